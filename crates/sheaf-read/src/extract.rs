//! Extracting an image into a directory (`sheaf extract`), never outside it.
//!
//! Safety comes from four rules:
//!
//! - every name from the image is checked to be a single path component
//!   ([`DirentRecord::is_plain_name`]: no `/`, `.`, `..` or NUL);
//! - the walk never names a path: it holds an open descriptor for each
//!   directory on the current path, opened with `O_DIRECTORY|O_NOFOLLOW`
//!   (so an existing entry is accepted only when it is a real directory),
//!   and creates, links and changes everything relative to it (`openat`,
//!   `mkdirat`, `symlinkat`, `linkat`, `mknodat`, `fchownat`, `utimensat`
//!   with `AT_SYMLINK_NOFOLLOW`); it never changes the working directory,
//!   and paths of any depth work;
//! - attributes of files and directories are set through their open
//!   descriptors (`fchown`, `fsetxattr`, `fchmod`, `futimens`); those of
//!   symlinks and special files through their directory's descriptor, never
//!   following a symlink (extended attributes through
//!   `/proc/self/fd/DIR/NAME` with `lsetxattr`, counted as unrestored when
//!   that fails);
//! - nothing existing is replaced unless asked ([`ExtractOptions::overwrite`],
//!   `sheaf extract -f`): files are created with `O_EXCL` and `O_NOFOLLOW`,
//!   symlinks, links and special files fail on an existing name. Asked, what
//!   is in the way is removed by name in its directory (`unlinkat`: a
//!   planted symlink goes, its target is untouched; a directory only if it
//!   is empty, and only where a non-directory goes; directories merge) and
//!   the entry created again the same way, so one planted meanwhile still
//!   fails the creation. Symlinks are created as they are, never followed.
//!
//! A hostile tree cannot make the walk loop ([`Seen`]) nor exhaust the
//! stack (the walk is a loop over a stack of directory listings, not a
//! recursion: any depth extracts), and descriptors are bounded: below
//! [`MAX_OPEN_DIRS`] levels the oldest ancestors' descriptors are closed;
//! on the way back up each is reopened as its child's `..` when that is the
//! same directory (device and inode as first opened), else by name (again
//! with `O_NOFOLLOW`), so a walk back up costs one open a level.

use crate::tree::terminal_name;
use crate::{Image, Inode, Piece, ReadError, Seen};
use nix::errno::Errno;
use nix::fcntl::{openat, AtFlags, OFlag};
use nix::sys::stat::{
    fchmod, fchmodat, fstatat, futimens, mkdirat, mknodat, utimensat, FchmodatFlags, Mode, SFlag,
    UtimensatFlags,
};
use nix::sys::time::TimeSpec;
use nix::unistd::{fchown, fchownat, linkat, symlinkat, Gid, Uid};
use sheaf_format::{DirentRecord, FileType};
use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::{self, File};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt as _;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use thiserror::Error;
use xattr::FileExt;

/// Directory descriptors held open at most on the current path (the target
/// directory included); deeper walks reopen ancestors by name.
pub const MAX_OPEN_DIRS: usize = 128;

/// What to extract, and where.
#[derive(Debug, Clone, Default)]
pub struct ExtractOptions {
    /// Directory to extract into (created if missing).
    pub target: PathBuf,
    /// Paths inside the image to extract, each with its parent directories
    /// (empty: the whole tree, and the root's attributes go to `target`).
    pub paths: Vec<Vec<u8>>,
    /// Go on past an entry the image cannot give (a bad block, a damaged
    /// directory or inode): it is listed in [`ExtractReport::lost`] and left
    /// out, and everything that verifies is extracted. Without it the first
    /// such entry stops the extraction. A file is never left half-written:
    /// one whose data fails is removed either way.
    pub keep_going: bool,
    /// Polled between entries and between the pieces of a file: once set,
    /// the extraction stops with [`ExtractError::Cancelled`] (the file being
    /// written is removed). `sheaf extract` passes the flag its SIGINT and
    /// SIGTERM handlers set.
    pub cancel: Option<&'static AtomicBool>,
    /// Create character and block devices (as root; without root they
    /// cannot be made and are noted as unrestored). Off by default: an
    /// image's author chooses their numbers and modes (a `c 1:1` of mode
    /// 0666 is `/dev/mem` for everyone), so they are skipped and counted
    /// in [`ExtractReport::skipped_devices`]. Fifos and sockets are always
    /// made.
    pub devices: bool,
    /// Replace what the target already holds where an entry goes (a file,
    /// symlink or special file; an empty directory where a non-directory
    /// goes), as `unsquashfs -f`; directories are merged either way.
    /// Without it an existing name stops the extraction
    /// ([`ExtractError::Exists`]).
    pub overwrite: bool,
    /// Keep the setuid and setgid bits of files (not directories, whose
    /// setgid only passes the group on). Off by default: they are cleared
    /// and counted in [`ExtractReport::setuid_cleared`], so an extraction
    /// as root makes no setuid-root program the image's author wrote (nor,
    /// as a user, a program that runs as that user for everyone).
    pub setuid: bool,
}

/// An entry [`extract`] left out because the image could not give it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lost {
    /// Its path relative to the target (a directory's ends in `/`: what it
    /// holds past the damage is lost with it).
    pub path: String,
    /// Why, one line (names the image and the bad part).
    pub error: String,
}

