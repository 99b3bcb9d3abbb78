//! Reading a tar archive (plain, gzip, zstd, xz, bzip2) straight into a
//! [`Tree`], feeding file data to the packer in archive order so the archive
//! is never extracted and is read exactly once. Entries feed a
//! [`TreeBuilder`], which owns the rules for paths (`..`, absolute paths in
//! a layer), exclusions, implicit parent directories, duplicates and
//! hardlinks ([`crate::normalize`]); this module only decodes the archive.

use crate::dict;
use crate::normalize::{Absolute, TreeBuilder};
use crate::options::{BuildError, BuildOptions};
use crate::pack::{Dense, FileData, Packer};
use crate::scan::Problems;
use crate::tree::{Kind, NodeId, Tree};
use sheaf_format::XattrSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use tar::EntryType;

/// Wrap `r` in the decompressor its first bytes announce
/// ([`sheaf_format::foreign::sniff`]).
pub fn decompressor<'a>(r: impl Read + 'a) -> std::io::Result<Box<dyn Read + 'a>> {
    use sheaf_format::ForeignKind as K;
    let mut br = BufReader::with_capacity(1 << 20, r);
    let head = br.fill_buf()?.to_vec();
    Ok(match sheaf_format::foreign::sniff(&head) {
        Some(K::Gzip) => Box::new(flate2::read::MultiGzDecoder::new(br)),
        Some(K::Zstd) => Box::new(zstd::stream::read::Decoder::with_buffer(br)?),
        Some(K::Xz) => Box::new(liblzma::read::XzDecoder::new_multi_decoder(br)),
        Some(K::Bzip2) => Box::new(bzip2::read::MultiBzDecoder::new(br)),
        _ => Box::new(br),
    })
}

/// `r`, a decompressed archive named `name`, checked to begin with a tar
/// header (or to be an empty archive), else refused in words that say
/// what it is ([`BuildError::NotATar`]): its first block is read, and
/// given back in front of the rest.
fn tar_stream<'a>(
    mut r: Box<dyn Read + 'a>,
    name: &str,
    raw_head: &[u8],
) -> Result<Box<dyn Read + 'a>, BuildError> {
    let mut block = Vec::with_capacity(512);
    (&mut r)
        .take(512)
        .read_to_end(&mut block)
        .map_err(|e| BuildError::Input {
            path: name.to_string(),
            cause: e,
        })?;
    let empty = block.iter().all(|&b| b == 0) && (block.is_empty() || block.len() == 512);
    if !empty && !sheaf_format::foreign::is_tar_header(&block) {
        return Err(BuildError::NotATar {
            path: name.to_string(),
            kind: sheaf_format::foreign::sniff(raw_head),
        });
    }
    Ok(Box::new(std::io::Cursor::new(block).chain(r)))
}

/// Parse a PAX time value `SEC[.FRAC]`.
fn pax_time(v: &[u8]) -> Option<(i64, u32)> {
    let s = std::str::from_utf8(v).ok()?;
    let (sec, frac) = s.split_once('.').unwrap_or((s, ""));
    let sec: i64 = sec.parse().ok()?;
    let mut ns = 0u32;
    for (i, ch) in frac.chars().take(9).enumerate() {
        ns += ch.to_digit(10)? * 10u32.pow(8 - i as u32);
    }
    Some((sec, ns))
}

/// The first small files of a stream, held back until a pack dictionary is
/// trained on them ([`dict::STREAM_HOLD_BYTES`]): a directory is sampled
/// before packing starts, a stream can only be sampled from its start. Their
/// nodes are in the tree already; their kinds are set when they are packed.
struct HeldBack {
    /// Still holding (a dictionary is wanted and not yet trained).
    holding: bool,
    /// The files' bytes, one after another.
    data: Vec<u8>,
    /// Each file's node, the end of its bytes in `data`, and its
    /// similarity group ([`Packer::group`]).
    files: Vec<(NodeId, u32, Option<u64>)>,
}

impl HeldBack {
    fn new(train: bool) -> Self {
        HeldBack {
            holding: train,
            data: Vec::new(),
            files: Vec::new(),
        }
    }

