//! Reading a tar archive (plain, gzip, zstd, xz, bzip2) straight into a
//! [`Tree`], feeding file data to the packer in archive order so the archive
//! is never extracted and is read exactly once. Entries feed a
//! [`TreeBuilder`], which owns the rules for paths (`..`, absolute paths in
//! a layer), exclusions, implicit parent directories, duplicates and
//! hardlinks ([`crate::normalize`]); this module only decodes the archive.

use crate::dict;
use crate::normalize::{Absolute, TreeBuilder};
use crate::options::{BuildError, BuildOptions};
use crate::pack::Packer;
use crate::scan::Problems;
use crate::tree::{Kind, NodeId, Tree};
use sheaf_format::XattrSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use tar::EntryType;

/// Wrap `r` in the decompressor its first bytes announce.
pub fn decompressor<'a>(r: impl Read + 'a) -> std::io::Result<Box<dyn Read + 'a>> {
    let mut br = BufReader::with_capacity(1 << 20, r);
    let head = br.fill_buf()?.to_vec();
    Ok(if head.starts_with(&[0x1f, 0x8b]) {
        Box::new(flate2::read::MultiGzDecoder::new(br))
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Box::new(zstd::stream::read::Decoder::with_buffer(br)?)
    } else if head.starts_with(&[0xfd, b'7', b'z', b'X', b'Z', 0]) {
        Box::new(liblzma::read::XzDecoder::new_multi_decoder(br))
    } else if head.starts_with(b"BZh") {
        Box::new(bzip2::read::MultiBzDecoder::new(br))
    } else {
        Box::new(br)
    })
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
            let (size, range) = packer.add_file(&mut bytes(i), None, name, id)?;
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
    let r = decompressor(input).map_err(|e| BuildError::Input {
        path: name.to_string(),
        cause: e,
    })?;
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
    let mut ar = tar::Archive::new(input);
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
        let shown = String::from_utf8_lossy(&path).into_owned();
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
                            .ok_or_else(|| bad(format!("{shown}: bad GNU.sparse.realsize")))?
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
                    (Some((_, real)), Some(b"1")) => {
                        let mut r = PaxSparse::new(&mut e, *real)
                            .map_err(|e| bad(format!("{shown}: bad sparse map: {e}")))?;
                        packer.add_file(&mut r, None, &what, id)?
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
                            held.release(packer, &mut t.tree, pack_size, name)?;
                        }
                        continue;
                    }
                    (None, _) => packer.add_file(&mut e, None, &what, id)?,
                };
                kind = t.tree.file_kind(size, range);
            }
        }
        t.put(parent, &comps, meta, kind, xattrs, None)
            .expect("not the root");
    }
    held.release(packer, &mut t.tree, pack_size, name)?;
    if count == 0 && !layer {
        return Err(bad("empty or not a tar archive".into()));
    }
    Ok(t.finish())
}

/// Expands a PAX 1.0 sparse member: a text map (`count\n` then `offset\n
/// size\n` pairs, padded to 512 bytes) followed by the data segments.
struct PaxSparse<'a, R: Read> {
    inner: &'a mut R,
    segs: std::collections::VecDeque<(u64, u64)>,
    pos: u64,
    real: u64,
}

impl<'a, R: Read> PaxSparse<'a, R> {
    fn new(inner: &'a mut R, real: u64) -> std::io::Result<Self> {
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
        let mut segs = std::collections::VecDeque::new();
        let mut end = 0;
        for _ in 0..n {
            let (off, len) = (number()?, number()?);
            if off < end || off.checked_add(len).is_none_or(|e| e > real) {
                return Err(std::io::Error::other(
                    "segments out of order or beyond the size",
                ));
            }
            end = off + len;
            segs.push_back((off, len));
        }
        let pad = (512 - consumed % 512) % 512;
        std::io::copy(&mut inner.by_ref().take(pad), &mut std::io::sink())?;
        Ok(PaxSparse {
            inner,
            segs,
            pos: 0,
            real,
        })
    }
}

impl<R: Read> Read for PaxSparse<'_, R> {
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
