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
/// The anchors that locate content for [`Bases::cuts`]: one position in
/// about 256 (a subset of the sketch's anchors).
const INDEX_MASK: u64 = (1 << 8) - 1;
/// Consecutive located anchors of one candidate that make a cut
/// ([`Bases::cuts`]): one for every this many bytes of a block, so about
/// a sixty-fourth of a block (256 anchors, 64 KiB, at 4 MiB). Shorter runs
/// are a common stretch of code or table, not a region that moved.
/// Measured on V (run at 4 MiB blocks → V size): 8 → 133.2 MB, 32 → 132.3,
/// 128 → 131.3, 192 → 131.3, 256 → 130.6, 384 → 131.8, 512 → 133.1;
/// K was 180.3 MB at 8 and is 179.1 at 256, as without cuts.
const RUN_BYTES: usize = 1 << 14;

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

/// Call `f(i, h)` for every anchor of `data`: each position `i` whose gear
/// hash `h` (of the 64 bytes ending at `i`) has its [`ANCHOR_MASK`] bits zero.
fn anchors(data: &[u8], mut f: impl FnMut(usize, u64)) {
    let g = gear();
    let mut h: u64 = 0;
    for (i, &b) in data.iter().enumerate() {
        h = (h << 1).wrapping_add(g[b as usize]);
        // The gear hash depends on the last 64 bytes only; the first 63
        // positions see fewer and are skipped.
        if i >= 63 && h & ANCHOR_MASK == 0 {
            f(i, h);
        }
    }
}

/// A block's sketch: its `K` smallest anchor hashes, ascending, distinct.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sketch(Vec<u64>);

impl Sketch {
    /// The sketch of `data`, and its index anchors ([`INDEX_MASK`]) in
    /// order, for [`Bases::cuts`].
    fn with_index(data: &[u8]) -> (Sketch, Vec<u64>) {
        let mut found: Vec<u64> = Vec::with_capacity(data.len() / 16 + 1);
        let mut index = Vec::with_capacity(data.len() / 128 + 1);
        anchors(data, |_, h| {
            if h & INDEX_MASK == 0 {
                index.push(h);
            }
            // Mixed, so the smallest values are a fair sample.
            found.push(h.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(29));
        });
        found.sort_unstable();
        found.dedup();
        found.truncate(K);
        (Sketch(found), index)
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
    /// Its number among candidates, in the order they came.
    serial: u64,
    /// Its index anchors ([`INDEX_MASK`]).
    index: Vec<u64>,
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
    /// Index anchors of the held candidates → the serial of the latest
    /// that holds it ([`Bases::cuts`]).
    index: HashMap<u64, u64>,
    /// The next candidate's serial.
    serial: u64,
    /// Digests of the candidates dropped since [`Bases::take_evicted`].
    evicted: Vec<Digest>,
}

impl Bases {
    /// Hold up to `budget` bytes of candidate blocks.
    pub fn new(budget: usize) -> Bases {
        Bases {
            budget,
            held: 0,
            recent: VecDeque::new(),
            seqs: HashMap::new(),
            index: HashMap::new(),
            serial: 0,
            evicted: Vec::new(),
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
        let (sketch, index) = Sketch::with_index(data);
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
        self.add(seq, hash, data.clone(), sketch, index);
        None
    }

    /// Hold up to `budget` bytes of candidates from now on (0: make no
    /// reference blocks).
    pub fn set_budget(&mut self, budget: usize) {
        self.budget = budget;
        self.evict();
    }

    /// Whether reference blocks are made (a budget was set).
    pub fn enabled(&self) -> bool {
        self.budget > 0
    }

    fn add(&mut self, seq: u32, hash: Digest, data: Arc<Vec<u8>>, sketch: Sketch, index: Vec<u64>) {
        self.seqs.entry(hash).or_insert(seq);
        self.held += data.len();
        let c = self.candidate(hash, data, sketch, index);
        self.recent.push_back(Held::Ready(c));
        self.evict();
    }

    /// A new candidate with this sketch and these index anchors
    /// ([`Sketch::with_index`] of `data`), its anchors entered.
    fn candidate(
        &mut self,
        hash: Digest,
        data: Arc<Vec<u8>>,
        sketch: Sketch,
        index: Vec<u64>,
    ) -> Candidate {
        let serial = self.serial;
        self.serial += 1;
        for &a in &index {
            self.index.insert(a, serial);
        }
        Candidate {
            hash,
            data,
            sketch,
            serial,
            index,
        }
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
                    let (sketch, index) = Sketch::with_index(&data);
                    Some(Held::Ready(self.candidate(hash, data, sketch, index)))
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
                Some(old) => {
                    self.held -= old.len();
                    if let Held::Ready(c) = old {
                        self.evicted.push(c.hash);
                        for a in &c.index {
                            if self.index.get(a) == Some(&c.serial) {
                                self.index.remove(a);
                            }
                        }
                    }
                }
                None => break,
            }
        }
    }

