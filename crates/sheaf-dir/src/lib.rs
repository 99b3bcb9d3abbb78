//! Files in directories sheaf does not trust.
//!
//! A container's upper directory, a shared node cache, a writable
//! directory a broadcast installs into, a pool directory under `/tmp`:
//! someone else can create, rename and link names in them while sheaf
//! works there, often while sheaf runs as root. Every path-based call in
//! such a directory is a race that a planted symbolic link wins (a create
//! that truncates `/etc/shadow`, a lock file made where the link points).
//! This crate is the one way sheaf opens, creates, renames and removes
//! names inside such a directory:
//!
//! - a [`Dir`] holds a descriptor of the directory; every operation names
//!   one entry relative to it (`openat`, `mkdirat`, `renameat`, `unlinkat`,
//!   `fstatat`), never a path the kernel resolves again;
//! - no symbolic link is ever followed below the directory: opens carry
//!   `O_NOFOLLOW` (and directories `O_DIRECTORY`), names are single
//!   components (no `/`, `.` or `..`);
//! - new files are made with `O_CREAT | O_EXCL`, so a name planted first
//!   is an error, never a file written through;
//! - temporaries get unpredictable names from the kernel's random source;
//! - a private directory (the default pool directory) is made mode 0700
//!   and checked every time it is used as OpenSSH checks `~/.ssh`
//!   ([`private_dir`]).
//!
//! The directory a caller names to [`Dir::open`] is taken as the caller
//! names it (links in the path the user typed are the user's); everything
//! below it is not. `sheaf-dir`'s own test `no_plain_creates` fails when a
//! crate that writes into such directories creates a file any other way.

#![warn(missing_docs)]

use rustix::fs::{self as rfs, AtFlags, Mode, OFlags};
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

pub use rustix::fs::{FileType, Stat};

/// How many names a temporary tries before giving up (each is 64 random
/// bits: a clash means someone is planting names).
const TEMP_TRIES: usize = 16;

/// A directory held by descriptor; see the crate documentation.
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
    /// For messages only: never resolved again.
    path: PathBuf,
}

fn errno(e: rustix::io::Errno) -> io::Error {
    io::Error::from(e)
}

/// `e` with `path` in front, one line.
fn at(path: &Path, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

/// `name` if it is one entry of a directory: not empty, no `/`, not `.`
/// or `..`, no NUL.
pub fn single(name: &OsStr) -> io::Result<&OsStr> {
    let b = name.as_bytes();
    if b.is_empty() || b == b"." || b == b".." || b.contains(&b'/') || b.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{:?} is not a single file name", name),
        ));
    }
    Ok(name)
}

/// What `open` reports for a symbolic link met with `O_NOFOLLOW`: ELOOP,
/// said in words.
fn link_refused(path: &Path, e: rustix::io::Errno) -> io::Error {
    if e == rustix::io::Errno::LOOP {
        io::Error::other(format!(
            "{}: is a symbolic link (not followed here: someone else may control this directory)",
            path.display()
        ))
    } else {
        at(path, errno(e))
    }
}

