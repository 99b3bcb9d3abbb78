//! Layouts for moving images between machines piece by piece (format.md §13).
//!
//! * An **object** is one data block or metadata page as stored, prefixed by
//!   its codec id: `[codec u8][stored bytes]`. It is named by the BLAKE3 of
//!   its *uncompressed* bytes — the digest its ref already carries — so the
//!   same content is one object whichever image, version or codec it came
//!   from, and any holder of a ref can verify it. Node caches and published
//!   repositories both hold objects.
//! * An **image index** holds the few byte ranges of an image a reader needs
//!   to open it (header, tail with trailer, section table, sections and any
//!   signature block) plus the image's length. With objects for every ref,
//!   it stands in for the whole image.

use crate::{Codec, Cursor, FormatError, HEADER_LEN};

/// Magic of an image index file.
pub const INDEX_MAGIC: [u8; 8] = *b"SHEAFIDX";
/// Version of the index layout written here.
pub const INDEX_VERSION: u32 = 1;
/// Largest index a reader accepts.
pub const MAX_INDEX_LEN: usize = 64 << 20;
/// Most ranges an index may hold.
pub const MAX_INDEX_RANGES: u32 = 64;

/// Encode an object: codec id, then the stored bytes.
pub fn encode_object(codec: Codec, stored: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(stored.len() + 1);
    v.push(codec as u8);
    v.extend_from_slice(stored);
    v
}

/// Split an object into its codec and stored bytes (not yet verified: the
/// caller decompresses and checks the digest it was named by).
pub fn decode_object(b: &[u8]) -> Result<(Codec, &[u8]), FormatError> {
    let (&id, rest) = b.split_first().ok_or(FormatError::Truncated("object"))?;
    Ok((Codec::from_id(id)?, rest))
}

/// The path of an object below a store's root: `objects/ab/abcdef…`
/// (256 fan-out directories keep directories small).
pub fn object_path(hash: &crate::Digest) -> String {
    let h = crate::hex(hash);
    format!("objects/{}/{h}", &h[..2])
}

/// Byte ranges of one image, enough to open it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageIndex {
    /// Length of the whole image file (signature block included).
    pub file_len: u64,
    /// `(offset, bytes)` in increasing, non-overlapping order.
    pub ranges: Vec<(u64, Vec<u8>)>,
}

impl ImageIndex {
    /// Whether `b` starts like an index (as opposed to an image).
    pub fn is_index(b: &[u8]) -> bool {
        b.starts_with(&INDEX_MAGIC)
    }

    /// Bytes `[off, off+buf.len())` if one range holds them all.
    pub fn read(&self, buf: &mut [u8], off: u64) -> bool {
        for (start, bytes) in &self.ranges {
            let end = start + bytes.len() as u64;
            if off >= *start && off + buf.len() as u64 <= end {
                let s = (off - start) as usize;
                buf.copy_from_slice(&bytes[s..s + buf.len()]);
                return true;
            }
        }
        false
    }

    /// Add a range, merging with any it touches or overlaps.
    pub fn add(&mut self, off: u64, bytes: &[u8]) {
        let mut lo = off;
        let mut hi = off + bytes.len() as u64;
        let mut keep = Vec::new();
        let mut merged: Vec<(u64, Vec<u8>)> = Vec::new();
        for (s, b) in self.ranges.drain(..) {
            let e = s + b.len() as u64;
            if e < lo || s > hi {
                keep.push((s, b));
            } else {
                lo = lo.min(s);
                hi = hi.max(e);
                merged.push((s, b));
            }
        }
        let mut out = vec![0u8; (hi - lo) as usize];
        for (s, b) in &merged {
            let p = (s - lo) as usize;
            out[p..p + b.len()].copy_from_slice(b);
        }
        let p = (off - lo) as usize;
        out[p..p + bytes.len()].copy_from_slice(bytes);
        keep.push((lo, out));
        keep.sort_by_key(|r| r.0);
        self.ranges = keep;
    }

