//! `sheaf build`.

use crate::util::{human, parse_size};
use anyhow::{bail, Context, Result};
use sheaf_build::{BuildOptions, Compression, Input, Progress};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Arguments of `sheaf build`.
#[derive(clap::Args, Debug)]
#[command(after_help = "\
Examples:
  sheaf build ./dataset -o dataset.sheaf
  sheaf build release.tar.zst -o release.sheaf -c xz:9 --block-size 4M
  tar -cf - -C /opt/stack . | sheaf build - -o stack.sheaf
  SOURCE_DATE_EPOCH=1700000000 sheaf build src -o src.sheaf --owner 0:0
  sheaf build ./dataset -o dataset-v2.sheaf --base dataset.sheaf

Input order: directories are packed with related files together: the
versions of one file side by side (paths equal but for version numbers,
such as numpy/1.24.4/... and numpy/1.26.4/...), else by directory, then
name stem, so x.py and __pycache__/x.pyc sit side by side; versions of a
file too large to pack share blocks. Tar input is packed in archive order,
read once.
The image is written to a temporary file and renamed when complete.")]
pub struct BuildArgs {
    /// A directory, a tar archive (plain, .gz, .zst, .xz, .bz2), or '-' for a tar stream on stdin.
    source: PathBuf,
    /// The image to write.
    #[arg(short, long, value_name = "IMAGE", required_unless_present = "stray")]
    output: Option<PathBuf>,
    /// A second operand, as mksquashfs takes its output: refused with the
    /// command meant (the output goes after -o).
    #[arg(hide = true, value_name = "OUT")]
    stray: Option<PathBuf>,
    #[command(flatten)]
    image: ImageArgs,
    /// Files a workload reads first (one path per line, relative to SOURCE,
    /// as `sheaf mount -o record=FILE` writes): their data is placed first
    /// and contiguously, and mounts fetch their blocks ahead of the workload.
    #[arg(long, value_name = "FILE")]
    prefetch: Option<PathBuf>,
    /// Skip unreadable entries instead of failing; they are listed at the end.
    #[arg(long)]
    skip_errors: bool,
    /// Incremental build from PREV, an earlier image of SOURCE built with the
    /// same block size, pack size and compression. A regular file with the
    /// same path, size, mtime (to the nanosecond), mode and owner as in PREV
    /// is taken to be unchanged: its data is copied from PREV's stored blocks
    /// (checked against their digests, not recompressed) and never read, so
    /// an edit that keeps size and mtime is NOT seen. Everything else is read
    /// as in a full build. Copied blocks may keep bytes of files changed or
    /// removed since PREV (unreachable; see --base-stale): build without
    /// --base when such bytes must not ship.
    #[arg(long, value_name = "PREV")]
    base: Option<PathBuf>,
    /// With --base: copy a block of PREV only if at most PCT percent of it
    /// is data no unchanged file uses; the files of a staler block are
    /// packed anew. 0: copy only blocks all of whose files are unchanged.
    #[arg(long, value_name = "PCT", requires = "base",
          value_parser = clap::value_parser!(u8).range(0..=100))]
    base_stale: Option<u8>,
}

