//! Sequential-access detection and background decompression of the next block.
//!
//! The packer writes a file's blocks, and the small files of a directory,
//! in order, so "block `b` is read right after block `b-1`" means a reader is
//! streaming (a large file, or `tar`/`cp -r` of a tree). Then block `b+1` is
//! decompressed on a prefetch thread while the reader consumes `b`; the
//! single-flight block cache makes a reader that arrives early wait for that
//! one decompression instead of starting a second.
//!
//! A read decodes a block only as far as it needs (sheaf_read's
//! `Image::block_upto`), and a later read further into it decodes it again
//! from its start. So when a read leaves a block decoded in part and a CPU
//! would otherwise sit idle (fewer reads in progress and prefetches than
//! CPUs, and fewer tasks running on the machine), the rest is decoded
//! there, after the reply: the dynamic loader faulting in a library's
//! pages, one at a time and out of order, then finds them decoded, while
//! concurrent random readers, who keep the CPUs busy, are left the cheaper
//! prefix decodes.
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
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
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
    /// Reads in progress.
    reading: AtomicUsize,
    /// Prefetch threads decoding.
    busy: Arc<AtomicUsize>,
    cpus: usize,
    /// `/proc/loadavg`, whose fourth field counts the tasks running or
    /// ready to run right now (this one included).
    loadavg: Option<std::fs::File>,
}

/// A read in progress, counted while it lives ([`Readahead::reading`]).
pub struct Reading<'a>(&'a AtomicUsize);

impl Drop for Reading<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