/// What an extraction did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExtractReport {
    /// The target directory, canonical.
    pub directory: PathBuf,
    /// Entries extracted (hardlinks and unrestorable special files count).
    pub entries: u64,
    /// Bytes of regular files written.
    pub bytes: u64,
    /// Attributes that could not be set (ownership without root, devices
    /// without root, extended attributes the filesystem refuses, ...).
    pub unrestored: u64,
    /// The first of those, as "NAME: what: why".
    pub first_unrestored: Option<String>,
    /// With [`ExtractOptions::keep_going`]: what could not be read, in the
    /// order met.
    pub lost: Vec<Lost>,
    /// Character and block devices not created (without
    /// [`ExtractOptions::devices`]); they count in `entries`.
    pub skipped_devices: u64,
    /// The first of those, its path relative to the target (quoted).
    pub first_skipped_device: Option<String>,
    /// Files whose setuid or setgid bit was cleared (without
    /// [`ExtractOptions::setuid`]; a hard link's names count once).
    pub setuid_cleared: u64,
    /// The first of those, its path relative to the target (quoted).
    pub first_setuid_cleared: Option<String>,
}

/// Why an extraction stopped. What it had written stays.
#[derive(Debug, Error)]
pub enum ExtractError {
    /// A system call on the target failed.
    #[error("{path}: {cause}")]
    Io {
        /// What it concerned: an entry's path relative to the target (a
        /// failed mode change names the entry alone, as `sheaf extract`
        /// always has), or the target as given.
        path: String,
        /// Cause.
        #[source]
        cause: io::Error,
    },
    /// Something is already where an entry goes, and
    /// [`ExtractOptions::overwrite`] was not given.
    #[error("{0}: already exists")]
    Exists(String),
    /// The walk needed a directory where something else exists.
    #[error("{0}: exists and is not a directory")]
    NotADirectory(String),
    /// The image holds a name that is not a single path component.
    #[error("image contains an unsafe entry name {0}; refusing to extract it")]
    UnsafeName(String),
    /// The image could not be read (its message names the image and part).
    #[error(transparent)]
    Read(#[from] ReadError),
    /// [`ExtractOptions::cancel`] was set.
    #[error("extraction cancelled")]
    Cancelled,
}

/// Why a file's data could not be written ([`Walk::file_data`]).
enum DataError {
    Read(ReadError),
    Write(io::Error),
    Cancelled,
}

/// Zero runs of a data chunk at least this long, aligned in their block,
/// become holes; a shorter one (at a chunk's ends) is looked at each time.
const ZERO_WINDOW: usize = 64 << 10;

fn io_err(path: impl Into<String>) -> impl FnOnce(io::Error) -> ExtractError {
    let path = path.into();
    move |cause| ExtractError::Io { path, cause }
}

fn errno(e: Errno) -> io::Error {
    io::Error::from(e)
}

fn safe_name(name: &[u8]) -> Result<&OsStr, ExtractError> {
    if !DirentRecord::is_plain_name(name) {
        return Err(ExtractError::UnsafeName(terminal_name(name)));
    }
    Ok(OsStr::from_bytes(name))
}

/// `rel/name`, as messages show it: quoted as a terminal must see it
/// ([`terminal_name`]), since an image's names are the author's.
fn shown(rel: &Path, name: &OsStr) -> String {
    quoted(&rel.join(name))
}

/// A path from the image, quoted for messages.
fn quoted(p: &Path) -> String {
    terminal_name(p.as_os_str().as_bytes())
}

/// Remove what is at `name` in `dir`, never following it: a file, symlink
/// or special file, or an empty directory.
fn remove_in(dir: &File, name: &OsStr) -> nix::Result<()> {
    use nix::unistd::{unlinkat, UnlinkatFlags};
    match unlinkat(dir, name, UnlinkatFlags::NoRemoveDir) {
        Err(Errno::EISDIR) => unlinkat(dir, name, UnlinkatFlags::RemoveDir),
        r => r,
    }
}

/// Open the directory `name` in `dir`, refusing anything that is not a
/// real directory (a symlink to one included).
fn open_dir(dir: &File, name: &OsStr) -> nix::Result<File> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    openat(dir, name, flags, Mode::empty()).map(File::from)
}

/// Extract `opts.paths` of `img` (everything when empty) into
/// `opts.target`, which is created if missing.
pub fn extract(img: &Image, opts: &ExtractOptions) -> Result<ExtractReport, ExtractError> {
    extract_with(img, opts, MAX_OPEN_DIRS)
}

