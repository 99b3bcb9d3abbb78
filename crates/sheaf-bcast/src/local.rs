//! The node's side: the copy being written, the lock that keeps two
//! broadcasts to one file apart, and the objects already on the node.

use sheaf_format::{BlockRef, Codec, Digest};
use sheaf_read::{FileSource, Image, ObjectStore};
use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a node waits for another broadcast to the same file to finish.
const LOCK_WAIT: Duration = Duration::from_secs(30);

/// Whether `dest` already is the image with root digest `root` and length
/// `len` (opened and its root checked; pages and blocks were verified when
/// it was installed, and every read verifies them again).
pub fn is_present(dest: &Path, root: &Digest, len: u64) -> bool {
    let Ok(src) = FileSource::open(dest) else {
        return false;
    };
    match Image::open(Arc::new(src)) {
        Ok(img) => img.root_digest() == *root && img.len() == len,
        Err(_) => false,
    }
}

/// A copy of the image being assembled beside its destination, renamed
/// over it only when complete and verified. Dropped unfinished, it is
/// removed; left by a killed process, the next broadcast removes it.
pub struct Install {
    dest: PathBuf,
    tmp: PathBuf,
    /// The file being written.
    pub file: File,
    _lock: File,
    done: bool,
}

fn file_name(dest: &Path) -> String {
    dest.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "image".into())
}

/// Prefix of the temporary and lock files of a broadcast to `dest`.
fn prefix(dest: &Path) -> String {
    format!(".{}.bcast", file_name(dest))
}

