//! The FUSE request handlers.
//!
//! An image never changes while mounted, so every reply tells the kernel to
//! keep it forever: entries, attributes and negative lookups get an infinite
//! timeout, and `open`/`opendir` answer `ENOSYS`, which makes the kernel stop
//! sending them at all and treat every open as `FOPEN_KEEP_CACHE` (files) and
//! `FOPEN_CACHE_DIR` (directories). A second `find` or `cat` never reaches
//! this process.
//!
//! Inode numbers: FUSE's root is 1, so image inode `i` is FUSE inode `i + 1`
//! (with the image root and inode 0 swapped if the root is not 0). Hardlinks
//! share one image inode, hence one FUSE inode.

use crate::listing::AttrInterest;
use crate::readahead::Readahead;
use crate::stats::{Op, Stats};
use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, Generation, INodeNo, InitFlags,
    IoctlFlags, KernelConfig, LockOwner, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory,
    ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyOpen, ReplyStatfs, ReplyXattr,
    Request,
};
use sheaf_format::records::FileType as Ft;
use sheaf_read::{CountingSource, Image, Inode, ReadError};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant, UNIX_EPOCH};

/// "Forever" for entry and attribute timeouts (the kernel clamps it).
pub(crate) const FOREVER: Duration = Duration::from_secs(u32::MAX as u64);
/// Entries decoded per batch while filling a readdir buffer (the kernel asks
/// for 4 KiB: about 100 plain entries or 25 with attributes).
const DIR_BATCH: usize = 128;
/// The same for readdirplus.
const DIR_BATCH_PLUS: usize = 32;
/// Largest read the kernel is allowed to send (with `FUSE_MAX_PAGES`).
pub const MAX_READ: u32 = 1 << 20;

/// How the filesystem presents the image.
#[derive(Debug, Clone, Default)]
pub struct FsConfig {
    /// Present every entry as owned by this user.
    pub uid: Option<u32>,
    /// Present every entry as owned by this group.
    pub gid: Option<u32>,
    /// Prefetch threads (0 disables readahead).
    pub prefetch_threads: usize,
    /// Blocks decompressed ahead of a sequential reader.
    pub prefetch_blocks: u32,
    /// How directories are listed.
    pub readdirplus: Readdirplus,
    /// Fetch every metadata page in the background at mount (remote images:
    /// a few large requests instead of a round trip per page on demand).
    pub prefetch_metadata: bool,
    /// Data blocks to fetch in the background at mount, in order.
    pub prefetch_list: Vec<u32>,
    /// Write the paths of the files read, in first-read order, to this file
    /// at unmount (for `-o prefetch=` and `sheaf build --prefetch`).
    pub record: Option<std::path::PathBuf>,
}

/// Read the root's first listing and its entries' attributes in the
/// background. The first thing done with a new mount is listing its root,
/// and `new` runs just before the FUSE handshake, which the kernel waits
/// for before it sends that listing, so after drop_caches its reads are
/// under way by the time the request comes (docs/mount.md).
fn warm_root(img: &Arc<Image>) {
    let img = img.clone();
    let _ = std::thread::Builder::new()
        .name("sheaf-warm-root".into())
        .spawn(move || {
            let Ok(root) = img.root() else { return };
            if let Ok(es) = img.read_dir(&root, 0, 256) {
                let inos: Vec<u32> = es.iter().map(|e| e.ino).collect();
                let _ = img.inodes(&inos);
            }
        });
}

/// Whether directory listings also return every child's attributes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Readdirplus {
    /// Always, for every entry (`ls -l` and `stat` of every entry need no
    /// further requests, but the kernel instantiates an inode for every
    /// entry listed, and a walker that only wants names pays for that).
    Always,
    /// The kernel decides per directory (plus for the first batch, and when
    /// entries of the directory are being stat'ed); directories always come
    /// with attributes, files only for processes and directories that have
    /// shown they stat files (see [`crate::listing`]).
    #[default]
    Auto,
    /// Never: listings return names and types only; entries are looked up
    /// when used.
    Never,
}

