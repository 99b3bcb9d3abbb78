//! The packer's workers and writer: what a worker does with a block
//! (compress it, against a base or not, or copy it from a `--base` image),
//! and the thread that writes finished blocks in id order.

use super::{Out, Progress};
use crate::options::{BuildError, Compression};
use crate::similar;
use crossbeam_channel::{Receiver, Sender};
use sheaf_format::{reference, BlockRef, Codec, Dictionary, Digest};
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Compress `data` with every candidate and keep the smallest; raw if none
/// shrinks it. With `dict`, zstd compresses with that dictionary
/// ([`Codec::ZstdDict`]).
pub fn compress_best(c: &Compression, data: &[u8], dict: Option<&Dictionary>) -> (Codec, Vec<u8>) {
    let mut best: Option<(Codec, Vec<u8>)> = None;
    for &(codec, level) in &c.candidates {
        let (codec, z) = match (codec, dict) {
            (Codec::None, _) => continue,
            (Codec::Zstd, Some(d)) => (
                Codec::ZstdDict,
                sheaf_format::codec::compress_with_dict(level, data, d),
            ),
            _ => (codec, codec.compress(level, data)),
        };
        if z.len() < data.len() && best.as_ref().is_none_or(|b| z.len() < b.1.len()) {
            best = Some((codec, z));
        }
    }
    best.unwrap_or_else(|| (Codec::None, data.to_vec()))
}

/// What the writer thread hands back: the output, the refs of the blocks
/// it wrote, by block id, and the dictionaries and reference bases (by
/// content digest) those blocks name.
pub(super) type Written<W> = (Out<W>, Vec<BlockRef>, Named);

/// Digests the written blocks name: dictionaries, and bases' contents.
pub(super) type Named = (BTreeSet<Digest>, BTreeSet<Digest>);

pub(super) struct Job {
    pub(super) id: u32,
    pub(super) hash: Digest,
    pub(super) work: Work,
}

/// What a worker does with a block.
pub(super) enum Work {
    /// Compress these bytes (with this dictionary: a pack block) this many
    /// zstd levels higher than asked ([`Compression::raised`]: a base of
    /// reference blocks, a pack of versions).
    Compress(Arc<Vec<u8>>, Option<Arc<Dictionary>>, i32),
    /// Compress these bytes against this base (a reference block,
    /// format.md §7.2), or alone if that does not shrink them.
    Against(Arc<Vec<u8>>, similar::Chosen),
    /// Copy this block of an earlier image as stored, after checking it
    /// against its digest (`--base`).
    Copy(Arc<sheaf_read::Image>, u32, BlockRef),
    /// Write these stored bytes of an earlier image's block as they are
    /// (already checked against their ref, whose length is given).
    Stored(Codec, Vec<u8>, u32),
}

pub(super) struct Done {
    id: u32,
    hash: Digest,
    ulen: u32,
    /// Codec and stored bytes, or why a copied block was refused.
    stored: Result<(Codec, Vec<u8>), BuildError>,
}

impl Work {
    /// Run on a worker thread; `scratch` is the worker's buffer for checking
    /// copied blocks.
    fn run(
        self,
        c: &Compression,
        block_size: u32,
        scratch: &mut Vec<u8>,
    ) -> (u32, Result<(Codec, Vec<u8>), BuildError>) {
        match self {
            Work::Compress(data, dict, step) => {
                let (codec, z) = compress_best(&c.raised(step), &data, dict.as_deref());
                // Data blocks are named by their stored bytes, so readers may
                // decompress only what they need (format.md §7).
                let codec = match codec {
                    Codec::Zstd => Codec::ZstdStored,
                    c => c,
                };
                (data.len() as u32, Ok((codec, z)))
            }
            Work::Against(data, base) => {
                // Blocks whose sketches resemble (similar::MIN_SHARED) came
                // out smaller by a sixteenth or more against their base in 185 of 188 cases on
                // tree V, by 44% on the whole, so the block is not also
                // compressed alone, which would cost a build a third more.
                let level = c.candidates.iter().find(|(k, _)| *k == Codec::Zstd);
                let r = level.map(|&(_, l)| reference::compress(l, &data, &base.data, &base.hash));
                match r {
                    Some(r) if r.len() < data.len() => (data.len() as u32, Ok((Codec::ZstdRef, r))),
                    _ => Work::Compress(data, None, 0).run(c, block_size, scratch),
                }
            }
            Work::Stored(codec, z, ulen) => (ulen, Ok((codec, z))),
            Work::Copy(img, prev_id, r) => {
                let what = || format!("data block {prev_id}");
                let stored = img
                    .stored(&r, block_size, &what, scratch)
                    .map_err(|cause| BuildError::Base { cause });
                (r.ulen, stored)
            }
        }
    }
}

/// A compressor thread: runs jobs until the job channel closes or the
/// writer stops taking results.
pub(super) fn worker(rx: Receiver<Job>, tx: Sender<Done>, c: &Compression, block_size: u32) {
    let mut scratch = Vec::new();
    for j in rx {
        let copy = matches!(j.work, Work::Copy(..) | Work::Stored(..));
        let (ulen, stored) = j.work.run(c, block_size, &mut scratch);
        // A ref of a stored-digest codec names what was stored (a copied
        // block keeps the digest it had).
        let hash = match &stored {
            Ok((codec, z)) if !copy && codec.names_stored() => sheaf_format::digest(z),
            _ => j.hash,
        };
        let d = Done {
            id: j.id,
            hash,
            ulen,
            stored,
        };
        if tx.send(d).is_err() {
            return;
        }
    }
}

pub(super) fn write_in_order<W: Write>(
    mut out: Out<W>,
    done: Receiver<Done>,
    tokens: Sender<()>,
    progress: &Progress,
) -> Result<Written<W>, BuildError> {
    let mut pending: BTreeMap<u32, Done> = BTreeMap::new();
    let mut refs = Vec::new();
    let (mut named, mut named_bases) = (BTreeSet::new(), BTreeSet::new());
    for d in done {
        // A slot frees when its block is compressed, not when it is
        // written: a block held back (Packer::hold) has its id already and
        // is compressed later, and the blocks after it wait here.
        let _ = tokens.send(());
        pending.insert(d.id, d);
        while let Some(d) = pending.remove(&(refs.len() as u32)) {
            let (codec, bytes) = d.stored?;
            let bad =
                |e: sheaf_format::FormatError| BuildError::Option(format!("a block to write: {e}"));
            match codec {
                Codec::ZstdDict => {
                    named.insert(sheaf_format::dict::named_dictionary(&bytes).map_err(bad)?);
                }
                Codec::ZstdRef => {
                    named_bases.insert(reference::named_base(&bytes).map_err(bad)?);
                }
                _ => {}
            }
            let offset = out.put(&bytes)?;
            progress
                .bytes_out
                .fetch_add(bytes.len() as u64, Ordering::Relaxed);
            refs.push(BlockRef {
                hash: d.hash,
                offset,
                codec,
                clen: bytes.len() as u32,
                ulen: d.ulen,
            });
        }
    }
    Ok((out, refs, (named, named_bases)))
}
