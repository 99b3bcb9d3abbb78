//! Reference blocks (codec 6, format.md §7.2): a data block compressed
//! against another block of the image, its *base*.
//!
//! Versions of one file differ in little, but each is compressed alone: a
//! new build of a 30 MiB library costs its whole compressed size again. A
//! reference block is a Zstandard frame whose window starts with the
//! base's uncompressed bytes (zstd's `--patch-from`), so it costs about
//! what changed. One level deep: a base is never itself a reference block,
//! so a read of one costs at most one more block.
//!
//! The stored bytes start with the BLAKE3 digest of the base's
//! *uncompressed* bytes; the image's reference-base section (kind 5) says
//! which block of the image has that content. The ref of a reference block
//! names its stored bytes ([`crate::Codec::names_stored`]), which name the
//! base's content, so what a reference block decodes to is fixed by its
//! ref alone, wherever its bytes travel (a reader checks the base it finds
//! against that digest).

use crate::{Cursor, Digest, FormatError};

/// Bytes a reference block starts with: the digest of its base's content.
pub const REF_PREFIX_LEN: usize = 32;
/// Bytes one entry of the reference-base section takes.
pub const BASE_ENTRY_LEN: usize = 36;

/// The content digest a reference block names (its first 32 bytes).
pub fn named_base(stored: &[u8]) -> Result<Digest, FormatError> {
    Cursor::new(stored, "reference block").array::<32>()
}

/// The window log a frame needs to match anywhere in a base of `base`
/// bytes and output of `data` bytes (at most 27: 128 MiB, two blocks of
/// the largest size, which every zstd decoder accepts by default).
pub fn window_log(base: usize, data: usize) -> u32 {
    let need = (base + data).max(1 << 10);
    (usize::BITS - (need - 1).leading_zeros()).clamp(10, 27)
}

/// Compress `data` at `level` against `base` (whose content digest is
/// `base_digest`): the stored bytes of a reference block (the digest, then
/// the frame).
pub fn compress(level: i32, data: &[u8], base: &[u8], base_digest: &Digest) -> Vec<u8> {
    use zstd::zstd_safe::{CCtx, CParameter};
    let mut c = CCtx::create();
    let set = |c: &mut CCtx, p| c.set_parameter(p).expect("valid zstd parameter");
    set(&mut c, CParameter::CompressionLevel(level));
    set(&mut c, CParameter::ChecksumFlag(false));
    set(&mut c, CParameter::ContentSizeFlag(false));
    set(
        &mut c,
        CParameter::WindowLog(window_log(base.len(), data.len())),
    );
    if let Some(m) = crate::codec::min_match(level) {
        set(&mut c, CParameter::MinMatch(m));
    }
    c.ref_prefix(base).expect("zstd accepts any prefix");
    let mut out = Vec::with_capacity(REF_PREFIX_LEN + zstd::zstd_safe::compress_bound(data.len()));
    out.extend_from_slice(base_digest);
    let mut cur = std::io::Cursor::new(out);
    cur.set_position(REF_PREFIX_LEN as u64);
    c.compress2(&mut cur, data)
        .expect("zstd compression into a large enough Vec cannot fail");
    cur.into_inner()
}

/// One entry of the reference-base section: block `id` of the image has
/// uncompressed content with digest `digest`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Base {
    /// The block's id.
    pub id: u32,
    /// BLAKE3 of its uncompressed bytes.
    pub digest: Digest,
}

/// Encode the reference-base section: `count u32`, then per base its block
/// id (`u32`) and content digest, ids strictly ascending. Empty (no section
/// is written) for no bases.
pub fn encode_section(bases: &[Base]) -> Vec<u8> {
    let mut v = Vec::new();
    if bases.is_empty() {
        return v;
    }
    v.reserve(4 + bases.len() * BASE_ENTRY_LEN);
    v.extend_from_slice(&(bases.len() as u32).to_le_bytes());
    for b in bases {
        v.extend_from_slice(&b.id.to_le_bytes());
        v.extend_from_slice(&b.digest);
    }
    v
}

/// Decode the reference-base section (hostile bytes): the count must
/// match the length, ids must ascend strictly and be below `block_count`,
/// and no digest may appear twice.
pub fn decode_section(b: &[u8], block_count: u64) -> Result<Vec<Base>, FormatError> {
    let bad = |d: String| FormatError::invalid("reference-base section", d);
    let mut c = Cursor::new(b, "reference-base section");
    let n = c.u32()? as usize;
    if c.remaining() != n.saturating_mul(BASE_ENTRY_LEN) {
        return Err(bad(format!(
            "{} bytes for {n} bases of {BASE_ENTRY_LEN}",
            c.remaining()
        )));
    }
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let id = c.u32()?;
        let digest = c.array::<32>()?;
        if id as u64 >= block_count {
            return Err(bad(format!(
                "block {id} of an image of {block_count} blocks"
            )));
        }
        if out.last().is_some_and(|p: &Base| p.id >= id) {
            return Err(bad(format!("block {id} out of order")));
        }
        out.push(Base { id, digest });
    }
    let mut digests: Vec<&Digest> = out.iter().map(|b| &b.digest).collect();
    digests.sort_unstable();
    if digests.windows(2).any(|w| w[0] == w[1]) {
        return Err(bad("one content named by two blocks".into()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn section_round_trips_and_rejects_damage() {
        let a = Base {
            id: 3,
            digest: [1; 32],
        };
        let b = Base {
            id: 9,
            digest: [2; 32],
        };
        let s = encode_section(&[a, b]);
        assert_eq!(decode_section(&s, 10).unwrap(), vec![a, b]);
        assert!(encode_section(&[]).is_empty());
        // Too short, too long, an id past the blocks, out of order, twice.
        assert!(decode_section(&s[..s.len() - 1], 10).is_err());
        let mut long = s.clone();
        long.push(0);
        assert!(decode_section(&long, 10).is_err());
        assert!(decode_section(&s, 9).is_err());
        assert!(decode_section(&encode_section(&[b, a]), 10).is_err());
        let twice = Base { id: 4, ..a };
        assert!(decode_section(&encode_section(&[a, twice]), 10).is_err());
        assert!(decode_section(&u32::MAX.to_le_bytes(), 10).is_err());
    }

    #[test]
    fn window_covers_base_and_data() {
        assert_eq!(window_log(4 << 20, 4 << 20), 23);
        assert_eq!(window_log((4 << 20) + 1, 4 << 20), 24);
        assert_eq!(window_log(64 << 20, 64 << 20), 27);
        assert_eq!(window_log(0, 0), 10);
    }
}
