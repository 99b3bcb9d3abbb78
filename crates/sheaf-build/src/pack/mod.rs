//! The data pipeline: pack → hash → compress → ordered write.
//!
//! One thread (the caller) reads files in packing order, cuts them into
//! blocks, hashes each block and drops duplicates; worker threads compress
//! unique blocks; a writer thread puts them in the image in block-id order.
//! Block ids are assigned by the single packing thread, so the image does not
//! depend on the number of workers. A fixed number of blocks may be in flight
//! at once, so memory does not grow with data size.
//!
//! Files of at least one block get their full blocks to themselves (so equal
//! blocks in different files dedup); everything shorter than a block (small
//! files and tails) is appended to a shared *pack* block. Whole-file content
//! hashes dedup identical files, which then share one chunk range. Aligned
//! all-zero blocks of a file become holes and are not stored. With
//! reference blocks, a large file up to a size is read whole and cut where
//! its content lines up with the blocks it may be compressed against
//! (`large.rs`). A finished block goes to the workers from `emit.rs`.

use crate::content_index::ContentIndex;
use crate::options::{BuildError, Compression};
use crate::similar;

mod copy;
mod emit;
mod large;
mod work;
use crate::tree::Chunk;
use crossbeam_channel::{bounded, Receiver, Sender};
use emit::{Held, Made};
use sheaf_format::{records::HOLE, reference, BlockRef, Codec, Dictionary, Digest};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
pub use work::compress_best;
use work::{write_in_order, Done, Job, Written};

/// Counters a progress display polls.
#[derive(Debug, Default)]
pub struct Progress {
    /// Files whose data has been read.
    pub files: AtomicU64,
    /// Logical bytes read.
    pub bytes_in: AtomicU64,
    /// Stored bytes written.
    pub bytes_out: AtomicU64,
    /// Files to read, when known in advance.
    pub total_files: AtomicU64,
    /// Bytes to read, when known in advance.
    pub total_bytes: AtomicU64,
    /// Logical bytes not stored because an identical block or file was.
    pub dedup_bytes: AtomicU64,
    /// Logical bytes not stored because they were all-zero blocks (holes).
    pub hole_bytes: AtomicU64,
}

/// Sequential writer of the image file that knows its position.
pub struct Out<W: Write> {
    w: W,
    /// Bytes written so far (= offset of the next write).
    pub pos: u64,
    /// Path for messages.
    pub path: String,
}

impl<W: Write> Out<W> {
    /// Wrap a writer positioned at `pos`.
    pub fn new(w: W, pos: u64, path: String) -> Self {
        Out { w, pos, path }
    }
    /// Append bytes, returning their offset.
    pub fn put(&mut self, b: &[u8]) -> Result<u64, BuildError> {
        let at = self.pos;
        self.w.write_all(b).map_err(|e| self.err(e))?;
        self.pos += b.len() as u64;
        Ok(at)
    }
    /// The inner writer.
    pub fn into_inner(self) -> W {
        self.w
    }
    /// Wrap an I/O error with the output path.
    pub fn err(&self, e: std::io::Error) -> BuildError {
        BuildError::Output {
            path: self.path.clone(),
            cause: e,
        }
    }
}

/// What [`Packer::finish`] returns: the output, block refs by id, the
/// chunks with final block ids, the dictionaries the blocks name and the
/// blocks reference blocks are compressed against (the image must carry
/// both).
pub type Packed<W> = (
    Out<W>,
    Vec<BlockRef>,
    Vec<Chunk>,
    Vec<Arc<Dictionary>>,
    Vec<reference::Base>,
);

/// Where the chunks of a file [`Packer::add_file`] stored are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileRange {
    /// Its own: first chunk and number of chunks.
    Chunks(u64, u32),
    /// Those of the earlier file with this id, which has the same content.
    SameAs(u32),
}

/// A `--base` image and its blocks by digest (with their ids in it).
type BaseBlocks = (Arc<sheaf_read::Image>, HashMap<Digest, (u32, BlockRef)>);

