//! Fetching and verifying what refs name: pages and blocks from the node
//! store or the source (with failover), objects for publishing and copying,
//! and coalesced parallel prefetch.

use super::{io_error, read_at, Image};
use crate::cache::Cache;
use crate::error::ReadError;
use crate::source::ObjectStore;
use sheaf_format::dict;
use sheaf_format::remote;
use sheaf_format::{BlockRef, FormatError, StreamId};

/// Most times one page or block is read again through another route after
/// failing verification.
const MAX_REROUTES: u32 = 8;
/// Most bytes one coalesced prefetch read asks for.
const MAX_PREFETCH_READ: u64 = 8 << 20;
/// Largest gap of unwanted bytes a coalesced read may span.
const MAX_PREFETCH_GAP: u64 = 64 << 10;

impl Image {
    /// Read, decompress and verify the bytes a ref points to (no caching).
    pub fn load_ref(
        &self,
        r: &BlockRef,
        max_ulen: u32,
        what: &dyn Fn() -> String,
    ) -> Result<Vec<u8>, ReadError> {
        self.load_ref_into(r, max_ulen, what, Vec::new(), usize::MAX)
    }

    /// [`Image::load_ref`] decoding into `data`'s allocation, the first
    /// `end` bytes at least (all if the ref does not name its stored bytes).
    ///
    /// Order: the object store (a bad object there is dropped), then the
    /// source; bytes from the source that fail verification make it switch
    /// route (mirror, proxy) and read again while it has routes left.
    pub(super) fn load_ref_into(
        &self,
        r: &BlockRef,
        max_ulen: u32,
        what: &dyn Fn() -> String,
        mut data: Vec<u8>,
        end: usize,
    ) -> Result<Vec<u8>, ReadError> {
        let err = |e: FormatError| ReadError::format(self.name(), &what(), e);
        r.validate(self.table_offset, max_ulen).map_err(err)?;
        if let Some(store) = &self.store {
            // Keyed by what the ref decodes to: an object that fails here
            // is damaged, never another image's (sheaf_format::cache_key).
            let key = r.key();
            if let Some(obj) = store.get(&key) {
                match remote::decode_object(&obj)
                    .and_then(|(codec, b)| self.decode_checked(r, codec, b, &mut data, end))
                {
                    Ok(()) => return Ok(data),
                    Err(_) => store.remove(&key),
                }
            }
        }
        let mut routes_left = MAX_REROUTES;
        loop {
            let (codec, stored) = self
                .src
                .read_object(r)
                .map_err(|e| io_error(&*self.src, e, r.offset, r.clen as usize))?;
            match self.decode_checked(r, codec, &stored, &mut data, end) {
                Ok(()) => {
                    if let Some(store) = &self.store {
                        self.put_object(&**store, r, codec, &stored);
                    }
                    return Ok(data);
                }
                Err(_) if routes_left > 0 && self.src.reject(r.offset) => routes_left -= 1,
                Err(FormatError::HashMismatch(_)) => {
                    return Err(err(FormatError::HashMismatch(format!(
                        "at offset {}",
                        r.offset
                    ))))
                }
                Err(e) => return Err(err(e)),
            }
        }
    }

    /// Decompress `stored` into `data` (the first `end` bytes at least) and
    /// check it is what `r` names.
    fn decode_checked(
        &self,
        r: &BlockRef,
        codec: sheaf_format::Codec,
        stored: &[u8],
        data: &mut Vec<u8>,
        end: usize,
    ) -> Result<(), FormatError> {
        r.check_stored_upto(codec, stored, end, data, self)
    }

    /// Before an object that names a dictionary goes to the shared store,
    /// the dictionary goes there too (as the object of its digest), so a
    /// reader of another image that finds the object can decode it.
    fn put_object(
        &self,
        store: &dyn ObjectStore,
        r: &BlockRef,
        codec: sheaf_format::Codec,
        stored: &[u8],
    ) {
        if codec == sheaf_format::Codec::ZstdDict {
            let Some(x) = dict::named_dictionary(stored)
                .ok()
                .and_then(|d| self.dictionary(&d))
            else {
                return;
            };
            let key = sheaf_format::content_key(x.digest());
            if !store.contains(&key) {
                store.put(
                    &key,
                    &remote::encode_object(sheaf_format::Codec::None, x.bytes()),
                );
            }
        }
        store.put(&r.key(), &remote::encode_object(codec, stored));
    }

