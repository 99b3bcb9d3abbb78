//! Where image bytes come from.
//!
//! A [`Source`] reads byte ranges at offsets; nothing else. The local file
//! implementation uses `pread` (never mmap, so a file truncated under a
//! reader yields an error, not SIGBUS). Remote sources (HTTP, a cache) will
//! implement the same trait.

use sheaf_format::{BlockRef, Codec, Digest};
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Random-access bytes of one image.
pub trait Source: Send + Sync {
    /// Total length in bytes.
    fn len(&self) -> u64;
    /// Whether the source is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Fill `buf` from `offset`; a short source is an `UnexpectedEof` error.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// A hint that bytes `[offset, offset+len)` will be read soon: a local
    /// file asks the kernel to read them ahead (`posix_fadvise` WILLNEED),
    /// so a cold disk serves many small reads from a few large ones. Others
    /// ignore it.
    fn will_need(&self, _offset: u64, _len: u64) {}
    /// Name used in messages (a path or URL).
    fn name(&self) -> &str;
    /// The stored bytes of the page or block `r` names, with their codec.
    /// By default the range `r` points at; a source that holds objects by
    /// digest (a published repository) fetches the object instead.
    fn read_object(&self, r: &BlockRef) -> io::Result<(Codec, Vec<u8>)> {
        let mut b = vec![0u8; r.clen as usize];
        self.read_exact_at(&mut b, r.offset)?;
        Ok((r.codec, b))
    }
    /// Whether [`Source::read_object`] reads byte ranges of the image, so the
    /// reader may fetch adjacent objects with one larger read.
    fn ranged(&self) -> bool {
        true
    }
    /// Whether reading the same bytes again is cheap (a local file, memory):
    /// then a block may be decoded only as far as a read needs and its
    /// stored bytes read again when a later read needs more. A network
    /// source says no (the default): its blocks are decoded whole once
    /// fetched, so no byte is fetched twice.
    fn local(&self) -> bool {
        false
    }
    /// Bytes just read failed verification. A source with other routes to the
    /// same image (mirrors, proxies) switches to the next one and returns
    /// true: the reader then reads again. Default: no other route.
    fn reject(&self, _offset: u64) -> bool {
        false
    }
    /// Counters for `sheaf stats`, as JSON fields (default none).
    fn stats_json(&self) -> Option<serde_json::Value> {
        None
    }
}

/// A content-addressed store of objects (pages and blocks as stored, named
/// by the digest of their uncompressed bytes; see `sheaf_format::remote`).
/// The reader verifies everything it gets, so a store may be shared,
/// stale or damaged without harm: a bad object is removed and fetched again.
pub trait ObjectStore: Send + Sync {
    /// The object named `hash`, encoded (`[codec][stored bytes]`), if held.
    fn get(&self, hash: &Digest) -> Option<Vec<u8>>;
    /// Whether the object is held (cheap; no read).
    fn contains(&self, hash: &Digest) -> bool;
    /// Keep an encoded object (best effort: a full disk only costs a refetch).
    fn put(&self, hash: &Digest, object: &[u8]);
    /// Drop an object that failed verification.
    fn remove(&self, hash: &Digest);
    /// Counters for `sheaf stats`, as JSON fields.
    fn stats_json(&self) -> serde_json::Value;
}

/// A local image file read with `pread`.
#[derive(Debug)]
pub struct FileSource {
    file: File,
    len: u64,
    name: String,
}

impl FileSource {
    /// Open `path` for reading.
    pub fn open(path: &Path) -> io::Result<Self> {
        let file = File::open(path)?;
        let md = file.metadata()?;
        if md.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "is a directory",
            ));
        }
        Ok(FileSource {
            len: md.len(),
            file,
            name: path.display().to_string(),
        })
    }
}

