//! `sheaf publish`: write an image as a static, content-addressed layout
//! that any web server can serve and any caching proxy can cache, into a
//! directory or under an `s3://BUCKET/PREFIX`.
//!
//! ```text
//! DIR/NAME              image index (format.md §13)
//! DIR/objects/ab/abcd…  one object per distinct page or block
//! ```
//!
//! Objects never change once written, so a proxy may cache them forever;
//! only the small index changes between versions. Publishing a new version
//! into the same DIR writes only objects not already there. The index is
//! written last, so a client never sees an index whose objects are missing.

use rayon::prelude::*;
use sheaf_format::remote::object_path;
use sheaf_read::{Image, ReadError};
use std::fs;
use std::io::{self, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// What a publish did.
#[derive(Debug, Default, Clone, Copy)]
pub struct PublishReport {
    /// Objects written now.
    pub written: u64,
    /// Bytes of those objects.
    pub written_bytes: u64,
    /// Objects already present (from earlier versions or shared content).
    pub reused: u64,
    /// Bytes of the index.
    pub index_bytes: u64,
}

/// Why a publish failed.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// The name cannot be an index file name.
    #[error("'{0}' cannot be a published name (one path component, not 'objects', not starting with '.')")]
    BadName(String),
    /// Reading the image failed.
    #[error(transparent)]
    Read(#[from] ReadError),
    /// Writing the layout failed.
    #[error("{path}: {cause}")]
    Write {
        /// What was being written.
        path: String,
        /// Why it failed.
        #[source]
        cause: io::Error,
    },
}

/// The objects of a repository on a local filesystem, read in place: a
/// published index opened by path needs no server and no cache. Objects
/// are checked by the reader like any others; nothing is ever written or
/// removed here.
#[derive(Debug)]
pub struct RepoStore {
    dir: std::path::PathBuf,
}

impl sheaf_read::ObjectStore for RepoStore {
    fn get(&self, hash: &sheaf_format::Digest) -> Option<Vec<u8>> {
        fs::read(self.dir.join(object_path(hash))).ok()
    }
    fn contains(&self, hash: &sheaf_format::Digest) -> bool {
        self.dir.join(object_path(hash)).exists()
    }
    fn put(&self, _: &sheaf_format::Digest, _: &[u8]) {}
    fn remove(&self, _: &sheaf_format::Digest) {}
    fn store_stats(&self) -> sheaf_read::StoreStats {
        sheaf_read::StoreStats::Repository {
            repository: self.dir.display().to_string(),
        }
    }
}

/// Open the published index at `path` with its repository's objects.
pub fn open_local_index(path: &Path) -> io::Result<(sheaf_format::remote::ImageIndex, RepoStore)> {
    let bytes = fs::read(path)?;
    let index = sheaf_format::remote::ImageIndex::decode(&bytes)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
    let dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
    Ok((index, RepoStore { dir }))
}

/// Append bytes to the image that the local index at `path` stands for,
/// as `sheaf sign` appends a signature block to an image file: `make` gets
/// the offset where the bytes go (the image's current length) and returns
/// them; the index gains that range, grows its file length, and is
/// replaced whole by rename (readers see the old index or the new one).
pub fn append_to_local_index(path: &Path, make: impl FnOnce(u64) -> Vec<u8>) -> io::Result<()> {
    let (mut index, _) = open_local_index(path)?;
    let offset = index.file_len;
    let bytes = make(offset);
    index.add(offset, &bytes);
    index.file_len = offset + bytes.len() as u64;
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    write_file_atomic(dir, path, &index.encode())
}

/// Write `dest` whole or not at all: into a temporary file in `dir` (on
/// the same filesystem), synced, then renamed over `dest`; a failure
/// removes the temporary. Repository files (objects, indexes, image
/// records) and other state files that readers may see at any moment are
/// written this way.
pub fn write_file_atomic(dir: &Path, dest: &Path, bytes: &[u8]) -> io::Result<()> {
    if let Some(parent) = dest.parent() {
        fs::create_dir_all(parent)?;
    }
    // A fresh name made with O_EXCL (never a name another user could have
    // placed a symlink at), mode 0666 less the umask as any new file.
    let mut tmp = tempfile::Builder::new()
        .prefix(".tmp.")
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666))
        .tempfile_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(dest).map(drop).map_err(|e| e.error)
}

