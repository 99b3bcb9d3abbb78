//! One mounted image: [`SheafFs`], its state and how image inodes are
//! presented to the kernel.
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
//!
//! Layout (as `union/`): this module holds the state, the inode mapping
//! and the attributes; `ops` the operations (plain methods returning
//! `Result<_, Errno>`, unit-tested without FUSE in `tests`); `fuse` the
//! thin `fuser::Filesystem` that calls them and replies.

// No system calls here: the kernel side is fuser's and `crate::kernel`'s.
#![deny(unsafe_code)]

mod fuse;
mod ops;
#[cfg(test)]
mod tests;

use crate::listing::AttrInterest;
use crate::readahead::Readahead;
use crate::stats::{Op, Stats};
use fuser::{Errno, FileAttr, FileType, INodeNo};
use sheaf_format::records::FileType as Ft;
use sheaf_read::{CountingSource, Image, Inode, ReadError};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant, UNIX_EPOCH};

/// "Forever" for entry and attribute timeouts (the kernel clamps it).
pub(crate) const FOREVER: Duration = Duration::from_secs(u32::MAX as u64);
/// Entries decoded per batch while filling a readdir buffer (the kernel asks
/// for 4 KiB: about 100 plain entries or 25 with attributes).
pub(super) const DIR_BATCH: usize = 128;
/// The same for readdirplus.
pub(super) const DIR_BATCH_PLUS: usize = 32;
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
