//! The node's persistent, content-addressed cache of objects (pages and
//! blocks, named by the digest of their uncompressed bytes) and of image
//! indexes (per URL, so an image opens again with the network down).
//!
//! Layout under the cache root:
//!
//! ```text
//! objects/ab/abcdef…   one object: [codec u8][stored bytes]
//! index/<blake3(url)>  the image index last seen at that URL
//! index/<…>.url        the URL, for people
//! tmp/                 files being written
//! lock                 held (flock) while evicting
//! ```
//!
//! Safe under any number of processes and `kill -9` at any moment: a file
//! appears under its final name only by `rename` of a complete temporary
//! file, readers verify every object against its name (via the reader) and
//! drop bad ones, and eviction only unlinks (a reader holding the file open
//! keeps its bytes; one that loses the race fetches again). Eviction is LRU
//! by modification time, which a hit refreshes (at most once a minute).

use sheaf_format::remote::{object_path, ImageIndex};
use sheaf_format::{digest, hex, Digest};
use sheaf_read::ObjectStore;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, SystemTime};

/// Default quota.
pub const DEFAULT_QUOTA: u64 = 10 << 30;
/// Temporary files older than this are leftovers of killed writers.
const STALE_TMP: Duration = Duration::from_secs(3600);
/// A hit refreshes an object's time only if it is older than this.
const TOUCH_AFTER: Duration = Duration::from_secs(60);

/// Counters of one process's use of the cache.
#[derive(Debug, Default)]
pub struct DiskCacheStats {
    /// Objects served from disk.
    pub hits: AtomicU64,
    /// Objects looked for and not held.
    pub misses: AtomicU64,
    /// Objects written.
    pub stored: AtomicU64,
    /// Objects dropped because they failed verification.
    pub bad: AtomicU64,
    /// Objects evicted by this process.
    pub evicted: AtomicU64,
    /// Writes that failed (full disk, permissions): only cost a refetch.
    pub write_errors: AtomicU64,
}

/// What `sheaf cache stats` reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Objects held.
    pub objects: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Image indexes held.
    pub indexes: u64,
    /// Temporary files (writes in progress or left by killed writers).
    pub temp_files: u64,
}

/// The cache.
pub struct DiskCache {
    root: PathBuf,
    quota: u64,
    /// Bytes held, as far as this process knows (others write too; each
    /// eviction pass recounts).
    size: AtomicU64,
    /// Counters.
    pub stats: DiskCacheStats,
}

fn ctx(p: &Path, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", p.display()))
}

impl DiskCache {
    /// Open (creating if needed) the cache at `root` with a size quota.
    pub fn open(root: &Path, quota: u64) -> io::Result<DiskCache> {
        // Absolute: a mount's server changes directory to / when detaching.
        let root = &std::path::absolute(root).map_err(|e| ctx(root, e))?;
        for d in ["objects", "index", "tmp"] {
            let p = root.join(d);
            fs::create_dir_all(&p).map_err(|e| ctx(&p, e))?;
        }
        let c = DiskCache {
            root: root.to_path_buf(),
            quota,
            size: AtomicU64::new(0),
            stats: DiskCacheStats::default(),
        };
        c.size.store(c.usage()?.bytes, Relaxed);
        Ok(c)
    }

    /// The cache root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The quota in bytes.
    pub fn quota(&self) -> u64 {
        self.quota
    }

    fn object(&self, hash: &Digest) -> PathBuf {
        self.root.join(object_path(hash))
    }

