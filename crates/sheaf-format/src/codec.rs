//! Block and page codecs.
//!
//! Each stored block or page names its codec in its [`BlockRef`](crate::BlockRef).
//! Decoding is bounded by the uncompressed length recorded in the ref, so a
//! hostile payload cannot make the reader allocate more than that.

use crate::dict::{named_dictionary, DictLookup, Dictionary, NoDicts, DICT_PREFIX_LEN};
use crate::FormatError;
use std::cell::RefCell;
use std::io::Read;

mod window;

thread_local! {
    static ZSTD_CCTX: RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> = const { RefCell::new(None) };
    static ZSTD_DCTX: RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { RefCell::new(None) };
    /// A compression context holding one dictionary at one level: loading
    /// a dictionary builds tables, so it is done once per thread and
    /// dictionary, not per block.
    static ZSTD_DICT_CCTX: RefCell<Option<(i32, crate::Digest, zstd::zstd_safe::CCtx<'static>)>> = const { RefCell::new(None) };
    /// A streaming context for partial decodes without a dictionary.
    static ZSTD_PREFIX_DCTX: RefCell<Option<zstd::zstd_safe::DCtx<'static>>> = const { RefCell::new(None) };
}

/// Compression codec of one block or page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Codec {
    /// Stored as is.
    None = 0,
    /// Zstandard frame.
    Zstd = 1,
    /// LZ4 block format (no frame), length known from the ref.
    Lz4 = 2,
    /// XZ stream (LZMA2).
    Xz = 3,
    /// Zstandard frame compressed with a dictionary, after the 32-byte
    /// digest that names the dictionary (format.md §7). Its ref's digest
    /// names the stored bytes ([`Codec::names_stored`]).
    ZstdDict = 4,
    /// Zstandard frame, like [`Codec::Zstd`], but its ref's digest names
    /// the stored bytes ([`Codec::names_stored`]): what data blocks use.
    ZstdStored = 5,
    /// Zstandard frame compressed against another block of the image, its
    /// base, after the 32-byte digest of the base's content (format.md
    /// §7.2, [`crate::reference`]). Its ref's digest names the stored bytes.
    ZstdRef = 6,
}

impl Codec {
    /// All codecs, in id order.
    pub const ALL: [Codec; 7] = [
        Codec::None,
        Codec::Zstd,
        Codec::Lz4,
        Codec::Xz,
        Codec::ZstdDict,
        Codec::ZstdStored,
        Codec::ZstdRef,
    ];

    /// Decode a codec id.
    pub fn from_id(id: u8) -> Result<Codec, FormatError> {
        Codec::ALL
            .get(id as usize)
            .copied()
            .ok_or_else(|| FormatError::invalid("codec", format!("unknown codec id {id}")))
    }

