//! `--metrics ADDR`: the snapshotter's counters in Prometheus's text
//! exposition format (`GET /metrics` on a TCP address, e.g.
//! `127.0.0.1:9877`), the same numbers its log lines count.

use crate::state::{Kind, State};
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

/// Counters kept while the process runs (the rest are in the state).
#[derive(Debug, Default)]
pub struct Runtime {
    /// Mounts made again: after a restart, or found dead.
    pub remounts: AtomicU64,
    /// Snapshots removed.
    pub removals: AtomicU64,
}

/// The exposition text for `st` and `rt`.
pub fn render(st: &State, rt: &Runtime) -> String {
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, values: &[(&str, u64)]| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, v) in values {
            let _ = writeln!(out, "{name}{labels} {v}");
        }
    };
    metric(
        "sheaf_snapshotter_layers_total",
        "counter",
        "Layers committed, by how: lazy from a repository, applied by containerd and packed, or refused by the signature policy (then applied).",
        &[
            ("{path=\"lazy\"}", st.lazy_layers),
            ("{path=\"applied\"}", st.applied_layers),
            ("{path=\"refused\"}", st.refused_layers),
        ],
    );
    metric(
        "sheaf_snapshotter_prefetched_layers_total",
        "counter",
        "Lazy layers whose recorded prefetch list was fetched into the node cache.",
        &[("", st.prefetched_layers)],
    );
    metric(
        "sheaf_snapshotter_remounts_total",
        "counter",
        "Union mounts made again by this process (after a restart, or found dead).",
        &[("", rt.remounts.load(Ordering::Relaxed))],
    );
    metric(
        "sheaf_snapshotter_removals_total",
        "counter",
        "Snapshots removed by this process.",
        &[("", rt.removals.load(Ordering::Relaxed))],
    );
    let count = |k: Kind| st.snaps.values().filter(|s| s.kind == k).count() as u64;
    metric(
        "sheaf_snapshotter_snapshots",
        "gauge",
        "Snapshots, by kind.",
        &[
            ("{kind=\"active\"}", count(Kind::Active)),
            ("{kind=\"view\"}", count(Kind::View)),
            ("{kind=\"committed\"}", count(Kind::Committed)),
        ],
    );
    out
}

/// Serve `text()` at `GET /metrics` on `addr` until the runtime ends.
pub async fn serve(
    addr: std::net::SocketAddr,
    text: impl Fn() -> String + Clone + Send + Sync + 'static,
) -> std::io::Result<()> {
    use hyper::service::{make_service_fn, service_fn};
    use hyper::{Body, Request, Response, StatusCode};
    let make = make_service_fn(move |_| {
        let text = text.clone();
        async move {
            Ok::<_, std::convert::Infallible>(service_fn(move |req: Request<Body>| {
                let text = text.clone();
                async move {
                    let r = if req.uri().path() == "/metrics" {
                        Response::builder()
                            .header("Content-Type", "text/plain; version=0.0.4")
                            .body(Body::from(text()))
                    } else {
                        Response::builder()
                            .status(StatusCode::NOT_FOUND)
                            .body(Body::from("see /metrics\n"))
                    };
                    Ok::<_, std::convert::Infallible>(r.expect("a valid response"))
                }
            }))
        }
    });
    hyper::Server::try_bind(&addr)
        .map_err(|e| std::io::Error::other(format!("--metrics {addr}: {e}")))?
        .serve(make)
        .await
        .map_err(std::io::Error::other)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_counters_are_in_the_exposition_format() {
        let st = State {
            lazy_layers: 3,
            applied_layers: 1,
            ..State::default()
        };
        let rt = Runtime::default();
        rt.remounts.store(2, Ordering::Relaxed);
        let t = render(&st, &rt);
        assert!(t.contains("# TYPE sheaf_snapshotter_layers_total counter\n"));
        assert!(t.contains("sheaf_snapshotter_layers_total{path=\"lazy\"} 3\n"));
        assert!(t.contains("sheaf_snapshotter_layers_total{path=\"applied\"} 1\n"));
        assert!(t.contains("sheaf_snapshotter_remounts_total 2\n"));
        assert!(t.contains("sheaf_snapshotter_snapshots{kind=\"active\"} 0\n"));
        // Every sample line is NAME[{labels}] VALUE.
        for l in t.lines().filter(|l| !l.starts_with('#')) {
            let (name, v) = l.rsplit_once(' ').unwrap();
            assert!(name.starts_with("sheaf_snapshotter_"), "{l}");
            v.parse::<u64>().unwrap();
        }
    }
}