    /// Where to cut `data`, a file of more than `block` bytes, into pieces
    /// of at most `block` (the ends of the pieces, ascending, the last
    /// `data.len()`), so that each piece holds what one held candidate
    /// holds: versions of a large file move their content by part of a
    /// block, and a piece cut at the fixed block size finds only part of
    /// itself in any one base. The located anchors of `data` (its index
    /// anchors that a candidate holds) name candidates in runs; a piece
    /// ends between a run of its candidate and a run of anchors ([`RUN_BYTES`]) of
    /// another, if at least `min` bytes in, else at `block`. Without held
    /// candidates, the cuts are every `block` bytes.
    pub fn cuts(&mut self, data: &[u8], block: usize, min: usize) -> Vec<usize> {
        let mut located = Vec::new();
        if self.budget > 0 {
            self.load_held();
            if !self.index.is_empty() {
                anchors(data, |i, h| {
                    if h & INDEX_MASK == 0 {
                        if let Some(&s) = self.index.get(&h) {
                            located.push((i, s));
                        }
                    }
                });
            }
        }
        let run = (block / RUN_BYTES).max(4);
        let mut cuts = Vec::with_capacity(data.len() / block + 2);
        let (mut start, mut k) = (0, 0);
        while data.len() - start > block {
            while k < located.len() && located[k].0 < start {
                k += 1;
            }
            let end = next_cut(&located[k..], start, start + block, min, run);
            cuts.push(end);
            start = end;
        }
        cuts.push(data.len());
        cuts
    }

    /// Record that the block of sequence `seq` has content `hash` and may
    /// be named as a base (a base copied from an earlier image with the
    /// reference block that names it).
    pub fn note(&mut self, seq: u32, hash: Digest) {
        self.seqs.entry(hash).or_insert(seq);
    }

    /// The digests of the candidates dropped from the window since the last
    /// call: they will never be chosen as bases.
    pub fn take_evicted(&mut self) -> Vec<Digest> {
        std::mem::take(&mut self.evicted)
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

/// The end of the piece that starts at `start` ([`Bases::cuts`]): given the
/// located anchors from `start` on (position, candidate serial), the first
/// point at least `min` bytes in where a run of `need` anchors of one
/// candidate follows the piece's own (the candidate of its first such run,
/// or of a later one that comes before `min`), halfway between the two;
/// else `limit`.
fn next_cut(
    located: &[(usize, u64)],
    start: usize,
    limit: usize,
    min: usize,
    need: usize,
) -> usize {
    let mut own: Option<(u64, usize)> = None; // candidate, last position
    let (mut run, mut run_len, mut run_at) = (u64::MAX, 0, 0);
    for &(at, s) in located.iter().take_while(|(at, _)| *at < limit) {
        if s == run {
            run_len += 1;
        } else {
            (run, run_len, run_at) = (s, 1, at);
        }
        match own {
            Some((o, _)) if o == s => own = Some((o, at)),
            None if run_len >= need => own = Some((s, at)),
            Some((_, last)) if run_len >= need => {
                // A window of 64 bytes ends at each anchor.
                let cut = (last + run_at.saturating_sub(63)) / 2 + 1;
                if cut >= start + min {
                    return cut;
                }
                // Too early for a piece: the piece is the new candidate's.
                own = Some((s, at));
            }
            _ => {}
        }
    }
    limit
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
        let of = |d: &[u8]| Sketch::with_index(d).0;
        let (sa, sb, su) = (of(&a), of(&b), of(&unrelated));
        assert_eq!(sa.0.len(), K);
        assert_eq!(sa.shared(&sa), K);
        let n = sa.shared(&sb);
        // Jaccard of the anchor sets is about 0.9 / 1.1 = 0.82.
        assert!(n > K / 2, "shared {n}");
        assert!(sa.shared(&su) < MIN_SHARED, "{}", sa.shared(&su));
        // Deterministic.
        assert_eq!(of(&a), sa);
    }

    #[test]
    fn cuts_line_up_with_the_bases_content() {
        const M: usize = 1 << 20;
        let h = |d: &[u8]| sheaf_format::digest(d);
        let a = noise(11, 12 * M);
        let mut b = Bases::new(64 * M);
        // Without candidates: every block.
        assert_eq!(b.cuts(&a, 4 * M, M / 4), vec![4 * M, 8 * M, 12 * M]);
        for (i, blk) in a.chunks(4 * M).enumerate() {
            let blk = Arc::new(blk.to_vec());
            assert!(b.choose(i as u32, h(&blk), &blk).is_none());
        }
        // A new version: 1 MiB of new bytes inserted 2 MiB in. Its bytes
        // from 3 MiB to 5 MiB are the end of the first base, from 5 MiB to
        // 9 MiB the second, from 9 MiB the third.
        let mut v = a[..2 * M].to_vec();
        v.extend_from_slice(&noise(12, M));
        v.extend_from_slice(&a[2 * M..]);
        let cuts = b.cuts(&v, 4 * M, M / 4);
        assert_eq!(cuts[0], 4 * M, "the first base's bytes run past a block");
        // Cut between two anchors, one in about 256 bytes: near, not at,
        // the seam (what is left after the last cut is a tail, packed).
        assert!(cuts[1].abs_diff(5 * M) < 4096, "{cuts:?}");
        assert!(cuts[2].abs_diff(9 * M) < 4096, "{cuts:?}");
        assert!(
            cuts.len() <= 5 && cuts[3].abs_diff(13 * M) < 4096,
            "{cuts:?}"
        );
        assert_eq!(cuts.last(), Some(&v.len()));
        // Each piece's base is the block that holds its bytes.
        let piece = Arc::new(v[cuts[1]..cuts[2]].to_vec());
        let chosen = b.choose(9, h(&piece), &piece).expect("a base");
        assert_eq!(chosen.hash, h(&a[4 * M..8 * M]));
        // Deterministic, and a budget of 0 cuts every block.
        assert_eq!(b.cuts(&v, 4 * M, M / 4), cuts);
        b.set_budget(0);
        assert_eq!(b.cuts(&v, 4 * M, M / 4), vec![4 * M, 8 * M, 12 * M, 13 * M]);
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
        assert_eq!(b.take_evicted(), vec![h(&v1)], "told once");
        assert!(b.take_evicted().is_empty());
        // Left the window, still known as a possible base.
        assert_eq!(b.seq_of(&h(&v1)), Some(0));
    }
}
