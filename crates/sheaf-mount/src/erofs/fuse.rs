//! The FUSE side of the blob: a root directory holding one read-only file,
//! [`BLOB_NAME`]. Each request is one call of [`BlobFs`]; nothing else
//! belongs here.

use super::blob::BlobFs;
use crate::fs::MAX_READ;
use fuser::{
    Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo, KernelConfig,
    LockOwner, OpenFlags, ReplyAttr, ReplyData, ReplyEmpty, ReplyEntry, ReplyOpen, Request,
};
use std::ffi::OsStr;
use std::time::{Duration, UNIX_EPOCH};

/// The one file's name.
pub const BLOB_NAME: &str = "blob";
const BLOB: INodeNo = INodeNo(2);
/// Nothing here ever changes.
const FOREVER: Duration = Duration::from_secs(365 * 24 * 3600);

impl BlobFs {
    fn attr(&self, ino: INodeNo) -> Option<FileAttr> {
        let (kind, perm, size, nlink) = match ino {
            INodeNo::ROOT => (FileType::Directory, 0o500, 0, 2),
            BLOB => (FileType::RegularFile, 0o400, self.len(), 1),
            _ => return None,
        };
        Some(FileAttr {
            ino,
            size,
            blocks: size.div_ceil(512),
            atime: UNIX_EPOCH,
            mtime: UNIX_EPOCH,
            ctime: UNIX_EPOCH,
            crtime: UNIX_EPOCH,
            kind,
            perm,
            nlink,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        })
    }
}

impl fuser::Filesystem for BlobFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_readahead(MAX_READ);
        let _ = config.set_max_write(MAX_READ);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match (parent, name == BLOB_NAME) {
            (INodeNo::ROOT, true) => {
                let a = self.attr(BLOB).expect("the blob has attributes");
                reply.entry(&FOREVER, &a, Generation(0))
            }
            _ => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.attr(ino) {
            Some(a) => reply.attr(&FOREVER, &a),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match ino {
            // Direct: EROFS keeps the file pages; a second copy of them in
            // the blob's page cache would halve what memory holds, and the
            // blob's readahead would run past a file's end into its
            // neighbours (tree P's import over HTTP fetched 31.4 MB through
            // the page cache, 29.5 MB direct, as through a FUSE mount).
            BLOB => reply.opened(FileHandle(0), FopenFlags::FOPEN_DIRECT_IO),
            _ => reply.error(Errno::EISDIR),
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
        reply.error(Errno::ENOSYS);
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
        if ino != BLOB {
            return reply.error(Errno::EISDIR);
        }
        match BlobFs::read(self, offset, size) {
            Ok(b) => reply.data(&b),
            Err(e) => reply.error(e),
        }
    }
}
