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
//! a counter. A node keeps an `O_PATH` descriptor of its upper object, so
//! renames and hardlinks in the upper directory never leave it with a stale
//! path.
//!
//! Concurrency: namespace changes (create, unlink, rename, copy-up, ...)
//! take a write lock; lookups, listings and attribute reads take a read
//! lock; data reads and writes on open files take neither.

use crate::fs::{encode_dev, image_attr, kind_of, FOREVER, MAX_READ};
use crate::stats::{Op, Stats};
use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, InitFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs,
    ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use serde_json::json;
use sheaf_format::layers::{self, Name, OPAQUE_MARKER};
use sheaf_format::records::FileType as Ft;
use sheaf_read::{DirIndex, Found, Image, Inode, ReadError, Stack};
use std::collections::{HashMap, HashSet};
use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirEntryExt, FileExt};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A merged directory of at least this many layers is looked up through an
/// index of its names instead of layer by layer (building it costs one
/// listing; a listing with attributes then costs one hash lookup a name).
const INDEX_PARTS: usize = 2;

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

/// What a node stands for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Key {
    /// An object of the upper directory (device, inode).
    Upper(u64, u64),
    /// An entry of a layer (layer, image inode); a directory is keyed by its
    /// top part.
    Lower(usize, u32),
    /// A hardlinked lower file in a writable mount, per path (copy-up of one
    /// name must not change the others).
    Path(u64, Vec<u8>),
}

/// A FUSE inode.
#[derive(Debug, Clone)]
struct Node {
    /// The directory it was last seen in, and its name there.
    parent: u64,
    name: Vec<u8>,
    /// What the layers show: for a directory, the lower directory merged
    /// under it (none if opaque or absent); otherwise the lower object, as
    /// long as it has not been copied up.
    lower: Option<Arc<Found>>,
    /// Whether it exists in the upper directory.
    in_upper: bool,
    /// An `O_PATH` descriptor of its upper object. In the table only for
    /// the root and hardlinked files (whose path may go while the object
    /// stays); [`UnionFs::node`] opens the others by path for each request,
    /// so a tree of millions of upper files never holds millions of
    /// descriptors.
    upper: Option<Arc<OwnedFd>>,
    is_dir: bool,
    nlookup: u64,
    keys: Vec<Key>,
    /// A read-only mount's listing, built once.
    listing: Option<Arc<Vec<Entry>>>,
}

/// One listed name.
#[derive(Debug, Clone)]
struct Entry {
    name: Vec<u8>,
    kind: FileType,
    ino: u64,
}

/// The inode table.
struct Table {
    nodes: HashMap<u64, Node>,
    by_key: HashMap<Key, u64>,
    next: u64,
}

/// What a name resolves to, before it becomes a node.
struct Child {
    lower: Option<Arc<Found>>,
    upper: Option<(OwnedFd, libc::stat)>,
}

/// An open file or directory.
enum Handle {
    /// An upper file.
    File(Arc<File>),
    /// A lower file opened for reading (no copy-up): its layer and inode,
    /// kept even if another open copies it up meanwhile.
    Lower(usize, Inode),
    /// A directory listing, taken at opendir.
    Dir(Arc<Vec<Entry>>),
}

/// How the open files of one node do their I/O: the kernel refuses
/// passthrough and cached opens of one inode at the same time, and wants
/// every passthrough open of it on the same backing file.
#[derive(Default)]
struct IoState {
    cached: u32,
    passthrough: u32,
    backing: Option<Arc<fuser::BackingId>>,
}

/// Open files by node, and each handle's node and mode.
#[derive(Default)]
struct IoModes {
    nodes: HashMap<u64, IoState>,
    handles: HashMap<u64, (u64, bool)>,
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
    passthrough: std::sync::atomic::AtomicBool,
    io: Mutex<IoModes>,
    stats: Arc<Stats>,
    started: Instant,
}

fn errno_of(e: &io::Error) -> Errno {
    Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO))
}

fn last() -> Errno {
    errno_of(&io::Error::last_os_error())
}

fn check(r: libc::c_int) -> Result<libc::c_int, Errno> {
    if r < 0 {
        Err(last())
    } else {
        Ok(r)
    }
}

fn cstr(b: &[u8]) -> Result<CString, Errno> {
    CString::new(b).map_err(|_| Errno::EINVAL)
}

/// `/proc/self/fd/N`: reopens or changes the object an `O_PATH` fd names.
fn proc_path(fd: &OwnedFd) -> CString {
    CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd())).expect("no NUL")
}

fn stat_fd(fd: &OwnedFd) -> Result<libc::stat, Errno> {
    stat_at(fd.as_raw_fd(), b"", libc::AT_EMPTY_PATH)
}

fn stat_at(dir: RawFd, name: &[u8], flags: libc::c_int) -> Result<libc::stat, Errno> {
    let c = cstr(name)?;
    // SAFETY: a zeroed stat is a valid out-parameter.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid C string and out-pointer.
    check(unsafe { libc::fstatat(dir, c.as_ptr(), &mut st, flags | libc::AT_SYMLINK_NOFOLLOW) })?;
    Ok(st)
}

fn exists_at(dir: RawFd, name: &[u8]) -> bool {
    stat_at(dir, name, 0).is_ok()
}

fn open_path_at(dir: RawFd, name: &[u8]) -> Result<OwnedFd, Errno> {
    let c = cstr(name)?;
    // SAFETY: valid C string; the result is checked.
    let fd = check(unsafe {
        libc::openat(
            dir,
            c.as_ptr(),
            libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    })?;
    // SAFETY: openat just returned it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn unlink_at(dir: RawFd, name: &[u8], flags: libc::c_int) -> Result<(), Errno> {
    let c = cstr(name)?;
    // SAFETY: valid C string.
    check(unsafe { libc::unlinkat(dir, c.as_ptr(), flags) }).map(drop)
}

fn kind_of_mode(mode: u32) -> FileType {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFSOCK => FileType::Socket,
        _ => FileType::RegularFile,
    }
}

fn time(sec: i64, nsec: i64) -> SystemTime {
    if sec >= 0 {
        UNIX_EPOCH + Duration::new(sec as u64, nsec as u32)
    } else {
        UNIX_EPOCH - Duration::from_secs(sec.unsigned_abs()) + Duration::from_nanos(nsec as u64)
    }
}

fn stat_attr(ino: u64, st: &libc::stat) -> FileAttr {
    let kind = kind_of_mode(st.st_mode);
    FileAttr {
        ino: INodeNo(ino),
        size: st.st_size as u64,
        blocks: st.st_blocks as u64,
        atime: time(st.st_atime, st.st_atime_nsec),
        mtime: time(st.st_mtime, st.st_mtime_nsec),
        ctime: time(st.st_ctime, st.st_ctime_nsec),
        crtime: time(st.st_mtime, st.st_mtime_nsec),
        kind,
        perm: (st.st_mode & 0o7777) as u16,
        nlink: st.st_nlink as u32,
        uid: st.st_uid,
        gid: st.st_gid,
        rdev: match kind {
            FileType::CharDevice | FileType::BlockDevice => encode_dev(st.st_rdev),
            _ => 0,
        },
        blksize: st.st_blksize as u32,
        flags: 0,
    }
}

/// The preferred node number of `key` (stable across forget and lookup).
fn preferred_ino(key: &Key) -> Option<u64> {
    const MASK: u64 = (1 << 40) - 1;
    match key {
        Key::Lower(l, ino) => Some(((*l as u64 + 1) << 40) | *ino as u64),
        Key::Upper(_, ino) if *ino <= MASK => Some((1 << 62) | ino),
        _ => None,
    }
}

/// Seconds and nanoseconds for utimensat.
fn timespec(t: Option<TimeOrNow>) -> libc::timespec {
    match t {
        None => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        Some(TimeOrNow::Now) => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_NOW,
        },
        Some(TimeOrNow::SpecificTime(t)) => match t.duration_since(UNIX_EPOCH) {
            Ok(d) => libc::timespec {
                tv_sec: d.as_secs() as libc::time_t,
                tv_nsec: d.subsec_nanos() as libc::c_long,
            },
            Err(e) => {
                let d = e.duration();
                let (mut s, mut n) = (-(d.as_secs() as i64), d.subsec_nanos() as i64);
                if n > 0 {
                    s -= 1;
                    n = 1_000_000_000 - n;
                }
                libc::timespec {
                    tv_sec: s as libc::time_t,
                    tv_nsec: n as libc::c_long,
                }
            }
        },
    }
}

