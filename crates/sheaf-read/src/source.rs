//! Where image bytes come from.
//!
//! A [`Source`] reads byte ranges at offsets; nothing else. The local file
//! implementation uses `pread` (never mmap, so a file truncated under a
//! reader yields an error, not SIGBUS). Remote sources (HTTP, a cache) will
//! implement the same trait.

use serde::{Deserialize, Serialize};
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
    /// Counters for `sheaf stats` (default none: not a network source).
    fn net_stats(&self) -> Option<NetStats> {
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
    /// Counters for `sheaf stats`.
    fn store_stats(&self) -> StoreStats;
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
        Self::from_file(File::open(path)?, path.display().to_string())
    }

    /// Read the open `file`, shown as `name`.
    pub fn from_file(file: File, name: String) -> io::Result<Self> {
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
            name,
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
    fn net_stats(&self) -> Option<NetStats> {
        self.inner.net_stats()
    }
}

/// What a network source reports to `sheaf stats` (its `remote` field).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NetStats {
    /// Serving from the node cache only (no transport).
    pub offline: bool,
    /// `image` (a whole image file) or `repository` (a published index).
    pub remote_form: String,
    /// The transport's counters (none offline).
    #[serde(flatten)]
    pub transport: Option<TransportStats>,
}

/// A transport's counters; each names its fields with its prefix
/// (`http_`, `ssh_`, `s3_`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TransportStats {
    /// HTTP(S), through mirrors and proxies.
    Http(HttpStats),
    /// SFTP over OpenSSH.
    Ssh(SshStats),
    /// S3.
    S3(S3Stats),
}

/// HTTP counters.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HttpStats {
    /// Requests sent.
    #[serde(rename = "http_requests")]
    pub requests: u64,
    /// Bytes received.
    #[serde(rename = "http_bytes")]
    pub bytes: u64,
    /// Requests retried.
    #[serde(rename = "http_retries")]
    pub retries: u64,
    /// Time spent waiting before retries.
    #[serde(rename = "http_wait_ms")]
    pub wait_ms: u64,
    /// Moves to another route.
    #[serde(rename = "http_failovers")]
    pub failovers: u64,
    /// Requests that failed.
    #[serde(rename = "http_errors")]
    pub errors: u64,
    /// The mirror in use (redacted).
    #[serde(rename = "http_url")]
    pub url: String,
    /// The proxy in use, or `DIRECT`.
    #[serde(rename = "http_via")]
    pub via: String,
    /// The last error, or empty.
    #[serde(rename = "http_last_error")]
    pub last_error: String,
}

/// SFTP counters.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SshStats {
    /// Requests sent.
    #[serde(rename = "ssh_requests")]
    pub requests: u64,
    /// Bytes received.
    #[serde(rename = "ssh_bytes")]
    pub bytes: u64,
    /// Connections made again.
    #[serde(rename = "ssh_reconnects")]
    pub reconnects: u64,
    /// Requests retried.
    #[serde(rename = "ssh_retries")]
    pub retries: u64,
    /// Time spent waiting before retries.
    #[serde(rename = "ssh_wait_ms")]
    pub wait_ms: u64,
    /// Requests that failed.
    #[serde(rename = "ssh_errors")]
    pub errors: u64,
    /// The URL.
    #[serde(rename = "ssh_url")]
    pub url: String,
    /// The last error, or empty.
    #[serde(rename = "ssh_last_error")]
    pub last_error: String,
}

/// S3 counters.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct S3Stats {
    /// Requests sent.
    #[serde(rename = "s3_requests")]
    pub requests: u64,
    /// Bytes received.
    #[serde(rename = "s3_bytes")]
    pub bytes: u64,
    /// Requests retried.
    #[serde(rename = "s3_retries")]
    pub retries: u64,
    /// Time spent waiting before retries.
    #[serde(rename = "s3_wait_ms")]
    pub wait_ms: u64,
    /// Requests that failed.
    #[serde(rename = "s3_errors")]
    pub errors: u64,
    /// The URL.
    #[serde(rename = "s3_url")]
    pub url: String,
    /// The endpoint (redacted) or host.
    #[serde(rename = "s3_endpoint")]
    pub endpoint: String,
    /// Whether requests are signed.
    #[serde(rename = "s3_signed")]
    pub signed: bool,
    /// The last error, or empty.
    #[serde(rename = "s3_last_error")]
    pub last_error: String,
}

