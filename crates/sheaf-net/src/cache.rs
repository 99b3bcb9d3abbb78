//! The node's persistent, content-addressed cache of objects (pages and
//! blocks, named by the digest of their uncompressed bytes) and of image
//! indexes (per URL, so an image opens again with the network down).
//!
//! Layout under the cache root:
//!
//! ```text
//! objects/ab/abcdef…   one object: [codec u8][stored bytes]
//! index/<blake3(url)>  the image index last seen at that URL (redacted)
//! index/<…>.url        the redacted URL, for people
//! tmp/                 files being written
//! lock                 held (flock) while evicting
//! ```
//!
//! Image indexes are keyed by the URL as [`redact`](crate::redact) shows
//! it, and only that form is stored: no password, token or signature
//! reaches the disk, and two credentials for the same resource (another
//! password of the same user, a fresh presigned URL) share one entry
//! (what it holds is verified by digest whoever fetched it). The
//! `index/` directory is made 0700 and its files 0600 (they name the images
//! this node reads); objects are 0644.
//!
//! The cache may be shared (a directory others can write): nothing below
//! its root is reached by a path the kernel resolves again. Every open,
//! create, rename and removal goes through a [`sheaf_dir::Dir`] descriptor
//! with no symbolic link followed, temporaries are created `O_EXCL` under
//! unpredictable names, and the lock file is opened without following a
//! link, so a link planted in the cache makes an operation fail, never
//! reach a file elsewhere.
//!
//! Safe under any number of processes and `kill -9` at any moment: a file
//! appears under its final name only by `rename` of a complete temporary
//! file, readers verify every object against its name (via the reader) and
//! drop bad ones, and eviction only unlinks (a reader holding the file open
//! keeps its bytes; one that loses the race fetches again). Eviction is LRU
//! by modification time, which a hit refreshes (at most once a minute).

use sheaf_dir::{Dir, FileType};
use sheaf_format::remote::ImageIndex;
use sheaf_format::{digest, hex, Digest};
use sheaf_read::ObjectStore;
use std::ffi::OsString;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

/// Default quota.
pub const DEFAULT_QUOTA: u64 = 10 << 30;
/// Temporary files older than this are leftovers of killed writers.
const STALE_TMP: Duration = Duration::from_secs(3600);
/// A hit refreshes an object's time only if it is older than this.
const TOUCH_AFTER: Duration = Duration::from_secs(60);
/// Modes: objects are for every user of the cache, indexes private.
const OBJECT_MODE: u32 = 0o644;
const INDEX_MODE: u32 = 0o600;
const INDEX_DIR_MODE: u32 = 0o700;
const DIR_MODE: u32 = 0o755;

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

/// The cache's directories, held by descriptor.
struct Dirs {
    root: Dir,
    objects: Dir,
    index: Dir,
    tmp: Dir,
}

impl Dirs {
    /// Open (making what is missing) the cache at `root`; `root` itself is
    /// as the caller named it, nothing below it is followed if a link.
    fn open(root: &Path) -> io::Result<Dirs> {
        let root = Dir::create_all(root, DIR_MODE)?;
        let index = root.create_dir("index", INDEX_DIR_MODE)?;
        // An index directory made before indexes were private.
        let st = index.stat_self()?;
        // SAFETY: geteuid has no preconditions; fchmod on a descriptor we
        // hold (the directory itself, never a name resolved again).
        if st.st_mode & 0o077 != 0 && st.st_uid == unsafe { libc::geteuid() } {
            let fd = std::os::fd::AsRawFd::as_raw_fd(&index.fd());
            // Best effort: a shared cache made by another user stays as is.
            let _ = unsafe { libc::fchmod(fd, INDEX_DIR_MODE) };
        }
        Ok(Dirs {
            objects: root.create_dir("objects", DIR_MODE)?,
            tmp: root.create_dir("tmp", DIR_MODE)?,
            index,
            root,
        })
    }
}