impl Dir {
    /// Open the directory `path` as the caller names it (links in `path`
    /// itself are followed: the caller chose it).
    pub fn open(path: &Path) -> io::Result<Dir> {
        let fd = rfs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| at(path, errno(e)))?;
        Ok(Dir {
            fd,
            path: path.to_path_buf(),
        })
    }

    /// Open the directory `path`, refusing a symbolic link as its last
    /// component (links in its ancestors are followed).
    pub fn open_nofollow(path: &Path) -> io::Result<Dir> {
        let fd = rfs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| link_refused(path, e))?;
        Ok(Dir {
            fd,
            path: path.to_path_buf(),
        })
    }

    /// Create `path` and its missing ancestors (mode `mode` for each one
    /// made), then open it; as [`Dir::open`], links in `path` are followed.
    pub fn create_all(path: &Path, mode: u32) -> io::Result<Dir> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(mode)
            .create(path)
            .map_err(|e| at(path, e))?;
        Dir::open(path)
    }

    /// The path this directory was opened as (for messages).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The descriptor.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Another handle on the same directory.
    pub fn try_clone(&self) -> io::Result<Dir> {
        Ok(Dir {
            fd: self.fd.try_clone()?,
            path: self.path.clone(),
        })
    }

    fn shown(&self, name: &OsStr) -> PathBuf {
        self.path.join(name)
    }

    /// The entry `name` (one component), never followed if a link.
    pub fn sub(&self, name: impl AsRef<OsStr>) -> io::Result<Dir> {
        let name = single(name.as_ref())?;
        let fd = rfs::openat(
            &self.fd,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| link_refused(&self.shown(name), e))?;
        Ok(Dir {
            fd,
            path: self.shown(name),
        })
    }

    /// The directory `rel` below this one (normal components only), each
    /// component opened without following links.
    pub fn sub_path(&self, rel: &Path) -> io::Result<Dir> {
        self.walk(rel, |d, n| d.sub(n))
    }

    /// `step` from this directory along each component of `rel`, which
    /// must stay below it (no `..`, no root).
    fn walk(&self, rel: &Path, step: impl Fn(&Dir, &OsStr) -> io::Result<Dir>) -> io::Result<Dir> {
        let mut d = self.try_clone()?;
        for c in rel.components() {
            match c {
                Component::Normal(n) => d = step(&d, n)?,
                Component::CurDir => {}
                _ => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!(
                            "{}: not a path below {}",
                            rel.display(),
                            self.path.display()
                        ),
                    ))
                }
            }
        }
        Ok(d)
    }

    /// Make the directory `name` (mode `mode` less the umask); an existing
    /// directory (not a link to one) is fine. Returns it opened.
    pub fn create_dir(&self, name: impl AsRef<OsStr>, mode: u32) -> io::Result<Dir> {
        let name = single(name.as_ref())?;
        match rfs::mkdirat(&self.fd, name, Mode::from_raw_mode(mode)) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(e) => return Err(at(&self.shown(name), errno(e))),
        }
        self.sub(name)
    }

    /// [`Dir::create_dir`] for each component of `rel` in turn.
    pub fn create_dir_all(&self, rel: &Path, mode: u32) -> io::Result<Dir> {
        self.walk(rel, |d, n| d.create_dir(n, mode))
    }

    /// A new file `name` (mode `mode` less the umask), open for reading
    /// and writing: an error if anything (a file, a link) has the name.
    pub fn create_new(&self, name: impl AsRef<OsStr>, mode: u32) -> io::Result<File> {
        let name = single(name.as_ref())?;
        let fd = rfs::openat(
            &self.fd,
            name,
            OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(mode),
        )
        .map_err(|e| at(&self.shown(name), errno(e)))?;
        Ok(File::from(fd))
    }

    /// A new file with an unpredictable name `PREFIX<16 hex digits>SUFFIX`
    /// (mode 0600), and that name.
    pub fn temp_file(&self, prefix: &str, suffix: &str) -> io::Result<(OsString, File)> {
        let mut last = None;
        for _ in 0..TEMP_TRIES {
            let mut r = [0u8; 8];
            rustix::rand::getrandom(&mut r, rustix::rand::GetRandomFlags::empty())
                .map_err(errno)?;
            let name = OsString::from(format!("{prefix}{:016x}{suffix}", u64::from_le_bytes(r)));
            match self.create_new(&name, 0o600) {
                Ok(f) => return Ok((name, f)),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("no temporary name")))
    }

    /// Open (creating if missing, mode 0600) the lock file `name`: a
    /// regular file with one link, never a link followed; its contents are
    /// not touched. Lock it with [`flock`].
    pub fn open_lock(&self, name: impl AsRef<OsStr>) -> io::Result<File> {
        let name = single(name.as_ref())?;
        let fd = rfs::openat(
            &self.fd,
            name,
            OFlags::RDWR | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
            Mode::from_raw_mode(0o600),
        )
        .map_err(|e| link_refused(&self.shown(name), e))?;
        let st = rfs::fstat(&fd).map_err(|e| at(&self.shown(name), errno(e)))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile || st.st_nlink != 1 {
            return Err(io::Error::other(format!(
                "{}: not a plain lock file (a special file or one with other links); remove it",
                self.shown(name).display()
            )));
        }
        Ok(File::from(fd))
    }

    /// Open the regular file `name` for reading, never through a link (a
    /// FIFO or device is refused without blocking).
    pub fn open_regular(&self, name: impl AsRef<OsStr>) -> io::Result<File> {
        let name = single(name.as_ref())?;
        let fd = rfs::openat(
            &self.fd,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK | OFlags::NOCTTY,
            Mode::empty(),
        )
        .map_err(|e| link_refused(&self.shown(name), e))?;
        let st = rfs::fstat(&fd).map_err(|e| at(&self.shown(name), errno(e)))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(io::Error::other(format!(
                "{}: not a regular file",
                self.shown(name).display()
            )));
        }
        rfs::fcntl_setfl(&fd, OFlags::empty()).map_err(errno)?;
        Ok(File::from(fd))
    }

    /// Write `bytes` to `name` atomically: a temporary beside it (mode
    /// `mode`), synced, renamed over `name` (a link at `name` is replaced,
    /// not followed).
    pub fn write_atomic(&self, name: impl AsRef<OsStr>, bytes: &[u8], mode: u32) -> io::Result<()> {
        let name = single(name.as_ref())?;
        let (tmp, mut f) = self.temp_file(".sheaf-tmp-", "")?;
        let done = (|| {
            rfs::fchmod(&f, Mode::from_raw_mode(mode)).map_err(errno)?;
            f.write_all(bytes)?;
            f.sync_all()?;
            self.rename(&tmp, name)
        })();
        if done.is_err() {
            let _ = self.remove_file(&tmp);
        }
        done.map_err(|e| at(&self.shown(name), e))
    }

    /// Rename `from` to `to` in this directory (a link at either is the
    /// entry itself, never followed).
    pub fn rename(&self, from: impl AsRef<OsStr>, to: impl AsRef<OsStr>) -> io::Result<()> {
        self.rename_to(from, self, to)
    }

    /// Rename `from` in this directory to `to` in `dir`.
    pub fn rename_to(
        &self,
        from: impl AsRef<OsStr>,
        dir: &Dir,
        to: impl AsRef<OsStr>,
    ) -> io::Result<()> {
        let (from, to) = (single(from.as_ref())?, single(to.as_ref())?);
        rfs::renameat(&self.fd, from, &dir.fd, to).map_err(|e| at(&dir.shown(to), errno(e)))
    }

    /// Remove the entry `name` that is not a directory (a link is removed
    /// itself).
    pub fn remove_file(&self, name: impl AsRef<OsStr>) -> io::Result<()> {
        let name = single(name.as_ref())?;
        rfs::unlinkat(&self.fd, name, AtFlags::empty()).map_err(|e| at(&self.shown(name), errno(e)))
    }

    /// Remove the empty directory `name`.
    pub fn remove_dir(&self, name: impl AsRef<OsStr>) -> io::Result<()> {
        let name = single(name.as_ref())?;
        rfs::unlinkat(&self.fd, name, AtFlags::REMOVEDIR)
            .map_err(|e| at(&self.shown(name), errno(e)))
    }

    /// Remove `name` and, if it is a directory (not a link to one),
    /// everything below it; iterative (no recursion on depth), never
    /// leaving this directory. A missing `name` is fine.
    pub fn remove_all(&self, name: impl AsRef<OsStr>) -> io::Result<()> {
        let name = single(name.as_ref())?.to_os_string();
        match self.stat(&name) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
            Ok(st) if FileType::from_raw_mode(st.st_mode) != FileType::Directory => {
                return self.remove_file(&name)
            }
            Ok(_) => {}
        }
        // A stack of (directory, name of the child being emptied).
        let mut stack: Vec<(Dir, OsString)> = vec![(self.try_clone()?, name)];
        while let Some((parent, child)) = stack.pop() {
            let d = parent.sub(&child)?;
            let mut sub_dir = None;
            for n in d.entries()? {
                let st = d.stat(&n)?;
                if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
                    sub_dir = Some(n);
                    break;
                }
                d.remove_file(&n)?;
            }
            match sub_dir {
                Some(n) => {
                    stack.push((parent, child));
                    stack.push((d, n));
                }
                None => parent.remove_dir(&child)?,
            }
        }
        Ok(())
    }

    /// The entry `name`'s status, not following a link.
    pub fn stat(&self, name: impl AsRef<OsStr>) -> io::Result<Stat> {
        let name = single(name.as_ref())?;
        rfs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| at(&self.shown(name), errno(e)))
    }

    /// This directory's own status.
    pub fn stat_self(&self) -> io::Result<Stat> {
        rfs::fstat(&self.fd).map_err(|e| at(&self.path, errno(e)))
    }

    /// The names in this directory (not `.` and `..`), in the order the
    /// filesystem gives them.
    pub fn entries(&self) -> io::Result<Vec<OsString>> {
        let mut d = rfs::Dir::read_from(&self.fd).map_err(|e| at(&self.path, errno(e)))?;
        let mut v = Vec::new();
        while let Some(e) = d.read() {
            let e = e.map_err(|e| at(&self.path, errno(e)))?;
            let n = e.file_name().to_bytes();
            if n != b"." && n != b".." {
                v.push(OsStr::from_bytes(n).to_os_string());
            }
        }
        Ok(v)
    }

    /// The extended attribute `attr` of this directory itself, if set.
    pub fn xattr(&self, attr: &str) -> io::Result<Option<Vec<u8>>> {
        let mut buf = vec![0u8; 256];
        loop {
            match rfs::fgetxattr(&self.fd, attr, &mut buf) {
                Ok(n) => {
                    buf.truncate(n);
                    return Ok(Some(buf));
                }
                Err(rustix::io::Errno::NODATA) => return Ok(None),
                Err(rustix::io::Errno::RANGE) if buf.len() < 1 << 16 => {
                    buf.resize(buf.len() * 4, 0)
                }
                Err(rustix::io::Errno::NOTSUP) => return Ok(None),
                Err(e) => return Err(at(&self.path, errno(e))),
            }
        }
    }

    /// Remove the extended attribute `attr` of this directory itself.
    pub fn remove_xattr(&self, attr: &str) -> io::Result<()> {
        rfs::fremovexattr(&self.fd, attr).map_err(|e| at(&self.path, errno(e)))
    }

    /// The extended attribute `attr` of the entry `name`, not following a
    /// link: `lgetxattr` on `/proc/self/fd/DIR/NAME`, so the directory is
    /// this descriptor's (the magic link is not a path resolved again) and
    /// the entry itself is never followed.
    pub fn entry_xattr(&self, name: impl AsRef<OsStr>, attr: &str) -> io::Result<Option<Vec<u8>>> {
        let name = single(name.as_ref())?;
        let mut proc = PathBuf::from(format!(
            "/proc/self/fd/{}",
            std::os::fd::AsRawFd::as_raw_fd(&self.fd)
        ));
        proc.push(name);
        let mut buf = vec![0u8; 256];
        loop {
            match rfs::lgetxattr(&proc, attr, &mut buf) {
                Ok(n) => {
                    buf.truncate(n);
                    return Ok(Some(buf));
                }
                Err(rustix::io::Errno::NODATA) | Err(rustix::io::Errno::NOTSUP) => return Ok(None),
                Err(rustix::io::Errno::RANGE) if buf.len() < 1 << 16 => {
                    buf.resize(buf.len() * 4, 0)
                }
                Err(e) => return Err(at(&self.shown(name), errno(e))),
            }
        }
    }

    /// Sync the directory (after a rename, so it survives a crash).
    pub fn sync(&self) -> io::Result<()> {
        rfs::fsync(&self.fd).map_err(|e| at(&self.path, errno(e)))
    }
}

