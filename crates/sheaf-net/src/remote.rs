//! [`RemoteSource`]: an image at a URL, in either form.
//!
//! * **Whole image** (`https://host/img.sheaf`): byte ranges with `Range`
//!   requests.
//! * **Published repository** (`https://host/repo/NAME`, written by
//!   `sheaf publish`): NAME is an image index; pages and blocks are
//!   immutable objects under `repo/objects/`, fetched whole by digest, which
//!   caching proxies and CDNs cache well.
//!
//! Which one is learned from the first bytes. When the server cannot be
//! reached at all and the node cache holds the index last seen at the URL,
//! the image opens from that (offline); pages and blocks then come from the
//! cache alone.

use crate::cache::DiskCache;
use crate::http::{Http, HttpOptions, Want};
use crate::s3::S3;
use crate::sftp::Sftp;
use sheaf_format::remote::{object_path, ImageIndex};
use sheaf_format::{BlockRef, Codec, HEADER_LEN};
use sheaf_read::Source;
use std::io;
use std::time::{Duration, SystemTime};

/// How long opening waits for a server before a cached index stands in.
const OFFLINE_PROBE: Duration = Duration::from_secs(3);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    Whole,
    Repo,
}

/// How bytes are fetched: HTTP(S) over routes, or SFTP from one SSH server.
pub enum Transport {
    /// `http://`, `https://`.
    Http(Http),
    /// `ssh://`.
    Ssh(Sftp),
    /// `s3://`.
    S3(S3),
}

/// Most bytes one range request may ask for. Every range sheaf reads is a
/// block, a page, a coalesced prefetch (8 MiB) or an index (64 MiB); a
/// larger one can only come from a length a server claimed, and the reply
/// buffer must never be sized by a server.
pub const MAX_RANGE: u64 = sheaf_format::remote::MAX_INDEX_LEN as u64;

fn check_range(want: &Want<'_>) -> io::Result<()> {
    match *want {
        Want::Range(from, to) if to < from || to - from >= MAX_RANGE => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "refusing to read {} bytes at once (a length the server claimed?)",
                to.wrapping_sub(from).wrapping_add(1)
            ),
        )),
        _ => Ok(()),
    }
}

impl Transport {
    /// The client for `url`'s scheme.
    pub fn new(url: &str, opts: HttpOptions) -> io::Result<Transport> {
        Ok(if url.starts_with("ssh://") {
            Transport::Ssh(Sftp::new(url, opts)?)
        } else if crate::s3::is_s3(url) {
            Transport::S3(S3::new(url, opts)?)
        } else {
            Transport::Http(Http::new(url, opts)?)
        })
    }

    /// See [`Http::get`].
    pub fn get(&self, want: Want<'_>) -> io::Result<(Vec<u8>, u64)> {
        check_range(&want)?;
        match self {
            Transport::Http(h) => h.get(want),
            Transport::Ssh(s) => s.get(want),
            Transport::S3(s) => s.get(want),
        }
    }

    /// See [`Http::get_within`].
    pub fn get_within(&self, want: Want<'_>, limit: Duration) -> io::Result<(Vec<u8>, u64)> {
        check_range(&want)?;
        match self {
            Transport::Http(h) => h.get_within(want, limit),
            Transport::Ssh(s) => s.get_within(want, limit),
            Transport::S3(s) => s.get_within(want, limit),
        }
    }

    /// Data failed verification: move to another route if there is one.
    pub fn reject(&self) -> bool {
        match self {
            Transport::Http(h) => h.reject(),
            Transport::Ssh(_) | Transport::S3(_) => false,
        }
    }

    /// Counters for `sheaf stats`.
    pub fn stats(&self) -> sheaf_read::TransportStats {
        match self {
            Transport::Http(h) => sheaf_read::TransportStats::Http(h.stats()),
            Transport::Ssh(s) => sheaf_read::TransportStats::Ssh(s.stats()),
            Transport::S3(s) => sheaf_read::TransportStats::S3(s.stats()),
        }
    }
}

/// An image read over HTTP(S), SSH or S3, or offline from a cached index.
pub struct RemoteSource {
    name: String,
    form: Form,
    len: u64,
    /// Ranges known without asking: the whole index of a repository or an
    /// offline image, or the header bytes the probe brought.
    index: ImageIndex,
    /// None when offline.
    http: Option<Transport>,
    /// When the cached index used offline was saved.
    offline_since: Option<SystemTime>,
}

/// Whether an error means "the server is unreachable" (so a cached index
/// may stand in) rather than "the server answered no".
fn unreachable(e: &io::Error) -> bool {
    !matches!(
        e.kind(),
        io::ErrorKind::NotFound
            | io::ErrorKind::PermissionDenied
            | io::ErrorKind::InvalidData
            | io::ErrorKind::InvalidInput
            | io::ErrorKind::UnexpectedEof
    )
}

