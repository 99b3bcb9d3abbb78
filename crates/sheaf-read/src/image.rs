//! An open image: verified access to metadata pages and data blocks.

use crate::cache::Cache;
use crate::error::ReadError;
use crate::source::{ObjectStore, Source};
use sheaf_format::build_info::BuildInfo;
use sheaf_format::dict::{self, Dictionary};
use sheaf_format::remote::ImageIndex;
use sheaf_format::signatures::{self, SigFooter, SIG_FOOTER_LEN};
use sheaf_format::superblock::level_lengths;
use sheaf_format::{
    BlockRef, ChunkRecord, Digest, FileType, FormatError, Header, InodeRecord, SectionEntry,
    SectionKind, StreamId, Superblock, Trailer, XattrSet, BLOCK_REF_LEN, HEADER_LEN, TRAILER_LEN,
};
use std::sync::{Arc, Mutex};

mod dicts;
mod load;
mod stream;

/// How much of the file's tail to read on open; usually covers the trailer,
/// section table and superblock in one request.
const TAIL_READ: u64 = 64 * 1024;

/// Cache sizes for an [`Image`].
#[derive(Debug, Clone, Copy)]
pub struct ImageOptions {
    /// Bytes of decoded data blocks to keep.
    pub block_cache_bytes: usize,
    /// Bytes of decoded metadata pages to keep.
    pub page_cache_bytes: usize,
}

impl Default for ImageOptions {
    fn default() -> Self {
        ImageOptions {
            block_cache_bytes: 256 << 20,
            page_cache_bytes: 64 << 20,
        }
    }
}

/// A decoded inode with its number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Inode {
    /// Inode number (root is the superblock's root inode, 0).
    pub ino: u32,
    /// The record.
    pub rec: InodeRecord,
}

impl Inode {
    /// File type.
    pub fn file_type(&self) -> FileType {
        self.rec.file_type().expect("validated on decode")
    }

    /// The size stat(2) shows: the record's for files, symlinks and
    /// directories; 0 for the rest (their record holds a device number).
    pub fn stat_size(&self) -> u64 {
        match self.file_type() {
            FileType::Regular | FileType::Symlink | FileType::Directory => self.rec.size,
            _ => 0,
        }
    }

    /// The 512-byte blocks stat(2) shows: the size rounded up (an image
    /// allocates nothing per file a reader could count instead).
    pub fn stat_blocks(&self) -> u64 {
        self.stat_size().div_ceil(512)
    }
}

/// One directory entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// Name bytes.
    pub name: Vec<u8>,
    /// Target inode.
    pub ino: u32,
    /// Target type.
    pub file_type: FileType,
}

/// An open, verified image. Cheap to share between threads (`Arc<Image>`).
pub struct Image {
    src: Arc<dyn Source>,
    sb: Superblock,
    sections: Vec<SectionEntry>,
    table_offset: u64,
    root_digest: Digest,
    levels: [Vec<u64>; 5],
    /// Level-0 page refs read so far (`stream`).
    page_refs: stream::PageRefs,
    pages: Cache,
    blocks: Arc<Cache>,
    /// Where the image's own bytes end (before any signature block).
    image_len: u64,
    signatures: Vec<Vec<u8>>,
    /// The byte ranges `open` read: with objects, enough to open again.
    index: ImageIndex,
    store: Option<Arc<dyn ObjectStore>>,
    /// The dictionary section's dictionaries (format.md §4, kind 4).
    dicts: Vec<Arc<Dictionary>>,
    /// Dictionaries not in the section that objects from a shared store or
    /// repository named, found as objects by their digest.
    foreign: Mutex<Vec<Arc<Dictionary>>>,
    /// The reference-base section: which block holds the content a
    /// reference block names (format.md §7.2).
    bases: Vec<sheaf_format::reference::Base>,
    bases_by_digest: std::collections::HashMap<Digest, u32>,
    /// Bases whose content was checked against their digest
    /// ([`sheaf_format::DictLookup::reference_known`]).
    bases_checked: Mutex<std::collections::HashSet<Digest>>,
}

/// The text signed for an image with root digest `root`.
pub fn signed_message(root: &Digest) -> String {
    format!("sheaf-root-v1 blake3:{}\n", sheaf_format::hex(root))
}

impl std::fmt::Debug for Image {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Image")
            .field("name", &self.src.name())
            .finish()
    }
}

impl Image {
    /// Open an image with default cache sizes.
    pub fn open(src: Arc<dyn Source>) -> Result<Image, ReadError> {
        Self::open_with(src, ImageOptions::default())
    }

