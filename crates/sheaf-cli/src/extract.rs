//! `sheaf extract`: arguments and the report; the extraction itself (and
//! its safety rules) is [`sheaf_read::extract`](mod@sheaf_read::extract).

use crate::util::human;
use crate::util::open_image as open_path;
use anyhow::Result;
use sheaf_read::ExtractOptions;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

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
        value_name = "DIR"
    )]
    dir: PathBuf,
    /// Print a JSON report on stdout.
    #[arg(long)]
    json: bool,
}

/// `sheaf extract`.
pub fn run(a: ExtractArgs, remote: &crate::util::RemoteArgs) -> Result<i32> {
    let img = open_path(&a.image, remote)?;
    let opts = ExtractOptions {
        target: a.dir.clone(),
        paths: a.paths.iter().map(|p| p.as_bytes().to_vec()).collect(),
    };
    let s = sheaf_read::extract(&img, &opts)?;
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