impl UnionFs {
    /// Serve `layers` (bottom first) with `cfg`.
    pub fn new(layers: Vec<Arc<Image>>, cfg: UnionConfig) -> Result<UnionFs, UnionError> {
        let stack = Stack::new(layers);
        let upper = match &cfg.upper {
            None => None,
            Some(dir) => {
                let bad = |problem: String| UnionError::Upper {
                    path: dir.clone(),
                    problem,
                };
                let c = cstr(dir.as_os_str().as_bytes()).map_err(|_| bad("bad path".into()))?;
                // SAFETY: valid C string.
                let fd = unsafe {
                    libc::open(
                        c.as_ptr(),
                        libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
                    )
                };
                if fd < 0 {
                    return Err(bad(io::Error::last_os_error().to_string()));
                }
                // SAFETY: open just returned it.
                let fd = unsafe { OwnedFd::from_raw_fd(fd) };
                // SAFETY: plain syscall.
                let root_user = unsafe { libc::geteuid() } == 0;
                // The kernel has applied the caller's umask to every mode it
                // sends; ours must not mask it again. (Process-wide: a caller
                // that starts programs restores its own for them.)
                // SAFETY: plain syscall.
                unsafe { libc::umask(0) };
                Some(Upper {
                    root: Arc::new(fd),
                    root_user,
                    _lock: cfg.upper_lock,
                })
            }
        };
        let fs = UnionFs {
            stack,
            upper,
            table: Mutex::new(Table {
                nodes: HashMap::new(),
                by_key: HashMap::new(),
                next: 1,
            }),
            ns: RwLock::new(()),
            handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            copyups: AtomicU64::new(0),
            indexes: Mutex::new(HashMap::new()),
            passthrough: std::sync::atomic::AtomicBool::new(false),
            io: Mutex::new(IoModes::default()),
            stats: Arc::new(Stats::default()),
            started: Instant::now(),
        };
        let root_lower = fs.stack.root()?;
        let opaque = fs
            .upper
            .as_ref()
            .is_some_and(|u| exists_at(u.root.as_raw_fd(), OPAQUE_MARKER));
        let root = Node {
            parent: 1,
            name: Vec::new(),
            lower: (!opaque).then(|| Arc::new(Found::Dir(root_lower))),
            in_upper: fs.upper.is_some(),
            upper: fs.upper.as_ref().map(|u| u.root.clone()),
            is_dir: true,
            nlookup: 1,
            keys: Vec::new(),
            listing: None,
        };
        fs.table.lock().expect("table").nodes.insert(1, root);
        Ok(fs)
    }

    fn writable(&self) -> bool {
        self.upper.is_some()
    }

    /// The live counters.
    pub fn stats(&self) -> &Arc<Stats> {
        &self.stats
    }

    /// A copy of node `ino`, with its upper object opened.
    fn node(&self, ino: INodeNo) -> Result<Node, Errno> {
        let (mut n, path) = {
            let t = self.table.lock().expect("table");
            let n = t.nodes.get(&ino.0).cloned().ok_or(Errno::ENOENT)?;
            let path = if n.in_upper && n.upper.is_none() {
                Some(Self::path_in(&t, ino.0).ok_or(Errno::EIO)?)
            } else {
                None
            };
            (n, path)
        };
        if let (Some(p), Some(u)) = (path, &self.upper) {
            n.upper = Some(Arc::new(open_path_at(u.root.as_raw_fd(), &p)?));
        }
        Ok(n)
    }

    fn read_err(&self, op: Op, e: &ReadError) -> Errno {
        let n = e.errno();
        if n != libc::ENOENT {
            self.stats.error(op);
            if n == libc::EIO {
                self.stats.image_errors.fetch_add(1, Relaxed);
            }
            log::error!("{}: {e}", op.name());
        }
        Errno::from_i32(n)
    }

    /// The lower entry `name` of directory `dir`, ignoring the upper layer.
    fn lower_child(&self, dir: &Node, name: &[u8]) -> Result<Option<Found>, ReadError> {
        match dir.lower.as_deref() {
            // Many layers share this directory: look names up in an index
            // of it, so the cost does not grow with the number of layers.
            Some(Found::Dir(md)) if md.parts.len() >= INDEX_PARTS => {
                let key = (md.parts[0].0, md.parts[0].1.ino);
                let cached = self.indexes.lock().expect("indexes").get(&key).cloned();
                let idx = match cached {
                    Some(i) => i,
                    None => {
                        let i = Arc::new(self.stack.index(md)?);
                        self.indexes.lock().expect("indexes").insert(key, i.clone());
                        i
                    }
                };
                self.stack.lookup_in(md, &idx, name)
            }
            Some(Found::Dir(md)) => self.stack.lookup(md, name),
            _ => Ok(None),
        }
    }

    /// What `name` in `dir` is, in the merged view.
    fn resolve(&self, dir: &Node, name: &[u8]) -> Result<Option<Child>, Errno> {
        if name.len() > 255 {
            return Err(Errno::from_i32(libc::ENAMETOOLONG));
        }
        if layers::is_hidden(name) {
            return Ok(None);
        }
        if let Some(pfd) = &dir.upper {
            let p = pfd.as_raw_fd();
            match stat_at(p, name, 0) {
                Ok(st) => {
                    let fd = open_path_at(p, name)?;
                    let is_dir = st.st_mode & libc::S_IFMT == libc::S_IFDIR;
                    let lower = if is_dir && !exists_at(fd.as_raw_fd(), OPAQUE_MARKER) {
                        match self.lower_child(dir, name) {
                            Ok(Some(f @ Found::Dir(_))) => Some(Arc::new(f)),
                            Ok(_) => None,
                            Err(e) => return Err(self.read_err(Op::Lookup, &e)),
                        }
                    } else {
                        None
                    };
                    return Ok(Some(Child {
                        lower,
                        upper: Some((fd, st)),
                    }));
                }
                Err(e) if e == Errno::ENOENT => {
                    if exists_at(p, &layers::whiteout(name)) {
                        return Ok(None);
                    }
                }
                Err(e) => return Err(e),
            }
        }
        match self.lower_child(dir, name) {
            Ok(Some(f)) => Ok(Some(Child {
                lower: Some(Arc::new(f)),
                upper: None,
            })),
            Ok(None) => Ok(None),
            Err(e) => Err(self.read_err(Op::Lookup, &e)),
        }
    }

    /// What identifies `child`, named `name` in `parent`.
    fn key_of(&self, parent: u64, name: &[u8], child: &Child) -> Result<Key, Errno> {
        Ok(match (&child.upper, child.lower.as_deref()) {
            (Some((_, st)), _) => Key::Upper(st.st_dev, st.st_ino),
            (None, Some(f)) => {
                let (l, i) = f.shown();
                if self.writable() && i.file_type() != Ft::Directory && i.rec.nlink > 1 {
                    Key::Path(parent, name.to_vec())
                } else {
                    Key::Lower(l, i.ino)
                }
            }
            (None, None) => return Err(Errno::ENOENT),
        })
    }

    /// Make `child` (named `name` in `parent`) a node, counting one lookup.
    fn remember(&self, parent: u64, name: &[u8], child: Child) -> Result<FileAttr, Errno> {
        let key = self.key_of(parent, name, &child)?;
        let is_dir = match (&child.upper, child.lower.as_deref()) {
            (Some((_, st)), _) => st.st_mode & libc::S_IFMT == libc::S_IFDIR,
            (None, Some(f)) => matches!(f, Found::Dir(_)),
            _ => false,
        };
        let attr = match (&child.upper, child.lower.as_deref()) {
            (Some((_, st)), _) => Some(*st),
            _ => None,
        };
        // Hardlinked upper files keep their descriptor (see Node::upper).
        let pin = |c: &mut Child| match c.upper.take() {
            Some((fd, st)) if st.st_nlink > 1 && st.st_mode & libc::S_IFMT != libc::S_IFDIR => {
                Some(Arc::new(fd))
            }
            _ => None,
        };
        let mut child = child;
        let in_upper = child.upper.is_some();
        let pinned = pin(&mut child);
        let mut t = self.table.lock().expect("table");
        let existing = t.by_key.get(&key).copied().filter(|id| {
            // An upper inode number may be reused after a delete while the
            // kernel still holds the old node.
            !matches!(key, Key::Upper(..)) || self.upper_alive(&t, *id)
        });
        let id = match existing {
            Some(id) => {
                let n = t.nodes.get_mut(&id).expect("mapped node");
                n.nlookup += 1;
                n.in_upper |= in_upper;
                if n.upper.is_none() {
                    n.upper = pinned;
                }
                if n.is_dir {
                    n.lower = child.lower.clone();
                }
                if !n.keys.contains(&key) {
                    n.keys.push(key);
                }
                id
            }
            None => {
                let id = match preferred_ino(&key).filter(|i| !t.nodes.contains_key(i)) {
                    Some(i) => i,
                    None => {
                        t.next += 1;
                        (1 << 63) | t.next
                    }
                };
                t.by_key.insert(key.clone(), id);
                t.nodes.insert(
                    id,
                    Node {
                        parent,
                        name: name.to_vec(),
                        lower: child.lower.clone(),
                        in_upper,
                        upper: pinned,
                        is_dir,
                        nlookup: 1,
                        keys: vec![key],
                        listing: None,
                    },
                );
                id
            }
        };
        let n = t.nodes.get(&id).expect("node").clone();
        drop(t);
        match attr {
            Some(st) => Ok(stat_attr(id, &st)),
            None => self.attr(id, &n),
        }
    }