    /// Open an image: reads the header, the tail (trailer, section table,
    /// superblock) and verifies the section table and superblock hashes.
    /// Touches a bounded number of byte ranges whatever the image size.
    pub fn open_with(src: Arc<dyn Source>, opts: ImageOptions) -> Result<Image, ReadError> {
        let name = src.name().to_string();
        let fmt = |what: &str, e: FormatError| ReadError::format(&name, what, e);
        let len = src.len();
        if len < (HEADER_LEN + TRAILER_LEN) as u64 {
            // Too small to be one: unless it begins as one (or is empty,
            // which is said in those words), not an image.
            let mut head = vec![0u8; len.min(8) as usize];
            read_at(&*src, &mut head, 0)?;
            if !sheaf_format::layout::HEADER_MAGIC.starts_with(&head) {
                return Err(not_an_image(&*src, len));
            }
            return Err(ReadError::format(
                &name,
                "file",
                FormatError::invalid(
                    "image",
                    format!("{len} bytes is too small to be a sheaf image"),
                ),
            ));
        }
        let mut index = ImageIndex {
            file_len: len,
            ranges: Vec::new(),
        };
        let mut head = [0u8; HEADER_LEN];
        read_at(&*src, &mut head, 0)?;
        index.add(0, &head);
        match Header::decode(&head) {
            Err(FormatError::BadMagic(_)) => return Err(not_an_image(&*src, len)),
            r => r.map_err(|e| fmt("header", e))?,
        };
        let file_len = len;
        let tail_len = TAIL_READ.min(len - HEADER_LEN as u64);
        let mut tail_start = len - tail_len;
        let mut tail = vec![0u8; tail_len as usize];
        read_at(&*src, &mut tail, tail_start)?;
        index.add(tail_start, &tail);
        // A signed image ends with a signature block after its trailer.
        let mut signatures = Vec::new();
        let len = if SigFooter::present(&tail) {
            let f = SigFooter::decode(&tail[tail.len() - SIG_FOOTER_LEN..], file_len)
                .map_err(|e| fmt("signature block", e))?;
            if f.image_len < (HEADER_LEN + TRAILER_LEN) as u64 {
                return Err(fmt(
                    "signature block",
                    FormatError::invalid("signature footer", "image length too small"),
                ));
            }
            // Bytes [off, off+n) from the tail already read, else from the
            // source: a few signatures usually sit in the tail with the trailer.
            let range = |off: u64, n: u64| -> Result<Vec<u8>, ReadError> {
                if off >= tail_start {
                    let s = (off - tail_start) as usize;
                    Ok(tail[s..s + n as usize].to_vec())
                } else {
                    let mut b = vec![0u8; n as usize];
                    read_at(&*src, &mut b, off)?;
                    Ok(b)
                }
            };
            let block = range(f.offset, f.len)?;
            index.add(f.offset, &block);
            signatures =
                signatures::decode_entries(&block, &f).map_err(|e| fmt("signature block", e))?;
            // The image's own tail, which the signature block moved back.
            let want = TAIL_READ.min(f.image_len - HEADER_LEN as u64);
            let start = f.image_len - want;
            tail = range(start, want)?;
            tail_start = start;
            index.add(tail_start, &tail);
            f.image_len
        } else {
            len
        };
        let trailer = Trailer::decode(&tail[tail.len() - TRAILER_LEN..], len).map_err(|e| {
            // The header was a sheaf image's: most likely a copy or a build
            // that stopped short, which is worth saying in those words.
            let e = match e {
                FormatError::BadMagic(_) => FormatError::invalid(
                    "image",
                    format!(
                        "truncated or not completely written: it begins as a sheaf image, \
                         but its {len} bytes do not end with a trailer"
                    ),
                ),
                e => e,
            };
            fmt("trailer", e)
        })?;
        // Bytes [off, off+n) from the tail buffer if there, else from the source.
        let mut fetch = |off: u64, n: usize| -> Result<Vec<u8>, ReadError> {
            if off >= tail_start {
                let s = (off - tail_start) as usize;
                Ok(tail[s..s + n].to_vec())
            } else {
                let mut b = vec![0u8; n];
                read_at(&*src, &mut b, off)?;
                index.add(off, &b);
                Ok(b)
            }
        };
        let table = fetch(trailer.table_offset, trailer.table_len())?;
        if sheaf_format::digest(&table) != trailer.root_digest {
            return Err(fmt(
                "section table",
                FormatError::HashMismatch("against the root digest".into()),
            ));
        }
        let sections = SectionEntry::decode_table(&table, trailer.table_offset)
            .map_err(|e| fmt("section table", e))?;
        // A section's bytes, at most `max` of them, checked against its digest.
        let mut load =
            |s: &SectionEntry, max: usize, what: &'static str| -> Result<Vec<u8>, ReadError> {
                let n = usize::try_from(s.length)
                    .ok()
                    .filter(|&n| n <= max)
                    .ok_or_else(|| fmt(what, FormatError::invalid(what, "too large")))?;
                let b = fetch(s.offset, n)?;
                if sheaf_format::digest(&b) != s.hash {
                    return Err(fmt(what, FormatError::HashMismatch(String::new())));
                }
                Ok(b)
            };
        let mut sb = None;
        let mut dicts = None;
        let mut bases_bytes = None;
        for s in &sections {
            match s.kind {
                SectionKind::Dictionaries => {
                    let max = dict::MAX_DICTS as usize * (dict::MAX_DICT_LEN + 4) + 4;
                    let b = load(s, max, "dictionary section")?;
                    if dicts.is_some() {
                        return Err(fmt(
                            "section table",
                            FormatError::invalid("section table", "two dictionary sections"),
                        ));
                    }
                    dicts =
                        Some(dict::decode_section(&b).map_err(|e| fmt("dictionary section", e))?);
                }
                SectionKind::RefBases => {
                    if bases_bytes.is_some() {
                        return Err(fmt(
                            "section table",
                            FormatError::invalid("section table", "two reference-base sections"),
                        ));
                    }
                    // At most one entry per block (checked with the count below).
                    let max = 4 + (u32::MAX as usize) * sheaf_format::reference::BASE_ENTRY_LEN;
                    bases_bytes = Some(load(s, max, "reference-base section")?);
                }
                SectionKind::Superblock => {
                    let b = load(s, 1 << 20, "superblock")?;
                    sb = Some(Superblock::decode(&b).map_err(|e| fmt("superblock", e))?);
                }
                SectionKind::Other(k) if s.required() => {
                    return Err(fmt(
                        "section table",
                        FormatError::UnknownFeature(format!("required section kind {k}")),
                    ));
                }
                _ => {}
            }
        }
        let sb = sb.ok_or_else(|| {
            fmt(
                "section table",
                FormatError::invalid("section table", "no superblock"),
            )
        })?;
        let bases = match bases_bytes {
            Some(b) => sheaf_format::reference::decode_section(&b, sb.block_count)
                .map_err(|e| fmt("reference-base section", e))?,
            None => Vec::new(),
        };
        let bases_by_digest = bases.iter().map(|b| (b.digest, b.id)).collect();
        let levels = StreamId::ALL.map(|id| level_lengths(sb.stream(id).len, sb.page_size));
        Ok(Image {
            src,
            sections,
            table_offset: trailer.table_offset,
            root_digest: trailer.root_digest,
            page_refs: stream::page_refs(&sb, &levels),
            levels,
            sb,
            pages: Cache::new(opts.page_cache_bytes),
            blocks: Arc::new(Cache::new(opts.block_cache_bytes)),
            image_len: len,
            signatures,
            index,
            store: None,
            dicts: dicts.unwrap_or_default(),
            foreign: Default::default(),
            bases,
            bases_by_digest,
            bases_checked: Mutex::default(),
        })
    }

    /// Consult and fill `store` (a node's disk cache) for pages and blocks.
    pub fn with_store(mut self, store: Arc<dyn ObjectStore>) -> Self {
        self.store = Some(store);
        self
    }

    /// The object store in use, if any.
    pub fn store(&self) -> Option<&Arc<dyn ObjectStore>> {
        self.store.as_ref()
    }

    /// The byte ranges needed to open this image again without it (header,
    /// tail, signature block) plus every section, read and verified now if
    /// `open` did not already hold them. With the objects of all refs, this
    /// index stands in for the image (`sheaf publish`, offline re-mounts).
    pub fn index(&self) -> Result<ImageIndex, ReadError> {
        let mut idx = self.index.clone();
        for s in &self.sections {
            let mut probe = vec![0u8; s.length.min(1 << 20) as usize];
            if s.length > 1 << 20 || !idx.read(&mut probe, s.offset) {
                let b = self.check_section(s)?;
                idx.add(s.offset, &b);
            }
        }
        Ok(idx)
    }

    /// Signatures appended to the image (OpenSSH `SSHSIG` PEM texts), in
    /// the order they were added. Not verified here: see `sheaf-trust`.
    pub fn signatures(&self) -> &[Vec<u8>] {
        &self.signatures
    }

    /// The message a signature signs: the root digest, in a fixed text form
    /// that `sheaf root` prints, so `ssh-keygen -Y sign/verify` can sign and
    /// check it too.
    pub fn signed_message(&self) -> String {
        signed_message(&self.root_digest)
    }

    /// The source's name (path or URL).
    pub fn name(&self) -> &str {
        self.src.name()
    }
    /// Whether any inode may carry xattrs (false when the builder recorded
    /// that none does: [`sheaf_format::superblock::OPT_NO_XATTRS`]).
    pub fn has_xattrs(&self) -> bool {
        self.sb.optional_features & sheaf_format::superblock::OPT_NO_XATTRS == 0
    }

    /// The superblock.
    pub fn superblock(&self) -> &Superblock {
        &self.sb
    }
    /// The root digest: BLAKE3 of the section table, which covers everything.
    pub fn root_digest(&self) -> Digest {
        self.root_digest
    }

    /// The rule of every open after the first: an image is opened once
    /// (where the policy decides), and from then on it is its root digest.
    /// A later open of the same name (the mount of `run --image`, a child
    /// mount of the snapshotter or of `pool load`, a share bcast reads)
    /// that finds another root is refused: a server that answers two
    /// requests with two images gets nothing from the second.
    pub fn expect_root(&self, root: &Digest) -> Result<(), ReadError> {
        if self.root_digest == *root {
            return Ok(());
        }
        Err(ReadError::RootChanged {
            image: self.name().to_string(),
            found: sheaf_format::hex(&self.root_digest),
            expected: sheaf_format::hex(root),
        })
    }
    /// Image file size (including any signature block).
    pub fn len(&self) -> u64 {
        self.src.len()
    }
    /// Where the image's own bytes end: its length without signatures.
    pub fn image_len(&self) -> u64 {
        self.image_len
    }
    /// Whether the image file is empty (never, for an opened image).
    pub fn is_empty(&self) -> bool {
        self.src.len() == 0
    }
    /// The section table.
    pub fn sections(&self) -> &[SectionEntry] {
        &self.sections
    }
    /// The data block cache (shareable between images).
    pub fn block_cache(&self) -> &Arc<Cache> {
        &self.blocks
    }

    /// Use `cache` for data blocks instead of this image's own, so several
    /// images (layers, versions of a stack) share one memory budget and one
    /// copy of every block they have in common (keys are content digests).
    pub fn with_block_cache(mut self, cache: Arc<Cache>) -> Self {
        self.blocks = cache;
        self
    }
    /// The metadata page cache.
    pub fn page_cache(&self) -> &Cache {
        &self.pages
    }

    /// Build options recorded in the image: the default when the image
    /// has none or they are not readable JSON (they are informative only),
    /// an error when the section fails its check.
    pub fn build_info(&self) -> Result<BuildInfo, ReadError> {
        let Some(s) = self
            .sections
            .iter()
            .find(|s| s.kind == SectionKind::BuildInfo)
        else {
            return Ok(BuildInfo::default());
        };
        Ok(BuildInfo::decode(&self.check_section(s)?))
    }

    /// The data blocks the image asks mounts to fetch ahead (its prefetch
    /// section, written by `sheaf build --prefetch`), in order; empty if none.
    pub fn prefetch_list(&self) -> Result<Vec<u32>, ReadError> {
        let Some(s) = self
            .sections
            .iter()
            .find(|s| s.kind == SectionKind::Prefetch)
        else {
            return Ok(Vec::new());
        };
        let b = self.check_section(s)?;
        let bad = |d: &str| {
            ReadError::format(
                self.name(),
                "prefetch section",
                FormatError::invalid("prefetch list", d.to_string()),
            )
        };
        if b.len() % 4 != 0 {
            return Err(bad("length is not a multiple of 4"));
        }
        b.chunks_exact(4)
            .map(|c| {
                let id = u32::from_le_bytes(c.try_into().expect("4 bytes"));
                if (id as u64) < self.sb.block_count {
                    Ok(id)
                } else {
                    Err(bad("block id beyond the image"))
                }
            })
            .collect()
    }

    /// Read a section (up to 16 MiB) and check it against its digest.
    pub fn check_section(&self, s: &SectionEntry) -> Result<Vec<u8>, ReadError> {
        let what = format!("section {}", s.kind.id());
        let n = usize::try_from(s.length)
            .ok()
            .filter(|&n| n <= 16 << 20)
            .ok_or_else(|| {
                ReadError::format(
                    self.name(),
                    &what,
                    FormatError::invalid("section", "too large"),
                )
            })?;
        let mut b = vec![0u8; n];
        read_at(&*self.src, &mut b, s.offset)?;
        if sheaf_format::digest(&b) != s.hash {
            return Err(ReadError::format(
                self.name(),
                &what,
                FormatError::HashMismatch(format!("(section kind {:?})", s.kind)),
            ));
        }
        Ok(b)
    }

    /// Stat one inode.
    pub fn inode(&self, ino: u32) -> Result<Inode, ReadError> {
        if ino as u64 >= self.sb.inode_count {
            return Err(ReadError::NoInode(ino));
        }
        let rec = self.record(
            StreamId::Inodes,
            ino as u64,
            InodeRecord::LEN,
            InodeRecord::decode,
        )?;
        Ok(Inode { ino, rec })
    }

    /// The root directory (a directory that is its own parent).
    pub fn root(&self) -> Result<Inode, ReadError> {
        let r = self.inode(self.sb.root_inode)?;
        if r.file_type() != FileType::Directory || r.rec.parent != r.ino {
            return Err(self.tree_error(
                r.ino,
                "the root is not a directory that is its own parent".into(),
            ));
        }
        Ok(r)
    }

    pub(crate) fn corrupt_inode(&self, ino: u32, detail: &str) -> ReadError {
        ReadError::format(
            self.name(),
            &format!("inode {ino}"),
            FormatError::invalid("inode", detail),
        )
    }

    /// The data blocks a regular file uses, in file order (no repeats).
    pub fn file_blocks(&self, ino: &Inode) -> Result<Vec<u32>, ReadError> {
        let (start, n) = self.file_chunks(ino)?;
        let mut v: Vec<u32> = Vec::new();
        for c in self.records(
            StreamId::Chunks,
            start,
            n as usize,
            ChunkRecord::LEN,
            ChunkRecord::decode,
        )? {
            if !c.is_hole() && v.last() != Some(&c.block) {
                v.push(c.block);
            }
        }
        Ok(v)
    }

    /// Target of a symlink.
    pub fn read_link(&self, ino: &Inode) -> Result<Vec<u8>, ReadError> {
        if ino.file_type() != FileType::Symlink {
            return Err(ReadError::NotASymlink(ino.ino));
        }
        let n = usize::try_from(ino.rec.size).ok().filter(|&n| n <= 1 << 20);
        let n = n.ok_or_else(|| self.corrupt_inode(ino.ino, "symlink target too long"))?;
        self.heap(ino.rec.data, n)
    }

    /// Extended attributes of an inode, sorted by name.
    pub fn xattrs(&self, ino: &Inode) -> Result<XattrSet, ReadError> {
        if ino.rec.xattr == 0 {
            return Ok(XattrSet::default());
        }
        let off = ino.rec.xattr - 1;
        let pre = self.heap(off, XattrSet::PREFIX)?;
        let total = u32::from_le_bytes(pre[..4].try_into().expect("4 bytes")) as usize;
        if !(8..=16 << 20).contains(&total) {
            return Err(self.corrupt_inode(ino.ino, "xattr set length"));
        }
        let b = self.heap(off, total)?;
        XattrSet::decode(&b)
            .map_err(|e| ReadError::format(self.name(), &format!("xattrs of inode {}", ino.ino), e))
    }

    /// Chunk record `idx`.
    pub fn chunk(&self, idx: u64) -> Result<ChunkRecord, ReadError> {
        self.record(StreamId::Chunks, idx, ChunkRecord::LEN, ChunkRecord::decode)
    }

    /// Data block `id`, decoded and verified, through the block cache.
    pub fn block(&self, id: u32) -> Result<Arc<Vec<u8>>, ReadError> {
        self.block_upto(id, 0, usize::MAX).map(|(b, _)| b)
    }

    /// Data block `id` decoded at least up to byte `end`, through the block
    /// cache, and its whole length; `start` is where the caller's bytes
    /// begin. A block whose digest names its stored bytes is decoded only as
    /// far as needed (a random read of a small file decodes half its pack on
    /// average). A later read past a decoded prefix decodes the block whole
    /// when it starts inside the prefix (reading on: one more decode, not
    /// one per piece), else at least twice as far as before (so at most a
    /// few decodes, together at most about twice the whole).
    pub fn block_upto(
        &self,
        id: u32,
        start: usize,
        end: usize,
    ) -> Result<(Arc<Vec<u8>>, u32), ReadError> {
        self.block_upto_for(id, start, end, end)
    }

    /// [`Image::block_upto`], where a first decode of the block goes at
    /// least to `first_end` (the end of the file's piece, for a read that
    /// streams it, [`STREAM_READ`]; [`decode_upto`]).
    fn block_upto_for(
        &self,
        id: u32,
        start: usize,
        end: usize,
        first_end: usize,
    ) -> Result<(Arc<Vec<u8>>, u32), ReadError> {
        let r = self.block_ref(id)?;
        let what = || format!("data block {id}");
        let need = self.block_need(&r, end);
        let further = self.block_need(&r, first_end.max(end));
        let b = self
            .blocks
            .get_or_load_min(&r.key(), need, need, |buf, prior| {
                let upto = decode_upto(start, need, further, prior);
                self.load_ref_into(&r, self.sb.block_size, &what, buf, upto)
            })?;
        Ok((b, r.ulen))
    }

    /// How much of block `r` a read that ends at `end` needs decoded. Part
    /// of a block pays only where its stored bytes can be had again cheaply
    /// (a local image, a node cache); else a later read would fetch them
    /// twice, so the whole.
    fn block_need(&self, r: &BlockRef, end: usize) -> usize {
        if self.src.local() || self.store.is_some() {
            end.min(r.ulen as usize)
        } else {
            r.ulen as usize
        }
    }

    /// Whether data block `id` is held in the block cache only as a prefix
    /// (decoded as far as reads needed so far, not whole).
    pub fn block_is_prefix(&self, id: u32) -> bool {
        self.block_ref(id).is_ok_and(|r| {
            self.blocks
                .held_len(&r.key())
                .is_some_and(|n| n < r.ulen as usize)
        })
    }

    /// The ref of data block `id`.
    pub fn block_ref(&self, id: u32) -> Result<BlockRef, ReadError> {
        if id as u64 >= self.sb.block_count {
            return Err(ReadError::format(
                self.name(),
                "chunk",
                FormatError::invalid("block id", id.to_string()),
            ));
        }
        let b = self.read_stream(
            StreamId::Blocks,
            id as u64 * BLOCK_REF_LEN as u64,
            BLOCK_REF_LEN,
        )?;
        BlockRef::decode(&b)
            .map_err(|e| ReadError::format(self.name(), &format!("data block {id} ref"), e))
    }

    fn file_chunks(&self, ino: &Inode) -> Result<(u64, u64), ReadError> {
        if ino.file_type() != FileType::Regular {
            return Err(ReadError::NotAFile(ino.ino));
        }
        let (start, n) = (ino.rec.data, ino.rec.count as u64);
        if start.checked_add(n).is_none_or(|e| e > self.sb.chunk_count) {
            return Err(self.corrupt_inode(ino.ino, "chunks out of range"));
        }
        Ok((start, n))
    }

    /// Read up to `buf.len()` bytes of a regular file at `offset`; returns the
    /// number of bytes read (short only at end of file).
    pub fn read(&self, ino: &Inode, offset: u64, buf: &mut [u8]) -> Result<usize, ReadError> {
        self.read_with(ino, offset, buf, &mut |_, _| {})
    }

    /// [`Image::read`], calling `on_block` with the id of each data block it
    /// uses, in file order, and whether the file has a later chunk (data in
    /// another block) after it (readahead policy lives with the caller).
    pub fn read_with(
        &self,
        ino: &Inode,
        offset: u64,
        buf: &mut [u8],
        on_block: &mut dyn FnMut(u32, bool),
    ) -> Result<usize, ReadError> {
        let mut at = 0;
        self.read_pieces(ino, offset, buf.len(), on_block, &mut |p| {
            let n = p.len();
            match p {
                Piece::Bytes(b, r) => buf[at..at + n].copy_from_slice(&b[r]),
                Piece::Zeros(_) => buf[at..at + n].fill(0),
            }
            at += n;
        })
    }

    /// The bytes of a read, `len` from `offset` (fewer at the end of the
    /// file), as [`Image::read_pieces`] finds them: shared with the block
    /// cache when they lie in one block (most reads), else gathered into a
    /// buffer of their own.
    pub fn read_bytes(
        &self,
        ino: &Inode,
        offset: u64,
        len: usize,
        on_block: &mut dyn FnMut(u32, bool),
    ) -> Result<ReadBytes, ReadError> {
        let mut pieces: Vec<Piece> = Vec::with_capacity(2);
        let n = self.read_pieces(ino, offset, len, on_block, &mut |p| pieces.push(p))?;
        if let [Piece::Bytes(b, r)] = pieces.as_slice() {
            return Ok(ReadBytes::Shared(b.clone(), r.clone()));
        }
        let mut buf = Vec::with_capacity(n);
        for p in &pieces {
            match p {
                Piece::Bytes(b, r) => buf.extend_from_slice(&b[r.clone()]),
                Piece::Zeros(z) => buf.resize(buf.len() + z, 0),
            }
        }
        Ok(ReadBytes::Owned(buf))
    }

    /// The bytes of a read, `len` from `offset` (fewer at the end of the
    /// file), handed to `sink` in file order as pieces that together cover
    /// exactly the bytes returned: slices of cached blocks, and zeros for
    /// holes and gaps between chunks. A caller that can send a slice as it
    /// is (a FUSE reply of one piece) copies nothing. `on_block` as for
    /// [`Image::read_with`].
    pub fn read_pieces(
        &self,
        ino: &Inode,
        offset: u64,
        len: usize,
        on_block: &mut dyn FnMut(u32, bool),
        sink: &mut dyn FnMut(Piece),
    ) -> Result<usize, ReadError> {
        self.read_pieces_via(ino, offset, len, on_block, sink, &mut |id, s, e, p| {
            self.block_upto_for(id, s, e, p)
        })
    }

    /// [`Image::read_pieces`] with data blocks decoded into `scratch`, not
    /// the block cache (a block the cache holds far enough is taken from
    /// it): for a stream of reads in block order that will not come back
    /// (`read_many` of a training list), which then reuses one buffer per
    /// thread instead of filling the cache with fresh memory (a third of
    /// such a run's time went to page faults). The same checks and the same
    /// prefix rule as [`Image::block_upto`].
    pub fn read_pieces_scratch(
        &self,
        ino: &Inode,
        offset: u64,
        len: usize,
        scratch: &mut BlockScratch,
        sink: &mut dyn FnMut(Piece),
    ) -> Result<usize, ReadError> {
        self.read_pieces_via(
            ino,
            offset,
            len,
            &mut |_, _| {},
            sink,
            &mut |id, s, e, p| self.block_upto_scratch(id, s, e, p, scratch),
        )
    }

    fn block_upto_scratch(
        &self,
        id: u32,
        start: usize,
        end: usize,
        first_end: usize,
        scratch: &mut BlockScratch,
    ) -> Result<(Arc<Vec<u8>>, u32), ReadError> {
        let r = self.block_ref(id)?;
        let key = r.key();
        let need = self.block_need(&r, end);
        let further = self.block_need(&r, first_end.max(end));
        let prior = (scratch.key == Some(key)).then(|| scratch.bytes.len());
        if prior.is_some_and(|p| p >= need) {
            return Ok((scratch.bytes.clone(), r.ulen));
        }
        if let Some(b) = self.blocks.peek(&key).filter(|b| b.len() >= need) {
            return Ok((b, r.ulen));
        }
        let upto = decode_upto(start, need, further, prior);
        // The buffer back from the last piece (the sink has let it go),
        // or a new one if a caller still holds it.
        let mut buf = Arc::get_mut(&mut scratch.bytes)
            .map(std::mem::take)
            .unwrap_or_default();
        buf.clear();
        scratch.key = None;
        let what = || format!("data block {id}");
        let b = self.load_ref_into(&r, self.sb.block_size, &what, buf, upto)?;
        scratch.bytes = Arc::new(b);
        scratch.key = Some(key);
        Ok((scratch.bytes.clone(), r.ulen))
    }

    fn read_pieces_via(
        &self,
        ino: &Inode,
        offset: u64,
        len: usize,
        on_block: &mut dyn FnMut(u32, bool),
        sink: &mut dyn FnMut(Piece),
        block_upto: &mut BlockGet<'_>,
    ) -> Result<usize, ReadError> {
        let (start, n) = self.file_chunks(ino)?;
        let size = ino.rec.size;
        if offset >= size || len == 0 {
            return Ok(0);
        }
        let want = len.min((size - offset) as usize);
        // Last chunk starting at or before `offset`.
        let (mut lo, mut hi) = (0u64, n);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.chunk(start + mid)?.file_offset <= offset {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        let mut i = lo.saturating_sub(1);
        let end = offset + want as u64;
        // Bytes before `done` have gone to `sink`.
        let mut done = offset;
        while i < n {
            let c = self.chunk(start + i)?;
            if c.file_offset >= end {
                break;
            }
            let c_end = c.file_offset.checked_add(c.len as u64);
            let c_end = c_end
                .filter(|&e| e <= size)
                .ok_or_else(|| self.corrupt_inode(ino.ino, "chunk beyond file size"))?;
            // Chunks are sorted and do not overlap in a valid image; a chunk
            // reaching back before `done` is read from `done` on.
            let from = done.max(c.file_offset);
            let to = end.min(c_end);
            if from < to && !c.is_hole() {
                on_block(c.block, i + 1 < n);
                let bs = c.block_offset as usize + (from - c.file_offset) as usize;
                let be = bs + (to - from) as usize;
                // The file's piece of the block; a read from its start of a
                // stream's size decodes it all the first time.
                let (ps, pe) = (
                    c.block_offset as usize,
                    c.block_offset as usize + c.len as usize,
                );
                let first_end = if bs == ps && be - bs >= STREAM_READ {
                    pe
                } else {
                    be
                };
                let (block, ulen) = block_upto(c.block, bs, be, first_end)?;
                if pe > ulen as usize {
                    return Err(self.corrupt_inode(ino.ino, "chunk beyond its block"));
                }
                if from > done {
                    sink(Piece::Zeros((from - done) as usize));
                }
                sink(Piece::Bytes(block, bs..be));
                done = to;
            }
            i += 1;
        }
        if done < end {
            sink(Piece::Zeros((end - done) as usize));
        }
        Ok(want)
    }
}

