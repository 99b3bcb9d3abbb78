//! The operations of a mounted image: plain methods returning
//! `Result<_, Errno>`, called by the FUSE adapter ([`super::fuse`]) and by
//! the unit tests without FUSE. Each is timed and counted here; a read
//! error becomes its errno through [`crate::stats::Stats::read_errno`]
//! (counted and logged unless it is a plain "no such entry").

use super::{Readdirplus, SheafFs, DIR_BATCH, DIR_BATCH_PLUS, MAX_READ};
use crate::stats::Op;
use fuser::{AccessFlags, Errno, FileAttr, FileType, INodeNo, InitFlags};
use sheaf_format::records::FileType as Ft;
use sheaf_read::{Inode, ReadError};
use std::sync::atomic::Ordering::Relaxed;

/// Receives one directory entry: its inode, whether its attributes are
/// known (readdirplus read them and they passed the tree checks), the
/// offset of the next entry and its name; returns true when the reply
/// buffer is full.
pub(super) type DirSink<'a> = dyn FnMut(&SheafFs, Inode, bool, u64, &[u8]) -> bool + 'a;

/// Receives one entry of a readdir reply: its FUSE inode, the next
/// offset, its type and name; returns true when the reply is full.
pub(super) type ReaddirSink<'a> = dyn FnMut(INodeNo, u64, FileType, &[u8]) -> bool + 'a;

/// Receives one entry of a readdirplus reply: the node the kernel makes an
/// entry for (0 for a name listed without attributes), the next offset,
/// the name and the attributes; returns true when the reply is full.
pub(super) type ReaddirplusSink<'a> = dyn FnMut(INodeNo, u64, &[u8], &FileAttr) -> bool + 'a;

/// What `statfs` answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Statfs {
    /// Blocks of `bsize` the image takes.
    pub blocks: u64,
    /// Inodes.
    pub files: u64,
    /// Block size.
    pub bsize: u32,
    /// Longest name.
    pub namelen: u32,
}

impl SheafFs {
    /// The capabilities asked of the kernel at `init`, from those it offers.
    pub(super) fn init_flags(&self, offered: InitFlags) -> InitFlags {
        let plus = match self.cfg.readdirplus {
            Readdirplus::Always => InitFlags::FUSE_DO_READDIRPLUS,
            Readdirplus::Auto => InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO,
            Readdirplus::Never => InitFlags::empty(),
        };
        let want = plus
            | InitFlags::FUSE_CACHE_SYMLINKS
            | InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_MAX_PAGES
            | InitFlags::FUSE_SPLICE_WRITE;
        offered & want
    }

    /// The entry `name` in directory `parent`, looked up for process `pid`.
    /// A missing name is an entry of node 0 (with the root's attributes):
    /// cached by the kernel as a negative entry, so repeated probes
    /// (Python's import path search) stay in the kernel.
    pub(super) fn lookup(&self, pid: u32, parent: INodeNo, name: &[u8]) -> Result<FileAttr, Errno> {
        let _t = self.stats.time(Op::Lookup);
        let r = self.inode(parent).and_then(|dir| {
            let child = self.img.lookup_child(&dir, name)?;
            Ok(child.map(|c| (dir.ino, c)))
        });
        match r {
            Ok(Some((dir, i))) => {
                if i.file_type() != Ft::Directory {
                    self.interest.note_file_lookup(pid, dir);
                }
                Ok(self.attr(&i))
            }
            Ok(None) => {
                let mut neg = self.attr(&self.img.root().expect("root was read at open"));
                neg.ino = INodeNo(0);
                Ok(neg)
            }
            Err(e) => Err(self.errno(Op::Lookup, &e)),
        }
    }

    /// The attributes of `ino`.
    pub(super) fn getattr(&self, ino: INodeNo) -> Result<FileAttr, Errno> {
        let _t = self.stats.time(Op::Getattr);
        self.inode(ino)
            .map(|i| self.attr(&i))
            .map_err(|e| self.errno_at(Op::Getattr, ino, &e))
    }

    /// The target of symlink `ino`.
    pub(super) fn readlink(&self, ino: INodeNo) -> Result<Vec<u8>, Errno> {
        let _t = self.stats.time(Op::Readlink);
        self.inode(ino)
            .and_then(|i| self.img.read_link(&i))
            .map_err(|e| self.errno_at(Op::Readlink, ino, &e))
    }

