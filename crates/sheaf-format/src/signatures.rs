//! The signature block: signatures appended after an image's trailer.
//!
//! Signatures sign the root digest, which covers everything else, so they
//! cannot live inside the hashed section table. They follow the image as
//! `[entries][footer]`, where each entry is `u32 length` + the signature (an
//! OpenSSH `SSHSIG` in PEM text) and the 40-byte footer is
//!
//! | off | size | field |
//! |---|---|---|
//! | 0 | 8 | magic `SHEAFSIG` |
//! | 8 | 4 | entry count |
//! | 12 | 4 | reserved, zero |
//! | 16 | 8 | image length (where the image's own bytes end) |
//! | 24 | 8 | offset of the entries |
//! | 32 | 8 | length of the entries |
//!
//! Adding a signature appends a new, complete block and footer (the old
//! block, if any, becomes dead bytes), so an interrupted signing never
//! damages what was there: the image bytes are never touched.

use crate::{Cursor, FormatError};

/// Magic of the footer.
pub const SIG_MAGIC: &[u8; 8] = b"SHEAFSIG";
/// Footer length.
pub const SIG_FOOTER_LEN: usize = 40;
/// Largest entries region accepted.
pub const MAX_SIG_BLOCK: u64 = 1 << 20;
/// Largest single signature accepted.
pub const MAX_SIG_LEN: usize = 64 << 10;
/// Most signatures accepted.
pub const MAX_SIGS: u32 = 1024;

/// A decoded footer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SigFooter {
    /// Number of entries.
    pub count: u32,
    /// End of the image proper.
    pub image_len: u64,
    /// Offset of the entries.
    pub offset: u64,
    /// Length of the entries.
    pub len: u64,
}

impl SigFooter {
    /// Whether the last bytes of a file (`tail`, at least the footer) end in
    /// a signature footer.
    pub fn present(tail: &[u8]) -> bool {
        tail.len() >= SIG_FOOTER_LEN && &tail[tail.len() - SIG_FOOTER_LEN..][..8] == SIG_MAGIC
    }

    /// Decode the footer ending a file of `file_len` bytes and check that it
    /// describes a block inside the file.
    pub fn decode(b: &[u8], file_len: u64) -> Result<Self, FormatError> {
        let mut c = Cursor::new(b, "signature footer");
        if c.take(8)? != SIG_MAGIC {
            return Err(FormatError::invalid("signature footer", "bad magic"));
        }
        let count = c.u32()?;
        let _reserved = c.u32()?;
        let f = SigFooter {
            count,
            image_len: c.u64()?,
            offset: c.u64()?,
            len: c.u64()?,
        };
        let end = f.offset.checked_add(f.len);
        if f.count > MAX_SIGS
            || f.len > MAX_SIG_BLOCK
            || f.offset < f.image_len
            || end != Some(file_len.saturating_sub(SIG_FOOTER_LEN as u64))
        {
            return Err(FormatError::invalid(
                "signature footer",
                "signature block out of range",
            ));
        }
        Ok(f)
    }
}

/// Encode a signature block (entries then footer) to be written at
/// `offset` of an image whose own bytes end at `image_len`.
pub fn encode_block(sigs: &[Vec<u8>], image_len: u64, offset: u64) -> Vec<u8> {
    let mut out = Vec::new();
    for s in sigs {
        out.extend_from_slice(&(s.len() as u32).to_le_bytes());
        out.extend_from_slice(s);
    }
    let len = out.len() as u64;
    out.extend_from_slice(SIG_MAGIC);
    out.extend_from_slice(&(sigs.len() as u32).to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&image_len.to_le_bytes());
    out.extend_from_slice(&offset.to_le_bytes());
    out.extend_from_slice(&len.to_le_bytes());
    out
}

/// Decode the entries region described by `f`.
pub fn decode_entries(b: &[u8], f: &SigFooter) -> Result<Vec<Vec<u8>>, FormatError> {
    let mut c = Cursor::new(b, "signature block");
    let mut v = Vec::with_capacity(f.count as usize);
    for _ in 0..f.count {
        let n = c.u32()? as usize;
        if n > MAX_SIG_LEN {
            return Err(FormatError::invalid(
                "signature block",
                "signature too long",
            ));
        }
        v.push(c.take(n)?.to_vec());
    }
    if c.remaining() != 0 {
        return Err(FormatError::invalid("signature block", "trailing bytes"));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_round_trips_and_bounds_are_checked() {
        let sigs = vec![b"one".to_vec(), b"second signature".to_vec()];
        let image_len = 1000;
        let b = encode_block(&sigs, image_len, 1000);
        let file_len = 1000 + b.len() as u64;
        assert!(SigFooter::present(&b));
        let f = SigFooter::decode(&b[b.len() - SIG_FOOTER_LEN..], file_len).unwrap();
        assert_eq!((f.count, f.image_len, f.offset), (2, 1000, 1000));
        let e = decode_entries(&b[..f.len as usize], &f).unwrap();
        assert_eq!(e, sigs);
        // A footer pointing outside the file, or a wrong length, is refused.
        assert!(SigFooter::decode(&b[b.len() - SIG_FOOTER_LEN..], file_len + 1).is_err());
        let mut bad = b.clone();
        let n = bad.len();
        bad[n - 8] ^= 1;
        assert!(SigFooter::decode(&bad[n - SIG_FOOTER_LEN..], file_len).is_err());
        assert!(decode_entries(&b[..f.len as usize - 1], &f).is_err());
    }
}
