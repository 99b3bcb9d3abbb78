//! Large files: their full blocks at fixed offsets, or, read whole, cut
//! where their content lines up with the bases held for reference blocks.

use super::{FileRange, Made, Packer};
use crate::options::BuildError;
use crate::tree::Chunk;
use sheaf_format::Digest;
use std::io::Write;
use std::sync::atomic::Ordering;

impl<W: Write + Send + 'static> Packer<W> {
    /// Store `data`, the piece of a file at file offset `at`, as a block
    /// of its own (not a pack); returns its digest.
    pub(super) fn add_block_at(&mut self, data: &[u8], at: u64) -> Result<Digest, BuildError> {
        let seq = self.new_seq();
        self.chunks.push(Chunk {
            file_offset: at,
            block: seq,
            block_offset: 0,
            len: data.len() as u32,
        });
        self.emit(seq, data.to_vec(), Made::Own)
    }

    /// Store `data`, full blocks of a file starting at file offset `at`,
    /// one block each (an all-zero one as a hole), and add each to the
    /// file's identity `id`. `first` is the file's first chunk.
    pub(super) fn add_blocks(
        &mut self,
        data: &[u8],
        mut at: u64,
        first: usize,
        id: &mut blake3::Hasher,
    ) -> Result<(), BuildError> {
        for b in data.chunks(self.block_size) {
            let n = b.len() as u64;
            if b.iter().all(|&x| x == 0) {
                self.add_hole(first, at, n);
                id.update(b"H").update(&n.to_le_bytes());
            } else {
                let d = self.add_block_at(b, at)?;
                id.update(b"D").update(&d);
            }
            at += n;
        }
        Ok(())
    }

    /// Store a file of more than a block read whole (`data`): shared with
    /// an identical earlier file read whole, else cut into pieces of at
    /// most a block where its content lines up with the held bases
    /// ([`crate::similar::Bases::cuts`]). Each piece is a block of its own,
    /// an all-zero one a hole, except a last one shorter than a pack, which
    /// goes to the packs like any tail. `first` is the file's first chunk;
    /// nothing of it has been stored yet.
    pub(super) fn add_whole(
        &mut self,
        data: Vec<u8>,
        first: usize,
        file: u32,
    ) -> Result<(u64, FileRange), BuildError> {
        let size = data.len() as u64;
        // The identity of a file read whole is its bytes: its pieces depend
        // on the bases held when it came, an identical file's may not.
        let h = *blake3::Hasher::new_derive_key("sheaf 1.0 whole large-file identity")
            .update(&data)
            .update(&size.to_le_bytes())
            .finalize()
            .as_bytes();
        if let Some(f) = self.by_content.get(&h) {
            self.progress.dedup_bytes.fetch_add(size, Ordering::Relaxed);
            return Ok((size, FileRange::SameAs(f)));
        }
        // A piece shorter than this costs a block (and a read of it one
        // more) for little that it lines up.
        let min = self.block_size / 16;
        let mut start = 0;
        for end in self.bases.cuts(&data, self.block_size, min) {
            let piece = &data[start..end];
            let at = start as u64;
            if piece.iter().all(|&b| b == 0) {
                self.add_hole(first, at, piece.len() as u64);
            } else if end == data.len() && piece.len() < self.pack_size.min(self.block_size / 4) {
                self.append_packed(piece, at)?;
            } else {
                self.add_block_at(piece, at)?;
            }
            start = end;
        }
        self.by_content.insert(h, file);
        let count = (self.chunks.len() - first) as u32;
        Ok((size, FileRange::Chunks(first as u64, count)))
    }
}
