//! Compression dictionaries (format.md §5.1, codec 4).
//!
//! Small files compress poorly alone: a pack block of a few hundred KiB
//! starts with an empty zstd window. A dictionary trained on an image's own
//! small files gives every pack that context, so packs can be small (cheap
//! random reads, fine-grained lazy fetches) at the size of large ones.
//!
//! A block compressed with a dictionary names it by digest in its first 32
//! stored bytes, so the block stays decodable wherever it travels as an
//! object (node caches and repositories are shared by digest across images):
//! a reader finds the dictionary in the image's dictionary section, or else
//! as the object named by that digest.

use crate::{digest, Cursor, Digest, FormatError};
use std::sync::Arc;

/// Largest dictionary a reader accepts.
pub const MAX_DICT_LEN: usize = 1 << 20;
/// Most dictionaries one image may carry.
pub const MAX_DICTS: u32 = 64;
/// Bytes a dictionary-compressed block starts with: the dictionary's digest.
pub const DICT_PREFIX_LEN: usize = 32;

/// One dictionary: its bytes, named by their BLAKE3 digest.
pub struct Dictionary {
    digest: Digest,
    bytes: Arc<[u8]>,
}

impl std::fmt::Debug for Dictionary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dictionary")
            .field("digest", &crate::hex(&self.digest))
            .field("len", &self.bytes.len())
            .finish()
    }
}

impl Dictionary {
    /// A dictionary from its bytes (1..=[`MAX_DICT_LEN`]).
    pub fn new(bytes: Vec<u8>) -> Result<Dictionary, FormatError> {
        if bytes.is_empty() || bytes.len() > MAX_DICT_LEN {
            return Err(FormatError::invalid(
                "dictionary",
                format!("length {} (1..={MAX_DICT_LEN})", bytes.len()),
            ));
        }
        Ok(Dictionary {
            digest: digest(&bytes),
            bytes: bytes.into(),
        })
    }
    /// BLAKE3 of the bytes: the name blocks use.
    pub fn digest(&self) -> &Digest {
        &self.digest
    }
    /// The dictionary's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

/// Where a decoder finds what a block names besides its own bytes: the
/// dictionary of a codec-4 block, the base of a codec-6 block.
pub trait DictLookup {
    /// The dictionary with this digest, if known.
    fn dictionary(&self, digest: &Digest) -> Option<Arc<Dictionary>>;
    /// The uncompressed bytes of the reference base whose content has this
    /// digest (format.md §7.2). The decoder checks them against it.
    fn reference(&self, digest: &Digest) -> Result<Arc<Vec<u8>>, FormatError> {
        Err(FormatError::MissingReference(crate::hex(digest)))
    }
    /// Whether what [`DictLookup::reference`] gives for this digest was
    /// checked against it before ([`DictLookup::reference_checked`]): a
    /// lookup that always gives the same bytes for a digest (an image's
    /// base is one block, verified by its own ref whenever it is decoded)
    /// spares the decoder hashing up to a block for every reference block
    /// it decodes. By default nothing is remembered.
    fn reference_known(&self, _digest: &Digest) -> bool {
        false
    }
    /// The decoder checked the base for this digest against it.
    fn reference_checked(&self, _digest: &Digest) {}
}

/// No dictionaries: a block that needs one fails to decode.
pub struct NoDicts;

impl DictLookup for NoDicts {
    fn dictionary(&self, _: &Digest) -> Option<Arc<Dictionary>> {
        None
    }
}

impl DictLookup for &[Arc<Dictionary>] {
    fn dictionary(&self, d: &Digest) -> Option<Arc<Dictionary>> {
        self.iter().find(|x| x.digest == *d).cloned()
    }
}

impl DictLookup for Vec<Arc<Dictionary>> {
    fn dictionary(&self, d: &Digest) -> Option<Arc<Dictionary>> {
        self.as_slice().dictionary(d)
    }
}

/// The digest a dictionary-compressed block names (its first 32 bytes).
pub fn named_dictionary(stored: &[u8]) -> Result<Digest, FormatError> {
    Cursor::new(stored, "dictionary-compressed block").array::<32>()
}

/// Encode the dictionary section: `count u32`, then per dictionary
/// `length u32` and its bytes; nothing at all (no section is written) for
/// no dictionaries.
pub fn encode_section(dicts: &[Arc<Dictionary>]) -> Vec<u8> {
    let mut v = Vec::new();
    if dicts.is_empty() {
        return v;
    }
    v.extend_from_slice(&(dicts.len() as u32).to_le_bytes());
    for d in dicts {
        v.extend_from_slice(&(d.bytes.len() as u32).to_le_bytes());
        v.extend_from_slice(&d.bytes);
    }
    v
}

/// Decode the dictionary section (hostile bytes: every length is checked,
/// nothing may follow the last dictionary, no dictionary may repeat).
pub fn decode_section(b: &[u8]) -> Result<Vec<Arc<Dictionary>>, FormatError> {
    let mut c = Cursor::new(b, "dictionary section");
    let n = c.u32()?;
    if n > MAX_DICTS {
        return Err(FormatError::invalid(
            "dictionary section",
            format!("{n} dictionaries (at most {MAX_DICTS})"),
        ));
    }
    let mut out: Vec<Arc<Dictionary>> = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let len = c.u32()? as usize;
        if len > MAX_DICT_LEN {
            return Err(FormatError::invalid(
                "dictionary section",
                format!("dictionary of {len} bytes (at most {MAX_DICT_LEN})"),
            ));
        }
        let d = Dictionary::new(c.take(len)?.to_vec())?;
        if out.iter().any(|x| x.digest == d.digest) {
            return Err(FormatError::invalid(
                "dictionary section",
                "the same dictionary twice",
            ));
        }
        out.push(Arc::new(d));
    }
    if c.remaining() != 0 {
        return Err(FormatError::invalid(
            "dictionary section",
            "bytes after the last dictionary",
        ));
    }
    Ok(out)
}

/// Train a dictionary of at most `max_len` bytes on `samples` (the
/// contents of small files). Deterministic for the same samples. `None`
/// when there is too little to learn from.
pub fn train(samples: &[&[u8]], max_len: usize) -> Option<Dictionary> {
    let total: usize = samples.iter().map(|s| s.len()).sum();
    // zstd needs a few samples and several times the dictionary's size to
    // learn anything; below that a dictionary costs more than it saves.
    if samples.len() < 16 || total < 4 * max_len {
        return None;
    }
    let bytes = zstd::dict::from_samples(samples, max_len).ok()?;
    Dictionary::new(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn section_round_trips_and_rejects_damage() {
        let a = Arc::new(Dictionary::new(b"abc".to_vec()).unwrap());
        let b = Arc::new(Dictionary::new(vec![7; 100]).unwrap());
        let s = encode_section(&[a.clone(), b.clone()]);
        let d = decode_section(&s).unwrap();
        assert_eq!(d.len(), 2);
        assert_eq!(d[0].digest(), a.digest());
        assert_eq!(d[1].bytes(), b.bytes());
        assert!(decode_section(&s[..s.len() - 1]).is_err());
        let mut extra = s.clone();
        extra.push(0);
        assert!(decode_section(&extra).is_err());
        assert!(decode_section(&encode_section(&[a.clone(), a])).is_err());
        assert!(decode_section(&u32::MAX.to_le_bytes()).is_err());
        assert!(Dictionary::new(Vec::new()).is_err());
    }
}
