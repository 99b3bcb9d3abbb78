//! Read-only commands: `info`, `ls`, `cat`, `check`.

use crate::util::human;
use crate::util::open_image as open_path;
use anyhow::{bail, Result};
use sheaf_format::{hex, FileType, StreamId};
use sheaf_read::{Image, Inode};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Paths hidden by whiteouts in `img`, and its opaque directories.
fn whiteouts(img: &Image) -> Result<(Vec<String>, Vec<String>)> {
    use sheaf_format::layers::{parse, Name};
    let (mut wh, mut opaque) = (Vec::new(), Vec::new());
    let mut todo = vec![(img.root()?, Vec::<u8>::new())];
    let mut seen = sheaf_read::Seen::new(img);
    while let Some((dir, prefix)) = todo.pop() {
        seen.enter(img, &dir)?;
        let n = img.dir_len(&dir)?;
        for e in img.read_dir(&dir, 0, n as usize)? {
            let full = join_name(&prefix, &e.name);
            match parse(&e.name) {
                Name::Opaque => opaque.push(
                    String::from_utf8_lossy(if prefix.is_empty() { b"/" } else { &prefix })
                        .into_owned(),
                ),
                Name::Whiteout(t) => {
                    wh.push(String::from_utf8_lossy(&join_name(&prefix, t)).into_owned())
                }
                Name::Plain(_) if e.file_type == FileType::Directory => {
                    todo.push((img.child(&dir, e.ino, e.file_type)?, full));
                }
                Name::Plain(_) => {}
            }
        }
    }
    wh.sort();
    opaque.sort();
    Ok((wh, opaque))
}