    /// Enough to sample: [`dict::STREAM_HOLD_BYTES`], or so many files
    /// that their records would cost as much (tiny files).
    fn full(&self) -> bool {
        self.data.len() as u64 >= dict::STREAM_HOLD_BYTES
            || self.files.len() as u64 >= dict::STREAM_HOLD_BYTES / 32
    }

    /// Whether a member of this type and size is held back: plain files
    /// that go into packs, while holding.
    fn takes(&self, t: EntryType, size: u64, pack_size: u64) -> bool {
        self.holding
            && matches!(t, EntryType::Regular | EntryType::Continuous)
            && size > 0
            && size < pack_size
    }

    /// Train the dictionary on the files held (if there are enough of
    /// them), then pack them in archive order; stop holding.
    fn release<W: Write + Send + 'static>(
        &mut self,
        packer: &mut Packer<W>,
        tree: &mut Tree,
        pack_size: u64,
        name: &str,
        cancel: &std::sync::atomic::AtomicBool,
    ) -> Result<(), BuildError> {
        if !std::mem::take(&mut self.holding) {
            return Ok(());
        }
        let (data, files) = (
            std::mem::take(&mut self.data),
            std::mem::take(&mut self.files),
        );
        let start = |i: usize| if i == 0 { 0 } else { files[i - 1].1 as usize };
        let bytes = |i: usize| &data[start(i)..files[i].1 as usize];
        let sizes: Vec<u64> = (0..files.len()).map(|i| bytes(i).len() as u64).collect();
        let samples: Vec<&[u8]> = dict::pick_samples(&sizes, pack_size)
            .into_iter()
            .map(bytes)
            .collect();
        packer.set_dictionary(dict::train(&samples));
        for (i, &(id, _, group)) in files.iter().enumerate() {
            packer.set_group(group);
            // Read from memory: `name` (the archive) is only for messages.
            let (size, range) = packer.add_file(&mut Dense(bytes(i)), name, id, cancel)?;
            tree.nodes[id as usize].kind = tree.file_kind(size, range);
        }
        Ok(())
    }
}

/// Read a tar stream (compressed or not) into a tree, packing file data as
/// it goes.
pub fn read_tar<W: Write + Send + 'static>(
    input: impl Read,
    name: &str,
    opts: &BuildOptions,
    packer: &mut Packer<W>,
    problems: &mut Problems,
    cancel: &std::sync::atomic::AtomicBool,
) -> Result<Tree, BuildError> {
    let io = |e| BuildError::Input {
        path: name.to_string(),
        cause: e,
    };
    let mut br = BufReader::with_capacity(1 << 20, input);
    let raw_head = br.fill_buf().map_err(io)?.to_vec();
    let r = tar_stream(decompressor(br).map_err(io)?, name, &raw_head)?;
    read_entries(r, name, false, opts, packer, problems, cancel)
}

/// Read an image layer's decompressed tar stream into a tree (see
/// [`crate::TarStream`] for what differs from [`read_tar`]).
pub fn read_layer<W: Write + Send + 'static>(
    input: impl Read,
    name: &str,
    opts: &BuildOptions,
    packer: &mut Packer<W>,
    problems: &mut Problems,
    cancel: &std::sync::atomic::AtomicBool,
) -> Result<Tree, BuildError> {
    read_entries(input, name, true, opts, packer, problems, cancel)
}

