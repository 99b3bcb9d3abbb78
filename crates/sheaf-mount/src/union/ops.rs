//! The filesystem operations, as plain methods returning `Result<_, Errno>`
//! (no FUSE reply in sight: [`super::fuse`] turns results into replies, and
//! the unit tests call these directly). Each takes the namespace lock the
//! way the kernel's requests need it: changes exclusively, lookups and
//! listings shared, data I/O on open files neither.

use super::handles::Handle;
use super::sys::{self, errno_of};
use super::table::ROOT;
use super::view::stat_attr;
use super::UnionFs;
use crate::fs::MAX_READ;
use crate::stats::Op;
use fuser::{
    AccessFlags, BackingId, Errno, FileAttr, FileHandle, FileType, INodeNo, RenameFlags, TimeOrNow,
};
use sheaf_format::layers;
use sheaf_read::ReadBytes;
use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::UNIX_EPOCH;

/// Who asks (new entries are given their owner when served by root).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Caller {
    pub(crate) uid: u32,
    pub(crate) gid: u32,
}

/// A file opened: its handle, and the backing file to reply with when it
/// is opened in kernel passthrough.
pub(crate) struct Opened {
    pub(crate) fh: FileHandle,
    pub(crate) backing: Option<Arc<BackingId>>,
}

/// What a setattr changes (`None`: unchanged).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct SetAttr {
    pub(crate) mode: Option<u32>,
    pub(crate) uid: Option<u32>,
    pub(crate) gid: Option<u32>,
    pub(crate) size: Option<u64>,
    pub(crate) atime: Option<TimeOrNow>,
    pub(crate) mtime: Option<TimeOrNow>,
    /// The handle a truncate came through, if any.
    pub(crate) fh: Option<FileHandle>,
}

/// What statfs answers.
pub(crate) struct Statfs {
    pub(crate) blocks: u64,
    pub(crate) bfree: u64,
    pub(crate) bavail: u64,
    pub(crate) files: u64,
    pub(crate) ffree: u64,
    pub(crate) bsize: u32,
    pub(crate) namelen: u32,
    pub(crate) frsize: u32,
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
                tv_sec: d.as_secs() as _,
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
                    tv_sec: s as _,
                    tv_nsec: n as libc::c_long,
                }
            }
        },
    }
}

impl UnionFs {
    /// Run a change under the exclusive namespace lock (EROFS without an
    /// upper directory).
    fn with_write<T>(&self, f: impl FnOnce() -> Result<T, Errno>) -> Result<T, Errno> {
        self.upper()?;
        let _g = self.ns.write().expect("ns lock");
        f()
    }

    /// The node for new entry `name` of `parent`, counting one lookup.
    fn entry_of(&self, parent: INodeNo, name: &[u8]) -> Result<FileAttr, Errno> {
        let dir = self.node(parent)?;
        let child = self.resolve(&dir, name)?.ok_or(Errno::ENOENT)?;
        self.remember(parent.0, name, child)
    }

    /// `name` in `parent`, counting one lookup; `None` if there is none.
    pub(crate) fn lookup(&self, parent: INodeNo, name: &[u8]) -> Result<Option<FileAttr>, Errno> {
        let _t = self.stats.time(Op::Lookup);
        let _g = self.ns.read().expect("ns lock");
        let dir = self.node(parent)?;
        match self.resolve(&dir, name)? {
            Some(c) => self.remember(parent.0, name, c).map(Some),
            None => Ok(None),
        }
    }

    /// The kernel dropped `n` lookups of `ino`.
    pub(crate) fn forget(&self, ino: INodeNo, n: u64) {
        self.forget_n(ino.0, n);
    }

    pub(crate) fn getattr(&self, ino: INodeNo) -> Result<FileAttr, Errno> {
        let _t = self.stats.time(Op::Getattr);
        self.node(ino).and_then(|n| self.attr(ino.0, &n))
    }

