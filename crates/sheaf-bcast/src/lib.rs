//! `sheaf bcast`: one image to a node-local path on every node of a job,
//! read from shared storage once.
//!
//! Owns: grouping ranks into nodes ([`comm`]), the skip and delta rules
//! (a node that has the image does nothing; one that has some of its
//! objects in other local images or its node cache gets only the rest),
//! the read schedule ([`plan`]), the pipelined transfer, and the verified,
//! atomic install ([`local`]). Knows nothing of MPI beyond the [`Comm`]
//! trait (the `mpi` feature adds [`mpi::Mpi`]), nothing of the CLI.
//!
//! The protocol, every rank in the same order (docs/pools.md):
//! 1. rank 0 opens the source, applies the signature policy and sends the
//!    image index (header, sections, tail: what opening needs);
//! 2. every node's lowest rank (its *leader*) checks its destination;
//!    when all have the image, the run ends here;
//! 3. rank 0 sends the list of the image's objects (pages and blocks);
//! 4. each leader copies the objects it already has into a temporary
//!    copy, verified, and marks the rest; the marks are OR-ed over ranks;
//! 5. the needed objects are read by all ranks, each a contiguous share,
//!    verified by their reader against the image's digests, and broadcast
//!    in chunks carrying a checksum of their bytes; leaders check that checksum
//!    on arrival and write the objects they lack;
//! 6. leaders write the index bytes and check the copy's root digest; all
//!    ranks agree on success, then leaders rename their copies into place.
//!
//! A failure anywhere becomes the same one-line error on every rank, and
//! no destination is touched.

pub mod comm;
pub mod local;
#[cfg(feature = "mpi")]
pub mod mpi;
pub mod plan;

pub use comm::{Comm, Nodes, Solo};

use local::{Install, Local};
use sheaf_format::remote::ImageIndex;
use sheaf_format::{one_line, BlockRef, Codec, Dictionary, Digest, BLOCK_REF_LEN};
use sheaf_net::RemoteConfig;
use sheaf_read::{CountingSource, Image, ImageOptions, IndexSource, ObjectStore, Source};
use sheaf_trust::Policy;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Default bytes per broadcast message.
pub const DEFAULT_CHUNK: usize = 16 << 20;
/// Default chunks each reader reads ahead of the broadcast.
pub const DEFAULT_WINDOW: usize = 4;

/// What to broadcast where, and how.
#[derive(Debug, Clone)]
pub struct Options {
    /// The image on shared storage: a path or a URL.
    pub src: PathBuf,
    /// The node-local destination path (the same on every node).
    pub dest: PathBuf,
    /// How URLs are reached; its node cache also lends objects.
    pub remote: RemoteConfig,
    /// Signature policy, checked before anything is written.
    pub policy: Policy,
    /// Bytes per broadcast message.
    pub chunk: usize,
    /// Chunks each reader keeps in flight ahead of the broadcast.
    pub window: usize,
    /// More local images (files or directories) to take objects from,
    /// besides the destination's directory.
    pub reuse: Vec<PathBuf>,
}

impl Options {
    /// Defaults for `src` → `dest`.
    pub fn new(src: PathBuf, dest: PathBuf) -> Options {
        Options {
            src,
            dest,
            remote: RemoteConfig::default(),
            policy: Policy::default(),
            chunk: DEFAULT_CHUNK,
            window: DEFAULT_WINDOW,
            reuse: Vec::new(),
        }
    }
}

/// What a broadcast did (the same on every rank; byte counts are totals
/// over all ranks or nodes).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    /// Ranks in the job.
    pub ranks: usize,
    /// Nodes (distinct host names).
    pub nodes: usize,
    /// Nodes that already had the image and did nothing.
    pub nodes_present: u64,
    /// Root digest of the image, hex.
    pub root: String,
    /// Length of the image file.
    pub image_bytes: u64,
    /// Objects (pages and blocks) in the image.
    pub objects: u64,
    /// Objects some node lacked (what was read and sent).
    pub objects_sent: u64,
    /// Bytes of those objects.
    pub bytes_sent: u64,
    /// Bytes read from the source by all ranks (index and metadata included).
    pub bytes_read: u64,
    /// Bytes nodes took from images or caches they already had.
    pub bytes_reused: u64,
    /// Seconds from start to the agreed end.
    pub seconds: f64,
}

