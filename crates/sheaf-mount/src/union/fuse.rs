//! The FUSE side: `fuser::Filesystem` for [`UnionFs`], each request handed
//! to its operation in [`super::ops`] and the result turned into a reply.
//! Nothing else belongs here (what a request does is tested through ops).

use super::sys;
use super::view::stat_attr;
use super::{Caller, Opened, SetAttr, UnionFs};
use crate::fs::{FOREVER, MAX_READ};
use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, Filesystem, FopenFlags, Generation, INodeNo,
    InitFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite,
    ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::Ordering::Relaxed;
use std::time::SystemTime;

fn caller(req: &Request) -> Caller {
    Caller {
        uid: req.uid(),
        gid: req.gid(),
    }
}

/// Answer a request that makes an entry.
fn reply_entry(reply: ReplyEntry, r: Result<FileAttr, Errno>) {
    match r {
        Ok(a) => reply.entry(&FOREVER, &a, Generation(0)),
        Err(e) => reply.error(e),
    }
}

fn reply_empty(reply: ReplyEmpty, r: Result<(), Errno>) {
    match r {
        Ok(()) => reply.ok(),
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

/// Answer an open.
fn reply_open(reply: ReplyOpen, r: Result<Opened, Errno>) {
    match r {
        // (The kernel answers EIO to FOPEN_KEEP_CACHE with passthrough.)
        Ok(Opened {
            fh,
            backing: Some(b),
        }) => reply.opened_passthrough(fh, FopenFlags::empty(), &b),
        Ok(Opened { fh, backing: None }) => reply.opened(fh, FopenFlags::FOPEN_KEEP_CACHE),
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
        if self.writable()
            && sys::is_root()
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
        match UnionFs::lookup(self, parent, name.as_bytes()) {
            Ok(Some(a)) => reply.entry(&FOREVER, &a, Generation(0)),
            // Node 0 with a timeout: a cached negative entry.
            Ok(None) => reply.entry(&FOREVER, &stat_attr(0, &sys::zero_stat()), Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        UnionFs::forget(self, ino, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match UnionFs::getattr(self, ino) {
            Ok(a) => reply.attr(&FOREVER, &a),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match UnionFs::readlink(self, ino) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let r = UnionFs::open(self, ino, flags.0, |f| reply.open_backing(f));
        reply_open(reply, r)
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
        match UnionFs::read(self, ino, fh, offset, size) {
            Ok(d) => reply.data(&d),
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
        match UnionFs::write(self, fh, offset, data) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e),
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
        UnionFs::release(self, fh);
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
        reply_empty(reply, UnionFs::fsync(self, fh, datasync))
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match UnionFs::opendir(self, ino) {
            // The kernel may keep the listing: every change to the
            // directory goes through this mount and invalidates it.
            Ok(fh) => reply.opened(
                fh,
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
        let r = UnionFs::readdirplus(self, ino, offset, |ino, off, name, a| {
            reply.add(ino, off, name, &FOREVER, a, Generation(0))
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let r = UnionFs::readdir(self, ino, fh, offset, |ino, off, kind, name| {
            reply.add(ino, off, kind, name)
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        UnionFs::releasedir(self, fh);
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
        let s = UnionFs::statfs(self);
        reply.statfs(
            s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.frsize,
        );
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        if self.xattrs_off() {
            // As a single image's mount does (crate::fs): the kernel stops
            // asking, statistics go through the ioctl.
            return reply.error(Errno::ENOSYS);
        }
        reply_xattr(reply, size, UnionFs::getxattr(self, ino, name.as_bytes()))
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        if self.xattrs_off() {
            return reply.error(Errno::ENOSYS);
        }
        reply_xattr(reply, size, UnionFs::listxattr(self, ino))
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
        reply_empty(
            reply,
            UnionFs::setxattr(self, ino, name.as_bytes(), value, flags),
        )
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(reply, UnionFs::removexattr(self, ino, name.as_bytes()))
    }

    fn access(&self, _req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        reply_empty(reply, UnionFs::access(self, ino, mask))
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
        let a = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime,
            mtime,
            fh,
        };
        match UnionFs::setattr(self, ino, a) {
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
        let r = UnionFs::mknod(self, caller(req), parent, name.as_bytes(), mode, rdev);
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
        let r = UnionFs::mkdir(self, caller(req), parent, name.as_bytes(), mode);
        reply_entry(reply, r)
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(reply, UnionFs::unlink(self, parent, name.as_bytes()))
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(reply, UnionFs::rmdir(self, parent, name.as_bytes()))
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &std::path::Path,
        reply: ReplyEntry,
    ) {
        let r = UnionFs::symlink(
            self,
            caller(req),
            parent,
            link_name.as_bytes(),
            target.as_os_str().as_bytes(),
        );
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
        let r = UnionFs::rename(
            self,
            parent,
            name.as_bytes(),
            newparent,
            newname.as_bytes(),
            flags,
        );
        reply_empty(reply, r)
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        reply_entry(
            reply,
            UnionFs::link(self, ino, newparent, newname.as_bytes()),
        )
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
        let r = UnionFs::create(
            self,
            caller(req),
            parent,
            name.as_bytes(),
            mode,
            flags,
            |f| reply.open_backing(f),
        );
        match r {
            // (The kernel answers EIO to FOPEN_KEEP_CACHE with passthrough.)
            Ok((
                a,
                Opened {
                    fh,
                    backing: Some(b),
                },
            )) => {
                reply.created_passthrough(&FOREVER, &a, Generation(0), fh, FopenFlags::empty(), &b)
            }
            Ok((a, Opened { fh, backing: None })) => reply.created(
                &FOREVER,
                &a,
                Generation(0),
                fh,
                FopenFlags::FOPEN_KEEP_CACHE,
            ),
            Err(e) => reply.error(e),
        }
    }

    /// The control ioctls on the root ([`crate::STATS_IOCTL`]); ENOTTY for
    /// anything else.
    #[allow(clippy::too_many_arguments)]
    fn ioctl(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        cmd: u32,
        _in_data: &[u8],
        out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        crate::reply_control(
            cmd,
            out_size,
            |n| UnionFs::hidden_xattr(self, ino, n),
            reply,
        )
    }
}
