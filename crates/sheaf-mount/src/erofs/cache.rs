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
    if let (Ok(_), Ok(mut m)) = (d.open_regular(&meta_name), d.open_regular(&map_name)) {
        let mut bytes = Vec::new();
        m.read_to_end(&mut bytes).map_err(io_err(&map_name))?;
        if let Some(map) = BlobMap::decode(&bytes) {
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
