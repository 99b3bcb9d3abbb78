//! The packer's index of whole files by content, for dedup of identical
//! files (its own module to keep `pack` readable).

use sheaf_format::Digest;

/// Whole files by content digest → the caller's id of the first file
/// stored with that content, for dedup of identical files. There is one
/// entry per distinct file, so this is the packer's largest table: entries
/// (36 bytes; the caller has the chunk range) sit in one vector and the hash
/// table holds only their 4-byte indices. A `HashMap<Digest, (u64, u32)>`
/// took 48 bytes a bucket at a load as low as 7/16, and old and new tables
/// at once while growing.
#[derive(Default)]
pub(crate) struct ContentIndex {
    entries: Vec<ContentEntry>,
    /// Open addressing with linear probing; indices into `entries`,
    /// `EMPTY` for a free slot. Length zero or a power of two.
    slots: Vec<u32>,
}

#[derive(Clone, Copy)]
struct ContentEntry {
    digest: Digest,
    file: u32,
}

impl ContentIndex {
    const EMPTY: u32 = u32::MAX;

    /// Slot to start probing at: digests are uniform, so their first bytes
    /// are a hash already.
    fn home(&self, d: &Digest) -> usize {
        u64::from_le_bytes(d[..8].try_into().expect("8 bytes")) as usize & (self.slots.len() - 1)
    }

    pub(crate) fn get(&self, d: &Digest) -> Option<u32> {
        if self.slots.is_empty() {
            return None;
        }
        let mask = self.slots.len() - 1;
        let mut i = self.home(d);
        loop {
            match self.slots[i] {
                Self::EMPTY => return None,
                e => {
                    let e = &self.entries[e as usize];
                    if e.digest == *d {
                        return Some(e.file);
                    }
                }
            }
            i = (i + 1) & mask;
        }
    }

    /// Record `d` (not present yet). Past 2^32 − 1 entries files are no
    /// longer indexed, only stored again if repeated.
    pub(crate) fn insert(&mut self, d: Digest, file: u32) {
        let n = self.entries.len();
        if n >= Self::EMPTY as usize {
            return;
        }
        // Load at most 3/4 keeps probe runs short.
        if (n + 1) * 4 > self.slots.len() * 3 {
            self.grow((self.slots.len() * 2).max(1024));
        }
        self.entries.push(ContentEntry { digest: d, file });
        self.place(n as u32);
    }

    fn place(&mut self, e: u32) {
        let mask = self.slots.len() - 1;
        let mut i = self.home(&self.entries[e as usize].digest);
        while self.slots[i] != Self::EMPTY {
            i = (i + 1) & mask;
        }
        self.slots[i] = e;
    }

    fn grow(&mut self, len: usize) {
        // The old slots are not needed to rebuild: free them first.
        self.slots = Vec::new();
        self.slots = vec![Self::EMPTY; len];
        for e in 0..self.entries.len() as u32 {
            self.place(e);
        }
    }

    pub(crate) fn reserve(&mut self, more: usize) {
        self.entries.reserve(more);
        let want = (self.entries.len() + more).saturating_mul(4) / 3 + 1;
        if want > self.slots.len() {
            self.grow(want.next_power_of_two().max(1024));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_index_finds_what_it_holds() {
        let mut idx = ContentIndex::default();
        let d = |i: u64| sheaf_format::digest(&i.to_le_bytes());
        assert_eq!(idx.get(&d(0)), None);
        for i in 0..5000u64 {
            if i == 100 {
                idx.reserve(3000); // growing in the middle keeps every entry
            }
            idx.insert(d(i), i as u32 * 3);
        }
        for i in 0..5000u64 {
            assert_eq!(idx.get(&d(i)), Some(i as u32 * 3));
        }
        assert_eq!(idx.get(&d(5000)), None);
    }
}