/// Why a broadcast failed: one line, the same on every rank.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BcastError(pub String);

/// Failures of reading the source outrank the others when ranks agree on
/// which message to show (a node that only saw a short chunk knows less).
const READ_FAILURE: u64 = 0;
const OTHER_FAILURE: u64 = 1;

fn agree(comm: &dyn Comm, local: Result<(), (u64, String)>) -> Result<(), BcastError> {
    comm.agree(local).map_err(BcastError)
}

fn other<T>(r: Result<T, String>) -> Result<T, (u64, String)> {
    r.map_err(|e| (OTHER_FAILURE, e))
}

/// Reads of the source: a local file read in ranges, or an image (URL)
/// read object by object. Counts bytes.
enum Reader {
    File(Arc<CountingSource>),
    Remote(Box<Image>, Arc<CountingSource>),
}

impl Reader {
    /// Open the source as an image (rank 0: it reads the index and lists
    /// the objects); objects read through the image are kept in `record`
    /// for the reader to serve again.
    fn open_image(o: &Options, record: Arc<Recorded>) -> Result<(Reader, Image), String> {
        let mut counter = None;
        let opened = sheaf_net::open_image(&o.src, &o.remote, ImageOptions::default(), |s| {
            let c = Arc::new(CountingSource::new(s));
            counter = Some(c.clone());
            Arc::new(Recording {
                inner: c,
                seen: record,
            }) as Arc<dyn Source>
        })
        .map_err(|e| one_line(&e))?;
        let counter = counter.expect("wrap is called");
        let root = opened.image.root_digest();
        let reader = Reader::for_share(o, counter, &root)?;
        Ok((reader, opened.image))
    }

    /// Open the source for reading a share only: a local file is read
    /// without opening it as an image (no second read of its index).
    /// `root`: the one the job agreed on (rank 0's open); a share read
    /// from another image is refused.
    fn open(o: &Options, root: &Digest) -> Result<Reader, String> {
        let src = o.src.to_string_lossy();
        if sheaf_net::is_url(&src) {
            let (r, img) = Reader::open_image(o, Arc::default())?;
            img.expect_root(root).map_err(|e| one_line(&e))?;
            return Ok(r);
        }
        let f = sheaf_read::FileSource::open(&o.src)
            .map_err(|e| format!("{}: {e}", o.src.display()))?;
        Reader::for_share(o, Arc::new(CountingSource::new(Arc::new(f))), root)
    }

    fn for_share(
        o: &Options,
        counter: Arc<CountingSource>,
        root: &Digest,
    ) -> Result<Reader, String> {
        if sheaf_net::is_url(&o.src.to_string_lossy()) {
            // Objects (verified, through the node cache) by digest, from
            // the image opened first: the same name opened again must be
            // the same root.
            let again = sheaf_net::open_image(&o.src, &o.remote, ImageOptions::default(), |s| s)
                .map_err(|e| one_line(&e))?;
            again.image.expect_root(root).map_err(|e| one_line(&e))?;
            Ok(Reader::Remote(Box::new(again.image), counter))
        } else {
            Ok(Reader::File(counter))
        }
    }

    fn bytes(&self) -> u64 {
        match self {
            Reader::File(c) | Reader::Remote(_, c) => c.bytes.load(Relaxed),
        }
    }

