//! Live counters of a mount: requests per operation with latency histograms.
//!
//! Everything is a relaxed atomic so recording costs a few nanoseconds on the
//! request path; readers (`sheaf stats`) get a consistent-enough snapshot.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// How many of the last errors a mount keeps for `sheaf stats`.
pub const RECENT_ERRORS: usize = 16;

/// An error a reader of the mount met, as `sheaf stats` shows it.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RecentError {
    /// When (seconds since the epoch).
    pub unix_time: u64,
    /// The operation (read, lookup, ...).
    pub op: String,
    /// The entry, from the image's root, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The image's inode the request was about, when known (a path is
    /// found for it when the report is made).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inode: Option<u32>,
    /// The error, one line (names the image and the part that failed).
    pub error: String,
}

/// FUSE operations that are counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// lookup
    Lookup,
    /// getattr
    Getattr,
    /// readlink
    Readlink,
    /// open / opendir (answered once, then the kernel stops asking)
    Open,
    /// read
    Read,
    /// readdir
    Readdir,
    /// readdirplus
    Readdirplus,
    /// statfs
    Statfs,
    /// getxattr
    Getxattr,
    /// listxattr
    Listxattr,
    /// access
    Access,
}

impl Op {
    /// All counted operations, in report order.
    pub const ALL: [Op; 11] = [
        Op::Lookup,
        Op::Getattr,
        Op::Readlink,
        Op::Open,
        Op::Read,
        Op::Readdir,
        Op::Readdirplus,
        Op::Statfs,
        Op::Getxattr,
        Op::Listxattr,
        Op::Access,
    ];

    /// Name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Op::Lookup => "lookup",
            Op::Getattr => "getattr",
            Op::Readlink => "readlink",
            Op::Open => "open",
            Op::Read => "read",
            Op::Readdir => "readdir",
            Op::Readdirplus => "readdirplus",
            Op::Statfs => "statfs",
            Op::Getxattr => "getxattr",
            Op::Listxattr => "listxattr",
            Op::Access => "access",
        }
    }
}

/// Latency buckets: bucket `i` holds requests that took `[2^i, 2^(i+1))` µs
/// (bucket 0 also holds everything under 1 µs).
const BUCKETS: usize = 32;

/// Counters of one operation.
#[derive(Default)]
pub struct OpStats {
    /// Requests taken (counted on arrival: a caller that has its answer
    /// finds it counted; the latency is recorded once the answer is sent).
    pub count: AtomicU64,
    /// Requests answered with an error (other than "no such entry").
    pub errors: AtomicU64,
    /// Sum of latencies in nanoseconds.
    pub total_ns: AtomicU64,
    /// Largest latency in nanoseconds.
    pub max_ns: AtomicU64,
    hist: [AtomicU64; BUCKETS],
}

impl OpStats {
    fn record(&self, ns: u64) {
        self.total_ns.fetch_add(ns, Relaxed);
        self.max_ns.fetch_max(ns, Relaxed);
        let us = ns / 1000;
        let b = if us == 0 {
            0
        } else {
            (63 - us.leading_zeros() as usize).min(BUCKETS - 1)
        };
        self.hist[b].fetch_add(1, Relaxed);
    }

    /// Upper bound in µs of the bucket holding quantile `q` (0..1).
    fn quantile_us(&self, q: f64) -> u64 {
        let counts: Vec<u64> = self.hist.iter().map(|h| h.load(Relaxed)).collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return 0;
        }
        let target = ((total as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, c) in counts.iter().enumerate() {
            seen += c;
            if seen >= target {
                return 1u64 << (i + 1);
            }
        }
        1u64 << BUCKETS
    }
}

/// All counters of one mount.
#[derive(Default)]
pub struct Stats {
    ops: [OpStats; Op::ALL.len()],
    /// Bytes returned to the kernel by `read`.
    pub bytes_served: AtomicU64,
    /// Blocks queued for background decompression by readahead.
    pub prefetch_queued: AtomicU64,
    /// Prefetches dropped because the queue was full.
    pub prefetch_dropped: AtomicU64,
    /// Blocks a read left decoded in part, queued to be decoded whole on a
    /// spare CPU.
    pub prefetch_completions: AtomicU64,
    /// Bytes fetched by the background prefetch at mount.
    pub prefetch_bytes: AtomicU64,
    /// Errors reading the image (I/O or a failed hash check).
    pub image_errors: AtomicU64,
    /// The last [`RECENT_ERRORS`] errors, oldest first.
    pub recent: Mutex<VecDeque<RecentError>>,
}

/// Records the latency of one request when dropped.
pub struct Timer<'a> {
    stats: &'a OpStats,
    start: Instant,
}

impl Drop for Timer<'_> {
    fn drop(&mut self) {
        self.stats.record(self.start.elapsed().as_nanos() as u64);
    }
}

impl Stats {
    /// Counters of `op`.
    pub fn op(&self, op: Op) -> &OpStats {
        &self.ops[Op::ALL.iter().position(|&o| o == op).expect("listed")]
    }