/// The cache.
pub struct DiskCache {
    root: PathBuf,
    dirs: RwLock<Arc<Dirs>>,
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

/// `fchmod` on the open file (never a name resolved again).
fn set_mode(f: &std::fs::File, mode: u32) -> io::Result<()> {
    // SAFETY: fchmod on a descriptor we own.
    if unsafe { libc::fchmod(std::os::fd::AsRawFd::as_raw_fd(f), mode) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn is_regular(st: &sheaf_dir::Stat) -> bool {
    FileType::from_raw_mode(st.st_mode) == FileType::RegularFile
}

#[allow(clippy::unnecessary_cast)] // i64 here, not on every target
fn mtime(st: &sheaf_dir::Stat) -> (i64, i64) {
    (st.st_mtime as i64, st.st_mtime_nsec as i64)
}

/// The fan-out directory and file name of an object.
fn object_name(hash: &Digest) -> (String, String) {
    let h = hex(hash);
    (h[..2].to_string(), h)
}

/// The key and the stored form of an index URL: its redacted form.
fn index_key(url: &str) -> (String, String) {
    let shown = crate::redact(url);
    (hex(&digest(shown.as_bytes())), shown)
}

impl DiskCache {
    /// Open (creating if needed) the cache at `root` with a size quota.
    pub fn open(root: &Path, quota: u64) -> io::Result<DiskCache> {
        // Absolute: a mount's server changes directory to / when detaching.
        let root = &std::path::absolute(root).map_err(|e| ctx(root, e))?;
        let c = DiskCache {
            dirs: RwLock::new(Arc::new(Dirs::open(root)?)),
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

    fn dirs(&self) -> Arc<Dirs> {
        self.dirs.read().expect("lock").clone()
    }

    /// The cache was deleted under us: make it again (by its path, as the
    /// caller named it) and use the new directories from now on.
    fn reopen(&self) -> io::Result<Arc<Dirs>> {
        let d = Arc::new(Dirs::open(&self.root)?);
        *self.dirs.write().expect("lock") = d.clone();
        Ok(d)
    }

    /// Write `bytes` to `name` in `dest` (of `dirs`) atomically: a new
    /// temporary with an unpredictable name in `tmp/`, then rename.
    fn write_in(
        dirs: &Dirs,
        dest: impl Fn(&Dirs) -> io::Result<Dir>,
        name: &str,
        bytes: &[u8],
        mode: u32,
    ) -> io::Result<()> {
        let dest = dest(dirs)?;
        let (tmp, mut f) = dirs
            .tmp
            .temp_file(&format!("{}.", &name[..name.len().min(16)]), "")?;
        let r = (|| {
            set_mode(&f, mode)?;
            f.write_all(bytes)?;
            drop(f);
            dirs.tmp.rename_to(&tmp, &dest, name)
        })();
        if r.is_err() {
            let _ = dirs.tmp.remove_file(&tmp);
        }
        r
    }

    fn write_atomic(
        &self,
        dest: impl Fn(&Dirs) -> io::Result<Dir>,
        name: &str,
        bytes: &[u8],
        mode: u32,
    ) -> io::Result<()> {
        match Self::write_in(&self.dirs(), &dest, name, bytes, mode) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                Self::write_in(&*self.reopen()?, &dest, name, bytes, mode)
            }
            r => r,
        }
    }

    /// Keep the index of the image at `url` (under its redacted form: see
    /// the module text).
    pub fn save_index(&self, url: &str, idx: &ImageIndex) -> io::Result<()> {
        let (key, shown) = index_key(url);
        let index = |d: &Dirs| d.index.try_clone();
        self.write_atomic(index, &format!("{key}.url"), shown.as_bytes(), INDEX_MODE)?;
        self.write_atomic(index, &key, &idx.encode(), INDEX_MODE)
    }

    /// The index last kept for `url`, and when; `None` if absent or unusable.
    pub fn load_index(&self, url: &str) -> Option<(ImageIndex, SystemTime)> {
        let (key, _) = index_key(url);
        let f = self.dirs().index.open_regular(&key).ok()?;
        let when = f.metadata().and_then(|m| m.modified()).ok()?;
        let mut b = Vec::new();
        io::Read::read_to_end(
            &mut io::Read::take(&f, sheaf_format::remote::MAX_INDEX_LEN as u64 + 1),
            &mut b,
        )
        .ok()?;
        ImageIndex::decode(&b).ok().map(|i| (i, when))
    }

    /// Count what the cache holds (walks the whole tree).
    pub fn usage(&self) -> io::Result<Usage> {
        let dirs = self.dirs();
        let mut u = Usage::default();
        for_each_object(&dirs, |_, _, st| {
            u.objects += 1;
            u.bytes += st.st_size as u64;
        })?;
        for n in entries(&dirs.index)? {
            if !n.to_string_lossy().ends_with(".url") {
                u.indexes += 1;
            }
        }
        u.temp_files = entries(&dirs.tmp)?.len() as u64;
        Ok(u)
    }

    /// Evict least recently used objects until at most `target` bytes are
    /// held, remove stale temporary files and index entries kept before
    /// indexes were stored redacted. One process evicts at a time (others
    /// skip). Returns (objects removed, bytes held after).
    pub fn gc(&self, target: u64) -> io::Result<(u64, u64)> {
        let dirs = self.dirs();
        let lock = dirs
            .root
            .open_lock("lock")
            .map_err(|e| ctx(&self.root.join("lock"), e))?;
        if !sheaf_dir::flock(&lock, true, false)? {
            return Ok((0, self.size.load(Relaxed)));
        }
        let now = SystemTime::now();
        for n in entries(&dirs.tmp)? {
            let old = dirs.tmp.stat(&n).is_ok_and(|st| {
                let t = SystemTime::UNIX_EPOCH + Duration::from_secs(st.st_mtime.max(0) as u64);
                now.duration_since(t).unwrap_or_default() > STALE_TMP
            });
            if old {
                let _ = dirs.tmp.remove_file(&n);
            }
        }
        scrub_index(&dirs.index)?;
        let mut all = Vec::new();
        let mut total = 0;
        for_each_object(&dirs, |fan, name, st| {
            total += st.st_size as u64;
            let (s, ns) = mtime(st);
            all.push((
                s,
                ns,
                st.st_size as u64,
                fan.to_os_string(),
                name.to_os_string(),
            ));
        })?;
        all.sort();
        let mut removed = 0;
        let mut fans: std::collections::HashMap<OsString, Dir> = Default::default();
        for (_, _, len, fan, name) in all {
            if total <= target {
                break;
            }
            let d = match fans.entry(fan) {
                std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
                std::collections::hash_map::Entry::Vacant(v) => match dirs.objects.sub(v.key()) {
                    Ok(d) => v.insert(d),
                    Err(_) => continue,
                },
            };
            if d.remove_file(&name).is_ok() {
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
        let dirs = self.dirs();
        let mut n = 0;
        for fan in entries(&dirs.objects)? {
            // A link planted as a fan-out directory is removed, not entered.
            let Ok(d) = dirs.objects.sub(&fan) else {
                let _ = dirs.objects.remove_file(&fan);
                continue;
            };
            for name in entries(&d)? {
                if d.remove_file(&name).is_ok() {
                    n += 1;
                }
            }
        }
        for d in [&dirs.index, &dirs.tmp] {
            for name in entries(d)? {
                let _ = d.remove_file(&name);
            }
        }
        self.size.store(0, Relaxed);
        Ok(n)
    }

    /// The fan-out directory of an object (`None`: not there, or not a
    /// directory of ours).
    fn fan(&self, fan: &str) -> Option<Dir> {
        self.dirs().objects.sub(fan).ok()
    }
}

/// The names in `d`; a directory that vanished holds none.
fn entries(d: &Dir) -> io::Result<Vec<OsString>> {
    match d.entries() {
        Ok(v) => Ok(v),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// Call `f` with each object (a regular file in a fan-out directory that
/// is no link).
fn for_each_object(
    dirs: &Dirs,
    mut f: impl FnMut(&std::ffi::OsStr, &std::ffi::OsStr, &sheaf_dir::Stat),
) -> io::Result<()> {
    for fan in entries(&dirs.objects)? {
        // Entries may vanish under us (another process evicting); a link
        // is not entered.
        let Ok(d) = dirs.objects.sub(&fan) else {
            continue;
        };
        for name in entries(&d).unwrap_or_default() {
            if let Ok(st) = d.stat(&name) {
                if is_regular(&st) {
                    f(&fan, &name, &st);
                }
            }
        }
    }
    Ok(())
}

/// Remove index entries whose `.url` holds more than its redacted form
/// (kept by an older sheaf, keyed by the URL with its secrets).
fn scrub_index(index: &Dir) -> io::Result<()> {
    for n in entries(index)? {
        let Some(key) = n.to_str().and_then(|s| s.strip_suffix(".url")) else {
            continue;
        };
        let Ok(f) = index.open_regular(&n) else {
            continue;
        };
        let mut b = Vec::new();
        if io::Read::read_to_end(&mut io::Read::take(&f, 1 << 16), &mut b).is_err() {
            continue;
        }
        let url = String::from_utf8_lossy(&b);
        if crate::redact(&url) != url || index_key(&url).0 != key {
            let _ = index.remove_file(key);
            let _ = index.remove_file(&n);
        }
    }
    Ok(())
}

impl ObjectStore for DiskCache {
    fn get(&self, hash: &Digest) -> Option<Vec<u8>> {
        let (fan, name) = object_name(hash);
        let f = self.fan(&fan).and_then(|d| d.open_regular(&name).ok());
        match f {
            Some(mut f) => {
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
            None => {
                self.stats.misses.fetch_add(1, Relaxed);
                None
            }
        }
    }

    fn contains(&self, hash: &Digest) -> bool {
        let (fan, name) = object_name(hash);
        self.fan(&fan)
            .is_some_and(|d| d.stat(&name).is_ok_and(|st| is_regular(&st)))
    }

    fn put(&self, hash: &Digest, object: &[u8]) {
        if self.contains(hash) {
            return;
        }
        let (fan, name) = object_name(hash);
        let dest = |d: &Dirs| d.objects.create_dir(&fan, DIR_MODE);
        match self.write_atomic(dest, &name, object, OBJECT_MODE) {
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
        let (fan, name) = object_name(hash);
        if let Some(d) = self.fan(&fan) {
            if let Ok(st) = d.stat(&name) {
                if d.remove_file(&name).is_ok() {
                    let len = st.st_size as u64;
                    self.size
                        .fetch_sub(len.min(self.size.load(Relaxed)), Relaxed);
                }
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

    /// Issue 53: an index is stored and keyed by the redacted URL, private.
    #[test]
    fn indexes_hold_no_secret_and_are_private() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let c = DiskCache::open(t.path(), 10_000).unwrap();
        let idx = ImageIndex {
            file_len: 100,
            ranges: vec![(0, vec![7; 64])],
        };
        let url = "https://alice:s3cr3t@h/i.sheaf?X-Amz-Signature=deadbeef&X-Amz-Credential=AKIAXX";
        c.save_index(url, &idx).unwrap();
        // Another password, a fresh signature: the same entry.
        let other =
            "https://alice:hunter2@h/i.sheaf?X-Amz-Signature=feedface&X-Amz-Credential=AKIAYY";
        assert_eq!(c.load_index(other).unwrap().0, idx);
        let shown = "https://alice:***@h/i.sheaf?X-Amz-Signature=***&X-Amz-Credential=***";
        let key = hex(&digest(shown.as_bytes()));
        let dir = t.path().join("index");
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, [key.clone(), format!("{key}.url")]);
        assert_eq!(
            std::fs::read_to_string(dir.join(format!("{key}.url"))).unwrap(),
            shown
        );
        for n in &names {
            let b = std::fs::read(dir.join(n)).unwrap();
            for secret in ["s3cr3t", "deadbeef", "AKIAXX"] {
                assert!(
                    !b.windows(secret.len()).any(|w| w == secret.as_bytes()),
                    "{n} holds {secret}"
                );
            }
            let mode = std::fs::metadata(dir.join(n)).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "{n}");
        }
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        // An entry an older sheaf kept under the raw URL is scrubbed by gc.
        let old = hex(&digest(url.as_bytes()));
        std::fs::write(dir.join(&old), idx.encode()).unwrap();
        std::fs::write(dir.join(format!("{old}.url")), url).unwrap();
        c.gc(u64::MAX).unwrap();
        assert!(!dir.join(&old).exists() && !dir.join(format!("{old}.url")).exists());
        assert!(dir.join(&key).exists());
    }

    /// Issue 53: links planted in a shared cache are never followed by
    /// inserts, gc, clear or the lock.
    #[test]
    fn links_planted_in_the_cache_reach_nothing_outside() {
        use std::os::unix::fs::symlink;
        let t = tempfile::tempdir().unwrap();
        let outside = t.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        let victim = outside.join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        let root = t.path().join("cache");
        let c = DiskCache::open(&root, 1000).unwrap();
        let objs: Vec<(Digest, Vec<u8>)> = (0..4u8).map(|i| (digest(&[i]), vec![i; 400])).collect();
        // The fan-out directory of the first object is a link to outside/,
        // and a name in it is the object's own name.
        let (fan, name) = object_name(&objs[0].0);
        symlink(&outside, root.join("objects").join(&fan)).unwrap();
        std::fs::write(outside.join(&name), b"also precious").unwrap();
        // Links in tmp/ and index/ to the victim, and the lock.
        symlink(&victim, root.join("tmp/planted")).unwrap();
        let (key, _) = index_key("http://h/x");
        symlink(&victim, root.join("index").join(&key)).unwrap();
        symlink(&victim, root.join("index").join(format!("{key}.url"))).unwrap();
        symlink(outside.join("made-by-lock"), root.join("lock")).unwrap();
        let snapshot = || {
            let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(&outside)
                .unwrap()
                .map(|e| {
                    let e = e.unwrap();
                    (
                        e.file_name().into_string().unwrap(),
                        std::fs::read(e.path()).unwrap(),
                    )
                })
                .collect();
            v.sort();
            v
        };
        let before = snapshot();
        assert_eq!(before.len(), 2);
        // Inserts: the object behind the linked fan-out fails to store,
        // the others go in (and push the cache over quota: gc runs).
        for (h, o) in &objs {
            c.put(h, o);
        }
        assert!(c.get(&objs[0].0).is_none());
        assert!(!c.contains(&objs[0].0));
        assert_eq!(c.get(&objs[1].0).as_deref(), Some(&objs[1].1[..]));
        assert!(c.load_index("http://h/x").is_none());
        c.save_index(
            "http://h/x",
            &ImageIndex {
                file_len: 1,
                ranges: vec![],
            },
        )
        .unwrap();
        c.remove(&objs[0].0);
        // gc refuses the linked lock; with a plain lock it runs.
        assert!(c.gc(0).is_err());
        std::fs::remove_file(root.join("lock")).unwrap();
        c.gc(0).unwrap();
        assert_eq!(snapshot(), before);
        c.clear().unwrap();
        assert_eq!(snapshot(), before);
        assert!(std::fs::symlink_metadata(&victim).unwrap().is_file());
        // A linked index/ (or tmp/, objects/) is refused outright.
        let root2 = t.path().join("cache2");
        std::fs::create_dir(&root2).unwrap();
        symlink(&outside, root2.join("index")).unwrap();
        assert!(DiskCache::open(&root2, 1000).is_err());
        assert_eq!(snapshot(), before);
    }
}
