//! The blob map: which range of the virtual blob is which file's data.

use crate::BLOCK;

/// One file's range of the blob: `blocks` blocks from block `start`, the
/// first `size` bytes of which are inode `ino` of layer `layer`'s data
/// (layer 0 for one image; the rest of the last block reads as zeros).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// First blob block.
    pub start: u32,
    /// The layer of a stack, bottom first (0 for one image).
    pub layer: u32,
    /// Sheaf inode number.
    pub ino: u32,
    /// The file's size in bytes.
    pub size: u64,
}

impl Extent {
    /// Blob blocks the range takes.
    pub fn blocks(&self) -> u64 {
        self.size.div_ceil(BLOCK)
    }
}

/// Every file's range of the blob, in blob order, ranges adjacent and
/// never overlapping (the writer assigns them so; [`BlobMap::decode`]
/// checks it of bytes read back).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BlobMap {
    extents: Vec<Extent>,
    blocks: u64,
}

/// The first bytes of an encoded map, with its version.
const MAGIC: &[u8; 8] = b"sheafbm2";
/// Bytes per encoded range.
const ENTRY: usize = 20;

impl BlobMap {
    /// Add a file of `size` bytes (> 0) at the end of the blob; its first
    /// block, or `None` if the blob would pass EROFS's 32-bit block
    /// addresses.
    pub(crate) fn push(&mut self, layer: u32, ino: u32, size: u64) -> Option<u32> {
        let start = u32::try_from(self.blocks).ok()?;
        let end = self.blocks.checked_add(size.div_ceil(BLOCK))?;
        // u32::MAX is EROFS's "no block" (EROFS_NULL_ADDR).
        if end >= u64::from(u32::MAX) {
            return None;
        }
        self.extents.push(Extent {
            start,
            layer,
            ino,
            size,
        });
        self.blocks = end;
        Some(start)
    }

    /// The blob's length in blocks.
    pub fn blocks(&self) -> u64 {
        self.blocks
    }

    /// The blob's length in bytes.
    pub fn len(&self) -> u64 {
        self.blocks * BLOCK
    }

    /// Whether no file has data.
    pub fn is_empty(&self) -> bool {
        self.extents.is_empty()
    }

    /// The ranges, in blob order.
    pub fn extents(&self) -> &[Extent] {
        &self.extents
    }

    /// The range holding blob byte `offset`, if any.
    pub fn find(&self, offset: u64) -> Option<&Extent> {
        let block = offset / BLOCK;
        let i = self
            .extents
            .partition_point(|e| u64::from(e.start) <= block)
            .checked_sub(1)?;
        let e = &self.extents[i];
        (block < u64::from(e.start) + e.blocks()).then_some(e)
    }

    /// The map as bytes (kept beside the metadata image it belongs to).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 + self.extents.len() * ENTRY);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&(self.extents.len() as u64).to_le_bytes());
        for e in &self.extents {
            out.extend_from_slice(&e.start.to_le_bytes());
            out.extend_from_slice(&e.layer.to_le_bytes());
            out.extend_from_slice(&e.ino.to_le_bytes());
            out.extend_from_slice(&e.size.to_le_bytes());
        }
        out
    }

    /// A map from [`BlobMap::encode`]'s bytes; `None` unless they are one,
    /// with every range where the writer would have put it.
    pub fn decode(b: &[u8]) -> Option<BlobMap> {
        let rest = b.strip_prefix(MAGIC)?;
        let (n, mut rest) = rest.split_first_chunk::<8>()?;
        let n = u64::from_le_bytes(*n);
        if rest.len() as u64 != n.checked_mul(ENTRY as u64)? {
            return None;
        }
        let mut m = BlobMap::default();
        while let Some((e, more)) = rest.split_first_chunk::<ENTRY>() {
            let start = u32::from_le_bytes(e[0..4].try_into().ok()?);
            let layer = u32::from_le_bytes(e[4..8].try_into().ok()?);
            let ino = u32::from_le_bytes(e[8..12].try_into().ok()?);
            let size = u64::from_le_bytes(e[12..20].try_into().ok()?);
            if size == 0 || m.push(layer, ino, size)? != start {
                return None;
            }
            rest = more;
        }
        Some(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_block_aligned_found_and_survive_encoding() {
        let mut m = BlobMap::default();
        assert_eq!(m.push(0, 7, 1), Some(0));
        assert_eq!(m.push(1, 9, 4096), Some(1));
        assert_eq!(m.push(0, 3, 4097), Some(2));
        assert_eq!(m.blocks(), 4);
        assert_eq!(m.find(0).map(|e| e.ino), Some(7));
        assert_eq!(m.find(4095).map(|e| e.ino), Some(7));
        assert_eq!(m.find(4096).map(|e| e.ino), Some(9));
        assert_eq!(m.find(3 * 4096 + 5).map(|e| e.ino), Some(3));
        assert_eq!(m.find(4 * 4096), None);
        let back = BlobMap::decode(&m.encode()).expect("decodes");
        assert_eq!(back, m);
    }

    #[test]
    fn a_map_whose_ranges_do_not_follow_is_refused() {
        let mut m = BlobMap::default();
        m.push(0, 1, 10);
        m.push(0, 2, 10);
        let mut b = m.encode();
        // The second range claims block 5 instead of 1.
        b[16 + ENTRY] = 5;
        assert_eq!(BlobMap::decode(&b), None);
        assert_eq!(BlobMap::decode(&b[..b.len() - 1]), None);
        assert_eq!(BlobMap::decode(b"nonsense"), None);
    }

    #[test]
    fn a_blob_past_32_bit_block_addresses_is_refused() {
        let mut m = BlobMap::default();
        assert_eq!(m.push(0, 1, (u64::from(u32::MAX) - 1) * BLOCK), Some(0));
        assert_eq!(m.push(0, 2, BLOCK), None);
        assert_eq!(m.push(0, 3, u64::MAX), None);
    }
}