fn write_atomic(dir: &Path, dest: &Path, bytes: &[u8]) -> Result<(), PublishError> {
    write_file_atomic(dir, dest, bytes).map_err(|cause| PublishError::Write {
        path: dest.display().to_string(),
        cause,
    })
}

/// Where a repository is written: a directory, or a bucket's prefix.
trait Dest: Sync {
    /// Whether the file `rel` (relative to the repository) exists.
    fn exists(&self, rel: &str) -> Result<bool, PublishError>;
    /// Write `rel` whole or not at all.
    fn put(&self, rel: &str, bytes: &[u8]) -> Result<(), PublishError>;
}

struct DirDest<'a>(&'a Path);

impl Dest for DirDest<'_> {
    fn exists(&self, rel: &str) -> Result<bool, PublishError> {
        Ok(self.0.join(rel).exists())
    }
    fn put(&self, rel: &str, bytes: &[u8]) -> Result<(), PublishError> {
        write_atomic(self.0, &self.0.join(rel), bytes)
    }
}

struct S3Dest<'a>(&'a crate::s3::S3);

impl S3Dest<'_> {
    fn fail(&self, rel: &str) -> impl Fn(io::Error) -> PublishError + '_ {
        let path = format!("s3://{}/{}", self.0.bucket(), self.0.under(rel));
        move |cause| PublishError::Write {
            path: path.clone(),
            cause,
        }
    }
}

impl Dest for S3Dest<'_> {
    fn exists(&self, rel: &str) -> Result<bool, PublishError> {
        self.0.exists(&self.0.under(rel)).map_err(self.fail(rel))
    }
    fn put(&self, rel: &str, bytes: &[u8]) -> Result<(), PublishError> {
        self.0
            .put(&self.0.under(rel), bytes)
            .map_err(self.fail(rel))
    }
}

/// A repository being written: a local directory or `s3://BUCKET/PREFIX`
/// (for writers of more than one image's files, such as `sheaf import
/// --publish`, which adds blob links and image records after the layers).
pub enum Repository {
    /// A directory (created when opened).
    Dir(std::path::PathBuf),
    /// A bucket's prefix.
    S3(Box<crate::s3::S3>),
}

impl Repository {
    /// The repository `target` names (a path, or an `s3://` URL reached
    /// with `opts`).
    pub fn open(target: &Path, opts: crate::HttpOptions) -> io::Result<Repository> {
        let s = target.to_string_lossy();
        if crate::s3::is_s3(&s) {
            return Ok(Repository::S3(Box::new(crate::s3::S3::new(&s, opts)?)));
        }
        fs::create_dir_all(target)?;
        Ok(Repository::Dir(target.to_path_buf()))
    }

    /// The local directory, if it is one.
    pub fn dir(&self) -> Option<&Path> {
        match self {
            Repository::Dir(d) => Some(d),
            Repository::S3(_) => None,
        }
    }

    /// Where the file `rel` is: a path or a URL (to show, or to open).
    pub fn location(&self, rel: &str) -> String {
        match self {
            Repository::Dir(d) => d.join(rel).display().to_string(),
            Repository::S3(s) => format!("s3://{}/{}", s.bucket(), s.under(rel)),
        }
    }

    /// Whether the file `rel` exists.
    pub fn exists(&self, rel: &str) -> io::Result<bool> {
        match self {
            Repository::Dir(d) => Ok(d.join(rel).exists()),
            Repository::S3(s) => s.exists(&s.under(rel)),
        }
    }

    /// Write the file `rel` whole or not at all.
    pub fn put(&self, rel: &str, bytes: &[u8]) -> io::Result<()> {
        match self {
            Repository::Dir(d) => write_file_atomic(d, &d.join(rel), bytes),
            Repository::S3(s) => s.put(&s.under(rel), bytes),
        }
    }

    /// [`publish`] `img` as `name` here.
    pub fn publish(
        &self,
        img: &Image,
        name: &str,
        progress: &(dyn Fn(u64, u64) + Sync),
    ) -> Result<PublishReport, PublishError> {
        match self {
            Repository::Dir(d) => publish(img, d, name, progress),
            Repository::S3(s) => {
                check_name(name)?;
                publish_into(img, &S3Dest(s), name, progress)
            }
        }
    }
}

fn check_name(name: &str) -> Result<(), PublishError> {
    if name.is_empty() || name.contains('/') || name.starts_with('.') || name == "objects" {
        return Err(PublishError::BadName(name.to_string()));
    }
    Ok(())
}

