//! The builder's dictionary policy: which bytes a pack dictionary is
//! trained on, and how large it is (format: `sheaf_format::dict`).
//!
//! Small files are sampled evenly across the packing order, not taken from
//! its start: the first few MiB of a source tree are one corner of it (on
//! tree K, `arch/`), and a dictionary trained there saved 2.2% of K's
//! packs where one trained across the tree saved 3.3% (docs/design.md).

use sheaf_format::Dictionary;
use std::sync::Arc;

/// Size of a trained dictionary: zstd's own default. A 256 KiB one trained
/// on the same samples compressed K's packs 0.6% worse.
pub const DICT_LEN: usize = 110 << 10;
/// Bytes of small files sampled to train on (zstd advises about a hundred
/// times the dictionary; more costs training time for little gain).
pub const SAMPLE_BYTES: u64 = 8 << 20;

/// Small-file bytes below which no dictionary is trained: it is stored in
/// the image (110 KiB) and saves about 3% of the packs, so it pays from
/// some 4 MiB of compressed packs on; below 16 MiB of small files it may
/// cost more than it saves.
pub const MIN_SMALL_BYTES: u64 = 16 << 20;

/// Which of `files` (sizes in packing order) to sample: files shorter than
/// `pack_size` (they go to pack blocks whole), evenly spaced so that about
/// [`SAMPLE_BYTES`] are read; none when they add up to less than
/// [`MIN_SMALL_BYTES`]. Returns indices into `files`.
pub fn pick_samples(files: &[u64], pack_size: u64) -> Vec<usize> {
    let small: Vec<usize> = (0..files.len())
        .filter(|&i| files[i] > 0 && files[i] < pack_size)
        .collect();
    let total: u64 = small.iter().map(|&i| files[i]).sum();
    if total < MIN_SMALL_BYTES {
        return Vec::new();
    }
    // Every k-th small file, at most about SAMPLE_BYTES in all; all of
    // them when they are fewer.
    let k = total.div_ceil(SAMPLE_BYTES).max(1) as usize;
    small.into_iter().step_by(k).collect()
}

/// Small-file bytes at the start of a tar stream held back to train on
/// (samples are picked from them as from a directory's files): a stream
/// cannot be sampled ahead. Memory of the build, not per entry.
pub const STREAM_HOLD_BYTES: u64 = 32 << 20;

/// Train the pack dictionary on `samples`; `None` when they are too few or
/// too short for a dictionary to pay for itself.
pub fn train(samples: &[&[u8]]) -> Option<Arc<Dictionary>> {
    if samples.is_empty() {
        return None;
    }
    sheaf_format::dict::train(samples, DICT_LEN).map(Arc::new)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_spread_and_small() {
        // 10,000 files of 4 KiB (40 MB of small files) and some large ones.
        let mut sizes = vec![4096u64; 10_000];
        sizes[5] = 10 << 20;
        sizes[9_000] = 0;
        let s = pick_samples(&sizes, 256 << 10);
        let bytes: u64 = s.iter().map(|&i| sizes[i]).sum();
        assert!(
            (SAMPLE_BYTES / 2..=SAMPLE_BYTES + 4096).contains(&bytes),
            "{bytes}"
        );
        assert!(s.iter().all(|&i| sizes[i] > 0 && sizes[i] < 256 << 10));
        assert!(*s.last().unwrap() > 9_000, "reaches the end of the order");
        assert!(pick_samples(&[0, 5 << 20], 256 << 10).is_empty());
        assert!(
            pick_samples(&vec![4096; 4000], 256 << 10).is_empty(),
            "16 MB is too little"
        );
    }
}
