//! The HTTP client: routes (mirror × proxy), failover, retries with
//! backoff, timeouts, and counters.
//!
//! A *route* is one mirror's URL reached directly or through one proxy. All
//! requests go to the current route; a failure moves to the next route at
//! once (the CVMFS way: proxies first, then mirrors), and only when every
//! route has failed does the client wait and retry, with exponential backoff
//! and an overall deadline per request. After a failover the client returns
//! to the first route once `failback` has passed, so a recovered primary
//! takes the load back.

use serde_json::json;
use std::io::{self, Read};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Network settings.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// Longest wait to connect.
    pub connect_timeout: Duration,
    /// Longest time for one whole request, body included.
    pub request_timeout: Duration,
    /// Longest time one read may take over all its retries and failovers;
    /// past it the read fails (a mount answers EIO) instead of hanging.
    pub deadline: Duration,
    /// Rounds over all routes before giving up (1 = no retry).
    pub attempts: u32,
    /// First wait between rounds; doubled each time.
    pub backoff: Duration,
    /// After a failover, go back to the first route after this long.
    pub failback: Duration,
    /// Mirrors: further URLs of the same image (or repository index).
    pub mirrors: Vec<String>,
    /// Proxies to try in order (`DIRECT` = none). Empty: from the
    /// environment (`http_proxy`, `https_proxy`, `no_proxy`), else direct.
    pub proxies: Vec<String>,
}

impl Default for HttpOptions {
    fn default() -> Self {
        HttpOptions {
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
            deadline: Duration::from_secs(60),
            attempts: 4,
            backoff: Duration::from_millis(200),
            failback: Duration::from_secs(300),
            mirrors: Vec::new(),
            proxies: Vec::new(),
        }
    }
}

/// Counters of one client.
#[derive(Debug, Default)]
pub struct NetStats {
    /// Requests sent (every try counts).
    pub requests: AtomicU64,
    /// Body bytes received in successful replies.
    pub bytes: AtomicU64,
    /// Waits before a new round over the routes.
    pub retries: AtomicU64,
    /// Switches to another route.
    pub failovers: AtomicU64,
    /// Failed tries (any cause).
    pub errors: AtomicU64,
}

/// One route's agent: direct or through one proxy.
struct Via {
    label: String,
    agent: ureq::Agent,
}

/// An HTTP client for one image and its mirrors.
pub struct Http {
    urls: Vec<String>,
    vias: Vec<Via>,
    current: AtomicUsize,
    failed_at: Mutex<Option<Instant>>,
    opts: HttpOptions,
    /// Counters.
    pub stats: NetStats,
    /// The last failure, for messages and `sheaf stats`.
    last_error: Mutex<String>,
}

/// What a request asks for.
#[derive(Clone, Copy)]
pub enum Want<'a> {
    /// Bytes `from..=to` of the image itself.
    Range(u64, u64),
    /// A whole file at this path relative to the image's directory.
    Object(&'a str),
    /// The first `n` bytes of the image, and its length, accepting a server
    /// that answers 200 for a small file (an index).
    Probe(u64),
}

/// Whether retrying (elsewhere or later) might help.
fn worth_retrying(e: &io::Error, routes: usize) -> bool {
    match e.kind() {
        // Another mirror may have it.
        io::ErrorKind::NotFound => routes > 1,
        io::ErrorKind::PermissionDenied | io::ErrorKind::InvalidData => routes > 1,
        io::ErrorKind::UnexpectedEof => false,
        _ => true,
    }
}

fn agent(opts: &HttpOptions, proxy: Option<Option<ureq::Proxy>>) -> ureq::Agent {
    let tls = ureq::tls::TlsConfig::builder()
        .root_certs(ureq::tls::RootCerts::PlatformVerifier)
        .build();
    let mut b = ureq::Agent::config_builder()
        .timeout_connect(Some(opts.connect_timeout))
        .timeout_global(Some(opts.request_timeout))
        .http_status_as_error(false)
        .max_idle_connections_per_host(16)
        .tls_config(tls);
    // None: ureq's default, which reads the environment.
    if let Some(p) = proxy {
        b = b.proxy(p);
    }
    b.build().into()
}