fn extract_with(
    img: &Image,
    opts: &ExtractOptions,
    max_open: usize,
) -> Result<ExtractReport, ExtractError> {
    let target = &opts.target;
    // trusted-path: the target the user named; below it, nothing is followed
    fs::create_dir_all(target).map_err(io_err(target.display().to_string()))?;
    let root = fs::canonicalize(target).map_err(io_err(target.display().to_string()))?;
    let root_fd = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(&root)
        .map_err(io_err(root.display().to_string()))?;
    let mut w = Walk {
        img,
        dirs: Dirs::new(root_fd, max_open),
        rel: PathBuf::new(),
        links: HashMap::new(),
        report: ExtractReport {
            directory: root,
            ..Default::default()
        },
        // SAFETY: geteuid has no preconditions.
        is_root: unsafe { libc::geteuid() } == 0,
        zero_windows: HashMap::new(),
        cancel: opts.cancel,
        seen: Seen::new(img),
        keep_going: opts.keep_going,
        devices: opts.devices,
        setuid: opts.setuid,
        overwrite: opts.overwrite,
    };
    let all: [Vec<u8>; 1] = [b"/".to_vec()];
    let paths = if opts.paths.is_empty() {
        &all[..]
    } else {
        &opts.paths[..]
    };
    for p in paths {
        let ino = img.resolve(p)?;
        let comps: Vec<&[u8]> = p
            .split(|&b| b == b'/')
            .filter(|c| !c.is_empty() && *c != b".")
            .collect();
        w.dirs.truncate(1);
        w.rel = PathBuf::new();
        match comps.split_last() {
            None => {
                w.contents(&ino)?;
                let root = w.dirs.top(&w.rel)?;
                w.set_attrs(&ino, Target::Fd(&root), OsStr::new("."))?;
            }
            Some((leaf, parents)) => {
                for c in parents {
                    w.enter(safe_name(c)?, 0o755)?;
                }
                let r = w.one(&ino, leaf);
                w.lose(terminal_name(p), r)?;
            }
        }
    }
    Ok(w.report)
}

/// What attributes are set on: an open file or directory, or a name in a
/// directory (symlinks and special files, which are not opened).
#[derive(Clone, Copy)]
enum Target<'f> {
    Fd(&'f File),
    At(&'f File, &'f OsStr),
}

struct Walk<'a> {
    img: &'a Image,
    /// The directories on the current path, the target first.
    dirs: Dirs,
    /// The current directory, relative to the target (for messages and links).
    rel: PathBuf,
    /// Inode → path (relative to the target) of its first extracted name.
    links: HashMap<u32, PathBuf>,
    report: ExtractReport,
    is_root: bool,
    /// (data block, [`ZERO_WINDOW`]-sized window of it) → whether the
    /// window is all zero: a block many chunks name (a deduplicated zero
    /// block) is looked at once.
    zero_windows: HashMap<(u32, u32), bool>,
    cancel: Option<&'static AtomicBool>,
    /// Directories entered, so a hostile image cannot make the walk loop.
    seen: Seen,
    keep_going: bool,
    /// [`ExtractOptions::devices`] and [`ExtractOptions::setuid`].
    devices: bool,
    setuid: bool,
    /// [`ExtractOptions::overwrite`].
    overwrite: bool,
}

