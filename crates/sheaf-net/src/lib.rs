//! Remote images: a [`sheaf_read::Source`] that reads byte ranges of an image
//! over HTTP(S) with `Range` requests, from any static web server or
//! S3-compatible store.
//!
//! Owns the network policy: timeouts everywhere, retries with backoff,
//! keep-alive connection reuse, and turning every failure into an error that
//! names the URL. It knows nothing of the format (every byte it returns is
//! verified against its hash by the reader) or of mounts and caches.

use sheaf_read::Source;
use std::io;
use std::time::Duration;

/// Whether `s` names a remote image.
pub fn is_url(s: &str) -> bool {
    s.starts_with("http://") || s.starts_with("https://")
}

/// Network settings.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// Longest wait to connect.
    pub connect_timeout: Duration,
    /// Longest time for one whole request, body included.
    pub request_timeout: Duration,
    /// Attempts per range (1 = no retry).
    pub attempts: u32,
    /// First retry delay; doubled each time.
    pub backoff: Duration,
}

impl Default for HttpOptions {
    fn default() -> Self {
        HttpOptions {
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
            attempts: 4,
            backoff: Duration::from_millis(200),
        }
    }
}

/// An image read over HTTP(S).
pub struct HttpSource {
    url: String,
    len: u64,
    agent: ureq::Agent,
    opts: HttpOptions,
}

/// Whether a failure is worth retrying (the server or network may recover).
fn transient(e: &io::Error) -> bool {
    !matches!(
        e.kind(),
        io::ErrorKind::NotFound | io::ErrorKind::PermissionDenied | io::ErrorKind::InvalidData
    )
}

impl HttpSource {
    /// Connect to `url` and learn the image's length (one ranged request).
    pub fn open(url: &str, opts: HttpOptions) -> io::Result<Self> {
        let tls = ureq::tls::TlsConfig::builder()
            .root_certs(ureq::tls::RootCerts::PlatformVerifier)
            .build();
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_connect(Some(opts.connect_timeout))
            .timeout_global(Some(opts.request_timeout))
            .http_status_as_error(false)
            .tls_config(tls)
            .build()
            .into();
        let mut s = HttpSource {
            url: url.to_string(),
            len: 0,
            agent,
            opts,
        };
        s.len = s.with_retries(|| s.probe_len())?;
        Ok(s)
    }

    /// Run `f`, retrying transient failures with exponential backoff.
    fn with_retries<T>(&self, mut f: impl FnMut() -> io::Result<T>) -> io::Result<T> {
        let mut delay = self.opts.backoff;
        let mut attempt = 1;
        loop {
            match f() {
                Ok(v) => return Ok(v),
                Err(e) if attempt < self.opts.attempts && transient(&e) => {
                    std::thread::sleep(delay);
                    delay *= 2;
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn err(&self, kind: io::ErrorKind, what: String) -> io::Error {
        io::Error::new(kind, what)
    }

    /// GET `bytes=from-to` (inclusive); returns the response.
    fn get_range(&self, from: u64, to: u64) -> io::Result<ureq::http::Response<ureq::Body>> {
        let resp = self
            .agent
            .get(&self.url)
            .header("Range", format!("bytes={from}-{to}"))
            .call()
            .map_err(|e| self.err(io::ErrorKind::Other, e.to_string()))?;
        match resp.status().as_u16() {
            206 => Ok(resp),
            200 => Err(self.err(
                io::ErrorKind::InvalidData,
                "the server ignores Range requests (answered 200 with the whole file)".into(),
            )),
            404 | 410 => Err(self.err(io::ErrorKind::NotFound, format!("HTTP {}", resp.status()))),
            401 | 403 => Err(self.err(
                io::ErrorKind::PermissionDenied,
                format!("HTTP {}", resp.status()),
            )),
            416 => Err(self.err(
                io::ErrorKind::UnexpectedEof,
                format!("HTTP 416: bytes {from}-{to} are beyond the end"),
            )),
            _ => Err(self.err(io::ErrorKind::Other, format!("HTTP {}", resp.status()))),
        }
    }

    fn probe_len(&self) -> io::Result<u64> {
        let resp = self.get_range(0, 0)?;
        let cr = resp
            .headers()
            .get("content-range")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        // "bytes 0-0/TOTAL"
        cr.rsplit_once('/')
            .and_then(|(_, t)| t.trim().parse::<u64>().ok())
            .ok_or_else(|| {
                self.err(
                    io::ErrorKind::InvalidData,
                    format!("no usable Content-Range in the reply ('{cr}')"),
                )
            })
    }

    fn read_once(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let end = offset + buf.len() as u64 - 1;
        let mut resp = self.get_range(offset, end)?;
        let body = resp
            .body_mut()
            .with_config()
            .limit(buf.len() as u64 + 1)
            .read_to_vec()
            .map_err(|e| self.err(io::ErrorKind::Other, format!("reading the reply: {e}")))?;
        if body.len() != buf.len() {
            return Err(self.err(
                io::ErrorKind::Other,
                format!(
                    "short reply: {} of {} bytes at offset {offset}",
                    body.len(),
                    buf.len()
                ),
            ));
        }
        buf.copy_from_slice(&body);
        Ok(())
    }
}

impl Source for HttpSource {
    fn len(&self) -> u64 {
        self.len
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        if offset
            .checked_add(buf.len() as u64)
            .is_none_or(|e| e > self.len)
        {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "read beyond the end of the image",
            ));
        }
        self.with_retries(|| self.read_once(buf, offset))
    }

    fn name(&self) -> &str {
        &self.url
    }
}
