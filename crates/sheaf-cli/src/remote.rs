//! `sheaf publish` and `sheaf cache`.

use crate::util::{disk_cache, human, open_image, RemoteArgs};
use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use serde_json::json;
use std::io::Write;
use std::path::PathBuf;

/// Arguments of `sheaf publish`.
#[derive(Args, Debug)]
#[command(after_long_help = "\
Layout written (serve DIR with any static web server):
  DIR/NAME              the image index: header, trailer, superblock, signatures
  DIR/objects/ab/abcd…  one immutable object per distinct page or block

DIR may be s3://BUCKET/PREFIX (credentials and endpoint as the AWS tools take
them: docs/remote.md); each file is one PUT, the index last.

Clients mount https://HOST/PATH/NAME like an image URL. Objects never change,
so proxies may cache them forever; publishing a new version into the same DIR
writes only the objects it does not already hold, and the index last.

Examples:
  sheaf publish stack-2026.11.sheaf /srv/www/repo --name stack
  sheaf mount https://repo.example.org/repo/stack /opt/stack
  sheaf publish stack-2026.11.sheaf s3://bucket/repo --name stack
  sheaf mount s3://bucket/repo/stack /opt/stack")]
pub struct PublishArgs {
    /// The image (file or URL).
    image: PathBuf,
    /// The repository directory (created if missing), or s3://BUCKET/PREFIX.
    #[arg(value_hint = clap::ValueHint::DirPath)]
    dir: PathBuf,
    /// Name of the index in DIR [default: the image's file name without .sheaf].
    #[arg(long)]
    name: Option<String>,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// `sheaf publish`.
pub fn publish(a: PublishArgs, remote: &RemoteArgs, io: &mut crate::Io<'_>) -> Result<i32> {
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
    let img = open_image(&a.image, remote)?;
    let bar = io.stderr_is_tty().then(|| {
        let b = indicatif::ProgressBar::new(0);
        b.set_style(
            indicatif::ProgressStyle::with_template("publishing {bar:30} {pos}/{len} objects")
                .expect("template"),
        );
        b
    });
    let progress = |done, total| {
        if let Some(b) = &bar {
            b.set_length(total);
            b.set_position(done);
        }
    };
    let dir = a.dir.to_string_lossy().into_owned();
    let (r, index) = if sheaf_net::s3::is_s3(&dir) {
        let opts = crate::util::http_options(remote)?;
        let r = sheaf_net::publish_to_url(&img, &dir, &name, opts, &progress)?;
        (r, format!("{}/{name}", dir.trim_end_matches('/')))
    } else {
        let r = sheaf_net::publish(&img, &a.dir, &name, &progress)?;
        (r, a.dir.join(&name).display().to_string())
    };
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    if a.json {
        writeln!(
            io.stdout,
            "{}",
            json!({
                "index": index,
                "objects_written": r.written,
                "bytes_written": r.written_bytes,
                "objects_reused": r.reused,
                "index_bytes": r.index_bytes,
            })
        )?;
    } else {
        writeln!(
            io.stdout,
            "published {} as {}: {} new objects ({}), {} already there, index {}",
            img.name(),
            index,
            r.written,
            human(r.written_bytes),
            r.reused,
            human(r.index_bytes)
        )?;
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
    /// SIZE) and remove files left by killed writers. With --kernel: remove
    /// the kernel path's metadata images no mount has used for --older-than
    /// (root's cache, not the node cache).
    Gc {
        /// Target size (default: the quota).
        size: Option<String>,
        /// The kernel path's cache of metadata images (`sheaf mount
        /// --kernel`) instead of the node cache.
        #[arg(long, conflicts_with = "size")]
        kernel: bool,
        /// With --kernel: remove what no mount has used for this long
        /// (`30d`, `12h`, `90m`, `0` for everything not being written).
        #[arg(long, value_name = "AGE", default_value = "30d", requires = "kernel")]
        older_than: String,
        /// With --kernel: the cache's directory (default: the site's
        /// `[mount] kernel_cache`, else /var/cache/sheaf/kernel).
        #[arg(long, value_name = "DIR", requires = "kernel")]
        kernel_cache: Option<PathBuf>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Remove everything from the node cache.
    Clear,
    /// Fetch a remote image's metadata, and the blocks of the files LIST
    /// names (every file without --list), into the node cache ahead of use:
    /// warm a node before a job (the containerd snapshotter runs this with
    /// an image's recorded prefetch list).
    Fetch {
        /// The image (a URL).
        image: PathBuf,
        /// Files to fetch, one path per line (as `sheaf mount -o record=FILE`
        /// writes); paths the image lacks are skipped.
        #[arg(long, value_name = "FILE")]
        list: Option<PathBuf>,
        /// Requests in flight.
        #[arg(long, default_value_t = 16, value_name = "N")]
        parallel: usize,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// `sheaf cache`.
pub fn cache(a: CacheArgs, remote: &RemoteArgs, io: &mut crate::Io<'_>) -> Result<i32> {
    if let CacheCmd::Gc {
        kernel: true,
        older_than,
        kernel_cache,
        json,
        ..
    } = &a.cmd
    {
        return kernel_gc(older_than, kernel_cache.as_deref(), *json, io);
    }
    let Some(c) = disk_cache(remote)? else {
        bail!("no node cache (--no-cache given, or no --cache-dir and no HOME)");
    };
    match a.cmd {
        CacheCmd::Stats { json } => {
            let u = c.usage()?;
            if json {
                writeln!(
                    io.stdout,
                    "{}",
                    json!({
                        "dir": c.root().display().to_string(),
                        "objects": u.objects,
                        "bytes": u.bytes,
                        "quota": c.quota(),
                        "indexes": u.indexes,
                        "temp_files": u.temp_files,
                    })
                )?;
            } else {
                writeln!(io.stdout, "node cache {}", c.root().display())?;
                writeln!(
                    io.stdout,
                    "  objects  {} ({} of {} quota)",
                    u.objects,
                    human(u.bytes),
                    human(c.quota())
                )?;
                writeln!(io.stdout, "  images   {} cached indexes", u.indexes)?;
                if u.temp_files > 0 {
                    writeln!(io.stdout, "  temp     {} files being written or left by killed writers (gc removes those over 1 h old)", u.temp_files)?;
                }
            }
        }
        CacheCmd::Gc { size, json, .. } => {
            let target = match size {
                Some(s) => crate::util::parse_size64(&s).map_err(anyhow::Error::msg)?,
                None => c.quota(),
            };
            let (n, left) = c.gc(target)?;
            if json {
                writeln!(io.stdout, "{}", json!({"evicted": n, "bytes_held": left}))?;
            } else {
                writeln!(io.stdout, "evicted {n} objects; {} held", human(left))?;
            }
        }
        CacheCmd::Clear => {
            let n = c.clear()?;
            writeln!(io.stdout, "removed {n} objects from {}", c.root().display())?;
        }
        CacheCmd::Fetch {
            image,
            list,
            parallel,
            json,
        } => {
            if !sheaf_net::is_url(&image.to_string_lossy()) {
                bail!(
                    "{}: a local image is read in place; only URLs are fetched into the node cache",
                    image.display()
                );
            }
            let img = crate::util::open_image(&image, remote)?;
            let meta = img.prefetch_metadata(parallel)?;
            let blocks = match &list {
                Some(l) => crate::util::prefetch_blocks(&img, l)?,
                None => (0..img.superblock().block_count as u32).collect(),
            };
            let data = img.prefetch_blocks(&blocks, parallel)?;
            if json {
                writeln!(
                    io.stdout,
                    "{}",
                    json!({"image": image.display().to_string(), "blocks": blocks.len(),
                        "metadata_bytes_fetched": meta, "data_bytes_fetched": data})
                )?;
            } else {
                writeln!(
                    io.stdout,
                    "{}: {} blocks in the node cache; fetched {} of metadata and {} of data",
                    image.display(),
                    blocks.len(),
                    human(meta),
                    human(data)
                )?;
            }
        }
    }
    Ok(0)
}

/// Arguments of `sheaf optimize`.
#[derive(Args, Debug)]
pub struct OptimizeArgs {
    /// The image (file or URL).
    image: PathBuf,
    /// Files a workload reads first, one path per line (as `sheaf mount -o
    /// record=FILE` writes).
    #[arg(long, value_name = "FILE")]
    prefetch: PathBuf,
    /// The new image.
    #[arg(short = 'o', long, value_name = "IMAGE")]
    output: PathBuf,
    /// Replace the output if it exists.
    #[arg(short = 'f', long)]
    force: bool,
    /// Print what was written as JSON (docs/json.md).
    #[arg(long)]
    json: bool,
}

/// `sheaf optimize`: the same tree with the listed files' blocks first and
/// listed in a prefetch section; data is copied as stored, not recompressed.
pub fn optimize(a: OptimizeArgs, remote: &RemoteArgs, io: &mut crate::Io<'_>) -> Result<i32> {
    use sheaf_format::StreamId;
    let img = open_image(&a.image, remote)?;
    let first = crate::util::prefetch_blocks(&img, &a.prefetch)?;
    if first.is_empty() {
        bail!(
            "{}: none of the listed paths is a file with data in {}",
            a.prefetch.display(),
            img.name()
        );
    }
    let sb = img.superblock().clone();
    let mut streams: [Vec<u8>; 5] = Default::default();
    for id in StreamId::ALL {
        if id != StreamId::Blocks {
            let len = usize::try_from(sb.stream(id).len)?;
            streams[id as usize] = img.read_stream(id, 0, len)?;
        }
    }
    let blocks = (0..sb.block_count as u32)
        .map(|id| img.block_ref(id))
        .collect::<Result<Vec<_>, _>>()?;
    let mut info = img.build_info()?;
    info.optimized = Some(sheaf_format::build_info::Optimized {
        from_root: sheaf_format::hex(&img.root_digest()),
        prefetch_blocks: first.len() as u64,
        by: format!("sheaf {}", env!("CARGO_PKG_VERSION")),
    });
    let parts = sheaf_build::rewrite::Parts {
        superblock: sb.clone(),
        streams,
        blocks,
        build_info: info.encode(),
        ref_bases: img.ref_bases().to_vec(),
    };
    let stored = |_id: u32, r: &sheaf_format::BlockRef| {
        let obj = img.object(r, sb.block_size).map_err(|e| e.to_string())?;
        let (codec, bytes) =
            sheaf_format::remote::decode_object(&obj).map_err(|e| e.to_string())?;
        Ok((codec, bytes.to_vec()))
    };
    let len = sheaf_build::rewrite::rewrite(
        parts,
        &first,
        &stored,
        &img,
        &a.output,
        &Default::default(),
        a.force,
    )?;
    if a.json {
        // The new root, read back from what was written.
        let out = sheaf_read::open_path(&a.output)?;
        /// What `optimize --json` prints (docs/json.md; fields sorted, as
        /// printed before).
        #[derive(serde::Serialize)]
        struct Optimized {
            blocks: u64,
            bytes: u64,
            from_root: String,
            output: String,
            prefetch_blocks: usize,
            root_digest: String,
        }
        let report = Optimized {
            blocks: sb.block_count,
            bytes: len,
            from_root: sheaf_format::hex(&img.root_digest()),
            output: a.output.display().to_string(),
            prefetch_blocks: first.len(),
            root_digest: sheaf_format::hex(&out.root_digest()),
        };
        writeln!(io.stdout, "{}", serde_json::to_string(&report)?)?;
        return Ok(0);
    }
    writeln!(
        io.stdout,
        "wrote {} ({}): {} of {} blocks placed first and listed for prefetch",
        a.output.display(),
        human(len),
        first.len(),
        sb.block_count
    )?;
    Ok(0)
}

/// `sheaf cache gc --kernel`: the kernel path's metadata images no mount
/// has used for `older_than`.
fn kernel_gc(
    older_than: &str,
    dir: Option<&std::path::Path>,
    json: bool,
    io: &mut crate::Io<'_>,
) -> Result<i32> {
    let age = parse_age(older_than).ok_or_else(|| {
        anyhow::anyhow!("--older-than {older_than}: not an age such as 30d, 12h, 90m, 45s or 0")
    })?;
    let dir = match dir {
        Some(d) => d.to_path_buf(),
        None => {
            let site = crate::options::site_mount_options(&sheaf_trust::policy::site_config()?)?;
            site.iter()
                .find_map(|o| o.strip_prefix("kernel_cache="))
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(crate::options::KERNEL_CACHE))
        }
    };
    let r = sheaf_mount::erofs::gc(&dir, age)?;
    if json {
        writeln!(io.stdout, "{}", serde_json::to_string(&r)?)?;
    } else {
        writeln!(
            io.stdout,
            "{}: removed {} metadata images unused for {older_than} and {} leftovers ({}); kept {}",
            dir.display(),
            r.removed,
            r.leftovers,
            human(r.bytes_freed),
            r.kept
        )?;
    }
    Ok(0)
}

/// `30d`, `12h`, `90m`, `45s`, `0` (a bare number is seconds).
fn parse_age(s: &str) -> Option<std::time::Duration> {
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num.parse().ok()?;
    let secs = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86400,
        _ => return None,
    };
    Some(std::time::Duration::from_secs(n.checked_mul(secs)?))
}

#[cfg(test)]
mod tests {
    use super::parse_age;
    use std::time::Duration;

    #[test]
    fn ages() {
        assert_eq!(parse_age("30d"), Some(Duration::from_secs(30 * 86400)));
        assert_eq!(parse_age("12h"), Some(Duration::from_secs(43200)));
        assert_eq!(parse_age("90m"), Some(Duration::from_secs(5400)));
        assert_eq!(parse_age("0"), Some(Duration::ZERO));
        assert_eq!(parse_age("45s"), Some(Duration::from_secs(45)));
        for bad in ["", "d", "3w", "-1d", "1.5h", "99999999999999999999d"] {
            assert_eq!(parse_age(bad), None, "{bad}");
        }
    }
}