    /// Serialise: magic, version, range count, file length, then per range
    /// its offset, length and bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&INDEX_MAGIC);
        v.extend_from_slice(&INDEX_VERSION.to_le_bytes());
        v.extend_from_slice(&(self.ranges.len() as u32).to_le_bytes());
        v.extend_from_slice(&self.file_len.to_le_bytes());
        for (off, b) in &self.ranges {
            v.extend_from_slice(&off.to_le_bytes());
            v.extend_from_slice(&(b.len() as u64).to_le_bytes());
            v.extend_from_slice(b);
        }
        v
    }

    /// Parse untrusted bytes; ranges must be in order, inside the file and
    /// must include the header.
    pub fn decode(b: &[u8]) -> Result<ImageIndex, FormatError> {
        if b.len() > MAX_INDEX_LEN {
            return Err(FormatError::invalid("image index", "larger than 64 MiB"));
        }
        let mut c = Cursor::new(b, "image index");
        if c.array::<8>()? != INDEX_MAGIC {
            return Err(FormatError::BadMagic("image index"));
        }
        let version = c.u32()?;
        if version != INDEX_VERSION {
            return Err(FormatError::UnknownFeature(format!(
                "image index version {version}"
            )));
        }
        let n = c.u32()?;
        if n == 0 || n > MAX_INDEX_RANGES {
            return Err(FormatError::invalid(
                "image index",
                format!("{n} ranges (1..={MAX_INDEX_RANGES} allowed)"),
            ));
        }
        let file_len = c.u64()?;
        let mut ranges: Vec<(u64, Vec<u8>)> = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let off = c.u64()?;
            let len = c.u64()?;
            let bytes = c.take(usize::try_from(len).unwrap_or(usize::MAX))?;
            off.checked_add(len)
                .filter(|&e| e <= file_len)
                .ok_or_else(|| FormatError::invalid("image index", "range beyond the image"))?;
            if let Some((ps, pb)) = ranges.last() {
                if off < ps + pb.len() as u64 {
                    return Err(FormatError::invalid("image index", "ranges out of order"));
                }
            }
            ranges.push((off, bytes.to_vec()));
        }
        if c.remaining() != 0 {
            return Err(FormatError::invalid("image index", "trailing bytes"));
        }
        let idx = ImageIndex { file_len, ranges };
        if !idx.read(&mut [0u8; HEADER_LEN], 0) {
            return Err(FormatError::invalid("image index", "no header range"));
        }
        Ok(idx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_round_trip_and_reject_unknown_codecs() {
        let o = encode_object(Codec::Zstd, b"abc");
        assert_eq!(decode_object(&o).unwrap(), (Codec::Zstd, &b"abc"[..]));
        assert!(decode_object(&[]).is_err());
        assert!(decode_object(&[9, 1]).is_err());
    }

    #[test]
    fn index_round_trips_merges_and_serves_reads() {
        let mut i = ImageIndex {
            file_len: 1000,
            ranges: vec![],
        };
        i.add(0, &[1; 64]);
        i.add(900, &[2; 100]);
        i.add(850, &[3; 60]); // overlaps the tail range: merged
        assert_eq!(i.ranges.len(), 2);
        assert_eq!(i.ranges[1].0, 850);
        assert_eq!(i.ranges[1].1.len(), 150);
        let d = ImageIndex::decode(&i.encode()).unwrap();
        assert_eq!(d, i);
        let mut b = [0u8; 4];
        assert!(d.read(&mut b, 905));
        assert_eq!(b, [3; 4]);
        assert!(!d.read(&mut b, 500));
        assert!(!d.read(&mut b, 998));
    }

    #[test]
    fn hostile_indexes_are_errors() {
        let good = ImageIndex {
            file_len: 100,
            ranges: vec![(0, vec![0; 64])],
        }
        .encode();
        for cut in 0..good.len() {
            assert!(ImageIndex::decode(&good[..cut]).is_err());
        }
        let mut beyond = good.clone();
        beyond[16..24].copy_from_slice(&10u64.to_le_bytes()); // file_len < range
        assert!(ImageIndex::decode(&beyond).is_err());
        let mut many = good.clone();
        many[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(ImageIndex::decode(&many).is_err());
        let mut huge = good;
        huge[32..40].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(ImageIndex::decode(&huge).is_err());
    }
}