/// Receives one directory entry (its inode, the offset of the next entry,
/// its name); returns true when the reply buffer is full.
/// Takes an entry's inode, whether its attributes are known (readdirplus
/// read them and they passed the tree checks), the next offset and the
/// name; returns true when the buffer is full.
type DirSink<'a> = dyn FnMut(&SheafFs, Inode, bool, u64, &[u8]) -> bool + 'a;

/// A mounted image.
pub struct SheafFs {
    img: Arc<Image>,
    src: Arc<CountingSource>,
    cfg: FsConfig,
    stats: Arc<Stats>,
    readahead: Readahead,
    started: Instant,
    pid: u32,
    /// Who gets files' attributes in listings.
    interest: AttrInterest,
    /// Files read so far, in first-read order (with `record`).
    recorded: Option<std::sync::Mutex<(std::collections::HashSet<u32>, Vec<u32>)>>,
}

impl SheafFs {
    /// Serve `img`, whose bytes come through `src` (counted for statistics).
    pub fn new(img: Arc<Image>, src: Arc<CountingSource>, cfg: FsConfig) -> Self {
        let stats = Arc::new(Stats::default());
        let readahead = Readahead::new(
            img.clone(),
            stats.clone(),
            cfg.prefetch_threads,
            cfg.prefetch_blocks,
        );
        warm_root(&img);
        SheafFs {
            recorded: cfg.record.as_ref().map(|_| Default::default()),
            interest: AttrInterest::default(),
            img,
            src,
            cfg,
            stats,
            readahead,
            started: Instant::now(),
            pid: std::process::id(),
        }
    }

    /// Start the background fetch of metadata and listed blocks.
    fn start_prefetch(&self) {
        if !self.cfg.prefetch_metadata && self.cfg.prefetch_list.is_empty() {
            return;
        }
        let (img, list, meta) = (
            self.img.clone(),
            self.cfg.prefetch_list.clone(),
            self.cfg.prefetch_metadata,
        );
        let stats = self.stats.clone();
        let spawned = std::thread::Builder::new()
            .name("sheaf-prefetch".into())
            .spawn(move || {
                let t = Instant::now();
                let mut bytes = 0;
                if meta {
                    match img.prefetch_metadata(4) {
                        Ok(n) => bytes += n,
                        Err(e) => log::warn!("prefetch of metadata stopped: {e}"),
                    }
                }
                if !list.is_empty() {
                    match img.prefetch_blocks(&list, 4) {
                        Ok(n) => bytes += n,
                        Err(e) => log::warn!("prefetch of listed blocks stopped: {e}"),
                    }
                }
                stats.prefetch_bytes.fetch_add(bytes, Relaxed);
                log::info!(
                    "prefetched {bytes} bytes ({} listed blocks) in {:.2} s",
                    list.len(),
                    t.elapsed().as_secs_f64()
                );
            });
        if let Err(e) = spawned {
            log::warn!("no prefetch thread: {e}");
        }
    }

    /// Write the recorded file list (paths relative to the image root).
    fn write_record(&self) {
        let (Some(path), Some(rec)) = (&self.cfg.record, &self.recorded) else {
            return;
        };
        let order = rec.lock().expect("record lock").1.clone();
        let r = (|| -> Result<usize, Box<dyn std::error::Error>> {
            let paths = self.img.paths_of(&order)?;
            let mut out = Vec::new();
            for p in paths.iter().flatten() {
                out.extend_from_slice(p);
                out.push(b'\n');
            }
            std::fs::write(path, out)?;
            Ok(paths.iter().flatten().count())
        })();
        match r {
            Ok(n) => log::info!("recorded {n} files read to {}", path.display()),
            Err(e) => log::error!("recording to {}: {e}", path.display()),
        }
    }