    /// The path of node `id` relative to the upper directory (`.` for the
    /// root), from the names the table holds.
    fn path_in(t: &Table, id: u64) -> Option<Vec<u8>> {
        let mut names = Vec::new();
        let mut cur = id;
        while cur != 1 {
            let n = t.nodes.get(&cur)?;
            names.push(n.name.as_slice());
            cur = n.parent;
            if names.len() > 4096 {
                return None;
            }
        }
        if names.is_empty() {
            return Some(b".".to_vec());
        }
        names.reverse();
        Some(names.join(&b'/'))
    }

    /// Whether node `id`'s upper object still exists under the name the
    /// table gives it (or, for a pinned one, anywhere).
    fn upper_alive(&self, t: &Table, id: u64) -> bool {
        let Some(n) = t.nodes.get(&id) else {
            return false;
        };
        if let Some(fd) = &n.upper {
            return stat_fd(fd)
                .is_ok_and(|s| s.st_nlink > 0 || s.st_mode & libc::S_IFMT == libc::S_IFDIR);
        }
        let (Some(u), Some(path)) = (&self.upper, Self::path_in(t, id)) else {
            return false;
        };
        let Ok(st) = stat_at(u.root.as_raw_fd(), &path, 0) else {
            return false;
        };
        n.keys.contains(&Key::Upper(st.st_dev, st.st_ino))
    }

    fn attr(&self, id: u64, n: &Node) -> Result<FileAttr, Errno> {
        if let Some(fd) = &n.upper {
            return Ok(stat_attr(id, &stat_fd(fd)?));
        }
        match n.lower.as_deref() {
            Some(f) => Ok(image_attr(id, &f.shown().1)),
            None => Err(Errno::ENOENT),
        }
    }

    /// The merged listing of a directory node.
    fn listing(&self, n: &Node) -> Result<Vec<Entry>, Errno> {
        self.merged_listing(n.upper.as_deref(), n.lower.as_deref())
    }

    /// The merged listing of a directory: its upper part, then what the
    /// layers add that the upper part neither has nor hides.
    fn merged_listing(
        &self,
        upper: Option<&OwnedFd>,
        lower: Option<&Found>,
    ) -> Result<Vec<Entry>, Errno> {
        let mut out = Vec::new();
        let mut seen: HashSet<Vec<u8>> = HashSet::new();
        let mut hidden: HashSet<Vec<u8>> = HashSet::new();
        if let Some(fd) = upper {
            let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
            let rd = std::fs::read_dir(&path).map_err(|e| errno_of(&e))?;
            let st = stat_fd(fd)?;
            for e in rd {
                let e = e.map_err(|e| errno_of(&e))?;
                let name = e.file_name().as_bytes().to_vec();
                match layers::parse(&name) {
                    Name::Whiteout(t) => {
                        hidden.insert(t.to_vec());
                        continue;
                    }
                    Name::Opaque => continue,
                    Name::Plain(_) => {}
                }
                let kind = match e.file_type() {
                    Ok(t) if t.is_dir() => FileType::Directory,
                    Ok(t) if t.is_symlink() => FileType::Symlink,
                    Ok(t) if t.is_file() => FileType::RegularFile,
                    Ok(_) | Err(_) => match stat_at(fd.as_raw_fd(), &name, 0) {
                        Ok(s) => kind_of_mode(s.st_mode),
                        Err(_) => continue,
                    },
                };
                let ino = preferred_ino(&Key::Upper(st.st_dev, e.ino())).unwrap_or(u64::MAX);
                seen.insert(name.clone());
                out.push(Entry { name, kind, ino });
            }
        }
        if let Some(Found::Dir(md)) = lower {
            let lower = self
                .stack
                .read_dir(md)
                .map_err(|e| self.read_err(Op::Readdir, &e))?;
            for e in lower {
                if seen.contains(&e.name) || hidden.contains(&e.name) {
                    continue;
                }
                out.push(Entry {
                    ino: preferred_ino(&Key::Lower(e.layer, e.ino)).unwrap_or(u64::MAX),
                    kind: kind_of(e.file_type),
                    name: e.name,
                });
            }
        }
        Ok(out)
    }

    /// The cached listing of a read-only mount's directory.
    fn cached_listing(&self, ino: INodeNo) -> Result<Arc<Vec<Entry>>, Errno> {
        let n = self.node(ino)?;
        if let Some(l) = &n.listing {
            return Ok(l.clone());
        }
        let l = Arc::new(self.listing(&n)?);
        if let Some(n) = self.table.lock().expect("table").nodes.get_mut(&ino.0) {
            n.listing = Some(l.clone());
        }
        Ok(l)
    }

    fn add_handle(&self, h: Handle) -> FileHandle {
        let fh = self.next_fh.fetch_add(1, Relaxed);
        self.handles.lock().expect("handles").insert(fh, h);
        FileHandle(fh)
    }

    // ---- the upper directory ----

    fn upper(&self) -> Result<&Upper, Errno> {
        self.upper.as_ref().ok_or(Errno::EROFS)
    }

    /// Give a new upper entry the caller's owner (as root; the group of a
    /// setgid directory is kept, as the kernel chose it).
    fn own(&self, req: &Request, dir: RawFd, name: &[u8], mode: Option<u32>) -> Result<(), Errno> {
        if !self.upper()?.root_user {
            return Ok(());
        }
        let st = stat_at(dir, b"", libc::AT_EMPTY_PATH)?;
        let gid = if st.st_mode & libc::S_ISGID != 0 {
            u32::MAX
        } else {
            req.gid()
        };
        let c = cstr(name)?;
        // SAFETY: valid C string.
        let r =
            unsafe { libc::fchownat(dir, c.as_ptr(), req.uid(), gid, libc::AT_SYMLINK_NOFOLLOW) };
        if r < 0 {
            // The caller's id may not exist in this process's user namespace
            // (a mount moved into one): keep the server's own.
            let e = last();
            if e != Errno::EINVAL && e != Errno::EPERM {
                return Err(e);
            }
            return Ok(());
        }
        // chown clears set-id bits of files; put back what was asked for.
        if let Some(m) = mode.filter(|m| m & (libc::S_ISUID | libc::S_ISGID) != 0) {
            // SAFETY: valid C string.
            check(unsafe { libc::fchmodat(dir, c.as_ptr(), m & 0o7777, 0) })?;
        }
        Ok(())
    }

    /// Make sure node `id` exists in the upper directory (copying it and its
    /// missing parents up) and return its descriptor.
    fn copy_up(&self, id: u64) -> Result<Arc<OwnedFd>, Errno> {
        let n = self.node(INodeNo(id))?;
        if let Some(fd) = &n.upper {
            return Ok(fd.clone());
        }
        if id == 1 {
            return Err(Errno::EROFS);
        }
        let pfd = self.copy_up(n.parent)?;
        let p = pfd.as_raw_fd();
        // Adopt an existing copy (a directory renamed whole was copied up
        // beneath nodes that still point at the lower tree).
        let fd = if exists_at(p, &n.name) {
            open_path_at(p, &n.name)?
        } else {
            let found = n.lower.as_deref().ok_or(Errno::ENOENT)?;
            self.copy_entry(p, &n.name, found)?;
            open_path_at(p, &n.name)?
        };
        let st = stat_fd(&fd)?;
        let fd = Arc::new(fd);
        let mut t = self.table.lock().expect("table");
        t.by_key.insert(Key::Upper(st.st_dev, st.st_ino), id);
        if let Some(node) = t.nodes.get_mut(&id) {
            node.in_upper = true;
            node.keys.push(Key::Upper(st.st_dev, st.st_ino));
            if !node.is_dir {
                node.lower = None;
            }
        }
        Ok(fd)
    }