    /// Start timing a request of `op`.
    pub fn time(&self, op: Op) -> Timer<'_> {
        let stats = self.op(op);
        // Counted now: the answer goes out before the timer drops, and a
        // test (or script) that reads the counters right after its own
        // request must find that request counted.
        stats.count.fetch_add(1, Relaxed);
        Timer {
            stats,
            start: Instant::now(),
        }
    }

    /// Count an error answer of `op`.
    pub fn error(&self, op: Op) {
        self.op(op).errors.fetch_add(1, Relaxed);
    }

    /// The errno a filesystem answers for a read error of `op`: anything
    /// but a plain "no such entry" is counted and logged (the log says which
    /// image and which page or block; the reader sees only the errno).
    pub fn read_errno(&self, op: Op, e: &sheaf_read::ReadError) -> i32 {
        self.read_errno_at(op, None, e)
    }

    /// [`Stats::read_errno`] for a request about the image's inode `ino`,
    /// kept among the recent errors with it.
    pub fn read_errno_at(&self, op: Op, ino: Option<u32>, e: &sheaf_read::ReadError) -> i32 {
        let n = e.errno();
        if n != libc::ENOENT {
            self.error(op);
            if n == libc::EIO {
                self.image_errors.fetch_add(1, Relaxed);
            }
            let error = sheaf_format::one_line(e);
            log::error!("{}: {error}", op.name());
            let mut r = self.recent.lock().unwrap_or_else(|p| p.into_inner());
            if r.len() == RECENT_ERRORS {
                r.pop_front();
            }
            r.push_back(RecentError {
                unix_time: SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0),
                op: op.name().to_string(),
                path: None,
                inode: ino,
                error,
            });
        }
        n
    }

    /// The recent errors, oldest first, with paths found by `path_of` for
    /// those that have an inode and no path yet (kept for later reports).
    pub fn recent_errors(
        &self,
        path_of: impl FnOnce(&[u32]) -> Vec<(u32, String)>,
    ) -> Vec<RecentError> {
        let mut r = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        let want: Vec<u32> = r
            .iter()
            .filter(|e| e.path.is_none())
            .filter_map(|e| e.inode)
            .collect();
        if !want.is_empty() {
            let found = path_of(&want);
            for e in r.iter_mut().filter(|e| e.path.is_none()) {
                e.path = e
                    .inode
                    .and_then(|i| found.iter().find(|f| f.0 == i).map(|f| f.1.clone()));
            }
        }
        r.iter().cloned().collect()
    }

    /// Per-operation counters, by operation name (those never asked for
    /// are left out).
    pub fn ops(&self) -> BTreeMap<String, OpReport> {
        let mut m = BTreeMap::new();
        for op in Op::ALL {
            let s = self.op(op);
            let n = s.count.load(Relaxed);
            if n == 0 {
                continue;
            }
            m.insert(
                op.name().into(),
                OpReport {
                    count: n,
                    errors: s.errors.load(Relaxed),
                    mean_us: s.total_ns.load(Relaxed) as f64 / n as f64 / 1000.0,
                    p50_us_le: s.quantile_us(0.5),
                    p99_us_le: s.quantile_us(0.99),
                    max_us: s.max_ns.load(Relaxed) as f64 / 1000.0,
                },
            );
        }
        m
    }
}

/// What `sheaf stats` reads from a mount (both filesystems write it; a
/// field a filesystem does not have is absent, not zero).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Report {
    /// The image, or the layers joined by commas.
    pub image: String,
    /// The root digest of each image served (hex; the layers bottom first),
    /// so a caller that finds a mount can tell what it serves.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub roots: Vec<String>,
    /// The serving process.
    pub pid: u32,
    /// Seconds since the mount came up.
    pub uptime_s: f64,
    /// Reads of the image's bytes (single image).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_reads: Option<u64>,
    /// Bytes read from the image (single image).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_bytes_read: Option<u64>,
    /// Bytes handed to readers.
    pub bytes_served: u64,
    /// Requests answered EIO because the image was damaged or unreachable.
    pub image_errors: u64,
    /// Decompressed data blocks (summed over layers for a union).
    pub block_cache: CacheReport,
    /// Blocks decompressed (single image; the block cache's misses).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocks_decompressed: Option<u64>,
    /// Decoded metadata pages (single image).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_cache: Option<CacheReport>,
    /// Readahead and background prefetch (single image).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefetch: Option<PrefetchReport>,
    /// The network source's counters (remote images).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<sheaf_read::NetStats>,
    /// The object store's counters (remote images: the node cache, or a
    /// repository read in place).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_cache: Option<sheaf_read::StoreStats>,
    /// The layers of a union, bottom first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layers: Option<Vec<String>>,
    /// Whether a union is writable through an upper directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upper: Option<bool>,
    /// Files and directories copied up (writable unions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copy_ups: Option<u64>,
    /// Nodes the kernel holds (unions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<u64>,
    /// Requests that came through FUSE over io_uring rather than
    /// `/dev/fuse` (0 when the kernel does not offer it or it is off).
    #[serde(default)]
    pub io_uring_requests: u64,
    /// Per operation: count, errors, latencies ([`Stats::ops`]).
    pub ops: BTreeMap<String, OpReport>,
    /// The last errors readers met, oldest first (at most
    /// [`RECENT_ERRORS`]), with the path of the entry when known.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recent_errors: Vec<RecentError>,
    /// Where the mount's messages go: "stderr", "syslog" or a file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log: Option<String>,
}

