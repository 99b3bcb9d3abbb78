//! The HTTP client: routes (mirror × proxy), failover, retries with
//! backoff, timeouts, and counters.
//!
//! A *route* is one mirror's URL reached directly or through one proxy. All
//! requests go to the current route; a failure moves to the next route at
//! once (the CVMFS way: proxies first, then mirrors), and only when every
//! route has failed does the client wait and retry, with exponential backoff
//! capped at [`HttpOptions::max_backoff`], for as long as the request's
//! deadline allows: an outage shorter than the deadline (a server, proxy or
//! mirror restarting) is only a wait for the reader, never an error. After a failover the client returns
//! to the first route once `failback` has passed, so a recovered primary
//! takes the load back.

use sheaf_format::one_line;
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
    /// First wait between rounds over all routes; doubled each time up to
    /// `max_backoff`. Rounds go on until `deadline`.
    pub backoff: Duration,
    /// Longest wait between two rounds, so a recovered server is noticed
    /// soon after it is back.
    pub max_backoff: Duration,
    /// After a failover, go back to the first route after this long.
    pub failback: Duration,
    /// Mirrors: further URLs of the same image (or repository index).
    pub mirrors: Vec<String>,
    /// Proxies to try in order (`DIRECT` = none). Empty: from the
    /// environment (`http_proxy`, `https_proxy`, `no_proxy`), else direct.
    pub proxies: Vec<String>,
    /// Told before each wait for a server that failed: its host, how long
    /// it has been waited for, and the deadline (the CLI shows a live line
    /// on a terminal; this crate knows nothing of terminals).
    pub on_wait: Option<fn(host: &str, waited: Duration, limit: Duration)>,
    /// Wait for a server never reached yet as for one lost later: a first
    /// request that finds nothing listening (or no answer) is retried with
    /// the same backoff until the deadline, instead of failing at once
    /// (`sheaf mount --wait-for-server`). With a cached index at hand,
    /// opening then waits the whole deadline before the index stands in.
    pub wait_for_server: bool,
    /// Told once, when a request to a server never reached starts waiting
    /// for it under `wait_for_server`: the server's URL (redacted), why it
    /// failed (one short line) and how long it will be waited for.
    pub on_server_wait: Option<ServerWait>,
}

/// See [`HttpOptions::on_server_wait`]: the server's redacted URL, why it
/// failed, how long it will be waited for.
pub type ServerWait = fn(server: &str, why: &str, limit: Duration);

