//! Turning a finished [`Tree`] into metadata streams and writing them as
//! paged, compressed, hashed streams.

use crate::options::{BuildError, Compression};
use crate::pack::{compress_best, Out};
use crate::tree::{Kind, NodeId, Tree};
use rayon::prelude::*;
use sheaf_format::superblock::MAX_ROOT_REFS;
use sheaf_format::{BlockRef, DirentRecord, InodeRecord, StreamDesc};
use std::collections::VecDeque;
use std::io::Write;

/// The encoded (uncompressed) metadata streams.
#[derive(Debug, Default)]
pub struct Streams {
    /// Inode records, in inode-number order.
    pub inodes: Vec<u8>,
    /// Dirent records.
    pub dirents: Vec<u8>,
    /// Names, symlink targets, xattr sets.
    pub heap: Vec<u8>,
    /// Number of inodes.
    pub inode_count: u64,
    /// Number of dirents.
    pub dirent_count: u64,
}

/// Number inodes breadth-first (so a directory's entries have neighbouring
/// inode numbers and `ls -l` of one directory touches few pages) and encode
/// inodes, dirents and the heap.
pub fn encode_tree(tree: &Tree) -> Result<Streams, BuildError> {
    let n = tree.nodes.len();
    let mut ino = vec![u32::MAX; n];
    let mut order: Vec<NodeId> = Vec::with_capacity(n);
    ino[0] = 0;
    order.push(0);
    let mut queue = VecDeque::from([0 as NodeId]);
    while let Some(d) = queue.pop_front() {
        if let Kind::Dir(entries) = &tree.nodes[d as usize].kind {
            for &(_, c) in entries {
                if ino[c as usize] == u32::MAX {
                    ino[c as usize] = order.len() as u32;
                    order.push(c);
                    if matches!(tree.nodes[c as usize].kind, Kind::Dir(_)) {
                        queue.push_back(c);
                    }
                }
            }
        }
    }
    let mut s = Streams::default();
    // Xattr sets go first in the heap, each stored once.
    let mut xattr_off = Vec::with_capacity(tree.xattr_sets.len());
    for set in &tree.xattr_sets {
        xattr_off.push(s.heap.len() as u64);
        s.heap.extend_from_slice(&set.encode());
    }
    for &id in &order {
        let node = &tree.nodes[id as usize];
        let m = node.meta;
        let mut r = InodeRecord {
            mode: m.mode,
            uid: m.uid,
            gid: m.gid,
            nlink: node.links.max(1),
            mtime_sec: m.mtime_sec,
            mtime_nsec: m.mtime_nsec,
            xattr: match node.xattrs {
                0 => 0,
                i => xattr_off[i as usize - 1] + 1,
            },
            ..Default::default()
        };
        match &node.kind {
            Kind::Dir(entries) => {
                if entries.len() > u32::MAX as usize {
                    return Err(BuildError::Option(
                        "directory with more than 2^32 entries".into(),
                    ));
                }
                r.parent = ino[node.parent as usize];
                r.data = s.dirent_count;
                r.count = entries.len() as u32;
                r.size = entries.len() as u64;
                let mut subdirs = 0;
                for (name, c) in entries {
                    let dtype = tree.file_type(*c).dtype();
                    subdirs += (dtype == sheaf_format::FileType::Directory.dtype()) as u32;
                    if name.len() > u16::MAX as usize {
                        return Err(BuildError::Option("name longer than 65535 bytes".into()));
                    }
                    DirentRecord {
                        name_offset: s.heap.len() as u64,
                        name_len: name.len() as u16,
                        dtype,
                        inode: ino[*c as usize],
                    }
                    .encode(&mut s.dirents);
                    s.heap.extend_from_slice(name);
                    s.dirent_count += 1;
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
                r.data = s.heap.len() as u64;
                s.heap.extend_from_slice(t);
            }
            Kind::Device(rdev) => r.data = *rdev,
            Kind::Special => {}
        }
        r.encode(&mut s.inodes);
    }
    s.inode_count = order.len() as u64;
    Ok(s)
}

/// Write `bytes` as a paged stream: pages compressed (in parallel on the
/// current rayon pool when `parallel`), written in
/// order, then the refs of each level paged in turn until the top level fits
/// in the superblock.
pub fn write_stream<W: Write>(
    out: &mut Out<W>,
    bytes: &[u8],
    page_size: u32,
    comp: &Compression,
    parallel: bool,
) -> Result<StreamDesc, BuildError> {
    if bytes.is_empty() {
        return Ok(StreamDesc::default());
    }
    // Level 0 is the caller's bytes; upper levels (refs) are built here.
    let mut upper: Vec<u8>;
    let mut level: &[u8] = bytes;
    let mut levels = 0;
    loop {
        levels += 1;
        let page = |p: &[u8]| {
            let (codec, z) = compress_best(comp, p);
            (sheaf_format::digest(p), codec, z, p.len() as u32)
        };
        let pages: Vec<(sheaf_format::Digest, sheaf_format::Codec, Vec<u8>, u32)> = if parallel {
            level.par_chunks(page_size as usize).map(page).collect()
        } else {
            level.chunks(page_size as usize).map(page).collect()
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
        if refs.len() <= MAX_ROOT_REFS {
            return Ok(StreamDesc {
                len: bytes.len() as u64,
                levels,
                roots: refs,
            });
        }
        upper = refs.iter().flat_map(|r| r.encode()).collect();
        level = &upper;
    }
}