    /// Fill `out` with the stored bytes of `refs` (in order, adjacent in
    /// `out`), coalescing runs adjacent in the file into one read.
    fn read(&self, refs: &[BlockRef], recorded: &Recorded, out: &mut [u8]) -> Result<(), String> {
        let mut pos = 0;
        let mut i = 0;
        while i < refs.len() {
            let r = &refs[i];
            if let Some(b) = recorded.take(r.offset) {
                out[pos..pos + b.len()].copy_from_slice(&b);
                pos += b.len();
                i += 1;
                continue;
            }
            match self {
                Reader::File(src) => {
                    let mut j = i + 1;
                    let mut end = r.offset + r.clen as u64;
                    while j < refs.len() && refs[j].offset == end && !recorded.has(refs[j].offset) {
                        end += refs[j].clen as u64;
                        j += 1;
                    }
                    let n = (end - r.offset) as usize;
                    src.read_exact_at(&mut out[pos..pos + n], r.offset)
                        .map_err(|e| format!("{}: read at offset {}: {e}", src.name(), r.offset))?;
                    pos += n;
                    i = j;
                }
                Reader::Remote(img, counter) => {
                    let obj = img.object(r, u32::MAX).map_err(|e| one_line(&e))?;
                    counter.bytes.fetch_add(obj.len() as u64, Relaxed);
                    let (codec, stored) = sheaf_format::remote::decode_object(&obj)
                        .map_err(|e| format!("{}: {e}", img.name()))?;
                    if codec != r.codec || stored.len() != r.clen as usize {
                        return Err(format!(
                            "{}: object {} is stored differently from the image's layout \
                             (a repository shared with another build); broadcast the image file instead",
                            img.name(),
                            sheaf_format::hex(&r.hash)
                        ));
                    }
                    out[pos..pos + stored.len()].copy_from_slice(stored);
                    pos += stored.len();
                    i += 1;
                }
            }
        }
        Ok(())
    }
}

/// Objects rank 0 read while listing the image's objects (ref pages, the
/// block index), so its share serves them without reading them again.
#[derive(Default)]
struct Recorded(Mutex<HashMap<u64, Vec<u8>>>);

impl Recorded {
    fn has(&self, off: u64) -> bool {
        self.0.lock().expect("recorded").contains_key(&off)
    }
    fn take(&self, off: u64) -> Option<Vec<u8>> {
        self.0.lock().expect("recorded").remove(&off)
    }
}

/// A source that remembers the objects read through it.
struct Recording {
    inner: Arc<dyn Source>,
    seen: Arc<Recorded>,
}

impl Source for Recording {
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.inner.read_exact_at(buf, offset)
    }
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn read_object(&self, r: &BlockRef) -> std::io::Result<(Codec, Vec<u8>)> {
        let (c, b) = self.inner.read_object(r)?;
        if c == r.codec && b.len() == r.clen as usize {
            self.seen
                .0
                .lock()
                .expect("recorded")
                .insert(r.offset, b.clone());
        }
        Ok((c, b))
    }
    fn ranged(&self) -> bool {
        self.inner.ranged()
    }
}

/// Every distinct object of `img`, in file order.
fn list_objects(img: &Image) -> Result<Vec<BlockRef>, String> {
    let mut refs: Vec<BlockRef> = img
        .object_refs()
        .map_err(|e| one_line(&e))?
        .into_iter()
        .map(|(r, _)| r)
        .collect();
    refs.sort_by_key(|r| r.offset);
    refs.dedup_by_key(|r| r.offset);
    Ok(refs)
}

