//! From a finished block to the workers: dedup by digest, copy from a
//! `--base` image, choose how to compress it (against a base, with the
//! dictionary, alone), hold back a block stored alone while it may become a
//! base (then compressed harder), give block ids and hand the work over.

use super::work::{Job, Work};
use super::Packer;
use crate::options::{BuildError, BASE_LEVEL_STEP, VERSIONS_PACK_LEVEL_STEP};
use crate::similar;
use sheaf_format::Digest;
use std::io::Write;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// What a finished block is, which says how it is compressed.
pub(super) enum Made {
    /// A block of its own: against a resembling earlier block, if there is
    /// one, else alone (harder once a later block is compressed against
    /// it, [`Packer::hold`]).
    Own,
    /// A pack: against this base (a copied pack holding earlier versions of
    /// its files), else with the dictionary; harder if it holds versions of
    /// a file side by side ([`Packer::pack_room`]).
    Pack(Option<similar::Chosen>, bool),
}

/// A block stored alone, not yet sent to the workers ([`Packer::hold`]).
pub(super) struct Held {
    id: u32,
    hash: Digest,
    data: Arc<Vec<u8>>,
    /// [`Packer::emitted`] when it was held.
    at: u64,
}

/// Most bytes of later blocks a held block waits through ([`Packer::hold`]):
/// the writer keeps the blocks after it, compressed, until it goes.
const MAX_HOLD: u64 = 64 << 20;

impl<W: Write + Send + 'static> Packer<W> {
    /// Hash a finished block, dedup it, and send it on if new; returns its
    /// digest. `made` says how it is compressed.
    pub(super) fn emit(
        &mut self,
        seq: u32,
        data: Vec<u8>,
        made: Made,
    ) -> Result<Digest, BuildError> {
        let hash = sheaf_format::digest(&data);
        let key = sheaf_format::content_key(&hash);
        if let Some(&id) = self.by_hash.get(&key) {
            self.progress
                .dedup_bytes
                .fetch_add(data.len() as u64, Ordering::Relaxed);
            self.seq_to_id[seq as usize] = id;
            return Ok(hash);
        }
        let work = match &self.base {
            Some((img, by_digest)) => match by_digest.get(&hash) {
                Some(&(prev_id, r)) if r.ulen as usize == data.len() => {
                    self.copied_blocks.0 += 1;
                    self.copied_blocks.1 += r.clen as u64;
                    Some(Work::Copy(img.clone(), prev_id, r))
                }
                _ => self.compress_work(seq, key, hash, data, made)?,
            },
            None => self.compress_work(seq, key, hash, data, made)?,
        };
        if let Some(work) = work {
            self.send(seq, key, hash, work)?;
        }
        Ok(hash)
    }

    /// How to compress new block `seq` ([`Made`]); `None` if it is held
    /// back ([`Packer::hold`]).
    fn compress_work(
        &mut self,
        seq: u32,
        key: Digest,
        hash: Digest,
        data: Vec<u8>,
        made: Made,
    ) -> Result<Option<Work>, BuildError> {
        let data = Arc::new(data);
        Ok(Some(match made {
            Made::Pack(Some(base), _) => Work::Against(data, base),
            Made::Pack(None, versions) => {
                let step = if versions {
                    VERSIONS_PACK_LEVEL_STEP
                } else {
                    0
                };
                Work::Compress(data, self.dict.clone(), step)
            }
            Made::Own => {
                let chosen = self.bases.choose(seq, hash, &data);
                if let Some(b) = &chosen {
                    self.release_held(|h| h.hash == b.hash, BASE_LEVEL_STEP)?;
                }
                let gone = self.bases.take_evicted();
                if !gone.is_empty() {
                    self.release_held(|h| gone.contains(&h.hash), 0)?;
                }
                match chosen {
                    Some(base) => Work::Against(data, base),
                    None if self.bases.enabled() => {
                        self.hold(seq, key, hash, data);
                        return Ok(None);
                    }
                    None => Work::Compress(data, None, 0),
                }
            }
        }))
    }

    /// Hold back block `seq`, stored alone and now a candidate base, until
    /// a later block is compressed against it (then it is compressed
    /// [`BASE_LEVEL_STEP`] levels higher), it leaves the window of
    /// candidates, or [`MAX_HOLD`] bytes of blocks come after it (then as
    /// asked). It gets its id now, so it keeps its place in the image; its
    /// bytes are in the window meanwhile.
    fn hold(&mut self, seq: u32, key: Digest, hash: Digest, data: Arc<Vec<u8>>) {
        let id = self.assign(seq, key);
        let at = self.emitted;
        self.held.push(Held { id, hash, data, at });
    }

    /// Send the held blocks that `which` picks on, `step` levels higher.
    pub(super) fn release_held(
        &mut self,
        which: impl Fn(&Held) -> bool,
        step: i32,
    ) -> Result<(), BuildError> {
        let (go, keep): (Vec<Held>, _) =
            std::mem::take(&mut self.held).into_iter().partition(which);
        self.held = keep;
        for h in go {
            self.dispatch(h.id, h.hash, Work::Compress(h.data, None, step))?;
        }
        Ok(())
    }

    /// Give `seq` a new block id and hand the block to the workers.
    /// `key` names the block's bytes for dedup ([`sheaf_format::cache_key`]:
    /// new data by its content, a copied block by its ref).
    pub(super) fn send(
        &mut self,
        seq: u32,
        key: Digest,
        hash: Digest,
        work: Work,
    ) -> Result<(), BuildError> {
        let id = self.assign(seq, key);
        self.dispatch(id, hash, work)?;
        let old = self.emitted.saturating_sub(MAX_HOLD);
        if self.held.first().is_some_and(|h| h.at < old) {
            self.release_held(|h| h.at < old, 0)?;
        }
        Ok(())
    }

    /// Give `seq` the next block id, known by `key` from now on.
    fn assign(&mut self, seq: u32, key: Digest) -> u32 {
        let id = self.next_id;
        self.next_id += 1;
        self.by_hash.insert(key, id);
        self.seq_to_id[seq as usize] = id;
        id
    }

    /// Hand block `id` to the workers.
    fn dispatch(&mut self, id: u32, hash: Digest, work: Work) -> Result<(), BuildError> {
        self.emitted += match &work {
            Work::Compress(d, ..) | Work::Against(d, _) => d.len() as u64,
            Work::Copy(_, _, r) => r.ulen as u64,
            Work::Stored(_, _, ulen) => *ulen as u64,
        };
        // Wait for a free slot; a closed channel means the writer failed.
        if self.tokens.recv().is_err() {
            return Err(self.writer_failed());
        }
        let sent = self
            .jobs
            .as_ref()
            .expect("open until finish")
            .send(Job { id, hash, work });
        if sent.is_err() {
            return Err(self.writer_failed());
        }
        Ok(())
    }

    /// The writer's error, once it has stopped.
    fn writer_failed(&mut self) -> BuildError {
        self.jobs = None;
        match self.writer.take().map(|h| h.join()) {
            Some(Ok(Err(e))) => e,
            _ => BuildError::Option("image writer stopped unexpectedly".into()),
        }
    }
}
