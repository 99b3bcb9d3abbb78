//! Errors of the read side.

use sheaf_format::FormatError;
use thiserror::Error;

/// Why a read failed. Messages name the image and the page or block.
#[derive(Debug, Error)]
pub enum ReadError {
    /// The source could not deliver bytes.
    #[error("{image}: {cause}")]
    Io {
        /// Image name.
        image: String,
        /// Cause.
        #[source]
        cause: std::io::Error,
    },
    /// The bytes are not a valid image (corrupt, truncated, hostile, too new).
    #[error("{image}: {what}: {err}")]
    Format {
        /// Image name.
        image: String,
        /// Which part (e.g. "data block 17", "inode table page 3 (level 0)").
        what: String,
        /// What is wrong.
        #[source]
        err: FormatError,
    },
    /// No entry at that path.
    #[error("{0}: no such file or directory in the image")]
    NotFound(String),
    /// An inode number beyond the table.
    #[error("no inode {0}")]
    NoInode(u32),
    /// A directory operation on something else.
    #[error("inode {0} is not a directory")]
    NotADirectory(u32),
    /// A file read on something else.
    #[error("inode {0} is not a regular file")]
    NotAFile(u32),
    /// readlink on something else.
    #[error("inode {0} is not a symlink")]
    NotASymlink(u32),
    /// Following symlinks went round (more than 40 in one path).
    #[error("{0}: too many levels of symbolic links in the image")]
    TooManyLinks(String),
    /// The image opened is not the one an earlier open of the same name
    /// decided on ([`crate::Image::expect_root`]).
    #[error("{image}: refused: its root digest is {found}, not {expected}, the one opened first (the image changed between two opens)")]
    RootChanged {
        /// Image name.
        image: String,
        /// The root found now (hex).
        found: String,
        /// The root decided on (hex).
        expected: String,
    },
}

impl ReadError {
    /// Build a [`ReadError::Format`].
    pub fn format(image: &str, what: &str, err: FormatError) -> Self {
        ReadError::Format {
            image: image.to_string(),
            what: what.to_string(),
            err,
        }
    }

    /// The errno a filesystem should report for this error.
    pub fn errno(&self) -> i32 {
        match self {
            ReadError::NotFound(_) | ReadError::NoInode(_) => libc::ENOENT,
            ReadError::NotADirectory(_) => libc::ENOTDIR,
            ReadError::NotAFile(_) => libc::EISDIR,
            ReadError::NotASymlink(_) => libc::EINVAL,
            ReadError::TooManyLinks(_) => libc::ELOOP,
            ReadError::Io { .. } | ReadError::Format { .. } => libc::EIO,
            ReadError::RootChanged { .. } => libc::EACCES,
        }
    }
}