    pub(crate) fn readlink(&self, ino: INodeNo) -> Result<Vec<u8>, Errno> {
        let _t = self.stats.time(Op::Readlink);
        let n = self.node(ino)?;
        if let Some(fd) = &n.upper {
            return sys::readlink_fd(fd.as_fd());
        }
        let (l, i) = n.lower.as_deref().ok_or(Errno::ENOENT)?.shown();
        self.stack.layers()[l]
            .read_link(&i)
            .map_err(|e| self.read_err(Op::Readlink, &e))
    }

    /// Open `ino` with open(2) `flags`: an upper file is reopened (a lower
    /// one copied up first when opened for writing); a lower file opened
    /// for reading is read from its layer. `register` makes the backing file
    /// for passthrough, when that is on. ENOSYS for a read-only union (the
    /// kernel then stops asking and keeps its page cache).
    pub(crate) fn open(
        &self,
        ino: INodeNo,
        flags: i32,
        register: impl FnOnce(&File) -> io::Result<BackingId>,
    ) -> Result<Opened, Errno> {
        let _t = self.stats.time(Op::Open);
        if !self.writable() {
            return Err(Errno::ENOSYS);
        }
        let f = flags;
        let writing = f & libc::O_ACCMODE != libc::O_RDONLY || f & libc::O_TRUNC != 0;
        let h = (|| -> Result<Handle, Errno> {
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
            // Reopened through /proc/self/fd (a magic link): O_NOFOLLOW
            // would refuse it, and the kernel resolved the name already.
            let keep = f & !(libc::O_CREAT | libc::O_EXCL | libc::O_NOCTTY | libc::O_NOFOLLOW)
                | libc::O_CLOEXEC;
            Ok(Handle::File(Arc::new(sys::reopen(fd.as_fd(), keep)?)))
        })()?;
        let file = match &h {
            Handle::File(f) => Some(f.clone()),
            _ => None,
        };
        let backing = self.io_open(ino.0, file.as_deref(), register);
        let fh = self.add_handle(h);
        self.io_handle(fh, ino.0, backing.is_some());
        Ok(Opened { fh, backing })
    }

    /// Up to `size` bytes of open file `fh` (of node `ino`) at `offset`.
    pub(crate) fn read(
        &self,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
    ) -> Result<ReadBytes, Errno> {
        let _t = self.stats.time(Op::Read);
        let want = size.min(MAX_READ) as usize;
        let src = match self.handles.lock().expect("handles").get(&fh.0) {
            Some(Handle::File(f)) => Ok(f.clone()),
            Some(Handle::Lower(l, i)) => Err(Some((*l, *i))),
            _ => Err(None),
        };
        let bytes = match src {
            Ok(f) => {
                let mut buf = vec![0u8; want];
                let mut got = 0;
                while got < buf.len() {
                    match f.read_at(&mut buf[got..], offset + got as u64) {
                        Ok(0) => break,
                        Ok(k) => got += k,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(errno_of(&e)),
                    }
                }
                buf.truncate(got);
                ReadBytes::Owned(buf)
            }
            Err(lower) => {
                let (l, i) = match lower {
                    Some(li) => li,
                    None => self.node(ino)?.lower.as_deref().ok_or(Errno::EIO)?.shown(),
                };
                self.stack.layers()[l]
                    .read_bytes(&i, offset, want, &mut |_, _| {})
                    .map_err(|e| self.read_err(Op::Read, &e))?
            }
        };
        self.stats
            .bytes_served
            .fetch_add(bytes.len() as u64, Relaxed);
        Ok(bytes)
    }

    /// Write `data` at `offset` of open file `fh`; returns the bytes written.
    pub(crate) fn write(&self, fh: FileHandle, offset: u64, data: &[u8]) -> Result<u32, Errno> {
        let f = self.file_of(fh).ok_or(Errno::EBADF)?;
        f.write_all_at(data, offset).map_err(|e| errno_of(&e))?;
        Ok(data.len() as u32)
    }

    pub(crate) fn release(&self, fh: FileHandle) {
        self.handles.lock().expect("handles").remove(&fh.0);
        self.io_release(fh);
    }