    /// The answer to `open` and `opendir`: ENOSYS, so the kernel stops
    /// sending them, keeps the page cache and caches listings.
    pub(super) fn open(&self) -> Errno {
        let _t = self.stats.time(Op::Open);
        Errno::ENOSYS
    }

    /// Up to `size` bytes of `ino` at `offset`, handed to `send` (the reply)
    /// before the blocks read are reported to readahead.
    pub(super) fn read(
        &self,
        ino: INodeNo,
        offset: u64,
        size: u32,
        send: impl FnOnce(&[u8]),
    ) -> Result<(), Errno> {
        let _t = self.stats.time(Op::Read);
        if let Some(rec) = &self.recorded {
            if let Ok(i) = self.image_ino(ino) {
                let mut g = rec.lock().expect("record lock");
                if g.0.insert(i) {
                    g.1.push(i);
                }
            }
        }
        let _reading = self.readahead.reading();
        let mut used: Vec<u32> = Vec::with_capacity(2);
        let r = self.inode(ino).and_then(|i| {
            self.img
                .read_bytes(&i, offset, size.min(MAX_READ) as usize, &mut |b, more| {
                    if used.last() != Some(&b) {
                        used.push(b);
                    }
                    self.readahead.observe(b, more)
                })
        });
        match r {
            Ok(bytes) => {
                self.stats
                    .bytes_served
                    .fetch_add(bytes.len() as u64, Relaxed);
                send(&bytes);
                self.readahead.complete(&used);
                Ok(())
            }
            Err(e) => Err(self.errno_at(Op::Read, ino, &e)),
        }
    }

    /// List directory `ino` from `offset` for process `pid` into `add`.
    pub(super) fn readdir(
        &self,
        pid: u32,
        ino: INodeNo,
        offset: u64,
        add: &mut ReaddirSink<'_>,
    ) -> Result<(), Errno> {
        let _t = self.stats.time(Op::Readdir);
        self.fill_dir(
            Op::Readdir,
            pid,
            ino,
            offset,
            &mut |fs, i, _, next, name| {
                let kind = fs.attr(&i).kind;
                add(fs.fuse_ino(i.ino), next, kind, name)
            },
        )
        .map_err(|e| self.errno_at(Op::Readdir, ino, &e))
    }

    /// [`Self::readdir`] with attributes.
    pub(super) fn readdirplus(
        &self,
        pid: u32,
        ino: INodeNo,
        offset: u64,
        add: &mut ReaddirplusSink<'_>,
    ) -> Result<(), Errno> {
        let _t = self.stats.time(Op::Readdirplus);
        self.fill_dir(
            Op::Readdirplus,
            pid,
            ino,
            offset,
            &mut |fs, i, known, next, name| {
                let attr = fs.attr(&i);
                let node = if known { attr.ino } else { INodeNo(0) };
                add(node, next, name, &attr)
            },
        )
        .map_err(|e| self.errno_at(Op::Readdirplus, ino, &e))
    }

