//! Who reads what, and in which order it is broadcast.
//!
//! The objects every node needs (in file order) are cut into one contiguous
//! share per rank by bytes, so the source is read once, in large sequential
//! runs, by all ranks together. Each share is cut into chunks of whole
//! objects, and the chunks are broadcast round-robin over the ranks (first
//! chunk of every share, then the second, ...), so every reader is busy at
//! once. Every rank computes the same schedule from the same inputs; nothing
//! about it is sent.

use std::ops::Range;

/// One broadcast message: whole objects read by one rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// The rank that reads and sends it.
    pub root: usize,
    /// Indices into the list of needed objects.
    pub objects: Range<usize>,
    /// Payload bytes (the objects' stored lengths).
    pub len: usize,
}

/// The broadcast order for objects of stored sizes `sizes` (in file order)
/// over `ranks` readers, chunks of at most `chunk` bytes (or one object when
/// an object is larger).
pub fn schedule(sizes: &[u32], ranks: usize, chunk: usize) -> Vec<Chunk> {
    let ranks = ranks.max(1);
    let total: u64 = sizes.iter().map(|&s| s as u64).sum();
    // Per rank, its chunks in order.
    let mut per_rank: Vec<Vec<Chunk>> = vec![Vec::new(); ranks];
    let mut start = 0u64;
    for (i, &s) in sizes.iter().enumerate() {
        // The share an object belongs to is decided by where it starts.
        let r = if total == 0 {
            0
        } else {
            ((start as u128 * ranks as u128) / total as u128) as usize
        }
        .min(ranks - 1);
        start += s as u64;
        let list = &mut per_rank[r];
        match list.last_mut() {
            Some(c) if c.objects.end == i && c.len + s as usize <= chunk => {
                c.objects.end = i + 1;
                c.len += s as usize;
            }
            _ => list.push(Chunk {
                root: r,
                objects: i..i + 1,
                len: s as usize,
            }),
        }
    }
    let mut out = Vec::new();
    let mut iters: Vec<_> = per_rank.into_iter().map(|v| v.into_iter()).collect();
    loop {
        let before = out.len();
        for it in iters.iter_mut() {
            out.extend(it.next());
        }
        if out.len() == before {
            return out;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(sizes: &[u32], ranks: usize, chunk: usize) -> Vec<Chunk> {
        let s = schedule(sizes, ranks, chunk);
        // Every object exactly once.
        let mut seen = vec![0; sizes.len()];
        for c in &s {
            for i in c.objects.clone() {
                seen[i] += 1;
            }
            let len: usize = sizes[c.objects.clone()].iter().map(|&x| x as usize).sum();
            assert_eq!(len, c.len);
            assert!(c.len <= chunk || c.objects.len() == 1, "{c:?}");
            assert!(c.root < ranks);
        }
        assert!(seen.iter().all(|&n| n == 1));
        // Each rank's objects form one contiguous run, in order.
        for r in 0..ranks {
            let mine: Vec<usize> = s
                .iter()
                .filter(|c| c.root == r)
                .flat_map(|c| c.objects.clone())
                .collect();
            assert!(
                mine.windows(2).all(|w| w[1] == w[0] + 1),
                "rank {r}: {mine:?}"
            );
        }
        s
    }

    #[test]
    fn shares_are_contiguous_balanced_and_interleaved() {
        let sizes = vec![100u32; 40];
        let s = check(&sizes, 4, 300);
        // 1,000 bytes per rank, in chunks of 3 objects: 4 chunks each.
        for r in 0..4 {
            assert_eq!(s.iter().filter(|c| c.root == r).count(), 4);
        }
        // Round-robin: the first four chunks come from four different ranks.
        let roots: Vec<usize> = s[..4].iter().map(|c| c.root).collect();
        assert_eq!(roots, vec![0, 1, 2, 3]);
    }

    #[test]
    fn odd_inputs() {
        assert!(check(&[], 3, 10).is_empty());
        check(&[5], 8, 1);
        check(&[1000, 1, 1, 1, 1000, 0, 0, 7], 3, 10);
        check(&[0, 0, 0], 2, 10);
        let s = check(&[10; 7], 1, 1 << 20);
        assert_eq!(s.len(), 1);
    }
}
