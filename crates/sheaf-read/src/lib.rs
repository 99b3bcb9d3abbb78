//! Reading sheaf images.
//!
//! Owns the read side: [`source`] (where bytes come from: a local file with
//! `pread`, memory; `sheaf-net` adds HTTP), [`image`] (open with a bounded number of
//! reads, verified access to pages and blocks, lookup, directory listing,
//! stat, xattrs, read at offset), [`cache`] (bounded, content-addressed,
//! single-flight caches of decoded pages and blocks) and [`verify`] (check
//! everything). Every byte handed out has been checked against its BLAKE3
//! hash. [`stack`] is the merged view of stacked layers, [`tree`] the tree
//! rules a walk relies on, and [`extract`](mod@extract) unpacks an image into a directory
//! (`sheaf extract`) without ever writing outside it. [`info`](mod@info)
//! has the fields of `sheaf info --json` and [`find`](mod@find) find(1)'s
//! language over an image (with [`ident`], this machine's user and group
//! names), shared by the CLI and the Python package. This crate knows
//! nothing of FUSE, the CLI or how images are built.

#![warn(missing_docs)]

pub mod cache;
mod dir;
pub mod error;
pub mod extract;
pub mod find;
#[doc(hidden)]
pub mod fuzzing;
pub mod ident;
pub mod image;
pub mod info;
pub mod show;
pub mod source;
pub mod stack;
pub mod tree;
pub mod verify;
pub mod walk;

pub use cache::Cache;
pub use error::ReadError;
pub use extract::{extract, ExtractError, ExtractOptions, ExtractReport};
pub use image::{
    signed_message, BlockScratch, DirEntry, Image, ImageOptions, Inode, Piece, ReadBytes,
};
pub use source::{
    CacheStats, CountingSource, FileSource, HttpStats, IndexSource, MemSource, NetStats,
    ObjectStore, S3Stats, Source, SshStats, StoreStats, TransportStats, TransportSummary,
};
pub use stack::{DirIndex, Found, MergedDir, Stack, StackEntry};
pub use tree::{Seen, SeenMerged};
pub use walk::{Order, Step};

use std::path::Path;
use std::sync::Arc;

/// Open a local image file with default options.
pub fn open_path(path: &Path) -> Result<Image, ReadError> {
    let src = FileSource::open(path).map_err(|e| ReadError::Io {
        image: path.display().to_string(),
        cause: e,
    })?;
    Image::open(Arc::new(src))
}
