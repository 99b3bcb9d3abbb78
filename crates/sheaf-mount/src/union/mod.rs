//! A stack of images served as one tree, optionally writable through an
//! upper directory (an overlay).
//!
//! The read side is [`sheaf_read::Stack`]: later layers win, OCI whiteouts
//! hide lower entries and are never shown. With an upper directory the mount
//! is read-write and the upper directory is the top layer, in the same
//! format a layer image has (so `sheaf commit` only packs it):
//!
//! - new and changed entries are plain files, directories, symlinks, ...;
//! - a lower entry NAME that was removed is an empty file `.wh.NAME`;
//! - a directory whose lower contents are hidden holds `.wh..wh..opq`;
//! - a copy-up writes `.wh..sheaf-copyup.N` and renames it into place, so an
//!   interrupted one leaves a name that is hidden and that commit skips.
//!
//! Copy-up is whole-file, on the first change of a lower entry (open for
//! writing, truncate, chmod, chown, utimens, xattrs, rename, hardlink);
//! parent directories are created first, with their attributes. Lower
//! images never change.
//!
//! Inodes: a *node* is what the kernel holds a FUSE inode number for. Its
//! number is derived from what it is (layer and image inode, or the upper
//! inode) so that it is stable across the kernel forgetting and looking it
//! up again (`git status` compares inode numbers); collisions fall back to
//! a counter. A node records its parent and name, and opens its upper
//! object by that path for each request; only the root, hardlinked files
//! and unlinked files still looked up keep an `O_PATH` descriptor.
//!
//! Concurrency: namespace changes (create, unlink, rename, copy-up, ...)
//! take a write lock; lookups and listings take a read lock; attribute
//! reads and data reads and writes on open files take neither.
//!
//! Layout (private modules of `union/`): `sys` has the system calls (safe
//! wrappers), `table` the nodes, `view` the merged view, `copyup` the
//! changes to the upper directory, `handles` open files, `ops` the
//! operations (plain methods returning `Result<_, Errno>`, testable without
//! FUSE) and `fuse` the thin `fuser::Filesystem` that calls them and
//! replies.

// System calls are wrapped in `sys`, and only there.
#![deny(unsafe_code)]

mod copyup;
mod fuse;
mod handles;
mod ops;
#[allow(unsafe_code)]
mod sys;
mod table;
#[cfg(test)]
mod tests;
mod view;

use crate::stats::{Op, Stats};
use handles::{Handle, IoModes};
use sheaf_format::layers::OPAQUE_MARKER;
use sheaf_read::{DirIndex, Found, Image, ReadError, Stack};
use std::collections::HashMap;
use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;
use table::{Node, Table, ROOT};

pub(crate) use ops::{Caller, Opened, SetAttr};

/// How a union is presented.
#[derive(Debug, Default)]
pub struct UnionConfig {
    /// The writable upper directory, if any.
    pub upper: Option<std::path::PathBuf>,
    /// Held for the life of the mount: the exclusive lock on the upper
    /// directory that keeps a second writer out.
    pub upper_lock: Option<File>,
}