    /// Write `bytes` to `dest` atomically (temporary file, then rename).
    fn write_atomic(&self, dest: &Path, bytes: &[u8]) -> io::Result<()> {
        let name = format!(
            "{}.{}.{}",
            dest.file_name().and_then(|n| n.to_str()).unwrap_or("f"),
            std::process::id(),
            SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0)
        );
        let tmp = self.root.join("tmp").join(name);
        let r = (|| {
            let mut f = match fs::File::create(&tmp) {
                // The cache was deleted under us: make it again.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    fs::create_dir_all(self.root.join("tmp"))?;
                    fs::File::create(&tmp)?
                }
                r => r?,
            };
            f.write_all(bytes)?;
            drop(f);
            match fs::rename(&tmp, dest) {
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    // The fan-out directory did not exist yet.
                    if let Some(parent) = dest.parent() {
                        fs::create_dir_all(parent)?;
                    }
                    fs::rename(&tmp, dest)
                }
                r => r,
            }
        })();
        if r.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        r
    }

    /// Keep the index of the image at `url`.
    pub fn save_index(&self, url: &str, idx: &ImageIndex) -> io::Result<()> {
        let key = hex(&digest(url.as_bytes()));
        let dir = self.root.join("index");
        self.write_atomic(&dir.join(format!("{key}.url")), url.as_bytes())?;
        self.write_atomic(&dir.join(&key), &idx.encode())
    }

    /// The index last kept for `url`, and when; `None` if absent or unusable.
    pub fn load_index(&self, url: &str) -> Option<(ImageIndex, SystemTime)> {
        let p = self.root.join("index").join(hex(&digest(url.as_bytes())));
        let b = fs::read(&p).ok()?;
        let when = fs::metadata(&p).and_then(|m| m.modified()).ok()?;
        ImageIndex::decode(&b).ok().map(|i| (i, when))
    }

    /// Count what the cache holds (walks the whole tree).
    pub fn usage(&self) -> io::Result<Usage> {
        let mut u = Usage::default();
        self.for_each_object(|_, md| {
            u.objects += 1;
            u.bytes += md.len();
        })?;
        for e in read_dir(&self.root.join("index"))? {
            if !e.file_name().to_string_lossy().ends_with(".url") {
                u.indexes += 1;
            }
        }
        u.temp_files = read_dir(&self.root.join("tmp"))?.len() as u64;
        Ok(u)
    }

    fn for_each_object(&self, mut f: impl FnMut(PathBuf, fs::Metadata)) -> io::Result<()> {
        for fan in read_dir(&self.root.join("objects"))? {
            // Entries may vanish under us (another process evicting).
            for e in read_dir(&fan.path()).unwrap_or_default() {
                if let Ok(md) = e.metadata() {
                    f(e.path(), md);
                }
            }
        }
        Ok(())
    }

    /// Evict least recently used objects until at most `target` bytes are
    /// held, and remove stale temporary files. One process evicts at a time
    /// (others skip). Returns (objects removed, bytes held after).
    pub fn gc(&self, target: u64) -> io::Result<(u64, u64)> {
        let lock_path = self.root.join("lock");
        let lock = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| ctx(&lock_path, e))?;
        // SAFETY: flock on an fd we own.
        if unsafe {
            libc::flock(
                std::os::fd::AsRawFd::as_raw_fd(&lock),
                libc::LOCK_EX | libc::LOCK_NB,
            )
        } != 0
        {
            return Ok((0, self.size.load(Relaxed)));
        }
        let now = SystemTime::now();
        for e in read_dir(&self.root.join("tmp"))? {
            let old = e
                .metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|t| now.duration_since(t).unwrap_or_default() > STALE_TMP);
            if old {
                let _ = fs::remove_file(e.path());
            }
        }
        let mut all = Vec::new();
        let mut total = 0;
        self.for_each_object(|p, md| {
            total += md.len();
            all.push((md.mtime(), md.mtime_nsec(), md.len(), p));
        })?;
        all.sort();
        let mut removed = 0;
        for (_, _, len, p) in all {
            if total <= target {
                break;
            }
            if fs::remove_file(&p).is_ok() {
                total -= len;
                removed += 1;
            }
        }
        self.size.store(total, Relaxed);
        self.stats.evicted.fetch_add(removed, Relaxed);
        Ok((removed, total))
    }

    /// Remove every object, index and temporary file.
    pub fn clear(&self) -> io::Result<u64> {
        let mut n = 0;
        self.for_each_object(|p, _| {
            if fs::remove_file(p).is_ok() {
                n += 1;
            }
        })?;
        for d in ["index", "tmp"] {
            for e in read_dir(&self.root.join(d))? {
                let _ = fs::remove_file(e.path());
            }
        }
        self.size.store(0, Relaxed);
        Ok(n)
    }
}

