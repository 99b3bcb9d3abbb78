//! Where metadata images are kept: one per image root digest, in a
//! directory only root may change, made once and reused by every later
//! mount of the same image.

use sheaf_dir::{private_dir, PrivateDirError};
use sheaf_erofs::{BlobMap, ErofsError};
use sheaf_read::{Image, Stack};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The version of the writer's layout in the names: a new layout never
/// takes an old file for its own.
const VERSION: &str = "v1";

/// Whether `path` (a mount's source) names a metadata image this module
/// wrote: `<root digest>.<version>.erofs`. How `sheaf umount` tells a
/// kernel-path mount from another EROFS mount.
pub fn is_metadata_image(path: &Path) -> bool {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return false;
    };
    name.strip_suffix(".erofs")
        .and_then(|n| n.split_once('.'))
        .is_some_and(|(hex, v)| {
            hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) && v.starts_with('v')
        })
}

/// A metadata image ready to mount.
#[derive(Debug)]
pub struct Prepared {
    /// Its path.
    pub meta: PathBuf,
    /// The blob map that goes with it.
    pub map: BlobMap,
    /// Whether this call wrote it (else an earlier mount did).
    pub made: bool,
}

/// Why no metadata image could be had.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    /// The directory is not one only root may change.
    #[error(transparent)]
    Dir(#[from] PrivateDirError),
    /// Reading or writing there failed.
    #[error("{}: {}", path.display(), sheaf_format::one_line(source))]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The writer refused (the image holds what EROFS cannot say), or the
    /// image could not be read.
    #[error(transparent)]
    Erofs(#[from] ErofsError),
}

/// What names the metadata image of `layers`: one image's root digest; for
/// a stack, the digest of its layers' roots in order.
fn stem(layers: &[Arc<Image>]) -> String {
    match layers {
        [img] => sheaf_format::hex(&img.root_digest()),
        _ => {
            let mut b = b"sheaf-stack-v1".to_vec();
            for l in layers {
                b.extend_from_slice(&l.root_digest());
            }
            sheaf_format::hex(&sheaf_format::digest(&b))
        }
    }
}

/// The metadata image of `layers` (one image, or a stack bottom first,
/// written as its merged view) in `dir` (made 0700 and checked as
/// `sheaf_dir::private_dir` does), written there first if no earlier
/// mount left a complete one. Both files are written under temporary
/// names and renamed into place, the blob map first: a metadata image
/// present means its map is too.
pub fn prepare(layers: &[Arc<Image>], dir: &Path) -> Result<Prepared, PrepareError> {
    let d = private_dir(dir)?;
    let stem = stem(layers);
    let (meta_name, map_name) = (
        format!("{stem}.{VERSION}.erofs"),
        format!("{stem}.{VERSION}.map"),
    );
    let io_err = |name: &str| {
        let path = dir.join(name);
        move |source| PrepareError::Io { path, source }
    };
    if let (Ok(meta), Ok(mut m)) = (d.open_regular(&meta_name), d.open_regular(&map_name)) {
        let mut bytes = Vec::new();
        m.read_to_end(&mut bytes).map_err(io_err(&map_name))?;
        if let Some(map) = BlobMap::decode(&bytes) {
            // Used now: `gc` keeps what mounts use.
            let _ = meta.set_modified(std::time::SystemTime::now());
            return Ok(Prepared {
                meta: dir.join(&meta_name),
                map,
                made: false,
            });
        }
        log::warn!(
            "{}: not a blob map; writing it again",
            dir.join(&map_name).display()
        );
    }
    let (tmp, file) = d.temp_file(".meta", ".tmp").map_err(io_err(&meta_name))?;
    let written = (|| -> Result<_, PrepareError> {
        let mut out = io::BufWriter::new(file);
        let w = match layers {
            [img] => sheaf_erofs::write(img, &mut out)?,
            _ => sheaf_erofs::write_stack(&Stack::new(layers.to_vec()), &mut out)?,
        };
        out.flush().map_err(io_err(&meta_name))?;
        d.write_atomic(&map_name, &w.map.encode(), 0o600)
            .map_err(io_err(&map_name))?;
        d.rename(&tmp, &meta_name).map_err(io_err(&meta_name))?;
        Ok(w)
    })();
    let w = match written {
        Ok(w) => w,
        Err(e) => {
            let _ = d.remove_file(&tmp);
            return Err(e);
        }
    };
    Ok(Prepared {
        meta: dir.join(&meta_name),
        map: w.map,
        made: true,
    })
}

/// What [`gc`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub struct GcReport {
    /// The cache's directory.
    pub dir: PathBuf,
    /// Metadata images removed (with their blob maps).
    pub removed: u64,
    /// Metadata images kept (used more recently than the threshold).
    pub kept: u64,
    /// Temporary files of killed writers removed, and blob maps left
    /// without their metadata image.
    pub leftovers: u64,
    /// Bytes the removed files held.
    pub bytes_freed: u64,
}

