//! The metadata streams (format.md §6): pages found through their refs,
//! decoded through the page cache, and read as byte ranges and records.
//!
//! A record read is the hot path of every lookup (a binary search reads a
//! dirent and its name per probe), so it costs no allocation when the
//! record lies in one page, and the refs of level-0 pages, once read from
//! the verified level above, are kept: a probe is one page-cache hit, not
//! one per level (a third of `read_many`'s time on a 1M-entry image went
//! to reading refs and copying records out).

use super::Image;
use crate::error::ReadError;
use sheaf_format::{BlockRef, FormatError, StreamId, BLOCK_REF_LEN};
use std::sync::OnceLock;

/// The refs of each stream's level-0 pages, filled as they are first read
/// (about 0.1% of the metadata's size when all are).
pub(super) type PageRefs = [Vec<OnceLock<BlockRef>>; 5];

/// Empty slots for the level-0 page refs of streams whose refs sit in a
/// level above (those with one level have their refs in the superblock).
pub(super) fn page_refs(sb: &sheaf_format::Superblock, levels: &[Vec<u64>; 5]) -> PageRefs {
    StreamId::ALL.map(|id| {
        if sb.stream(id).levels > 1 {
            let n = sheaf_format::superblock::page_count(levels[id as usize][0], sb.page_size);
            (0..n).map(|_| OnceLock::new()).collect()
        } else {
            Vec::new()
        }
    })
}

impl Image {
    /// The ref of page `idx` of `level` of a stream.
    pub fn page_ref(&self, id: StreamId, level: usize, idx: u64) -> Result<BlockRef, ReadError> {
        let desc = self.sb.stream(id);
        let top = desc.levels as usize - 1;
        if level == top {
            return desc.roots.get(idx as usize).copied().ok_or_else(|| {
                ReadError::format(
                    self.name(),
                    id.name(),
                    FormatError::invalid("page index", idx.to_string()),
                )
            });
        }
        let slot = match level {
            0 => self.page_refs[id as usize].get(idx as usize),
            _ => None,
        };
        if let Some(r) = slot.and_then(|s| s.get()) {
            return Ok(*r);
        }
        let r = self.with_level(
            id,
            level + 1,
            idx * BLOCK_REF_LEN as u64,
            BLOCK_REF_LEN,
            &mut |b| BlockRef::decode(b).map_err(|e| ReadError::format(self.name(), id.name(), e)),
        )?;
        if let Some(s) = slot {
            let _ = s.set(r);
        }
        Ok(r)
    }

    /// Number of pages in `level` of a stream.
    pub fn page_count(&self, id: StreamId, level: usize) -> u64 {
        sheaf_format::superblock::page_count(self.levels[id as usize][level], self.sb.page_size)
    }

    /// Number of levels of a stream.
    pub fn stream_levels(&self, id: StreamId) -> usize {
        self.sb.stream(id).levels as usize
    }

    /// Expected uncompressed length of page `idx` at `level`.
    fn page_len(&self, id: StreamId, level: usize, idx: u64) -> u32 {
        let total = self.levels[id as usize][level];
        let p = self.sb.page_size as u64;
        total.saturating_sub(idx * p).min(p) as u32
    }

    /// Decoded page, through the page cache.
    pub fn page(
        &self,
        id: StreamId,
        level: usize,
        idx: u64,
    ) -> Result<std::sync::Arc<Vec<u8>>, ReadError> {
        let r = self.page_ref(id, level, idx)?;
        let want = self.page_len(id, level, idx);
        let what = || format!("{} page {idx} (level {level})", id.name());
        if r.ulen != want {
            return Err(ReadError::format(
                self.name(),
                &what(),
                FormatError::invalid("page", format!("length {} instead of {want}", r.ulen)),
            ));
        }
        self.pages.get_or_load(&r.key(), |buf| {
            self.load_ref_into(&r, want, &what, buf, usize::MAX)
        })
    }