/// How far to decode a block a read needs up to `need` of (from `start`),
/// `prior` bytes of it having been decoded before: the first time, just
/// `need`, or `further` (the end of the file's piece) for a read that
/// streams the piece from its start (the file's next read then finds it
/// decoded: 5000 random files of tree V decoded 857 MiB instead of 985,
/// docs/design.md); whole when the read starts inside the prefix (reading
/// on: one more decode, not one per piece); else at least twice as far as
/// before (a few decodes, together at most about twice the whole).
fn decode_upto(start: usize, need: usize, further: usize, prior: Option<usize>) -> usize {
    match prior {
        None => further,
        Some(p) if start <= p => usize::MAX,
        Some(p) => need.max(2 * p),
    }
}

/// A read of at least this many bytes from the start of a file's piece of a
/// block is taken for a stream through it (`cat`, `cp`, a loader reading a
/// whole module).
const STREAM_READ: usize = 128 << 10;

/// How [`Image::read_pieces_via`] gets data block `id` decoded at least over
/// `[start, end)`, a first decode at least to the fourth argument
/// ([`Image::block_upto_for`]), with its whole length.
type BlockGet<'a> =
    dyn FnMut(u32, usize, usize, usize) -> Result<(Arc<Vec<u8>>, u32), ReadError> + 'a;