/// This process's umask (read by setting it and back at once).
pub fn umask() -> u32 {
    let m = rustix::process::umask(Mode::from_raw_mode(0o022));
    rustix::process::umask(m);
    m.bits()
}

/// Set the permission bits of the open file `f` (`fchmod`: the file, never
/// a name resolved again).
pub fn set_mode(f: &File, mode: u32) -> io::Result<()> {
    rfs::fchmod(f, Mode::from_raw_mode(mode)).map_err(errno)
}

/// Lock `f` with `flock(2)`: exclusive or shared, waiting or not. `Ok(false)`
/// when `wait` is false and someone else holds a conflicting lock.
pub fn flock(f: &File, exclusive: bool, wait: bool) -> io::Result<bool> {
    use rustix::fs::FlockOperation as Op;
    let op = match (exclusive, wait) {
        (true, true) => Op::LockExclusive,
        (true, false) => Op::NonBlockingLockExclusive,
        (false, true) => Op::LockShared,
        (false, false) => Op::NonBlockingLockShared,
    };
    loop {
        match rfs::flock(f, op) {
            Ok(()) => return Ok(true),
            Err(rustix::io::Errno::INTR) => continue,
            Err(rustix::io::Errno::WOULDBLOCK) if !wait => return Ok(false),
            Err(e) => return Err(errno(e)),
        }
    }
}