    /// Lowercase name used on the command line and in `sheaf info`.
    pub fn name(self) -> &'static str {
        match self {
            Codec::None => "none",
            Codec::Zstd => "zstd",
            Codec::Lz4 => "lz4",
            Codec::Xz => "xz",
            Codec::ZstdDict => "zstd+dict",
            // Zstandard all the same: which bytes a ref's digest names is
            // a detail of the format, not of the compression.
            Codec::ZstdStored => "zstd",
            Codec::ZstdRef => "zstd+ref",
        }
    }

    /// Parse the name of a codec a user may choose (the builder stores
    /// `zstd` data blocks as [`Codec::ZstdStored`], or `zstd+dict` when the
    /// image has a dictionary).
    pub fn from_name(s: &str) -> Option<Codec> {
        Codec::ALL
            .into_iter()
            .filter(|c| !c.names_stored())
            .find(|c| c.name() == s)
    }

    /// Whether a ref's digest with this codec is that of the *stored*
    /// bytes rather than the uncompressed ones. Such a block is verified
    /// before it is decompressed, so a reader may decompress only the
    /// prefix it needs, and a block can be checked and copied without
    /// decompressing it (format.md §7).
    pub fn names_stored(self) -> bool {
        matches!(self, Codec::ZstdDict | Codec::ZstdStored | Codec::ZstdRef)
    }

    /// Default level when none is given.
    pub fn default_level(self) -> i32 {
        match self {
            Codec::None | Codec::Lz4 => 0,
            Codec::Zstd | Codec::ZstdDict | Codec::ZstdStored | Codec::ZstdRef => 12,
            Codec::Xz => 6,
        }
    }

    /// Range of levels accepted for this codec.
    pub fn level_range(self) -> std::ops::RangeInclusive<i32> {
        match self {
            Codec::None | Codec::Lz4 => 0..=0,
            Codec::Zstd | Codec::ZstdDict | Codec::ZstdStored | Codec::ZstdRef => 1..=22,
            Codec::Xz => 0..=9,
        }
    }

    /// Compress `data` at `level`. Never fails for valid levels.
    /// [`Codec::ZstdDict`] needs a dictionary: see [`compress_with_dict`].
    pub fn compress(self, level: i32, data: &[u8]) -> Vec<u8> {
        match self {
            Codec::None => data.to_vec(),
            Codec::ZstdDict => panic!("zstd+dict compresses with compress_with_dict"),
            Codec::ZstdRef => panic!("zstd+ref compresses with reference::compress"),
            Codec::Zstd | Codec::ZstdStored => ZSTD_CCTX.with(|slot| {
                // One context per thread and level: a fresh context costs
                // its table allocations for every block.
                let mut slot = slot.borrow_mut();
                if slot.as_ref().is_none_or(|(l, _)| *l != level) {
                    let mut c = zstd::bulk::Compressor::new(level).expect("zstd level validated");
                    // The frame need not repeat what the ref already records.
                    let _ = c.include_checksum(false);
                    let _ = c.include_contentsize(false);
                    if let Some(m) = min_match(level) {
                        let _ = c.set_parameter(zstd::zstd_safe::CParameter::MinMatch(m));
                    }
                    *slot = Some((level, c));
                }
                let (_, c) = slot.as_mut().expect("just set");
                c.compress(data)
                    .expect("zstd compression into a Vec cannot fail")
            }),
            Codec::Lz4 => lz4_flex::block::compress(data),
            Codec::Xz => {
                let mut out = Vec::with_capacity(data.len() / 3);
                let mut enc = liblzma::read::XzEncoder::new(data, level as u32);
                enc.read_to_end(&mut out)
                    .expect("xz compression from memory cannot fail");
                out
            }
        }
    }

    /// Decompress `data` which must expand to exactly `ulen` bytes.
    pub fn decompress(self, data: &[u8], ulen: usize) -> Result<Vec<u8>, FormatError> {
        let mut out = Vec::new();
        self.decompress_into(data, ulen, &mut out)?;
        Ok(out)
    }

    /// [`Codec::decompress`] into `out` (cleared first), reusing its
    /// allocation: readers recycle evicted multi-MiB block buffers this way
    /// instead of fragmenting the heap with fresh ones. Knows no
    /// dictionaries ([`Codec::decompress_with`] does).
    pub fn decompress_into(
        self,
        data: &[u8],
        ulen: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), FormatError> {
        self.decompress_with(data, ulen, out, &NoDicts)
    }

    /// [`Codec::decompress_into`], finding the dictionary a
    /// [`Codec::ZstdDict`] block names in `dicts`.
    pub fn decompress_with(
        self,
        data: &[u8],
        ulen: usize,
        out: &mut Vec<u8>,
        dicts: &dyn DictLookup,
    ) -> Result<(), FormatError> {
        let err = |d: String| self.error(d);
        ready_for(out, ulen);
        match self {
            Codec::None => out.extend_from_slice(data),
            Codec::Zstd | Codec::ZstdStored => ZSTD_DCTX.with(|slot| {
                // One context per thread: a fresh one allocates its tables.
                let mut slot = slot.borrow_mut();
                if slot.is_none() {
                    *slot = Some(zstd::bulk::Decompressor::new().map_err(|e| err(e.to_string()))?);
                }
                let d = slot.as_mut().expect("just set");
                // Writes at most the spare capacity, which is about `ulen`.
                d.decompress_to_buffer(data, out)
                    .map(drop)
                    .map_err(|e| err(e.to_string()))
            })?,
            Codec::ZstdDict => self.decode_with_dict(data, ulen, ulen, out, dicts)?,
            Codec::ZstdRef => self.decode_with_ref(data, ulen, ulen, out, dicts)?,
            Codec::Lz4 => {
                out.resize(ulen, 0);
                let n =
                    lz4_flex::block::decompress_into(data, out).map_err(|e| err(e.to_string()))?;
                out.truncate(n);
            }
            Codec::Xz => {
                liblzma::read::XzDecoder::new(data)
                    .take(ulen as u64 + 1)
                    .read_to_end(out)
                    .map_err(|e| err(e.to_string()))?;
            }
        }
        if out.len() != ulen {
            return Err(self.expanded(out.len(), ulen, ulen));
        }
        Ok(())
    }
}

