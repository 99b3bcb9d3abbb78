//! Fixed framing of an image file: header, trailer, section table, block refs.
//!
//! ```text
//! [header 64 B][data blocks ...][metadata pages ...][sections ...][section table][trailer 64 B]
//! ```
//! A reader needs the header, the trailer, the section table and the
//! superblock section; the writer places the last three at the end so one
//! read of the file's tail usually fetches them together.

use crate::{Codec, Cursor, Digest, FormatError};

/// Magic at offset 0.
pub const HEADER_MAGIC: [u8; 8] = *b"\x89SHEAF\r\n";
/// Magic at the start of the trailer.
pub const TRAILER_MAGIC: [u8; 8] = *b"SHEAFTBL";
/// Magic closing the file.
pub const END_MAGIC: [u8; 8] = *b"SHEAFEND";
/// Length of the header.
pub const HEADER_LEN: usize = 64;
/// Length of the trailer.
pub const TRAILER_LEN: usize = 64;
/// Length of one section table entry.
pub const SECTION_ENTRY_LEN: usize = 64;
/// Length of one block/page ref.
pub const BLOCK_REF_LEN: usize = 48;
/// Major format version written by this crate.
pub const VERSION_MAJOR: u16 = 1;
/// Minor format version written by this crate.
pub const VERSION_MINOR: u16 = 0;
/// Section flag: a reader that does not know this section kind must refuse the image.
pub const SECTION_FLAG_REQUIRED: u32 = 1;
/// Upper bound on sections, so a hostile trailer cannot ask for a huge table.
pub const MAX_SECTIONS: u32 = 4096;

/// The first 64 bytes of an image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Major version; readers refuse a major they do not know.
    pub major: u16,
    /// Minor version; additions that older readers may ignore.
    pub minor: u16,
}

impl Header {
    /// The header this crate writes.
    pub fn current() -> Self {
        Header {
            major: VERSION_MAJOR,
            minor: VERSION_MINOR,
        }
    }
    /// Encode to 64 bytes.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..8].copy_from_slice(&HEADER_MAGIC);
        b[8..10].copy_from_slice(&self.major.to_le_bytes());
        b[10..12].copy_from_slice(&self.minor.to_le_bytes());
        b[12..16].copy_from_slice(&(HEADER_LEN as u32).to_le_bytes());
        b
    }
    /// Decode and check magic and version.
    pub fn decode(b: &[u8]) -> Result<Self, FormatError> {
        let mut c = Cursor::new(b, "header");
        if c.array::<8>()? != HEADER_MAGIC {
            return Err(FormatError::BadMagic("header"));
        }
        let h = Header {
            major: c.u16()?,
            minor: c.u16()?,
        };
        if h.major != VERSION_MAJOR {
            return Err(FormatError::UnsupportedVersion(h.major, h.minor));
        }
        Ok(h)
    }
}

/// The last 64 bytes of an image: where the section table is and its digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trailer {
    /// Absolute offset of the section table.
    pub table_offset: u64,
    /// Number of entries in the section table.
    pub section_count: u32,
    /// BLAKE3 of the section table bytes: the image's root digest.
    pub root_digest: Digest,
}

impl Trailer {
    /// Encode to 64 bytes.
    pub fn encode(&self) -> [u8; TRAILER_LEN] {
        let mut b = [0u8; TRAILER_LEN];
        b[0..8].copy_from_slice(&TRAILER_MAGIC);
        b[8..16].copy_from_slice(&self.table_offset.to_le_bytes());
        b[16..20].copy_from_slice(&self.section_count.to_le_bytes());
        b[24..56].copy_from_slice(&self.root_digest);
        b[56..64].copy_from_slice(&END_MAGIC);
        b
    }
    /// Decode; `file_len` bounds the table's position.
    pub fn decode(b: &[u8], file_len: u64) -> Result<Self, FormatError> {
        let mut c = Cursor::new(b, "trailer");
        if c.array::<8>()? != TRAILER_MAGIC {
            return Err(FormatError::BadMagic("trailer"));
        }
        let table_offset = c.u64()?;
        let section_count = c.u32()?;
        c.u32()?;
        let root_digest = c.array::<32>()?;
        if c.array::<8>()? != END_MAGIC {
            return Err(FormatError::BadMagic("trailer"));
        }
        if section_count == 0 || section_count > MAX_SECTIONS {
            return Err(FormatError::invalid(
                "trailer",
                format!("section count {section_count}"),
            ));
        }
        let table_end = table_offset
            .checked_add(section_count as u64 * SECTION_ENTRY_LEN as u64)
            .filter(|&e| table_offset >= HEADER_LEN as u64 && e + TRAILER_LEN as u64 == file_len);
        if table_end.is_none() {
            return Err(FormatError::invalid(
                "trailer",
                "section table does not end where the trailer starts",
            ));
        }
        Ok(Trailer {
            table_offset,
            section_count,
            root_digest,
        })
    }
    /// Length in bytes of the section table this trailer points to.
    pub fn table_len(&self) -> usize {
        self.section_count as usize * SECTION_ENTRY_LEN
    }
}