/// Why a private directory was refused.
#[derive(Debug)]
pub enum PrivateDirError {
    /// It, or a directory above it, is not owned by this user (or root).
    Owner {
        /// The directory.
        path: PathBuf,
        /// Its owner.
        uid: u32,
    },
    /// It, or a directory above it, can be written by others (and is not
    /// sticky, as `/tmp` is).
    Writable {
        /// The directory.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// It is a symbolic link or not a directory.
    NotDir {
        /// The path.
        path: PathBuf,
    },
    /// It could not be made or opened.
    Io {
        /// The path.
        path: PathBuf,
        /// The cause.
        source: io::Error,
    },
}

impl std::fmt::Display for PrivateDirError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const NEXT: &str = "another user may have made it to take it over; \
                            remove it if it is yours, or choose another directory";
        match self {
            PrivateDirError::Owner { path, uid } => write!(
                f,
                "{}: owned by uid {uid}, not by you ({}): {NEXT}",
                path.display(),
                rustix::process::geteuid().as_raw()
            ),
            PrivateDirError::Writable { path, mode } => write!(
                f,
                "{}: writable by others (mode {:04o}): {NEXT}, or chmod go-w it",
                path.display(),
                mode & 0o7777
            ),
            PrivateDirError::NotDir { path } => write!(
                f,
                "{}: a symbolic link or not a directory: {NEXT}",
                path.display()
            ),
            PrivateDirError::Io { path, source } => write!(f, "{}: {source}", path.display()),
        }
    }
}

