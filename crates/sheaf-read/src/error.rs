//! Errors of the read side.

use sheaf_format::{ForeignKind, FormatError};
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
    /// The file is not a sheaf image at all (it does not begin with a
    /// sheaf header): `kind` says what it is when its first bytes tell,
    /// and the message what to do with it (convert a SquashFS image, pack
    /// a tar archive).
    #[error("{}", not_an_image(image, *kind))]
    NotAnImage {
        /// Image name.
        image: String,
        /// What the file is, if known.
        kind: Option<ForeignKind>,
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
            ReadError::NotAnImage { .. } => libc::EINVAL,
            ReadError::RootChanged { .. } => libc::EACCES,
        }
    }
}

/// The name an image made from `file` would have: its file name without
/// the archive's extensions, with `.sheaf` ("ds.tar.gz" gives "ds.sheaf").
fn sheaf_name(file: &str) -> String {
    let base = file.rsplit('/').next().unwrap_or(file);
    let mut stem = base;
    for ext in [
        ".gz",
        ".tgz",
        ".zst",
        ".tzst",
        ".xz",
        ".txz",
        ".bz2",
        ".tbz2",
        ".tar",
        ".sqfs",
        ".squashfs",
        ".img",
    ] {
        if let Some(s) = stem.strip_suffix(ext).filter(|s| !s.is_empty()) {
            stem = s;
        }
    }
    format!("{stem}.sheaf")
}

/// The message of [`ReadError::NotAnImage`].
fn not_an_image(image: &str, kind: Option<ForeignKind>) -> String {
    let out = sheaf_name(image);
    match kind {
        Some(ForeignKind::SquashFs) => format!(
            "{image} is a SquashFS image, not a sheaf image; convert it: \
             sqfs2tar {image} | sheaf build - -o {out} (sqfs2tar: Debian's squashfs-tools-ng)"
        ),
        Some(ForeignKind::Tar) => format!(
            "{image} is a tar archive, not a sheaf image; pack it: sheaf build {image} -o {out}"
        ),
        Some(k) => format!(
            "{image} is {}, not a sheaf image; if it holds a tar archive, pack it: sheaf build {image} -o {out}",
            k.describe()
        ),
        None => format!(
            "{image} is not a sheaf image (it does not begin with a sheaf header); sheaf build makes one from a directory or a tar archive"
        ),
    }
}