impl Codec {
    /// The first `end` bytes of what `data` decodes to, into `out`, for a
    /// codec whose frame can be decoded in part (zstd); other codecs, and a
    /// prefix that is the whole, decode whole. `ulen` bounds the whole as for
    /// [`Codec::decompress_with`]. Partial output is only as trustworthy as
    /// `data`: callers check the stored bytes first ([`Codec::names_stored`]).
    pub fn decompress_prefix(
        self,
        data: &[u8],
        ulen: usize,
        end: usize,
        out: &mut Vec<u8>,
        dicts: &dyn DictLookup,
    ) -> Result<(), FormatError> {
        match self {
            Codec::Zstd | Codec::ZstdStored if end < ulen => {}
            Codec::ZstdDict if end < ulen => {
                return self.decode_with_dict(data, ulen, end, out, dicts)
            }
            Codec::ZstdRef if end < ulen => {
                return self.decode_with_ref(data, ulen, end, out, dicts)
            }
            _ => return self.decompress_with(data, ulen, out, dicts),
        }
        let zerr = |c: usize| self.error(zstd::zstd_safe::get_error_name(c).into());
        ZSTD_PREFIX_DCTX.with(|slot| {
            let mut slot = slot.borrow_mut();
            let d = match &mut *slot {
                Some(d) => {
                    d.reset(zstd::zstd_safe::ResetDirective::SessionOnly)
                        .map_err(zerr)?;
                    d
                }
                none => {
                    let mut d = zstd::zstd_safe::DCtx::create();
                    d.set_parameter(zstd::zstd_safe::DParameter::StableOutBuffer(true))
                        .map_err(zerr)?;
                    none.insert(d)
                }
            };
            self.decode_stable(d, data, ulen, end, out)
        })
    }

    /// Decode zstd `frame` with `d` (set for a stable output buffer) into
    /// `out`: the first `end` bytes at least, or the whole when `end >=
    /// ulen`, which must then be exactly `ulen` bytes and end the frame.
    /// Room for the whole: zstd decodes each of the frame's blocks straight
    /// into it (no window buffer, no copy), a block it cannot fit whole is
    /// an error, and it stops after the block that reaches `end`.
    fn decode_stable(
        self,
        d: &mut zstd::zstd_safe::DCtx<'_>,
        frame: &[u8],
        ulen: usize,
        end: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), FormatError> {
        let zerr = |c: usize| self.error(zstd::zstd_safe::get_error_name(c).into());
        ready_for(out, ulen);
        let whole = end >= ulen;
        let mut output = zstd::zstd_safe::OutBuffer::around(out);
        let ended = window::until(d, frame, &mut output, (!whole).then_some(end)).map_err(zerr)?;
        let got = output.pos();
        if got < end.min(ulen) || got > ulen || (whole && got != ulen) {
            return Err(self.expanded(got, end, ulen));
        }
        if whole && !ended {
            return Err(self.error(format!("frame goes on past {ulen} bytes")));
        }
        Ok(())
    }