impl std::error::Error for PrivateDirError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            PrivateDirError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// A directory only this user can change: checked every time, as OpenSSH
/// checks `~/.ssh`, and made (mode 0700, with its missing ancestors) when
/// missing. `path` itself must be no symbolic link, owned by this user and
/// writable by no one else; every directory above it must be owned by root
/// or this user and writable by no one else unless sticky (as `/tmp`). The
/// directories that exist are checked before anything is made (walked from
/// `/` along the path with links resolved, following none on the way), so
/// nothing is ever created inside a directory someone else controls; the
/// directory returned is the one checked.
pub fn private_dir(path: &Path) -> Result<Dir, PrivateDirError> {
    let io_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| PrivateDirError::Io { path, source }
    };
    // The longest existing prefix, and the names to make below it.
    let mut existing = path.to_path_buf();
    let mut missing = Vec::new();
    loop {
        match std::fs::symlink_metadata(&existing) {
            Ok(m) if existing == path && !m.is_dir() => {
                return Err(PrivateDirError::NotDir {
                    path: path.to_path_buf(),
                })
            }
            Ok(_) => break,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                match (existing.file_name(), existing.parent()) {
                    (Some(n), Some(p)) => {
                        missing.push(n.to_os_string());
                        existing = p.to_path_buf();
                    }
                    _ => return Err(io_err(path)(e)),
                }
            }
            Err(e) => return Err(io_err(&existing)(e)),
        }
    }
    missing.reverse();
    let me = rustix::process::geteuid().as_raw();
    // A link on the way is re-read by every later use of the path: only one
    // that root or this user made (and so only they can change) is taken.
    for a in existing.ancestors() {
        if let Ok(m) = std::fs::symlink_metadata(a) {
            use std::os::unix::fs::MetadataExt;
            if m.file_type().is_symlink() && m.uid() != 0 && m.uid() != me {
                return Err(PrivateDirError::Owner {
                    path: a.to_path_buf(),
                    uid: m.uid(),
                });
            }
        }
    }
    let real = std::fs::canonicalize(&existing).map_err(io_err(&existing))?;
    let check = |fd: &OwnedFd, p: &Path, last: bool| -> Result<(), PrivateDirError> {
        let st = rfs::fstat(fd).map_err(|e| io_err(p)(errno(e)))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
            return Err(PrivateDirError::NotDir {
                path: p.to_path_buf(),
            });
        }
        let owner_ok = st.st_uid == me || (!last && st.st_uid == 0);
        if !owner_ok {
            return Err(PrivateDirError::Owner {
                path: p.to_path_buf(),
                uid: st.st_uid,
            });
        }
        let sticky = st.st_mode & 0o1000 != 0;
        if st.st_mode & 0o022 != 0 && (last || !sticky) {
            return Err(PrivateDirError::Writable {
                path: p.to_path_buf(),
                mode: st.st_mode,
            });
        }
        Ok(())
    };
    let open_flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let mut cur =
        rfs::open("/", open_flags, Mode::empty()).map_err(|e| io_err(Path::new("/"))(errno(e)))?;
    let mut walked = PathBuf::from("/");
    let parts: Vec<OsString> = real
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            _ => None,
        })
        .collect();
    let total = parts.len() + missing.len();
    check(&cur, &walked, total == 0)?;
    for (i, (n, make)) in parts
        .iter()
        .map(|n| (n, false))
        .chain(missing.iter().map(|n| (n, true)))
        .enumerate()
    {
        walked.push(n);
        if make {
            // Made only below a directory just checked.
            match rfs::mkdirat(&cur, n.as_os_str(), Mode::from_raw_mode(0o700)) {
                Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                Err(e) => return Err(io_err(&walked)(errno(e))),
            }
        }
        cur = rfs::openat(&cur, n.as_os_str(), open_flags, Mode::empty()).map_err(|e| {
            if e == rustix::io::Errno::LOOP || e == rustix::io::Errno::NOTDIR {
                PrivateDirError::NotDir {
                    path: walked.clone(),
                }
            } else {
                io_err(&walked)(errno(e))
            }
        })?;
        check(&cur, &walked, i + 1 == total)?;
    }
    // The checked directory, opened for use through the checked descriptor.
    let fd = rfs::openat(
        &cur,
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io_err(path)(errno(e)))?;
    Ok(Dir {
        fd,
        path: path.to_path_buf(),
    })
}

#[cfg(test)]
mod tests;
