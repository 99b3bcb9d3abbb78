//! The layer rules: which names of an image (or of an overlay's upper
//! directory) are whiteouts, opaque markers or sheaf's own temporaries, and
//! the lock that keeps an upper directory to one writer.
//!
//! A layer is an ordinary image; nothing in the format marks it as one
//! (docs/format.md, section 4). Stacking follows the OCI image-layer naming
//! convention, carried by ordinary entries (docs/layers.md):
//!
//! - `.wh.NAME`, an empty regular file, is a *whiteout*: it hides NAME in
//!   the layers below ([`whiteout`] forms it, [`parse`] reads it back);
//! - [`OPAQUE_MARKER`] (`.wh..wh..opq`) in a directory makes it *opaque*: it
//!   hides everything the layers below have at that path;
//! - no name starting with [`WHITEOUT_PREFIX`] is ever shown in a merged
//!   view ([`is_hidden`]), and none can be created through a writable mount,
//!   since OCI has no escape for a user file of such a name;
//! - names starting with [`TEMP_PREFIX`] (`.wh..sheaf-*`) are a writable
//!   mount's temporaries (a copy-up being written): hidden like every
//!   `.wh.` name, and left out of a committed layer ([`TEMP_GLOB`]).
//!
//! [`lock`] is the one lock a writable mount (exclusive, for its life) and
//! `sheaf commit` (shared, while it reads) take on an upper directory, so
//! neither sees the other half done. It is the only I/O in this crate: it
//! belongs to the same convention as the names, and every side that writes
//! or packs an upper directory depends on this crate.

use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use thiserror::Error;

/// Prefix of a whiteout: `.wh.NAME` hides NAME in the layers below.
pub const WHITEOUT_PREFIX: &[u8] = b".wh.";
/// The entry that makes its directory opaque (hides all lower contents).
pub const OPAQUE_MARKER: &[u8] = b".wh..wh..opq";
/// Prefix of a writable mount's temporary files in its upper directory.
pub const TEMP_PREFIX: &[u8] = b".wh..sheaf-";
/// The exclude pattern (globset syntax) that leaves [`TEMP_PREFIX`] names
/// out of a committed layer, at any depth.
pub const TEMP_GLOB: &str = ".wh..sheaf-*";

/// What a directory entry's name means in a layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Name<'a> {
    /// An ordinary entry, shown in the merged view.
    Plain(&'a [u8]),
    /// A whiteout of the name it carries (which may be empty, or itself
    /// start with `.wh.` for a temporary: such a whiteout hides nothing a
    /// merged view could show).
    Whiteout(&'a [u8]),
    /// The opaque marker.
    Opaque,
}

/// Read a directory entry's name by the layer rules.
pub fn parse(name: &[u8]) -> Name<'_> {
    if name == OPAQUE_MARKER {
        return Name::Opaque;
    }
    match name.strip_prefix(WHITEOUT_PREFIX) {
        Some(hidden) => Name::Whiteout(hidden),
        None => Name::Plain(name),
    }
}

/// The whiteout that hides `name`: `.wh.NAME`.
pub fn whiteout(name: &[u8]) -> Vec<u8> {
    [WHITEOUT_PREFIX, name].concat()
}

/// Whether `name` is layer bookkeeping (a whiteout, the opaque marker or a
/// temporary) and so never shown, looked up or created in a merged view.
pub fn is_hidden(name: &[u8]) -> bool {
    name.starts_with(WHITEOUT_PREFIX)
}

/// Whether `name` is one of a writable mount's temporaries.
pub fn is_temp(name: &[u8]) -> bool {
    name.starts_with(TEMP_PREFIX)
}

/// A temporary name `.wh..sheaf-TAG` for the upper directory.
pub fn temp_name(tag: &str) -> Vec<u8> {
    [TEMP_PREFIX, tag.as_bytes()].concat()
}