/// Kinds of section. Unknown kinds are skipped unless flagged required.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SectionKind {
    /// The superblock: counts, geometry, metadata stream roots. Required.
    Superblock,
    /// JSON describing how the image was built. Optional.
    BuildInfo,
    /// Data block ids to fetch ahead of a workload, in order. Optional.
    Prefetch,
    /// Compression dictionaries blocks may name (`crate::dict`). Written
    /// required: an image that has them has blocks that need them.
    Dictionaries,
    /// Which blocks reference blocks may be compressed against, by content
    /// digest (`crate::reference`). Written required.
    RefBases,
    /// A kind this reader does not know.
    Other(u32),
}

impl SectionKind {
    /// Numeric id.
    pub fn id(self) -> u32 {
        match self {
            SectionKind::Superblock => 1,
            SectionKind::BuildInfo => 2,
            SectionKind::Prefetch => 3,
            SectionKind::Dictionaries => 4,
            SectionKind::RefBases => 5,
            SectionKind::Other(n) => n,
        }
    }
    /// From a numeric id.
    pub fn from_id(id: u32) -> Self {
        match id {
            1 => SectionKind::Superblock,
            2 => SectionKind::BuildInfo,
            3 => SectionKind::Prefetch,
            4 => SectionKind::Dictionaries,
            5 => SectionKind::RefBases,
            n => SectionKind::Other(n),
        }
    }
}

/// One entry of the section table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SectionEntry {
    /// What the section holds.
    pub kind: SectionKind,
    /// Bit 0: required.
    pub flags: u32,
    /// Absolute offset of the section bytes.
    pub offset: u64,
    /// Length of the section bytes.
    pub length: u64,
    /// BLAKE3 of the section bytes.
    pub hash: Digest,
}

impl SectionEntry {
    /// Encode to 64 bytes.
    pub fn encode(&self) -> [u8; SECTION_ENTRY_LEN] {
        let mut b = [0u8; SECTION_ENTRY_LEN];
        b[0..4].copy_from_slice(&self.kind.id().to_le_bytes());
        b[4..8].copy_from_slice(&self.flags.to_le_bytes());
        b[8..16].copy_from_slice(&self.offset.to_le_bytes());
        b[16..24].copy_from_slice(&self.length.to_le_bytes());
        b[32..64].copy_from_slice(&self.hash);
        b
    }
    /// Decode a whole section table, checking each entry lies inside `[HEADER_LEN, table_offset)`.
    pub fn decode_table(b: &[u8], table_offset: u64) -> Result<Vec<SectionEntry>, FormatError> {
        if !b.len().is_multiple_of(SECTION_ENTRY_LEN) {
            return Err(FormatError::Truncated("section table"));
        }
        let mut out = Vec::with_capacity(b.len() / SECTION_ENTRY_LEN);
        for chunk in b.chunks_exact(SECTION_ENTRY_LEN) {
            let mut c = Cursor::new(chunk, "section entry");
            let kind = SectionKind::from_id(c.u32()?);
            let flags = c.u32()?;
            let offset = c.u64()?;
            let length = c.u64()?;
            c.u64()?;
            let hash = c.array::<32>()?;
            let in_range = offset >= HEADER_LEN as u64
                && offset
                    .checked_add(length)
                    .is_some_and(|e| e <= table_offset);
            if !in_range {
                return Err(FormatError::invalid(
                    "section table",
                    format!("section {} lies outside the file", kind.id()),
                ));
            }
            out.push(SectionEntry {
                kind,
                flags,
                offset,
                length,
                hash,
            });
        }
        Ok(out)
    }
    /// Whether a reader must understand this section.
    pub fn required(&self) -> bool {
        self.flags & SECTION_FLAG_REQUIRED != 0
    }
}

/// Where one compressed block or metadata page lives, and its digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockRef {
    /// BLAKE3 of the bytes the codec names (format.md §7): the stored
    /// bytes for [`Codec::names_stored`] codecs, else the uncompressed ones.
    pub hash: Digest,
    /// Absolute offset of the stored bytes.
    pub offset: u64,
    /// Codec of the stored bytes.
    pub codec: Codec,
    /// Stored (compressed) length.
    pub clen: u32,
    /// Uncompressed length.
    pub ulen: u32,
}

