//! Block and page codecs.
//!
//! Each stored block or page names its codec in its [`BlockRef`](crate::BlockRef).
//! Decoding is bounded by the uncompressed length recorded in the ref, so a
//! hostile payload cannot make the reader allocate more than that.

use crate::FormatError;
use std::cell::RefCell;
use std::io::Read;

thread_local! {
    static ZSTD_CCTX: RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> = const { RefCell::new(None) };
    static ZSTD_DCTX: RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { RefCell::new(None) };
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
}

impl Codec {
    /// All codecs, in id order.
    pub const ALL: [Codec; 4] = [Codec::None, Codec::Zstd, Codec::Lz4, Codec::Xz];

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
        }
    }

    /// Parse a codec name.
    pub fn from_name(s: &str) -> Option<Codec> {
        Codec::ALL.into_iter().find(|c| c.name() == s)
    }

    /// Default level when none is given.
    pub fn default_level(self) -> i32 {
        match self {
            Codec::None | Codec::Lz4 => 0,
            Codec::Zstd => 12,
            Codec::Xz => 6,
        }
    }

    /// Range of levels accepted for this codec.
    pub fn level_range(self) -> std::ops::RangeInclusive<i32> {
        match self {
            Codec::None | Codec::Lz4 => 0..=0,
            Codec::Zstd => 1..=22,
            Codec::Xz => 0..=9,
        }
    }

    /// Compress `data` at `level`. Never fails for valid levels.
    pub fn compress(self, level: i32, data: &[u8]) -> Vec<u8> {
        match self {
            Codec::None => data.to_vec(),
            Codec::Zstd => ZSTD_CCTX.with(|slot| {
                // One context per thread and level: a fresh context costs
                // its table allocations for every block.
                let mut slot = slot.borrow_mut();
                if slot.as_ref().is_none_or(|(l, _)| *l != level) {
                    let mut c = zstd::bulk::Compressor::new(level).expect("zstd level validated");
                    // The frame need not repeat what the ref already records.
                    let _ = c.include_checksum(false);
                    let _ = c.include_contentsize(false);
                    // Matches of 4 bytes (instead of 5 at these levels) pay
                    // off on machine code: 1.1% smaller on a scientific
                    // Python stack at the same speed (docs/design.md).
                    if (10..=15).contains(&level) {
                        let _ = c.set_parameter(zstd::zstd_safe::CParameter::MinMatch(4));
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
                let mut enc = xz2::read::XzEncoder::new(data, level as u32);
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
    /// instead of fragmenting the heap with fresh ones.
    pub fn decompress_into(
        self,
        data: &[u8],
        ulen: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), FormatError> {
        let err = |d: String| FormatError::Decompress {
            codec: self.name(),
            detail: d,
        };
        if out.capacity() > 2 * ulen + 4096 {
            // A recycled buffer much larger than needed would pin its memory.
            *out = Vec::new();
        }
        out.clear();
        out.reserve_exact(ulen);
        match self {
            Codec::None => out.extend_from_slice(data),
            Codec::Zstd => ZSTD_DCTX.with(|slot| {
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
            Codec::Lz4 => {
                out.resize(ulen, 0);
                let n =
                    lz4_flex::block::decompress_into(data, out).map_err(|e| err(e.to_string()))?;
                out.truncate(n);
            }
            Codec::Xz => {
                xz2::read::XzDecoder::new(data)
                    .take(ulen as u64 + 1)
                    .read_to_end(out)
                    .map_err(|e| err(e.to_string()))?;
            }
        }
        if out.len() != ulen {
            return Err(err(format!(
                "expanded to {} bytes, expected {ulen}",
                out.len()
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_codec_round_trips_and_rejects_wrong_length() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        for c in Codec::ALL {
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
    fn ids_and_names_round_trip() {
        for c in Codec::ALL {
            assert_eq!(Codec::from_id(c as u8).unwrap(), c);
            assert_eq!(Codec::from_name(c.name()), Some(c));
        }
        assert!(Codec::from_id(4).is_err());
    }
}