/// The counters every transport has, for printing.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TransportSummary {
    /// Requests sent.
    pub requests: u64,
    /// Bytes received.
    pub bytes: u64,
    /// Requests retried.
    pub retries: u64,
    /// Time spent waiting before retries.
    pub wait_ms: u64,
    /// Moves to another route (HTTP only; else 0).
    pub failovers: u64,
    /// Requests that failed.
    pub errors: u64,
    /// Where requests go: `URL via PROXY` (HTTP) or the URL.
    pub route: String,
    /// The last error, or empty.
    pub last_error: String,
}

impl TransportStats {
    /// The counters all transports share.
    pub fn summary(&self) -> TransportSummary {
        match self {
            TransportStats::Http(h) => TransportSummary {
                requests: h.requests,
                bytes: h.bytes,
                retries: h.retries,
                wait_ms: h.wait_ms,
                failovers: h.failovers,
                errors: h.errors,
                route: format!("{} via {}", h.url, h.via),
                last_error: h.last_error.clone(),
            },
            TransportStats::Ssh(s) => TransportSummary {
                requests: s.requests,
                bytes: s.bytes,
                retries: s.retries,
                wait_ms: s.wait_ms,
                failovers: 0,
                errors: s.errors,
                route: s.url.clone(),
                last_error: s.last_error.clone(),
            },
            TransportStats::S3(s) => TransportSummary {
                requests: s.requests,
                bytes: s.bytes,
                retries: s.retries,
                wait_ms: s.wait_ms,
                failovers: 0,
                errors: s.errors,
                route: s.url.clone(),
                last_error: s.last_error.clone(),
            },
        }
    }
}

/// What an object store reports to `sheaf stats` (its `disk_cache` field).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum StoreStats {
    /// The node cache.
    NodeCache(CacheStats),
    /// A published repository read in place.
    Repository {
        /// Its directory.
        repository: String,
    },
}

/// The node cache's counters.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CacheStats {
    /// Its directory.
    #[serde(rename = "disk_cache")]
    pub dir: String,
    /// Objects found.
    #[serde(rename = "disk_cache_hits")]
    pub hits: u64,
    /// Objects not found.
    #[serde(rename = "disk_cache_misses")]
    pub misses: u64,
    /// Objects kept.
    #[serde(rename = "disk_cache_stored")]
    pub stored: u64,
    /// Objects that failed verification and were dropped.
    #[serde(rename = "disk_cache_bad")]
    pub bad: u64,
    /// Objects evicted for the quota.
    #[serde(rename = "disk_cache_evicted")]
    pub evicted: u64,
    /// Objects that could not be written.
    #[serde(rename = "disk_cache_write_errors")]
    pub write_errors: u64,
    /// Bytes held.
    #[serde(rename = "disk_cache_bytes")]
    pub bytes: u64,
    /// Bytes it may hold.
    #[serde(rename = "disk_cache_quota")]
    pub quota: u64,
}

#[cfg(test)]
mod stats_tests {
    use super::*;

    #[test]
    fn net_stats_round_trip_per_transport() {
        for t in [
            None,
            Some(TransportStats::Http(HttpStats {
                bytes: 3,
                via: "DIRECT".into(),
                ..Default::default()
            })),
            Some(TransportStats::Ssh(SshStats {
                reconnects: 1,
                ..Default::default()
            })),
            Some(TransportStats::S3(S3Stats {
                signed: true,
                ..Default::default()
            })),
        ] {
            let n = NetStats {
                offline: t.is_none(),
                remote_form: "repository".into(),
                transport: t,
            };
            let text = serde_json::to_string(&n).unwrap();
            assert_eq!(
                serde_json::from_str::<NetStats>(&text).unwrap(),
                n,
                "{text}"
            );
        }
    }

    #[test]
    fn store_stats_round_trip() {
        for s in [
            StoreStats::NodeCache(CacheStats {
                dir: "/c".into(),
                quota: 5,
                ..Default::default()
            }),
            StoreStats::Repository {
                repository: "/r".into(),
            },
        ] {
            let text = serde_json::to_string(&s).unwrap();
            assert_eq!(
                serde_json::from_str::<StoreStats>(&text).unwrap(),
                s,
                "{text}"
            );
        }
    }
}