impl RemoteSource {
    /// Open the image at `url`; with a `cache`, fall back to the index it
    /// holds for `url` when the network is down.
    pub fn open(url: &str, opts: HttpOptions, cache: Option<&DiskCache>) -> io::Result<Self> {
        let wait = opts.wait_for_server;
        let http = Transport::new(url, opts)?;
        // With an index in the cache, an unreachable server need not be
        // waited for up to the whole timeout: the cached index stands in.
        // Read once: it decides the wait and is what stands in. Asked to
        // wait for the server (`wait_for_server`), opening waits the whole
        // timeout first: an offline image reads only what the cache holds,
        // for as long as it is mounted.
        let cached = cache.and_then(|c| c.load_index(url));
        let limit = if cached.is_some() && !wait {
            OFFLINE_PROBE
        } else {
            Duration::MAX
        };
        match Self::probe(&http, limit) {
            Ok((form, len, index)) => Ok(RemoteSource {
                name: crate::redact(url),
                form,
                len,
                index,
                http: Some(http),
                offline_since: None,
            }),
            Err(e) if unreachable(&e) => match cached {
                Some((index, when)) => Ok(RemoteSource {
                    name: crate::redact(url),
                    form: Form::Repo,
                    len: index.file_len,
                    index,
                    http: None,
                    offline_since: Some(when),
                }),
                None => Err(e),
            },
            Err(e) => Err(e),
        }
    }

    /// First request: the header (or an index, whole).
    fn probe(http: &Transport, limit: Duration) -> io::Result<(Form, u64, ImageIndex)> {
        let (head, total) = http.get_within(Want::Probe(HEADER_LEN as u64), limit)?;
        if ImageIndex::is_index(&head) {
            if total > sheaf_format::remote::MAX_INDEX_LEN as u64 {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "image index: the server claims {total} bytes (an index is at most {} MiB)",
                        sheaf_format::remote::MAX_INDEX_LEN >> 20
                    ),
                ));
            }
            let all = if head.len() as u64 >= total {
                head
            } else {
                http.get(Want::Range(0, total - 1))?.0
            };
            let index = ImageIndex::decode(&all).map_err(|e| {
                io::Error::new(io::ErrorKind::InvalidData, format!("image index: {e}"))
            })?;
            return Ok((Form::Repo, index.file_len, index));
        }
        let mut index = ImageIndex {
            file_len: total,
            ranges: Vec::new(),
        };
        if head.len() == HEADER_LEN {
            index.add(0, &head);
        }
        Ok((Form::Whole, total, index))
    }

    /// When offline, the time the cached index was saved.
    pub fn offline_since(&self) -> Option<SystemTime> {
        self.offline_since
    }

    /// Whether this is a published repository (objects fetched by digest).
    pub fn is_repository(&self) -> bool {
        self.form == Form::Repo && self.http.is_some()
    }

    fn offline_error(&self) -> io::Error {
        io::Error::new(
            io::ErrorKind::NotConnected,
            "offline (server unreachable) and not in the node cache",
        )
    }
}

impl Source for RemoteSource {
    fn len(&self) -> u64 {
        self.len
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        if buf.is_empty() || self.index.read(buf, offset) {
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
        match (&self.http, self.form) {
            (Some(h), Form::Whole) => {
                let (b, _) = h.get(Want::Range(offset, offset + buf.len() as u64 - 1))?;
                buf.copy_from_slice(&b);
                Ok(())
            }
            (Some(_), Form::Repo) => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "bytes {offset}+{} are neither in the published index nor an object",
                    buf.len()
                ),
            )),
            (None, _) => Err(self.offline_error()),
        }
    }

    fn read_object(&self, r: &BlockRef) -> io::Result<(Codec, Vec<u8>)> {
        match (&self.http, self.form) {
            (Some(h), Form::Repo) => {
                // An object is its codec byte and the stored bytes; a ref
                // without lengths is a dictionary (format.md §13).
                let max = match r.clen {
                    0 => sheaf_format::dict::MAX_DICT_LEN as u64,
                    n => n as u64,
                } + 1;
                let (b, _) = h.get(Want::Object(&object_path(&r.hash), max))?;
                let (codec, stored) = sheaf_format::remote::decode_object(&b).map_err(|e| {
                    io::Error::new(io::ErrorKind::InvalidData, format!("object: {e}"))
                })?;
                Ok((codec, stored.to_vec()))
            }
            (Some(_), Form::Whole) => {
                let mut b = vec![0u8; r.clen as usize];
                self.read_exact_at(&mut b, r.offset)?;
                Ok((r.codec, b))
            }
            (None, _) => Err(self.offline_error()),
        }
    }

    fn ranged(&self) -> bool {
        self.form == Form::Whole
    }

    fn reject(&self, _offset: u64) -> bool {
        self.http.as_ref().is_some_and(|h| h.reject())
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn net_stats(&self) -> Option<sheaf_read::NetStats> {
        Some(sheaf_read::NetStats {
            offline: self.http.is_none(),
            remote_form: match self.form {
                Form::Whole => "image",
                Form::Repo => "repository",
            }
            .to_string(),
            transport: self.http.as_ref().map(|h| h.stats()),
        })
    }
}