/// `sheaf info`.
pub fn info(
    path: &Path,
    json: bool,
    list_whiteouts: bool,
    remote: &crate::util::RemoteArgs,
) -> Result<i32> {
    let img = open_path(path, remote)?;
    let (wh, opaque) = if list_whiteouts {
        whiteouts(&img)?
    } else {
        Default::default()
    };
    let sb = img.superblock();
    let build: serde_json::Value = img
        .build_info()?
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or_default();
    let stats = &build["stats"];
    let meta_bytes: u64 = StreamId::ALL.iter().map(|&id| sb.stream(id).len).sum();
    let v = serde_json::json!({
        "image": path.display().to_string(),
        "image_bytes": img.len(),
        "root_digest": hex(&img.root_digest()),
        "inodes": sb.inode_count,
        "entries_by_type": stats["entries_by_type"],
        "hardlinked_inodes": stats["hardlinked_inodes"],
        "logical_bytes": sb.logical_bytes,
        "stored_data_bytes": sb.stored_data_bytes,
        "compression_ratio": sb.logical_bytes as f64 / img.len().max(1) as f64,
        "dedup_bytes": stats["dedup_bytes"],
        "hole_bytes": stats["hole_bytes"],
        "blocks": sb.block_count,
        "blocks_by_codec": stats["blocks_by_codec"],
        "block_size": sb.block_size,
        "page_size": sb.page_size,
        "metadata_bytes_uncompressed": meta_bytes,
        "build": {
            "builder": build["builder"],
            "compression": build["compression"],
            "owner": build["owner"],
            "mtime": build["mtime"],
            "clamp_mtime": build["clamp_mtime"],
            "exclude": build["exclude"],
        },
        "signatures": img.signatures().iter().map(|s| match sheaf_trust::describe(s) {
            Ok((alg, fp, ns)) => serde_json::json!({"algorithm": alg, "key": fp, "namespace": ns}),
            Err(e) => serde_json::json!({"error": e.to_string()}),
        }).collect::<Vec<_>>(),
        "prefetch_blocks": img.prefetch_list()?.len(),
        "whiteouts": list_whiteouts.then_some(&wh),
        "opaque_dirs": list_whiteouts.then_some(&opaque),
        "sections": img.sections().iter().map(|s| serde_json::json!({
            "kind": s.kind.id(), "required": s.required(), "offset": s.offset, "length": s.length,
        })).collect::<Vec<_>>(),
    });
    if json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(0);
    }
    let mut o = std::io::stdout().lock();
    writeln!(o, "image:        {} ({})", path.display(), human(img.len()))?;
    writeln!(o, "root digest:  {}", hex(&img.root_digest()))?;
    if img.signatures().is_empty() {
        writeln!(o, "signatures:   none")?;
    }
    for (i, s) in img.signatures().iter().enumerate() {
        let d = match sheaf_trust::describe(s) {
            Ok((alg, fp, ns)) => {
                format!("{alg} {fp} (namespace {ns}; not verified: use sheaf verify)")
            }
            Err(e) => e.to_string(),
        };
        writeln!(
            o,
            "{}{d}",
            if i == 0 {
                "signatures:   "
            } else {
                "              "
            }
        )?;
    }
    let types = v["entries_by_type"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, n)| format!("{n} {k}"))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default();
    writeln!(o, "entries:      {} inodes ({types})", sb.inode_count)?;
    writeln!(
        o,
        "data:         {} logical, {} stored in {} blocks of {}",
        human(sb.logical_bytes),
        human(sb.stored_data_bytes),
        sb.block_count,
        human(sb.block_size as u64)
    )?;
    let pf = v["prefetch_blocks"].as_u64().unwrap_or(0);
    if pf > 0 {
        writeln!(
            o,
            "prefetch:     {pf} blocks listed for mounts to fetch ahead"
        )?;
    }
    writeln!(
        o,
        "ratio:        {:.2}x (logical / image size)",
        v["compression_ratio"].as_f64().unwrap_or(0.0)
    )?;
    if let Some(d) = v["dedup_bytes"].as_u64() {
        writeln!(
            o,
            "dedup saved:  {}; holes: {}",
            human(d),
            human(v["hole_bytes"].as_u64().unwrap_or(0))
        )?;
    }
    writeln!(
        o,
        "codecs:       {} (blocks: {})",
        build["compression"].as_str().unwrap_or("?"),
        v["blocks_by_codec"]
    )?;
    writeln!(
        o,
        "metadata:     {} uncompressed, pages of {}",
        human(meta_bytes),
        human(sb.page_size as u64)
    )?;
    writeln!(
        o,
        "built by:     {}",
        build["builder"].as_str().unwrap_or("?")
    )?;
    if list_whiteouts {
        writeln!(o, "whiteouts:    {} (hidden in the layers below)", wh.len())?;
        for p in &wh {
            writeln!(o, "  {p}")?;
        }
        writeln!(o, "opaque dirs:  {}", opaque.len())?;
        for p in &opaque {
            writeln!(o, "  {p}/")?;
        }
    }
    Ok(0)
}

/// Arguments of `sheaf ls`.
#[derive(clap::Args, Debug)]
pub struct LsArgs {
    /// The image, or a stack of layers BASE,LAYER,... (later layers win;
    /// OCI whiteouts applied and not shown).
    image: PathBuf,
    /// Directory or file inside the image (default: the root).
    #[arg(default_value = "/")]
    path: std::ffi::OsString,
    /// Long listing: mode, links, owner, size, mtime, name -> target.
    #[arg(short, long)]
    long: bool,
    /// Recurse into subdirectories (paths printed relative to PATH).
    #[arg(short = 'R', long)]
    recursive: bool,
}

pub(crate) fn mode_string(mode: u32) -> String {
    let t = match FileType::from_mode(mode) {
        Some(FileType::Directory) => 'd',
        Some(FileType::Symlink) => 'l',
        Some(FileType::CharDevice) => 'c',
        Some(FileType::BlockDevice) => 'b',
        Some(FileType::Fifo) => 'p',
        Some(FileType::Socket) => 's',
        _ => '-',
    };
    let mut s = String::from(t);
    for (i, c) in "rwxrwxrwx".chars().enumerate() {
        let bit = 1 << (8 - i);
        let on = mode & bit != 0;
        let special = match i {
            2 => mode & 0o4000 != 0,
            5 => mode & 0o2000 != 0,
            8 => mode & 0o1000 != 0,
            _ => false,
        };
        s.push(match (on, special) {
            (true, false) => c,
            (false, false) => '-',
            (true, true) => {
                if i == 8 {
                    't'
                } else {
                    's'
                }
            }
            (false, true) => {
                if i == 8 {
                    'T'
                } else {
                    'S'
                }
            }
        });
    }
    s
}

