//! Turning a finished [`Tree`] into metadata streams and writing them as
//! paged, compressed, hashed streams.

use crate::options::{BuildError, Compression};
use crate::pack::{compress_best, Out};
use crate::tree::{Kind, NodeId, Tree};
use rayon::prelude::*;
use sheaf_format::superblock::MAX_ROOT_REFS;
use sheaf_format::{BlockRef, DirentRecord, InodeRecord, StreamDesc, StreamId};
use std::io::Write;

/// Inode numbers of a finished [`Tree`], and what the inode, dirent and heap
/// streams hold, so each can be encoded while it is written
/// ([`Layout::encode`]) instead of all three being held at once next to the
/// tree.
#[derive(Debug)]
pub struct Layout {
    /// Node of each inode number.
    order: Vec<NodeId>,
    /// Inode number of each node (`u32::MAX`: not in the image).
    ino: Vec<u32>,
    /// Number of dirents.
    pub dirent_count: u64,
}

impl Layout {
    /// Number inodes breadth-first (so a directory's entries have
    /// neighbouring inode numbers and `ls -l` of one directory touches few
    /// pages), and check what the format cannot hold.
    pub fn new(tree: &Tree) -> Result<Self, BuildError> {
        let n = tree.nodes.len();
        let mut ino = vec![u32::MAX; n];
        let mut order: Vec<NodeId> = Vec::with_capacity(n);
        ino[0] = 0;
        order.push(0);
        let mut dirent_count = 0u64;
        let mut next = 0;
        // `order` is the breadth-first queue too: directories are visited in
        // inode order.
        while next < order.len() {
            let d = order[next];
            next += 1;
            let Kind::Dir(entries) = &tree.nodes[d as usize].kind else {
                continue;
            };
            if entries.len() > u32::MAX as usize {
                return Err(BuildError::Option(
                    "directory with more than 2^32 entries".into(),
                ));
            }
            dirent_count += entries.len() as u64;
            for e in entries.iter() {
                if e.name.len() > u16::MAX as usize {
                    return Err(BuildError::Option("name longer than 65535 bytes".into()));
                }
                let c = e.node as usize;
                if ino[c] == u32::MAX {
                    ino[c] = order.len() as u32;
                    order.push(e.node);
                }
            }
        }
        Ok(Layout {
            order,
            ino,
            dirent_count,
        })
    }

    /// Number of inodes.
    pub fn inode_count(&self) -> u64 {
        self.order.len() as u64
    }

    /// Encode stream `id` (inodes, dirents or heap) of `tree` into `w`.
    /// Each walks the tree in inode order with the same offsets; only the
    /// bytes of `id` are kept.
    pub fn encode<W: Write>(
        &self,
        tree: &Tree,
        id: StreamId,
        w: &mut PagedWriter<'_, W>,
    ) -> Result<(), BuildError> {
        let (inodes, dirents, heap) = (
            id == StreamId::Inodes,
            id == StreamId::Dirents,
            id == StreamId::Heap,
        );
        let mut heap_len = 0u64;
        let mut dirent_count = 0u64;
        let mut put_heap = |w: &mut PagedWriter<'_, W>, b: &[u8]| -> u64 {
            let at = heap_len;
            if heap {
                w.buf().extend_from_slice(b);
            }
            heap_len += b.len() as u64;
            at
        };
        // Xattr sets go first in the heap, each stored once.
        let mut xattr_off = Vec::with_capacity(tree.xattr_sets.len());
        for set in &tree.xattr_sets {
            xattr_off.push(put_heap(w, &set.encode()));
        }
        for &id in &self.order {
            let node = &tree.nodes[id as usize];
            let m = tree.meta(id);
            let mut r = InodeRecord {
                mode: m.mode,
                uid: m.uid,
                gid: m.gid,
                nlink: node.links.max(1),
                mtime_sec: m.mtime_sec,
                mtime_nsec: m.mtime_nsec,
                xattr: match tree.xattrs(id) {
                    0 => 0,
                    i => xattr_off[i as usize - 1] + 1,
                },
                ..Default::default()
            };
            match &node.kind {
                Kind::Dir(entries) => {
                    r.parent = self.ino[node.parent as usize];
                    r.data = dirent_count;
                    r.count = entries.len() as u32;
                    r.size = entries.len() as u64;
                    let mut subdirs = 0;
                    for e in entries.iter() {
                        let (name, c) = (tree.name(e.name), e.node);
                        let dtype = tree.file_type(c).dtype();
                        subdirs += (dtype == sheaf_format::FileType::Directory.dtype()) as u32;
                        let name_offset = put_heap(w, name);
                        if dirents {
                            DirentRecord {
                                name_offset,
                                name_len: name.len() as u16,
                                dtype,
                                inode: self.ino[c as usize],
                            }
                            .encode(w.buf());
                        }
                        dirent_count += 1;
                    }
                    r.nlink = 2 + subdirs;
                }
                Kind::File { size, first, count } => {
                    r.size = *size;
                    r.data = *first;
                    r.count = *count;
                }
                Kind::Symlink(t) => {
                    r.size = t.len() as u64;
                    r.data = put_heap(w, t);
                }
                Kind::Device(rdev) => r.data = *rdev,
                Kind::Special => {}
            }
            if inodes {
                r.encode(w.buf());
            }
            w.flush_full()?;
        }
        Ok(())
    }
}

/// Writes one paged stream from bytes given in pieces: whole pages are
/// compressed and written a batch at a time, so a stream is never held
/// whole. The pages are the same as [`write_stream`] makes of the whole.
pub struct PagedWriter<'o, W: Write> {
    out: &'o mut Out<W>,
    page_size: usize,
    comp: &'o Compression,
    parallel: bool,
    /// Bytes not written yet.
    pending: Vec<u8>,
    /// Written so far.
    len: u64,
    refs: Vec<BlockRef>,
}