/// Packs file data into blocks and streams them to the compressors and writer.
pub struct Packer<W: Write + Send + 'static> {
    block_size: usize,
    pack_size: usize,
    /// All chunks; `block` holds a block *sequence number* until [`Packer::finish`].
    pub chunks: Vec<Chunk>,
    pack: Vec<u8>,
    pack_seq: Option<u32>,
    /// The chunks in `pack` (indices into `chunks`), in the order appended.
    pack_pieces: Vec<usize>,
    /// Whether the open pack holds a version of the piece before it, and
    /// the similarity group of its last piece ([`Packer::pack_room`]).
    pack_has_versions: bool,
    pack_group: Option<u64>,
    seq_to_id: Vec<u32>,
    by_hash: HashMap<Digest, u32>,
    by_content: ContentIndex,
    next_id: u32,
    jobs: Option<Sender<Job>>,
    tokens: Receiver<()>,
    workers: Vec<JoinHandle<()>>,
    writer: Option<JoinHandle<Result<Written<W>, BuildError>>>,
    progress: Arc<Progress>,
    buf: Vec<u8>,
    /// Blocks of a `--base` image already copied: its block id → sequence.
    copied: HashMap<u32, u32>,
    /// Blocks copied from a `--base` image, and their stored bytes.
    pub copied_blocks: (u64, u64),
    /// The `--base` image and its blocks by digest: a block read from the
    /// source that it already holds is copied from it, not compressed.
    base: Option<BaseBlocks>,
    /// The dictionary pack blocks are compressed with.
    dict: Option<Arc<Dictionary>>,
    /// Every dictionary a written block may name (`dict`, and those of the
    /// `--base` image, whose blocks are copied as stored).
    known_dicts: Vec<Arc<Dictionary>>,
    /// The similarity group of the file being added ([`Packer::set_group_of`]).
    group: Option<u64>,
    /// The open group block: files of a pack or more of one group, stored
    /// together ([`Packer::set_group_of`]).
    shared: Option<SharedBlock>,
    /// Whether files are grouped by path ([`Packer::set_group_of`]).
    grouping: bool,
    /// Blocks that may serve as bases of reference blocks
    /// ([`Packer::set_references`]), and those that do.
    bases: similar::Bases,
    /// Files of a block up to this size are read whole and cut where their
    /// content lines up with the held bases ([`similar::Bases::cuts`]); 0
    /// without reference blocks.
    whole_cap: usize,
    /// The pack of the `--base` image that holds an earlier version of the
    /// file being added ([`Packer::set_version_in`]).
    copied_pack: Option<CopiedPack>,
    /// Blocks stored alone that may yet become bases, held back until one
    /// is chosen as a base or leaves the window of candidates ([`Packer::hold`]).
    held: Vec<Held>,
    /// Uncompressed bytes of the blocks handed to the workers so far.
    emitted: u64,
    /// The copied pack the open pack is compressed against: it holds earlier
    /// versions of the open pack's files ([`Packer::version_base`]).
    pack_base: Option<CopiedPack>,
}

/// A pack block copied from a `--base` image.
#[derive(Clone)]
struct CopiedPack {
    /// Its sequence number here, and its id in the `--base` image.
    seq: u32,
    old: u32,
    img: Arc<sheaf_read::Image>,
}

/// A block that files of one similarity group fill, in packing order.
struct SharedBlock {
    seq: u32,
    group: u64,
    data: Vec<u8>,
}