    /// A [`Codec::ZstdDict`] block's first `end` bytes at least (all when
    /// `end >= ulen`), with the dictionary it names from `dicts`.
    fn decode_with_dict(
        self,
        data: &[u8],
        ulen: usize,
        end: usize,
        out: &mut Vec<u8>,
        dicts: &dyn DictLookup,
    ) -> Result<(), FormatError> {
        let name = named_dictionary(data)?;
        let dict = dicts
            .dictionary(&name)
            .ok_or_else(|| FormatError::MissingDictionary(crate::hex(&name)))?;
        window::decode(&dict, &data[DICT_PREFIX_LEN..], ulen, end, out).map_err(|f| match f {
            window::Failure::Dictionary => self.error(format!(
                "dictionary {} is not one zstd accepts",
                crate::hex(&name)
            )),
            window::Failure::Zstd(e) => self.error(e.to_string()),
            window::Failure::Unended => self.error(format!("frame goes on past {ulen} bytes")),
            window::Failure::Length(got) => self.expanded(got, end, ulen),
        })
    }

    /// A [`Codec::ZstdRef`] block's first `end` bytes at least (all when
    /// `end >= ulen`), against the base `dicts` finds for the content digest
    /// it names (checked against that digest here: what a reference block
    /// decodes to depends on its stored bytes alone).
    fn decode_with_ref(
        self,
        data: &[u8],
        ulen: usize,
        end: usize,
        out: &mut Vec<u8>,
        dicts: &dyn DictLookup,
    ) -> Result<(), FormatError> {
        let name = crate::reference::named_base(data)?;
        let base = dicts.reference(&name)?;
        // Not a checksum error: the base was checked against its own ref,
        // so the image's base list, not a route, is wrong.
        if !dicts.reference_known(&name) {
            if crate::digest(&base) != name {
                return Err(FormatError::invalid(
                    "reference block",
                    format!(
                        "the block listed as base {} has other content",
                        crate::hex(&name)
                    ),
                ));
            }
            dicts.reference_checked(&name);
        }
        let zerr = |c: usize| self.error(zstd::zstd_safe::get_error_name(c).into());
        let mut d = zstd::zstd_safe::DCtx::create();
        d.set_parameter(zstd::zstd_safe::DParameter::StableOutBuffer(true))
            .map_err(zerr)?;
        d.ref_prefix(&base[..]).map_err(zerr)?;
        let frame = &data[crate::reference::REF_PREFIX_LEN..];
        self.decode_stable(&mut d, frame, ulen, end, out)
    }

    /// A decode that gave `got` bytes where it needed `end` of at most
    /// `ulen` (exactly `ulen` when `end >= ulen`).
    fn expanded(self, got: usize, end: usize, ulen: usize) -> FormatError {
        self.error(if end >= ulen {
            format!("expanded to {got} bytes, expected {ulen}")
        } else {
            format!("expanded to {got} bytes, expected {end} to {ulen}")
        })
    }

    fn error(self, detail: String) -> FormatError {
        FormatError::Decompress {
            codec: self.name(),
            detail,
        }
    }
}

/// Empty `out` with room for `ulen` bytes, reusing its allocation unless it
/// is much larger (a recycled buffer that would pin its memory).
fn ready_for(out: &mut Vec<u8>, ulen: usize) {
    if out.capacity() > 2 * ulen + 4096 {
        *out = Vec::new();
    }
    out.clear();
    out.reserve_exact(ulen);
}

/// Longest zstd frame header: the first input a partial decode gives zstd.
const FRAME_HEADER_MAX: usize = 18;

/// Smallest match length at `level`, where it differs from zstd's own
/// choice: matches of 4 bytes (instead of 5 at these levels) pay off on
/// machine code: 1.1% smaller on a scientific Python stack at the same
/// speed (docs/design.md).
pub(crate) fn min_match(level: i32) -> Option<u32> {
    (10..=15).contains(&level).then_some(4)
}

/// The input size dictionary compression is tuned for (see
/// [`compress_with_dict`]); part of what makes a build reproducible.
pub const DICT_SIZE_HINT: u32 = 256 << 10;

