//! Remote images: reading sheaf images over HTTP(S) from any static web
//! server or S3-compatible store, over SSH ([`sftp`]: the user's own
//! OpenSSH) or from object storage ([`s3`]: `s3://BUCKET/KEY`), a node-wide content-addressed cache, and
//! the static layout `sheaf publish` writes for caching proxies and CDNs.
//!
//! Modules follow the data flow: [`http`] (routes over mirrors and proxies,
//! failover, retries, timeouts, counters) → [`remote`] (a
//! [`sheaf_read::Source`] for an image URL or a published repository, with
//! offline fallback to a cached index) and [`cache`] (the node's
//! [`sheaf_read::ObjectStore`] on disk: quota, LRU eviction, safe under
//! concurrent use and `kill -9`); [`publish`] writes the repository layout;
//! [`open`] opens whatever image a user names (file or URL) under one
//! [`RemoteConfig`], passed in, never global.
//!
//! This crate owns network and cache *policy*. It knows the format only
//! through `sheaf_format::remote` (objects and image indexes) and never
//! verifies bytes itself: the reader checks every page and block against its
//! digest, so no server, mirror, proxy or cache can change a byte. It knows
//! nothing of FUSE or the command line.

#![warn(missing_docs)]

pub mod cache;
pub mod http;
pub mod open;
pub mod publish;
pub mod remote;
pub mod s3;
pub mod secrets;
pub mod sftp;

pub use cache::DiskCache;
pub use http::HttpOptions;
pub use open::{open_image, OpenError, Opened, RemoteConfig};
pub use publish::{publish, publish_to_url, PublishError, PublishReport};
pub use remote::RemoteSource;
pub use secrets::{redact, redact_text, SecretUrl};

/// Whether `s` names a remote image (`http://`, `https://`, `ssh://`,
/// `s3://`).
pub fn is_url(s: &str) -> bool {
    s.starts_with("http://")
        || s.starts_with("https://")
        || s.starts_with("ssh://")
        || s.starts_with("s3://")
}

/// The default node cache directory: `/var/cache/sheaf` for root, else
/// `$XDG_CACHE_HOME/sheaf` or `~/.cache/sheaf`.
pub fn default_cache_dir() -> Option<std::path::PathBuf> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return Some("/var/cache/sheaf".into());
    }
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|x| !x.is_empty()) {
        return Some(std::path::PathBuf::from(x).join("sheaf"));
    }
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(|h| std::path::PathBuf::from(h).join(".cache/sheaf"))
}

/// Fetch a whole small file (a pool catalogue, a record) with the usual
/// routes, retries and deadline; `Ok(None)` when the server has no such
/// file.
pub fn fetch_file(url: &str, opts: HttpOptions) -> std::io::Result<Option<Vec<u8>>> {
    let name = url.rsplit('/').next().unwrap_or_default();
    let h = remote::Transport::new(url, opts)?;
    match h.get(http::Want::Object(
        name,
        sheaf_format::remote::MAX_INDEX_LEN as u64,
    )) {
        Ok((bytes, _)) => Ok(Some(bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}