fn print_entry(
    o: &mut impl Write,
    img: &Image,
    ino: &Inode,
    name: &[u8],
    long: bool,
) -> Result<()> {
    // On a terminal, quoted as ls quotes (an image's names may hold
    // escape sequences); to a pipe, as they are.
    let tty = crate::util::stdout_is_tty();
    let shown = |b: &[u8]| {
        if tty {
            crate::util::terminal_name(b)
        } else {
            String::from_utf8_lossy(b).into_owned()
        }
    };
    let name = shown(name);
    if !long {
        writeln!(o, "{name}")?;
        return Ok(());
    }
    let r = &ino.rec;
    let size = match ino.file_type() {
        FileType::CharDevice | FileType::BlockDevice => {
            format!("{},{}", libc::major(r.data), libc::minor(r.data))
        }
        _ => ino.stat_size().to_string(),
    };
    let target = if ino.file_type() == FileType::Symlink {
        format!(" -> {}", shown(&img.read_link(ino)?))
    } else {
        String::new()
    };
    writeln!(
        o,
        "{} {:>3} {:>5} {:>5} {:>12} {}.{:09} {name}{target}",
        mode_string(r.mode),
        r.nlink,
        r.uid,
        r.gid,
        size,
        r.mtime_sec,
        r.mtime_nsec
    )?;
    Ok(())
}

/// `sheaf ls`.
pub fn ls(a: LsArgs, remote: &crate::util::RemoteArgs) -> Result<i32> {
    let arg = a.image.to_string_lossy();
    if arg.contains(',') && !a.image.exists() {
        return ls_stack(&a, remote);
    }
    let img = open_path(&a.image, remote)?;
    let path = a.path.as_bytes();
    let start = img.resolve(path)?;
    let mut o = std::io::BufWriter::new(std::io::stdout().lock());
    if start.file_type() != FileType::Directory {
        let name = path.rsplit(|&b| b == b'/').next().unwrap_or(path);
        print_entry(&mut o, &img, &start, name, a.long)?;
        return Ok(0);
    }
    let mut stack = vec![(start, Vec::<u8>::new())];
    let mut seen = sheaf_read::Seen::new(&img);
    while let Some((dir, prefix)) = stack.pop() {
        seen.enter(&img, &dir)?;
        let n = img.dir_len(&dir)?;
        let mut subdirs = Vec::new();
        for e in img.read_dir(&dir, 0, n as usize)? {
            let ino = img.child(&dir, e.ino, e.file_type)?;
            let full = join_name(&prefix, &e.name);
            print_entry(&mut o, &img, &ino, &full, a.long)?;
            if a.recursive && e.file_type == FileType::Directory {
                subdirs.push((ino, full));
            }
        }
        stack.extend(subdirs.into_iter().rev());
    }
    Ok(0)
}

fn join_name(prefix: &[u8], name: &[u8]) -> Vec<u8> {
    let mut full = prefix.to_vec();
    if !full.is_empty() {
        full.push(b'/');
    }
    full.extend_from_slice(name);
    full
}