impl BlockRef {
    /// Largest offset representable (56 bits).
    pub const MAX_OFFSET: u64 = (1 << 56) - 1;

    /// What caches name this ref's decoded bytes by ([`crate::cache_key`]).
    pub fn key(&self) -> Digest {
        crate::cache_key(self.codec, &self.hash)
    }

    /// Encode to 48 bytes.
    pub fn encode(&self) -> [u8; BLOCK_REF_LEN] {
        let mut b = [0u8; BLOCK_REF_LEN];
        b[0..32].copy_from_slice(&self.hash);
        let oc = self.offset | ((self.codec as u64) << 56);
        b[32..40].copy_from_slice(&oc.to_le_bytes());
        b[40..44].copy_from_slice(&self.clen.to_le_bytes());
        b[44..48].copy_from_slice(&self.ulen.to_le_bytes());
        b
    }
    /// Decode 48 bytes.
    pub fn decode(b: &[u8]) -> Result<Self, FormatError> {
        let mut c = Cursor::new(b, "block ref");
        let hash = c.array::<32>()?;
        let oc = c.u64()?;
        Ok(BlockRef {
            hash,
            offset: oc & Self::MAX_OFFSET,
            codec: Codec::from_id((oc >> 56) as u8)?,
            clen: c.u32()?,
            ulen: c.u32()?,
        })
    }
    /// Decompress `stored` (in `codec`) into `out` and check it is what this
    /// ref names: exactly `ulen` bytes, with digest `hash` over them or, when
    /// the ref's codec [names its stored bytes](crate::Codec::names_stored),
    /// over `stored` (checked first). The one check every page and block
    /// passes before use, wherever its bytes came from. `dicts` holds the
    /// dictionaries a [`crate::Codec::ZstdDict`] block may name.
    pub fn check_stored(
        &self,
        codec: crate::Codec,
        stored: &[u8],
        out: &mut Vec<u8>,
        dicts: &dyn crate::DictLookup,
    ) -> Result<(), FormatError> {
        self.check_stored_upto(codec, stored, self.ulen as usize, out, dicts)
    }

    /// [`BlockRef::check_stored`] for the first `end` bytes at least: when
    /// the ref names its stored bytes, those are checked and only as much of
    /// the frame is decompressed as `end` needs; otherwise the whole is
    /// decompressed and checked (and kept).
    pub fn check_stored_upto(
        &self,
        codec: crate::Codec,
        stored: &[u8],
        end: usize,
        out: &mut Vec<u8>,
        dicts: &dyn crate::DictLookup,
    ) -> Result<(), FormatError> {
        let ulen = self.ulen as usize;
        let end = end.min(ulen);
        if self.check_stored_bytes(codec, stored)? {
            // Decodes whole when `end` is the whole.
            return codec.decompress_prefix(stored, ulen, end, out, dicts);
        }
        // Checking needed the whole: keep it.
        codec.decompress_with(stored, ulen, out, dicts)?;
        if out.len() != ulen || crate::digest(out) != self.hash {
            return Err(FormatError::HashMismatch(String::new()));
        }
        Ok(())
    }

    /// Check that `stored` is what this ref names, decompressing (into
    /// `scratch`) only when the digest names the uncompressed bytes: for
    /// copying or keeping stored bytes as they are.
    pub fn verify_stored(
        &self,
        codec: crate::Codec,
        stored: &[u8],
        scratch: &mut Vec<u8>,
        dicts: &dyn crate::DictLookup,
    ) -> Result<(), FormatError> {
        match self.check_stored_bytes(codec, stored)? {
            true => Ok(()),
            false => self.check_stored(codec, stored, scratch, dicts),
        }
    }

