//! Images in object storage: `s3://BUCKET/KEY` on Amazon S3 or any
//! S3-compatible store (Ceph RGW, SeaweedFS, MinIO), through the Apache
//! Arrow project's `object_store` crate (SigV4 signing, ranged GETs, PUT).
//!
//! * Reading: a whole image (ranged GETs; the first GET also gives the
//!   object's length) or a published repository (the index at KEY, its
//!   objects at `dirname(KEY)/objects/…`), told apart by the first bytes as
//!   for HTTP. Writing: [`S3::put`] for `sheaf publish … s3://BUCKET/PREFIX`.
//! * Credentials, region and endpoint are found as the AWS tools find them
//!   ([`S3Config::from_env`]): the environment first, then the profile's
//!   sections of `~/.aws/credentials` and `~/.aws/config`. With no
//!   credentials at all (or `AWS_NO_SIGN_REQUEST=true`) requests go
//!   unsigned: public buckets.
//! * Failures follow the HTTP client's rule ([`crate::http::Backoff`]): the
//!   crate's own retries are off, and a request that failed for a reason
//!   waiting may fix (a refused or dropped connection, a timeout, a 5xx) is
//!   tried again with capped backoff until `--timeout`, so an outage shorter
//!   than that is only a wait. Answers that waiting cannot change (access
//!   denied, no such bucket, no such key) fail at once with one line naming
//!   the bucket and key.
//! * Secrets never leave [`S3Config`]: errors are made here from the
//!   status and the S3 error code, never from the reply's body or the
//!   request's headers.

use crate::http::{Backoff, HttpOptions, NetStats, Want};
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::client::{HttpError, HttpErrorKind};
use object_store::path::Path as ObjPath;
use object_store::{ClientOptions, GetOptions, GetRange, ObjectStore, ObjectStoreExt, RetryConfig};
use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Whether `s` is an `s3://` URL.
pub fn is_s3(s: &str) -> bool {
    s.starts_with("s3://")
}

/// Split `s3://BUCKET/KEY` into bucket and key (the key may be empty: a
/// prefix for publishing).
pub fn parse_url(url: &str) -> io::Result<(String, String)> {
    let bad = |why: &str| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("'{}': {why}", crate::redact(url)),
        )
    };
    let rest = url
        .strip_prefix("s3://")
        .ok_or_else(|| bad("not an s3:// URL"))?;
    let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty()
        || bucket.contains(['@', ':', '?', '#'])
        || !bucket
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
    {
        return Err(bad("not a bucket name (s3://BUCKET/KEY)"));
    }
    if key.split('/').any(|c| c == "." || c == "..") || key.contains("//") {
        return Err(bad("'.', '..' and empty names are not keys"));
    }
    Ok((bucket.to_string(), key.to_string()))
}

/// Access keys (never shown anywhere).
#[derive(Clone)]
struct Keys {
    id: String,
    secret: String,
    token: Option<String>,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Keys(***)")
    }
}

/// Where and how to reach the store, found as the AWS tools find it.
#[derive(Debug, Clone)]
pub struct S3Config {
    /// Region (signing; the AWS endpoint).
    pub region: String,
    /// A custom endpoint (`http(s)://HOST[:PORT]`), or None for AWS.
    pub endpoint: Option<String>,
    /// Path-style addressing (`ENDPOINT/BUCKET/KEY`) rather than
    /// virtual-hosted (`BUCKET.ENDPOINT/KEY`).
    pub path_style: bool,
    /// The profile whose files were read (for messages).
    pub profile: String,
    keys: Option<Keys>,
}

/// `[section]`'s keys in an INI file of the AWS kind; indented lines under
/// `name =` (as `s3 =` nests `addressing_style`) become `name.key`.
fn ini_section(text: &str, section: &str) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let mut inside = false;
    let mut parent: Option<String> = None;
    for raw in text.lines() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            inside = name.split_whitespace().collect::<Vec<_>>().join(" ") == section;
            parent = None;
            continue;
        }
        if !inside {
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            continue;
        };
        let (k, v) = (k.trim().to_ascii_lowercase(), v.trim().to_string());
        let nested = raw.starts_with([' ', '\t']);
        match (&parent, nested) {
            (Some(p), true) => {
                out.insert(format!("{p}.{k}"), v);
            }
            _ => {
                parent = v.is_empty().then(|| k.clone());
                out.insert(k, v);
            }
        }
    }
    out
}