impl Walk<'_> {
    fn note(&mut self, what: String) {
        self.report.unrestored += 1;
        self.report.first_unrestored.get_or_insert(what);
    }

    /// Run `make`, which creates `name` in `dir`; where something is
    /// already there: [`ExtractError::Exists`], or with `overwrite`, that
    /// thing removed ([`remove_in`]) and `make` run once more. The inner
    /// result is `make`'s own.
    fn create<T>(
        &self,
        dir: &File,
        name: &OsStr,
        mut make: impl FnMut() -> nix::Result<T>,
    ) -> Result<nix::Result<T>, ExtractError> {
        match make() {
            Err(Errno::EEXIST) if self.overwrite => {
                remove_in(dir, name).map_err(|e| io_err(shown(&self.rel, name))(errno(e)))?;
                Ok(make())
            }
            Err(Errno::EEXIST) => Err(ExtractError::Exists(shown(&self.rel, name))),
            r => Ok(r),
        }
    }

    fn cancelled(&self) -> bool {
        self.cancel.is_some_and(|c| c.load(Ordering::Relaxed))
    }

    /// Write regular file `ino`'s bytes into `f` (new and empty; the caller
    /// sets its length). Only data chunks are read: holes and gaps between
    /// chunks, and all-zero windows of the data (a deduplicated zero block),
    /// are skipped and stay holes, so a file's cost follows what the image
    /// stores, not its size. The cancel flag is polled at every chunk.
    fn file_data(&mut self, ino: &Inode, f: &File) -> Result<(), DataError> {
        let img = self.img;
        let size = ino.rec.size;
        // A read of nothing checks the file's chunk range.
        img.read(ino, 0, &mut []).map_err(DataError::Read)?;
        let (start, n) = (ino.rec.data, u64::from(ino.rec.count));
        // Bytes before `done` are written or known to be zero.
        let mut done = 0u64;
        for i in 0..n {
            if self.cancelled() {
                return Err(DataError::Cancelled);
            }
            let c = img.chunk(start + i).map_err(DataError::Read)?;
            let from = done.max(c.file_offset);
            let end = c.file_offset.saturating_add(u64::from(c.len));
            if c.is_hole() || from >= size || from >= end {
                continue;
            }
            // The reader checks the chunk (within the file, within its
            // block) and hands over slices of the cached block.
            let to = end.min(size);
            let mut at = from;
            let block = std::cell::Cell::new(c.block);
            let mut failed = None;
            let zero = &mut self.zero_windows;
            img.read_pieces(
                ino,
                from,
                (to - from) as usize,
                &mut |id, _| block.set(id),
                &mut |p| {
                    let n = p.len() as u64;
                    if let (Piece::Bytes(b, r), None) = (&p, &failed) {
                        if let Err(e) = write_nonzero(f, at, block.get(), b, r.clone(), zero) {
                            failed = Some(e);
                        }
                    }
                    at += n;
                },
            )
            .map_err(DataError::Read)?;
            if let Some(e) = failed {
                return Err(DataError::Write(e));
            }
            done = to;
        }
        Ok(())
    }

    /// Create (or verify) a real directory `name` in the current one and
    /// make it current.
    fn enter(&mut self, name: &OsStr, mode: u32) -> Result<(), ExtractError> {
        let parent = self.dirs.top(&self.rel)?;
        let err = |e: Errno| ExtractError::Io {
            path: shown(&self.rel, name),
            cause: errno(e),
        };
        let mkdir = || match mkdirat(&*parent, name, Mode::from_bits_truncate(mode | 0o700)) {
            Ok(()) | Err(Errno::EEXIST) => open_dir(&parent, name),
            Err(e) => Err(e),
        };
        let fd = match mkdir() {
            Ok(fd) => fd,
            // A file or symlink where a directory goes: with overwrite it
            // goes (a symlink is not followed), and the directory is made.
            Err(Errno::ENOTDIR | Errno::ELOOP) if self.overwrite => {
                match remove_in(&parent, name).and_then(|()| mkdir()) {
                    Ok(fd) => fd,
                    Err(Errno::ENOTDIR | Errno::ELOOP) => {
                        return Err(ExtractError::NotADirectory(shown(&self.rel, name)))
                    }
                    Err(e) => return Err(err(e)),
                }
            }
            Err(Errno::ENOTDIR | Errno::ELOOP) => {
                return Err(ExtractError::NotADirectory(shown(&self.rel, name)))
            }
            Err(e) => return Err(err(e)),
        };
        drop(parent);
        self.dirs.push(name.to_owned(), fd);
        self.rel.push(name);
        Ok(())
    }

    /// Make the parent of the current directory current; returns the
    /// descriptor of the one left.
    fn leave(&mut self) -> Result<Rc<File>, ExtractError> {
        let fd = self.dirs.top(&self.rel)?;
        self.dirs.truncate(self.dirs.len() - 1);
        self.rel.pop();
        self.dirs.reopen_parent(&fd);
        Ok(fd)
    }

    /// With `keep_going`, a read error about `what` (a path relative to
    /// the target) is recorded and passed over; any other error stops.
    fn lose(&mut self, what: String, r: Result<(), ExtractError>) -> Result<(), ExtractError> {
        match r {
            Err(ExtractError::Read(e)) if self.keep_going => {
                self.report.lost.push(Lost {
                    path: what,
                    error: sheaf_format::one_line(&e),
                });
                Ok(())
            }
            r => r,
        }
    }

    /// Start listing directory `dir` (entered already): a walk enters
    /// each directory once.
    fn listing(&mut self, dir: &Inode, name: &OsStr) -> Result<Listing, ExtractError> {
        self.seen.enter(self.img, dir)?;
        Ok(Listing {
            dir: *dir,
            name: name.to_owned(),
            n: self.img.dir_len(dir)?,
            from: 0,
            batch: Vec::new().into_iter(),
        })
    }

    /// Extract what directory `dir` (the current one) holds, the whole
    /// subtree. Iterative: the directories on the path are a stack of
    /// [`Listing`]s, so no depth of the image's tree can exhaust the
    /// thread's stack. Each directory's attributes are set when its listing
    /// ends (after what it holds, so its mode and mtime stay as stored).
    fn contents(&mut self, dir: &Inode) -> Result<(), ExtractError> {
        let mut stack = vec![self.listing(dir, OsStr::new(""))?];
        while let Some(top) = stack.last_mut() {
            if self.cancelled() {
                return Err(ExtractError::Cancelled);
            }
            let Some(e) = top.batch.next() else {
                if top.from < top.n {
                    match self.img.read_dir(&top.dir, top.from, 4096) {
                        Ok(b) if !b.is_empty() => {
                            top.from += b.len() as u64;
                            top.batch = b.into_iter();
                        }
                        r => {
                            top.from = top.n;
                            let here = format!("{}/", quoted(&self.rel));
                            let r = r.map(drop).map_err(ExtractError::from);
                            self.lose(here, r)?;
                        }
                    }
                    continue;
                }
                // This directory is done.
                let done = stack.pop().expect("a listing is on the stack");
                if stack.is_empty() {
                    return Ok(());
                }
                let fd = self.leave()?;
                let r = self.set_attrs(&done.dir, Target::Fd(&fd), &done.name);
                self.entry_failed(&done.name, r)?;
                continue;
            };
            let dir = top.dir;
            let name = OsStr::from_bytes(&e.name);
            let r = match self.img.child(&dir, e.ino, e.file_type) {
                Err(err) => Err(err.into()),
                Ok(ino) if ino.file_type() == FileType::Directory => {
                    match self.down(&ino, &e.name) {
                        Ok(l) => {
                            stack.push(l);
                            continue;
                        }
                        Err(err) => Err(err),
                    }
                }
                Ok(ino) => self.one(&ino, &e.name),
            };
            self.entry_failed(name, r)?;
        }
        Ok(())
    }

    /// Create and enter directory `name` for `ino` and start its listing.
    fn down(&mut self, ino: &Inode, name: &[u8]) -> Result<Listing, ExtractError> {
        let name = safe_name(name)?;
        self.report.entries += 1;
        self.enter(name, ino.rec.mode & 0o7777)?;
        match self.listing(ino, name) {
            Ok(l) => Ok(l),
            Err(e) => {
                self.leave()?;
                Err(e)
            }
        }
    }

    /// An entry `name` of the current directory failed with `r` (if it
    /// did): passed over with `keep_going` when the image could not give it.
    fn entry_failed(
        &mut self,
        name: &OsStr,
        r: Result<(), ExtractError>,
    ) -> Result<(), ExtractError> {
        if r.is_err() {
            let what = shown(&self.rel, name);
            self.lose(what, r)?;
        }
        Ok(())
    }

    /// Extract one entry named `name` into the current directory.
    fn one(&mut self, ino: &Inode, name: &[u8]) -> Result<(), ExtractError> {
        let name = safe_name(name)?;
        self.report.entries += 1;
        let r = ino.rec;
        if ino.file_type() == FileType::Directory {
            // A path named on the command line; the walk below it is
            // iterative ([`Walk::contents`]).
            self.enter(name, r.mode & 0o7777)?;
            let listed = self.contents(ino);
            let fd = self.leave()?;
            listed?;
            return self.set_attrs(ino, Target::Fd(&fd), name);
        }
        let dir = self.dirs.top(&self.rel)?;
        if r.nlink > 1 {
            if let Some(first) = self.links.get(&ino.ino) {
                // linkat without AT_SYMLINK_FOLLOW links the entry itself.
                let first = first.clone();
                return self.link(&first, &dir, name);
            }
            self.links.insert(ino.ino, self.rel.join(name));
        }
        match ino.file_type() {
            FileType::Directory => unreachable!("handled above"),
            FileType::Regular => {
                let flags = OFlag::O_WRONLY
                    | OFlag::O_CREAT
                    | OFlag::O_EXCL
                    | OFlag::O_NOFOLLOW
                    | OFlag::O_CLOEXEC;
                let f = self
                    .create(&dir, name, || {
                        openat(&*dir, name, flags, Mode::from_bits_truncate(0o600))
                    })?
                    .map(File::from)
                    .map_err(|e| io_err(shown(&self.rel, name))(errno(e)))?;
                let failed = match self.file_data(ino, &f) {
                    Ok(()) => None,
                    Err(DataError::Write(e)) => {
                        return Err(io_err(shown(&self.rel, name))(e));
                    }
                    Err(DataError::Read(e)) => Some(ExtractError::Read(e)),
                    Err(DataError::Cancelled) => Some(ExtractError::Cancelled),
                };
                if let Some(e) = failed {
                    // No half-written file stays behind (nor a later hard
                    // link to it).
                    self.links.remove(&ino.ino);
                    self.report.entries -= 1;
                    let _ =
                        nix::unistd::unlinkat(&*dir, name, nix::unistd::UnlinkatFlags::NoRemoveDir);
                    return Err(e);
                }
                f.set_len(r.size).map_err(io_err(shown(&self.rel, name)))?;
                self.report.bytes += r.size;
                self.set_attrs(ino, Target::Fd(&f), name)
            }
            FileType::Symlink => {
                let target = self.img.read_link(ino)?;
                self.create(&dir, name, || {
                    symlinkat(OsStr::from_bytes(&target), &*dir, name)
                })?
                .map_err(|e| io_err(shown(&self.rel, name))(errno(e)))?;
                self.set_attrs(ino, Target::At(&dir, name), name)
            }
            t => {
                let is_dev = matches!(t, FileType::CharDevice | FileType::BlockDevice);
                if is_dev && !self.devices {
                    // Not made: no name for later hard links to find.
                    self.links.remove(&ino.ino);
                    self.report.skipped_devices += 1;
                    let what = shown(&self.rel, name);
                    self.report.first_skipped_device.get_or_insert(what);
                    return Ok(());
                }
                let dev = if is_dev { r.data } else { 0 };
                let kind = SFlag::from_bits_truncate(r.mode & libc::S_IFMT);
                // Permission bits only (set_attrs sets the mode again).
                let perm = Mode::from_bits_truncate(r.mode & 0o1777);
                match self.create(&dir, name, || {
                    mknodat(&*dir, name, kind, perm, dev as libc::dev_t)
                })? {
                    Ok(()) => self.set_attrs(ino, Target::At(&dir, name), name),
                    Err(Errno::EPERM) => {
                        let what = format!("{}: {} needs root", shown(&self.rel, name), t.name());
                        self.note(what);
                        Ok(())
                    }
                    Err(e) => Err(io_err(shown(&self.rel, name))(errno(e))),
                }
            }
        }
    }

    /// Link `name` in `dir` to `first` (relative to the target), opening
    /// `first`'s directory from the target down, one real directory at a time.
    fn link(&self, first: &Path, dir: &Rc<File>, name: &OsStr) -> Result<(), ExtractError> {
        let err = |e: Errno| io_err(shown(&self.rel, name))(errno(e));
        let (Some(parent), Some(leaf)) = (first.parent(), first.file_name()) else {
            unreachable!("a first name is a name in a directory");
        };
        let from = if parent == self.rel.as_path() {
            dir.clone()
        } else {
            // O_PATH: like the path walk of link(2), this needs search
            // permission only (the first name's directory may be finished,
            // its mode already applied).
            let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
            let mut cur = self.dirs.root();
            for c in parent.iter() {
                let next = openat(&*cur, c, flags, Mode::empty()).map_err(err)?;
                cur = Rc::new(File::from(next));
            }
            cur
        };
        self.create(dir, name, || {
            linkat(&*from, leaf, &**dir, name, AtFlags::empty())
        })?
        .map_err(err)
    }

    /// Owner, xattrs, mode, then mtime (in that order: chown clears setuid
    /// and writing xattrs may touch ctime, never mtime). `name` is what
    /// notes call it.
    fn set_attrs(&mut self, ino: &Inode, t: Target, name: &OsStr) -> Result<(), ExtractError> {
        let r = ino.rec;
        let is_link = ino.file_type() == FileType::Symlink;
        let (uid, gid) = (Some(Uid::from_raw(r.uid)), Some(Gid::from_raw(r.gid)));
        let owned = match t {
            Target::Fd(f) => fchown(f, uid, gid),
            Target::At(d, n) => fchownat(d, n, uid, gid, AtFlags::AT_SYMLINK_NOFOLLOW),
        };
        if let (Err(e), true) = (owned, self.is_root) {
            self.note(format!("{}: owner: {}", quoted(name.as_ref()), errno(e)));
        }
        for (k, v) in self.img.xattrs(ino)?.0 {
            let k = OsStr::from_bytes(&k);
            let set = match t {
                Target::Fd(f) => f.set_xattr(k, &v),
                Target::At(d, n) => {
                    // No `lsetxattrat` before Linux 6.13: name the entry
                    // through its directory's descriptor, not following it.
                    let mut p = OsString::from(format!("/proc/self/fd/{}/", d.as_raw_fd()));
                    p.push(n);
                    xattr::set(Path::new(&p), k, &v)
                }
            };
            if let Err(e) = set {
                self.note(format!(
                    "{}: xattr {}: {e}",
                    quoted(name.as_ref()),
                    terminal_name(k.as_bytes())
                ));
            }
        }
        if !is_link {
            let mut bits = r.mode & 0o7777;
            let set_id = libc::S_ISUID | libc::S_ISGID;
            if bits & set_id != 0 && !self.setuid && ino.file_type() != FileType::Directory {
                bits &= !set_id;
                self.report.setuid_cleared += 1;
                let what = shown(&self.rel, name);
                self.report.first_setuid_cleared.get_or_insert(what);
            }
            let mode = Mode::from_bits_truncate(bits);
            let changed = match t {
                Target::Fd(f) => fchmod(f, mode).map_err(errno),
                Target::At(d, n) => chmod_at(d, n, mode),
            };
            changed.map_err(io_err(quoted(name.as_ref())))?;
        }
        let ts = TimeSpec::new(r.mtime_sec as _, r.mtime_nsec as _);
        let timed = match t {
            Target::Fd(f) => futimens(f, &ts, &ts),
            Target::At(d, n) => utimensat(d, n, &ts, &ts, UtimensatFlags::NoFollowSymlink),
        };
        if let Err(e) = timed {
            self.note(format!("{}: mtime: {}", quoted(name.as_ref()), errno(e)));
        }
        Ok(())
    }
}

