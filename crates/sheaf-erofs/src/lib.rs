//! EROFS metadata for a sheaf image, so that the kernel's EROFS driver can
//! serve the tree (lookups, listings, attributes: no FUSE round trip) while
//! the data stays sheaf's, lazy and verified.
//!
//! [`write`] walks an open, verified [`Image`] and writes an EROFS image
//! holding only metadata: directories, inodes, names, modes, owners, times,
//! extended attributes, symbolic links and devices. Each regular file with
//! data is *chunk-based* (EROFS's `EROFS_INODE_CHUNK_BASED`): its chunks
//! name blocks of device 1, the **blob**, a virtual file in which every such
//! file has one block-aligned range. The [`BlobMap`] that [`write`] returns
//! says which sheaf inode each range is; whoever serves the blob (sheaf's
//! FUSE server, `sheaf_mount::blob`) answers a read of the blob with the
//! file's bytes, read and verified by the image reader, and zeros up to the
//! end of the file's last block.
//!
//! The on-disk format is the kernel's (`fs/erofs/erofs_fs.h`); what this
//! writer uses of it is spelled out in docs/format.md §14. This crate owns
//! that layout and the blob map; it does not know how either is mounted,
//! cached or served.

mod layout;
mod map;

pub use layout::{write, write_stack, Written};
pub use map::{BlobMap, Extent};

use sheaf_read::ReadError;

/// The block size of the metadata image and the blob: EROFS's, and the
/// page size of every machine sheaf runs on.
pub const BLOCK: u64 = 4096;

/// Why no EROFS metadata could be written for an image.
#[derive(Debug, thiserror::Error)]
pub enum ErofsError {
    /// Reading the image failed (a refusal of the reader: corrupt, missing).
    #[error(transparent)]
    Read(#[from] ReadError),
    /// Writing the metadata image failed.
    #[error("writing the EROFS metadata: {0}")]
    Io(#[from] std::io::Error),
    /// The image holds something EROFS cannot say (the caller serves it
    /// through FUSE instead).
    #[error("EROFS cannot express {0}")]
    Unsupported(String),
}