    /// Fill a readdir buffer from `offset`: 0 is ".", 1 is "..", `k + 2` is
    /// entry `k`. `add` returns true when the buffer is full. `pid` asked
    /// (it decides whether files come with attributes, see [`crate::listing`]).
    fn fill_dir(
        &self,
        op: Op,
        pid: u32,
        ino: INodeNo,
        offset: u64,
        add: &mut DirSink<'_>,
    ) -> Result<(), ReadError> {
        let dir = self.inode(ino)?;
        let files = op == Op::Readdirplus
            && (self.cfg.readdirplus == Readdirplus::Always
                || self.interest.wants_files(pid, dir.ino));
        let mut off = offset;
        if off == 0 {
            if add(self, dir, true, 1, b".") {
                return Ok(());
            }
            off = 1;
        }
        if off == 1 {
            let parent = self.img.inode(dir.rec.parent)?;
            if add(self, parent, true, 2, b"..") {
                return Ok(());
            }
            off = 2;
        }
        let total = self.img.dir_len(&dir)?;
        let mut k = off - 2;
        while k < total {
            let want = if op == Op::Readdirplus {
                DIR_BATCH_PLUS
            } else {
                DIR_BATCH
            };
            let batch = self.img.read_dir(&dir, k, want)?;
            let plain = |e: &sheaf_read::DirEntry| Inode {
                ino: e.ino,
                rec: sheaf_format::records::InodeRecord {
                    mode: (e.file_type.dtype() as u32) << 12,
                    ..Default::default()
                },
            };
            let children: Vec<(Inode, bool)> = if op == Op::Readdirplus {
                // Attributes for the entries that get them (see `listing`);
                // the others are listed by name and type.
                let with_attrs = |e: &sheaf_read::DirEntry| files || e.file_type == Ft::Directory;
                let inos: Vec<u32> = batch
                    .iter()
                    .filter(|e| with_attrs(e))
                    .map(|e| e.ino)
                    .collect();
                let mut inodes = self.img.inodes(&inos)?.into_iter();
                batch
                    .iter()
                    .map(|e| {
                        if !with_attrs(e) {
                            return (plain(e), false);
                        }
                        let i = inodes.next().expect("one inode per entry asked");
                        match self.img.check_child(&dir, &i, e.file_type) {
                            Ok(()) => (i, true),
                            // Listed without attributes: a lookup of this
                            // name answers EIO, the rest of the listing stands.
                            Err(err) => {
                                self.errno(op, &err);
                                (plain(e), false)
                            }
                        }
                    })
                    .collect()
            } else {
                // Plain readdir needs only the number and type.
                batch.iter().map(|e| (plain(e), true)).collect()
            };
            for (e, (child, known)) in batch.iter().zip(children) {
                k += 1;
                if add(self, child, known, k + 2, &e.name) {
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    /// The root's hidden attributes (statistics, the serving pid), also
    /// answered by the control ioctls; None for any other name or inode.
    pub(super) fn control(&self, ino: INodeNo, name: &[u8]) -> Option<Vec<u8>> {
        if ino.0 != 1 {
            return None;
        }
        if name == crate::STATS_XATTR.as_bytes() {
            Some(self.report().to_bytes())
        } else if name == crate::PID_XATTR.as_bytes() {
            Some(self.pid.to_string().into_bytes())
        } else {
            None
        }
    }

    /// The filesystem's size as `df` shows it.
    pub(super) fn statfs(&self) -> Statfs {
        let _t = self.stats.time(Op::Statfs);
        let bsize = 4096u32;
        Statfs {
            blocks: self.img.len().div_ceil(bsize as u64),
            files: self.img.superblock().inode_count,
            bsize,
            namelen: 255,
        }
    }

    /// Extended attribute `name` of `ino` (or a hidden one of the root).
    /// ENOSYS when the image has none: the kernel stops sending getxattr
    /// for this mount and answers EOPNOTSUPP itself (ls -l asks two or
    /// three per file); statistics are then read through the ioctl.
    pub(super) fn getxattr(&self, ino: INodeNo, name: &[u8]) -> Result<Vec<u8>, Errno> {
        let _t = self.stats.time(Op::Getxattr);
        if !self.img.has_xattrs() {
            return Err(Errno::ENOSYS);
        }
        let value = match self.control(ino, name) {
            Some(v) => Ok(Some(v)),
            None => self
                .inode(ino)
                .and_then(|i| self.img.xattrs(&i))
                .map(|set| {
                    set.0
                        .into_iter()
                        .find(|(k, _)| k.as_slice() == name)
                        .map(|(_, v)| v)
                }),
        };
        match value {
            Ok(Some(v)) => Ok(v),
            Ok(None) => Err(Errno::NO_XATTR),
            Err(e) => Err(self.errno(Op::Getxattr, &e)),
        }
    }

    /// The names of `ino`'s extended attributes, each followed by a NUL
    /// (ENOSYS when the image has none, as [`Self::getxattr`]).
    pub(super) fn listxattr(&self, ino: INodeNo) -> Result<Vec<u8>, Errno> {
        let _t = self.stats.time(Op::Listxattr);
        if !self.img.has_xattrs() {
            return Err(Errno::ENOSYS);
        }
        match self.inode(ino).and_then(|i| self.img.xattrs(&i)) {
            Ok(set) => {
                let mut names = Vec::new();
                for (k, _) in set.0 {
                    names.extend_from_slice(&k);
                    names.push(0);
                }
                Ok(names)
            }
            Err(e) => Err(self.errno_at(Op::Listxattr, ino, &e)),
        }
    }

    /// Whether `ino` exists and may be accessed with `mask`. Permission bits
    /// are checked by the kernel (default_permissions); this only answers
    /// existence and the read-only nature.
    pub(super) fn access(&self, ino: INodeNo, mask: AccessFlags) -> Result<(), Errno> {
        let _t = self.stats.time(Op::Access);
        match self.inode(ino) {
            Ok(_) if mask.contains(AccessFlags::W_OK) => Err(Errno::EROFS),
            Ok(_) => Ok(()),
            Err(e) => Err(self.errno(Op::Access, &e)),
        }
    }
}