/// Write bytes `r` of data block `id` (decoded as far as `b`) at `at` in
/// `f`, leaving out the windows that are all zero (they stay holes). A
/// window wholly inside `r` is judged once per block and remembered in
/// `zero`; only the partial windows at the ends are looked at each time.
fn write_nonzero(
    f: &File,
    at: u64,
    id: u32,
    b: &[u8],
    r: std::ops::Range<usize>,
    zero: &mut HashMap<(u32, u32), bool>,
) -> io::Result<()> {
    let mut s = r.start;
    while s < r.end {
        let w = s / ZERO_WINDOW;
        let e = ((w + 1) * ZERO_WINDOW).min(r.end);
        let part = &b[s..e];
        let whole = s == w * ZERO_WINDOW && e == (w + 1) * ZERO_WINDOW;
        let is_zero = if whole {
            *zero
                .entry((id, w as u32))
                .or_insert_with(|| part.iter().all(|&x| x == 0))
        } else {
            part.iter().all(|&x| x == 0)
        };
        if !is_zero {
            f.write_all_at(part, at + (s - r.start) as u64)?;
        }
        s = e;
    }
    Ok(())
}

/// chmod a special file by name without following a symlink. Before
/// `fchmodat2` (Linux 6.6, glibc 2.39) the C library emulates
/// `AT_SYMLINK_NOFOLLOW` through `/proc` and answers `EOPNOTSUPP` for a
/// symlink or when `/proc` is missing; then a name that is not a symlink is
/// changed with a plain `fchmodat`.
fn chmod_at(dir: &File, name: &OsStr, mode: Mode) -> io::Result<()> {
    match fchmodat(dir, name, mode, FchmodatFlags::NoFollowSymlink) {
        Err(Errno::EOPNOTSUPP) => {
            let st = fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW).map_err(errno)?;
            if st.st_mode & libc::S_IFMT == libc::S_IFLNK {
                return Err(errno(Errno::EOPNOTSUPP));
            }
            fchmodat(dir, name, mode, FchmodatFlags::FollowSymlink).map_err(errno)
        }
        r => r.map_err(errno),
    }
}

