//! The node's side: the copy being written, the lock that keeps two
//! broadcasts to one file apart, and the objects already on the node.

use sheaf_format::{BlockRef, Codec, Digest};
use sheaf_read::{FileSource, Image, ObjectStore};
use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::{self, File};
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
///
/// The destination's directory may be writable by others (a shared
/// scratch directory): the lock, the copy and the signature are made
/// relative to a descriptor of it with no link followed, the copy and the
/// signature under unpredictable names created `O_EXCL` (`sheaf_dir`), so
/// a name planted there is refused, never written through.
pub struct Install {
    dest: PathBuf,
    dir: sheaf_dir::Dir,
    /// The destination's name in `dir`.
    name: OsString,
    tmp: OsString,
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
        let dir_path = match dest.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = dest
            .file_name()
            .map(OsStr::to_os_string)
            .ok_or_else(|| format!("{}: not a file name", dest.display()))?;
        let shown = |e: io::Error| format!("{}: {e}", dest.display());
        let dir = sheaf_dir::Dir::create_all(&dir_path, 0o755).map_err(|e| e.to_string())?;
        let pre = prefix(dest);
        let lock = dir
            .open_lock(format!("{pre}.lock"))
            .map_err(|e| e.to_string())?;
        let start = Instant::now();
        // Never wait unboundedly: the other ranks are waiting in a collective.
        while !sheaf_dir::flock(&lock, true, false).map_err(shown)? {
            if start.elapsed() > LOCK_WAIT {
                return Err(format!(
                    "{}: another sheaf bcast to this file is running on this node (lock {})",
                    dest.display(),
                    dir_path.join(format!("{pre}.lock")).display()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        // What killed broadcasts left (their names, never followed: a
        // link is removed itself).
        for n in dir.entries().unwrap_or_default() {
            let s = n.to_string_lossy();
            if s.starts_with(&pre) && s.ends_with(".tmp") {
                let _ = dir.remove_file(&n);
            }
        }
        let (tmp, file) = dir
            .temp_file(&format!("{pre}-"), ".tmp")
            .map_err(|e| e.to_string())?;
        let me = Install {
            dest: dest.to_path_buf(),
            dir,
            name,
            tmp,
            file,
            _lock: lock,
            done: false,
        };
        // The copy becomes the image: readable as a file made with the
        // umask would be (temporaries are made 0600).
        let mode = 0o666 & !sheaf_dir::umask();
        sheaf_dir::set_mode(&me.file, mode).map_err(shown)?;
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
        let ok = self
            .file
            .try_clone()
            .ok()
            .and_then(|f| FileSource::from_file(f, self.dest.display().to_string()).ok())
            .and_then(|src| Image::open(Arc::new(src)).ok())
            .is_some_and(|img| img.root_digest() == *root && img.len() == len);
        if ok {
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
        if let Some(sig) = sig {
            let d = sheaf_trust::policy::detached_path(&self.dest);
            let d_name = d
                .file_name()
                .map(OsStr::to_os_string)
                .ok_or_else(|| format!("{}: not a file name", d.display()))?;
            let mode = 0o666 & !sheaf_dir::umask();
            self.dir
                .write_atomic(&d_name, sig, mode)
                .map_err(|e| e.to_string())?;
        }
        self.dir
            .rename(&self.tmp, &self.name)
            .map_err(|e| format!("{}: {e}", self.dest.display()))?;
        self.done = true;
        let _ = self.dir.sync();
        Ok(())
    }
}

impl Drop for Install {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.dir.remove_file(&self.tmp);
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A user who can write the destination's directory plants links where
    /// a broadcast (often run as root) makes its lock, copy and signature:
    /// none is written through, and the outside file keeps its bytes.
    #[test]
    fn planted_links_in_the_destination_directory_are_never_written_through() {
        let t = tempfile::tempdir().unwrap();
        let victim = t.path().join("victim");
        fs::write(&victim, b"precious").unwrap();
        let dir = t.path().join("shared");
        fs::create_dir(&dir).unwrap();
        let dest = dir.join("a.sheaf");
        // The lock: refused in one line naming it, the victim untouched,
        // and a dangling link's target not created.
        symlink(&victim, dir.join(".a.sheaf.bcast.lock")).unwrap();
        let e = Install::begin(&dest, 10).err().unwrap();
        assert!(
            e.contains(".a.sheaf.bcast.lock") && e.contains("symbolic link"),
            "{e}"
        );
        fs::remove_file(dir.join(".a.sheaf.bcast.lock")).unwrap();
        symlink(t.path().join("made"), dir.join(".a.sheaf.bcast.lock")).unwrap();
        assert!(Install::begin(&dest, 10).is_err());
        assert!(!t.path().join("made").exists());
        fs::remove_file(dir.join(".a.sheaf.bcast.lock")).unwrap();
        // The copy's old predictable names and the signature's place hold
        // links: the copy goes elsewhere, the stale links are removed as
        // links, and the signature replaces its link.
        for pid in [std::process::id(), 1, 2] {
            symlink(&victim, dir.join(format!(".a.sheaf.bcast-{pid}.tmp"))).unwrap();
            symlink(&victim, dir.join(format!(".a.sheaf.bcast-{pid}.sig.tmp"))).unwrap();
        }
        symlink(&victim, dir.join("a.sheaf.sig")).unwrap();
        let i = Install::begin(&dest, 10).unwrap();
        i.write_at(b"0123456789", 0).unwrap();
        i.finish(Some(b"signature")).unwrap();
        assert_eq!(fs::read(&victim).unwrap(), b"precious");
        assert_eq!(fs::read(&dest).unwrap(), b"0123456789");
        assert_eq!(fs::read(dir.join("a.sheaf.sig")).unwrap(), b"signature");
        assert!(!fs::symlink_metadata(dir.join("a.sheaf.sig"))
            .unwrap()
            .file_type()
            .is_symlink());
        let left: Vec<String> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".tmp"))
            .collect();
        assert!(left.is_empty(), "stale temporaries left: {left:?}");
    }
}