/// Publish `img` into `dir` under `name`; `progress` gets (done, total).
pub fn publish(
    img: &Image,
    dir: &Path,
    name: &str,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<PublishReport, PublishError> {
    check_name(name)?;
    fs::create_dir_all(dir.join("objects")).map_err(|cause| PublishError::Write {
        path: dir.display().to_string(),
        cause,
    })?;
    publish_into(img, &DirDest(dir), name, progress)
}

/// Publish `img` under `s3://BUCKET/PREFIX` (`url`) as `name`: the same
/// layout as [`publish`], each file one PUT (an object is whole or absent),
/// objects first and the index last, so a reader never sees an index whose
/// objects are missing. Credentials and endpoint: [`crate::s3::S3Config`].
pub fn publish_to_url(
    img: &Image,
    url: &str,
    name: &str,
    opts: crate::HttpOptions,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<PublishReport, PublishError> {
    check_name(name)?;
    let s3 = crate::s3::S3::new(url, opts).map_err(|cause| PublishError::Write {
        path: crate::redact(url),
        cause,
    })?;
    publish_into(img, &S3Dest(&s3), name, progress)
}

fn publish_into(
    img: &Image,
    dest: &dyn Dest,
    name: &str,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<PublishReport, PublishError> {
    let mut refs = img.object_refs()?;
    refs.sort_by_key(|(r, _)| r.hash);
    refs.dedup_by_key(|(r, _)| r.hash);
    let total = refs.len() as u64;
    let (written, bytes, reused, done) = (
        AtomicU64::new(0),
        AtomicU64::new(0),
        AtomicU64::new(0),
        AtomicU64::new(0),
    );
    refs.par_iter().try_for_each(|(r, max)| {
        let rel = object_path(&r.hash);
        if dest.exists(&rel)? {
            reused.fetch_add(1, Relaxed);
        } else {
            let obj = img.object(r, *max)?;
            dest.put(&rel, &obj)?;
            written.fetch_add(1, Relaxed);
            bytes.fetch_add(obj.len() as u64, Relaxed);
        }
        progress(done.fetch_add(1, Relaxed) + 1, total);
        Ok::<(), PublishError>(())
    })?;
    // Dictionaries travel as the objects of their digests, stored as is
    // (format.md §13): a reader of another image in this repository whose
    // blocks' objects came from this one finds them here.
    let mut dicts: Vec<_> = img.dictionaries().to_vec();
    for f in img.foreign_dictionaries() {
        if !dicts.iter().any(|d| d.digest() == f.digest()) {
            dicts.push(f);
        }
    }
    for d in dicts {
        let rel = object_path(d.digest());
        if !dest.exists(&rel)? {
            let obj = sheaf_format::remote::encode_object(sheaf_format::Codec::None, d.bytes());
            dest.put(&rel, &obj)?;
            written.fetch_add(1, Relaxed);
            bytes.fetch_add(obj.len() as u64, Relaxed);
        }
    }
    let index = img.index()?.encode();
    dest.put(name, &index)?;
    Ok(PublishReport {
        written: written.into_inner(),
        written_bytes: bytes.into_inner(),
        reused: reused.into_inner(),
        index_bytes: index.len() as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Another user who can write the directory plants symlinks where the
    /// temporary file would go (the names this process used to choose:
    /// its pid and thread id); the write goes only to `dest`.
    #[test]
    fn an_atomic_write_never_follows_a_planted_link() {
        let t = tempfile::tempdir().unwrap();
        let victim = t.path().join("victim");
        fs::write(&victim, b"precious").unwrap();
        let dir = t.path().join("repo");
        fs::create_dir(&dir).unwrap();
        let old_name = format!(
            ".tmp.{}.{:?}",
            std::process::id(),
            std::thread::current().id()
        );
        std::os::unix::fs::symlink(&victim, dir.join(&old_name)).unwrap();
        let dest = dir.join("index");
        write_file_atomic(&dir, &dest, b"new bytes").unwrap();
        assert_eq!(fs::read(&victim).unwrap(), b"precious");
        assert!(fs::symlink_metadata(&dest).unwrap().file_type().is_file());
        assert_eq!(fs::read(&dest).unwrap(), b"new bytes");
        // A readable file (mode 0666 less the umask), nothing left behind
        // but the planted link.
        let names: Vec<String> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
    }
}
