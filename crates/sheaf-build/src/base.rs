//! Incremental builds (`sheaf build --base PREV`): which files of the new
//! tree can keep the data PREV stores for them, and which of PREV's blocks
//! are copied as stored (docs/build.md has the rules and why).
//!
//! A regular file is *unchanged* when PREV has a regular file at the same
//! path with the same size, mtime (ns), mode and owner as the new build
//! would store. Its data is then taken from PREV's blocks, never read from
//! the source. A block of PREV is copied whole, with its digest, when the
//! files that keep it cover all but at most `max_stale_pct` percent of its
//! bytes; a file is reused only when every block it uses is copied, else it
//! is read and packed anew like in a full build.
//!
//! PREV is untrusted: its metadata is read through the verified reader, its
//! chunk records are checked against its blocks here, and every copied block
//! is decompressed and checked against its digest by the packer's workers.

use crate::options::{BuildError, BuildOptions};
use crate::tree::{Kind, Meta, NodeId, Tree};
use sheaf_format::{BlockRef, ChunkRecord, FileType, StreamId, BLOCK_REF_LEN};
use sheaf_read::{Image, ReadError, Step};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

/// What PREV recorded for one regular file.
#[derive(Debug, Clone, Copy)]
struct PrevFile {
    meta: Meta,
    size: u64,
    first: u64,
    count: u32,
}

/// An opened PREV: its files by path, its chunk table and block refs.
pub struct Base {
    /// The image, for copying blocks (verified as they are read).
    pub image: Arc<Image>,
    /// How messages name it.
    pub name: String,
    files: HashMap<Vec<u8>, PrevFile>,
    chunks: Vec<ChunkRecord>,
    /// PREV's block refs, by PREV block id.
    pub refs: Vec<BlockRef>,
}

impl std::fmt::Debug for Base {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Base").field("name", &self.name).finish()
    }
}

/// Which files reuse PREV's data: node id → PREV chunk range.
#[derive(Debug, Default)]
pub struct Plan {
    /// Reused files and the (first, count) of their chunks in PREV.
    pub reused: HashMap<NodeId, (u64, u32)>,
    /// Bytes of the blocks to copy that no reused file covers (data of
    /// files changed or removed since PREV, unreachable in the new image).
    pub stale_bytes: u64,
}

fn read_err(cause: ReadError) -> BuildError {
    BuildError::Base { cause }
}

impl Base {
    /// Open PREV and check that its blocks fit this build: same block size,
    /// pack size and compression (else copied blocks would differ in kind
    /// from the ones a full build writes).
    pub fn open(path: &Path, opts: &BuildOptions) -> Result<Base, BuildError> {
        let name = path.display().to_string();
        if opts.mtime.is_some() {
            return Err(BuildError::Option(
                "--base cannot be combined with --mtime: with every mtime forced, \
                 unchanged files cannot be told from changed ones"
                    .into(),
            ));
        }
        let image = sheaf_read::open_path(path).map_err(read_err)?;
        let refuse = |detail: String| {
            BuildError::BadInput {
            path: name.clone(),
            detail: format!("{detail}; --base needs an image built with the same block size, pack size and compression"),
        }
        };
        let sb = image.superblock().clone();
        if sb.block_size != opts.block_size {
            return Err(refuse(format!(
                "block size {} (this build: {})",
                sb.block_size, opts.block_size
            )));
        }
        let info = image.build_info().map_err(read_err)?;
        let pack = opts.pack_block_size();
        let want_comp = opts.compression.describe();
        match (info.pack_size, info.compression.as_deref()) {
            (Some(p), Some(c)) if p == pack && c == want_comp => {}
            (Some(p), Some(c)) => {
                return Err(refuse(format!(
                    "pack size {p}, compression {c} (this build: {pack}, {want_comp})"
                )))
            }
            _ => {
                return Err(refuse(
                    "its build information does not say its pack size and compression".into(),
                ))
            }
        }
        // Whole chunk table and block index: 24 and 48 bytes per entry, the
        // order of the tree the build holds anyway.
        let chunk_bytes = usize::try_from(sb.chunk_count * ChunkRecord::LEN as u64)
            .map_err(|_| refuse("chunk table too large".into()))?;
        let raw = image
            .read_stream(StreamId::Chunks, 0, chunk_bytes)
            .map_err(read_err)?;
        let bad = |what: &str, e| read_err(ReadError::format(&name, what, e));
        let chunks = raw
            .chunks_exact(ChunkRecord::LEN)
            .map(|b| ChunkRecord::decode(b).map_err(|e| bad("chunk", e)))
            .collect::<Result<Vec<_>, _>>()?;
        let ref_bytes = usize::try_from(sb.block_count * BLOCK_REF_LEN as u64)
            .map_err(|_| refuse("block index too large".into()))?;
        let raw = image
            .read_stream(StreamId::Blocks, 0, ref_bytes)
            .map_err(read_err)?;
        let refs = raw
            .chunks_exact(BLOCK_REF_LEN)
            .map(|b| BlockRef::decode(b).map_err(|e| bad("block ref", e)))
            .collect::<Result<Vec<_>, _>>()?;
        let mut files = HashMap::new();
        let root = image.root().map_err(read_err)?;
        image
            .walk(root, Vec::new(), &mut |p, ino, _| {
                if ino.file_type() == FileType::Regular {
                    let r = &ino.rec;
                    let p = p.strip_prefix(b"/").unwrap_or(p);
                    files.insert(
                        p.to_vec(),
                        PrevFile {
                            meta: Meta {
                                mode: r.mode,
                                uid: r.uid,
                                gid: r.gid,
                                mtime_sec: r.mtime_sec,
                                mtime_nsec: r.mtime_nsec,
                            },
                            size: r.size,
                            first: r.data,
                            count: r.count,
                        },
                    );
                }
                Ok(Step::Continue)
            })
            .map_err(read_err)?;
        Ok(Base {
            image: Arc::new(image),
            name,
            files,
            chunks,
            refs,
        })
    }