fn read_dir(p: &Path) -> io::Result<Vec<fs::DirEntry>> {
    match fs::read_dir(p) {
        Ok(it) => Ok(it.filter_map(Result::ok).collect()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(ctx(p, e)),
    }
}

impl ObjectStore for DiskCache {
    fn get(&self, hash: &Digest) -> Option<Vec<u8>> {
        let p = self.object(hash);
        match fs::File::open(&p) {
            Ok(mut f) => {
                let mut b = Vec::new();
                if io::Read::read_to_end(&mut f, &mut b).is_err() {
                    self.stats.misses.fetch_add(1, Relaxed);
                    return None;
                }
                self.stats.hits.fetch_add(1, Relaxed);
                let stale = f
                    .metadata()
                    .and_then(|m| m.modified())
                    .is_ok_and(|t| t.elapsed().unwrap_or_default() > TOUCH_AFTER);
                if stale {
                    let _ = f.set_modified(SystemTime::now());
                }
                Some(b)
            }
            Err(_) => {
                self.stats.misses.fetch_add(1, Relaxed);
                None
            }
        }
    }

    fn contains(&self, hash: &Digest) -> bool {
        self.object(hash).exists()
    }

    fn put(&self, hash: &Digest, object: &[u8]) {
        let p = self.object(hash);
        if p.exists() {
            return;
        }
        match self.write_atomic(&p, object) {
            Ok(()) => {
                self.stats.stored.fetch_add(1, Relaxed);
                let size = self.size.fetch_add(object.len() as u64, Relaxed) + object.len() as u64;
                if size > self.quota {
                    // Evict to 90% so eviction runs now and then, not per put.
                    let _ = self.gc(self.quota / 10 * 9);
                }
            }
            Err(e) => {
                // One warning, not one per object: reads go on from the
                // network, each write failure only costs a later refetch.
                if self.stats.write_errors.fetch_add(1, Relaxed) == 0 {
                    log::warn!(
                        "node cache {}: cannot store objects ({e}); reading from the network without caching",
                        self.root.display()
                    );
                }
            }
        }
    }

    fn remove(&self, hash: &Digest) {
        self.stats.bad.fetch_add(1, Relaxed);
        if let Ok(md) = fs::metadata(self.object(hash)) {
            if fs::remove_file(self.object(hash)).is_ok() {
                self.size
                    .fetch_sub(md.len().min(self.size.load(Relaxed)), Relaxed);
            }
        }
    }

    fn store_stats(&self) -> sheaf_read::StoreStats {
        let s = &self.stats;
        sheaf_read::StoreStats::NodeCache(sheaf_read::CacheStats {
            dir: self.root.display().to_string(),
            hits: s.hits.load(Relaxed),
            misses: s.misses.load(Relaxed),
            stored: s.stored.load(Relaxed),
            bad: s.bad.load(Relaxed),
            evicted: s.evicted.load(Relaxed),
            write_errors: s.write_errors.load(Relaxed),
            bytes: self.size.load(Relaxed),
            quota: self.quota,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_get_remove_evict_and_clear() {
        let t = tempfile::tempdir().unwrap();
        let c = DiskCache::open(t.path(), 10_000).unwrap();
        let objs: Vec<(Digest, Vec<u8>)> =
            (0..8u8).map(|i| (digest(&[i]), vec![i; 2000])).collect();
        for (h, o) in &objs[..4] {
            c.put(h, o);
        }
        assert_eq!(c.get(&objs[0].0).unwrap(), objs[0].1);
        assert!(c.get(&objs[7].0).is_none());
        c.remove(&objs[0].0);
        assert!(!c.contains(&objs[0].0));
        // Over quota: the oldest go.
        for (h, o) in &objs[4..] {
            std::thread::sleep(Duration::from_millis(5));
            c.put(h, o);
        }
        let u = c.usage().unwrap();
        assert!(u.bytes <= 10_000, "{u:?}");
        assert!(c.contains(&objs[7].0));
        assert!(!c.contains(&objs[1].0));
        assert_eq!(u.temp_files, 0);
        let idx = ImageIndex {
            file_len: 100,
            ranges: vec![(0, vec![7; 64])],
        };
        c.save_index("http://x/y", &idx).unwrap();
        assert_eq!(c.load_index("http://x/y").unwrap().0, idx);
        assert!(c.load_index("http://x/z").is_none());
        assert_eq!(c.usage().unwrap().indexes, 1);
        c.clear().unwrap();
        assert_eq!(c.usage().unwrap(), Usage::default());
    }
}