impl Readahead {
    /// Start `threads` prefetch threads reading `blocks_ahead` blocks ahead
    /// (0 of either disables readahead).
    pub fn new(img: Arc<Image>, stats: Arc<Stats>, threads: usize, blocks_ahead: u32) -> Self {
        let busy = Arc::new(AtomicUsize::new(0));
        let tx = if threads == 0 || blocks_ahead == 0 {
            None
        } else {
            let (tx, rx) = crossbeam_channel::bounded::<u32>(QUEUE);
            for i in 0..threads {
                let (rx, img, stats, busy) = (rx.clone(), img.clone(), stats.clone(), busy.clone());
                std::thread::Builder::new()
                    .name(format!("sheaf-prefetch-{i}"))
                    .spawn(move || {
                        for id in rx {
                            busy.fetch_add(1, Relaxed);
                            if let Err(e) = img.block(id) {
                                stats.image_errors.fetch_add(1, Relaxed);
                                log::error!("prefetch of data block {id}: {e}");
                            }
                            busy.fetch_sub(1, Relaxed);
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
            reading: AtomicUsize::new(0),
            busy,
            cpus: crate::serve::cpus(),
            loadavg: std::fs::File::open("/proc/loadavg").ok(),
        }
    }

    /// Whether fewer reads are in progress and prefetches under way (with
    /// `queued` waiting) than there are CPUs: the first test of a spare
    /// CPU, a few atomic loads.
    fn spare_here(&self, queued: usize) -> bool {
        self.reading.load(Relaxed) + self.busy.load(Relaxed) + queued < self.cpus
    }

    /// The second test of a spare CPU, one `pread`: (where the kernel says)
    /// fewer tasks running or ready to run on the machine than CPUs, this
    /// one included. A reader that waits on its own read, like Python
    /// importing, leaves one spare; four readers on two CPUs, between their
    /// reads, do not.
    fn spare_on_machine(&self, queued: usize) -> bool {
        let Some(f) = &self.loadavg else { return true };
        let mut buf = [0u8; 128];
        let n = std::os::unix::fs::FileExt::read_at(f, &mut buf, 0).unwrap_or(0);
        running_tasks(&buf[..n]).is_none_or(|r| r + queued < self.cpus)
    }

    /// Count a read in progress until the guard drops.
    pub fn reading(&self) -> Reading<'_> {
        self.reading.fetch_add(1, Relaxed);
        Reading(&self.reading)
    }

    /// After a read (still counted) that used `blocks`: queue those it left
    /// decoded only in part to be decoded whole, while a CPU is spare.
    pub fn complete(&self, blocks: &[u32]) {
        let Some(tx) = &self.tx else { return };
        for &b in blocks {
            // Cheapest first: while reads keep the CPUs busy (the common
            // case under concurrent readers) the block's ref is not looked
            // up again, nor the machine's load read.
            if !self.spare_here(tx.len()) {
                return;
            }
            if !self.img.block_is_prefix(b) {
                continue;
            }
            if !self.spare_on_machine(tx.len()) {
                return;
            }
            match tx.try_send(b) {
                Ok(()) => self.stats.prefetch_completions.fetch_add(1, Relaxed),
                Err(TrySendError::Full(_)) => self.stats.prefetch_dropped.fetch_add(1, Relaxed),
                Err(TrySendError::Disconnected(_)) => return,
            };
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
                .map(|r| self.img.block_cache().contains(&r.key()))
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

/// The tasks running or ready to run, from `/proc/loadavg`'s text
/// ("0.52 0.58 0.59 2/311 12345": the count before the '/').
fn running_tasks(loadavg: &[u8]) -> Option<usize> {
    let field = std::str::from_utf8(loadavg)
        .ok()?
        .split_whitespace()
        .nth(3)?;
    field.split('/').next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn the_running_count_is_read_from_loadavg() {
        assert_eq!(running_tasks(b"0.52 0.58 0.59 2/311 12345\n"), Some(2));
        assert_eq!(running_tasks(b"1.00 1.00 1.00 17/2048 1\n"), Some(17));
        assert_eq!(running_tasks(b"0.52 0.58"), None);
        assert_eq!(running_tasks(b"a b c x/1 2"), None);
    }

    /// An image of one 3 MiB file (compressible, so stored as one block
    /// decoded in steps), its block read in part, and a readahead on two
    /// CPUs with the machine's own load left out.
    fn partly_read() -> (tempfile::TempDir, Arc<Image>, Readahead, u32) {
        let tmp = tempfile::tempdir().unwrap();
        let data = sheaf_testkit::patterned(3 << 20);
        let out = sheaf_testkit::image(tmp.path(), "i", &[("big", &data)]);
        let img = Arc::new(sheaf_read::open_path(&out).unwrap());
        let ino = img.resolve(b"/big").unwrap();
        let mut used = vec![];
        let mut buf = vec![0u8; 4096];
        img.read_with(&ino, 0, &mut buf, &mut |b, _| used.push(b))
            .unwrap();
        assert_eq!(buf, data[..4096], "read through the image");
        let mut ra = Readahead::new(img.clone(), Arc::new(Stats::default()), 1, 1);
        (ra.loadavg, ra.cpus) = (None, 2);
        (tmp, img, ra, used[0])
    }

    #[test]
    fn a_block_read_in_part_is_finished_on_a_spare_cpu() {
        let (_tmp, img, ra, b) = partly_read();
        assert!(img.block_is_prefix(b), "a 4 KiB read decodes a prefix");
        let reading = ra.reading();
        ra.complete(&[b]);
        drop(reading);
        let t = Instant::now();
        while img.block_is_prefix(b) {
            assert!(t.elapsed() < Duration::from_secs(20), "never finished");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(ra.stats.prefetch_completions.load(Relaxed), 1);
        let whole = img.block(b).unwrap();
        assert_eq!(whole.len(), img.block_ref(b).unwrap().ulen as usize);
    }

    #[test]
    fn no_cpu_spare_leaves_the_prefix() {
        let (_tmp, img, ra, b) = partly_read();
        // Two reads in progress on two CPUs.
        let (_r1, _r2) = (ra.reading(), ra.reading());
        ra.complete(&[b]);
        assert_eq!(ra.stats.prefetch_completions.load(Relaxed), 0);
        std::thread::sleep(Duration::from_millis(50));
        assert!(img.block_is_prefix(b));
    }
}