impl Source for FileSource {
    fn local(&self) -> bool {
        true
    }
    fn len(&self) -> u64 {
        self.len
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn will_need(&self, offset: u64, len: u64) {
        use std::os::fd::AsRawFd;
        let (Ok(off), Ok(len)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
            return;
        };
        // SAFETY: a hint about this open descriptor's pages; no memory is
        // passed. A refusal only means no readahead.
        unsafe { libc::posix_fadvise(self.file.as_raw_fd(), off, len, libc::POSIX_FADV_WILLNEED) };
    }
}

/// An image held in memory (tests, fuzzing, embedding).
#[derive(Debug, Clone)]
pub struct MemSource {
    bytes: Vec<u8>,
    name: String,
}

impl MemSource {
    /// Wrap bytes under a display name.
    pub fn new(bytes: Vec<u8>, name: impl Into<String>) -> Self {
        MemSource {
            bytes,
            name: name.into(),
        }
    }
}

impl Source for MemSource {
    fn local(&self) -> bool {
        true
    }
    fn len(&self) -> u64 {
        self.bytes.len() as u64
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        let end = start.checked_add(buf.len());
        match end.filter(|&e| e <= self.bytes.len()) {
            Some(e) => {
                buf.copy_from_slice(&self.bytes[start..e]);
                Ok(())
            }
            None => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "read past end",
            )),
        }
    }
    fn name(&self) -> &str {
        &self.name
    }
}

/// An image known only by its index (`sheaf_format::remote::ImageIndex`):
/// enough to open it and read its superblock and sections, not its pages or
/// blocks (reading those is an error). Used where the index travelled
/// without the image, as in a broadcast.
#[derive(Debug, Clone)]
pub struct IndexSource {
    index: sheaf_format::remote::ImageIndex,
    name: String,
}

impl IndexSource {
    /// Serve `index` under a display name.
    pub fn new(index: sheaf_format::remote::ImageIndex, name: impl Into<String>) -> Self {
        IndexSource {
            index,
            name: name.into(),
        }
    }
}

impl Source for IndexSource {
    fn len(&self) -> u64 {
        self.index.file_len
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        if self.index.read(buf, offset) {
            Ok(())
        } else {
            Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("bytes {offset}+{} are not in the index", buf.len()),
            ))
        }
    }
    fn name(&self) -> &str {
        &self.name
    }
}

/// Wraps a source and counts the requests and bytes read through it
/// (for `sheaf stats`: how much of the image a workload touched).
pub struct CountingSource {
    inner: std::sync::Arc<dyn Source>,
    /// Read requests made.
    pub reads: std::sync::atomic::AtomicU64,
    /// Bytes read.
    pub bytes: std::sync::atomic::AtomicU64,
}

impl CountingSource {
    /// Count reads of `inner`.
    pub fn new(inner: std::sync::Arc<dyn Source>) -> Self {
        CountingSource {
            inner,
            reads: Default::default(),
            bytes: Default::default(),
        }
    }
}

impl Source for CountingSource {
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        use std::sync::atomic::Ordering::Relaxed;
        self.reads.fetch_add(1, Relaxed);
        self.bytes.fetch_add(buf.len() as u64, Relaxed);
        self.inner.read_exact_at(buf, offset)
    }
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn read_object(&self, r: &BlockRef) -> io::Result<(Codec, Vec<u8>)> {
        use std::sync::atomic::Ordering::Relaxed;
        self.reads.fetch_add(1, Relaxed);
        self.bytes.fetch_add(r.clen as u64, Relaxed);
        self.inner.read_object(r)
    }
    fn ranged(&self) -> bool {
        self.inner.ranged()
    }
    fn local(&self) -> bool {
        self.inner.local()
    }
    fn reject(&self, offset: u64) -> bool {
        self.inner.reject(offset)
    }
    fn will_need(&self, offset: u64, len: u64) {
        self.inner.will_need(offset, len)
    }
    fn stats_json(&self) -> Option<serde_json::Value> {
        self.inner.stats_json()
    }
}
