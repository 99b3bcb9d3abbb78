//! Which earlier block a new block resembles, for reference blocks
//! (format.md §7.2, [`sheaf_format::reference`]).
//!
//! A block's *sketch* is the `K` smallest of the hashes of its 64-byte
//! windows that a rolling (gear) hash picks as anchors, about one in 32
//! positions: two blocks that share much of their content share many of
//! their smallest anchors wherever the shared bytes sit, so the sketches
//! estimate resemblance without comparing bytes (the bottom-k estimate of
//! the Jaccard index). The builder keeps recent blocks that may serve as
//! bases, up to a memory budget, and compresses a new block against the
//! one whose sketch resembles it most. Versions of one file sit together
//! in the packing order ([`crate::order`]), so the base of a block is
//! usually a few blocks back.
//!
//! Memory: the budget's worth of block bytes, plus 36 bytes for every block
//! that served as a candidate (its content digest and sequence number).

use sheaf_format::Digest;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, OnceLock};

/// Anchors kept per sketch.
const K: usize = 64;
/// Anchors shared (of the `K` smallest of both sketches together) that make
/// a block worth compressing against another: below this the frame rarely
/// gains what the extra block costs a reader.
const MIN_SHARED: usize = 4;
/// A position is an anchor when the low bits of the gear hash are zero.
const ANCHOR_MASK: u64 = (1 << 5) - 1;

/// The gear table: 256 fixed pseudo-random words (SplitMix64 from a fixed
/// seed, so sketches, and so images, are the same on every build).
fn gear() -> &'static [u64; 256] {
    static T: OnceLock<[u64; 256]> = OnceLock::new();
    T.get_or_init(|| {
        let mut s: u64 = 0x5348_4541_4620_7631; // "SHEAF v1"
        std::array::from_fn(|_| {
            s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        })
    })
}

/// A block's sketch: its `K` smallest anchor hashes, ascending, distinct.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sketch(Vec<u64>);

impl Sketch {
    /// The sketch of `data`.
    pub fn of(data: &[u8]) -> Sketch {
        let g = gear();
        let mut h: u64 = 0;
        let mut found: Vec<u64> = Vec::with_capacity(data.len() / 16 + 1);
        for (i, &b) in data.iter().enumerate() {
            h = (h << 1).wrapping_add(g[b as usize]);
            // The gear hash depends on the last 64 bytes only; the first 63
            // positions see fewer and are skipped.
            if i >= 63 && h & ANCHOR_MASK == 0 {
                // Mixed, so the smallest values are a fair sample.
                found.push(h.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(29));
            }
        }
        found.sort_unstable();
        found.dedup();
        found.truncate(K);
        Sketch(found)
    }

    /// How many of the `K` smallest anchors of both sketches together
    /// both hold.
    pub fn shared(&self, other: &Sketch) -> usize {
        let (a, b) = (&self.0, &other.0);
        let (mut i, mut j, mut seen, mut both) = (0, 0, 0, 0);
        while seen < K && (i < a.len() || j < b.len()) {
            match (a.get(i), b.get(j)) {
                (Some(x), Some(y)) if x == y => {
                    both += 1;
                    i += 1;
                    j += 1;
                }
                (Some(x), Some(y)) if x < y => i += 1,
                (Some(_), None) => i += 1,
                _ => j += 1,
            }
            seen += 1;
        }
        both
    }
}

/// A block that may serve as a base.
struct Candidate {
    hash: Digest,
    data: Arc<Vec<u8>>,
    sketch: Sketch,
}

/// Loads a candidate's bytes when first needed: a block copied from an
/// earlier image as stored, which only a new block may want to see.
pub type Loader = Box<dyn FnOnce() -> Option<Arc<Vec<u8>>> + Send>;

/// A candidate held, or one to load when a new block looks for a base.
enum Held {
    Ready(Candidate),
    Later(u32, usize, Loader),
}

impl Held {
    fn len(&self) -> usize {
        match self {
            Held::Ready(c) => c.data.len(),
            Held::Later(_, n, _) => *n,
        }
    }
}

/// A base chosen for a new block: its bytes and content digest.
pub struct Chosen {
    /// The base's uncompressed bytes.
    pub data: Arc<Vec<u8>>,
    /// Their digest, which the reference block names.
    pub hash: Digest,
    /// Anchors the sketches share (of [`K`]).
    pub shared: usize,
}

/// Recent blocks that may serve as bases, and every block that has.
pub struct Bases {
    budget: usize,
    held: usize,
    recent: VecDeque<Held>,
    /// Every block ever offered as a candidate: content digest → sequence
    /// number (for the reference-base section, once ids are known).
    seqs: HashMap<Digest, u32>,
}

impl Bases {
    /// Hold up to `budget` bytes of candidate blocks.
    pub fn new(budget: usize) -> Bases {
        Bases {
            budget,
            held: 0,
            recent: VecDeque::new(),
            seqs: HashMap::new(),
        }
    }

    /// The base for block `seq` (content `data` with digest `hash`): the
    /// held candidate that resembles it most, if any resembles it enough.
    /// Otherwise the block becomes a candidate itself (it will be stored
    /// alone, so it may be a base: never a reference block's base is a
    /// reference block).
    pub fn choose(&mut self, seq: u32, hash: Digest, data: &Arc<Vec<u8>>) -> Option<Chosen> {
        if self.budget == 0 {
            return None;
        }
        let sketch = Sketch::of(data);
        self.load_held();
        let best = self
            .recent
            .iter()
            .rev()
            .filter_map(|h| match h {
                Held::Ready(c) => Some(c),
                Held::Later(..) => None,
            })
            .map(|c| (c.sketch.shared(&sketch), c))
            .filter(|(n, c)| *n >= MIN_SHARED && c.hash != hash)
            // The most recent of the best: ties go to the nearest version.
            .fold(None::<(usize, &Candidate)>, |best, (n, c)| match best {
                Some((m, _)) if m >= n => best,
                _ => Some((n, c)),
            });
        if let Some((n, c)) = best {
            return Some(Chosen {
                data: c.data.clone(),
                hash: c.hash,
                shared: n,
            });
        }
        self.add(seq, hash, data.clone(), sketch);
        None
    }