/// One thread's data block decoded outside the block cache, its buffer
/// reused from read to read ([`Image::read_pieces_scratch`]).
#[derive(Debug, Default)]
pub struct BlockScratch {
    /// The cache key of the block held, if one is.
    key: Option<Digest>,
    bytes: Arc<Vec<u8>>,
}

/// The bytes of one read ([`Image::read_bytes`]).
#[derive(Debug, Clone)]
pub enum ReadBytes {
    /// Bytes `range` of a decoded block held by the cache.
    Shared(Arc<Vec<u8>>, std::ops::Range<usize>),
    /// Bytes gathered from several pieces, or read from elsewhere.
    Owned(Vec<u8>),
}

impl std::ops::Deref for ReadBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            ReadBytes::Shared(b, r) => &b[r.clone()],
            ReadBytes::Owned(v) => v,
        }
    }
}

/// A stretch of a read's bytes ([`Image::read_pieces`]).
#[derive(Debug, Clone)]
pub enum Piece {
    /// Bytes `range` of a decoded block held by the cache.
    Bytes(Arc<Vec<u8>>, std::ops::Range<usize>),
    /// This many zero bytes: a hole, or a gap between chunks.
    Zeros(usize),
}

impl Piece {
    /// Its length in bytes.
    pub fn len(&self) -> usize {
        match self {
            Piece::Bytes(_, r) => r.len(),
            Piece::Zeros(n) => *n,
        }
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The error for a source that does not begin with a sheaf header: what
/// its first bytes say it is ([`sheaf_format::foreign::sniff`]).
fn not_an_image(src: &dyn Source, len: u64) -> ReadError {
    use sheaf_format::foreign::{sniff, SNIFF_LEN};
    let mut head = vec![0u8; len.min(SNIFF_LEN as u64) as usize];
    if let Err(e) = read_at(src, &mut head, 0) {
        return e;
    }
    ReadError::NotAnImage {
        image: src.name().to_string(),
        kind: sniff(&head),
    }
}

fn read_at(src: &dyn Source, buf: &mut [u8], off: u64) -> Result<(), ReadError> {
    src.read_exact_at(buf, off)
        .map_err(|e| io_error(src, e, off, buf.len()))
}

/// A source's failure to deliver bytes `[off, off+n)` as a [`ReadError`].
fn io_error(src: &dyn Source, e: std::io::Error, off: u64, n: usize) -> ReadError {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        ReadError::format(
            src.name(),
            "file",
            FormatError::invalid("image", format!("truncated (needed bytes {off}+{n})")),
        )
    } else {
        ReadError::Io {
            image: src.name().to_string(),
            cause: e,
        }
    }
}