/// Why [`lock`] failed.
#[derive(Debug, Error)]
pub enum LockError {
    /// Someone else holds a conflicting lock (not waited for).
    #[error("{}: {}", .path.display(), busy_text(*.exclusive))]
    Busy {
        /// The upper directory.
        path: PathBuf,
        /// Whether an exclusive lock was asked for.
        exclusive: bool,
    },
    /// The directory cannot be opened or locked.
    #[error("{}: {cause}", .path.display())]
    Io {
        /// The upper directory.
        path: PathBuf,
        /// The cause.
        cause: std::io::Error,
    },
}

fn busy_text(exclusive: bool) -> &'static str {
    if exclusive {
        "in use by another writable mount or a commit"
    } else {
        "in use by a writable mount; unmount it first"
    }
}

/// Lock the upper directory `dir` without waiting: `exclusive` for a
/// writable mount (for its whole life), shared for a commit (while it reads
/// the directory). The lock is `flock(2)` on a descriptor of `dir` itself,
/// opened `O_RDONLY | O_DIRECTORY`; it is held until the returned file and
/// every descriptor duplicated from it (or inherited across `fork`) are
/// closed, and released by the kernel when the process dies.
pub fn lock(dir: &Path, exclusive: bool) -> Result<File, LockError> {
    let io = |cause| LockError::Io {
        path: dir.to_path_buf(),
        cause,
    };
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY)
        .open(dir)
        .map_err(io)?;
    let op = if exclusive {
        libc::LOCK_EX
    } else {
        libc::LOCK_SH
    };
    loop {
        // SAFETY: flock on a descriptor we own; no memory is passed.
        if unsafe { libc::flock(f.as_raw_fd(), op | libc::LOCK_NB) } == 0 {
            return Ok(f);
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EWOULDBLOCK) => {
                return Err(LockError::Busy {
                    path: dir.to_path_buf(),
                    exclusive,
                })
            }
            _ => return Err(io(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_as_oci_layers_mean_them() {
        assert_eq!(parse(b"file"), Name::Plain(b"file"));
        assert_eq!(parse(b".hidden"), Name::Plain(b".hidden"));
        assert_eq!(parse(b".wh.file"), Name::Whiteout(b"file"));
        assert_eq!(parse(b".wh..wh..opq"), Name::Opaque);
        assert_eq!(parse(b".wh."), Name::Whiteout(b""));
        assert_eq!(
            parse(b".wh..sheaf-copyup.7"),
            Name::Whiteout(b".sheaf-copyup.7")
        );
        assert_eq!(whiteout(b"a b"), b".wh.a b".to_vec());
        assert_eq!(parse(&whiteout(b"x")), Name::Whiteout(b"x"));
        for n in [&b".wh.x"[..], b".wh..wh..opq", b".wh..sheaf-copyup.1"] {
            assert!(is_hidden(n), "{n:?}");
        }
        assert!(!is_hidden(b".w.x") && !is_hidden(b"wh.x"));
        assert!(is_temp(&temp_name("copyup.3")));
        assert_eq!(temp_name("copyup.3"), b".wh..sheaf-copyup.3".to_vec());
        assert!(!is_temp(b".wh.x") && !is_temp(OPAQUE_MARKER));
        assert_eq!(TEMP_GLOB.trim_end_matches('*').as_bytes(), TEMP_PREFIX);
    }

    #[test]
    fn a_mount_and_commits_exclude_each_other() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        // Commits share the lock; a mount cannot start while one runs.
        let a = lock(d, false).unwrap();
        let b = lock(d, false).unwrap();
        let e = lock(d, true).unwrap_err();
        assert!(e
            .to_string()
            .ends_with("in use by another writable mount or a commit"));
        drop((a, b));
        // A mount holds it alone; commits are refused meanwhile.
        let m = lock(d, true).unwrap();
        let e = lock(d, false).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "{}: in use by a writable mount; unmount it first",
                d.display()
            )
        );
        assert!(matches!(lock(d, true), Err(LockError::Busy { .. })));
        drop(m);
        lock(d, false).unwrap();
        // Not a directory.
        let f = d.join("file");
        std::fs::write(&f, b"").unwrap();
        assert!(matches!(lock(&f, false), Err(LockError::Io { .. })));
    }
}