impl<'o, W: Write> PagedWriter<'o, W> {
    /// Bytes of pages compressed together: enough to keep every thread busy.
    const BATCH: usize = 8 << 20;

    /// A stream of pages of `page_size` bytes written to `out`, compressed
    /// on the current rayon pool when `parallel`.
    pub fn new(out: &'o mut Out<W>, page_size: u32, comp: &'o Compression, parallel: bool) -> Self {
        PagedWriter {
            out,
            page_size: page_size as usize,
            comp,
            parallel,
            pending: Vec::new(),
            len: 0,
            refs: Vec::new(),
        }
    }

    /// Where to append the stream's next bytes; call [`PagedWriter::flush_full`]
    /// now and then.
    pub fn buf(&mut self) -> &mut Vec<u8> {
        &mut self.pending
    }

    /// Write the pending whole pages once there is a batch of them.
    pub fn flush_full(&mut self) -> Result<(), BuildError> {
        if self.pending.len() >= Self::BATCH.max(self.page_size) {
            let whole = self.pending.len() / self.page_size * self.page_size;
            self.write_pages(whole)?;
        }
        Ok(())
    }

    /// Compress and write the first `n` pending bytes as pages.
    fn write_pages(&mut self, n: usize) -> Result<(), BuildError> {
        let refs = write_pages(
            self.out,
            &self.pending[..n],
            self.page_size,
            self.comp,
            self.parallel,
        )?;
        self.refs.extend(refs);
        self.len += n as u64;
        self.pending.drain(..n);
        Ok(())
    }

    /// Write the rest, then the levels of refs above the pages.
    pub fn finish(mut self) -> Result<StreamDesc, BuildError> {
        self.write_pages(self.pending.len())?;
        let (page_size, comp, parallel) = (self.page_size, self.comp, self.parallel);
        top_levels(self.out, self.refs, self.len, page_size, comp, parallel)
    }
}

/// The refs of each level paged in turn until the top level fits in the
/// superblock; `refs` are the pages of a stream of `len` bytes.
fn top_levels<W: Write>(
    out: &mut Out<W>,
    mut refs: Vec<BlockRef>,
    len: u64,
    page_size: usize,
    comp: &Compression,
    parallel: bool,
) -> Result<StreamDesc, BuildError> {
    if len == 0 {
        return Ok(StreamDesc::default());
    }
    let mut levels = 1;
    while refs.len() > MAX_ROOT_REFS {
        levels += 1;
        let upper: Vec<u8> = refs.iter().flat_map(|r| r.encode()).collect();
        refs = write_pages(out, &upper, page_size, comp, parallel)?;
    }
    Ok(StreamDesc {
        len,
        levels,
        roots: refs,
    })
}

/// Compress `bytes` in pages (in parallel on the current rayon pool when
/// `parallel`) and write them in order; their refs.
fn write_pages<W: Write>(
    out: &mut Out<W>,
    bytes: &[u8],
    page_size: usize,
    comp: &Compression,
    parallel: bool,
) -> Result<Vec<BlockRef>, BuildError> {
    let page = |p: &[u8]| {
        let (codec, z) = compress_best(comp, p, None);
        (sheaf_format::digest(p), codec, z, p.len() as u32)
    };
    let pages: Vec<(sheaf_format::Digest, sheaf_format::Codec, Vec<u8>, u32)> = if parallel {
        bytes.par_chunks(page_size).map(page).collect()
    } else {
        bytes.chunks(page_size).map(page).collect()
    };
    let mut refs = Vec::with_capacity(pages.len());
    for (hash, codec, z, ulen) in pages {
        let offset = out.put(&z)?;
        refs.push(BlockRef {
            hash,
            offset,
            codec,
            clen: z.len() as u32,
            ulen,
        });
    }
    Ok(refs)
}

/// Write `bytes` as a paged stream (see [`PagedWriter`]).
pub fn write_stream<W: Write>(
    out: &mut Out<W>,
    bytes: &[u8],
    page_size: u32,
    comp: &Compression,
    parallel: bool,
) -> Result<StreamDesc, BuildError> {
    let ps = page_size as usize;
    let refs = write_pages(out, bytes, ps, comp, parallel)?;
    top_levels(out, refs, bytes.len() as u64, ps, comp, parallel)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream given to [`PagedWriter`] in pieces, across batches, is
    /// written exactly as [`write_stream`] writes it whole.
    #[test]
    fn paged_writer_matches_write_stream() {
        let comp = Compression::default();
        let page = 4096u32;
        // Enough pages for two levels of refs and several batches.
        let bytes: Vec<u8> = (0..PagedWriter::<Vec<u8>>::BATCH * 2 + 12345)
            .map(|i| (i as u32).wrapping_mul(2654435761).to_le_bytes()[i % 3])
            .collect();
        let mut whole = Out::new(Vec::new(), 0, "whole".into());
        let a = write_stream(&mut whole, &bytes, page, &comp, false).unwrap();
        let mut pieces = Out::new(Vec::new(), 0, "pieces".into());
        let mut w = PagedWriter::new(&mut pieces, page, &comp, false);
        for piece in bytes.chunks(1000) {
            w.buf().extend_from_slice(piece);
            w.flush_full().unwrap();
        }
        let b = w.finish().unwrap();
        assert!(a.levels > 1);
        assert_eq!(a, b);
        assert_eq!(whole.into_inner(), pieces.into_inner());
        let mut empty = Out::new(Vec::new(), 0, "empty".into());
        let d = PagedWriter::new(&mut empty, page, &comp, false)
            .finish()
            .unwrap();
        assert_eq!(d, StreamDesc::default());
    }
}