    /// Copy one lower entry into upper directory `dir` as `name` (a
    /// directory without its contents).
    fn copy_entry(&self, dir: RawFd, name: &[u8], found: &Found) -> Result<(), Errno> {
        let (l, i) = found.shown();
        let img = &self.stack.layers()[l];
        let r = &i.rec;
        let cname = cstr(name)?;
        let perm = r.mode & 0o7777;
        self.copyups.fetch_add(1, Relaxed);
        match i.file_type() {
            Ft::Directory => {
                // SAFETY: valid C string.
                check(unsafe { libc::mkdirat(dir, cname.as_ptr(), perm) })?;
            }
            Ft::Regular => {
                let tmp = layers::temp_name(&format!("copyup.{}", self.copyups.load(Relaxed)));
                let ctmp = cstr(&tmp)?;
                // SAFETY: valid C string; result checked.
                let fd = check(unsafe {
                    libc::openat(
                        dir,
                        ctmp.as_ptr(),
                        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC,
                        0o600,
                    )
                })?;
                // SAFETY: openat just returned it.
                let f = unsafe { File::from_raw_fd(fd) };
                let copied = (|| -> Result<(), Errno> {
                    let mut buf = vec![0u8; MAX_READ as usize];
                    let mut off = 0u64;
                    loop {
                        let k = img
                            .read(&i, off, &mut buf)
                            .map_err(|e| self.read_err(Op::Read, &e))?;
                        if k == 0 {
                            break;
                        }
                        f.write_all_at(&buf[..k], off).map_err(|e| errno_of(&e))?;
                        off += k as u64;
                    }
                    Ok(())
                })();
                if let Err(e) = copied {
                    let _ = unlink_at(dir, &tmp, 0);
                    return Err(e);
                }
                drop(f);
                // SAFETY: valid C strings.
                let moved =
                    check(unsafe { libc::renameat(dir, ctmp.as_ptr(), dir, cname.as_ptr()) });
                if let Err(e) = moved {
                    let _ = unlink_at(dir, &tmp, 0);
                    return Err(e);
                }
            }
            Ft::Symlink => {
                let target = img
                    .read_link(&i)
                    .map_err(|e| self.read_err(Op::Readlink, &e))?;
                let t = cstr(&target)?;
                // SAFETY: valid C strings.
                check(unsafe { libc::symlinkat(t.as_ptr(), dir, cname.as_ptr()) })?;
            }
            Ft::CharDevice | Ft::BlockDevice | Ft::Fifo | Ft::Socket => {
                // SAFETY: valid C string.
                check(unsafe {
                    libc::mknodat(dir, cname.as_ptr(), r.mode, r.data as libc::dev_t)
                })?;
            }
        }
        // Attributes: owner (when allowed), mode, xattrs, then times last.
        // SAFETY: valid C string.
        unsafe {
            libc::fchownat(dir, cname.as_ptr(), r.uid, r.gid, libc::AT_SYMLINK_NOFOLLOW);
        }
        if i.file_type() != Ft::Symlink {
            // SAFETY: valid C string.
            check(unsafe { libc::fchmodat(dir, cname.as_ptr(), perm, 0) })?;
            if let Ok(set) = img.xattrs(&i) {
                let path = [format!("/proc/self/fd/{dir}/").as_bytes(), name].concat();
                for (k, v) in set.0 {
                    if let Err(e) = xattr_set(&path, &k, &v, 0) {
                        log::warn!(
                            "copy-up of {}: xattr {} not kept: {e:?}",
                            String::from_utf8_lossy(name),
                            String::from_utf8_lossy(&k)
                        );
                    }
                }
            }
        }
        let t = libc::timespec {
            tv_sec: r.mtime_sec as libc::time_t,
            tv_nsec: r.mtime_nsec as libc::c_long,
        };
        let times = [t, t];
        // SAFETY: valid C string and array.
        unsafe {
            libc::utimensat(
                dir,
                cname.as_ptr(),
                times.as_ptr(),
                libc::AT_SYMLINK_NOFOLLOW,
            );
        }
        Ok(())
    }

