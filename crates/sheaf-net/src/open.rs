//! Opening an image the user named: a local file, or a URL (a whole image
//! read with Range requests, or a published repository) through the node
//! cache. Every command that takes an image opens it here, so the rules are
//! the same everywhere: which cache, which routes, and that bytes failing
//! verification while opening (a corrupting proxy or mirror) move the
//! source to its next route, as reads do later.

use crate::cache::DiskCache;
use crate::http::HttpOptions;
use crate::remote::RemoteSource;
use sheaf_read::{FileSource, Image, ImageOptions, ReadError, Source};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

/// Most times opening is retried through another route after the bytes
/// failed verification.
const OPEN_REROUTES: u32 = 8;

/// How remote images are reached and cached. Passed to every open; there is
/// no process-wide setting.
#[derive(Debug, Clone, Default)]
pub struct RemoteConfig {
    /// Node cache directory; `None`: [`crate::default_cache_dir`].
    pub cache_dir: Option<PathBuf>,
    /// Size quota of the node cache.
    pub cache_quota: u64,
    /// Use no node cache (every read is fetched).
    pub no_cache: bool,
    /// Routes, timeouts and retries.
    pub http: HttpOptions,
}

/// Why an image could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// A local file could not be opened.
    #[error("{path}")]
    Local {
        /// The path as given.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The server (or every route to it) failed.
    #[error("{url}")]
    Remote {
        /// The URL as given.
        url: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The node cache could not be opened.
    #[error("node cache")]
    Cache(#[source] std::io::Error),
    /// The bytes are not a valid image.
    #[error(transparent)]
    Read(#[from] ReadError),
}

/// An open image and what the caller may want to tell the user.
#[derive(Debug)]
pub struct Opened {
    /// The image (with the node cache as its object store when remote).
    pub image: Image,
    /// When the server was unreachable and the index cached at this time
    /// stood in for it.
    pub offline_since: Option<SystemTime>,
}

impl RemoteConfig {
    /// The node cache this configuration names (None with `no_cache`, or
    /// when no default directory exists).
    pub fn disk_cache(&self) -> Result<Option<Arc<DiskCache>>, OpenError> {
        if self.no_cache {
            return Ok(None);
        }
        let Some(dir) = self.cache_dir.clone().or_else(crate::default_cache_dir) else {
            return Ok(None);
        };
        let c = DiskCache::open(&dir, self.cache_quota).map_err(OpenError::Cache)?;
        Ok(Some(Arc::new(c)))
    }
}

/// Open the image named `arg` (a path or an `http(s)://` URL). `wrap` may
/// interpose on the source (e.g. to count reads).
pub fn open_image(
    arg: &Path,
    cfg: &RemoteConfig,
    opts: ImageOptions,
    wrap: impl FnOnce(Arc<dyn Source>) -> Arc<dyn Source>,
) -> Result<Opened, OpenError> {
    let s = arg.to_string_lossy();
    if !crate::is_url(&s) {
        let local = |e| OpenError::Local {
            path: arg.display().to_string(),
            source: e,
        };
        let f = FileSource::open(arg).map_err(local)?;
        // A repository's index opened by path: its objects are read in
        // place (no server, no cache).
        let mut head = [0u8; 8];
        if f.len() >= 8
            && f.read_exact_at(&mut head, 0).is_ok()
            && head == sheaf_format::remote::INDEX_MAGIC
        {
            let (index, store) = crate::publish::open_local_index(arg).map_err(local)?;
            let src = wrap(Arc::new(sheaf_read::IndexSource::new(index, s.to_string())));
            return Ok(Opened {
                image: Image::open_with(src, opts)?.with_store(Arc::new(store)),
                offline_since: None,
            });
        }
        return Ok(Opened {
            image: Image::open_with(wrap(Arc::new(f)), opts)?,
            offline_since: None,
        });
    }
    let cache = cfg.disk_cache()?;
    let src = RemoteSource::open(&s, cfg.http.clone(), cache.as_deref()).map_err(|e| {
        OpenError::Remote {
            url: crate::redact(&s),
            source: e,
        }
    })?;
    let offline_since = src.offline_since();
    let src = wrap(Arc::new(src));
    let mut reroutes = OPEN_REROUTES;
    let mut img = loop {
        match Image::open_with(src.clone(), opts) {
            // A mirror or proxy serving something else (an error page)
            // is passed over for the next.
            Err(ReadError::Format { .. } | ReadError::NotAnImage { .. })
                if reroutes > 0 && src.reject(0) =>
            {
                reroutes -= 1
            }
            r => break r?,
        }
    };
    if let Some(c) = cache {
        if offline_since.is_none() {
            // Best effort: without it only offline re-opens are lost.
            if let Ok(idx) = img.index() {
                let _ = c.save_index(&s, &idx);
            }
        }
        img = img.with_store(c);
    }
    Ok(Opened {
        image: img,
        offline_since,
    })
}