fn read_entries<W: Write + Send + 'static>(
    input: impl Read,
    name: &str,
    layer: bool,
    opts: &BuildOptions,
    packer: &mut Packer<W>,
    problems: &mut Problems,
    cancel: &std::sync::atomic::AtomicBool,
) -> Result<Tree, BuildError> {
    let absolute = if layer {
        Absolute::Refuse
    } else {
        Absolute::Strip
    };
    let mut t = TreeBuilder::new(opts, absolute)?;
    let bad = |d: String| BuildError::BadInput {
        path: name.to_string(),
        detail: d,
    };
    let io = |e: std::io::Error| BuildError::Input {
        path: name.to_string(),
        cause: e,
    };
    let tap = Tap::new(input);
    let mut ar = tar::Archive::new(tap.clone());
    let mut count = 0u64;
    let pack_size = opts.pack_block_size() as u64;
    let mut held = HeldBack::new(opts.trains_dictionary());
    for entry in ar.entries().map_err(io)? {
        if cancel.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(BuildError::Interrupted);
        }
        let mut e = entry.map_err(|e| bad(format!("bad tar archive: {e}")))?;
        count += 1;
        let mut path = e.path_bytes().into_owned();
        // PAX records of this entry, read once.
        let pax: Vec<(Vec<u8>, Vec<u8>)> = match e.pax_extensions() {
            Ok(Some(p)) => p
                .flatten()
                .map(|x| (x.key_bytes().to_vec(), x.value_bytes().to_vec()))
                .collect(),
            _ => Vec::new(),
        };
        // A PAX 1.0 sparse member is stored under a made-up name.
        if let Some((_, v)) = pax.iter().rev().find(|(k, _)| k == b"GNU.sparse.name") {
            path = v.clone();
        }
        let shown = crate::normalize::shown(&path);
        let comps = match t.path(&path) {
            Ok(p) => p,
            Err(why) => {
                problems.handle(Path::new(&shown), std::io::Error::other(why.to_string()))?;
                continue;
            }
        };
        if t.excluded(&comps) {
            continue;
        }
        let h = e.header().clone();
        let etype = h.entry_type();
        let mut uid = h.uid().unwrap_or(0) as u32;
        let mut gid = h.gid().unwrap_or(0) as u32;
        let (mut sec, mut nsec) = (h.mtime().unwrap_or(0) as i64, 0u32);
        let mut xattrs = Vec::new();
        let mut sparse: Option<(Vec<u8>, u64)> = None; // PAX 1.0 sparse: real name, real size
        let mut sparse_major = None;
        for (k, v) in &pax {
            let (k, v) = (k.as_slice(), v.as_slice());
            let num = || std::str::from_utf8(v).ok()?.parse::<u32>().ok();
            match k {
                    b"uid" => uid = num().unwrap_or(uid),
                    b"gid" => gid = num().unwrap_or(gid),
                    b"mtime" => (sec, nsec) = pax_time(v).unwrap_or((sec, nsec)),
                    b"GNU.sparse.major" => sparse_major = Some(v.to_vec()),
                    b"GNU.sparse.name" => sparse.get_or_insert((Vec::new(), 0)).0 = v.to_vec(),
                    b"GNU.sparse.realsize" => {
                        sparse.get_or_insert((Vec::new(), 0)).1 = std::str::from_utf8(v)
                            .ok()
                            .and_then(|s| s.parse().ok())
                            .filter(|&n| n <= MAX_FILE_SIZE)
                            .ok_or_else(|| {
                                bad(format!("{shown}: bad GNU.sparse.realsize (at most {MAX_FILE_SIZE})"))
                            })?
                    }
                    b"GNU.sparse.size" | b"GNU.sparse.map" | b"GNU.sparse.numblocks" => {
                        return Err(bad(format!(
                            "{shown}: PAX sparse format 0.x is not supported; re-create the archive with GNU tar 1.28+ (--format=pax -S gives 1.0) or without -S"
                        )))
                    }
                    _ => {
                        if let Some(x) = k.strip_prefix(b"SCHILY.xattr.") {
                            xattrs.push((x.to_vec(), v.to_vec()));
                        }
                    }
                }
        }
        let perm = h.mode().unwrap_or(0o644) & 0o7777;
        let ifmt = match etype {
            EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse | EntryType::Link => {
                libc::S_IFREG
            }
            EntryType::Directory => libc::S_IFDIR,
            EntryType::Symlink => libc::S_IFLNK,
            EntryType::Char => libc::S_IFCHR,
            EntryType::Block => libc::S_IFBLK,
            EntryType::Fifo => libc::S_IFIFO,
            _ => continue, // PAX/GNU meta entries are consumed by the tar crate
        };
        let meta = t.meta(ifmt | perm, uid, gid, sec, nsec);
        let xattrs = t.tree.intern_xattrs(XattrSet(xattrs));
        if comps.is_root() && etype != EntryType::Directory {
            problems.handle(
                Path::new(&shown),
                std::io::Error::other("the root must be a directory"),
            )?;
            continue;
        }
        let parent = t.parent(&comps).map_err(bad)?;
        let mut kind = Kind::Special;
        match etype {
            EntryType::Directory => {
                t.put(
                    parent,
                    &comps,
                    meta,
                    Kind::Dir(Box::default()),
                    xattrs,
                    None,
                )
                .expect("a directory");
                continue;
            }
            EntryType::Link => {
                let target = e
                    .link_name_bytes()
                    .map(|c| c.into_owned())
                    .unwrap_or_default();
                match t.linked_path(&target) {
                    Some(target) if !comps.is_root() => t.link(parent, &comps, target),
                    _ => problems.handle(
                        Path::new(&shown),
                        std::io::Error::other(format!(
                            "hardlink target {} is not an earlier file in the archive",
                            String::from_utf8_lossy(&target)
                        )),
                    )?,
                }
                continue;
            }
            EntryType::Symlink => {
                let target = e
                    .link_name_bytes()
                    .map(|c| c.into_owned())
                    .unwrap_or_default();
                kind = Kind::Symlink(target.into());
            }
            EntryType::Char | EntryType::Block => {
                let major = h.device_major().ok().flatten().unwrap_or(0);
                let minor = h.device_minor().ok().flatten().unwrap_or(0);
                kind = Kind::Device(libc::makedev(major, minor));
            }
            EntryType::Fifo => {}
            _ => {
                let what = format!("{name}: {shown}");
                // The node this file becomes.
                let id = t.tree.nodes.len() as NodeId;
                packer.set_group_of(&comps.joined());
                let (size, range) = match (&sparse, sparse_major.as_deref()) {
                    _ if etype == EntryType::GNUSparse => {
                        let map = gnu_sparse_map(&h, &tap, e.raw_header_position())
                            .map_err(|e| bad(format!("{shown}: bad sparse map: {e}")))?;
                        let (segs, real) = map;
                        let mut r = SparseData::new(TapRaw(&tap), segs, real);
                        packer.add_file(&mut r, &what, id, cancel)?
                    }
                    (Some((_, real)), Some(b"1")) => {
                        let mut r = SparseData::pax(&mut e, *real)
                            .map_err(|e| bad(format!("{shown}: bad sparse map: {e}")))?;
                        packer.add_file(&mut r, &what, id, cancel)?
                    }
                    (Some(_), _) => {
                        return Err(bad(format!("{shown}: unsupported PAX sparse version")))
                    }
                    (None, _) if held.takes(etype, e.size(), pack_size) => {
                        e.read_to_end(&mut held.data).map_err(io)?;
                        // Its kind is set when it is packed (HeldBack::release).
                        held.files
                            .push((id, held.data.len() as u32, packer.group()));
                        t.put(parent, &comps, meta, kind, xattrs, None)
                            .expect("not the root");
                        if held.full() {
                            held.release(packer, &mut t.tree, pack_size, name, cancel)?;
                        }
                        continue;
                    }
                    (None, _) => packer.add_file(&mut Dense(&mut e), &what, id, cancel)?,
                };
                kind = t.tree.file_kind(size, range);
            }
        }
        t.put(parent, &comps, meta, kind, xattrs, None)
            .expect("not the root");
    }
    held.release(packer, &mut t.tree, pack_size, name, cancel)?;
    if count == 0 && !layer {
        return Err(bad("empty or not a tar archive".into()));
    }
    Ok(t.finish())
}