/// One operation's counters and latencies.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct OpReport {
    /// Requests.
    pub count: u64,
    /// Error answers (other than "no such entry").
    pub errors: u64,
    /// Largest latency, µs.
    pub max_us: f64,
    /// Mean latency, µs.
    pub mean_us: f64,
    /// Upper bound of the median's histogram bucket, µs.
    pub p50_us_le: u64,
    /// Upper bound of the 99th percentile's histogram bucket, µs.
    pub p99_us_le: u64,
}

/// A cache's counters.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct CacheReport {
    /// Bytes it may hold (absent for the page cache).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<u64>,
    /// Bytes held.
    pub size: u64,
    /// Lookups answered from the cache.
    pub hits: u64,
    /// Lookups that had to load (decompress) the item.
    pub misses: u64,
    /// Lookups that waited for another thread loading the same item.
    pub waits: u64,
    /// Items evicted (absent for the page cache).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evictions: Option<u64>,
    /// Bytes the misses decompressed.
    #[serde(default)]
    pub loaded_bytes: u64,
    /// Misses that decoded a held prefix of a block again, further.
    #[serde(default)]
    pub extensions: u64,
}

/// Readahead and prefetch counters.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct PrefetchReport {
    /// Blocks queued for decompression ahead of sequential readers.
    pub queued: u64,
    /// Blocks not queued because the queue was full.
    pub dropped: u64,
    /// Blocks read in part, queued to be decoded whole on a spare CPU.
    #[serde(default)]
    pub completions: u64,
    /// Bytes fetched by background prefetch (metadata, listed blocks).
    pub background_bytes: u64,
}

impl Report {
    /// The report as the stats xattr carries it: JSON, keys sorted.
    pub fn to_bytes(&self) -> Vec<u8> {
        (serde_json::to_value(self)
            .expect("a report serializes")
            .to_string())
        .into_bytes()
    }

    /// The report as `sheaf stats --json` prints it: indented, keys sorted
    /// as [`Report::to_bytes`] sorts them.
    pub fn to_json_pretty(&self) -> String {
        serde_json::to_string_pretty(&serde_json::to_value(self).expect("a report serializes"))
            .expect("a JSON value prints")
    }
}

impl CacheReport {
    /// The counters of `c`.
    pub fn of(c: &sheaf_read::Cache) -> CacheReport {
        CacheReport {
            capacity: Some(c.capacity() as u64),
            size: c.size() as u64,
            hits: c.stats.hits.load(Relaxed),
            misses: c.stats.misses.load(Relaxed),
            waits: c.stats.waits.load(Relaxed),
            evictions: Some(c.stats.evictions.load(Relaxed)),
            loaded_bytes: c.stats.loaded_bytes.load(Relaxed),
            extensions: c.stats.extensions.load(Relaxed),
        }
    }

    /// Sum of several caches' counters (a union's layers).
    pub fn sum<'a>(caches: impl Iterator<Item = &'a sheaf_read::Cache>) -> CacheReport {
        caches
            .map(CacheReport::of)
            .fold(CacheReport::default(), |a, b| CacheReport {
                capacity: Some(a.capacity.unwrap_or(0) + b.capacity.unwrap_or(0)),
                size: a.size + b.size,
                hits: a.hits + b.hits,
                misses: a.misses + b.misses,
                waits: a.waits + b.waits,
                evictions: Some(a.evictions.unwrap_or(0) + b.evictions.unwrap_or(0)),
                loaded_bytes: a.loaded_bytes + b.loaded_bytes,
                extensions: a.extensions + b.extensions,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One request of `op` that took `ns`.
    fn took(s: &Stats, op: Op, ns: u64) {
        s.op(op).count.fetch_add(1, Relaxed);
        s.op(op).record(ns);
    }

    #[test]
    fn quantiles_come_from_the_histogram() {
        let s = Stats::default();
        for _ in 0..98 {
            took(&s, Op::Read, 3_000); // 3 µs: bucket [2,4)
        }
        took(&s, Op::Read, 1_000_000); // 1 ms
        took(&s, Op::Read, 2_000_000);
        let j = s.ops();
        let r = &j[Op::Read.name()];
        assert_eq!(r.count, 100);
        assert_eq!(r.p50_us_le, 4);
        assert_eq!(r.p99_us_le, 1024);
        assert_eq!(r.max_us, 2000.0);
        assert!(!j.contains_key(Op::Lookup.name()));
    }

    #[test]
    fn a_request_counts_while_it_is_being_answered() {
        let s = Stats::default();
        let t = s.time(Op::Getxattr);
        // The reply goes out here, before the timer drops.
        assert_eq!(s.ops()[Op::Getxattr.name()].count, 1);
        drop(t);
        assert_eq!(s.ops()[Op::Getxattr.name()].count, 1);
        assert!(s.op(Op::Getxattr).total_ns.load(Relaxed) > 0);
    }
}