    pub(crate) fn fsync(&self, fh: FileHandle, datasync: bool) -> Result<(), Errno> {
        let r = match self.file_of(fh) {
            Some(f) if datasync => f.sync_data(),
            Some(f) => f.sync_all(),
            None => Ok(()),
        };
        r.map_err(|e| errno_of(&e))
    }

    /// Open directory `ino`: its listing is taken now. ENOSYS for a
    /// read-only union (the kernel then stops asking and caches listings).
    pub(crate) fn opendir(&self, ino: INodeNo) -> Result<FileHandle, Errno> {
        let _t = self.stats.time(Op::Open);
        if !self.writable() {
            return Err(Errno::ENOSYS);
        }
        let _g = self.ns.read().expect("ns lock");
        let l = self.node(ino).and_then(|n| self.listing(&n))?;
        Ok(self.add_handle(Handle::Dir(Arc::new(l))))
    }

    /// List directory `ino` (open as `fh`) from `offset`: `add(ino, next
    /// offset, kind, name)` takes each entry and says when it is full.
    pub(crate) fn readdir(
        &self,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut add: impl FnMut(INodeNo, u64, FileType, &OsStr) -> bool,
    ) -> Result<(), Errno> {
        let _t = self.stats.time(Op::Readdir);
        let listing = match self.handles.lock().expect("handles").get(&fh.0) {
            Some(Handle::Dir(l)) => Some(l.clone()),
            _ => None,
        };
        let l = match listing {
            Some(l) => l,
            None => {
                let _g = self.ns.read().expect("ns lock");
                self.cached_listing(ino)?
            }
        };
        let parent = self.node(ino).map(|n| n.parent).unwrap_or(ROOT);
        let mut off = offset;
        if off == 0 {
            if add(ino, 1, FileType::Directory, OsStr::new(".")) {
                return Ok(());
            }
            off = 1;
        }
        if off == 1 {
            if add(INodeNo(parent), 2, FileType::Directory, OsStr::new("..")) {
                return Ok(());
            }
            off = 2;
        }
        for (k, e) in l.iter().enumerate().skip((off - 2) as usize) {
            if add(
                INodeNo(e.ino),
                k as u64 + 3,
                e.kind,
                OsStr::from_bytes(&e.name),
            ) {
                break;
            }
        }
        Ok(())
    }