/// Why a union cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum UnionError {
    /// The upper directory is unusable.
    #[error("{}: {problem}", path.display())]
    Upper {
        /// The directory.
        path: std::path::PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// A layer could not be read.
    #[error("{0}")]
    Read(#[from] ReadError),
}

/// The upper directory.
struct Upper {
    root: Arc<OwnedFd>,
    /// Whether this process may chown (then new entries get the caller's
    /// owner, as on a local filesystem).
    root_user: bool,
    _lock: Option<File>,
}

/// A union of layers, optionally writable.
pub struct UnionFs {
    stack: Stack,
    upper: Option<Upper>,
    table: Mutex<Table>,
    ns: RwLock<()>,
    handles: Mutex<HashMap<u64, Handle>>,
    next_fh: AtomicU64,
    copyups: AtomicU64,
    /// Name indexes of merged directories many layers share, by their top
    /// part (layer, image inode): the layers never change.
    indexes: Mutex<HashMap<(usize, u32), Arc<DirIndex>>>,
    /// Whether upper files are opened in kernel passthrough mode (reads and
    /// writes go straight to the upper file; root only, Linux 6.9+).
    passthrough: AtomicBool,
    io: Mutex<IoModes>,
    stats: Arc<Stats>,
    started: Instant,
}

impl UnionFs {
    /// The layers, bottom first.
    pub fn layers(&self) -> Vec<Arc<Image>> {
        self.stack.layers().to_vec()
    }

    /// Serve `layers` (bottom first) with `cfg`.
    pub fn new(layers: Vec<Arc<Image>>, cfg: UnionConfig) -> Result<UnionFs, UnionError> {
        let stack = Stack::new(layers);
        let upper = match &cfg.upper {
            None => None,
            Some(dir) => {
                let fd = sys::open_dir(dir).map_err(|e| UnionError::Upper {
                    path: dir.clone(),
                    problem: e.to_string(),
                })?;
                let root_user = sys::is_root();
                // The kernel has applied the caller's umask to every mode it
                // sends; ours must not mask it again. (Process-wide: a caller
                // that starts programs restores its own for them.)
                sys::clear_umask();
                Some(Upper {
                    root: Arc::new(fd),
                    root_user,
                    _lock: cfg.upper_lock,
                })
            }
        };
        let root_lower = stack.root()?;
        let opaque = upper
            .as_ref()
            .is_some_and(|u| sys::exists_at(u.root.as_fd(), OPAQUE_MARKER));
        let root = Node {
            parent: ROOT,
            name: Vec::new(),
            lower: (!opaque).then(|| Arc::new(Found::Dir(root_lower))),
            in_upper: upper.is_some(),
            upper: upper.as_ref().map(|u| u.root.clone()),
            is_dir: true,
            nlookup: 1,
            keys: Vec::new(),
            listing: None,
        };
        Ok(UnionFs {
            stack,
            upper,
            table: Mutex::new(Table::new(root)),
            ns: RwLock::new(()),
            handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            copyups: AtomicU64::new(0),
            indexes: Mutex::new(HashMap::new()),
            passthrough: AtomicBool::new(false),
            io: Mutex::new(IoModes::default()),
            stats: Arc::new(Stats::default()),
            started: Instant::now(),
        })
    }

    fn writable(&self) -> bool {
        self.upper.is_some()
    }

    /// The live counters.
    pub fn stats(&self) -> &Arc<Stats> {
        &self.stats
    }

    /// The errno for a layer read error, counted and logged unless it is a
    /// plain ENOENT.
    fn read_err(&self, op: Op, e: &ReadError) -> fuser::Errno {
        fuser::Errno::from_i32(self.stats.read_errno(op, e))
    }

    /// Live statistics (the hidden stats xattr).
    pub fn report(&self) -> crate::stats::Report {
        use crate::stats::{CacheReport, Report};
        let s = &self.stats;
        let layers: Vec<String> = self
            .stack
            .layers()
            .iter()
            .map(|i| i.name().to_string())
            .collect();
        Report {
            image: layers.join(","),
            roots: (self.stack.layers().iter())
                .map(|i| sheaf_format::hex(&i.root_digest()))
                .collect(),
            pid: std::process::id(),
            uptime_s: self.started.elapsed().as_secs_f64(),
            bytes_served: s.bytes_served.load(Relaxed),
            image_errors: s.image_errors.load(Relaxed),
            block_cache: CacheReport::sum(self.stack.layers().iter().map(|i| &**i.block_cache())),
            layers: Some(layers),
            upper: Some(self.upper.is_some()),
            copy_ups: Some(self.copyups.load(Relaxed)),
            nodes: Some(self.table.lock().expect("table").nodes.len() as u64),
            ops: s.ops(),
            recent_errors: s.recent_errors(|_| Vec::new()),
            log: crate::logging::destination(),
            ..Default::default()
        }
    }
}