fn truthy(v: &str) -> Option<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

impl S3Config {
    /// The configuration the environment gives, in the AWS CLI's order:
    ///
    /// * keys: `AWS_ACCESS_KEY_ID` + `AWS_SECRET_ACCESS_KEY` (+
    ///   `AWS_SESSION_TOKEN`), else the profile (`AWS_PROFILE`, else
    ///   `default`) in `~/.aws/credentials` (`AWS_SHARED_CREDENTIALS_FILE`)
    ///   then `~/.aws/config` (`AWS_CONFIG_FILE`); none, or
    ///   `AWS_NO_SIGN_REQUEST=true`: anonymous.
    /// * region: `AWS_REGION`, `AWS_DEFAULT_REGION`, the profile's
    ///   `region`, else `us-east-1`.
    /// * endpoint: `AWS_ENDPOINT_URL_S3`, `AWS_ENDPOINT_URL`, the profile's
    ///   `s3 = endpoint_url`, `endpoint_url` or `endpoint`, else AWS.
    /// * path style: `AWS_S3_FORCE_PATH_STYLE=true|false`, else the
    ///   profile's `s3 = addressing_style = path|virtual`, else path style
    ///   for a custom endpoint and virtual-hosted for AWS.
    pub fn from_env() -> io::Result<S3Config> {
        Self::from_lookup(&|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
    }

    fn from_lookup(env: &dyn Fn(&str) -> Option<String>) -> io::Result<S3Config> {
        let home = env("HOME").unwrap_or_default();
        let profile = env("AWS_PROFILE")
            .or_else(|| env("AWS_DEFAULT_PROFILE"))
            .unwrap_or_else(|| "default".into());
        let read = |var: &str, rel: &str| -> String {
            let p = env(var).unwrap_or_else(|| format!("{home}/.aws/{rel}"));
            std::fs::read_to_string(p).unwrap_or_default()
        };
        let creds = ini_section(
            &read("AWS_SHARED_CREDENTIALS_FILE", "credentials"),
            &profile,
        );
        let conf_name = if profile == "default" {
            "default".to_string()
        } else {
            format!("profile {profile}")
        };
        let conf = ini_section(&read("AWS_CONFIG_FILE", "config"), &conf_name);
        let from_files = |k: &str| {
            creds
                .get(k)
                .or_else(|| conf.get(k))
                .filter(|v| !v.is_empty())
                .cloned()
        };
        let anonymous = env("AWS_NO_SIGN_REQUEST")
            .and_then(|v| truthy(&v))
            .unwrap_or(false);
        let keys = match (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY")) {
            (Some(id), Some(secret)) => Some(Keys {
                id,
                secret,
                token: env("AWS_SESSION_TOKEN"),
            }),
            _ => match (
                from_files("aws_access_key_id"),
                from_files("aws_secret_access_key"),
            ) {
                (Some(id), Some(secret)) => Some(Keys {
                    id,
                    secret,
                    token: from_files("aws_session_token"),
                }),
                _ => None,
            },
        }
        .filter(|_| !anonymous);
        let region = env("AWS_REGION")
            .or_else(|| env("AWS_DEFAULT_REGION"))
            .or_else(|| conf.get("region").cloned())
            .unwrap_or_else(|| "us-east-1".into());
        let endpoint = env("AWS_ENDPOINT_URL_S3")
            .or_else(|| env("AWS_ENDPOINT_URL"))
            .or_else(|| conf.get("s3.endpoint_url").cloned())
            .or_else(|| conf.get("endpoint_url").cloned())
            .or_else(|| conf.get("endpoint").cloned())
            .filter(|e| !e.is_empty())
            .map(|e| e.trim_end_matches('/').to_string());
        if let Some(e) = &endpoint {
            if !(e.starts_with("http://") || e.starts_with("https://")) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "S3 endpoint '{}' is not an http(s):// URL (AWS_ENDPOINT_URL or the profile's endpoint_url)",
                        crate::redact(e)
                    ),
                ));
            }
        }
        let path_style = env("AWS_S3_FORCE_PATH_STYLE")
            .and_then(|v| truthy(&v))
            .or_else(|| {
                conf.get("s3.addressing_style")
                    .and_then(|s| match s.as_str() {
                        "path" => Some(true),
                        "virtual" => Some(false),
                        _ => None,
                    })
            })
            .unwrap_or(endpoint.is_some());
        Ok(S3Config {
            region,
            endpoint,
            path_style,
            profile,
            keys,
        })
    }

    /// Whether requests are signed.
    pub fn signed(&self) -> bool {
        self.keys.is_some()
    }

    fn store(&self, bucket: &str, opts: &HttpOptions) -> io::Result<AmazonS3> {
        // rustls needs a process-wide crypto provider; a second install
        // fails harmlessly.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut client = ClientOptions::new()
            .with_timeout(opts.request_timeout)
            .with_connect_timeout(opts.connect_timeout)
            .with_user_agent(reqwest::header::HeaderValue::from_static(concat!(
                "sheaf/",
                env!("CARGO_PKG_VERSION")
            )));
        let mut b = AmazonS3Builder::new()
            .with_bucket_name(bucket)
            .with_region(&self.region)
            // Retries are ours (the deadline rule of every transport).
            .with_retry(RetryConfig {
                max_retries: 0,
                retry_timeout: Duration::ZERO,
                ..Default::default()
            });
        if let Some(e) = &self.endpoint {
            client = client.with_allow_http(e.starts_with("http://"));
            if self.path_style {
                b = b.with_endpoint(e);
            } else {
                // Virtual-hosted on a custom endpoint: the bucket is the
                // first label of the host.
                let (scheme, host) = e.split_once("://").unwrap_or(("https", e));
                b = b
                    .with_endpoint(format!("{scheme}://{bucket}.{host}"))
                    .with_virtual_hosted_style_request(true);
            }
        } else if !self.path_style {
            b = b.with_virtual_hosted_style_request(true);
        }
        b = match &self.keys {
            Some(k) => {
                let mut b = b
                    .with_access_key_id(&k.id)
                    .with_secret_access_key(&k.secret);
                if let Some(t) = &k.token {
                    b = b.with_token(t);
                }
                b
            }
            None => b.with_skip_signature(true),
        };
        b.with_client_options(client)
            .build()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, scrub(&e.to_string())))
    }
}

