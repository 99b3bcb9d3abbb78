//! The sheaf image format: byte layout, record encoding and codecs.
//!
//! This crate owns *what the bytes mean*: the header and trailer, the
//! section table, the superblock, the fixed-size metadata records, the
//! paged-stream geometry and the block codecs, and the [`layers`] naming rules
//! (whiteouts, opaque directories) that stack images. It performs no I/O but
//! the upper-directory lock of [`layers`], and has no policy about caching,
//! threading or where bytes come from; the builder (`sheaf-build`) produces
//! these structures and the reader (`sheaf-read`) consumes them.
//! `docs/format.md` is the normative description; this crate is its
//! reference implementation.
//!
//! Every decoder here takes untrusted bytes and returns a [`FormatError`]
//! instead of panicking; the fuzz targets in `fuzz/` exercise them.

#![warn(missing_docs)]

pub mod build_info;
pub mod codec;
pub mod dict;
pub mod error;
pub mod foreign;
pub mod layers;
pub mod layout;
pub mod records;
pub mod reference;
pub mod remote;
pub mod signatures;
pub mod superblock;

pub use codec::Codec;
pub use dict::{DictLookup, Dictionary};
pub use error::{one_line, without_os_error, FormatError};
pub use foreign::ForeignKind;
pub use layout::{
    BlockRef, Header, SectionEntry, SectionKind, Trailer, BLOCK_REF_LEN, HEADER_LEN,
    SECTION_ENTRY_LEN, SECTION_FLAG_REQUIRED, TRAILER_LEN,
};
pub use records::{ChunkRecord, DirentRecord, FileType, InodeRecord, XattrSet};
pub use superblock::{StreamDesc, StreamId, Superblock};

/// A BLAKE3 digest, used for blocks, pages, sections and the image root.
pub type Digest = [u8; 32];

/// Hash bytes the way every digest in the format is computed.
pub fn digest(bytes: &[u8]) -> Digest {
    *blake3::hash(bytes).as_bytes()
}

/// The name caches (a reader's memory caches, a node's object store) give
/// the value a digest stands for, given the codec of the ref that names it.
/// A digest alone is ambiguous: for codecs that [name their stored
/// bytes](Codec::names_stored) it covers the compressed frame, for the
/// others the uncompressed content, so a file whose content *is* another
/// block's frame has that block's digest. The key binds which bytes the
/// digest covers (and, for stored-digest codecs, how they decode), so two
/// refs share a key only when they decode to the same bytes. Zstandard
/// data blocks (the common case, [`Codec::ZstdStored`]) keep their digest
/// as key, so node caches filled before stay valid.
pub fn cache_key(codec: Codec, hash: &Digest) -> Digest {
    if codec == Codec::ZstdStored {
        return *hash;
    }
    let class = if codec.names_stored() {
        codec as u8
    } else {
        0xff
    };
    let mut h = blake3::Hasher::new();
    h.update(b"sheaf cache key\0");
    h.update(&[class]);
    h.update(hash);
    *h.finalize().as_bytes()
}

/// [`cache_key`] of uncompressed bytes with digest `hash` (a content-named
/// block or page, a dictionary object).
pub fn content_key(hash: &Digest) -> Digest {
    cache_key(Codec::None, hash)
}

/// A digest from the 64 hex digits [`hex`] writes (either case); `None`
/// for anything else.
pub fn unhex(s: &str) -> Option<Digest> {
    if s.len() != 64 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut d = [0u8; 32];
    for (i, b) in d.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(d)
}

/// Render a digest as lowercase hex (used in messages and `sheaf info`).
pub fn hex(d: &[u8]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// Little-endian cursor over untrusted bytes; every read is bounds-checked.
#[derive(Debug)]
pub struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    what: &'static str,
}

impl<'a> Cursor<'a> {
    /// Start reading `buf`; `what` names the structure in errors.
    pub fn new(buf: &'a [u8], what: &'static str) -> Self {
        Cursor { buf, pos: 0, what }
    }
    /// Take the next `n` bytes.
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], FormatError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or(FormatError::Truncated(self.what))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    /// Read a fixed-size array.
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], FormatError> {
        Ok(self.take(N)?.try_into().expect("length checked"))
    }
    /// Read a little-endian u8.
    pub fn u8(&mut self) -> Result<u8, FormatError> {
        Ok(self.array::<1>()?[0])
    }
    /// Read a little-endian u16.
    pub fn u16(&mut self) -> Result<u16, FormatError> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    /// Read a little-endian u32.
    pub fn u32(&mut self) -> Result<u32, FormatError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    /// Read a little-endian u64.
    pub fn u64(&mut self) -> Result<u64, FormatError> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    /// Read a little-endian i64.
    pub fn i64(&mut self) -> Result<i64, FormatError> {
        Ok(i64::from_le_bytes(self.array()?))
    }
    /// Bytes not yet consumed.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }
}
