//! What the packer takes from a `--base` image: its blocks, copied as
//! stored, and its packs as the bases of packs of new versions.

use super::{Chunk, CopiedPack, Packer};
use crate::options::BuildError;
use crate::pack::work::Work;
use sheaf_format::{reference, BlockRef, Codec};
use std::io::Write;
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl<W: Write + Send + 'static> Packer<W> {
    /// Store a file whose data is `chunks` of the `--base` image `img`
    /// (checked by the caller against `refs`): each block they use is
    /// copied as stored, once, unless a block with its digest is already in
    /// the image. Nothing is read from the source. Returns (first chunk,
    /// chunk count).
    pub fn add_copied(
        &mut self,
        img: &Arc<sheaf_read::Image>,
        refs: &[BlockRef],
        chunks: &[Chunk],
    ) -> Result<(u64, u32), BuildError> {
        let first = self.chunks.len();
        for c in chunks {
            if c.is_hole() {
                self.chunks.push(*c);
                continue;
            }
            let seq = self.copy_block(img, refs, c.block)?;
            self.chunks.push(Chunk { block: seq, ..*c });
        }
        self.progress.files.fetch_add(1, Ordering::Relaxed);
        Ok((first as u64, (self.chunks.len() - first) as u32))
    }

    /// The file added next is a new version of a small file that pack
    /// `old` of the `--base` image `img` (with block refs `refs`) holds, or
    /// of none; that pack is copied here if it was not yet. A reference
    /// block is never a base (format.md §7.2).
    pub fn set_version_in(
        &mut self,
        img: &Arc<sheaf_read::Image>,
        refs: &[BlockRef],
        old: Option<u32>,
    ) -> Result<(), BuildError> {
        self.copied_pack = None;
        let may_be_base = |o: u32| {
            refs.get(o as usize)
                .is_some_and(|r| r.codec != Codec::ZstdRef)
        };
        let Some(old) = old.filter(|&o| may_be_base(o)) else {
            return Ok(());
        };
        if !self.bases.enabled() {
            return Ok(());
        }
        let seq = self.copy_block(img, refs, old)?;
        self.copied_pack = Some(CopiedPack {
            seq,
            old,
            img: img.clone(),
        });
        Ok(())
    }

    /// The sequence number of block `old` of the `--base` image `img` (with
    /// block refs `refs`) in this image: copied as stored, once, unless a
    /// block with its key is here already. A reference block's base comes
    /// first (the image must hold it, and it may not be a reference block
    /// itself, format.md §7.2).
    fn copy_block(
        &mut self,
        img: &Arc<sheaf_read::Image>,
        refs: &[BlockRef],
        old: u32,
    ) -> Result<u32, BuildError> {
        if let Some(&s) = self.copied.get(&old) {
            return Ok(s);
        }
        let r = refs[old as usize];
        let base_err = |why: String| BuildError::Base {
            cause: sheaf_read::ReadError::format(
                img.name(),
                &format!("data block {old}"),
                sheaf_format::FormatError::invalid("reference block", why),
            ),
        };
        let mut work = Work::Copy(img.clone(), old, r);
        if r.codec == Codec::ZstdRef && !self.by_hash.contains_key(&r.key()) {
            let what = || format!("data block {old}");
            let (codec, z) = img
                .stored(&r, img.superblock().block_size, &what, &mut Vec::new())
                .map_err(|cause| BuildError::Base { cause })?;
            let named = reference::named_base(&z).map_err(|e| base_err(e.to_string()))?;
            let base = img
                .ref_base(&named)
                .ok_or_else(|| base_err("its base is not in the image's base list".into()))?;
            if refs[base as usize].codec == Codec::ZstdRef {
                return Err(base_err(format!(
                    "its base, data block {base}, is a reference block itself"
                )));
            }
            let base_seq = self.copy_block(img, refs, base)?;
            self.bases.note(base_seq, named);
            work = Work::Stored(codec, z, r.ulen);
        }
        let s = self.new_seq();
        match self.by_hash.get(&r.key()) {
            Some(&id) => self.seq_to_id[s as usize] = id,
            None => {
                self.copied_blocks.0 += 1;
                self.copied_blocks.1 += r.clen as u64;
                // A block of its own, stored alone, may be the base of a
                // new version's block that follows (read only if one does).
                if r.ulen as usize > self.pack_size
                    && !matches!(r.codec, Codec::ZstdRef | Codec::ZstdDict)
                {
                    let img = img.clone();
                    let load = Box::new(move || img.block(old).ok());
                    self.bases.offer_later(s, r.ulen as usize, load);
                }
                self.send(s, r.key(), r.hash, work)?;
            }
        }
        self.copied.insert(old, s);
        Ok(s)
    }
}