/// One process's runtime and client (a `fork` keeps neither's threads).
struct Client {
    /// Always `Some` until dropped.
    rt: Option<tokio::runtime::Runtime>,
    store: AmazonS3,
}

impl Drop for Client {
    fn drop(&mut self) {
        // Dropping a runtime waits for its threads, which tokio refuses
        // (a panic) on a task of another runtime, where the snapshotter's
        // requests drop their sources: let them end in the background.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// One try: the client, and how long it may take.
struct Try<'a> {
    c: &'a Client,
    limit: Duration,
}

impl Try<'_> {
    /// Run `f` on the client's runtime, for at most the try's limit. A
    /// caller on a task of another runtime (the snapshotter's gRPC service)
    /// may not block on one there (tokio panics): it waits for this
    /// client's runtime from a thread of its own instead.
    fn block<F>(&self, f: F) -> io::Result<F::Output>
    where
        F: std::future::Future + Send,
        F::Output: Send,
    {
        let rt = self.c.rt.as_ref().expect("a live client has its runtime");
        let run = || rt.block_on(async { tokio::time::timeout(self.limit, f).await });
        let r = if tokio::runtime::Handle::try_current().is_ok() {
            std::thread::scope(|s| s.spawn(run).join())
                .unwrap_or_else(|p| std::panic::resume_unwind(p))
        } else {
            run()
        };
        r.map_err(|_| {
            io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no answer within {:.1} s", self.limit.as_secs_f64()),
            )
        })
    }
}

/// A client for one bucket, and the key the user named in it.
pub struct S3 {
    url: String,
    bucket: String,
    key: String,
    conf: S3Config,
    opts: HttpOptions,
    /// Counters.
    pub stats: NetStats,
    last_error: Mutex<String>,
    client: Mutex<Option<(u32, Arc<Client>)>>,
    /// Whether the store has answered yet (with any status).
    reached: AtomicBool,
    /// `HOST[:PORT]` of the endpoint: who is waited for.
    host: String,
}

/// The S3 error code in an XML error body (`<Code>NoSuchKey</Code>`): a
/// fixed word, safe to show, unlike the rest of the body.
fn error_code(body: &str) -> Option<&str> {
    let s = body.find("<Code>")? + 6;
    let e = body[s..].find("</Code>")? + s;
    let c = &body[s..e];
    (!c.is_empty() && c.len() < 64 && c.bytes().all(|b| b.is_ascii_alphanumeric())).then_some(c)
}