/// The first message: the index, and a detached signature if any.
fn encode_head(index: &ImageIndex, sig: Option<&[u8]>) -> Vec<u8> {
    let idx = index.encode();
    let mut v = (idx.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(&idx);
    if let Some(s) = sig {
        v.extend_from_slice(s);
    }
    v
}

fn decode_head(b: &[u8]) -> Result<(ImageIndex, Option<Vec<u8>>), String> {
    let bad = || "broadcast header: malformed".to_string();
    let n = u64::from_le_bytes(b.get(..8).ok_or_else(bad)?.try_into().expect("8")) as usize;
    let idx = b.get(8..8 + n).ok_or_else(bad)?;
    let index = ImageIndex::decode(idx).map_err(|e| format!("broadcast header: {e}"))?;
    let sig = &b[8 + n..];
    Ok((index, (!sig.is_empty()).then(|| sig.to_vec())))
}

/// Broadcast `o.src` to `o.dest` on every node of `comm`'s world.
/// `progress(done, total)` is called on rank 0 as payload bytes go out.
pub fn run(
    comm: &dyn Comm,
    o: &Options,
    progress: &dyn Fn(u64, u64),
) -> Result<Report, BcastError> {
    let t0 = Instant::now();
    let rank = comm.rank();
    let nodes = Nodes::discover(comm);
    let leader = nodes.is_leader(rank);

    // 1. The index, from rank 0.
    let mut src = None;
    let mut head = Vec::new();
    let recorded = Arc::new(Recorded::default());
    let local = if rank == 0 {
        open_source(o, recorded.clone()).map(|(reader, img, h)| {
            head = h;
            src = Some((reader, img));
        })
    } else {
        Ok(())
    };
    agree(comm, other(local))?;
    comm.bcast_vec(0, &mut head);
    let (index, sig) = decode_head(&head).map_err(BcastError)?;
    let file_len = index.file_len;
    let name = o.src.display().to_string();
    let meta = Image::open(Arc::new(IndexSource::new(index.clone(), name.clone())))
        .map_err(|e| BcastError(one_line(&e)))?;
    let root: Digest = meta.root_digest();

    // 2. Who needs it.
    let mut install: Option<Install> = None;
    let local = if leader && !local::is_present(&o.dest, &root, file_len) {
        Install::begin(&o.dest, file_len).map(|i| install = Some(i))
    } else {
        Ok(())
    };
    agree(comm, other(local))?;
    let needing = comm.all_sum(install.is_some() as u64);
    let mut report = Report {
        ranks: comm.size(),
        nodes: nodes.leaders.len(),
        nodes_present: nodes.leaders.len() as u64 - needing,
        root: sheaf_format::hex(&root),
        image_bytes: file_len,
        objects: 0,
        objects_sent: 0,
        bytes_sent: 0,
        bytes_read: 0,
        bytes_reused: 0,
        seconds: 0.0,
    };
    if needing == 0 {
        let read = src.as_ref().map_or(0, |(r, _): &(Reader, Image)| r.bytes());
        report.bytes_read = comm.all_sum(read);
        report.seconds = t0.elapsed().as_secs_f64();
        return Ok(report);
    }

    // 3. The object list, from rank 0.
    let mut list = Vec::new();
    let local = match &src {
        Some((_, img)) => list_objects(img).map(|refs| {
            list = refs.iter().flat_map(|r| r.encode()).collect();
        }),
        None => Ok(()),
    };
    agree(comm, other(local))?;
    comm.bcast_vec(0, &mut list);
    let refs: Vec<BlockRef> = list
        .chunks(BLOCK_REF_LEN)
        .map(BlockRef::decode)
        .collect::<Result<_, _>>()
        .map_err(|e| BcastError(format!("{name}: object list: {e}")))?;
    report.objects = refs.len() as u64;

    // 4. What each node lacks; objects it has go into its copy now.
    let mut need = vec![0u8; refs.len().div_ceil(8)];
    let mut reused = 0u64;
    let local = match &install {
        Some(inst) => fill_from_local(o, inst, &refs, meta.dictionaries(), &mut need, &mut reused),
        None => Ok(()),
    };
    agree(comm, other(local))?;
    // This node's own marks (all zero where it writes nothing).
    let mine = need.clone();
    comm.all_or(&mut need);
    let bit = |v: &[u8], i: usize| v[i / 8] & (1 << (i % 8)) != 0;
    let wanted: Vec<usize> = (0..refs.len()).filter(|&i| bit(&need, i)).collect();
    let sizes: Vec<u32> = wanted.iter().map(|&i| refs[i].clen).collect();
    let chunks = plan::schedule(&sizes, comm.size(), o.chunk.max(1));
    report.objects_sent = wanted.len() as u64;
    report.bytes_sent = sizes.iter().map(|&s| s as u64).sum();

    // 5. Read, broadcast, verify, write.
    let mut open_error = None;
    let mut reader_only = None;
    if src.is_none() && chunks.iter().any(|c| c.root == rank) {
        match Reader::open(o, &root) {
            Ok(r) => reader_only = Some(r),
            // Still take part (sending failure marks), so no rank waits.
            Err(e) => open_error = Some(e),
        }
    }
    let transfer = transfer(
        comm,
        &chunks,
        &refs,
        meta.dictionaries(),
        &wanted,
        &mine,
        src.as_ref()
            .map(|(r, _)| r)
            .or(reader_only.as_ref())
            .ok_or(open_error),
        &recorded,
        install.as_ref(),
        o.window.max(1),
        progress,
        report.bytes_sent,
    );
    agree(comm, transfer)?;

    // 6. Finish: index bytes, check, agree, rename.
    let local = match &install {
        Some(inst) => index
            .ranges
            .iter()
            .try_for_each(|(off, b)| inst.write_at(b, *off))
            .and_then(|()| inst.verify(&root, file_len)),
        None => Ok(()),
    };
    agree(comm, other(local))?;
    let local = match install.take() {
        Some(inst) => inst.finish(sig.as_deref()),
        None => Ok(()),
    };
    agree(comm, other(local))?;
    let read = src.as_ref().map(|(r, _)| r).or(reader_only.as_ref());
    report.bytes_read = comm.all_sum(read.map_or(0, Reader::bytes));
    report.bytes_reused = comm.all_sum(reused);
    report.seconds = t0.elapsed().as_secs_f64();
    Ok(report)
}

/// Rank 0: open the source, enforce the policy, and build the first message.
fn open_source(o: &Options, record: Arc<Recorded>) -> Result<(Reader, Image, Vec<u8>), String> {
    let (reader, img) = Reader::open_image(o, record)?;
    o.policy
        .enforce(&img.signed_message(), img.signatures(), &o.src)
        .map_err(|e| one_line(&e))?;
    let index = img.index().map_err(|e| one_line(&e))?;
    let sig = if sheaf_net::is_url(&o.src.to_string_lossy()) {
        None
    } else {
        match std::fs::read(sheaf_trust::policy::detached_path(&o.src)) {
            Ok(b) => Some(b),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                let p = sheaf_trust::policy::detached_path(&o.src);
                return Err(format!("{}: {e}", p.display()));
            }
        }
    };
    let head = encode_head(&index, sig.as_deref());
    Ok((reader, img, head))
}