    /// Fetch the objects of `refs` that neither `cache` nor the store holds,
    /// with few, large, parallel reads: adjacent ranges are coalesced (up to
    /// 8 MiB, skipping gaps up to 64 KiB) and up to `parallel` reads run at
    /// once. Verified objects go to the store, or decoded into `cache` when
    /// there is no store. Returns the bytes fetched.
    fn prefetch_refs(
        &self,
        mut refs: Vec<BlockRef>,
        cache: &Cache,
        parallel: usize,
    ) -> Result<u64, ReadError> {
        refs.retain(|r| {
            !cache.contains(&r.key()) && !self.store.as_ref().is_some_and(|s| s.contains(&r.key()))
        });
        refs.sort_by_key(|r| r.offset);
        refs.dedup_by_key(|r| r.key());
        // Groups of refs fetched with one read each.
        let mut groups: Vec<Vec<BlockRef>> = Vec::new();
        for r in refs {
            match groups.last_mut() {
                Some(g) if self.src.ranged() => {
                    let first = g[0].offset;
                    let last = g.last().expect("non-empty");
                    let end = last.offset + last.clen as u64;
                    if r.offset >= end
                        && r.offset - end <= MAX_PREFETCH_GAP
                        && r.offset + r.clen as u64 - first <= MAX_PREFETCH_READ
                    {
                        g.push(r);
                    } else {
                        groups.push(vec![r]);
                    }
                }
                _ => groups.push(vec![r]),
            }
        }
        let next = std::sync::atomic::AtomicUsize::new(0);
        let fetched = std::sync::atomic::AtomicU64::new(0);
        let first_err = std::sync::Mutex::new(None);
        let work = || loop {
            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let Some(g) = groups.get(i) else { break };
            if let Err(e) = self.prefetch_group(g, cache, &fetched) {
                first_err.lock().expect("lock").get_or_insert(e);
                break;
            }
        };
        std::thread::scope(|sc| {
            for _ in 1..parallel.max(1).min(groups.len()) {
                sc.spawn(work);
            }
            work();
        });
        match first_err.into_inner().expect("lock") {
            Some(e) => Err(e),
            None => Ok(fetched.into_inner()),
        }
    }

    /// One coalesced read (or one object) of [`Image::prefetch_refs`].
    fn prefetch_group(
        &self,
        g: &[BlockRef],
        cache: &Cache,
        fetched: &std::sync::atomic::AtomicU64,
    ) -> Result<(), ReadError> {
        let keep = |r: &BlockRef, codec, stored: &[u8]| -> Result<(), ReadError> {
            match &self.store {
                Some(store) => {
                    let mut data = Vec::new();
                    // Unverified bytes are not kept; the on-demand path
                    // will fetch (and fail over) for this one later.
                    if r.verify_stored(codec, stored, &mut data, self).is_ok() {
                        self.put_object(&**store, r, codec, stored);
                    }
                }
                None => {
                    let _ = cache.get_or_load(&r.key(), |mut buf| {
                        self.decode_checked(r, codec, stored, &mut buf, usize::MAX)
                            .map(|()| buf)
                    });
                }
            }
            Ok(())
        };
        if g.len() == 1 || !self.src.ranged() {
            for r in g {
                let (codec, stored) = self
                    .src
                    .read_object(r)
                    .map_err(|e| io_error(&*self.src, e, r.offset, r.clen as usize))?;
                fetched.fetch_add(stored.len() as u64, std::sync::atomic::Ordering::Relaxed);
                keep(r, codec, &stored)?;
            }
            return Ok(());
        }
        let start = g[0].offset;
        let last = g.last().expect("non-empty");
        let mut buf = vec![0u8; (last.offset + last.clen as u64 - start) as usize];
        read_at(&*self.src, &mut buf, start)?;
        fetched.fetch_add(buf.len() as u64, std::sync::atomic::Ordering::Relaxed);
        for r in g {
            let s = (r.offset - start) as usize;
            keep(r, r.codec, &buf[s..s + r.clen as usize])?;
        }
        Ok(())
    }

    /// Every metadata page ref (all streams, all levels) and data block ref,
    /// each with the largest uncompressed length it may have.
    pub fn object_refs(&self) -> Result<Vec<(BlockRef, u32)>, ReadError> {
        let mut v = Vec::new();
        for id in StreamId::ALL {
            for level in 0..self.stream_levels(id) {
                for i in 0..self.page_count(id, level) {
                    v.push((self.page_ref(id, level, i)?, self.sb.page_size));
                }
            }
        }
        for id in 0..self.sb.block_count as u32 {
            v.push((self.block_ref(id)?, self.sb.block_size));
        }
        Ok(v)
    }