impl<W: Write + Send + 'static> Packer<W> {
    /// Start `threads` compressors and the writer thread on `out`.
    pub fn new(
        out: Out<W>,
        block_size: u32,
        compression: Compression,
        threads: usize,
        progress: Arc<Progress>,
    ) -> Self {
        Self::with_extra_in_flight(out, block_size, compression, threads, 0, progress)
    }

    /// Blocks in flight added for a build that copies blocks (`--base`).
    /// Copies are quick and compressions slow, and blocks are written in id
    /// order: with 3 per thread, one compression at the head of that order
    /// holds every slot while the copies behind it are done, and the other
    /// workers wait. Measured on P with 1% changed, 2 threads: 1.6 s instead
    /// of 1.9 s. Costs at most this many blocks more memory.
    pub const COPY_ROOM: usize = 18;

    /// [`Packer::new`] with `extra` more blocks in flight than the usual 3
    /// per thread (see [`Packer::COPY_ROOM`]).
    pub fn with_extra_in_flight(
        out: Out<W>,
        block_size: u32,
        compression: Compression,
        threads: usize,
        extra: usize,
        progress: Arc<Progress>,
    ) -> Self {
        let threads = threads.max(1);
        let in_flight = threads * 3 + extra;
        let (jobs_tx, jobs_rx) = bounded::<Job>(threads);
        let (done_tx, done_rx) = bounded::<Done>(in_flight);
        let (tok_tx, tok_rx) = bounded::<()>(in_flight);
        for _ in 0..in_flight {
            tok_tx.send(()).expect("capacity");
        }
        let workers = (0..threads)
            .map(|_| {
                let rx = jobs_rx.clone();
                let tx = done_tx.clone();
                let c = compression.clone();
                std::thread::spawn(move || work::worker(rx, tx, &c, block_size))
            })
            .collect();
        drop(done_tx);
        let prog = progress.clone();
        let writer = std::thread::spawn(move || write_in_order(out, done_rx, tok_tx, &prog));
        Packer {
            block_size: block_size as usize,
            pack_size: block_size as usize,
            chunks: Vec::new(),
            pack: Vec::with_capacity(block_size as usize),
            pack_seq: None,
            pack_pieces: Vec::new(),
            pack_has_versions: false,
            pack_group: None,
            seq_to_id: Vec::new(),
            by_hash: HashMap::new(),
            by_content: ContentIndex::default(),
            next_id: 0,
            jobs: Some(jobs_tx),
            tokens: tok_rx,
            workers,
            writer: Some(writer),
            progress,
            buf: vec![0; block_size as usize],
            copied: HashMap::new(),
            copied_blocks: (0, 0),
            base: None,
            dict: None,
            known_dicts: Vec::new(),
            group: None,
            shared: None,
            grouping: false,
            bases: similar::Bases::new(0),
            whole_cap: 0,
            copied_pack: None,
            held: Vec::new(),
            emitted: 0,
            pack_base: None,
        }
    }

    /// Compress blocks of their own (not packs) against a resembling
    /// earlier block when that is smaller ([`crate::similar`]), holding up
    /// to `budget` bytes of candidates; 0 turns reference blocks off. Only
    /// zstd makes them.
    pub fn set_references(&mut self, budget: usize, c: &Compression) {
        let zstd = c.candidates.iter().any(|(k, _)| *k == Codec::Zstd);
        let budget = if zstd { budget } else { 0 };
        self.bases.set_budget(budget);
        // Half the window: a file larger cannot line up with much of it.
        self.whole_cap = if budget > 0 {
            (budget / 2).max(self.block_size)
        } else {
            0
        };
    }

    /// The similarity group of the file at `rel` (relative to the top) and
    /// of the files added after it: from its path ([`crate::order::group_key`]:
    /// the versions of one file), when grouping is on
    /// ([`Packer::set_grouping`]), so every input groups alike. Consecutive
    /// files of one group that would each get a block of their own (a pack
    /// or more, shorter than a block) share one instead, as long as it has
    /// room: compressed together, a version costs little more than what it
    /// changes, and a read of one decodes at most one block, as any read.
    pub fn set_group_of(&mut self, rel: &[u8]) {
        self.group = self.grouping.then(|| crate::order::group_key(rel));
    }

    /// The similarity group [`Packer::set_group_of`] last set, for an input
    /// that adds a file later than it names it (a tar stream's held files).
    pub fn group(&self) -> Option<u64> {
        self.group
    }

    /// Set the similarity group [`Packer::group`] returned.
    pub fn set_group(&mut self, group: Option<u64>) {
        self.group = group;
    }

    /// Whether [`Packer::set_group_of`] groups files (`--no-group-blocks`
    /// turns it off).
    pub fn set_grouping(&mut self, on: bool) {
        self.grouping = on;
    }

    /// Send the open group block on, if any.
    fn flush_shared(&mut self) -> Result<(), BuildError> {
        if let Some(b) = self.shared.take() {
            if !b.data.is_empty() {
                self.emit(b.seq, b.data, Made::Own)?;
            }
        }
        Ok(())
    }

    /// Compress pack blocks from now on with `dict` (small files gain most
    /// from one; blocks of large files compress well alone).
    pub fn set_dictionary(&mut self, dict: Option<Arc<Dictionary>>) {
        if let Some(d) = &dict {
            self.know_dictionary(d);
        }
        self.dict = dict;
    }

    fn know_dictionary(&mut self, d: &Arc<Dictionary>) {
        if !self.known_dicts.iter().any(|k| k.digest() == d.digest()) {
            self.known_dicts.push(d.clone());
        }
    }

    /// Pack small files and tails into blocks of `n` bytes (at most the
    /// block size) instead of full-size blocks.
    pub fn set_pack_size(&mut self, n: u32) {
        self.pack_size = (n as usize).clamp(1, self.block_size);
    }

    /// Take blocks whose digest the `--base` image `img` (with block refs
    /// `refs`) holds from it as stored instead of compressing them anew:
    /// unchanged blocks of changed files (e.g. one appended to) cost a copy.
    pub fn set_base(&mut self, img: &Arc<sheaf_read::Image>, refs: &[BlockRef]) {
        let by_digest = refs
            .iter()
            .enumerate()
            // Only digests of content can match new content: a stored-digest
            // ref's digest is its frame's, which a file may equal.
            .filter(|(_, r)| !r.codec.names_stored())
            .map(|(i, r)| (r.hash, (i as u32, *r)))
            .collect();
        self.base = Some((img.clone(), by_digest));
        for d in img.dictionaries() {
            self.know_dictionary(d);
        }
    }

    /// Make room for `files` more files, when the count is known in
    /// advance: growing the dedup index and chunk list at full size would
    /// briefly hold the old and the new tables together.
    pub fn reserve(&mut self, files: usize) {
        self.chunks.reserve(files);
        self.by_content.reserve(files);
    }

    fn new_seq(&mut self) -> u32 {
        self.seq_to_id.push(u32::MAX);
        (self.seq_to_id.len() - 1) as u32
    }

    /// One small file in this many (by content digest) ends a half-full pack.
    const PACK_CUT_ONE_IN: u32 = 128;

    /// Append bytes shorter than a block to the shared pack; returns chunks.
    fn append_packed(&mut self, mut data: &[u8], mut file_offset: u64) -> Result<(), BuildError> {
        while !data.is_empty() {
            let seq = match self.pack_seq {
                Some(s) => s,
                None => {
                    let s = self.new_seq();
                    self.pack_seq = Some(s);
                    s
                }
            };
            // A full pack, or one whose base the file's does not match
            // (`version_base`, asked only when there is room), is cut first.
            let room = self.pack_room();
            if room == 0 || self.version_base() {
                self.flush_pack()?;
                continue;
            }
            let n = data.len().min(room);
            self.pack_has_versions |= self.group.is_some() && self.group == self.pack_group;
            self.pack_group = self.group;
            self.pack_pieces.push(self.chunks.len());
            self.chunks.push(Chunk {
                file_offset,
                block: seq,
                block_offset: self.pack.len() as u32,
                len: n as u32,
            });
            self.pack.extend_from_slice(&data[..n]);
            data = &data[n..];
            file_offset += n as u64;
            if self.pack_room() == 0 {
                self.flush_pack()?;
            }
        }
        Ok(())
    }

    /// How many times the pack size a pack that holds versions may grow
    /// to (at most a block). Tree V: 122.8 MB instead of 130.6; K and P
    /// within 0.05% (docs/design.md, "Packs of versions").
    pub const VERSION_PACK_FACTOR: usize = 4;

    /// Room left in the open pack. A pack that holds a version of the piece
    /// before it (one similarity group after another,
    /// [`Packer::set_group_of`]) may grow to [`Packer::VERSION_PACK_FACTOR`]
    /// times the pack size: versions and their neighbours compress against
    /// each other across more files. Other packs keep the pack size: a
    /// random read verifies and so reads its whole pack from the disk, and
    /// with 1 MiB packs throughout, K's 5000 random files read 2.7 times
    /// the bytes and took 1.1-1.5 times as long.
    fn pack_room(&self) -> usize {
        let cap = if self.pack_has_versions {
            (self.pack_size * Self::VERSION_PACK_FACTOR).min(self.block_size)
        } else {
            self.pack_size
        };
        cap.saturating_sub(self.pack.len())
    }

    /// Whether `n` bytes shorter than a block (a file or a tail) get a
    /// block of their own instead of going through the packs: when they
    /// fill at least a pack. Cut into packs, a 1 MiB library restarts its
    /// compression every pack and shares each pack with its neighbours;
    /// whole, it compresses as one, and reading it decompresses only it
    /// (P: 1.x% smaller at 256 KiB packs, docs/design.md).
    fn own_block(&self, n: usize) -> bool {
        n >= self.pack_size && self.pack_size < self.block_size
    }

    /// Store `data` (shorter than a block) as one block of its own, or in
    /// the open group block when it is of the same group and fits.
    fn add_own_block(&mut self, data: &[u8], file_offset: u64) -> Result<(), BuildError> {
        if let Some(g) = self.group {
            let fits = self
                .shared
                .as_ref()
                .is_some_and(|b| b.group == g && b.data.len() + data.len() <= self.block_size);
            if !fits {
                self.flush_shared()?;
                let seq = self.new_seq();
                self.shared = Some(SharedBlock {
                    seq,
                    group: g,
                    data: Vec::with_capacity(self.block_size),
                });
            }
            let b = self.shared.as_mut().expect("opened above");
            self.chunks.push(Chunk {
                file_offset,
                block: b.seq,
                block_offset: b.data.len() as u32,
                len: data.len() as u32,
            });
            b.data.extend_from_slice(data);
            return Ok(());
        }
        self.flush_shared()?;
        self.add_block_at(data, file_offset)?;
        Ok(())
    }

    /// End the current pack block: later small files start a new one.
    pub fn cut_pack(&mut self) -> Result<(), BuildError> {
        self.flush_shared()?;
        self.flush_pack()
    }

    fn flush_pack(&mut self) -> Result<(), BuildError> {
        let versions = std::mem::take(&mut self.pack_has_versions);
        self.pack_group = None;
        let base = self.pack_base.take();
        if let Some(seq) = self.pack_seq.take() {
            let data = self.shortest_first();
            let base = base.and_then(|b| {
                // One that cannot be read is left out: copying it fails on
                // its own.
                let content = b.img.block(b.old).ok()?;
                let hash = sheaf_format::digest(&content);
                self.bases.note(b.seq, hash);
                Some(similar::Chosen {
                    data: content,
                    hash,
                    shared: 0,
                })
            });
            self.emit(seq, data, Made::Pack(base, versions))?;
        }
        Ok(())
    }

    /// Whether the open pack has to be cut before the file being added
    /// goes into it, having noted the file's base: a new file whose
    /// earlier version a pack of the `--base` image holds
    /// ([`Packer::set_version_in`], which sets nothing without reference
    /// blocks) makes that pack the base of the open one, which is compressed
    /// against it (a new version costs what it changes, not what it
    /// shares with the pack's other files); a file of another base pack
    /// starts a new pack, so that each pack has one base.
    fn version_base(&mut self) -> bool {
        let Some(c) = self.copied_pack.as_ref() else {
            return false;
        };
        match &self.pack_base {
            Some(b) => b.seq != c.seq,
            None if self.pack.is_empty() => {
                self.pack_base = Some(c.clone());
                false
            }
            None => true,
        }
    }

    /// The current pack's bytes laid out shortest piece first (ties in
    /// packing order), its chunks' offsets moved to match; bytes no chunk
    /// names any more (the tail of a file found to be a duplicate) are
    /// left out. A read decodes a pack from its start to the end of what it
    /// wants (format.md §7), and pack sizes are heavy-tailed: shortest
    /// first, the many small files lie near the start and the few large
    /// ones at the end. Measured on K: a random file needs 0.44× the bytes
    /// decoded (docs/design.md, "Order inside a pack").
    fn shortest_first(&mut self) -> Vec<u8> {
        let mut pieces = std::mem::take(&mut self.pack_pieces);
        pieces.sort_by_key(|&i| self.chunks[i].len);
        let mut out = Vec::with_capacity(self.pack_size);
        for i in pieces.drain(..) {
            let c = &mut self.chunks[i];
            let at = c.block_offset as usize;
            c.block_offset = out.len() as u32;
            out.extend_from_slice(&self.pack[at..at + c.len as usize]);
        }
        self.pack.clear();
        self.pack_pieces = pieces;
        out
    }

    /// Read a file to its end and store it; returns its size and where its
    /// chunks are. `file` is the caller's id for it: a later file with the
    /// same content gets [`FileRange::SameAs`] this id (so only files that
    /// are kept may be given one, each its own).
    /// `name` is only used in messages. Whole-block holes `r` knows of
    /// ([`FileData::hole_blocks`]: `SEEK_DATA`, a tar sparse map) are
    /// skipped unread, at no cost per byte; `cancel` is polled at every
    /// block.
    pub fn add_file(
        &mut self,
        r: &mut dyn FileData,
        name: &str,
        file: u32,
        cancel: &std::sync::atomic::AtomicBool,
    ) -> Result<(u64, FileRange), BuildError> {
        let io = |e: std::io::Error| BuildError::Input {
            path: name.to_string(),
            cause: e,
        };
        let first = self.chunks.len();
        // Where the open group block ends before this file, to take its
        // tail back out if the file turns out to repeat an earlier one.
        let shared_mark = self.shared.as_ref().map(|b| (b.seq, b.data.len()));
        // A file of a block or more is identified by its chunk sequence: the
        // digests its blocks get anyway, its holes with their lengths, its
        // tail bytes and its size. A separate BLAKE3 domain keeps these ids
        // apart from small files' content hashes.
        let mut id = blake3::Hasher::new_derive_key("sheaf 1.0 large-file identity");
        let mut size = 0u64;
        let mut buf = std::mem::take(&mut self.buf);
        // A large file's bytes while it may still be cut whole (see
        // `whole_cap`); `size` counts them as read.
        let mut held: Vec<u8> = Vec::new();
        let mut whole = self.whole_cap > 0;
        let result = (|| {
            loop {
                if cancel.load(Ordering::Relaxed) {
                    return Err(BuildError::Interrupted);
                }
                {
                    let skip = r.hole_blocks(size, self.block_size as u64).map_err(io)?;
                    if skip > 0 {
                        if whole {
                            whole = false;
                            self.add_blocks(&held, size - held.len() as u64, first, &mut id)?;
                            held = Vec::new();
                        }
                        self.add_hole(first, size, skip);
                        id.update(b"H").update(&skip.to_le_bytes());
                        size += skip;
                    }
                }
                let n = read_full(r, &mut buf).map_err(io)?;
                if n == 0 {
                    break;
                }
                self.progress
                    .bytes_in
                    .fetch_add(n as u64, Ordering::Relaxed);
                if n < self.block_size {
                    if size == 0 {
                        // A whole small file: share an identical earlier one.
                        let h = sheaf_format::digest(&buf[..n]);
                        if let Some(f) = self.by_content.get(&h) {
                            self.progress
                                .dedup_bytes
                                .fetch_add(n as u64, Ordering::Relaxed);
                            return Ok((n as u64, Some(f)));
                        }
                        if self.own_block(n) {
                            self.add_own_block(&buf[..n], 0)?;
                            self.by_content.insert(h, file);
                            return Ok((n as u64, None));
                        }
                        self.append_packed(&buf[..n], 0)?;
                        self.by_content.insert(h, file);
                        // Content-defined pack boundaries: end the pack after
                        // a file whose digest says so (once it is half full),
                        // so an edited or added file changes its own pack, not
                        // every pack after it; a new image version then shares
                        // most blocks with the old one (measured in design.md).
                        if self.pack_room() <= self.pack.len()
                            && u32::from_le_bytes([h[0], h[1], h[2], h[3]])
                                .is_multiple_of(Self::PACK_CUT_ONE_IN)
                        {
                            self.flush_pack()?;
                        }
                        return Ok((n as u64, None));
                    }
                    if whole {
                        held.extend_from_slice(&buf[..n]);
                        size += n as u64;
                        break;
                    }
                    id.update(b"T").update(&buf[..n]);
                    if self.own_block(n) {
                        self.add_own_block(&buf[..n], size)?;
                    } else {
                        self.append_packed(&buf[..n], size)?;
                    }
                    size += n as u64;
                    break;
                }
                if whole && held.len() + n <= self.whole_cap {
                    if held.is_empty() {
                        if let Some(len) = r.len_hint() {
                            held.reserve_exact((len as usize).min(self.whole_cap));
                        }
                    }
                    held.extend_from_slice(&buf[..n]);
                    size += n as u64;
                    continue;
                }
                if whole {
                    whole = false;
                    self.add_blocks(&held, size - held.len() as u64, first, &mut id)?;
                    held = Vec::new();
                }
                self.add_blocks(&buf[..n], size, first, &mut id)?;
                size += n as u64;
            }
            Ok((size, None))
        })();
        self.buf = buf;
        self.progress.files.fetch_add(1, Ordering::Relaxed);
        let (size, shared) = result?;
        if let Some(f) = shared {
            return Ok((size, FileRange::SameAs(f)));
        }
        if !held.is_empty() {
            return self.add_whole(held, first, file);
        }
        // A large file identical to an earlier one shares its chunk range.
        let count = (self.chunks.len() - first) as u32;
        if size >= self.block_size as u64 {
            let h = *id
                .update(b"S")
                .update(&size.to_le_bytes())
                .finalize()
                .as_bytes();
            if let Some(f) = self.by_content.get(&h) {
                // Its full blocks were already counted as deduplicated; add the rest.
                let tail = size % self.block_size as u64;
                self.progress.dedup_bytes.fetch_add(tail, Ordering::Relaxed);
                self.chunks.truncate(first);
                self.pack_pieces.retain(|&i| i < first);
                if let Some(b) = self.shared.as_mut() {
                    match shared_mark {
                        Some((seq, len)) if seq == b.seq => b.data.truncate(len),
                        // Opened by this file: nothing else is in it.
                        _ => b.data.clear(),
                    }
                }
                return Ok((size, FileRange::SameAs(f)));
            }
            self.by_content.insert(h, file);
        }
        Ok((size, FileRange::Chunks(first as u64, count)))
    }

    /// The most hole chunks one hole is recorded with (each up to 4 GiB
    /// less a block, a chunk's length being 32 bits): a longer hole is
    /// left uncovered, which reads as zeros all the same (format.md §8.2),
    /// so a file's records follow its data, never its claimed size (a
    /// 4 EiB sparse file took a billion hole chunks, 24 GB).
    pub const MAX_HOLE_CHUNKS: u64 = 256;

    fn add_hole(&mut self, first: usize, mut at: u64, mut len: u64) {
        self.progress.hole_bytes.fetch_add(len, Ordering::Relaxed);
        // A chunk length is 32 bits: long holes become several chunks.
        let max = (u32::MAX as u64 / self.block_size as u64) * self.block_size as u64;
        if len / max >= Self::MAX_HOLE_CHUNKS {
            return;
        }
        while len > max {
            self.push_hole(first, at, max);
            at += max;
            len -= max;
        }
        self.push_hole(first, at, len);
    }

    fn push_hole(&mut self, first: usize, at: u64, len: u64) {
        let own = self.chunks.len() > first;
        if let Some(last) = self.chunks.last_mut().filter(|_| own) {
            if last.is_hole()
                && last.file_offset + last.len as u64 == at
                && last.len as u64 + len <= u32::MAX as u64
            {
                last.len += len as u32;
                return;
            }
        }
        self.chunks.push(Chunk {
            file_offset: at,
            block: HOLE,
            block_offset: 0,
            len: len as u32,
        });
    }

    /// Flush the last pack block, wait for all writes, and return the output,
    /// the block refs (by id), and the chunks with final block ids.
    pub fn finish(mut self) -> Result<Packed<W>, BuildError> {
        self.flush_shared()?;
        self.flush_pack()?;
        self.release_held(|_| true, 0)?;
        self.jobs = None;
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
        let (out, refs, (named, named_bases)) = match self.writer.take().expect("present").join() {
            Ok(r) => r?,
            Err(_) => return Err(BuildError::Option("image writer panicked".into())),
        };
        let mut dicts = Vec::new();
        for d in named {
            // Blocks name only dictionaries this packer compressed with or
            // copied blocks from (checked against their digests).
            let x = self
                .known_dicts
                .iter()
                .find(|k| *k.digest() == d)
                .ok_or_else(|| {
                    BuildError::Option(format!(
                        "a copied block names dictionary {}, which its image does not carry",
                        sheaf_format::hex(&d)
                    ))
                })?;
            dicts.push(x.clone());
        }
        let mut chunks = std::mem::take(&mut self.chunks);
        for c in &mut chunks {
            if !c.is_hole() {
                c.block = self.seq_to_id[c.block as usize];
            }
        }
        let mut bases = Vec::with_capacity(named_bases.len());
        for digest in named_bases {
            // Every base a written block names was a candidate or copied.
            let seq = self.bases.seq_of(&digest).ok_or_else(|| {
                BuildError::Option(format!(
                    "a reference block names base {}, which the image does not hold",
                    sheaf_format::hex(&digest)
                ))
            })?;
            bases.push(reference::Base {
                id: self.seq_to_id[seq as usize],
                digest,
            });
        }
        bases.sort_by_key(|b| b.id);
        Ok((out, refs, chunks, dicts, bases))
    }
}