impl Install {
    /// Lock the destination, remove what killed broadcasts left, and
    /// create an empty copy of `len` bytes (space reserved up front, so a
    /// full disk fails here rather than midway).
    pub fn begin(dest: &Path, len: u64) -> Result<Install, String> {
        let dir = match dest.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let shown = |e: io::Error| format!("{}: {e}", dest.display());
        fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let pre = prefix(dest);
        let lock_path = dir.join(format!("{pre}.lock"));
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| format!("{}: {e}", lock_path.display()))?;
        let start = Instant::now();
        // Never wait unboundedly: the other ranks are waiting in a collective.
        // SAFETY: flock on an fd we own.
        while unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            if start.elapsed() > LOCK_WAIT {
                return Err(format!(
                    "{}: another sheaf bcast to this file is running on this node (lock {})",
                    dest.display(),
                    lock_path.display()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if let Ok(rd) = fs::read_dir(&dir) {
            for e in rd.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if n.starts_with(&pre) && n.ends_with(".tmp") {
                    let _ = fs::remove_file(e.path());
                }
            }
        }
        let tmp = dir.join(format!("{pre}-{}.tmp", std::process::id()));
        let file = OpenOptions::new()
            .create_new(true)
            .read(true)
            .write(true)
            .open(&tmp)
            .map_err(|e| format!("{}: {e}", tmp.display()))?;
        let me = Install {
            dest: dest.to_path_buf(),
            tmp,
            file,
            _lock: lock,
            done: false,
        };
        me.file.set_len(len).map_err(shown)?;
        // SAFETY: fallocate on an fd we own.
        let rc = unsafe { libc::posix_fallocate(me.file.as_raw_fd(), 0, len as libc::off_t) };
        if rc != 0 && rc != libc::EOPNOTSUPP && rc != libc::EINVAL {
            let e = io::Error::from_raw_os_error(rc);
            return Err(format!("{}: {e}", dest.display()));
        }
        Ok(me)
    }

    /// Write `bytes` at `off` of the copy.
    pub fn write_at(&self, bytes: &[u8], off: u64) -> Result<(), String> {
        self.file
            .write_all_at(bytes, off)
            .map_err(|e| format!("{}: {e}", self.dest.display()))
    }

    /// Flush the copy and check it is the image expected: it opens, and its
    /// root digest and length are `root` and `len`.
    pub fn verify(&self, root: &Digest, len: u64) -> Result<(), String> {
        self.file
            .sync_all()
            .map_err(|e| format!("{}: {e}", self.dest.display()))?;
        if is_present(&self.tmp, root, len) {
            Ok(())
        } else {
            Err(format!(
                "{}: the assembled copy does not verify against the source's root digest",
                self.dest.display()
            ))
        }
    }

    /// Rename the copy over the destination (atomic), with `sig` (a
    /// detached signature) beside it first when there is one.
    pub fn finish(mut self, sig: Option<&[u8]>) -> Result<(), String> {
        let shown = |p: &Path, e: io::Error| format!("{}: {e}", p.display());
        if let Some(sig) = sig {
            let d = sheaf_trust::policy::detached_path(&self.dest);
            let t = self.tmp.with_extension("sig.tmp");
            fs::write(&t, sig).map_err(|e| shown(&t, e))?;
            fs::rename(&t, &d).map_err(|e| shown(&d, e))?;
        }
        fs::rename(&self.tmp, &self.dest).map_err(|e| shown(&self.dest, e))?;
        self.done = true;
        if let Some(dir) = self.dest.parent().filter(|p| !p.as_os_str().is_empty()) {
            if let Ok(d) = File::open(dir) {
                let _ = d.sync_all();
            }
        }
        Ok(())
    }
}

impl Drop for Install {
    fn drop(&mut self) {
        if !self.done {
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

/// Objects already on this node: in other images (earlier versions, other
/// pools in the same directory) and in the node cache. Only a copy stored
/// exactly as the source stores it (same codec, same stored length) can
/// fill the source's byte range; every one is verified before use.
pub struct Local {
    files: Vec<(PathBuf, File)>,
    /// Digest → (index in `files`, offset, codec, stored length).
    by_hash: HashMap<Digest, (usize, u64, Codec, u32)>,
    cache: Option<Arc<dyn ObjectStore>>,
}

impl Local {
    /// Index the images at `paths` (files, or directories whose regular
    /// files not starting with `.` are tried), skipping any that do not
    /// open as images.
    pub fn scan(paths: &[PathBuf], cache: Option<Arc<dyn ObjectStore>>) -> Local {
        let mut me = Local {
            files: Vec::new(),
            by_hash: HashMap::new(),
            cache,
        };
        let mut candidates = Vec::new();
        for p in paths {
            if p.is_dir() {
                if let Ok(rd) = fs::read_dir(p) {
                    let mut v: Vec<PathBuf> = rd
                        .flatten()
                        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
                        .filter(|e| e.file_type().map(|t| t.is_file()).unwrap_or(false))
                        .map(|e| e.path())
                        .collect();
                    v.sort();
                    candidates.extend(v);
                }
            } else if p.is_file() {
                candidates.push(p.clone());
            }
        }
        candidates.dedup();
        for path in candidates {
            let Ok(src) = FileSource::open(&path) else {
                continue;
            };
            let Ok(img) = Image::open(Arc::new(src)) else {
                continue;
            };
            let Ok(refs) = img.object_refs() else {
                continue;
            };
            let Ok(file) = File::open(&path) else {
                continue;
            };
            let idx = me.files.len();
            me.files.push((path, file));
            for (r, _) in refs {
                me.by_hash
                    .entry(r.key())
                    .or_insert((idx, r.offset, r.codec, r.clen));
            }
        }
        me
    }

    /// Number of images indexed.
    pub fn images(&self) -> usize {
        self.files.len()
    }

    /// The stored bytes of `r` exactly as the source stores them, verified,
    /// if this node has them.
    /// `dicts` are the source image's dictionaries.
    pub fn get(
        &self,
        r: &BlockRef,
        scratch: &mut Vec<u8>,
        dicts: &[Arc<sheaf_format::Dictionary>],
    ) -> Option<Vec<u8>> {
        let from_file = self
            .by_hash
            .get(&r.key())
            .and_then(|(file, offset, codec, clen)| {
                if *codec != r.codec || *clen != r.clen {
                    return None;
                }
                let mut b = vec![0u8; r.clen as usize];
                self.files[*file].1.read_exact_at(&mut b, *offset).ok()?;
                Some(b)
            });
        let found = from_file.or_else(|| {
            let obj = self.cache.as_ref()?.get(&r.key())?;
            let (codec, stored) = sheaf_format::remote::decode_object(&obj).ok()?;
            (codec == r.codec && stored.len() == r.clen as usize).then(|| stored.to_vec())
        })?;
        r.verify_stored(r.codec, &found, scratch, &dicts).ok()?;
        Some(found)
    }
}