/// A directory being extracted: where its listing is.
struct Listing {
    dir: Inode,
    /// Its name in its parent (for messages and attributes).
    name: OsString,
    /// Its entry count, and how many have been read.
    n: u64,
    from: u64,
    /// Entries read and not yet extracted.
    batch: std::vec::IntoIter<crate::DirEntry>,
}

/// One directory on the current path: its name in its parent and, unless
/// closed to save descriptors, an open descriptor.
struct Level {
    name: OsString,
    fd: Option<Rc<File>>,
    /// Device and inode of the directory when it was first opened.
    id: (u64, u64),
}

fn dir_id(fd: &File) -> (u64, u64) {
    nix::sys::stat::fstat(fd).map_or((u64::MAX, u64::MAX), |st| (st.st_dev, st.st_ino))
}

/// The directories on the current path, the target first (always open),
/// with at most `max_open` descriptors open: the oldest ancestors' are
/// closed first, and reopened by name when the walk comes back.
struct Dirs {
    levels: Vec<Level>,
    open: usize,
    max_open: usize,
    /// Levels `1..closed_below` are all closed.
    closed_below: usize,
}

impl Dirs {
    fn new(root: File, max_open: usize) -> Dirs {
        Dirs {
            levels: vec![Level {
                name: OsString::new(),
                id: dir_id(&root),
                fd: Some(Rc::new(root)),
            }],
            open: 1,
            max_open: max_open.max(2),
            closed_below: 1,
        }
    }