    /// PREV's chunks of a range from [`Plan::reused`].
    pub fn chunks(&self, first: u64, count: u32) -> &[ChunkRecord] {
        &self.chunks[first as usize..first as usize + count as usize]
    }

    /// Decide which of `files` (node ids of the new tree, in packing order,
    /// with their relative paths) reuse PREV's data. `clamp` is the build's
    /// SOURCE_DATE_EPOCH: a file stored with exactly that mtime may have
    /// been clamped, so its mtime tells nothing and it is read anew.
    pub fn plan(
        &self,
        tree: &Tree,
        files: &[(NodeId, Vec<u8>)],
        clamp: Option<i64>,
        max_stale_pct: u8,
    ) -> Result<Plan, BuildError> {
        let bad = |detail: String| BuildError::BadInput {
            path: self.name.clone(),
            detail,
        };
        // Candidates by their PREV chunk range: files PREV stored once
        // (identical content) share one range and are covered once.
        let mut ranges: Vec<(u64, u32)> = Vec::new();
        let mut range_size: Vec<u64> = Vec::new();
        let mut range_of: HashMap<(u64, u32), usize> = HashMap::new();
        let mut cands: Vec<(NodeId, usize)> = Vec::new();
        for (id, path) in files {
            let Kind::File { size, .. } = tree.nodes[*id as usize].kind else {
                continue;
            };
            let meta = tree.meta(*id);
            let Some(p) = self.files.get(path.as_slice()) else {
                continue;
            };
            let clamped = clamp.is_some_and(|c| (meta.mtime_sec, meta.mtime_nsec) == (c, 0));
            if p.size != size || p.meta != meta || clamped {
                continue;
            }
            let key = (p.first, p.count);
            let r = *range_of.entry(key).or_insert_with(|| {
                ranges.push(key);
                range_size.push(size);
                ranges.len() - 1
            });
            if range_size[r] != size {
                return Err(bad(format!(
                    "files of sizes {size} and {} share chunks",
                    range_size[r]
                )));
            }
            cands.push((*id, r));
        }
        // Check the ranges against PREV's tables before trusting them.
        let nblocks = self.refs.len();
        let mut cover = vec![0u64; nblocks];
        let mut users: HashMap<u32, Vec<usize>> = HashMap::new();
        for (j, &(first, count)) in ranges.iter().enumerate() {
            let end = first.checked_add(count as u64);
            if end.is_none_or(|e| e > self.chunks.len() as u64) {
                return Err(bad(format!("file chunks {first}+{count} out of range")));
            }
            // In file order, not overlapping, inside the file: what a reader
            // of NEW will check, so a PREV that breaks it fails here, naming PREV.
            let mut end = 0u64;
            for c in self.chunks(first, count) {
                let c_end = c.file_offset.checked_add(c.len as u64);
                if c.file_offset < end || c_end.is_none_or(|e| e > range_size[j]) {
                    return Err(bad(format!("chunk {} out of place", c.file_offset)));
                }
                end = c_end.unwrap_or(end);
                if c.is_hole() {
                    continue;
                }
                let r = self
                    .refs
                    .get(c.block as usize)
                    .ok_or_else(|| bad(format!("chunk names block {} of {nblocks}", c.block)))?;
                if c.block_offset as u64 + c.len as u64 > r.ulen as u64 {
                    return Err(bad(format!("chunk beyond data block {}", c.block)));
                }
                cover[c.block as usize] += c.len as u64;
                let u = users.entry(c.block).or_default();
                if u.last() != Some(&j) {
                    u.push(j);
                }
            }
        }
        let stale = |b: usize, cover: &[u64]| (self.refs[b].ulen as u64).saturating_sub(cover[b]);
        let too_stale = |b: usize, cover: &[u64]| {
            stale(b, cover) * 100 > max_stale_pct as u64 * self.refs[b].ulen as u64
        };
        // Drop blocks with too much stale data, then the ranges using them,
        // whose other blocks lose coverage in turn, until nothing changes.
        let mut ok = vec![true; ranges.len()];
        let mut dropped = vec![false; nblocks];
        let mut queue: Vec<u32> = users
            .keys()
            .copied()
            .filter(|&b| too_stale(b as usize, &cover))
            .collect();
        while let Some(b) = queue.pop() {
            if std::mem::replace(&mut dropped[b as usize], true) {
                continue;
            }
            for &j in &users[&b] {
                if !std::mem::replace(&mut ok[j], false) {
                    continue;
                }
                let (first, count) = ranges[j];
                for c in self.chunks(first, count).iter().filter(|c| !c.is_hole()) {
                    cover[c.block as usize] -= c.len as u64;
                    if !dropped[c.block as usize] && too_stale(c.block as usize, &cover) {
                        queue.push(c.block);
                    }
                }
            }
        }
        let stale_bytes = users
            .keys()
            .filter(|&&b| !dropped[b as usize] && cover[b as usize] > 0)
            .map(|&b| stale(b as usize, &cover))
            .sum();
        Ok(Plan {
            reused: cands
                .into_iter()
                .filter(|&(_, j)| ok[j])
                .map(|(id, j)| (id, ranges[j]))
                .collect(),
            stale_bytes,
        })
    }
}