/// Largest zstd block inside a dictionary-compressed pack (zstd's own limit
/// is 128 KiB). A read decodes a pack only up to the end of the zstd block
/// holding its last byte, so smaller blocks decode less of a pack per random
/// small file: 5000 random files of tree K 7% faster through a mount (median
/// of 5) for 0.1% of K's size and nothing of P's (docs/design.md). Part of
/// what makes a build reproducible.
pub const DICT_ZSTD_BLOCK: u32 = 64 << 10;

/// Compress `data` with zstd at `level` using `dict`: the stored bytes of a
/// [`Codec::ZstdDict`] block (the dictionary's digest, then the frame).
pub fn compress_with_dict(level: i32, data: &[u8], dict: &Dictionary) -> Vec<u8> {
    use zstd::zstd_safe::{CCtx, CParameter};
    ZSTD_DICT_CCTX.with(|slot| {
        let mut slot = slot.borrow_mut();
        if slot
            .as_ref()
            .is_none_or(|(l, d, _)| *l != level || d != dict.digest())
        {
            let mut c = CCtx::create();
            let set = |c: &mut CCtx, p| c.set_parameter(p).expect("valid zstd parameter");
            set(&mut c, CParameter::CompressionLevel(level));
            set(&mut c, CParameter::ChecksumFlag(false));
            set(&mut c, CParameter::ContentSizeFlag(false));
            // The digest before the frame names the dictionary already.
            set(&mut c, CParameter::DictIdFlag(false));
            if let Some(m) = min_match(level) {
                set(&mut c, CParameter::MinMatch(m));
            }
            // Reference the dictionary's tables instead of copying them
            // into the context for every block: at level 12 with packs over
            // 32 KiB zstd would copy, and rebuilding its match tree over the
            // dictionary per block made a build of K twice as slow.
            set(
                &mut c,
                CParameter::ForceAttachDict(zstd::zstd_safe::DictAttachPref::ForceAttach),
            );
            // zstd sizes a dictionary's tables for the input it expects; told
            // nothing, it expects inputs as short as the dictionary and picks
            // its slowest search. A pack of 256 KiB or more: 2.3x faster on
            // K's packs for 1.2% of their size (docs/design.md).
            set(&mut c, CParameter::SrcSizeHint(DICT_SIZE_HINT));
            set(&mut c, CParameter::MaxBlockSize(DICT_ZSTD_BLOCK));
            c.load_dictionary(dict.bytes())
                .expect("zstd accepts any dictionary bytes");
            *slot = Some((level, *dict.digest(), c));
        }
        let (_, _, c) = slot.as_mut().expect("just set");
        let mut out =
            Vec::with_capacity(DICT_PREFIX_LEN + zstd::zstd_safe::compress_bound(data.len()));
        out.extend_from_slice(dict.digest());
        // A Vec is written from its start; a cursor past the digest is not.
        let mut cur = std::io::Cursor::new(out);
        cur.set_position(DICT_PREFIX_LEN as u64);
        c.compress2(&mut cur, data)
            .expect("zstd compression into a large enough Vec cannot fail");
        cur.into_inner()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_codec_round_trips_and_rejects_wrong_length() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        for c in Codec::ALL
            .into_iter()
            .filter(|c| !matches!(c, Codec::ZstdDict | Codec::ZstdRef))
        {
            let z = c.compress(c.default_level(), &data);
            assert_eq!(c.decompress(&z, data.len()).unwrap(), data, "{c:?}");
            assert!(c.decompress(&z, data.len() - 1).is_err(), "{c:?} short");
            if c != Codec::None {
                assert!(
                    c.decompress(&z[..z.len() / 2], data.len()).is_err(),
                    "{c:?} cut"
                );
            }
        }
    }

    #[test]
    fn reference_blocks_decode_against_the_base_they_name() {
        use crate::reference;
        use std::sync::Arc;
        struct Bases(Vec<Arc<Vec<u8>>>);
        impl DictLookup for Bases {
            fn dictionary(&self, _: &crate::Digest) -> Option<Arc<Dictionary>> {
                None
            }
            fn reference(&self, d: &crate::Digest) -> Result<Arc<Vec<u8>>, FormatError> {
                // The first base whose digest matches, else the first
                // (a lying lookup, which the decoder must catch).
                Ok(self
                    .0
                    .iter()
                    .find(|b| crate::digest(b) == *d)
                    .unwrap_or(&self.0[0])
                    .clone())
            }
        }
        // Incompressible alone; one byte from its base.
        let mut base = vec![0u8; 300_000];
        for (i, b) in base.iter_mut().enumerate() {
            *b = (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3];
        }
        let mut data = base.clone();
        data[1234] ^= 1;
        let base = Arc::new(base);
        let z = reference::compress(12, &data, &base, &crate::digest(&base));
        assert!(z.len() < 1000, "{}", z.len());
        assert_eq!(reference::named_base(&z).unwrap(), crate::digest(&base));
        let c = Codec::ZstdRef;
        let good = Bases(vec![base.clone()]);
        let mut out = Vec::new();
        c.decompress_with(&z, data.len(), &mut out, &good).unwrap();
        assert_eq!(out, data);
        c.decompress_prefix(&z, data.len(), 5000, &mut out, &good)
            .unwrap();
        assert!(out.len() >= 5000 && data.starts_with(&out));
        assert!(c
            .decompress_with(&z, data.len() - 1, &mut out, &good)
            .is_err());
        // Another base of the same length: refused, never other bytes.
        let liar = Bases(vec![Arc::new(vec![7u8; base.len()])]);
        let e = c.decompress_with(&z, data.len(), &mut out, &liar);
        assert!(matches!(e, Err(FormatError::Invalid { .. })), "{e:?}");
        let e = c.decompress_prefix(&z, data.len(), 10, &mut out, &liar);
        assert!(matches!(e, Err(FormatError::Invalid { .. })), "{e:?}");
        // No base at all; too short to name one.
        let e = c.decompress_with(&z, data.len(), &mut out, &NoDicts);
        assert!(matches!(e, Err(FormatError::MissingReference(_))), "{e:?}");
        assert!(c
            .decompress_with(&z[..20], data.len(), &mut out, &good)
            .is_err());
    }

    #[test]
    fn dictionary_blocks_decode_as_plain_zstd_does() {
        use std::sync::Arc;
        // Packs that lean on their dictionary, of several sizes (several
        // zstd blocks each: the window grows), two dictionaries in turn.
        let text = |i: u32| {
            format!("/* probe {i} */\nstatic int probe_{i}(struct device *dev)\n{{\n\treturn dev_err_probe(dev, -{i}, \"probe {i}\");\n}}\n")
        };
        let samples: Vec<Vec<u8>> = (0..300u32)
            .map(|i| text(i).repeat(4).into_bytes())
            .collect();
        let refs: Vec<&[u8]> = samples.iter().map(|s| s.as_slice()).collect();
        let a = Arc::new(crate::dict::train(&refs, 8192).expect("enough samples"));
        let b = Arc::new(Dictionary::new(text(7).repeat(50).into_bytes()).unwrap());
        let dicts = vec![a.clone(), b.clone()];
        let mut out = Vec::new();
        for (n, dict) in [
            (1_000u32, &a),
            (300_000, &b),
            (40_000, &a),
            (700_000, &a),
            (5_000, &b),
        ] {
            let data: Vec<u8> = (0..n)
                .flat_map(|i| text(i * 7919 % 1000).into_bytes())
                .take(n as usize)
                .collect();
            let z = compress_with_dict(12, &data, dict);
            // The reference: zstd's own decoder with the dictionary's bytes.
            let want = zstd::bulk::Decompressor::with_dictionary(dict.bytes())
                .unwrap()
                .decompress(&z[DICT_PREFIX_LEN..], data.len())
                .unwrap();
            assert_eq!(want, data);
            Codec::ZstdDict
                .decompress_with(&z, data.len(), &mut out, &dicts)
                .unwrap();
            assert_eq!(out, data, "whole, {n} bytes");
            for end in [1, data.len() / 3, data.len() - 1, data.len()] {
                Codec::ZstdDict
                    .decompress_prefix(&z, data.len(), end, &mut out, &dicts)
                    .unwrap();
                assert!(
                    out.len() >= end && out[..] == data[..out.len()],
                    "prefix {end} of {n}"
                );
                // The buffer is sized to the prefix (a cache counts what it
                // pins): at most one 64 KiB zstd block past `end`.
                assert!(
                    out.capacity() <= 2 * (end + DICT_ZSTD_BLOCK as usize) + 4096,
                    "prefix {end} of {n} kept {} bytes",
                    out.capacity()
                );
            }
        }
    }

    #[test]
    fn a_dictionary_zstd_refuses_is_an_error_not_a_panic() {
        use std::sync::Arc;
        let samples: Vec<Vec<u8>> = (0..200u32)
            .map(|i| {
                format!("line {i} of a sample that repeats itself\n")
                    .repeat(5)
                    .into_bytes()
            })
            .collect();
        let refs: Vec<&[u8]> = samples.iter().map(|s| s.as_slice()).collect();
        let good = crate::dict::train(&refs, 4096).expect("enough samples");
        let data = samples[3].clone();
        let z = compress_with_dict(12, &data, &good);
        // zstd's dictionary magic, then entropy tables that are not.
        let mut bad = good.bytes()[..8].to_vec();
        bad.extend(std::iter::repeat_n(0xff, 4000));
        let bad = Arc::new(Dictionary::new(bad).unwrap());
        // The block names the good dictionary; a lookup that answers with
        // the bad one under that name stands in for a hostile image.
        struct Liar(Arc<Dictionary>);
        impl DictLookup for Liar {
            fn dictionary(&self, _: &crate::Digest) -> Option<Arc<Dictionary>> {
                Some(self.0.clone())
            }
        }
        let mut out = Vec::new();
        for end in [data.len(), 10] {
            let e = Codec::ZstdDict.decompress_prefix(
                &z,
                data.len(),
                end,
                &mut out,
                &Liar(bad.clone()),
            );
            assert!(e.is_err(), "{e:?}");
        }
        // And the thread's decoder still works with a good one afterwards.
        Codec::ZstdDict
            .decompress_with(&z, data.len(), &mut out, &Liar(Arc::new(good)))
            .unwrap();
        assert_eq!(out, data);
    }

    #[test]
    fn dictionary_blocks_name_their_dictionary_and_need_it() {
        use std::sync::Arc;
        // Samples that share much: a dictionary has something to learn.
        let samples: Vec<Vec<u8>> = (0..200u32)
            .map(|i| format!("#include <linux/module.h>\nstatic int probe_{i}(struct device *dev) {{ return {i}; }}\n").repeat(3).into_bytes())
            .collect();
        let refs: Vec<&[u8]> = samples.iter().map(|s| s.as_slice()).collect();
        let dict = Arc::new(crate::dict::train(&refs, 4096).expect("enough samples"));
        let other = Arc::new(Dictionary::new(vec![1; 4096]).unwrap());
        let data = samples[7].clone();
        let z = compress_with_dict(12, &data, &dict);
        assert_eq!(&z[..32], dict.digest());
        assert!(z.len() < Codec::Zstd.compress(12, &data).len() + 32);
        let mut out = Vec::new();
        Codec::ZstdDict
            .decompress_with(&z, data.len(), &mut out, &vec![other.clone(), dict.clone()])
            .unwrap();
        assert_eq!(out, data);
        // Without the dictionary, or with only another one: an error, not bytes.
        let e = Codec::ZstdDict.decompress_with(&z, data.len(), &mut out, &vec![other]);
        assert!(matches!(e, Err(FormatError::MissingDictionary(_))), "{e:?}");
        assert!(Codec::ZstdDict.decompress(&z, data.len()).is_err());
        assert!(Codec::ZstdDict.decompress(&z[..20], data.len()).is_err());
        let mut cut = z.clone();
        cut.truncate(z.len() - 3);
        assert!(Codec::ZstdDict
            .decompress_with(&cut, data.len(), &mut out, &vec![dict.clone()])
            .is_err());
        assert!(Codec::ZstdDict
            .decompress_with(&z, data.len() - 1, &mut out, &vec![dict])
            .is_err());
    }

    #[test]
    fn ids_and_names_round_trip() {
        for c in Codec::ALL {
            assert_eq!(Codec::from_id(c as u8).unwrap(), c);
        }
        for c in Codec::ALL.into_iter().filter(|c| !c.names_stored()) {
            assert_eq!(Codec::from_name(c.name()), Some(c));
        }
        assert_eq!(Codec::from_name("zstd+dict"), None);
        assert_eq!(Codec::ZstdStored.name(), "zstd");
        assert_eq!(Codec::from_name("zstd+ref"), None);
        assert!(Codec::from_id(7).is_err());
    }

    #[test]
    fn a_prefix_decodes_to_the_first_bytes_of_the_whole() {
        use std::sync::Arc;
        // Several zstd blocks (over 128 KiB), so a prefix can stop early.
        let data: Vec<u8> = (0..300_000u32)
            .flat_map(|i| format!("line {i} of {}\n", i % 977).into_bytes())
            .take(300_000)
            .collect();
        let samples: Vec<&[u8]> = data.chunks(3000).collect();
        let dict = Arc::new(crate::dict::train(&samples, 8192).expect("enough samples"));
        let z = Codec::ZstdStored.compress(12, &data);
        let zd = compress_with_dict(12, &data, &dict);
        let dicts = vec![dict];
        let mut out = Vec::new();
        for end in [0, 1, 1000, 131_072, 131_073, 250_000, 299_999, 300_000] {
            for (c, bytes) in [
                (Codec::ZstdStored, &z),
                (Codec::ZstdDict, &zd),
                (Codec::Zstd, &z),
            ] {
                c.decompress_prefix(bytes, data.len(), end, &mut out, &dicts)
                    .unwrap_or_else(|e| panic!("{c:?} to {end}: {e}"));
                assert!(
                    out.len() >= end && out.len() <= data.len(),
                    "{c:?} {end}: {}",
                    out.len()
                );
                assert_eq!(out[..], data[..out.len()], "{c:?} to {end}");
            }
        }
        // A cut frame fails if the cut is before `end`, never returns less.
        let cut = &z[..z.len() / 3];
        assert!(Codec::ZstdStored
            .decompress_prefix(cut, data.len(), 299_000, &mut out, &dicts)
            .is_err());
        // One that decodes to more than the ref says is refused.
        assert!(Codec::ZstdStored
            .decompress_prefix(&z, 1000, 999, &mut out, &dicts)
            .is_err());
        // A dictionary block without its dictionary: an error, not bytes.
        let e = Codec::ZstdDict.decompress_prefix(&zd, data.len(), 10, &mut out, &NoDicts);
        assert!(matches!(e, Err(FormatError::MissingDictionary(_))), "{e:?}");
    }

    #[test]
    fn a_prefix_crosses_raw_and_rle_blocks() {
        // zstd stores a block of noise raw and a block of one byte as RLE;
        // a prefix may end inside, at or just past either.
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut data: Vec<u8> = (0..131_072)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        data.extend(std::iter::repeat_n(b'a', 131_072));
        data.extend((0..40_000u32).flat_map(|i| format!("{i},").into_bytes()));
        let z = Codec::ZstdStored.compress(12, &data);
        let mut out = Vec::new();
        for end in [
            1,
            131_071,
            131_072,
            131_073,
            200_000,
            262_144,
            262_145,
            data.len() - 1,
        ] {
            Codec::ZstdStored
                .decompress_prefix(&z, data.len(), end, &mut out, &NoDicts)
                .unwrap_or_else(|e| panic!("to {end}: {e}"));
            assert!(out.len() >= end, "{end}: {}", out.len());
            assert_eq!(out[..], data[..out.len()], "to {end}");
        }
    }
}
