//! The upper directory of a writable overlay, as `sheaf commit` packs it
//! into a layer ([`crate::Input::Upper`]) and a writable mount writes it.
//!
//! The format (docs/layers.md): new and changed entries are ordinary files,
//! directories, symlinks and so on; a deleted lower entry NAME is an empty
//! regular file [`WHITEOUT_PREFIX`]`NAME` beside it; a directory whose lower
//! contents are hidden holds an empty regular file [`OPAQUE_MARKER`]; names
//! starting with [`TEMP_PREFIX`] are the overlay's temporary files (an
//! interrupted copy-up) and never go into a layer.
//!
//! [`lock`] is the one lock both sides take on the directory itself: a
//! writable mount holds it exclusively for its whole life, a commit holds it
//! shared while it reads the directory, so neither sees the other half done.

use crate::options::BuildError;
use crate::tree::{Kind, NodeId, Tree};
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use thiserror::Error;

/// Prefix of a whiteout: `.wh.NAME` hides NAME in the layers below.
pub const WHITEOUT_PREFIX: &[u8] = b".wh.";
/// The entry that makes its directory opaque (hides all lower contents).
pub const OPAQUE_MARKER: &[u8] = b".wh..wh..opq";
/// Prefix of the overlay's temporary files; left out of every layer.
pub const TEMP_PREFIX: &[u8] = b".wh..sheaf-";

/// The `--exclude` pattern that leaves the overlay's temporary files out.
pub(crate) const TEMP_GLOB: &str = ".wh..sheaf-*";

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
        // SAFETY: flock on a descriptor we own.
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

/// Refuse a scanned upper directory whose whiteouts are not empty regular
/// files: a layer cannot tell such a file from a whiteout (nor can OCI), so
/// packing it would silently turn user data into a deletion.
pub(crate) fn check_whiteouts(tree: &Tree, root: &Path) -> Result<(), BuildError> {
    let mut index = None;
    for (d, n) in tree.nodes.iter().enumerate() {
        let Kind::Dir(entries) = &n.kind else {
            continue;
        };
        for (name, id) in entries {
            if !name.starts_with(WHITEOUT_PREFIX) {
                continue;
            }
            let node = &tree.nodes[*id as usize];
            let problem = if name.len() == WHITEOUT_PREFIX.len() {
                Some("a whiteout must name the entry it hides")
            } else if node.meta.mode & libc::S_IFMT != libc::S_IFREG {
                Some("a whiteout must be an empty regular file, not a directory, link or special file")
            } else if !matches!(node.kind, Kind::File { size: 0, .. }) {
                Some("a whiteout must be an empty regular file (a file of this name cannot be stored in a layer)")
            } else {
                None
            };
            if let Some(p) = problem {
                let index = index.get_or_insert_with(|| tree.entry_index());
                let dir = tree.path(index, d as NodeId);
                let shown = root
                    .join(dir)
                    .join(std::ffi::OsStr::from_bytes(name))
                    .display()
                    .to_string();
                return Err(BuildError::BadInput {
                    path: shown,
                    detail: p.to_string(),
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
