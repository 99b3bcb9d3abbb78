//! Rewriting an existing image without recompressing its data: the data
//! blocks are copied as stored, in a new order, and the metadata re-paged
//! around their new offsets (`sheaf optimize`). Block ids, and so every
//! chunk record, stay the same; only the block index changes.
//!
//! The caller supplies the parts (this crate does not read images): the
//! uncompressed metadata streams, the block refs, and a way to get each
//! block's stored bytes, verified.

use crate::meta;
use crate::options::Compression;
use crate::pack::Out;
use crate::{BuildError, TempOut};
use sheaf_format::{
    BlockRef, Codec, Header, SectionKind, StreamId, Superblock, SECTION_FLAG_REQUIRED,
};
use std::io::BufWriter;
use std::path::Path;
use std::sync::atomic::AtomicBool;

/// Gives a block's codec and stored bytes, verified, by id and ref.
pub type StoredBlock<'a> = dyn Fn(u32, &BlockRef) -> Result<(Codec, Vec<u8>), String> + Sync + 'a;

/// What an image is rebuilt from.
pub struct Parts {
    /// The superblock (counts and geometry are kept; stream roots are
    /// rewritten).
    pub superblock: Superblock,
    /// Uncompressed inode, chunk, dirent and heap streams (index by
    /// [`StreamId`]; the block index entry is ignored and rebuilt).
    pub streams: [Vec<u8>; 5],
    /// The ref of every data block, by id.
    pub blocks: Vec<BlockRef>,
    /// Build information JSON to carry over (may be empty).
    pub build_info: Vec<u8>,
    /// The reference-base section's entries (block ids stay the same).
    pub ref_bases: Vec<sheaf_format::reference::Base>,
}

/// Write `parts` to `output` with the blocks in `first` placed first (in
/// that order) and listed in the prefetch section, then all others in id
/// order. `stored(id, r)` returns a block's codec and stored bytes, verified
/// (the codec may differ from the ref's when it came from a shared object);
/// `dicts` finds the dictionaries those bytes name, which the new image
/// carries.
pub fn rewrite(
    parts: Parts,
    first: &[u32],
    stored: &StoredBlock<'_>,
    dicts: &dyn sheaf_format::DictLookup,
    output: &Path,
    compression: &Compression,
    force: bool,
) -> Result<u64, BuildError> {
    let shown = output.display().to_string();
    let out_err = |e: std::io::Error| BuildError::Output {
        path: shown.clone(),
        cause: e,
    };
    if !force && output.symlink_metadata().is_ok() {
        return Err(BuildError::Exists(shown));
    }
    let (file, mut guard) = TempOut::create(output).map_err(out_err)?;
    let mut out = Out::new(BufWriter::with_capacity(4 << 20, file), 0, shown.clone());
    out.put(&Header::current().encode())?;
    let n = parts.blocks.len();
    let mut placed = vec![false; n];
    let mut order: Vec<u32> = Vec::with_capacity(n);
    for &id in first {
        if (id as usize) < n && !placed[id as usize] {
            placed[id as usize] = true;
            order.push(id);
        }
    }
    let listed = order.len();
    order.extend((0..n as u32).filter(|&id| !placed[id as usize]));
    let mut refs = parts.blocks.clone();
    let mut named: Vec<std::sync::Arc<sheaf_format::Dictionary>> = Vec::new();
    for &id in &order {
        let r = &parts.blocks[id as usize];
        let (codec, bytes) = stored(id, r).map_err(BuildError::Option)?;
        if codec == Codec::ZstdDict {
            let d = sheaf_format::dict::named_dictionary(&bytes)
                .map_err(|e| BuildError::Option(format!("block {id}: {e}")))?;
            if !named.iter().any(|x| *x.digest() == d) {
                named.push(dicts.dictionary(&d).ok_or_else(|| {
                    BuildError::Option(format!(
                        "block {id} names dictionary {}, which was not found",
                        sheaf_format::hex(&d)
                    ))
                })?);
            }
        }
        let nr = &mut refs[id as usize];
        nr.offset = out.put(&bytes)?;
        nr.codec = codec;
        nr.clen = u32::try_from(bytes.len())
            .map_err(|_| BuildError::Option(format!("block {id} is too large")))?;
    }
    let mut descs = parts.superblock.streams.clone();
    let block_bytes: Vec<u8> = refs.iter().flat_map(|r| r.encode()).collect();
    let page_size = parts.superblock.page_size;
    for id in StreamId::ALL {
        let bytes = if id == StreamId::Blocks {
            &block_bytes
        } else {
            &parts.streams[id as usize]
        };
        descs[id as usize] = meta::write_stream(&mut out, bytes, page_size, compression, true)?;
    }
    let sb = Superblock {
        streams: descs,
        ..parts.superblock
    };
    let prefetch: Vec<u8> = order[..listed]
        .iter()
        .flat_map(|id| id.to_le_bytes())
        .collect();
    let dict_bytes = sheaf_format::dict::encode_section(&named);
    crate::write_tail(
        &mut out,
        vec![
            (SectionKind::BuildInfo, 0, parts.build_info),
            (SectionKind::Prefetch, 0, prefetch),
            (SectionKind::Dictionaries, SECTION_FLAG_REQUIRED, dict_bytes),
            (
                SectionKind::RefBases,
                SECTION_FLAG_REQUIRED,
                sheaf_format::reference::encode_section(&parts.ref_bases),
            ),
            (SectionKind::Superblock, SECTION_FLAG_REQUIRED, sb.encode()),
        ],
    )?;
    crate::finish_output(out, &mut guard, force, &AtomicBool::new(false))
}
