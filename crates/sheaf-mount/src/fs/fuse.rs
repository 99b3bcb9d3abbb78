//! The FUSE side: `fuser::Filesystem` for [`SheafFs`], each request handed
//! to its operation in [`super::ops`] and the result turned into a reply.
//! Nothing else belongs here (what a request does is tested through ops).

use super::{SheafFs, FOREVER, MAX_READ};
use fuser::{
    AccessFlags, Errno, FileHandle, Filesystem, Generation, INodeNo, IoctlFlags, KernelConfig,
    LockOwner, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty,
    ReplyEntry, ReplyIoctl, ReplyOpen, ReplyStatfs, ReplyXattr, Request,
};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

/// Answer a getxattr/listxattr: the size when asked for it, ERANGE when the
/// caller's buffer is too small, else the bytes.
fn reply_xattr(reply: ReplyXattr, size: u32, v: Result<Vec<u8>, Errno>) {
    match v {
        Ok(v) if size == 0 => reply.size(v.len() as u32),
        Ok(v) if (size as usize) < v.len() => reply.error(Errno::ERANGE),
        Ok(v) => reply.data(&v),
        Err(e) => reply.error(e),
    }
}

impl Filesystem for SheafFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let have = self.init_flags(config.capabilities());
        let _ = config.add_capabilities(have);
        let _ = config.set_max_readahead(MAX_READ);
        // Nothing is written to an image; a small max_write keeps io_uring
        // entries (sized by the kernel's largest argument) at MAX_READ.
        let _ = config.set_max_write(MAX_READ);
        self.start_prefetch();
        Ok(())
    }

    fn destroy(&mut self) {
        self.write_record();
    }

    // Quiet answers to requests a read-only image does not serve (fuser's
    // defaults log a warning for each, flooding the log on every close).
    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // ENOSYS: the kernel stops sending flush for this mount.
        reply.error(Errno::ENOSYS);
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match SheafFs::lookup(self, req.pid(), parent, name.as_bytes()) {
            Ok(a) => reply.entry(&FOREVER, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match SheafFs::getattr(self, ino) {
            Ok(a) => reply.attr(&FOREVER, &a),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match SheafFs::readlink(self, ino) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        reply.error(SheafFs::open(self))
    }

    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        reply.error(SheafFs::open(self))
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let mut reply = Some(reply);
        let r = SheafFs::read(self, ino, offset, size, |b| {
            if let Some(r) = reply.take() {
                r.data(b)
            }
        });
        if let (Err(e), Some(reply)) = (r, reply) {
            reply.error(e)
        }
    }

    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let r = SheafFs::readdir(
            self,
            req.pid(),
            ino,
            offset,
            &mut |node, next, kind, name| reply.add(node, next, kind, OsStr::from_bytes(name)),
        );
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn readdirplus(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let r = SheafFs::readdirplus(self, req.pid(), ino, offset, &mut |node, next, name, a| {
            reply.add(
                node,
                next,
                OsStr::from_bytes(name),
                &FOREVER,
                a,
                Generation(0),
            )
        });
        match r {
            Ok(()) => reply.ok(),
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
        _flags: IoctlFlags,
        cmd: u32,
        _in_data: &[u8],
        out_size: u32,
        reply: ReplyIoctl,
    ) {
        crate::reply_control(cmd, out_size, |n| self.control(ino, n), reply)
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let s = SheafFs::statfs(self);
        reply.statfs(s.blocks, 0, 0, s.files, 0, s.bsize, s.namelen, s.bsize);
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        reply_xattr(reply, size, SheafFs::getxattr(self, ino, name.as_bytes()))
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        reply_xattr(reply, size, SheafFs::listxattr(self, ino))
    }

    fn access(&self, _req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        match SheafFs::access(self, ino, mask) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }
}