    /// Copy everything below merged directory `dir` (upper `dfd`, lower
    /// `lower`) into the upper directory, so it no longer needs the layers.
    fn copy_up_tree(&self, dfd: RawFd, lower: Option<&Found>) -> Result<(), Errno> {
        let Some(Found::Dir(md)) = lower else {
            return Ok(());
        };
        if exists_at(dfd, OPAQUE_MARKER) {
            return Ok(());
        }
        let entries = self
            .stack
            .read_dir(md)
            .map_err(|e| self.read_err(Op::Readdir, &e))?;
        for e in entries {
            if exists_at(dfd, &layers::whiteout(&e.name)) {
                continue;
            }
            let found = self
                .stack
                .lookup(md, &e.name)
                .map_err(|e| self.read_err(Op::Lookup, &e))?
                .ok_or(Errno::EIO)?;
            match stat_at(dfd, &e.name, 0) {
                Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFDIR => {
                    if matches!(found, Found::Dir(_)) {
                        let sub = open_path_at(dfd, &e.name)?;
                        self.copy_up_tree(sub.as_raw_fd(), Some(&found))?;
                    }
                }
                Ok(_) => {}
                Err(_) => {
                    self.copy_entry(dfd, &e.name, &found)?;
                    if matches!(found, Found::Dir(_)) {
                        let sub = open_path_at(dfd, &e.name)?;
                        self.copy_up_tree(sub.as_raw_fd(), Some(&found))?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Make a fresh upper directory hide what the layers have at its path.
    fn make_opaque(&self, dfd: RawFd) -> Result<(), Errno> {
        let c = cstr(OPAQUE_MARKER)?;
        // SAFETY: valid C string; result checked.
        let fd = check(unsafe {
            libc::openat(
                dfd,
                c.as_ptr(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_CLOEXEC,
                0o600,
            )
        })?;
        // SAFETY: openat just returned it.
        drop(unsafe { OwnedFd::from_raw_fd(fd) });
        Ok(())
    }

    /// Record that lower entry `name` of `dir` is gone.
    fn add_whiteout(&self, dfd: RawFd, name: &[u8]) -> Result<(), Errno> {
        let c = cstr(&layers::whiteout(name))?;
        // SAFETY: valid C string; result checked.
        let fd = check(unsafe {
            libc::openat(
                dfd,
                c.as_ptr(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_CLOEXEC,
                0o600,
            )
        })?;
        // SAFETY: openat just returned it.
        drop(unsafe { OwnedFd::from_raw_fd(fd) });
        Ok(())
    }

    /// Get directory node `parent` ready for a new entry `name`: in the
    /// upper directory, with no whiteout of that name. Returns its
    /// descriptor, whether the layers hold a directory there (a new
    /// directory must then be opaque) and whether a whiteout was removed.
    fn prepare_create(
        &self,
        parent: INodeNo,
        name: &[u8],
    ) -> Result<(Arc<OwnedFd>, bool, bool), Errno> {
        if layers::is_hidden(name) {
            // Not representable in a layer (OCI has no escape for it).
            return Err(Errno::EINVAL);
        }
        let pfd = self.copy_up(parent.0)?;
        let p = pfd.as_raw_fd();
        let wh = layers::whiteout(name);
        let had_whiteout = exists_at(p, &wh);
        if had_whiteout {
            unlink_at(p, &wh, 0)?;
        }
        let dir = self.node(parent)?;
        let lower_dir = matches!(
            self.lower_child(&dir, name)
                .map_err(|e| self.read_err(Op::Lookup, &e))?,
            Some(Found::Dir(_))
        );
        Ok((pfd, lower_dir, had_whiteout))
    }

    /// The reply for a new entry `name` of `parent`.
    fn entry_of(&self, parent: INodeNo, name: &[u8]) -> Result<FileAttr, Errno> {
        let dir = self.node(parent)?;
        let child = self.resolve(&dir, name)?.ok_or(Errno::ENOENT)?;
        self.remember(parent.0, name, child)
    }

    /// Remove the upper bookkeeping (whiteouts, opaque marker) of a
    /// directory that is empty in the merged view, so it can be removed or
    /// replaced.
    fn clear_dir(&self, dfd: RawFd) -> Result<(), Errno> {
        let path = format!("/proc/self/fd/{dfd}");
        for e in std::fs::read_dir(&path).map_err(|e| errno_of(&e))? {
            let e = e.map_err(|e| errno_of(&e))?;
            let name = e.file_name().as_bytes().to_vec();
            if layers::is_hidden(&name) {
                unlink_at(dfd, &name, 0)?;
            } else {
                return Err(Errno::ENOTEMPTY);
            }
        }
        Ok(())
    }

    /// Stop mapping `key` to a node whose upper object is gone (its inode
    /// number may be reused by a new file).
    fn unmap_if_gone(&self, key: &Key) {
        let mut t = self.table.lock().expect("table");
        let Some(&id) = t.by_key.get(key) else {
            return;
        };
        if !self.upper_alive(&t, id) {
            t.by_key.remove(key);
        }
    }

    /// Whether a directory is empty in the merged view.
    fn is_empty_dir(&self, child: &Child) -> Result<bool, Errno> {
        Ok(self
            .merged_listing(
                child.upper.as_ref().map(|(fd, _)| fd),
                child.lower.as_deref(),
            )?
            .is_empty())
    }

    /// Remove `name` from `parent` (a file, or a directory with `dir`).
    fn remove(&self, parent: INodeNo, name: &[u8], dir: bool) -> Result<(), Errno> {
        let pnode = self.node(parent)?;
        let child = self.resolve(&pnode, name)?.ok_or(Errno::ENOENT)?;
        let key = self.key_of(parent.0, name, &child)?;
        let lower_has = self
            .lower_child(&pnode, name)
            .map_err(|e| self.read_err(Op::Lookup, &e))?
            .is_some();
        if dir && !self.is_empty_dir(&child)? {
            return Err(Errno::ENOTEMPTY);
        }
        let pfd = self.copy_up(parent.0)?;
        let p = pfd.as_raw_fd();
        if let Some((fd, _)) = &child.upper {
            // A file may stay open after its last name goes: keep its node
            // reachable without a path (fstat of an open, unlinked file).
            if !dir {
                let mut t = self.table.lock().expect("table");
                if let Some(id) = t.by_key.get(&key).copied() {
                    if let Some(n) = t.nodes.get_mut(&id) {
                        if n.upper.is_none() {
                            if let Ok(own) = fd.try_clone() {
                                n.upper = Some(Arc::new(own));
                            }
                        }
                    }
                }
            }
            if dir {
                self.clear_dir(fd.as_raw_fd())?;
                unlink_at(p, name, libc::AT_REMOVEDIR)?;
            } else {
                unlink_at(p, name, 0)?;
            }
        }
        if lower_has {
            self.add_whiteout(p, name)?;
        }
        self.unmap_if_gone(&key);
        Ok(())
    }

    fn do_rename(
        &self,
        parent: INodeNo,
        name: &[u8],
        newparent: INodeNo,
        newname: &[u8],
        flags: RenameFlags,
    ) -> Result<(), Errno> {
        if flags.contains(RenameFlags::RENAME_EXCHANGE)
            || flags.contains(RenameFlags::RENAME_WHITEOUT)
        {
            return Err(Errno::EINVAL);
        }
        if layers::is_hidden(newname) {
            return Err(Errno::EINVAL);
        }
        let pnode = self.node(parent)?;
        let src = self.resolve(&pnode, name)?.ok_or(Errno::ENOENT)?;
        let src_lower = self
            .lower_child(&pnode, name)
            .map_err(|e| self.read_err(Op::Lookup, &e))?
            .is_some();
        let npnode = self.node(newparent)?;
        let dst = self.resolve(&npnode, newname)?;
        if let Some(d) = &dst {
            if flags.contains(RenameFlags::RENAME_NOREPLACE) {
                return Err(Errno::EEXIST);
            }
            // The kernel has checked the types; a directory replaced must
            // be empty in the merged view.
            let d_is_dir = match (&d.upper, d.lower.as_deref()) {
                (Some((_, st)), _) => st.st_mode & libc::S_IFMT == libc::S_IFDIR,
                (None, Some(f)) => matches!(f, Found::Dir(_)),
                _ => false,
            };
            if d_is_dir && !self.is_empty_dir(d)? {
                return Err(Errno::ENOTEMPTY);
            }
        }
        // The node the kernel holds for the source (copy-up works on nodes).
        let attr = self.remember(parent.0, name, src)?;
        let sid = attr.ino.0;
        let r = (|| -> Result<(), Errno> {
            let snode = self.node(attr.ino)?;
            let is_dir = snode.is_dir;
            let sfd = self.copy_up(sid)?;
            let merged_dir = is_dir && snode.lower.is_some();
            if merged_dir {
                self.copy_up_tree(sfd.as_raw_fd(), snode.lower.as_deref())?;
            }
            let (npfd, dst_lower_dir, had_whiteout) = self.prepare_create(newparent, newname)?;
            if let Some((dfd, st)) = dst.as_ref().and_then(|d| d.upper.as_ref()) {
                if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
                    self.clear_dir(dfd.as_raw_fd())?;
                }
            }
            let (a, b) = (cstr(name)?, cstr(newname)?);
            let pfd = self.copy_up(parent.0)?;
            // SAFETY: valid C strings.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_renameat2,
                    pfd.as_raw_fd(),
                    a.as_ptr(),
                    npfd.as_raw_fd(),
                    b.as_ptr(),
                    flags.bits() & libc::RENAME_NOREPLACE,
                )
            };
            if r < 0 {
                let e = last();
                if had_whiteout {
                    let _ = self.add_whiteout(npfd.as_raw_fd(), newname);
                }
                return Err(e);
            }
            if src_lower {
                self.add_whiteout(pfd.as_raw_fd(), name)?;
            }
            if is_dir && (merged_dir || dst_lower_dir) {
                self.make_opaque(sfd.as_raw_fd())?;
            }
            let mut t = self.table.lock().expect("table");
            if let Some(n) = t.nodes.get_mut(&sid) {
                n.parent = newparent.0;
                n.name = newname.to_vec();
                if is_dir {
                    n.lower = None;
                }
            }
            Ok(())
        })();
        if let Some(d) = &dst {
            if let Ok(k) = self.key_of(newparent.0, newname, d) {
                self.unmap_if_gone(&k);
            }
        }
        self.forget_one(sid);
        r
    }

    fn forget_one(&self, id: u64) {
        self.forget_n(id, 1);
    }

    fn forget_n(&self, id: u64, n: u64) {
        if id == 1 {
            return;
        }
        let mut t = self.table.lock().expect("table");
        let gone = match t.nodes.get_mut(&id) {
            Some(node) => {
                node.nlookup = node.nlookup.saturating_sub(n);
                node.nlookup == 0
            }
            None => false,
        };
        if gone {
            if let Some(node) = t.nodes.remove(&id) {
                for k in node.keys {
                    if t.by_key.get(&k) == Some(&id) {
                        t.by_key.remove(&k);
                    }
                }
            }
        }
    }

    /// Decide how a new open of `node` does its I/O and count it: in
    /// passthrough (returning the backing file to reply with) when enabled,
    /// `file` is an upper file and no cached open of the node exists.
    fn io_open(
        &self,
        node: u64,
        file: Option<&File>,
        register: impl FnOnce(&File) -> io::Result<fuser::BackingId>,
    ) -> Option<Arc<fuser::BackingId>> {
        let mut io = self.io.lock().expect("io");
        let st = io.nodes.entry(node).or_default();
        let want = file.filter(|_| self.passthrough.load(Relaxed) && st.cached == 0);
        let backing = match (want, &st.backing) {
            (None, _) => None,
            (Some(_), Some(b)) => Some(b.clone()),
            (Some(f), None) => match register(f) {
                Ok(b) => {
                    let b = Arc::new(b);
                    st.backing = Some(b.clone());
                    Some(b)
                }
                Err(e) => {
                    log::warn!("kernel passthrough refused ({e}); serving reads and writes");
                    self.passthrough.store(false, Relaxed);
                    None
                }
            },
        };
        if backing.is_some() {
            st.passthrough += 1;
        } else {
            st.cached += 1;
        }
        backing
    }

    /// Remember that handle `fh` of `node` was opened (after [`Self::io_open`]).
    fn io_handle(&self, fh: FileHandle, node: u64, passthrough: bool) {
        self.io
            .lock()
            .expect("io")
            .handles
            .insert(fh.0, (node, passthrough));
    }

    /// Forget handle `fh`.
    fn io_release(&self, fh: FileHandle) {
        let mut io = self.io.lock().expect("io");
        let Some((node, pt)) = io.handles.remove(&fh.0) else {
            return;
        };
        if let Some(st) = io.nodes.get_mut(&node) {
            if pt {
                st.passthrough = st.passthrough.saturating_sub(1);
                if st.passthrough == 0 {
                    st.backing = None;
                }
            } else {
                st.cached = st.cached.saturating_sub(1);
            }
            if st.passthrough == 0 && st.cached == 0 {
                io.nodes.remove(&node);
            }
        }
    }

    /// Live statistics as JSON (the hidden stats xattr).
    pub fn stats_json(&self) -> serde_json::Value {
        let s = &self.stats;
        let layers: Vec<_> = self
            .stack
            .layers()
            .iter()
            .map(|i| i.name().to_string())
            .collect();
        json!({
            "image": layers.join(","),
            "layers": layers,
            "upper": self.upper.is_some(),
            "copy_ups": self.copyups.load(Relaxed),
            "pid": std::process::id(),
            "uptime_s": self.started.elapsed().as_secs_f64(),
            "bytes_served": s.bytes_served.load(Relaxed),
            "image_errors": s.image_errors.load(Relaxed),
            "block_cache": {
                "capacity": self.stack.layers().iter().map(|i| i.block_cache().capacity()).sum::<usize>(),
                "size": self.stack.layers().iter().map(|i| i.block_cache().size()).sum::<usize>(),
                "hits": self.stack.layers().iter().map(|i| i.block_cache().stats.hits.load(Relaxed)).sum::<u64>(),
                "misses": self.stack.layers().iter().map(|i| i.block_cache().stats.misses.load(Relaxed)).sum::<u64>(),
                "waits": self.stack.layers().iter().map(|i| i.block_cache().stats.waits.load(Relaxed)).sum::<u64>(),
                "evictions": self.stack.layers().iter().map(|i| i.block_cache().stats.evictions.load(Relaxed)).sum::<u64>(),
            },
            "nodes": self.table.lock().expect("table").nodes.len(),
            "ops": s.ops_json(),
        })
    }

    fn with_write<T>(&self, f: impl FnOnce() -> Result<T, Errno>) -> Result<T, Errno> {
        self.upper()?;
        let _g = self.ns.write().expect("ns lock");
        f()
    }

    #[allow(clippy::too_many_arguments)]
    fn set_attrs(
        &self,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        fh: Option<FileHandle>,
    ) -> Result<FileAttr, Errno> {
        let fd = self.copy_up(ino.0)?;
        let n = self.node(ino)?;
        let st = stat_fd(&fd)?;
        let symlink = st.st_mode & libc::S_IFMT == libc::S_IFLNK;
        let path = proc_path(&fd);
        if uid.is_some() || gid.is_some() {
            // SAFETY: valid descriptor and empty path.
            check(unsafe {
                libc::fchownat(
                    fd.as_raw_fd(),
                    c"".as_ptr(),
                    uid.unwrap_or(u32::MAX),
                    gid.unwrap_or(u32::MAX),
                    libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
                )
            })?;
        }
        if let Some(m) = mode {
            if !symlink {
                // SAFETY: valid C string.
                check(unsafe { libc::chmod(path.as_ptr(), m & 0o7777) })?;
            }
        }
        if let Some(sz) = size {
            let h = fh.and_then(
                |fh| match self.handles.lock().expect("handles").get(&fh.0) {
                    Some(Handle::File(f)) => Some(f.clone()),
                    _ => None,
                },
            );
            match h {
                Some(f) => f.set_len(sz).map_err(|e| errno_of(&e))?,
                // SAFETY: valid C string.
                None => {
                    check(unsafe { libc::truncate(path.as_ptr(), sz as libc::off_t) }).map(drop)?
                }
            }
        }
        if atime.is_some() || mtime.is_some() {
            let times = [timespec(atime), timespec(mtime)];
            if symlink {
                let p = self.copy_up(n.parent)?;
                let c = cstr(&n.name)?;
                // SAFETY: valid C string and array.
                check(unsafe {
                    libc::utimensat(
                        p.as_raw_fd(),
                        c.as_ptr(),
                        times.as_ptr(),
                        libc::AT_SYMLINK_NOFOLLOW,
                    )
                })?;
            } else {
                // SAFETY: valid C string and array.
                check(unsafe {
                    libc::utimensat(libc::AT_FDCWD, path.as_ptr(), times.as_ptr(), 0)
                })?;
            }
        }
        Ok(stat_attr(ino.0, &stat_fd(&fd)?))
    }

    fn do_xattr_list(&self, ino: INodeNo) -> Result<Vec<u8>, Errno> {
        let n = self.node(ino)?;
        if let Some(fd) = &n.upper {
            return xattr_list(&format!("/proc/self/fd/{}", fd.as_raw_fd()));
        }
        let (l, i) = n.lower.as_deref().ok_or(Errno::ENOENT)?.shown();
        let set = self.stack.layers()[l]
            .xattrs(&i)
            .map_err(|e| self.read_err(Op::Listxattr, &e))?;
        let mut names = Vec::new();
        for (k, _) in set.0 {
            names.extend_from_slice(&k);
            names.push(0);
        }
        Ok(names)
    }

    fn do_xattr_get(&self, ino: INodeNo, name: &[u8]) -> Result<Vec<u8>, Errno> {
        if ino.0 == 1 && name == crate::STATS_XATTR.as_bytes() {
            return Ok(self.stats_json().to_string().into_bytes());
        }
        if ino.0 == 1 && name == crate::PID_XATTR.as_bytes() {
            return Ok(std::process::id().to_string().into_bytes());
        }
        let n = self.node(ino)?;
        if let Some(fd) = &n.upper {
            return xattr_get(&format!("/proc/self/fd/{}", fd.as_raw_fd()), name);
        }
        let (l, i) = n.lower.as_deref().ok_or(Errno::ENOENT)?.shown();
        let set = self.stack.layers()[l]
            .xattrs(&i)
            .map_err(|e| self.read_err(Op::Getxattr, &e))?;
        set.0
            .into_iter()
            .find(|(k, _)| k.as_slice() == name)
            .map(|(_, v)| v)
            .ok_or(Errno::NO_XATTR)
    }
}

fn xattr_set(path: &[u8], name: &[u8], value: &[u8], flags: i32) -> Result<(), Errno> {
    let (p, n) = (cstr(path)?, cstr(name)?);
    // SAFETY: valid C strings and buffer.
    check(unsafe {
        libc::setxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            flags,
        )
    })
    .map(drop)
}

fn xattr_get(path: &str, name: &[u8]) -> Result<Vec<u8>, Errno> {
    let (p, n) = (cstr(path.as_bytes())?, cstr(name)?);
    loop {
        // SAFETY: size query.
        let len = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), std::ptr::null_mut(), 0) };
        if len < 0 {
            return Err(last());
        }
        let mut buf = vec![0u8; len as usize];
        // SAFETY: buffer of the given size.
        let got =
            unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        if got >= 0 {
            buf.truncate(got as usize);
            return Ok(buf);
        }
        if last() != Errno::ERANGE {
            return Err(last());
        }
    }
}