    /// Check `stored` against the digest when the ref names its stored
    /// bytes: `Ok(true)` if it does and they match (the bytes may then be
    /// copied as they are without decompressing them), `Ok(false)` if the
    /// ref names uncompressed bytes (only decompressing can check it). Which
    /// bytes the digest names is the *ref's* codec's rule, never the one
    /// `stored` arrived with: else bytes claiming a stored-digest codec could
    /// pass as the uncompressed bytes a digest names.
    pub fn check_stored_bytes(
        &self,
        codec: crate::Codec,
        stored: &[u8],
    ) -> Result<bool, FormatError> {
        if !self.codec.names_stored() {
            return Ok(false);
        }
        if codec != self.codec || crate::digest(stored) != self.hash {
            return Err(FormatError::HashMismatch(String::new()));
        }
        Ok(true)
    }
    /// Check the stored range lies within `[HEADER_LEN, limit)` and the lengths are sane.
    pub fn validate(&self, limit: u64, max_ulen: u32) -> Result<(), FormatError> {
        let end = self.offset.checked_add(self.clen as u64);
        if self.offset < HEADER_LEN as u64 || end.is_none_or(|e| e > limit) {
            return Err(FormatError::invalid(
                "block ref",
                format!("range {}+{} outside the image", self.offset, self.clen),
            ));
        }
        if self.ulen > max_ulen || (self.codec == crate::Codec::None && self.clen != self.ulen) {
            return Err(FormatError::invalid(
                "block ref",
                format!("length {} (stored {})", self.ulen, self.clen),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_digest_refs_check_the_stored_bytes_first() {
        use crate::{dict::NoDicts, Codec};
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 7919 % 251) as u8).collect();
        let z = Codec::ZstdStored.compress(3, &data);
        let r = BlockRef {
            hash: crate::digest(&z),
            offset: 4096,
            codec: Codec::ZstdStored,
            clen: z.len() as u32,
            ulen: data.len() as u32,
        };
        let mut out = Vec::new();
        r.check_stored(Codec::ZstdStored, &z, &mut out, &NoDicts)
            .unwrap();
        assert_eq!(out, data);
        r.check_stored_upto(Codec::ZstdStored, &z, 5000, &mut out, &NoDicts)
            .unwrap();
        assert!(out.len() >= 5000 && out[..] == data[..out.len()]);
        assert!(r
            .verify_stored(Codec::ZstdStored, &z, &mut out, &NoDicts)
            .is_ok());
        // One flipped byte fails before any decoding, whatever the length.
        let mut bad = z.clone();
        let n = bad.len();
        bad[n - 1] ^= 1;
        for end in [10, data.len()] {
            let e = r.check_stored_upto(Codec::ZstdStored, &bad, end, &mut out, &NoDicts);
            assert!(matches!(e, Err(FormatError::HashMismatch(_))), "{e:?}");
        }
        // The same bytes arriving under another codec are not trusted.
        let e = r.check_stored(Codec::Zstd, &z, &mut out, &NoDicts);
        assert!(matches!(e, Err(FormatError::HashMismatch(_))), "{e:?}");
        // A ref naming uncompressed bytes is never satisfied by those bytes
        // sent as "stored" under a stored-digest codec: it decodes and hashes.
        let legacy = BlockRef {
            hash: crate::digest(&data),
            codec: Codec::Zstd,
            ..r
        };
        assert!(!legacy.check_stored_bytes(Codec::ZstdStored, &data).unwrap());
        assert!(legacy
            .check_stored(Codec::ZstdStored, &data, &mut out, &NoDicts)
            .is_err());
        legacy
            .check_stored(Codec::Zstd, &z, &mut out, &NoDicts)
            .unwrap();
        assert_eq!(out, data);
    }

    #[test]
    fn header_trailer_round_trip() {
        let h = Header::current();
        assert_eq!(Header::decode(&h.encode()).unwrap(), h);
        let t = Trailer {
            table_offset: 1000,
            section_count: 2,
            root_digest: [7; 32],
        };
        let len = 1000 + 128 + 64;
        assert_eq!(Trailer::decode(&t.encode(), len).unwrap(), t);
        assert!(Trailer::decode(&t.encode(), len + 1).is_err());
        let mut bad = h.encode();
        bad[1] ^= 1;
        assert_eq!(Header::decode(&bad), Err(FormatError::BadMagic("header")));
    }

    #[test]
    fn block_ref_round_trip_and_bounds() {
        let r = BlockRef {
            hash: [1; 32],
            offset: 64,
            codec: Codec::Xz,
            clen: 10,
            ulen: 20,
        };
        assert_eq!(BlockRef::decode(&r.encode()).unwrap(), r);
        assert!(r.validate(74, 20).is_ok());
        assert!(r.validate(73, 20).is_err());
        assert!(r.validate(74, 19).is_err());
    }

    #[test]
    fn section_table_rejects_out_of_range() {
        let e = SectionEntry {
            kind: SectionKind::Superblock,
            flags: SECTION_FLAG_REQUIRED,
            offset: 64,
            length: 10,
            hash: [0; 32],
        };
        let b = e.encode();
        assert_eq!(SectionEntry::decode_table(&b, 74).unwrap(), vec![e]);
        assert!(SectionEntry::decode_table(&b, 73).is_err());
    }
}