    /// The live counters.
    pub fn stats(&self) -> &Arc<Stats> {
        &self.stats
    }

    fn root(&self) -> u32 {
        self.img.superblock().root_inode
    }

    /// FUSE inode number of image inode `ino`.
    fn fuse_ino(&self, ino: u32) -> INodeNo {
        let root = self.root();
        INodeNo(if ino == root {
            1
        } else if ino == 0 {
            root as u64 + 1
        } else {
            ino as u64 + 1
        })
    }

    /// Image inode number of FUSE inode `ino`.
    fn image_ino(&self, ino: INodeNo) -> Result<u32, Errno> {
        let root = self.root();
        match ino.0 {
            1 => Ok(root),
            n if n == root as u64 + 1 => Ok(0),
            n => u32::try_from(n - 1).map_err(|_| Errno::ENOENT),
        }
    }

    fn inode(&self, ino: INodeNo) -> Result<Inode, ReadError> {
        let i = self
            .image_ino(ino)
            .map_err(|_| ReadError::NoInode(u32::MAX))?;
        self.img.inode(i)
    }

    /// The errno for `e`, logging anything that is not a plain "no such entry".
    fn errno(&self, op: Op, e: &ReadError) -> Errno {
        Errno::from_i32(self.stats.read_errno(op, e))
    }

    /// [`Self::errno`] for a request about `ino`, which `sheaf stats`
    /// names among the recent errors.
    fn errno_at(&self, op: Op, ino: INodeNo, e: &ReadError) -> Errno {
        Errno::from_i32(self.stats.read_errno_at(op, self.image_ino(ino).ok(), e))
    }

    fn attr(&self, i: &Inode) -> FileAttr {
        let mut a = image_attr(self.fuse_ino(i.ino).0, i);
        a.uid = self.cfg.uid.unwrap_or(a.uid);
        a.gid = self.cfg.gid.unwrap_or(a.gid);
        a
    }

    /// Live statistics (the hidden stats xattr).
    pub fn report(&self) -> crate::stats::Report {
        use crate::stats::{CacheReport, PrefetchReport, Report};
        let s = &self.stats;
        let blocks = CacheReport::of(self.img.block_cache());
        let pages = self.img.page_cache();
        Report {
            image: self.img.name().to_string(),
            roots: vec![sheaf_format::hex(&self.img.root_digest())],
            pid: self.pid,
            uptime_s: self.started.elapsed().as_secs_f64(),
            image_reads: Some(self.src.reads.load(Relaxed)),
            image_bytes_read: Some(self.src.bytes.load(Relaxed)),
            bytes_served: s.bytes_served.load(Relaxed),
            image_errors: s.image_errors.load(Relaxed),
            blocks_decompressed: Some(blocks.misses),
            block_cache: blocks,
            page_cache: Some(CacheReport {
                capacity: None,
                evictions: None,
                ..CacheReport::of(pages)
            }),
            prefetch: Some(PrefetchReport {
                queued: s.prefetch_queued.load(Relaxed),
                dropped: s.prefetch_dropped.load(Relaxed),
                completions: s.prefetch_completions.load(Relaxed),
                background_bytes: s.prefetch_bytes.load(Relaxed),
            }),
            remote: sheaf_read::Source::net_stats(&*self.src),
            disk_cache: self.img.store().map(|c| c.store_stats()),
            ops: s.ops(),
            io_uring_requests: fuser::io_uring_requests_served(),
            recent_errors: s.recent_errors(|inos| sheaf_read::verify::paths_of(&self.img, inos)),
            log: crate::logging::destination(),
            ..Default::default()
        }
    }