    /// List directory `ino` with attributes from `offset` (asked for only
    /// by a read-only union, whose listings never change: they come from
    /// the cached listing). `add(ino, next offset, name, attr)` takes each
    /// entry and says when it is full; every entry it takes, but "." and
    /// "..", counts as a lookup.
    pub(crate) fn readdirplus(
        &self,
        ino: INodeNo,
        offset: u64,
        mut add: impl FnMut(INodeNo, u64, &OsStr, &FileAttr) -> bool,
    ) -> Result<(), Errno> {
        let _t = self.stats.time(Op::Readdirplus);
        let l = {
            let _g = self.ns.read().expect("ns lock");
            self.cached_listing(ino)?
        };
        let dir = self.node(ino)?;
        let mut off = offset.max(2);
        if offset < 2 {
            // "." and ".." are not counted as lookups by the kernel.
            if let Ok(a) = self.attr(ino.0, &dir) {
                if offset == 0 && add(ino, 1, OsStr::new("."), &a) {
                    return Ok(());
                }
                if add(INodeNo(dir.parent), 2, OsStr::new(".."), &a) {
                    return Ok(());
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
            if add(a.ino, k as u64 + 3, OsStr::from_bytes(&e.name), &a) {
                // Not sent: the kernel did not count this lookup.
                self.forget_one(a.ino.0);
                break;
            }
        }
        Ok(())
    }

    pub(crate) fn releasedir(&self, fh: FileHandle) {
        self.handles.lock().expect("handles").remove(&fh.0);
    }

    /// The upper directory's filesystem, or the images' sizes.
    pub(crate) fn statfs(&self) -> Statfs {
        let _t = self.stats.time(Op::Statfs);
        if let Some(u) = &self.upper {
            if let Ok(s) = sys::statvfs_fd(u.root.as_fd()) {
                return Statfs {
                    blocks: s.blocks(),
                    bfree: s.blocks_free(),
                    bavail: s.blocks_available(),
                    files: s.files(),
                    ffree: s.files_free(),
                    bsize: s.block_size() as u32,
                    namelen: 255,
                    frsize: s.fragment_size() as u32,
                };
            }
        }
        let len: u64 = self.stack.layers().iter().map(|i| i.len()).sum();
        let files: u64 = self
            .stack
            .layers()
            .iter()
            .map(|i| i.superblock().inode_count)
            .sum();
        Statfs {
            blocks: len.div_ceil(4096),
            bfree: 0,
            bavail: 0,
            files,
            ffree: 0,
            bsize: 4096,
            namelen: 255,
            frsize: 4096,
        }
    }

    /// The root's hidden stats and pid attributes.
    pub(crate) fn hidden_xattr(&self, ino: INodeNo, name: &[u8]) -> Option<Vec<u8>> {
        if ino.0 != ROOT {
            None
        } else if name == crate::STATS_XATTR.as_bytes() {
            Some(self.report().to_bytes())
        } else if name == crate::PID_XATTR.as_bytes() {
            Some(std::process::id().to_string().into_bytes())
        } else {
            None
        }
    }

    /// Whether the mount answers no xattrs at all: read-only, and no layer
    /// has any ([`sheaf_read::Image::has_xattrs`]).
    pub(crate) fn xattrs_off(&self) -> bool {
        !self.writable() && self.stack.layers().iter().all(|l| !l.has_xattrs())
    }

    /// The value of extended attribute `name` of `ino` (the root also has
    /// the hidden stats and pid attributes).
    pub(crate) fn getxattr(&self, ino: INodeNo, name: &[u8]) -> Result<Vec<u8>, Errno> {
        let _t = self.stats.time(Op::Getxattr);
        if let Some(v) = self.hidden_xattr(ino, name) {
            return Ok(v);
        }
        let n = self.node(ino)?;
        if let Some(fd) = &n.upper {
            return sys::xattr_get_fd(fd.as_fd(), name);
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

    /// The extended attribute names of `ino`, each NUL-terminated.
    pub(crate) fn listxattr(&self, ino: INodeNo) -> Result<Vec<u8>, Errno> {
        let _t = self.stats.time(Op::Listxattr);
        let n = self.node(ino)?;
        if let Some(fd) = &n.upper {
            return sys::xattr_list_fd(fd.as_fd());
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

    pub(crate) fn setxattr(
        &self,
        ino: INodeNo,
        name: &[u8],
        value: &[u8],
        flags: i32,
    ) -> Result<(), Errno> {
        self.with_write(|| {
            let fd = self.copy_up(ino.0)?;
            sys::xattr_set_fd(fd.as_fd(), name, value, flags)
        })
    }

    pub(crate) fn removexattr(&self, ino: INodeNo, name: &[u8]) -> Result<(), Errno> {
        self.with_write(|| {
            let fd = self.copy_up(ino.0)?;
            sys::xattr_remove_fd(fd.as_fd(), name)
        })
    }

    /// Whether `ino` may be accessed with `mask` (the kernel checks
    /// permissions; only writing to a read-only union is refused here).
    pub(crate) fn access(&self, ino: INodeNo, mask: AccessFlags) -> Result<(), Errno> {
        let _t = self.stats.time(Op::Access);
        self.node(ino)?;
        if !self.writable() && mask.contains(AccessFlags::W_OK) {
            return Err(Errno::EROFS);
        }
        Ok(())
    }

    /// Change attributes of `ino` (copying it up first).
    pub(crate) fn setattr(&self, ino: INodeNo, a: SetAttr) -> Result<FileAttr, Errno> {
        self.with_write(|| self.set_attrs(ino, a))
    }

    fn set_attrs(&self, ino: INodeNo, a: SetAttr) -> Result<FileAttr, Errno> {
        let fd = self.copy_up(ino.0)?;
        let fd = fd.as_fd();
        let n = self.node(ino)?;
        let st = sys::stat_fd(fd)?;
        let symlink = st.st_mode & libc::S_IFMT == libc::S_IFLNK;
        if a.uid.is_some() || a.gid.is_some() {
            sys::chown_fd(fd, a.uid, a.gid)?;
        }
        if let Some(m) = a.mode {
            if !symlink {
                sys::chmod_fd(fd, m & 0o7777)?;
            }
        }
        if let Some(sz) = a.size {
            match a.fh.and_then(|fh| self.file_of(fh)) {
                Some(f) => f.set_len(sz).map_err(|e| errno_of(&e))?,
                None => sys::truncate_fd(fd, sz)?,
            }
        }
        if a.atime.is_some() || a.mtime.is_some() {
            let times = [timespec(a.atime), timespec(a.mtime)];
            if symlink {
                let p = self.copy_up(n.parent)?;
                sys::utimens_at(p.as_fd(), &n.name, times)?;
            } else {
                sys::utimens_fd(fd, times)?;
            }
        }
        Ok(stat_attr(ino.0, &sys::stat_fd(fd)?))
    }

    /// Make a device, fifo or socket `name` in `parent` (`rdev` as the
    /// kernel encodes it).
    pub(crate) fn mknod(
        &self,
        caller: Caller,
        parent: INodeNo,
        name: &[u8],
        mode: u32,
        rdev: u32,
    ) -> Result<FileAttr, Errno> {
        self.with_write(|| {
            let (pfd, _, _) = self.prepare_create(parent, name)?;
            let dev = libc::makedev(
                (rdev >> 8) & 0xfff,
                (rdev & 0xff) | ((rdev >> 12) & 0xfff00),
            );
            sys::mknod_at(pfd.as_fd(), name, mode, dev)?;
            self.own(caller, pfd.as_fd(), name, Some(mode))?;
            self.entry_of(parent, name)
        })
    }

    /// Make directory `name` in `parent`, opaque if it replaces a lower one.
    pub(crate) fn mkdir(
        &self,
        caller: Caller,
        parent: INodeNo,
        name: &[u8],
        mode: u32,
    ) -> Result<FileAttr, Errno> {
        self.with_write(|| {
            let (pfd, lower_dir, _) = self.prepare_create(parent, name)?;
            sys::mkdir_at(pfd.as_fd(), name, mode & 0o7777)?;
            self.own(caller, pfd.as_fd(), name, None)?;
            if lower_dir {
                let d = sys::open_path_at(pfd.as_fd(), name)?;
                self.make_opaque(d.as_fd())?;
            }
            self.entry_of(parent, name)
        })
    }

    /// Make symlink `name` in `parent` pointing to `target`.
    pub(crate) fn symlink(
        &self,
        caller: Caller,
        parent: INodeNo,
        name: &[u8],
        target: &[u8],
    ) -> Result<FileAttr, Errno> {
        self.with_write(|| {
            let (pfd, _, _) = self.prepare_create(parent, name)?;
            sys::symlink_at(target, pfd.as_fd(), name)?;
            self.own(caller, pfd.as_fd(), name, None)?;
            self.entry_of(parent, name)
        })
    }

    pub(crate) fn unlink(&self, parent: INodeNo, name: &[u8]) -> Result<(), Errno> {
        self.with_write(|| self.remove(parent, name, false))
    }

    pub(crate) fn rmdir(&self, parent: INodeNo, name: &[u8]) -> Result<(), Errno> {
        self.with_write(|| self.remove(parent, name, true))
    }

    /// Remove `name` from `parent` (a file, or a directory with `dir`),
    /// leaving a whiteout if the layers have it.
    fn remove(&self, parent: INodeNo, name: &[u8], dir: bool) -> Result<(), Errno> {
        let pnode = self.node(parent)?;
        let child = self.resolve(&pnode, name)?.ok_or(Errno::ENOENT)?;
        let key = self.key_of(parent.0, name, &child)?;
        let lower_has = self.lower_child_of(&pnode, name)?.is_some();
        if dir && !self.is_empty_dir(&child)? {
            return Err(Errno::ENOTEMPTY);
        }
        let pfd = self.copy_up(parent.0)?;
        let p = pfd.as_fd();
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
                self.clear_dir(fd.as_fd())?;
            }
            sys::unlink_at(p, name, dir)?;
        }
        if lower_has {
            self.add_whiteout(p, name)?;
        }
        self.unmap_if_gone(&key);
        Ok(())
    }

    /// Rename `name` of `parent` to `newname` of `newparent`. A lower entry
    /// is copied up first (a merged directory whole) and leaves a whiteout;
    /// a directory moved over or from the layers becomes opaque.
    pub(crate) fn rename(
        &self,
        parent: INodeNo,
        name: &[u8],
        newparent: INodeNo,
        newname: &[u8],
        flags: RenameFlags,
    ) -> Result<(), Errno> {
        self.with_write(|| self.do_rename(parent, name, newparent, newname, flags))
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
        let src_lower = self.lower_child_of(&pnode, name)?.is_some();
        let npnode = self.node(newparent)?;
        let dst = self.resolve(&npnode, newname)?;
        if let Some(d) = &dst {
            if flags.contains(RenameFlags::RENAME_NOREPLACE) {
                return Err(Errno::EEXIST);
            }
            // The kernel has checked the types; a directory replaced must
            // be empty in the merged view.
            if d.is_dir() && !self.is_empty_dir(d)? {
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
                self.copy_up_tree(sfd.as_fd(), snode.lower.as_deref())?;
            }
            let (npfd, dst_lower_dir, had_whiteout) = self.prepare_create(newparent, newname)?;
            if let Some((dfd, st)) = dst.as_ref().and_then(|d| d.upper.as_ref()) {
                if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
                    self.clear_dir(dfd.as_fd())?;
                }
            }
            let pfd = self.copy_up(parent.0)?;
            let noreplace = flags.contains(RenameFlags::RENAME_NOREPLACE);
            if let Err(e) = sys::rename_at(pfd.as_fd(), name, npfd.as_fd(), newname, noreplace) {
                if had_whiteout {
                    let _ = self.add_whiteout(npfd.as_fd(), newname);
                }
                return Err(e);
            }
            if src_lower {
                self.add_whiteout(pfd.as_fd(), name)?;
            }
            if is_dir && (merged_dir || dst_lower_dir) {
                self.make_opaque(sfd.as_fd())?;
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

    /// Give `ino` the new name `newname` in `newparent` (copying it up).
    pub(crate) fn link(
        &self,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &[u8],
    ) -> Result<FileAttr, Errno> {
        self.with_write(|| {
            let fd = self.copy_up(ino.0)?;
            let (pfd, _, _) = self.prepare_create(newparent, newname)?;
            sys::link_at(fd.as_fd(), pfd.as_fd(), newname)?;
            // Now hardlinked: its table name may go while it stays.
            if let Some(n) = self.table.lock().expect("table").nodes.get_mut(&ino.0) {
                n.upper = Some(fd.clone());
            }
            self.entry_of(newparent, newname)
        })
    }

    /// Create and open regular file `name` in `parent` with open(2)
    /// `flags` (see [`Self::open`] for `register`).
    pub(crate) fn create(
        &self,
        caller: Caller,
        parent: INodeNo,
        name: &[u8],
        mode: u32,
        flags: i32,
        register: impl FnOnce(&File) -> io::Result<BackingId>,
    ) -> Result<(FileAttr, Opened), Errno> {
        let (a, f) = self.with_write(|| {
            let (pfd, _, _) = self.prepare_create(parent, name)?;
            let keep = (flags & !(libc::O_NOCTTY | libc::O_CREAT | libc::O_EXCL))
                | libc::O_CREAT
                | libc::O_EXCL
                | libc::O_CLOEXEC;
            let f = sys::open_at(pfd.as_fd(), name, keep, mode & 0o7777)?;
            self.own(caller, pfd.as_fd(), name, Some(mode))?;
            let a = self.entry_of(parent, name)?;
            Ok((a, f))
        })?;
        let f = Arc::new(f);
        let backing = self.io_open(a.ino.0, Some(&f), register);
        let fh = self.add_handle(Handle::File(f));
        self.io_handle(fh, a.ino.0, backing.is_some());
        Ok((a, Opened { fh, backing }))
    }
}