    /// Call `f` with bytes `[off, off+len)` of `level` of a stream:
    /// borrowed from the page when they lie in one (most records), else
    /// gathered.
    fn with_level<T>(
        &self,
        id: StreamId,
        level: usize,
        off: u64,
        len: usize,
        f: &mut dyn FnMut(&[u8]) -> Result<T, ReadError>,
    ) -> Result<T, ReadError> {
        let total = self.levels[id as usize].get(level).copied().unwrap_or(0);
        if off.checked_add(len as u64).is_none_or(|e| e > total) {
            return Err(ReadError::format(
                self.name(),
                id.name(),
                FormatError::invalid("reference", format!("bytes {off}+{len} beyond the stream")),
            ));
        }
        let p = self.sb.page_size as u64;
        let s = (off % p) as usize;
        if s + len <= p as usize {
            let page = self.page(id, level, off / p)?;
            let b = page.get(s..s + len).ok_or_else(|| {
                ReadError::format(
                    self.name(),
                    id.name(),
                    FormatError::invalid("page", "shorter than its stream says"),
                )
            })?;
            return f(b);
        }
        let mut out = Vec::with_capacity(len);
        let mut pos = off;
        while out.len() < len {
            let page = self.page(id, level, pos / p)?;
            let s = (pos % p) as usize;
            let n = (len - out.len()).min(page.len().saturating_sub(s));
            if n == 0 {
                return Err(ReadError::format(
                    self.name(),
                    id.name(),
                    FormatError::invalid("page", "shorter than its stream says"),
                ));
            }
            out.extend_from_slice(&page[s..s + n]);
            pos += n as u64;
        }
        f(&out)
    }

    /// Bytes `[off, off+len)` of a metadata stream.
    pub fn read_stream(&self, id: StreamId, off: u64, len: usize) -> Result<Vec<u8>, ReadError> {
        self.with_level(id, 0, off, len, &mut |b| Ok(b.to_vec()))
    }

    /// Call `f` with bytes `[off, off+len)` of a metadata stream, borrowed
    /// where they lie in one page ([`Image::read_stream`] without a copy).
    pub(crate) fn with_stream<T>(
        &self,
        id: StreamId,
        off: u64,
        len: usize,
        f: &mut dyn FnMut(&[u8]) -> Result<T, ReadError>,
    ) -> Result<T, ReadError> {
        self.with_level(id, 0, off, len, f)
    }

    pub(crate) fn record<T>(
        &self,
        id: StreamId,
        idx: u64,
        len: usize,
        decode: fn(&[u8]) -> Result<T, FormatError>,
    ) -> Result<T, ReadError> {
        self.with_stream(id, idx * len as u64, len, &mut |b| {
            decode(b).map_err(|e| {
                ReadError::format(self.name(), &format!("{} record {idx}", id.name()), e)
            })
        })
    }

    /// Records `[first, first+count)` of a stream, read as one range.
    pub(crate) fn records<T>(
        &self,
        id: StreamId,
        first: u64,
        count: usize,
        len: usize,
        decode: fn(&[u8]) -> Result<T, FormatError>,
    ) -> Result<Vec<T>, ReadError> {
        let off = first.checked_mul(len as u64);
        let total = count.checked_mul(len);
        let (Some(off), Some(total)) = (off, total) else {
            return Err(ReadError::format(
                self.name(),
                id.name(),
                FormatError::invalid("reference", "record range overflows"),
            ));
        };
        self.with_stream(id, off, total, &mut |raw| {
            raw.chunks_exact(len)
                .zip(first..)
                .map(|(b, idx)| {
                    decode(b).map_err(|e| {
                        ReadError::format(self.name(), &format!("{} record {idx}", id.name()), e)
                    })
                })
                .collect()
        })
    }

    pub(crate) fn heap(&self, off: u64, len: usize) -> Result<Vec<u8>, ReadError> {
        self.read_stream(StreamId::Heap, off, len)
    }
}