/// `sheaf ls BASE,LAYER,...`: the merged view of a stack.
fn ls_stack(a: &LsArgs, remote: &crate::util::RemoteArgs) -> Result<i32> {
    use sheaf_read::{Found, Stack};
    let arg = a.image.to_string_lossy();
    let layers = arg
        .split(',')
        .map(|p| open_path(Path::new(p), remote).map(std::sync::Arc::new))
        .collect::<Result<Vec<_>>>()?;
    let stack = Stack::new(layers);
    let path = a.path.as_bytes();
    let mut o = std::io::BufWriter::new(std::io::stdout().lock());
    let start = stack.resolve(path)?;
    let dir = match start {
        Found::Dir(d) => d,
        Found::Node(l, ino) => {
            let name = path.rsplit(|&b| b == b'/').next().unwrap_or(path);
            print_entry(&mut o, &stack.layers()[l], &ino, name, a.long)?;
            return Ok(0);
        }
    };
    let mut todo = vec![(dir, Vec::<u8>::new())];
    let mut seen = sheaf_read::SeenMerged::new(&stack);
    while let Some((dir, prefix)) = todo.pop() {
        seen.enter(&stack, &dir)?;
        let mut subdirs = Vec::new();
        for e in stack.read_dir(&dir)? {
            let img = &stack.layers()[e.layer];
            let ino = stack.entry_inode(&dir, &e)?;
            let full = join_name(&prefix, &e.name);
            print_entry(&mut o, img, &ino, &full, a.long)?;
            if a.recursive && e.file_type == FileType::Directory {
                if let Some(Found::Dir(d)) = stack.lookup(&dir, &e.name)? {
                    subdirs.push((d, full));
                }
            }
        }
        todo.extend(subdirs.into_iter().rev());
    }
    Ok(0)
}

/// `sheaf cat`.
pub fn cat(image: &Path, path: &std::ffi::OsStr, remote: &crate::util::RemoteArgs) -> Result<i32> {
    let img = open_path(image, remote)?;
    let ino = img.resolve(path.as_bytes())?;
    if ino.file_type() != FileType::Regular {
        bail!(
            "{}: not a regular file (a {})",
            path.to_string_lossy(),
            ino.file_type().name()
        );
    }
    let mut out = std::io::stdout().lock();
    let mut buf = vec![0u8; img.superblock().block_size as usize];
    let mut off = 0u64;
    loop {
        let n = img.read(&ino, off, &mut buf)?;
        if n == 0 {
            break;
        }
        out.write_all(&buf[..n])?;
        off += n as u64;
    }
    out.flush()?;
    Ok(0)
}

/// `sheaf check`.
pub fn check(
    image: &Path,
    threads: Option<usize>,
    json: bool,
    remote: &crate::util::RemoteArgs,
) -> Result<i32> {
    let start = Instant::now();
    let img = open_path(image, remote)?;
    let pool = rayon_pool(threads)?;
    let progress = std::sync::atomic::AtomicU64::new(0);
    let rep = pool.install(|| sheaf_read::verify::verify(&img, &progress));
    let secs = start.elapsed().as_secs_f64();
    // Throughput counts file data, not holes (which cost nothing to check).
    let holes = img
        .build_info()
        .ok()
        .flatten()
        .and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok())
        .and_then(|v| v["stats"]["hole_bytes"].as_u64())
        .unwrap_or(0);
    let logical = img.superblock().logical_bytes.saturating_sub(holes);
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "image": image.display().to_string(),
                "ok": rep.errors.is_empty(),
                "pages": rep.pages, "blocks": rep.blocks, "inodes": rep.inodes, "entries": rep.entries,
                "block_bytes": rep.block_bytes, "logical_bytes": img.superblock().logical_bytes,
                "data_bytes": logical, "mb_per_s": logical as f64 / secs / 1e6,
                "seconds": secs, "errors": rep.errors,
                "root_digest": hex(&img.root_digest()),
            }))?
        );
    } else if rep.errors.is_empty() {
        println!(
            "{}: OK: {} pages, {} blocks ({}), {} inodes, a tree of {} entries verified in {:.2} s ({:.0} MB/s of file data)",
            image.display(),
            rep.pages,
            rep.blocks,
            human(rep.block_bytes),
            rep.inodes,
            rep.entries,
            secs,
            logical as f64 / secs / 1e6
        );
    } else {
        for e in &rep.errors {
            eprintln!("sheaf: {e}");
        }
        eprintln!(
            "sheaf: error: {}: {} problem{} found",
            image.display(),
            rep.errors.len(),
            if rep.errors.len() == 1 { "" } else { "s" }
        );
    }
    Ok(if rep.errors.is_empty() { 0 } else { 1 })
}

/// A rayon pool of `threads` (default: all cores).
pub fn rayon_pool(threads: Option<usize>) -> Result<rayon::ThreadPool> {
    Ok(rayon::ThreadPoolBuilder::new()
        .num_threads(threads.unwrap_or(0))
        .build()?)
}