    fn len(&self) -> usize {
        self.levels.len()
    }

    fn root(&self) -> Rc<File> {
        self.levels[0].fd.clone().expect("the target stays open")
    }

    /// Close the oldest open descriptor below the target until one more fits.
    fn make_room(&mut self) {
        while self.open >= self.max_open {
            let mut i = self.closed_below.max(1);
            while i < self.levels.len() && self.levels[i].fd.is_none() {
                i += 1;
            }
            if i == self.levels.len() {
                return;
            }
            self.levels[i].fd = None;
            self.open -= 1;
            self.closed_below = i + 1;
        }
    }

    fn push(&mut self, name: OsString, fd: File) {
        self.make_room();
        self.levels.push(Level {
            name,
            id: dir_id(&fd),
            fd: Some(Rc::new(fd)),
        });
        self.open += 1;
    }

    /// After leaving `child` for the current directory: if the current
    /// one's descriptor was closed, reopen it as `child`'s `..` when that is
    /// still the same directory (device and inode as first opened), so a
    /// walk back up a deep path costs one open a level, not a reopen from
    /// the nearest open ancestor each time. Otherwise [`Dirs::top`] reopens
    /// it by name, as before.
    fn reopen_parent(&mut self, child: &File) {
        let k = self.levels.len() - 1;
        if self.levels[k].fd.is_some() {
            return;
        }
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let Ok(fd) = openat(child, "..", flags, Mode::empty()).map(File::from) else {
            return;
        };
        if dir_id(&fd) != self.levels[k].id {
            return;
        }
        self.make_room();
        self.levels[k].fd = Some(Rc::new(fd));
        self.open += 1;
        self.closed_below = self.closed_below.min(k);
    }

    /// Keep the first `n` levels.
    fn truncate(&mut self, n: usize) {
        for l in self.levels.drain(n.max(1)..) {
            if l.fd.is_some() {
                self.open -= 1;
            }
        }
        self.closed_below = self.closed_below.min(self.levels.len());
    }