impl Default for HttpOptions {
    fn default() -> Self {
        HttpOptions {
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
            deadline: Duration::from_secs(60),
            backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(2),
            failback: Duration::from_secs(300),
            mirrors: Vec::new(),
            proxies: Vec::new(),
            on_wait: None,
            wait_for_server: false,
            on_server_wait: None,
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
    /// Total time spent in those waits, in milliseconds.
    pub wait_ms: AtomicU64,
    /// Switches to another route.
    pub failovers: AtomicU64,
    /// Failed tries (any cause).
    pub errors: AtomicU64,
}

/// How one route reaches servers: directly, through one proxy, or as the
/// environment says.
#[derive(Clone)]
enum ProxyChoice {
    Direct,
    Via(String),
    FromEnv,
}

/// One route's client. Built lazily and per process: a client owns a
/// runtime thread, which a `fork` (the mount daemonising) does not copy.
struct Via {
    label: String,
    choice: ProxyChoice,
    client: Mutex<Option<(u32, reqwest::blocking::Client)>>,
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
    /// Whether any route has answered yet (with any status).
    reached: std::sync::atomic::AtomicBool,
    /// The first URL, redacted: who is waited for (`on_server_wait`).
    shown: String,
    /// HOST[:PORT] of the first URL: who is waited for (`on_wait`).
    host: String,
}

/// What a request asks for.
#[derive(Clone, Copy)]
pub enum Want<'a> {
    /// Bytes `from..=to` of the image itself.
    Range(u64, u64),
    /// A whole file at this path relative to the image's directory, of at
    /// most this many bytes (what the caller expects: an object's stored
    /// length and codec byte; a larger reply is refused, never buffered).
    Object(&'a str, u64),
    /// The first `n` bytes of the image, and its length, accepting a server
    /// that answers 200 for a small file (an index).
    Probe(u64),
}

/// The waiting rule of every transport (HTTP routes, SSH reconnects): the
/// first wait is `backoff`, each next one twice as long up to
/// `max_backoff`, and none passes the deadline (`--timeout`, or a shorter
/// limit of the request); past it the last error is returned saying how
/// long it was tried. Waits are counted in `stats`.
pub(crate) struct Backoff<'a> {
    /// Who is waited for (a host), for `on_wait`.
    label: &'a str,
    on_wait: Option<fn(&str, Duration, Duration)>,
    start: Instant,
    /// When the request gives up.
    pub(crate) deadline: Instant,
    delay: Duration,
    max: Duration,
    stats: &'a NetStats,
    /// Said before the first wait: a server never reached is waited for
    /// (`wait_for_server`), its redacted URL and whom to tell.
    announce: Option<(&'a str, ServerWait)>,
}

impl<'a> Backoff<'a> {
    pub(crate) fn new(
        opts: &HttpOptions,
        limit: Duration,
        stats: &'a NetStats,
        label: &'a str,
    ) -> Self {
        let start = Instant::now();
        Backoff {
            label,
            on_wait: opts.on_wait,
            start,
            deadline: start + limit.min(opts.deadline),
            delay: opts.backoff,
            max: opts.max_backoff,
            stats,
            announce: None,
        }
    }

    /// Say once, before the first wait, that `server` (its redacted URL),
    /// never reached yet, is waited for (when `never_reached` and the
    /// options ask to wait for such a server and name whom to tell).
    pub(crate) fn announcing(
        mut self,
        opts: &HttpOptions,
        server: &'a str,
        never_reached: bool,
    ) -> Self {
        if opts.wait_for_server && never_reached {
            self.announce = opts.on_server_wait.map(|f| (server, f));
        }
        self
    }

    /// Sleep before the next try, or give `e` back if the deadline passed.
    pub(crate) fn wait(&mut self, e: io::Error) -> io::Result<()> {
        let now = Instant::now();
        if now >= self.deadline {
            return Err(io::Error::new(
                e.kind(),
                format!(
                    "{e}; gave up after {:.1} s (--timeout)",
                    self.start.elapsed().as_secs_f64()
                ),
            ));
        }
        let wait = self.delay.min(self.deadline - now);
        if let Some((server, f)) = self.announce.take() {
            f(server, &why(&e), self.deadline - self.start);
        }
        if let Some(f) = self.on_wait {
            f(self.label, now - self.start, self.deadline - self.start);
        }
        self.stats.retries.fetch_add(1, Relaxed);
        self.stats
            .wait_ms
            .fetch_add(wait.as_millis() as u64, Relaxed);
        std::thread::sleep(wait);
        self.delay = (self.delay * 2).min(self.max);
        Ok(())
    }
}

/// Why a server is being waited for, in a few words ("connection
/// refused", "timed out", "HTTP 503 Service Unavailable"), credentials
/// redacted.
fn why(e: &io::Error) -> String {
    let t = e.to_string();
    let l = t.to_ascii_lowercase();
    if e.kind() == io::ErrorKind::ConnectionRefused || l.contains("connection refused") {
        "connection refused".into()
    } else if e.kind() == io::ErrorKind::TimedOut || l.contains("timed out") {
        "no answer: timed out".into()
    } else {
        crate::redact_text(&t.replace(['\n', '\r'], " "))
    }
}

/// Whether retrying (elsewhere or later) might help.
fn worth_retrying(e: &io::Error, routes: usize) -> bool {
    match e.kind() {
        // Another mirror or proxy may do better.
        io::ErrorKind::NotFound | io::ErrorKind::PermissionDenied | io::ErrorKind::InvalidData => {
            routes > 1
        }
        io::ErrorKind::UnexpectedEof => false,
        _ => true,
    }
}

/// The proxy the environment names, for messages.
fn env_proxy() -> Option<String> {
    [
        "http_proxy",
        "HTTP_PROXY",
        "https_proxy",
        "HTTPS_PROXY",
        "all_proxy",
        "ALL_PROXY",
    ]
    .iter()
    .find_map(|v| std::env::var(v).ok().filter(|s| !s.is_empty()))
}

/// Whether a transport error is a refused connection (nothing listening).
fn is_refused(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(c) = cur {
        if let Some(io) = c.downcast_ref::<io::Error>() {
            if io.kind() == io::ErrorKind::ConnectionRefused {
                return true;
            }
        }
        cur = c.source();
    }
    false
}

/// Whether a transport error is TLS refusing the server (its certificate
/// or the handshake), not a network failure.
fn is_tls_rejection(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(c) = cur {
        if c.downcast_ref::<rustls::Error>().is_some() {
            return true;
        }
        if let Some(io) = c.downcast_ref::<io::Error>() {
            if io
                .get_ref()
                .is_some_and(|i| i.downcast_ref::<rustls::Error>().is_some())
            {
                return true;
            }
        }
        // Wrappers that keep the TLS error only as text (hyper's connect
        // error) still name it.
        let t = c.to_string();
        if t.contains("invalid peer certificate") || t.contains("peer is incompatible") {
            return true;
        }
        cur = c.source();
    }
    false
}

impl Http {
    /// A client for `url` (and `opts.mirrors`) over `opts.proxies`.
    pub fn new(url: &str, opts: HttpOptions) -> io::Result<Http> {
        let mut urls = vec![url.to_string()];
        urls.extend(opts.mirrors.iter().cloned());
        for u in &urls {
            if !(u.starts_with("http://") || u.starts_with("https://")) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("'{}' is not an http(s):// URL", crate::redact(u)),
                ));
            }
        }
        let via = |label: String, choice| Via {
            label,
            choice,
            client: Mutex::new(None),
        };
        let mut vias = Vec::new();
        for p in &opts.proxies {
            if p.eq_ignore_ascii_case("DIRECT") {
                vias.push(via("DIRECT".into(), ProxyChoice::Direct));
            } else {
                reqwest::Proxy::all(p.as_str()).map_err(|e| {
                    io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!(
                            "proxy '{}': {}",
                            crate::redact(p),
                            crate::redact_text(&e.to_string())
                        ),
                    )
                })?;
                vias.push(via(crate::redact(p), ProxyChoice::Via(p.clone())));
            }
        }
        if vias.is_empty() {
            let label = env_proxy()
                .map(|p| format!("{} (from the environment)", crate::redact(&p)))
                .unwrap_or_else(|| "DIRECT".into());
            vias.push(via(label, ProxyChoice::FromEnv));
        }
        Ok(Http {
            urls,
            vias,
            current: AtomicUsize::new(0),
            failed_at: Mutex::new(None),
            opts,
            stats: NetStats::default(),
            last_error: Mutex::new(String::new()),
            reached: std::sync::atomic::AtomicBool::new(false),
            shown: crate::redact(url),
            host: reqwest::Url::parse(url)
                .ok()
                .and_then(|u| {
                    let port = u.port().map_or(String::new(), |p| format!(":{p}"));
                    u.host_str().map(|h| format!("{h}{port}"))
                })
                .unwrap_or_default(),
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
            (_, "DIRECT") => format!(" (mirror {})", crate::redact(&self.urls[u])),
            _ => format!(" (mirror {} via proxy {via})", crate::redact(&self.urls[u])),
        }
    }

    /// Which route is in use, for `sheaf stats`.
    pub fn stats(&self) -> sheaf_read::HttpStats {
        let r = self.route();
        let s = &self.stats;
        sheaf_read::HttpStats {
            requests: s.requests.load(Relaxed),
            bytes: s.bytes.load(Relaxed),
            retries: s.retries.load(Relaxed),
            wait_ms: s.wait_ms.load(Relaxed),
            failovers: s.failovers.load(Relaxed),
            errors: s.errors.load(Relaxed),
            url: crate::redact(&self.urls[r / self.vias.len()]),
            via: self.vias[r % self.vias.len()].label.clone(),
            last_error: self.last_error.lock().expect("lock").clone(),
        }
    }

    /// Run a request, failing over and retrying until the deadline.
    /// Returns the body and, for ranges and probes, the total length.
    pub fn get(&self, want: Want<'_>) -> io::Result<(Vec<u8>, u64)> {
        self.get_within(want, self.opts.deadline)
    }

    /// [`Http::get`] with a deadline of its own (at most the configured one).
    pub fn get_within(&self, want: Want<'_>, limit: Duration) -> io::Result<(Vec<u8>, u64)> {
        let mut backoff = Backoff::new(&self.opts, limit, &self.stats, &self.host).announcing(
            &self.opts,
            &self.shown,
            !self.reached.load(Relaxed),
        );
        let deadline = backoff.deadline;
        let mut failed_in_round = 0;
        loop {
            let route = self.route();
            self.stats.requests.fetch_add(1, Relaxed);
            // One try never runs far past the deadline (a hung server).
            let left = deadline.saturating_duration_since(Instant::now());
            let limit = self
                .opts
                .request_timeout
                .min(left.max(Duration::from_millis(500)));
            match self.once(route, want, limit) {
                Ok(v) => {
                    self.stats.bytes.fetch_add(v.0.len() as u64, Relaxed);
                    return Ok(v);
                }
                Err(e) => {
                    self.stats.errors.fetch_add(1, Relaxed);
                    let e = io::Error::new(e.kind(), format!("{e}{}", self.describe(route)));
                    *self.last_error.lock().expect("lock") = crate::redact_text(&e.to_string());
                    if !worth_retrying(&e, self.routes()) {
                        return Err(e);
                    }
                    failed_in_round += 1;
                    // Nothing listening, on every route, and nothing ever
                    // answered: a wrong address or port, not an outage to
                    // wait out (a server that was reached is waited for),
                    // unless asked to wait for one never reached too.
                    if e.kind() == io::ErrorKind::ConnectionRefused
                        && failed_in_round >= self.routes()
                        && !self.reached.load(Relaxed)
                        && !self.opts.wait_for_server
                    {
                        return Err(io::Error::new(
                            e.kind(),
                            "connection refused (nothing is listening there; sheaf waits only for a server it has reached, or with --wait-for-server)",
                        ));
                    }
                    if failed_in_round < self.routes() {
                        self.failover(route);
                        continue;
                    }
                    // Every route failed this round: wait (never past the
                    // deadline), then start over from the next route.
                    backoff.wait(e)?;
                    self.failover(route);
                    failed_in_round = 0;
                }
            }
        }
    }

    /// This process's client for route `v`.
    fn client(&self, v: usize) -> io::Result<reqwest::blocking::Client> {
        let via = &self.vias[v];
        let pid = std::process::id();
        let mut g = via.client.lock().expect("lock");
        if let Some((p, c)) = &*g {
            if *p == pid {
                return Ok(c.clone());
            }
        }
        // rustls needs a process-wide crypto provider; a second install fails
        // harmlessly.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut b = reqwest::blocking::Client::builder()
            .connect_timeout(self.opts.connect_timeout)
            .timeout(self.opts.request_timeout)
            .pool_max_idle_per_host(16)
            .user_agent(concat!("sheaf/", env!("CARGO_PKG_VERSION")));
        b = match &via.choice {
            ProxyChoice::Direct => b.no_proxy(),
            ProxyChoice::Via(p) => b.proxy(
                reqwest::Proxy::all(p.as_str()).map_err(|e| io::Error::other(e.to_string()))?,
            ),
            ProxyChoice::FromEnv => b,
        };
        let c = b
            .build()
            .map_err(|e| io::Error::other(format!("HTTP client: {}", one_line(&e))))?;
        if let Some((_, inherited)) = g.replace((pid, c.clone())) {
            // Built before a fork: dropping it would join a runtime thread
            // that does not exist in this process, and hang.
            std::mem::forget(inherited);
        }
        Ok(c)
    }

    fn once(&self, route: usize, want: Want<'_>, limit: Duration) -> io::Result<(Vec<u8>, u64)> {
        let base = &self.urls[route / self.vias.len()];
        let client = self.client(route % self.vias.len())?;
        let url = match want {
            Want::Object(rel, _) => match base.rfind('/') {
                Some(i) => format!("{}/{rel}", &base[..i]),
                None => return Err(io::Error::other("bad URL")),
            },
            _ => base.clone(),
        };
        let mut req = client.get(&url).timeout(limit);
        let (limit, want_len) = match want {
            Want::Range(from, to) => {
                req = req.header("Range", format!("bytes={from}-{to}"));
                (to - from + 1, Some(to - from + 1))
            }
            Want::Probe(n) => {
                req = req.header("Range", format!("bytes=0-{}", n - 1));
                (sheaf_format::remote::MAX_INDEX_LEN as u64, None)
            }
            Want::Object(_, max) => (max, None),
        };
        let resp = req.send().map_err(|e| {
            let kind = if e.is_timeout() {
                io::ErrorKind::TimedOut
            } else if is_refused(&e) {
                io::ErrorKind::ConnectionRefused
            } else if is_tls_rejection(&e) {
                // Waiting will not make an untrusted server trusted.
                io::ErrorKind::PermissionDenied
            } else {
                io::ErrorKind::Other
            };
            io::Error::new(kind, one_line(&e.without_url()))
        })?;
        self.reached.store(true, Relaxed);
        let status = resp.status().as_u16();
        let read_err =
            |e: io::Error| io::Error::new(e.kind(), format!("reading the reply: {}", one_line(&e)));
        match status {
            206 if !matches!(want, Want::Object(..)) => {}
            200 if matches!(want, Want::Object(..)) => {}
            200 => {
                // Tolerated only for a small index file, which we then
                // read whole; an image must be served with ranges.
                if let Want::Probe(_) = want {
                    let mut body = resp;
                    let mut magic = [0u8; 8];
                    body.read_exact(&mut magic).map_err(read_err)?;
                    if sheaf_format::remote::ImageIndex::is_index(&magic) {
                        let mut all = magic.to_vec();
                        body.take(limit).read_to_end(&mut all).map_err(read_err)?;
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
        let total = if matches!(want, Want::Object(..)) {
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
        // Sized by what was asked (bounded by the caller), never by what the
        // server says it will send.
        let mut body = Vec::with_capacity(want_len.unwrap_or(0).min(limit) as usize);
        resp.take(limit + 1)
            .read_to_end(&mut body)
            .map_err(read_err)?;
        if body.len() as u64 > limit {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the reply is larger than the {limit} bytes expected"),
            ));
        }
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
