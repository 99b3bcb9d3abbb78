//! `sheaf extract`: arguments and the report; the extraction itself (and
//! its safety rules) is [`sheaf_read::extract`](mod@sheaf_read::extract).

use crate::util::human;
use crate::util::open_image as open_path;
use anyhow::Result;
use sheaf_read::ExtractOptions;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Arguments of `sheaf extract`.
#[derive(clap::Args, Debug)]
pub struct ExtractArgs {
    /// The image.
    image: PathBuf,
    /// Paths inside the image to extract (default: everything).
    paths: Vec<std::ffi::OsString>,
    /// Directory to extract into (created if missing).
    #[arg(
        short = 'C',
        long = "directory",
        default_value = ".",
        value_name = "DIR",
        value_hint = clap::ValueHint::DirPath
    )]
    dir: PathBuf,
    /// Print a JSON report on stdout.
    #[arg(long)]
    json: bool,
}

/// `sheaf extract`.
pub fn run(a: ExtractArgs, remote: &crate::util::RemoteArgs) -> Result<i32> {
    let img = open_path(&a.image, remote)?;
    if a.dir == Path::new(".") {
        if let Some(p) = a.paths.iter().find(|p| meant_as_target(&img, p)) {
            anyhow::bail!(
                "{}: no such file or directory in the image (PATHS are inside the image; \
                 to extract into that directory: sheaf extract -C {} {})",
                p.to_string_lossy(),
                p.to_string_lossy(),
                a.image.display()
            );
        }
    }
    // The user's own arguments first: a path that climbs is theirs, not
    // the image's; one the image lacks is refused before DIR is made.
    for p in &a.paths {
        if p.as_bytes().split(|&b| b == b'/').any(|c| c == b"..") {
            anyhow::bail!(
                "{}: PATHS name entries inside the image, from its root, without '..'",
                p.to_string_lossy()
            );
        }
        if let Err(e @ sheaf_read::ReadError::NotFound(_)) = img.resolve(p.as_bytes()) {
            return Err(e.into());
        }
    }
    let opts = ExtractOptions {
        target: a.dir.clone(),
        paths: a.paths.iter().map(|p| p.as_bytes().to_vec()).collect(),
    };
    let s = match sheaf_read::extract(&img, &opts) {
        Ok(s) => s,
        Err(sheaf_read::ExtractError::Io { path, cause })
            if cause.kind() == std::io::ErrorKind::AlreadyExists =>
        {
            let full = a.dir.join(path.trim_start_matches('/'));
            anyhow::bail!(
                "{}: already exists (extract never replaces a file: extract into an empty directory with -C DIR, or remove what is there)",
                full.display()
            );
        }
        Err(e) => return Err(e.into()),
    };
    if a.json {
        println!(
            "{}",
            serde_json::json!({"directory": s.directory, "entries": s.entries, "bytes": s.bytes,
                "unrestored_attributes": s.unrestored, "first_unrestored": s.first_unrestored})
        );
    } else {
        eprintln!(
            "extracted {} entries ({}) into {}",
            s.entries,
            human(s.bytes),
            s.directory.display()
        );
        if s.unrestored > 0 {
            eprintln!(
                "sheaf: {} attributes could not be restored (first: {})",
                s.unrestored,
                s.first_unrestored.as_deref().unwrap_or("?")
            );
        }
    }
    Ok(0)
}

/// Whether `p`, missing from the image, looks like a directory to extract
/// into (`sheaf extract IMG DIR`, as `unsquashfs -d DIR` users would write):
/// it is a directory here, or could be created in one.
fn meant_as_target(img: &sheaf_read::Image, p: &std::ffi::OsStr) -> bool {
    if !matches!(
        img.resolve(p.as_bytes()),
        Err(sheaf_read::ReadError::NotFound(_))
    ) {
        return false;
    }
    let host = Path::new(p);
    host.is_dir()
        || host
            .parent()
            .is_some_and(|q| q.as_os_str().is_empty() || q.is_dir())
}
