//! Sequential-access detection and background decompression of the next block.
//!
//! The packer writes a file's blocks, and the small files of a directory,
//! in order, so "block `b` is read right after block `b-1`" means a reader is
//! streaming (a large file, or `tar`/`cp -r` of a tree). Then block `b+1` is
//! decompressed on a prefetch thread while the reader consumes `b`; the
//! single-flight block cache makes a reader that arrives early wait for that
//! one decompression instead of starting a second.
//!
//! On a lazy mount (an image with a node cache: its blocks come over the
//! network) a block read ahead costs fetched bytes, not only CPU, so there
//! only a file with data in a later block reads ahead, after [`LAZY_RUN`]
//! of its blocks in a row: the next block of an image holds other files,
//! often never read, and a library the loader pages in is not a stream
//! (lazy import from tree P: 15.54% with any run, 15.30% after three
//! blocks, 14.50% after eight; docs/remote.md).

use crate::stats::Stats;
use crossbeam_channel::{Sender, TrySendError};
use sheaf_read::Image;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

/// How many recently used blocks are remembered.
const RECENT: usize = 32;
/// Blocks of one file read in a row before a lazy mount reads ahead: a
/// block fetched ahead costs network bytes, and the dynamic loader reads up
/// to 6 blocks of a large library in order without needing the next (lazy
/// import from tree P: 3 → 15.30% of the image, 8 → 14.50%; readahead=0 is
/// 14.50%). A file read 32 MiB in order (4 MiB blocks) is a stream.
const LAZY_RUN: u32 = 8;
/// Blocks waiting for a prefetch thread; more are dropped (never block a reader).
const QUEUE: usize = 16;

/// The detector and its worker threads.
pub struct Readahead {
    /// Recently first-touched block ids plus one (0 = empty), a tiny ring.
    recent: [AtomicU64; RECENT],
    next: AtomicU64,
    blocks_ahead: u32,
    tx: Option<Sender<u32>>,
    img: Arc<Image>,
    stats: Arc<Stats>,
    /// Read ahead only within a file (a lazy mount, see above).
    within_file: bool,
}

impl Readahead {
    /// Start `threads` prefetch threads reading `blocks_ahead` blocks ahead
    /// (0 of either disables readahead).
    pub fn new(img: Arc<Image>, stats: Arc<Stats>, threads: usize, blocks_ahead: u32) -> Self {
        let tx = if threads == 0 || blocks_ahead == 0 {
            None
        } else {
            let (tx, rx) = crossbeam_channel::bounded::<u32>(QUEUE);
            for i in 0..threads {
                let (rx, img, stats) = (rx.clone(), img.clone(), stats.clone());
                std::thread::Builder::new()
                    .name(format!("sheaf-prefetch-{i}"))
                    .spawn(move || {
                        for id in rx {
                            if let Err(e) = img.block(id) {
                                stats.image_errors.fetch_add(1, Relaxed);
                                log::error!("prefetch of data block {id}: {e}");
                            }
                        }
                    })
                    .expect("spawn prefetch thread");
            }
            Some(tx)
        };
        Readahead {
            recent: Default::default(),
            next: AtomicU64::new(0),
            blocks_ahead,
            tx,
            within_file: img.store().is_some(),
            img,
            stats,
        }
    }

    fn seen(&self, block: u32) -> bool {
        let k = block as u64 + 1;
        self.recent.iter().any(|r| r.load(Relaxed) == k)
    }

    /// Note that a read used `block`; queue the blocks after it if the read
    /// continues a stream. `file_continues`: the file read has data in a
    /// later block than this one.
    pub fn observe(&self, block: u32, file_continues: bool) {
        let Some(tx) = &self.tx else { return };
        if self.seen(block) {
            return;
        }
        let slot = self.next.fetch_add(1, Relaxed) as usize % RECENT;
        self.recent[slot].store(block as u64 + 1, Relaxed);
        if block == 0 || !self.seen(block - 1) {
            return;
        }
        if self.within_file
            && (!file_continues
                || block < LAZY_RUN - 1
                || (2..LAZY_RUN).any(|k| !self.seen(block - k)))
        {
            return;
        }
        let count = self.img.superblock().block_count;
        for ahead in 1..=self.blocks_ahead {
            let Some(next) = block.checked_add(ahead).filter(|&b| (b as u64) < count) else {
                break;
            };
            let cached = self
                .img
                .block_ref(next)
                .map(|r| self.img.block_cache().contains(&r.hash))
                .unwrap_or(true);
            if cached {
                continue;
            }
            match tx.try_send(next) {
                Ok(()) => self.stats.prefetch_queued.fetch_add(1, Relaxed),
                Err(TrySendError::Full(_)) => self.stats.prefetch_dropped.fetch_add(1, Relaxed),
                Err(TrySendError::Disconnected(_)) => return,
            };
        }
    }
}