    /// The object (`[codec][stored bytes]`) for `r`, read from the source and
    /// verified (for `sheaf publish`).
    pub fn object(&self, r: &BlockRef, max_ulen: u32) -> Result<Vec<u8>, ReadError> {
        let what = || format!("object {}", sheaf_format::hex(&r.hash));
        let (codec, stored) = self.stored(r, max_ulen, &what, &mut Vec::new())?;
        Ok(remote::encode_object(codec, &stored))
    }

    /// The codec and stored bytes of `r`, read from the source and verified
    /// (decompressed into `scratch`, which a caller copying many blocks
    /// reuses, and checked against the digest); `what` names it in errors.
    /// For copying blocks into another image as they are (`build --base`).
    pub fn stored(
        &self,
        r: &BlockRef,
        max_ulen: u32,
        what: &dyn Fn() -> String,
        scratch: &mut Vec<u8>,
    ) -> Result<(sheaf_format::Codec, Vec<u8>), ReadError> {
        let err = |e: FormatError| ReadError::format(self.name(), &what(), e);
        r.validate(self.table_offset, max_ulen).map_err(err)?;
        let (codec, stored) = self
            .src
            .read_object(r)
            .map_err(|e| io_error(&*self.src, e, r.offset, r.clen as usize))?;
        match r.verify_stored(codec, &stored, scratch, self) {
            Ok(()) => Ok((codec, stored)),
            Err(FormatError::HashMismatch(_)) => Err(err(FormatError::HashMismatch(format!(
                "at offset {}",
                r.offset
            )))),
            Err(e) => Err(err(e)),
        }
    }

    /// Fetch data blocks `ids` ahead of use (see [`Image::prefetch_refs`]).
    pub fn prefetch_blocks(&self, ids: &[u32], parallel: usize) -> Result<u64, ReadError> {
        let refs = ids
            .iter()
            .map(|&id| self.block_ref(id))
            .collect::<Result<Vec<_>, _>>()?;
        self.prefetch_refs(refs, &self.blocks, parallel)
    }

    /// Hint to a local source that data blocks `ids` will be read soon
    /// ([`Source::will_need`](crate::Source::will_need) over their stored
    /// ranges, neighbours within 64 KiB joined): a cold disk then reads
    /// them ahead in few large requests instead of one seek per block.
    pub fn advise_blocks(&self, ids: &[u32]) -> Result<(), ReadError> {
        if !self.src.local() {
            return Ok(());
        }
        let refs = ids
            .iter()
            .map(|&id| self.block_ref(id))
            .collect::<Result<Vec<_>, _>>()?;
        self.advise_refs(refs);
        Ok(())
    }

    /// [`Image::advise_blocks`] for every level-0 metadata page (the refs
    /// come from the levels above, read now): for work that will look up
    /// a good part of the tree.
    pub fn advise_metadata(&self) -> Result<(), ReadError> {
        if !self.src.local() {
            return Ok(());
        }
        let mut refs = Vec::new();
        for id in StreamId::ALL {
            for i in 0..self.page_count(id, 0) {
                refs.push(self.page_ref(id, 0, i)?);
            }
        }
        self.advise_refs(refs);
        Ok(())
    }

    fn advise_refs(&self, mut refs: Vec<BlockRef>) {
        refs.sort_by_key(|r| r.offset);
        let mut run: Option<(u64, u64)> = None;
        for r in refs {
            let end = r.offset.saturating_add(r.clen as u64);
            run = match run {
                Some((s, e)) if r.offset <= e.saturating_add(MAX_PREFETCH_GAP) => {
                    Some((s, e.max(end)))
                }
                Some((s, e)) => {
                    self.src.will_need(s, e - s);
                    Some((r.offset, end))
                }
                None => Some((r.offset, end)),
            };
        }
        if let Some((s, e)) = run {
            self.src.will_need(s, e - s);
        }
    }

    /// Fetch every metadata page, top level first (each level's refs live in
    /// the level above). Pages are written contiguously, so over HTTP this is
    /// a few large requests instead of one round trip per page on demand.
    pub fn prefetch_metadata(&self, parallel: usize) -> Result<u64, ReadError> {
        let mut total = 0;
        for id in StreamId::ALL {
            for level in (0..self.stream_levels(id)).rev() {
                let refs = (0..self.page_count(id, level))
                    .map(|i| self.page_ref(id, level, i))
                    .collect::<Result<Vec<_>, _>>()?;
                total += self.prefetch_refs(refs, &self.pages, parallel)?;
            }
        }
        Ok(total)
    }
}
