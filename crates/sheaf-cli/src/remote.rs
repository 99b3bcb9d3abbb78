//! `sheaf publish` and `sheaf cache`.

use crate::util::{disk_cache, human, open_image, remote_args};
use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use serde_json::json;
use std::path::PathBuf;

/// Arguments of `sheaf publish`.
#[derive(Args, Debug)]
#[command(after_long_help = "\
Layout written (serve DIR with any static web server):
  DIR/NAME              the image index: header, trailer, superblock, signatures
  DIR/objects/ab/abcd…  one immutable object per distinct page or block

Clients mount https://HOST/PATH/NAME like an image URL. Objects never change,
so proxies may cache them forever; publishing a new version into the same DIR
writes only the objects it does not already hold, and the index last.

Examples:
  sheaf publish stack-2026.11.sheaf /srv/www/repo --name stack
  sheaf mount https://repo.example.org/repo/stack /opt/stack")]
pub struct PublishArgs {
    /// The image (file or URL).
    image: PathBuf,
    /// The repository directory (created if missing).
    dir: PathBuf,
    /// Name of the index in DIR [default: the image's file name without .sheaf].
    #[arg(long)]
    name: Option<String>,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// `sheaf publish`.
pub fn publish(a: PublishArgs) -> Result<i32> {
    let name = match a.name {
        Some(n) => n,
        None => {
            let f = a
                .image
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_default();
            f.strip_suffix(".sheaf").unwrap_or(&f).to_string()
        }
    };
    let img = open_image(&a.image)?;
    let bar = crate::util::stderr_is_tty().then(|| {
        let b = indicatif::ProgressBar::new(0);
        b.set_style(
            indicatif::ProgressStyle::with_template("publishing {bar:30} {pos}/{len} objects")
                .expect("template"),
        );
        b
    });
    let r = sheaf_net::publish(&img, &a.dir, &name, &|done, total| {
        if let Some(b) = &bar {
            b.set_length(total);
            b.set_position(done);
        }
    })?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    if a.json {
        println!(
            "{}",
            json!({
                "index": a.dir.join(&name).display().to_string(),
                "objects_written": r.written,
                "bytes_written": r.written_bytes,
                "objects_reused": r.reused,
                "index_bytes": r.index_bytes,
            })
        );
    } else {
        println!(
            "published {} as {}: {} new objects ({}), {} already there, index {}",
            img.name(),
            a.dir.join(&name).display(),
            r.written,
            human(r.written_bytes),
            r.reused,
            human(r.index_bytes)
        );
    }
    Ok(0)
}

/// Arguments of `sheaf cache`.
#[derive(Args, Debug)]
pub struct CacheArgs {
    #[command(subcommand)]
    cmd: CacheCmd,
}

#[derive(Subcommand, Debug)]
enum CacheCmd {
    /// Show what the node cache holds.
    Stats {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Evict least recently used objects down to the quota (--cache-size or
    /// SIZE) and remove files left by killed writers.
    Gc {
        /// Target size (default: the quota).
        size: Option<String>,
    },
    /// Remove everything from the node cache.
    Clear,
}

/// `sheaf cache`.
pub fn cache(a: CacheArgs) -> Result<i32> {
    let ra = remote_args();
    let Some(c) = disk_cache(&ra)? else {
        bail!("no node cache (--no-cache given, or no --cache-dir and no HOME)");
    };
    match a.cmd {
        CacheCmd::Stats { json } => {
            let u = c.usage()?;
            if json {
                println!(
                    "{}",
                    json!({
                        "dir": c.root().display().to_string(),
                        "objects": u.objects,
                        "bytes": u.bytes,
                        "quota": c.quota(),
                        "indexes": u.indexes,
                        "temp_files": u.temp_files,
                    })
                );
            } else {
                println!("node cache {}", c.root().display());
                println!(
                    "  objects  {} ({} of {} quota)",
                    u.objects,
                    human(u.bytes),
                    human(c.quota())
                );
                println!("  images   {} cached indexes", u.indexes);
                if u.temp_files > 0 {
                    println!("  temp     {} files being written or left by killed writers (gc removes those over 1 h old)", u.temp_files);
                }
            }
        }
        CacheCmd::Gc { size } => {
            let target = match size {
                Some(s) => crate::util::parse_size64(&s).map_err(anyhow::Error::msg)?,
                None => c.quota(),
            };
            let (n, left) = c.gc(target)?;
            println!("evicted {n} objects; {} held", human(left));
        }
        CacheCmd::Clear => {
            let n = c.clear()?;
            println!("removed {n} objects from {}", c.root().display());
        }
    }
    Ok(0)
}