    /// The current directory's descriptor, reopened from its nearest open
    /// ancestor if it was closed. `rel` (its path) is for messages.
    fn top(&mut self, rel: &Path) -> Result<Rc<File>, ExtractError> {
        let k = self.levels.len() - 1;
        if let Some(fd) = &self.levels[k].fd {
            return Ok(fd.clone());
        }
        let j = (0..k)
            .rev()
            .find(|&j| self.levels[j].fd.is_some())
            .expect("the target stays open");
        let mut cur = self.levels[j].fd.clone().expect("found open");
        for l in &self.levels[j + 1..=k] {
            let next = open_dir(&cur, &l.name).map_err(|e| match e {
                Errno::ENOTDIR | Errno::ELOOP => ExtractError::NotADirectory(quoted(rel)),
                e => io_err(quoted(rel))(errno(e)),
            })?;
            cur = Rc::new(next);
        }
        self.make_room();
        self.levels[k].fd = Some(cur.clone());
        self.open += 1;
        self.closed_below = self.closed_below.min(k);
        Ok(cur)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sheaf_build::entries::{Entry, EntryKind, EntrySource};
    use sheaf_build::{build, BuildError, BuildOptions, Input, Progress};
    use std::os::unix::fs::MetadataExt;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    /// A tree given as (path, kind, link key): "d" a directory, "f:TEXT" a
    /// file, "l:TARGET" a symlink.
    #[derive(Debug)]
    struct Tree(Vec<(String, String, Option<u64>)>);

    impl EntrySource for Tree {
        fn name(&self) -> String {
            "test".into()
        }
        fn entries(&self) -> Box<dyn Iterator<Item = Result<Entry<'_>, BuildError>> + '_> {
            Box::new(self.0.iter().map(|(path, kind, link)| {
                let (mode, kind) = match kind.split_once(':') {
                    None => (libc::S_IFDIR | 0o755, EntryKind::Dir),
                    Some(("f", text)) => (
                        libc::S_IFREG | 0o644,
                        EntryKind::File(Box::new(text.as_bytes())),
                    ),
                    Some(("l", target)) => (
                        libc::S_IFLNK | 0o777,
                        EntryKind::Symlink(target.as_bytes().to_vec()),
                    ),
                    _ => unreachable!("{kind}"),
                };
                Ok(Entry {
                    path: path.as_bytes().to_vec(),
                    mode,
                    uid: 0,
                    gid: 0,
                    mtime_sec: 1_000_000_000,
                    mtime_nsec: 0,
                    xattrs: Vec::new(),
                    link: *link,
                    kind,
                })
            }))
        }
    }

    fn image(dir: &Path, tree: Tree) -> Image {
        let out = dir.join("t.sheaf");
        build(
            &Input::Entries(Arc::new(tree)),
            &out,
            &BuildOptions {
                force: true,
                ..Default::default()
            },
            Arc::new(Progress::default()),
            &AtomicBool::new(false),
        )
        .unwrap();
        crate::open_path(&out).unwrap()
    }

    /// Descriptors of this process open on `dir` or below: other tests
    /// run in parallel threads and open their own files, so only these
    /// tell whether an extraction into `dir` left any open.
    fn open_fds_under(dir: &Path) -> usize {
        fs::read_dir("/proc/self/fd")
            .unwrap()
            .flatten()
            .filter(|e| fs::read_link(e.path()).is_ok_and(|t| t.starts_with(dir)))
            .count()
    }

    #[test]
    fn a_tree_deeper_than_the_descriptor_budget_extracts_whole() {
        let t = tempfile::tempdir().unwrap();
        // 40 levels, a file and a hardlink pair at several depths, so the
        // walk keeps coming back to directories whose descriptors it closed.
        let mut entries = vec![(String::new(), "d".to_string(), None)];
        let mut p = String::new();
        for i in 0..40 {
            p.push_str(&format!("{}d{i}", if i == 0 { "" } else { "/" }));
            entries.push((p.clone(), "d".into(), None));
            if i % 10 == 9 {
                entries.push((format!("{p}/a{i}"), format!("f:level {i}"), Some(7)));
            }
        }
        // Siblings after each deep subtree: written after coming back up.
        let mut q = String::new();
        let mut tail = Vec::new();
        for i in 0..40 {
            q.push_str(&format!("{}d{i}", if i == 0 { "" } else { "/" }));
            tail.push((format!("{q}/z"), format!("f:after {i}"), None));
        }
        tail.reverse();
        // Parents first, but a directory's entries in name order.
        let mut all: Vec<_> = entries.into_iter().chain(tail).collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        let img = image(t.path(), Tree(all));
        let out = t.path().join("out");
        let before = open_fds_under(t.path());
        let opts = ExtractOptions {
            target: out.clone(),
            paths: Vec::new(),
            keep_going: false,
            ..Default::default()
        };
        let r = extract_with(&img, &opts, 3).unwrap();
        assert_eq!(open_fds_under(t.path()), before, "descriptors left open");
        assert_eq!(r.entries, 40 + 4 + 40);
        let mut p = out.clone();
        let mut first_ino = None;
        for i in 0..40 {
            p.push(format!("d{i}"));
            assert_eq!(
                fs::read(p.join("z")).unwrap(),
                format!("after {i}").as_bytes()
            );
            if i % 10 == 9 {
                let md = fs::metadata(p.join(format!("a{i}"))).unwrap();
                assert_eq!(md.nlink(), 4, "a{i}");
                assert_eq!(*first_ino.get_or_insert(md.ino()), md.ino(), "a{i}");
            }
            assert_eq!(fs::metadata(&p).unwrap().mtime(), 1_000_000_000, "{p:?}");
        }
        // A second run replaces nothing.
        let again = extract_with(&img, &opts, MAX_OPEN_DIRS).unwrap_err();
        assert!(
            matches!(&again, ExtractError::Exists(p) if p.ends_with("/d9/a9")),
            "{again}"
        );
        // Unless asked: then every entry again, the hard links one file.
        let over = ExtractOptions {
            overwrite: true,
            ..opts
        };
        let r = extract_with(&img, &over, 3).unwrap();
        assert_eq!(r.entries, 40 + 4 + 40);
        let a9 = out.join("d0/d1/d2/d3/d4/d5/d6/d7/d8/d9/a9");
        assert_eq!(fs::metadata(&a9).unwrap().nlink(), 4);
        assert_eq!(fs::read(&a9).unwrap(), b"level 9");
    }

    #[test]
    fn an_existing_symlink_is_never_entered() {
        let t = tempfile::tempdir().unwrap();
        let img = image(
            t.path(),
            Tree(vec![
                (String::new(), "d".into(), None),
                ("a".into(), "d".into(), None),
                ("a/f".into(), "f:payload".into(), None),
            ]),
        );
        let out = t.path().join("out");
        let elsewhere = t.path().join("elsewhere");
        fs::create_dir_all(&out).unwrap();
        fs::create_dir_all(&elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, out.join("a")).unwrap();
        let opts = ExtractOptions {
            target: out.clone(),
            paths: Vec::new(),
            keep_going: false,
            ..Default::default()
        };
        let e = extract(&img, &opts).unwrap_err();
        assert!(
            matches!(&e, ExtractError::NotADirectory(p) if p == "a"),
            "{e}"
        );
        assert_eq!(e.to_string(), "a: exists and is not a directory");
        assert_eq!(fs::read_dir(&elsewhere).unwrap().count(), 0);
        // The same when the path is named.
        let named = ExtractOptions {
            target: out,
            paths: vec![b"a/f".to_vec()],
            keep_going: false,
            ..Default::default()
        };
        assert!(matches!(
            extract(&img, &named),
            Err(ExtractError::NotADirectory(_))
        ));
        assert_eq!(fs::read_dir(&elsewhere).unwrap().count(), 0);
    }
}