/// The largest file size a tar member may claim: a file's size is an
/// `off_t` on Linux, so no larger file can be extracted or served
/// (docs/build.md, "Limits on input").
pub const MAX_FILE_SIZE: u64 = i64::MAX as u64;

/// The most bytes of headers kept to read a GNU sparse member's map back
/// (its extension headers, 21 segments in each 512 bytes: 700,000 or so).
const TAP_LOG: usize = 16 << 20;

/// The archive as the tar reader sees it, shared with this module: it
/// keeps the last run of header-sized reads (so the extension headers of a
/// GNU sparse member, which the tar crate reads and does not hand over,
/// can be read back), and lets this module read a member's data itself
/// ([`TapRaw`]), the tar reader then being handed zeros in their place
/// when it skips over them. The tar crate expands a GNU sparse member's
/// holes into zeros byte by byte: a member claiming 1 EiB took forever.
struct Tap<R>(std::rc::Rc<std::cell::RefCell<TapState<R>>>);

struct TapState<R> {
    inner: R,
    /// Bytes the tar reader has read.
    pos: u64,
    /// The bytes at `log_start..pos`, read in header-sized reads.
    log: Vec<u8>,
    log_start: u64,
    /// Bytes read by [`TapRaw`] that the tar reader has still to skip.
    owed: u64,
}