/// A leader: copy the objects this node has into `inst`; mark the rest in
/// `need`.
fn fill_from_local(
    o: &Options,
    inst: &Install,
    refs: &[BlockRef],
    dicts: &[Arc<Dictionary>],
    need: &mut [u8],
    reused: &mut u64,
) -> Result<(), String> {
    let mut paths = vec![o
        .dest
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)];
    paths.extend(o.reuse.iter().cloned());
    let cache = o
        .remote
        .disk_cache()
        .ok()
        .flatten()
        .map(|c| c as Arc<dyn ObjectStore>);
    let have = Local::scan(&paths, cache);
    // Read and verify in parallel (decompressing to check digests is the
    // cost), write in order.
    use rayon::prelude::*;
    let found: Vec<Option<Vec<u8>>> = refs
        .par_iter()
        .map_init(Vec::new, |scratch, r| have.get(r, scratch, dicts))
        .collect();
    for (i, (r, b)) in refs.iter().zip(found).enumerate() {
        match b {
            Some(b) => {
                inst.write_at(&b, r.offset)?;
                *reused += b.len() as u64;
            }
            None => need[i / 8] |= 1 << (i % 8),
        }
    }
    Ok(())
}

/// Step 5 on one rank. The main thread only broadcasts; a reader thread
/// reads this rank's chunks ahead (at most `window`), and on a leader a
/// writer thread verifies and writes what arrives (at most `window`
/// queued), so reading, sending and writing overlap with bounded memory.
#[allow(clippy::too_many_arguments)]
fn transfer(
    comm: &dyn Comm,
    chunks: &[plan::Chunk],
    refs: &[BlockRef],
    dicts: &[Arc<Dictionary>],
    wanted: &[usize],
    mine: &[u8],
    reader: Result<&Reader, Option<String>>,
    recorded: &Recorded,
    install: Option<&Install>,
    window: usize,
    progress: &dyn Fn(u64, u64),
    total: u64,
) -> Result<(), (u64, String)> {
    let rank = comm.rank();
    let refs_of =
        |c: &plan::Chunk| -> Vec<BlockRef> { c.objects.clone().map(|k| refs[wanted[k]]).collect() };
    let read_error: Mutex<Option<String>> = Mutex::new(None);
    let write_error: Mutex<Option<String>> = Mutex::new(None);
    let done = AtomicU64::new(0);
    std::thread::scope(|s| {
        let (rtx, rrx) = crossbeam_channel::bounded::<Vec<u8>>(window);
        let (wtx, wrx) = crossbeam_channel::bounded::<(usize, Vec<u8>)>(window);
        // Buffers go round (reader → broadcast → writer → here) instead of
        // being allocated per chunk: fresh multi-MiB buffers cost a page
        // fault per 4 KiB, about as much as the copy itself.
        let (free_tx, free_rx) = crossbeam_channel::bounded::<Vec<u8>>(3 * window + 2);
        // A recycled buffer keeps its old bytes: every byte of it is
        // overwritten (by the read or the broadcast) before it is used, and
        // zeroing 16 MiB per chunk cost as much as hashing it.
        let take = move |free: &crossbeam_channel::Receiver<Vec<u8>>, len: usize| {
            let mut b = free.try_recv().unwrap_or_default();
            b.resize(len, 0);
            b
        };
        if chunks.iter().any(|c| c.root == rank) {
            let free_rx = free_rx.clone();
            let read_error = &read_error;
            if let Err(e) = &reader {
                *read_error.lock().expect("error") = e.clone();
            }
            s.spawn(move || {
                for c in chunks.iter().filter(|c| c.root == rank) {
                    let mut buf = take(&free_rx, c.len + TRAILER);
                    let failed = read_error.lock().expect("error").is_some();
                    let res = if failed {
                        Err(String::new())
                    } else {
                        reader.as_ref().map_err(|_| String::new()).and_then(|r| {
                            let refs = refs_of(c);
                            r.read(&refs, recorded, &mut buf[..c.len])?;
                            check_objects(&refs, &buf[..c.len], dicts)
                        })
                    };
                    match res {
                        Ok(()) => {
                            let d = transport_sum(&buf[..c.len]);
                            buf[c.len..c.len + 16].copy_from_slice(&d);
                            buf[c.len + 16..c.len + 32].fill(0);
                            buf[c.len + 32] = 0;
                        }
                        Err(e) => {
                            if !e.is_empty() {
                                *read_error.lock().expect("error") = Some(e);
                            }
                            buf[c.len + 32] = 1;
                        }
                    }
                    if rtx.send(buf).is_err() {
                        return;
                    }
                }
            });
        }
        if let Some(inst) = install {
            let write_error = &write_error;
            let refs_of = &refs_of;
            let free_tx = free_tx.clone();
            s.spawn(move || {
                for (k, buf) in wrx {
                    let buf = Recycle(Some(buf), &free_tx);
                    if write_error.lock().expect("error").is_some() {
                        continue;
                    }
                    let c: &plan::Chunk = &chunks[k];
                    if buf[c.len + 32] != 0 {
                        *write_error.lock().expect("error") =
                            Some("a rank could not read its share of the source".into());
                        continue;
                    }
                    // The reader checked every object against the image's
                    // digests; this checks the bytes arrived as it sent them
                    // (not on the reading rank: they never left it).
                    if c.root != rank && transport_sum(&buf[..c.len])[..] != buf[c.len..c.len + 16]
                    {
                        *write_error.lock().expect("error") = Some(format!(
                            "a chunk from rank {} arrived damaged (checksum mismatch)",
                            c.root
                        ));
                        continue;
                    }
                    let mut pos = 0;
                    let mut res = Ok(());
                    for (j, r) in c.objects.clone().zip(refs_of(c)) {
                        let at = pos;
                        pos += r.clen as usize;
                        let i = wanted[j];
                        if mine[i / 8] & (1 << (i % 8)) != 0 {
                            res = inst.write_at(&buf[at..at + r.clen as usize], r.offset);
                            if res.is_err() {
                                break;
                            }
                        }
                    }
                    if let Err(e) = res {
                        *write_error.lock().expect("error") = Some(e);
                    }
                }
            });
        }
        for (k, c) in chunks.iter().enumerate() {
            let mut buf = if c.root == rank {
                rrx.recv().expect("reader sends one buffer per chunk")
            } else {
                take(&free_rx, c.len + TRAILER)
            };
            comm.bcast_into(c.root, &mut buf);
            if install.is_some() {
                let _ = wtx.send((k, buf));
            } else {
                let _ = free_tx.try_send(buf);
            }
            if rank == 0 {
                progress(done.fetch_add(c.len as u64, Relaxed) + c.len as u64, total);
            }
        }
        drop(wtx);
    });
    if let Some(e) = read_error.into_inner().expect("error") {
        return Err((READ_FAILURE, e));
    }
    if let Some(e) = write_error.into_inner().expect("error") {
        return Err((OTHER_FAILURE, e));
    }
    Ok(())
}