fn xattr_list(path: &str) -> Result<Vec<u8>, Errno> {
    let p = cstr(path.as_bytes())?;
    loop {
        // SAFETY: size query.
        let len = unsafe { libc::listxattr(p.as_ptr(), std::ptr::null_mut(), 0) };
        if len < 0 {
            return Err(last());
        }
        let mut buf = vec![0u8; len as usize];
        // SAFETY: buffer of the given size.
        let got = unsafe { libc::listxattr(p.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        if got >= 0 {
            buf.truncate(got as usize);
            return Ok(buf);
        }
        if last() != Errno::ERANGE {
            return Err(last());
        }
    }
}

/// Answer a request that makes an entry.
fn reply_entry(reply: ReplyEntry, r: Result<FileAttr, Errno>) {
    match r {
        Ok(a) => reply.entry(&FOREVER, &a, Generation(0)),
        Err(e) => reply.error(e),
    }
}

/// Answer a getxattr/listxattr.
fn reply_xattr(reply: ReplyXattr, size: u32, v: Result<Vec<u8>, Errno>) {
    match v {
        Ok(v) if size == 0 => reply.size(v.len() as u32),
        Ok(v) if (size as usize) < v.len() => reply.error(Errno::ERANGE),
        Ok(v) => reply.data(&v),
        Err(e) => reply.error(e),
    }
}

impl Filesystem for UnionFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        let want = InitFlags::FUSE_CACHE_SYMLINKS
            | InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_MAX_PAGES
            | InitFlags::FUSE_SPLICE_WRITE;
        // A read-only union lists with attributes when the kernel sees use
        // for them (its listings never change; an overlay's would).
        let want = if self.writable() {
            want
        } else {
            want | InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO
        };
        let have = config.capabilities() & want;
        let _ = config.add_capabilities(have);
        let _ = config.set_max_readahead(MAX_READ);
        let _ = config.set_max_write(MAX_READ);
        // Kernel passthrough of upper files: registering a backing file
        // needs CAP_SYS_ADMIN, so only a root server asks for it.
        // SAFETY: plain getter.
        let root = unsafe { libc::geteuid() } == 0;
        if self.writable()
            && root
            && std::env::var_os("SHEAF_NO_PASSTHROUGH").is_none()
            && config.capabilities().contains(InitFlags::FUSE_PASSTHROUGH)
            && config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
            && config.set_max_stack_depth(1).is_ok()
        {
            self.passthrough.store(true, Relaxed);
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let _t = self.stats.time(Op::Lookup);
        let _g = self.ns.read().expect("ns lock");
        let r = self
            .node(parent)
            .and_then(|dir| match self.resolve(&dir, name.as_bytes())? {
                Some(c) => self.remember(parent.0, name.as_bytes(), c).map(Some),
                None => Ok(None),
            });
        match r {
            Ok(Some(a)) => reply.entry(&FOREVER, &a, Generation(0)),
            Ok(None) => {
                // Node 0 with a timeout: a cached negative entry.
                // SAFETY: an all-zero stat is a valid value.
                let zero: libc::stat = unsafe { std::mem::zeroed() };
                reply.entry(&FOREVER, &stat_attr(0, &zero), Generation(0))
            }
            Err(e) => reply.error(e),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.forget_n(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let _t = self.stats.time(Op::Getattr);
        match self.node(ino).and_then(|n| self.attr(ino.0, &n)) {
            Ok(a) => reply.attr(&FOREVER, &a),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let _t = self.stats.time(Op::Readlink);
        let r = self.node(ino).and_then(|n| {
            if let Some(fd) = &n.upper {
                let mut buf = vec![0u8; libc::PATH_MAX as usize];
                // SAFETY: valid fd, empty path, buffer of the given size.
                let k = unsafe {
                    libc::readlinkat(
                        fd.as_raw_fd(),
                        c"".as_ptr(),
                        buf.as_mut_ptr().cast(),
                        buf.len(),
                    )
                };
                if k < 0 {
                    return Err(last());
                }
                buf.truncate(k as usize);
                return Ok(buf);
            }
            let (l, i) = n.lower.as_deref().ok_or(Errno::ENOENT)?.shown();
            self.stack.layers()[l]
                .read_link(&i)
                .map_err(|e| self.read_err(Op::Readlink, &e))
        });
        match r {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let _t = self.stats.time(Op::Open);
        if !self.writable() {
            // ENOSYS: the kernel stops sending open and keeps the page cache.
            return reply.error(Errno::ENOSYS);
        }
        let f = flags.0;
        let writing = f & libc::O_ACCMODE != libc::O_RDONLY || f & libc::O_TRUNC != 0;
        let r = (|| -> Result<Handle, Errno> {
            let n = self.node(ino)?;
            let fd = match (&n.upper, writing) {
                (Some(fd), _) => fd.clone(),
                (None, false) => {
                    let (l, i) = n.lower.as_deref().ok_or(Errno::ENOENT)?.shown();
                    return Ok(Handle::Lower(l, i));
                }
                (None, true) => {
                    let _g = self.ns.write().expect("ns lock");
                    self.copy_up(ino.0)?
                }
            };
            let path = proc_path(&fd);
            // Reopened through /proc/self/fd (a magic link): O_NOFOLLOW
            // would refuse it, and the kernel resolved the name already.
            let keep = f & !(libc::O_CREAT | libc::O_EXCL | libc::O_NOCTTY | libc::O_NOFOLLOW)
                | libc::O_CLOEXEC;
            // SAFETY: valid C string; result checked.
            let raw = check(unsafe { libc::open(path.as_ptr(), keep) })?;
            // SAFETY: open just returned it.
            Ok(Handle::File(Arc::new(unsafe { File::from_raw_fd(raw) })))
        })();
        let h = match r {
            Ok(h) => h,
            Err(e) => return reply.error(e),
        };
        let file = match &h {
            Handle::File(f) => Some(f.clone()),
            _ => None,
        };
        let backing = self.io_open(ino.0, file.as_deref(), |f| reply.open_backing(f));
        let fh = self.add_handle(h);
        self.io_handle(fh, ino.0, backing.is_some());
        match backing {
            // (The kernel answers EIO to FOPEN_KEEP_CACHE with passthrough.)
            Some(b) => reply.opened_passthrough(fh, FopenFlags::empty(), &b),
            None => reply.opened(fh, FopenFlags::FOPEN_KEEP_CACHE),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let _t = self.stats.time(Op::Read);
        let mut buf = vec![0u8; size.min(MAX_READ) as usize];
        let src = match self.handles.lock().expect("handles").get(&fh.0) {
            Some(Handle::File(f)) => Ok(f.clone()),
            Some(Handle::Lower(l, i)) => Err(Some((*l, *i))),
            _ => Err(None),
        };
        let r = match src {
            Ok(f) => {
                let mut got = 0;
                loop {
                    match f.read_at(&mut buf[got..], offset + got as u64) {
                        Ok(0) => break Ok(got),
                        Ok(k) => {
                            got += k;
                            if got == buf.len() {
                                break Ok(got);
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => break Err(errno_of(&e)),
                    }
                }
            }
            Err(lower) => lower
                .map_or_else(
                    || {
                        self.node(ino)
                            .and_then(|n| Ok(n.lower.as_deref().ok_or(Errno::EIO)?.shown()))
                    },
                    Ok,
                )
                .and_then(|(l, i)| {
                    self.stack.layers()[l]
                        .read(&i, offset, &mut buf)
                        .map_err(|e| self.read_err(Op::Read, &e))
                }),
        };
        match r {
            Ok(k) => {
                self.stats.bytes_served.fetch_add(k as u64, Relaxed);
                reply.data(&buf[..k])
            }
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let file = match self.handles.lock().expect("handles").get(&fh.0) {
            Some(Handle::File(f)) => Some(f.clone()),
            _ => None,
        };
        match file {
            Some(f) => match f.write_all_at(data, offset) {
                Ok(()) => reply.written(data.len() as u32),
                Err(e) => reply.error(errno_of(&e)),
            },
            None => reply.error(Errno::EBADF),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // ENOSYS: the kernel stops sending a flush on every close (writes
        // reach the upper file as they come; there is nothing to flush).
        reply.error(Errno::ENOSYS);
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.handles.lock().expect("handles").remove(&fh.0);
        self.io_release(fh);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let file = match self.handles.lock().expect("handles").get(&fh.0) {
            Some(Handle::File(f)) => Some(f.clone()),
            _ => None,
        };
        let r = match file {
            Some(f) if datasync => f.sync_data(),
            Some(f) => f.sync_all(),
            None => Ok(()),
        };
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno_of(&e)),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let _t = self.stats.time(Op::Open);
        if !self.writable() {
            // ENOSYS: the kernel stops sending opendir and caches listings.
            return reply.error(Errno::ENOSYS);
        }
        let _g = self.ns.read().expect("ns lock");
        match self.node(ino).and_then(|n| self.listing(&n)) {
            // The kernel may keep the listing: every change to the
            // directory goes through this mount and invalidates it.
            Ok(l) => reply.opened(
                self.add_handle(Handle::Dir(Arc::new(l))),
                FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE,
            ),
            Err(e) => reply.error(e),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        // Asked for only by a read-only union (see init): its listings
        // never change, so they come from the cached listing.
        let _t = self.stats.time(Op::Readdirplus);
        let listing = {
            let _g = self.ns.read().expect("ns lock");
            self.cached_listing(ino)
        };
        let l = match listing {
            Ok(l) => l,
            Err(e) => return reply.error(e),
        };
        let dir = match self.node(ino) {
            Ok(d) => d,
            Err(e) => return reply.error(e),
        };
        let mut off = offset.max(2);
        if offset < 2 {
            // "." and ".." are not counted as lookups by the kernel.
            if let Ok(a) = self.attr(ino.0, &dir) {
                if offset == 0 && reply.add(ino, 1, ".", &FOREVER, &a, Generation(0)) {
                    return reply.ok();
                }
                if reply.add(INodeNo(dir.parent), 2, "..", &FOREVER, &a, Generation(0)) {
                    return reply.ok();
                }
            }
            off = 2;
        }
        for (k, e) in l.iter().enumerate().skip((off - 2) as usize) {
            let a = match self.resolve(&dir, &e.name) {
                Ok(Some(c)) => match self.remember(ino.0, &e.name, c) {
                    Ok(a) => a,
                    Err(_) => continue,
                },
                _ => continue,
            };
            if reply.add(
                a.ino,
                k as u64 + 3,
                OsStr::from_bytes(&e.name),
                &FOREVER,
                &a,
                Generation(0),
            ) {
                // Not sent: the kernel did not count this lookup.
                self.forget_one(a.ino.0);
                break;
            }
        }
        reply.ok()
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let _t = self.stats.time(Op::Readdir);
        let listing = match self.handles.lock().expect("handles").get(&fh.0) {
            Some(Handle::Dir(l)) => Some(l.clone()),
            _ => None,
        };
        let listing = match listing {
            Some(l) => Ok(l),
            None => {
                let _g = self.ns.read().expect("ns lock");
                self.cached_listing(ino)
            }
        };
        let l = match listing {
            Ok(l) => l,
            Err(e) => return reply.error(e),
        };
        let parent = self.node(ino).map(|n| n.parent).unwrap_or(1);
        let mut off = offset;
        if off == 0 {
            if reply.add(ino, 1, FileType::Directory, ".") {
                return reply.ok();
            }
            off = 1;
        }
        if off == 1 {
            if reply.add(INodeNo(parent), 2, FileType::Directory, "..") {
                return reply.ok();
            }
            off = 2;
        }
        for (k, e) in l.iter().enumerate().skip((off - 2) as usize) {
            if reply.add(
                INodeNo(e.ino),
                k as u64 + 3,
                e.kind,
                OsStr::from_bytes(&e.name),
            ) {
                break;
            }
        }
        reply.ok()
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.handles.lock().expect("handles").remove(&fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let _t = self.stats.time(Op::Statfs);
        if let Some(u) = &self.upper {
            // SAFETY: zeroed statvfs is a valid out-parameter.
            let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
            // SAFETY: valid descriptor and out-pointer.
            if unsafe { libc::fstatvfs(u.root.as_raw_fd(), &mut s) } == 0 {
                return reply.statfs(
                    s.f_blocks,
                    s.f_bfree,
                    s.f_bavail,
                    s.f_files,
                    s.f_ffree,
                    s.f_bsize as u32,
                    255,
                    s.f_frsize as u32,
                );
            }
        }
        let len: u64 = self.stack.layers().iter().map(|i| i.len()).sum();
        let files: u64 = self
            .stack
            .layers()
            .iter()
            .map(|i| i.superblock().inode_count)
            .sum();
        reply.statfs(len.div_ceil(4096), 0, 0, files, 0, 4096, 255, 4096);
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let _t = self.stats.time(Op::Getxattr);
        reply_xattr(reply, size, self.do_xattr_get(ino, name.as_bytes()))
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let _t = self.stats.time(Op::Listxattr);
        reply_xattr(reply, size, self.do_xattr_list(ino))
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let r = self.with_write(|| {
            let fd = self.copy_up(ino.0)?;
            xattr_set(
                format!("/proc/self/fd/{}", fd.as_raw_fd()).as_bytes(),
                name.as_bytes(),
                value,
                flags,
            )
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let r = self.with_write(|| {
            let fd = self.copy_up(ino.0)?;
            let (p, n) = (proc_path(&fd), cstr(name.as_bytes())?);
            // SAFETY: valid C strings.
            check(unsafe { libc::removexattr(p.as_ptr(), n.as_ptr()) }).map(drop)
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn access(&self, _req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let _t = self.stats.time(Op::Access);
        match self.node(ino) {
            Ok(_) if !self.writable() && mask.contains(AccessFlags::W_OK) => {
                reply.error(Errno::EROFS)
            }
            Ok(_) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let r = self.with_write(|| self.set_attrs(ino, mode, uid, gid, size, atime, mtime, fh));
        match r {
            Ok(a) => reply.attr(&FOREVER, &a),
            Err(e) => reply.error(e),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let name = name.as_bytes();
        let r = self.with_write(|| {
            let (pfd, _, _) = self.prepare_create(parent, name)?;
            let c = cstr(name)?;
            let dev = libc::makedev(
                (rdev >> 8) & 0xfff,
                (rdev & 0xff) | ((rdev >> 12) & 0xfff00),
            );
            // SAFETY: valid C string.
            check(unsafe { libc::mknodat(pfd.as_raw_fd(), c.as_ptr(), mode, dev) })?;
            self.own(req, pfd.as_raw_fd(), name, Some(mode))?;
            self.entry_of(parent, name)
        });
        reply_entry(reply, r)
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let name = name.as_bytes();
        let r = self.with_write(|| {
            let (pfd, lower_dir, _) = self.prepare_create(parent, name)?;
            let c = cstr(name)?;
            // SAFETY: valid C string.
            check(unsafe { libc::mkdirat(pfd.as_raw_fd(), c.as_ptr(), mode & 0o7777) })?;
            self.own(req, pfd.as_raw_fd(), name, None)?;
            if lower_dir {
                let d = open_path_at(pfd.as_raw_fd(), name)?;
                self.make_opaque(d.as_raw_fd())?;
            }
            self.entry_of(parent, name)
        });
        reply_entry(reply, r)
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.with_write(|| self.remove(parent, name.as_bytes(), false)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.with_write(|| self.remove(parent, name.as_bytes(), true)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &std::path::Path,
        reply: ReplyEntry,
    ) {
        let name = link_name.as_bytes();
        let r = self.with_write(|| {
            let (pfd, _, _) = self.prepare_create(parent, name)?;
            let (c, t) = (cstr(name)?, cstr(target.as_os_str().as_bytes())?);
            // SAFETY: valid C strings.
            check(unsafe { libc::symlinkat(t.as_ptr(), pfd.as_raw_fd(), c.as_ptr()) })?;
            self.own(req, pfd.as_raw_fd(), name, None)?;
            self.entry_of(parent, name)
        });
        reply_entry(reply, r)
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let r = self.with_write(|| {
            self.do_rename(
                parent,
                name.as_bytes(),
                newparent,
                newname.as_bytes(),
                flags,
            )
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let name = newname.as_bytes();
        let r = self.with_write(|| {
            let fd = self.copy_up(ino.0)?;
            let (pfd, _, _) = self.prepare_create(newparent, name)?;
            let (src, c) = (proc_path(&fd), cstr(name)?);
            // SAFETY: valid C strings.
            check(unsafe {
                libc::linkat(
                    libc::AT_FDCWD,
                    src.as_ptr(),
                    pfd.as_raw_fd(),
                    c.as_ptr(),
                    libc::AT_SYMLINK_FOLLOW,
                )
            })?;
            // Now hardlinked: its table name may go while it stays.
            if let Some(n) = self.table.lock().expect("table").nodes.get_mut(&ino.0) {
                n.upper = Some(fd.clone());
            }
            self.entry_of(newparent, name)
        });
        reply_entry(reply, r)
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let name = name.as_bytes();
        let r = self.with_write(|| {
            let (pfd, _, _) = self.prepare_create(parent, name)?;
            let c = cstr(name)?;
            let keep = (flags & !(libc::O_NOCTTY | libc::O_CREAT | libc::O_EXCL))
                | libc::O_CREAT
                | libc::O_EXCL
                | libc::O_CLOEXEC;
            // SAFETY: valid C string; result checked.
            let raw =
                check(unsafe { libc::openat(pfd.as_raw_fd(), c.as_ptr(), keep, mode & 0o7777) })?;
            // SAFETY: openat just returned it.
            let f = unsafe { File::from_raw_fd(raw) };
            self.own(req, pfd.as_raw_fd(), name, Some(mode))?;
            let a = self.entry_of(parent, name)?;
            Ok((a, f))
        });
        let (a, f) = match r {
            Ok(x) => x,
            Err(e) => return reply.error(e),
        };
        let f = Arc::new(f);
        let backing = self.io_open(a.ino.0, Some(&f), |f| reply.open_backing(f));
        let fh = self.add_handle(Handle::File(f));
        self.io_handle(fh, a.ino.0, backing.is_some());
        match backing {
            // (The kernel answers EIO to FOPEN_KEEP_CACHE with passthrough.)
            Some(b) => {
                reply.created_passthrough(&FOREVER, &a, Generation(0), fh, FopenFlags::empty(), &b)
            }
            None => reply.created(
                &FOREVER,
                &a,
                Generation(0),
                fh,
                FopenFlags::FOPEN_KEEP_CACHE,
            ),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        reply.error(Errno::ENOTTY);
    }
}