/// The options of every command that writes an image (`build`, `commit`,
/// `merge`): how it is compressed and normalised, and how the run reports.
#[derive(clap::Args, Debug)]
pub struct ImageArgs {
    /// The smallest images, for images read whole or seldom (archives,
    /// releases, cold copies): blocks and packs of 64M compressed with
    /// xz:9, so versions and files alike share one 64 MiB window. Builds
    /// take 9 to 15 times as long as by default and hold 0.7 GiB per
    /// thread; a read decodes up to 64 MiB. Same as --block-size 64M
    /// --pack-size 64M -c xz:9; any of those given as well wins.
    #[arg(long)]
    archive: bool,
    /// Compression: zstd[:1-22] (default zstd:12), lz4, xz[:0-9], none, or auto[:LEVEL]
    /// (per block, the smallest of zstd, lz4 and xz; data that does not shrink is stored raw).
    /// With zstd, a block that later blocks are compressed against (a pool's first version of
    /// a library) gets 6 levels more and a pack of a file's versions 4 (at most 19): a pool
    /// of versions comes out about 3% smaller for about twice the build time; trees with
    /// few versions, under 0.5% smaller, build up to a third longer
    #[arg(short, long, value_name = "CODEC[:LEVEL]")]
    compression: Option<String>,
    /// Data block size, a power of two from 4K to 64M (default: 4M). Larger
    /// compresses better; smaller makes random reads and lazy fetches cheaper.
    #[arg(long, value_name = "SIZE")]
    block_size: Option<String>,
    /// Size of the blocks small files and tails are packed into, a power of
    /// two from 4K to the block size (default: 256K, or the block size if
    /// smaller). Smaller makes a cold or remote read of one small file
    /// cheaper; larger compresses better. Files of a pack or more get blocks
    /// of their own. A pack holding versions of one file (a pool's
    /// NAME/1.2.3/... trees side by side) grows to four times this size.
    /// For archives that are read whole: --archive.
    #[arg(long, value_name = "SIZE")]
    pack_size: Option<String>,
    /// Do not train a zstd dictionary on the input's small files. By default
    /// an image compressed with zstd gets one (110 KiB, kept in the image)
    /// when the input has 16 MiB or more of small files, sampled across a
    /// directory or a merged stack, or from the first 32 MiB of a tar
    /// stream; its packs come out 1–3% smaller. Readers older than the
    /// dictionary format refuse such images.
    #[arg(long)]
    no_dict: bool,
    /// Packing order of a directory's or a merged stack's files: versions
    /// (the versions of one file side by side: paths equal but for version
    /// numbers such as 1.24.4) or directory (by directory, then name). For
    /// measurements.
    #[arg(long, default_value = "versions", value_name = "ORDER", hide = true)]
    order: String,
    /// Give every file of a pack or more a block of its own, even when the
    /// next is another version of it, and keep packs of versions at the
    /// pack size. For measurements.
    #[arg(long, hide = true)]
    no_group_blocks: bool,
    /// Memory for recent blocks that later blocks may be compressed
    /// against (a new version of a library then costs about what changed;
    /// a read of such a block decodes its base too). Files up to half of
    /// it are read whole and cut where they line up with those blocks.
    /// 0 turns it off. zstd only.
    #[arg(long, default_value = "128M", value_name = "SIZE")]
    ref_window: String,
    /// Metadata page size, a power of two from 4K to 1M.
    #[arg(long, default_value = "64K", value_name = "SIZE", hide = true)]
    page_size: String,
    /// Compression threads (default: all cores). Does not change the output.
    #[arg(short = 'j', long, value_name = "N")]
    threads: Option<usize>,
    /// Leave out paths matching GLOB (relative to the input's top, or a bare name). Repeatable.
    #[arg(long, value_name = "GLOB")]
    exclude: Vec<String>,
    /// Store every entry as owned by UID:GID.
    #[arg(long, value_name = "UID:GID")]
    owner: Option<String>,
    /// Store every mtime as T (seconds since the epoch). Without it,
    /// SOURCE_DATE_EPOCH, if set, clamps later mtimes to its value.
    #[arg(long, value_name = "T")]
    mtime: Option<i64>,
    /// Replace IMAGE if it exists.
    #[arg(short, long)]
    force: bool,
    /// Print a JSON report on stdout.
    #[arg(long)]
    pub json: bool,
    /// No progress bar and no summary.
    #[arg(short, long)]
    pub quiet: bool,
}

fn parse_owner(s: &str) -> Result<(u32, u32)> {
    let (u, g) = s
        .split_once(':')
        .context("--owner wants UID:GID, e.g. 0:0")?;
    Ok((
        u.parse().context("--owner: UID is not a number")?,
        g.parse().context("--owner: GID is not a number")?,
    ))
}

impl ImageArgs {
    /// Whether the pack size was asked for (`--pack-size`, or `--archive`).
    pub fn pack_size_given(&self) -> bool {
        self.pack_size.is_some() || self.archive
    }