/// A writer's temporary file older than this was left by a killed one.
const TEMP_AGE: std::time::Duration = std::time::Duration::from_secs(3600);

/// Remove from `dir` the metadata images (and their blob maps) no mount
/// has prepared for `older_than` (a mount that reuses one refreshes its
/// time), temporary files of killed writers (over an hour old) and blob
/// maps left without their image. Removing an image a mount is using harms
/// no one: the kernel holds the file open until it is unmounted, and the
/// next mount of that image writes it again. A missing `dir` holds nothing.
pub fn gc(dir: &Path, older_than: std::time::Duration) -> Result<GcReport, PrepareError> {
    let mut r = GcReport {
        dir: dir.to_path_buf(),
        ..GcReport::default()
    };
    if matches!(std::fs::symlink_metadata(dir), Err(e) if e.kind() == io::ErrorKind::NotFound) {
        return Ok(r);
    }
    let d = private_dir(dir)?;
    let io_err = |name: &std::ffi::OsStr| {
        let path = dir.join(name);
        move |source| PrepareError::Io { path, source }
    };
    let now = std::time::SystemTime::now();
    let age = |mtime: i64| {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(mtime.max(0) as u64);
        now.duration_since(t).unwrap_or_default()
    };
    let names = d.entries().map_err(io_err(std::ffi::OsStr::new(".")))?;
    // Images first, so a map is removed only after its image: an image
    // present means its map is too (what `prepare` relies on).
    for name in &names {
        let Some(n) = name.to_str() else { continue };
        let Ok(st) = d.stat(name) else { continue };
        if is_metadata_image(&dir.join(n)) {
            let map = format!("{}.map", n.trim_end_matches(".erofs"));
            if age(st.st_mtime) < older_than {
                r.kept += 1;
                continue;
            }
            d.remove_file(name).map_err(io_err(name))?;
            r.removed += 1;
            r.bytes_freed += st.st_size as u64;
            if let Ok(ms) = d.stat(&map) {
                d.remove_file(&map)
                    .map_err(io_err(std::ffi::OsStr::new(&map)))?;
                r.bytes_freed += ms.st_size as u64;
            }
        }
    }
    for name in &names {
        let Some(n) = name.to_str() else { continue };
        let Ok(st) = d.stat(name) else { continue };
        let orphan_map = n.ends_with(".map")
            && d.stat(format!("{}.erofs", n.trim_end_matches(".map")))
                .is_err();
        let temp = n.ends_with(".tmp") || n.starts_with(".sheaf-tmp-");
        if (orphan_map || temp) && age(st.st_mtime) >= TEMP_AGE {
            d.remove_file(name).map_err(io_err(name))?;
            r.leftovers += 1;
            r.bytes_freed += st.st_size as u64;
        }
    }
    Ok(r)
}