impl<R> Clone for Tap<R> {
    fn clone(&self) -> Self {
        Tap(self.0.clone())
    }
}

impl<R: Read> Tap<R> {
    fn new(inner: R) -> Self {
        Tap(std::rc::Rc::new(std::cell::RefCell::new(TapState {
            inner,
            pos: 0,
            log: Vec::new(),
            log_start: 0,
            owed: 0,
        })))
    }

    /// The bytes the tar reader read from `from` on, if they are all kept.
    fn logged_since(&self, from: u64) -> Option<Vec<u8>> {
        let s = self.0.borrow();
        let skip = usize::try_from(from.checked_sub(s.log_start)?).ok()?;
        s.log.get(skip..).map(|b| b.to_vec())
    }
}

impl<R: Read> Read for Tap<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let mut s = self.0.borrow_mut();
        let s = &mut *s;
        if s.owed > 0 {
            let n = buf.len().min(usize::try_from(s.owed).unwrap_or(usize::MAX));
            buf[..n].fill(0);
            s.owed -= n as u64;
            s.pos += n as u64;
            s.log.clear();
            s.log_start = s.pos;
            return Ok(n);
        }
        let n = s.inner.read(buf)?;
        if buf.len() <= 512 {
            if s.log.len() + n > TAP_LOG {
                let drop = s.log.len() / 2;
                s.log.drain(..drop);
                s.log_start += drop as u64;
            }
            s.log.extend_from_slice(&buf[..n]);
        } else {
            s.log.clear();
            s.log_start = s.pos + n as u64;
        }
        s.pos += n as u64;
        Ok(n)
    }
}

/// Reads the current member's data past the tar reader (see [`Tap`]).
struct TapRaw<'a, R>(&'a Tap<R>);

impl<R: Read> Read for TapRaw<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let mut s = self.0 .0.borrow_mut();
        let n = s.inner.read(buf)?;
        s.owed += n as u64;
        Ok(n)
    }
}

/// The data segments and size of a GNU sparse member (type `S`) whose
/// header is `h` at `at` in the archive: four in the header, 21 in each
/// extension header after it (read back from `tap`).
fn gnu_sparse_map<R: Read>(
    h: &tar::Header,
    tap: &Tap<R>,
    at: u64,
) -> std::io::Result<(Vec<(u64, u64)>, u64)> {
    let other = std::io::Error::other;
    let gnu = h.as_gnu().ok_or_else(|| other("not a GNU header"))?;
    let real = gnu.real_size()?;
    if real > MAX_FILE_SIZE {
        return Err(std::io::Error::other(format!(
            "claims {real} bytes, more than a file can hold ({MAX_FILE_SIZE})"
        )));
    }
    let mut segs = Vec::new();
    let mut add = |s: &tar::GnuSparseHeader| -> std::io::Result<()> {
        if !s.is_empty() {
            segs.push((s.offset()?, s.length()?));
        }
        Ok(())
    };
    for s in &gnu.sparse {
        add(s)?;
    }
    if gnu.is_extended() {
        let ext = tap
            .logged_since(at + 512)
            .ok_or_else(|| other("more extension headers than sheaf reads"))?;
        let mut more = true;
        for b in ext.chunks(512) {
            if !more || b.len() < 512 {
                return Err(other("extension headers do not match"));
            }
            let mut x = tar::GnuExtSparseHeader::new();
            x.as_mut_bytes().copy_from_slice(b);
            for s in x.sparse() {
                add(s)?;
            }
            more = x.is_extended();
        }
        if more {
            return Err(other("extension headers end early"));
        }
    }
    check_segments(&segs, real)?;
    let stored: u64 = segs.iter().map(|s| s.1).sum();
    if stored != h.entry_size()? {
        return Err(other("segments do not add up to the stored size"));
    }
    Ok((segs, real))
}