    /// The build options these flags ask for (and SOURCE_DATE_EPOCH): the
    /// library's defaults, or its archive preset, with the flags given.
    pub fn options(&self) -> Result<BuildOptions> {
        let preset = if self.archive {
            BuildOptions::archive()
        } else {
            BuildOptions::default()
        };
        let compression = match &self.compression {
            Some(c) => Compression::parse(c).map_err(anyhow::Error::msg)?,
            None => preset.compression,
        };
        let clamp =
            match std::env::var("SOURCE_DATE_EPOCH") {
                Ok(v) if !v.is_empty() => Some(v.trim().parse::<i64>().with_context(|| {
                    format!("SOURCE_DATE_EPOCH='{v}' is not a number of seconds")
                })?),
                _ => None,
            };
        let block_size = match &self.block_size {
            Some(b) => parse_size(b).map_err(|e| anyhow::anyhow!("--block-size: {e}"))?,
            None => preset.block_size,
        };
        Ok(BuildOptions {
            compression,
            block_size,
            pack_size: match &self.pack_size {
                Some(s) => parse_size(s).map_err(|e| anyhow::anyhow!("--pack-size: {e}"))?,
                None => preset.pack_size.min(block_size),
            },
            page_size: parse_size(&self.page_size)
                .map_err(|e| anyhow::anyhow!("--page-size: {e}"))?,
            threads: self.threads.unwrap_or(0),
            exclude: self.exclude.clone(),
            owner: self.owner.as_deref().map(parse_owner).transpose()?,
            mtime: self.mtime,
            clamp_mtime: clamp,
            skip_errors: false,
            force: self.force,
            prefetch: Vec::new(),
            pack_boundaries: Vec::new(),
            base: None,
            base_max_stale_pct: sheaf_build::options::DEFAULT_BASE_MAX_STALE_PCT,
            dictionary: !self.no_dict,
            labels: Default::default(),
            order: sheaf_build::order::PackOrder::parse(&self.order)
                .map_err(|e| anyhow::anyhow!("--order: {e}"))?,
            group_blocks: !self.no_group_blocks,
            ref_window: parse_size(&self.ref_window)
                .map(u64::from)
                .map_err(|e| anyhow::anyhow!("--ref-window: {e}"))?,
        })
    }
}

/// Run `sheaf build`.
pub fn run(a: BuildArgs, io: &mut crate::Io<'_>) -> Result<i32> {
    let output = match (&a.output, &a.stray) {
        (Some(o), None) => o.clone(),
        (_, stray) => {
            // mksquashfs's order, SOURCE OUT: a usage error, with the line meant.
            let out = stray
                .as_ref()
                .or(a.output.as_ref())
                .expect("clap requires one");
            let _ = writeln!(
                io.stderr,
                "sheaf: the output goes after -o: sheaf build {} -o {} (see 'sheaf build --help')",
                a.source.display(),
                out.display()
            );
            return Ok(2);
        }
    };
    let opts = BuildOptions {
        skip_errors: a.skip_errors,
        base: a.base.clone(),
        base_max_stale_pct: a
            .base_stale
            .unwrap_or(sheaf_build::options::DEFAULT_BASE_MAX_STALE_PCT),
        prefetch: match &a.prefetch {
            Some(f) => crate::util::read_path_list(f)?,
            None => Vec::new(),
        },
        ..a.image.options()?
    };
    let input = if a.source.as_os_str() == "-" {
        // SAFETY: isatty on a constant fd.
        if unsafe { libc::isatty(0) } == 1 {
            bail!("refusing to read a tar archive from a terminal (pipe one in: tar -cf - DIR | sheaf build - -o IMAGE)");
        }
        Input::TarStdin
    } else {
        match std::fs::metadata(&a.source) {
            Ok(m) if m.is_dir() => Input::Dir(a.source.clone()),
            Ok(_) if is_sheaf_image(&a.source) => bail!(
                "{}: is a sheaf image, not a directory or tar archive (to combine images: sheaf merge BASE,LAYER -o OUT; to pack a writable mount's changes: sheaf commit UPPER -o LAYER; to repack: sheaf extract IMAGE -C DIR, then sheaf build DIR)",
                a.source.display()
            ),
            Ok(_) => Input::TarFile(a.source.clone()),
            Err(e) => bail!("{}: {e}", a.source.display()),
        }
    };
    write_image(&input, &output, &opts, &a.image, serde_json::json!({}), io)
}