/// `text` on one line with URLs redacted.
fn scrub(text: &str) -> String {
    crate::redact_text(&text.replace(['\n', '\r'], " "))
}

/// The whole chain of an error as text (where the crate keeps the status
/// and the reply's body), and its transport error if it has one.
fn chain<'a>(e: &'a (dyn std::error::Error + 'static)) -> (String, Option<&'a HttpError>) {
    let (mut text, mut http) = (String::new(), None);
    let mut cur = Some(e);
    while let Some(c) = cur {
        text.push_str(&c.to_string());
        text.push('\n');
        if http.is_none() {
            http = c.downcast_ref::<HttpError>();
        }
        if let Some(io) = c.downcast_ref::<io::Error>() {
            if io.kind() == io::ErrorKind::ConnectionRefused {
                text.push_str("Connection refused\n");
            }
        }
        cur = c.source();
    }
    (text, http)
}

/// The HTTP status in the crate's words ("status code: 404").
fn status_of(text: &str) -> Option<u16> {
    let i = text.find("status code: ")? + 13;
    text.get(i..i + 3)?.parse().ok()
}

impl S3 {
    /// A client for `url` (`s3://BUCKET/KEY`) under the environment's
    /// configuration ([`S3Config::from_env`]).
    pub fn new(url: &str, opts: HttpOptions) -> io::Result<S3> {
        Self::with_config(url, opts, S3Config::from_env()?)
    }