impl<W: Write + Send + 'static> Drop for Packer<W> {
    /// A build that fails before [`Packer::finish`] still stops and joins
    /// its threads, so none outlives the build (writing into a file the
    /// caller has removed, or holding memory a long-running caller such as
    /// the snapshotter or an importer wants back).
    fn drop(&mut self) {
        self.jobs = None;
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

/// A file's bytes as [`Packer::add_file`] reads them, and what is known of
/// its holes without reading them.
pub trait FileData: Read {
    /// The length of the run of whole blocks of `bs` bytes from `at` (the
    /// bytes read so far, a multiple of `bs`) that are known to be zero
    /// (a hole), leaving the reader after them; zero if none or unknown.
    fn hole_blocks(&mut self, _at: u64, _bs: u64) -> std::io::Result<u64> {
        Ok(0)
    }
    /// The file's size, if known before reading.
    fn len_hint(&self) -> Option<u64> {
        None
    }
}

/// A reader whose holes are not known: every byte is read.
pub struct Dense<R>(pub R);

impl<R: Read> Read for Dense<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.0.read(buf)
    }
}

impl<R: Read> FileData for Dense<R> {}

/// A file on disk: its holes are found with `SEEK_DATA`.
impl FileData for std::fs::File {
    fn hole_blocks(&mut self, at: u64, bs: u64) -> std::io::Result<u64> {
        hole_blocks(self, at, bs)
    }
    fn len_hint(&self) -> Option<u64> {
        self.metadata().ok().map(|m| m.len())
    }
}

/// Length of the run of whole blocks at `at` (block-aligned) that lie in a
/// hole of `f`, leaving the file position after them. Zero if none.
fn hole_blocks(f: &std::fs::File, at: u64, bs: u64) -> std::io::Result<u64> {
    use std::os::unix::io::AsRawFd;
    let fd = f.as_raw_fd();
    // SAFETY: lseek on an fd we own; no memory is touched.
    let data = unsafe { libc::lseek(fd, at as libc::off_t, libc::SEEK_DATA) };
    let len = f.metadata()?.len();
    let data = if data < 0 {
        match std::io::Error::last_os_error().raw_os_error() {
            Some(libc::ENXIO) => len, // no data after `at`: the rest is a hole
            // Filesystems without SEEK_DATA: just read everything.
            _ => at,
        }
    } else {
        data as u64
    };
    let skip = (data.min(len).saturating_sub(at) / bs) * bs;
    // SAFETY: as above.
    if unsafe { libc::lseek(fd, (at + skip) as libc::off_t, libc::SEEK_SET) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(skip)
}

/// Read until `buf` is full or EOF; returns bytes read.
fn read_full<R: Read + ?Sized>(r: &mut R, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests;