/// Whether `p` begins with a sheaf image's magic.
fn is_sheaf_image(p: &std::path::Path) -> bool {
    use std::io::Read;
    let mut head = [0u8; 8];
    std::fs::File::open(p)
        .and_then(|mut f| f.read_exact(&mut head))
        .is_ok_and(|()| head == sheaf_format::layout::HEADER_MAGIC)
}

/// Build `input` into `output` with a progress bar on a terminal, then the
/// summary line on stderr or (`--json`) the report on stdout, with the
/// fields of `extra` added to it.
pub fn write_image(
    input: &Input,
    output: &Path,
    opts: &BuildOptions,
    a: &ImageArgs,
    extra: serde_json::Value,
    io: &mut crate::Io<'_>,
) -> Result<i32> {
    if let Some(dir) = output.parent().filter(|d| !d.as_os_str().is_empty()) {
        if !dir.is_dir() {
            bail!(
                "{}: no such directory {} (create it first: mkdir -p {})",
                output.display(),
                dir.display(),
                dir.display()
            );
        }
    }
    let progress = Arc::new(Progress::default());
    let cancel = io.cancel_flag();
    let start = Instant::now();
    let show = !a.quiet && !a.json && io.stderr_is_tty();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let bar_thread = show.then(|| {
        let (p, done) = (progress.clone(), done.clone());
        std::thread::spawn(move || progress_bar(&p, &done))
    });
    let result = sheaf_build::build(input, output, opts, progress.clone(), cancel);
    done.store(true, Ordering::SeqCst);
    if let Some(t) = bar_thread {
        let _ = t.join();
    }
    let rep = result?;
    let secs = start.elapsed().as_secs_f64();
    if a.json {
        let v = crate::util::timed_json(&rep, secs, extra)?;
        writeln!(io.stdout, "{}", serde_json::to_string_pretty(&v)?)?;
    } else if !a.quiet {
        let _ = writeln!(
            io.stderr,
            "{}: {} entries, {} of data -> {} image (ratio {}) in {:.1} s; root {}",
            rep.image.display(),
            rep.inodes,
            human(rep.logical_bytes),
            human(rep.image_bytes),
            crate::util::ratio(rep.logical_bytes, rep.image_bytes),
            secs,
            &rep.root_digest[..16]
        );
        if let Some(b) = &rep.base {
            let _ = writeln!(io.stderr,
                "  from {}: {} unchanged files ({}) reused in {} copied blocks, {} files ({}) packed anew",
                b.image.display(),
                b.reused_files,
                human(b.reused_bytes),
                b.copied_blocks,
                b.packed_files,
                human(b.packed_bytes)
            );
        }
    }
    if !rep.skipped.is_empty() {
        let _ = writeln!(
            io.stderr,
            "sheaf: skipped {} unreadable entries:",
            rep.skipped.len()
        );
        for s in &rep.skipped {
            let _ = writeln!(io.stderr, "  {s}");
        }
    }
    Ok(0)
}

fn progress_bar(p: &Progress, done: &std::sync::atomic::AtomicBool) {
    let bar = indicatif::ProgressBar::new(0);
    // With a known total (directory input): a bar and an ETA. A tar stream's
    // size is unknown until its end: counters and rate only.
    let known = indicatif::ProgressStyle::with_template(
        "{spinner} [{elapsed_precise}] {bar:30} {bytes}/{total_bytes} in, {msg} ({binary_bytes_per_sec}, ETA {eta})",
    )
    .expect("valid template");
    let unknown = indicatif::ProgressStyle::with_template(
        "{spinner} [{elapsed_precise}] {bytes} in, {msg} ({binary_bytes_per_sec})",
    )
    .expect("valid template");
    let mut styled = None;
    while !done.load(Ordering::SeqCst) {
        let total = p.total_bytes.load(Ordering::Relaxed);
        if styled != Some(total > 0) {
            bar.set_style(if total > 0 {
                known.clone()
            } else {
                unknown.clone()
            });
            styled = Some(total > 0);
        }
        bar.set_length(total);
        bar.set_position(p.bytes_in.load(Ordering::Relaxed));
        bar.set_message(format!(
            "{} files, {} out",
            p.files.load(Ordering::Relaxed),
            human(p.bytes_out.load(Ordering::Relaxed))
        ));
        std::thread::sleep(Duration::from_millis(100));
    }
    bar.finish_and_clear();
}