    /// A client for `url` under `conf`.
    pub fn with_config(url: &str, opts: HttpOptions, conf: S3Config) -> io::Result<S3> {
        let (bucket, key) = parse_url(url)?;
        if !opts.mirrors.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "--mirror is for http(s):// images, not s3://",
            ));
        }
        let host = match &conf.endpoint {
            Some(e) => e.split_once("://").map_or(e.as_str(), |x| x.1).to_string(),
            None => format!("s3.{}.amazonaws.com", conf.region),
        };
        Ok(S3 {
            url: crate::redact(url),
            bucket,
            key,
            conf,
            opts,
            stats: NetStats::default(),
            last_error: Mutex::new(String::new()),
            client: Mutex::new(None),
            reached: AtomicBool::new(false),
            host,
        })
    }

    /// The bucket.
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// The URL the user gave.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// This process's client.
    fn client(&self) -> io::Result<Arc<Client>> {
        let pid = std::process::id();
        let mut g = self.client.lock().expect("lock");
        if let Some((p, c)) = &*g {
            if *p == pid {
                return Ok(c.clone());
            }
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("sheaf-s3")
            .enable_all()
            .build()?;
        let store = self.conf.store(&self.bucket, &self.opts)?;
        let c = Arc::new(Client {
            rt: Some(rt),
            store,
        });
        if let Some((_, inherited)) = g.replace((pid, c.clone())) {
            // Built before a fork: its threads are not in this process, and
            // dropping it would wait for them.
            std::mem::forget(inherited);
        }
        Ok(c)
    }

    /// The key of `rel` next to the named key (a repository's objects).
    fn sibling(&self, rel: &str) -> String {
        match self.key.rfind('/') {
            Some(i) => format!("{}/{rel}", &self.key[..i]),
            None => rel.to_string(),
        }
    }

    /// The key `rel` under the named prefix (publishing).
    pub fn under(&self, rel: &str) -> String {
        let p = self.key.trim_end_matches('/');
        if p.is_empty() {
            rel.to_string()
        } else {
            format!("{p}/{rel}")
        }
    }

    /// An `object_store` error as one line naming the bucket and key,
    /// with a kind the retry rule understands.
    fn error(&self, key: &str, e: object_store::Error) -> io::Error {
        let (text, http) = chain(&e);
        let code = error_code(&text);
        let status = status_of(&text);
        // The message follows the URL the user gave: name the key only
        // when it is another (a repository's object).
        let at = if key == self.key {
            String::new()
        } else {
            format!(" to s3://{}/{key}", self.bucket)
        };
        let hint = if self.conf.signed() {
            "check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY"
        } else {
            "no credentials were found, so the request was anonymous: set AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or AWS_PROFILE"
        };
        let not_found = matches!(e, object_store::Error::NotFound { .. }) || status == Some(404);
        let denied = matches!(
            e,
            object_store::Error::PermissionDenied { .. }
                | object_store::Error::Unauthenticated { .. }
        ) || matches!(status, Some(401 | 403));
        if not_found {
            let bucket = self.bucket.clone();
            return io::Error::new(
                io::ErrorKind::NotFound,
                if code == Some("NoSuchBucket") {
                    Missing::Bucket { bucket }
                } else {
                    Missing::Key {
                        key: key.to_string(),
                        bucket,
                    }
                },
            );
        }
        if denied {
            return io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "access denied{at} ({}{hint})",
                    code.map(|c| format!("{c}; ")).unwrap_or_default()
                ),
            );
        }
        // The reply's body may quote the request: keep only the status and
        // the S3 error code, or the transport's own words.
        let (kind, what) = if text.contains("Connection refused") {
            (
                io::ErrorKind::ConnectionRefused,
                "connection refused".to_string(),
            )
        } else if let Some(h) = http {
            let kind = match h.kind() {
                HttpErrorKind::Timeout => io::ErrorKind::TimedOut,
                _ => io::ErrorKind::Other,
            };
            (kind, scrub(&sheaf_format::one_line(h)))
        } else if let Some(s) = status {
            let kind = if (400..500).contains(&s) && s != 408 && s != 429 {
                io::ErrorKind::InvalidInput
            } else {
                io::ErrorKind::Other
            };
            (
                kind,
                format!(
                    "HTTP {s}{}",
                    code.map(|c| format!(" {c}")).unwrap_or_default()
                ),
            )
        } else {
            (io::ErrorKind::Other, scrub(&e.to_string()))
        };
        io::Error::new(kind, format!("{what}{at} (at {})", self.host))
    }

    /// Run `f` with the retry rule of every transport.
    fn retrying<T>(
        &self,
        key: &str,
        limit: Duration,
        f: impl Fn(&Try<'_>, &ObjPath) -> io::Result<Result<T, object_store::Error>>,
    ) -> io::Result<T> {
        let path = ObjPath::from(key);
        let mut backoff = Backoff::new(&self.opts, limit, &self.stats, &self.host).announcing(
            &self.opts,
            &self.url,
            !self.reached.load(Relaxed),
        );
        loop {
            self.stats.requests.fetch_add(1, Relaxed);
            let c = self.client()?;
            // One try never runs far past the deadline (a hung store).
            let left = backoff.deadline.saturating_duration_since(Instant::now());
            let t = Try {
                c: &c,
                limit: self
                    .opts
                    .request_timeout
                    .min(left.max(Duration::from_millis(500))),
            };
            let e = match f(&t, &path) {
                Ok(Ok(v)) => {
                    self.reached.store(true, Relaxed);
                    return Ok(v);
                }
                Ok(Err(e)) => self.error(key, e),
                Err(e) => e,
            };
            self.stats.errors.fetch_add(1, Relaxed);
            *self.last_error.lock().expect("lock") = scrub(&e.to_string());
            match e.kind() {
                io::ErrorKind::NotFound
                | io::ErrorKind::PermissionDenied
                | io::ErrorKind::InvalidData
                | io::ErrorKind::InvalidInput
                | io::ErrorKind::UnexpectedEof => {
                    self.reached.store(true, Relaxed);
                    return Err(e);
                }
                io::ErrorKind::ConnectionRefused
                    if !self.reached.load(Relaxed) && !self.opts.wait_for_server =>
                {
                    return Err(io::Error::new(
                        e.kind(),
                        format!("{e} (nothing is listening there; sheaf waits only for a server it has reached, or with --wait-for-server)"),
                    ));
                }
                _ => backoff.wait(e)?,
            }
        }
    }

    /// See [`crate::http::Http::get`].
    pub fn get(&self, want: Want<'_>) -> io::Result<(Vec<u8>, u64)> {
        self.get_within(want, self.opts.deadline)
    }

    /// See [`crate::http::Http::get_within`].
    pub fn get_within(&self, want: Want<'_>, limit: Duration) -> io::Result<(Vec<u8>, u64)> {
        let short =
            |got: usize, n: u64| io::Error::other(format!("short reply: {got} of {n} bytes"));
        let r = match want {
            Want::Range(from, to) => self.retrying(&self.key, limit, |t, p| {
                let n = to - from + 1;
                Ok(match t.block(t.c.store.get_range(p, from..to + 1))? {
                    Ok(b) if b.len() as u64 == n => Ok((b.to_vec(), 0)),
                    Ok(b) => return Err(short(b.len(), n)),
                    Err(e) => Err(e),
                })
            }),
            Want::Probe(n) => self.retrying(&self.key, limit, |t, p| {
                let opts = GetOptions {
                    range: Some(GetRange::Bounded(0..n)),
                    ..Default::default()
                };
                t.block(async {
                    let r = t.c.store.get_opts(p, opts).await?;
                    let size = r.meta.size;
                    Ok((r.bytes().await?.to_vec(), size))
                })
            }),
            Want::Object(rel, max) => {
                let key = self.sibling(rel);
                self.retrying(&key, limit, |t, p| {
                    t.block(async {
                        let r = match t.c.store.get(p).await {
                            Ok(r) => r,
                            Err(e) => return Ok(Err(e)),
                        };
                        if r.meta.size > max {
                            return Err(io::Error::new(
                                io::ErrorKind::InvalidData,
                                format!(
                                    "s3://{}/{key}: {} bytes, more than the {max} expected",
                                    self.bucket, r.meta.size
                                ),
                            ));
                        }
                        Ok(r.bytes().await.map(|b| (b.to_vec(), 0)))
                    })?
                })
            }
        };
        if let Ok((b, _)) = &r {
            self.stats.bytes.fetch_add(b.len() as u64, Relaxed);
        }
        r
    }

    /// Whether `key` exists (a HEAD).
    pub fn exists(&self, key: &str) -> io::Result<bool> {
        match self.retrying(key, self.opts.deadline, |t, p| {
            Ok(t.block(t.c.store.head(p))?.map(|_| ()))
        }) {
            Ok(()) => Ok(true),
            Err(e) if matches!(Missing::of(&e), Some(Missing::Key { .. })) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Write `bytes` as `key` in one PUT: readers see the whole object or
    /// none.
    pub fn put(&self, key: &str, bytes: &[u8]) -> io::Result<()> {
        let payload = object_store::PutPayload::from(bytes.to_vec());
        self.retrying(key, self.opts.deadline, |t, p| {
            Ok(t.block(t.c.store.put(p, payload.clone()))?.map(|_| ()))
        })
    }

    /// Counters for `sheaf stats`.
    pub fn stats(&self) -> sheaf_read::S3Stats {
        let s = &self.stats;
        sheaf_read::S3Stats {
            requests: s.requests.load(Relaxed),
            bytes: s.bytes.load(Relaxed),
            retries: s.retries.load(Relaxed),
            wait_ms: s.wait_ms.load(Relaxed),
            errors: s.errors.load(Relaxed),
            url: self.url.clone(),
            endpoint: (self.conf.endpoint.as_deref().map(crate::redact))
                .unwrap_or_else(|| self.host.clone()),
            signed: self.conf.signed(),
            last_error: self.last_error.lock().expect("lock").clone(),
        }
    }
}

/// What a NotFound error of S3 is missing: callers that decide on it (a
/// missing key is `exists` answering false, a missing bucket an error)
/// look at this, never at the message.
#[derive(Debug, thiserror::Error)]
enum Missing {
    #[error("no such bucket '{bucket}'")]
    Bucket { bucket: String },
    #[error("no such key '{key}' in bucket '{bucket}'")]
    Key { key: String, bucket: String },
}

impl Missing {
    /// The missing thing `e` reports, if it is such an error.
    fn of(e: &io::Error) -> Option<&Missing> {
        e.get_ref()?.downcast_ref::<Missing>()
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_missing_key_is_known_by_its_type_not_its_text() {
        let key = io::Error::new(
            io::ErrorKind::NotFound,
            Missing::Key {
                key: "a/b".into(),
                bucket: "bk".into(),
            },
        );
        assert_eq!(key.to_string(), "no such key 'a/b' in bucket 'bk'");
        assert!(matches!(Missing::of(&key), Some(Missing::Key { .. })));
        let bucket = io::Error::new(
            io::ErrorKind::NotFound,
            Missing::Bucket {
                bucket: "bk".into(),
            },
        );
        assert_eq!(bucket.to_string(), "no such bucket 'bk'");
        assert!(matches!(Missing::of(&bucket), Some(Missing::Bucket { .. })));
        let text = io::Error::new(io::ErrorKind::NotFound, "no such key 'x' in bucket 'y'");
        assert!(Missing::of(&text).is_none());
    }
    use super::*;

    fn conf(vars: &[(&str, &str)]) -> S3Config {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        S3Config::from_lookup(&|k| m.get(k).cloned()).unwrap()
    }

    #[test]
    fn urls() {
        assert_eq!(
            parse_url("s3://bkt/a/b.sheaf").unwrap(),
            ("bkt".into(), "a/b.sheaf".into())
        );
        assert_eq!(parse_url("s3://bkt").unwrap(), ("bkt".into(), "".into()));
        for bad in [
            "s3:///k",
            "s3://u:p@bkt/k",
            "s3://bkt/a/../b",
            "s3://bkt/a//b",
            "http://x/y",
        ] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn configuration_as_the_aws_tools_find_it() {
        let t = tempfile::tempdir().unwrap();
        let aws = t.path().join(".aws");
        std::fs::create_dir(&aws).unwrap();
        std::fs::write(
            aws.join("credentials"),
            "[default]\naws_access_key_id = D\naws_secret_access_key = DS\n\
             [lab]\naws_access_key_id = L\naws_secret_access_key = LS\naws_session_token = LT\n",
        )
        .unwrap();
        std::fs::write(
            aws.join("config"),
            "[default]\nregion = eu-west-1\n\
             [profile lab]\nregion = lab-1\nendpoint_url = http://127.0.0.1:8333\n\
             s3 =\n  addressing_style = virtual\n",
        )
        .unwrap();
        let home = t.path().to_str().unwrap();
        let c = conf(&[("HOME", home)]);
        assert_eq!(c.keys.as_ref().unwrap().id, "D");
        assert_eq!(
            (c.region.as_str(), c.endpoint.as_deref()),
            ("eu-west-1", None)
        );
        assert!(!c.path_style);
        let c = conf(&[("HOME", home), ("AWS_PROFILE", "lab")]);
        let k = c.keys.as_ref().unwrap();
        assert_eq!((k.id.as_str(), k.token.as_deref()), ("L", Some("LT")));
        assert_eq!(c.endpoint.as_deref(), Some("http://127.0.0.1:8333"));
        assert_eq!(c.region, "lab-1");
        assert!(!c.path_style, "the profile asked for virtual-hosted");
        // The environment wins over the files.
        let c = conf(&[
            ("HOME", home),
            ("AWS_PROFILE", "lab"),
            ("AWS_ACCESS_KEY_ID", "E"),
            ("AWS_SECRET_ACCESS_KEY", "ES"),
            ("AWS_REGION", "r"),
            ("AWS_ENDPOINT_URL", "http://h:1/"),
            ("AWS_S3_FORCE_PATH_STYLE", "true"),
        ]);
        assert_eq!(c.keys.as_ref().unwrap().id, "E");
        assert_eq!(
            (c.region.as_str(), c.endpoint.as_deref(), c.path_style),
            ("r", Some("http://h:1"), true)
        );
        // A custom endpoint is path style unless asked otherwise.
        let c = conf(&[("HOME", "/nonexistent"), ("AWS_ENDPOINT_URL", "http://h:1")]);
        assert!(c.path_style && !c.signed());
        assert_eq!(c.region, "us-east-1");
        let c = conf(&[("HOME", home), ("AWS_NO_SIGN_REQUEST", "true")]);
        assert!(!c.signed());
        // Secrets are never in Debug output.
        let d = format!("{:?}", conf(&[("HOME", home), ("AWS_PROFILE", "lab")]));
        assert!(!d.contains("LS") && !d.contains("LT"), "{d}");
    }

    #[test]
    fn error_codes_are_words() {
        assert_eq!(
            error_code("<Error><Code>NoSuchBucket</Code><Message>x</Message></Error>"),
            Some("NoSuchBucket")
        );
        assert_eq!(error_code("<Code>a b</Code>"), None);
        assert_eq!(
            status_of("Error performing GET http://h/b/k in 2ms - Server returned non-2xx status code: 404 Not Found: <Error>"),
            Some(404)
        );
        assert_eq!(status_of("error sending request"), None);
        assert_eq!(
            scrub("a\nb http://u:pw@h/x?X-Amz-Signature=zz"),
            "a b http://u:***@h/x?X-Amz-Signature=***"
        );
        assert_eq!(error_code("nothing"), None);
    }
}