/// Segments in order, not overlapping, within the file's size.
fn check_segments(segs: &[(u64, u64)], real: u64) -> std::io::Result<()> {
    let mut end = 0;
    for &(off, len) in segs {
        if off < end || off.checked_add(len).is_none_or(|e| e > real) {
            return Err(std::io::Error::other(
                "segments out of order or beyond the size",
            ));
        }
        end = off + len;
    }
    Ok(())
}

/// A sparse member's file: its data segments, read from `inner` one after
/// another, and zeros between them, the holes that whole blocks span
/// skipped unread ([`FileData::hole_blocks`]) so that a member claiming
/// any size costs its data, not its size.
struct SparseData<R: Read> {
    inner: R,
    segs: std::collections::VecDeque<(u64, u64)>,
    pos: u64,
    real: u64,
}

impl<R: Read> SparseData<R> {
    fn new(inner: R, segs: Vec<(u64, u64)>, real: u64) -> Self {
        SparseData {
            inner,
            segs: segs.into(),
            pos: 0,
            real,
        }
    }

    /// A PAX 1.0 sparse member: a text map (`count\n` then `offset\n
    /// size\n` pairs, padded to 512 bytes) followed by the data segments.
    fn pax(mut inner: R, real: u64) -> std::io::Result<Self> {
        let mut consumed = 0u64;
        let mut number = || -> std::io::Result<u64> {
            let mut v: u64 = 0;
            let mut digits = 0;
            loop {
                let mut b = [0u8; 1];
                inner.read_exact(&mut b)?;
                consumed += 1;
                match b[0] {
                    b'\n' if digits > 0 => return Ok(v),
                    d @ b'0'..=b'9' if digits < 20 => {
                        v = v
                            .checked_mul(10)
                            .and_then(|v| v.checked_add((d - b'0') as u64))
                            .ok_or_else(|| std::io::Error::other("number overflows"))?;
                        digits += 1;
                    }
                    _ => return Err(std::io::Error::other("not a decimal number")),
                }
            }
        };
        let n = number()?;
        let mut segs = Vec::new();
        for _ in 0..n {
            segs.push((number()?, number()?));
        }
        check_segments(&segs, real)?;
        let pad = (512 - consumed % 512) % 512;
        std::io::copy(&mut inner.by_ref().take(pad), &mut std::io::sink())?;
        Ok(SparseData::new(inner, segs, real))
    }
}

impl<R: Read> Read for SparseData<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while let Some(&(off, len)) = self.segs.front() {
            if self.pos >= off + len {
                self.segs.pop_front();
                continue;
            }
            if self.pos < off {
                let n = buf.len().min((off - self.pos) as usize);
                buf[..n].fill(0);
                self.pos += n as u64;
                return Ok(n);
            }
            let want = buf.len().min((off + len - self.pos) as usize);
            let n = self.inner.read(&mut buf[..want])?;
            if n == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "sparse data ends early",
                ));
            }
            self.pos += n as u64;
            return Ok(n);
        }
        let n = buf.len().min(self.real.saturating_sub(self.pos) as usize);
        buf[..n].fill(0);
        self.pos += n as u64;
        Ok(n)
    }
}

impl<R: Read> FileData for SparseData<R> {
    fn hole_blocks(&mut self, at: u64, bs: u64) -> std::io::Result<u64> {
        debug_assert_eq!(at, self.pos);
        while self.segs.front().is_some_and(|&(o, l)| self.pos >= o + l) {
            self.segs.pop_front();
        }
        let next = self.segs.front().map_or(self.real, |&(o, _)| o);
        let skip = next.saturating_sub(self.pos) / bs * bs;
        self.pos += skip;
        Ok(skip)
    }

    fn len_hint(&self) -> Option<u64> {
        Some(self.real)
    }
}