/// Bytes after a chunk's payload: its transport checksum (16 bytes, then 16
/// zero bytes) and a status byte (0: read and verified; 1: the reader failed).
const TRAILER: usize = 33;

/// The checksum a chunk travels with. The reader already verified every
/// object against the image's BLAKE3 digests, and the checksum is computed
/// by the sending rank, so it can only catch damage in transit, never a
/// dishonest peer; a cryptographic hash would add nothing but cost (BLAKE3
/// on every leader was a fifth of the CPU of a broadcast). XXH3-128 runs at
/// memory speed.
fn transport_sum(payload: &[u8]) -> [u8; 16] {
    xxhash_rust::xxh3::xxh3_128(payload).to_le_bytes()
}

/// Check every object of a chunk against its digest, in parallel
/// (decompressing is the cost): once per job, by the rank that read it.
fn check_objects(
    refs: &[BlockRef],
    payload: &[u8],
    dicts: &[Arc<Dictionary>],
) -> Result<(), String> {
    use rayon::prelude::*;
    let mut at = Vec::with_capacity(refs.len());
    let mut pos = 0;
    for r in refs {
        at.push(pos);
        pos += r.clen as usize;
    }
    refs.par_iter()
        .zip(at)
        .try_for_each_init(Vec::new, |scratch, (r, a)| {
            r.verify_stored(r.codec, &payload[a..a + r.clen as usize], scratch, &dicts)
                .map_err(|_| {
                    format!(
                        "source object {} at offset {} failed verification \
                     (the source is corrupt or changed while being read)",
                        sheaf_format::hex(&r.hash),
                        r.offset
                    )
                })
        })
}

/// A chunk buffer that goes back to the free list when dropped.
struct Recycle<'a>(Option<Vec<u8>>, &'a crossbeam_channel::Sender<Vec<u8>>);

impl std::ops::Deref for Recycle<'_> {
    type Target = Vec<u8>;
    fn deref(&self) -> &Vec<u8> {
        self.0.as_ref().expect("held until drop")
    }
}

impl Drop for Recycle<'_> {
    fn drop(&mut self) {
        if let Some(b) = self.0.take() {
            let _ = self.1.try_send(b);
        }
    }
}

/// How this process was launched: under an MPI launcher (several ranks
/// expected) or alone.
pub fn launched_by_mpi() -> bool {
    [
        "OMPI_COMM_WORLD_SIZE",
        "PMI_SIZE",
        "PMIX_RANK",
        "MPI_LOCALNRANKS",
    ]
    .iter()
    .any(|v| std::env::var_os(v).is_some())
}

/// Whether this build can use MPI.
pub const MPI_BUILT: bool = cfg!(feature = "mpi");
