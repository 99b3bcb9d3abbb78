//! Live counters of a mount: requests per operation with latency histograms.
//!
//! Everything is a relaxed atomic so recording costs a few nanoseconds on the
//! request path; readers (`sheaf stats`) get a consistent-enough snapshot.

use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

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
    /// Requests answered.
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
        self.count.fetch_add(1, Relaxed);
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
    /// Bytes fetched by the background prefetch at mount.
    pub prefetch_bytes: AtomicU64,
    /// Errors reading the image (I/O or a failed hash check).
    pub image_errors: AtomicU64,
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
        Timer {
            stats: self.op(op),
            start: Instant::now(),
        }
    }

    /// Count an error answer of `op`.
    pub fn error(&self, op: Op) {
        self.op(op).errors.fetch_add(1, Relaxed);
    }

    /// Per-operation counters as JSON.
    pub fn ops_json(&self) -> Value {
        let mut m = serde_json::Map::new();
        for op in Op::ALL {
            let s = self.op(op);
            let n = s.count.load(Relaxed);
            if n == 0 {
                continue;
            }
            m.insert(
                op.name().into(),
                json!({
                    "count": n,
                    "errors": s.errors.load(Relaxed),
                    "mean_us": s.total_ns.load(Relaxed) as f64 / n as f64 / 1000.0,
                    "p50_us_le": s.quantile_us(0.5),
                    "p99_us_le": s.quantile_us(0.99),
                    "max_us": s.max_ns.load(Relaxed) as f64 / 1000.0,
                }),
            );
        }
        Value::Object(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_come_from_the_histogram() {
        let s = Stats::default();
        for _ in 0..98 {
            s.op(Op::Read).record(3_000); // 3 µs: bucket [2,4)
        }
        s.op(Op::Read).record(1_000_000); // 1 ms
        s.op(Op::Read).record(2_000_000);
        let j = s.ops_json();
        assert_eq!(j["read"]["count"], 100);
        assert_eq!(j["read"]["p50_us_le"], 4);
        assert_eq!(j["read"]["p99_us_le"], 1024);
        assert_eq!(j["read"]["max_us"], 2000.0);
        assert!(j.get("lookup").is_none());
    }
}