impl Http {
    /// A client for `url` (and `opts.mirrors`) over `opts.proxies`.
    pub fn new(url: &str, opts: HttpOptions) -> io::Result<Http> {
        let mut urls = vec![url.to_string()];
        urls.extend(opts.mirrors.iter().cloned());
        for u in &urls {
            if !crate::is_url(u) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("'{u}' is not an http(s):// URL"),
                ));
            }
        }
        let mut vias = Vec::new();
        for p in &opts.proxies {
            if p.eq_ignore_ascii_case("DIRECT") {
                vias.push(Via {
                    label: "DIRECT".into(),
                    agent: agent(&opts, Some(None)),
                });
            } else {
                let proxy = ureq::Proxy::new(p).map_err(|e| {
                    io::Error::new(io::ErrorKind::InvalidInput, format!("proxy '{p}': {e}"))
                })?;
                vias.push(Via {
                    label: p.clone(),
                    agent: agent(&opts, Some(Some(proxy))),
                });
            }
        }
        if vias.is_empty() {
            let label = ureq::Proxy::try_from_env()
                .map(|p| format!("{}:{} (from the environment)", p.host(), p.port()))
                .unwrap_or_else(|| "DIRECT".into());
            vias.push(Via {
                label,
                agent: agent(&opts, None),
            });
        }
        Ok(Http {
            urls,
            vias,
            current: AtomicUsize::new(0),
            failed_at: Mutex::new(None),
            opts,
            stats: NetStats::default(),
            last_error: Mutex::new(String::new()),
        })
    }

    /// The image URL the user gave.
    pub fn url(&self) -> &str {
        &self.urls[0]
    }

    fn routes(&self) -> usize {
        self.urls.len() * self.vias.len()
    }

    /// The route to use now (back to the first once `failback` has passed).
    fn route(&self) -> usize {
        let r = self.current.load(Relaxed);
        if r != 0 {
            let mut f = self.failed_at.lock().expect("lock");
            if f.is_some_and(|t| t.elapsed() >= self.opts.failback) {
                *f = None;
                self.current.store(0, Relaxed);
                return 0;
            }
        }
        r
    }

    /// Move off route `from` (if no other thread already did).
    fn failover(&self, from: usize) {
        let to = (from + 1) % self.routes();
        if self
            .current
            .compare_exchange(from, to, Relaxed, Relaxed)
            .is_ok()
        {
            self.stats.failovers.fetch_add(1, Relaxed);
            *self.failed_at.lock().expect("lock") = Some(Instant::now());
        }
    }

    /// Data from the current route failed verification: use the next one.
    /// False when there is no other route.
    pub fn reject(&self) -> bool {
        if self.routes() < 2 {
            return false;
        }
        self.failover(self.route());
        true
    }

    fn describe(&self, route: usize) -> String {
        let (u, v) = (route / self.vias.len(), route % self.vias.len());
        let via = &self.vias[v].label;
        match (u, via.as_str()) {
            (0, "DIRECT") => String::new(),
            (0, _) => format!(" (via proxy {via})"),
            (_, "DIRECT") => format!(" (mirror {})", self.urls[u]),
            _ => format!(" (mirror {} via proxy {via})", self.urls[u]),
        }
    }

    /// Which route is in use, for `sheaf stats`.
    pub fn stats_json(&self) -> serde_json::Value {
        let r = self.route();
        let s = &self.stats;
        json!({
            "http_requests": s.requests.load(Relaxed),
            "http_bytes": s.bytes.load(Relaxed),
            "http_retries": s.retries.load(Relaxed),
            "http_failovers": s.failovers.load(Relaxed),
            "http_errors": s.errors.load(Relaxed),
            "http_url": self.urls[r / self.vias.len()],
            "http_via": self.vias[r % self.vias.len()].label,
            "http_last_error": *self.last_error.lock().expect("lock"),
        })
    }

    /// Run a request, failing over and retrying within the deadline.
    /// Returns the body and, for ranges and probes, the total length.
    pub fn get(&self, want: Want<'_>) -> io::Result<(Vec<u8>, u64)> {
        let deadline = Instant::now() + self.opts.deadline;
        let mut delay = self.opts.backoff;
        let mut round = 1;
        let mut failed_in_round = 0;
        loop {
            let route = self.route();
            self.stats.requests.fetch_add(1, Relaxed);
            match self.once(route, want) {
                Ok(v) => {
                    self.stats.bytes.fetch_add(v.0.len() as u64, Relaxed);
                    return Ok(v);
                }
                Err(e) => {
                    self.stats.errors.fetch_add(1, Relaxed);
                    let e = io::Error::new(e.kind(), format!("{e}{}", self.describe(route)));
                    *self.last_error.lock().expect("lock") = e.to_string();
                    if !worth_retrying(&e, self.routes()) {
                        return Err(e);
                    }
                    failed_in_round += 1;
                    if failed_in_round < self.routes() {
                        self.failover(route);
                        continue;
                    }
                    // Every route failed this round: wait, then start over
                    // from the next route.
                    if round >= self.opts.attempts || Instant::now() + delay > deadline {
                        return Err(e);
                    }
                    self.failover(route);
                    self.stats.retries.fetch_add(1, Relaxed);
                    std::thread::sleep(delay);
                    delay *= 2;
                    round += 1;
                    failed_in_round = 0;
                }
            }
        }
    }

    fn once(&self, route: usize, want: Want<'_>) -> io::Result<(Vec<u8>, u64)> {
        let base = &self.urls[route / self.vias.len()];
        let agent = &self.vias[route % self.vias.len()].agent;
        let url = match want {
            Want::Object(rel) => match base.rfind('/') {
                Some(i) => format!("{}/{rel}", &base[..i]),
                None => return Err(io::Error::other("bad URL")),
            },
            _ => base.clone(),
        };
        let mut req = agent.get(&url);
        let (limit, want_len) = match want {
            Want::Range(from, to) => {
                req = req.header("Range", format!("bytes={from}-{to}"));
                (to - from + 1, Some(to - from + 1))
            }
            Want::Probe(n) => {
                req = req.header("Range", format!("bytes=0-{}", n - 1));
                (sheaf_format::remote::MAX_INDEX_LEN as u64, None)
            }
            Want::Object(_) => (256 << 20, None),
        };
        let mut resp = req.call().map_err(|e| io::Error::other(e.to_string()))?;
        let status = resp.status().as_u16();
        match status {
            206 if !matches!(want, Want::Object(_)) => {}
            200 if matches!(want, Want::Object(_)) => {}
            200 => {
                // Tolerated only for a small index file, which we then
                // read whole; an image must be served with ranges.
                if let Want::Probe(_) = want {
                    let mut body = resp.body_mut().as_reader();
                    let mut magic = [0u8; 8];
                    body.read_exact(&mut magic)
                        .map_err(|e| io::Error::other(format!("reading the reply: {e}")))?;
                    if sheaf_format::remote::ImageIndex::is_index(&magic) {
                        let mut rest = Vec::new();
                        body.take(limit)
                            .read_to_end(&mut rest)
                            .map_err(|e| io::Error::other(format!("reading the reply: {e}")))?;
                        let mut all = magic.to_vec();
                        all.extend_from_slice(&rest);
                        let n = all.len() as u64;
                        return Ok((all, n));
                    }
                }
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "the server ignores Range requests (answered 200 with the whole file)",
                ));
            }
            404 | 410 => {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("HTTP {}", resp.status()),
                ))
            }
            401 | 403 => {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!("HTTP {}", resp.status()),
                ))
            }
            416 => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "HTTP 416: the range is beyond the end",
                ))
            }
            _ => return Err(io::Error::other(format!("HTTP {}", resp.status()))),
        }
        let total = if matches!(want, Want::Object(_)) {
            0
        } else {
            let cr = resp
                .headers()
                .get("content-range")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            // "bytes FROM-TO/TOTAL"
            cr.rsplit_once('/')
                .and_then(|(_, t)| t.trim().parse::<u64>().ok())
                .ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("no usable Content-Range in the reply ('{cr}')"),
                    )
                })?
        };
        let body = resp
            .body_mut()
            .with_config()
            .limit(limit + 1)
            .read_to_vec()
            .map_err(|e| io::Error::other(format!("reading the reply: {e}")))?;
        if let Some(n) = want_len {
            if body.len() as u64 != n {
                return Err(io::Error::other(format!(
                    "short reply: {} of {n} bytes",
                    body.len()
                )));
            }
        }
        Ok((body, total))
    }
}