    /// Value of a hidden xattr of the root, if `name` is one.
    fn hidden_xattr(&self, ino: INodeNo, name: &[u8]) -> Option<Vec<u8>> {
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
}

/// The FUSE file type of an image file type.
pub(crate) fn kind_of(ft: Ft) -> FileType {
    match ft {
        Ft::Regular => FileType::RegularFile,
        Ft::Directory => FileType::Directory,
        Ft::Symlink => FileType::Symlink,
        Ft::CharDevice => FileType::CharDevice,
        Ft::BlockDevice => FileType::BlockDevice,
        Ft::Fifo => FileType::NamedPipe,
        Ft::Socket => FileType::Socket,
    }
}

/// The attributes of image inode `i`, presented as FUSE inode `ino` (the
/// mtime stands for every time: an image keeps only that one).
pub(crate) fn image_attr(ino: u64, i: &Inode) -> FileAttr {
    let r = &i.rec;
    let ft = i.file_type();
    let mtime = if r.mtime_sec >= 0 {
        UNIX_EPOCH + Duration::new(r.mtime_sec as u64, r.mtime_nsec)
    } else {
        UNIX_EPOCH - Duration::from_secs(r.mtime_sec.unsigned_abs())
            + Duration::from_nanos(r.mtime_nsec as u64)
    };
    FileAttr {
        ino: INodeNo(ino),
        size: i.stat_size(),
        blocks: i.stat_blocks(),
        atime: mtime,
        mtime,
        ctime: mtime,
        crtime: mtime,
        kind: kind_of(ft),
        perm: (r.mode & 0o7777) as u16,
        nlink: r.nlink,
        uid: r.uid,
        gid: r.gid,
        rdev: match ft {
            Ft::CharDevice | Ft::BlockDevice => encode_dev(r.data),
            _ => 0,
        },
        blksize: 4096,
        flags: 0,
    }
}

/// The kernel's 32-bit `new_encode_dev` form of a 64-bit glibc `dev_t`.
pub(crate) fn encode_dev(dev: u64) -> u32 {
    let major = libc::major(dev);
    let minor = libc::minor(dev);
    (minor & 0xff) | ((major & 0xfff) << 8) | ((minor & !0xff) << 12)
}

impl Filesystem for SheafFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
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
        let have = config.capabilities() & want;
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
        reply: fuser::ReplyEmpty,
    ) {
        // ENOSYS: the kernel stops sending flush for this mount.
        reply.error(Errno::ENOSYS);
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let _t = self.stats.time(Op::Lookup);
        let r = self.inode(parent).and_then(|dir| {
            let child = self.img.lookup_child(&dir, name.as_bytes())?;
            Ok(child.map(|c| (dir.ino, c)))
        });
        match r {
            Ok(Some((dir, i))) => {
                if i.file_type() != Ft::Directory {
                    self.interest.note_file_lookup(req.pid(), dir);
                }
                reply.entry(&FOREVER, &self.attr(&i), Generation(0))
            }
            Ok(None) => {
                // Inode 0 with a timeout is a cached negative entry: repeated
                // probes (Python's import path search) stay in the kernel.
                let mut neg = self.attr(&self.img.root().expect("root was read at open"));
                neg.ino = INodeNo(0);
                reply.entry(&FOREVER, &neg, Generation(0))
            }
            Err(e) => reply.error(self.errno(Op::Lookup, &e)),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let _t = self.stats.time(Op::Getattr);
        match self.inode(ino) {
            Ok(i) => reply.attr(&FOREVER, &self.attr(&i)),
            Err(e) => reply.error(self.errno_at(Op::Getattr, ino, &e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let _t = self.stats.time(Op::Readlink);
        match self.inode(ino).and_then(|i| self.img.read_link(&i)) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(self.errno_at(Op::Readlink, ino, &e)),
        }
    }

    fn open(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let _t = self.stats.time(Op::Open);
        // ENOSYS: the kernel stops sending open and keeps the page cache.
        reply.error(Errno::ENOSYS);
    }

    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let _t = self.stats.time(Op::Open);
        // ENOSYS: the kernel stops sending opendir and caches listings.
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
                reply.data(&bytes);
                self.readahead.complete(&used);
            }
            Err(e) => reply.error(self.errno_at(Op::Read, ino, &e)),
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
        let _t = self.stats.time(Op::Readdir);
        let r = self.fill_dir(
            Op::Readdir,
            req.pid(),
            ino,
            offset,
            &mut |fs, i, _, next, name| {
                let kind = fs.attr(&i).kind;
                reply.add(fs.fuse_ino(i.ino), next, kind, OsStr::from_bytes(name))
            },
        );
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(self.errno_at(Op::Readdir, ino, &e)),
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
        let _t = self.stats.time(Op::Readdirplus);
        let r = self.fill_dir(
            Op::Readdirplus,
            req.pid(),
            ino,
            offset,
            &mut |fs, i, known, next, name| {
                let attr = fs.attr(&i);
                // Node 0: the kernel lists the name but makes no entry.
                let node = if known { attr.ino } else { INodeNo(0) };
                reply.add(
                    node,
                    next,
                    OsStr::from_bytes(name),
                    &FOREVER,
                    &attr,
                    Generation(0),
                )
            },
        );
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(self.errno_at(Op::Readdirplus, ino, &e)),
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
        crate::reply_control(cmd, out_size, |n| self.hidden_xattr(ino, n), reply)
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let _t = self.stats.time(Op::Statfs);
        let sb = self.img.superblock();
        let bsize = 4096u32;
        reply.statfs(
            self.img.len().div_ceil(bsize as u64),
            0,
            0,
            sb.inode_count,
            0,
            bsize,
            255,
            bsize,
        );
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let _t = self.stats.time(Op::Getxattr);
        if !self.img.has_xattrs() {
            // ENOSYS: the kernel stops sending getxattr for this mount and
            // answers EOPNOTSUPP itself (ls -l asks two or three per file).
            // Statistics are then read through STATS_IOCTL.
            return reply.error(Errno::ENOSYS);
        }
        let name = name.as_bytes();
        let value = match self.hidden_xattr(ino, name) {
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
            Ok(Some(v)) => reply_xattr(reply, size, &v),
            Ok(None) => reply.error(Errno::NO_XATTR),
            Err(e) => reply.error(self.errno(Op::Getxattr, &e)),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let _t = self.stats.time(Op::Listxattr);
        if !self.img.has_xattrs() {
            return reply.error(Errno::ENOSYS);
        }
        match self.inode(ino).and_then(|i| self.img.xattrs(&i)) {
            Ok(set) => {
                let mut names = Vec::new();
                for (k, _) in set.0 {
                    names.extend_from_slice(&k);
                    names.push(0);
                }
                reply_xattr(reply, size, &names)
            }
            Err(e) => reply.error(self.errno_at(Op::Listxattr, ino, &e)),
        }
    }

    fn access(&self, _req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let _t = self.stats.time(Op::Access);
        // Permission bits are checked by the kernel (default_permissions);
        // this only answers existence and the read-only nature.
        match self.inode(ino) {
            Ok(_) if mask.contains(AccessFlags::W_OK) => reply.error(Errno::EROFS),
            Ok(_) => reply.ok(),
            Err(e) => reply.error(self.errno(Op::Access, &e)),
        }
    }
}

/// Answer a getxattr/listxattr: the size when asked for it, ERANGE when the
/// caller's buffer is too small, else the bytes.
fn reply_xattr(reply: ReplyXattr, size: u32, v: &[u8]) {
    if size == 0 {
        reply.size(v.len() as u32)
    } else if (size as usize) < v.len() {
        reply.error(Errno::ERANGE)
    } else {
        reply.data(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_numbers_use_the_kernel_encoding() {
        assert_eq!(encode_dev(libc::makedev(1, 3)), 0x103);
        assert_eq!(
            encode_dev(libc::makedev(259, 0x12345)),
            0x12345 & 0xff | 259 << 8 | (0x12300 << 12)
        );
    }
}