    /// Hold up to `budget` bytes of candidates from now on (0: make no
    /// reference blocks).
    pub fn set_budget(&mut self, budget: usize) {
        self.budget = budget;
        self.evict();
    }

    fn add(&mut self, seq: u32, hash: Digest, data: Arc<Vec<u8>>, sketch: Sketch) {
        self.seqs.entry(hash).or_insert(seq);
        self.held += data.len();
        self.recent
            .push_back(Held::Ready(Candidate { hash, data, sketch }));
        self.evict();
    }

    /// Offer block `seq` of `len` bytes, stored alone, whose bytes `load`
    /// gives when a new block first looks for a base while it is held (a
    /// block copied from a `--base` image: most are never looked at, and
    /// decoding them all would cost a build on a base what it saves).
    pub fn offer_later(&mut self, seq: u32, len: usize, load: Loader) {
        if self.budget == 0 {
            return;
        }
        self.held += len;
        self.recent.push_back(Held::Later(seq, len, load));
        self.evict();
    }

    /// Load the candidates offered for later; one that cannot be loaded is
    /// dropped (the copy of its block fails on its own).
    fn load_held(&mut self) {
        if !self.recent.iter().any(|h| matches!(h, Held::Later(..))) {
            return;
        }
        let recent = std::mem::take(&mut self.recent);
        self.recent = recent
            .into_iter()
            .filter_map(|h| match h {
                Held::Later(seq, _, load) => {
                    let data = load()?;
                    let hash = sheaf_format::digest(&data);
                    self.seqs.entry(hash).or_insert(seq);
                    Some(Held::Ready(Candidate {
                        hash,
                        sketch: Sketch::of(&data),
                        data,
                    }))
                }
                ready => Some(ready),
            })
            .collect();
        self.held = self.recent.iter().map(Held::len).sum();
    }

    /// Drop the oldest candidates until the budget holds the rest.
    fn evict(&mut self) {
        while self.held > self.budget {
            match self.recent.pop_front() {
                Some(old) => self.held -= old.len(),
                None => break,
            }
        }
    }

    /// Record that the block of sequence `seq` has content `hash` and may
    /// be named as a base (a base copied from an earlier image with the
    /// reference block that names it).
    pub fn note(&mut self, seq: u32, hash: Digest) {
        self.seqs.entry(hash).or_insert(seq);
    }

    /// The sequence number of the block with content `hash`, if one was a
    /// candidate.
    pub fn seq_of(&self, hash: &Digest) -> Option<u32> {
        self.seqs.get(hash).copied()
    }

    /// Whether the block with content `hash` is held now (for tests).
    #[cfg(test)]
    fn holds(&self, hash: &Digest) -> bool {
        self.recent
            .iter()
            .any(|h| matches!(h, Held::Ready(c) if c.hash == *hash))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic pseudo-random bytes.
    fn noise(seed: u64, n: usize) -> Vec<u8> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                s as u8
            })
            .collect()
    }

    #[test]
    fn sketches_see_shared_content_wherever_it_sits() {
        let a = noise(1, 1 << 20);
        // The same bytes shifted by 1000 and with 10% replaced.
        let mut b = noise(2, 1000);
        b.extend_from_slice(&a);
        for i in (0..b.len()).step_by(10_000) {
            b[i..i + 1000].copy_from_slice(&noise(i as u64 + 3, 1000));
        }
        let unrelated = noise(99, 1 << 20);
        let (sa, sb, su) = (Sketch::of(&a), Sketch::of(&b), Sketch::of(&unrelated));
        assert_eq!(sa.0.len(), K);
        assert_eq!(sa.shared(&sa), K);
        let n = sa.shared(&sb);
        // Jaccard of the anchor sets is about 0.9 / 1.1 = 0.82.
        assert!(n > K / 2, "shared {n}");
        assert!(sa.shared(&su) < MIN_SHARED, "{}", sa.shared(&su));
        // Deterministic.
        assert_eq!(Sketch::of(&a), sa);
    }

    #[test]
    fn choose_takes_the_resembling_block_and_keeps_to_the_budget() {
        let v1 = Arc::new(noise(5, 256 << 10));
        let other = Arc::new(noise(6, 256 << 10));
        let mut v2 = (*v1).clone();
        v2[1000..2000].fill(0);
        let v2 = Arc::new(v2);
        let h = |d: &[u8]| sheaf_format::digest(d);
        let mut b = Bases::new(600 << 10);
        assert!(b.choose(0, h(&v1), &v1).is_none());
        assert!(b.choose(1, h(&other), &other).is_none());
        let c = b.choose(2, h(&v2), &v2).expect("v1 resembles v2");
        assert_eq!(c.hash, h(&v1));
        // v2 got a base, so it is no candidate itself.
        assert!(!b.holds(&h(&v2)));
        assert_eq!(b.seq_of(&h(&v1)), Some(0));
        // A third unrelated block goes past the budget: the oldest leaves.
        let third = Arc::new(noise(7, 256 << 10));
        assert!(b.choose(3, h(&third), &third).is_none());
        assert!(!b.holds(&h(&v1)) && b.holds(&h(&other)) && b.holds(&h(&third)));
        // Left the window, still known as a possible base.
        assert_eq!(b.seq_of(&h(&v1)), Some(0));
    }
}
