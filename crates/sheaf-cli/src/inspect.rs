//! Read-only commands: `info`, `ls`, `cat`, `check`.

use crate::util::human;
use crate::util::open_image as open_path;
use anyhow::{bail, Result};
use sheaf_format::{hex, FileType};
use sheaf_read::{Image, Inode};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// `sheaf info`.
pub fn info(
    path: &Path,
    json: bool,
    list_whiteouts: bool,
    remote: &crate::util::RemoteArgs,
    io: &mut crate::Io<'_>,
) -> Result<i32> {
    if let Some(layers) = crate::util::stack_layers(path) {
        return info_stack(path, &layers, json, list_whiteouts, remote, io);
    }
    let img = open_path(path, remote)?;
    let shown = crate::util::shown(path);
    let v = image_info(&img, &shown, list_whiteouts)?;
    if json {
        writeln!(io.stdout, "{}", serde_json::to_string_pretty(&v)?)?;
        return Ok(0);
    }
    let tty = io.stdout_is_tty();
    print_info(&mut *io.stdout, tty, &img, &v)?;
    Ok(0)
}

/// What `sheaf info --json` says about one image.
fn image_info(
    img: &Image,
    shown: &str,
    list_whiteouts: bool,
) -> Result<sheaf_read::info::ImageInfo> {
    let wo = if list_whiteouts {
        Some(sheaf_read::info::whiteouts(img)?)
    } else {
        None
    };
    Ok(sheaf_read::info::info(img, shown, wo.as_ref(), &|s| {
        sheaf_read::info::SignatureInfo::of(sheaf_trust::describe(s))
    })?)
}

/// `sheaf info BASE,LAYER,...`: the merged tree's figures, then each
/// layer's, bottom first.
fn info_stack(
    path: &Path,
    layers: &[PathBuf],
    json: bool,
    list_whiteouts: bool,
    remote: &crate::util::RemoteArgs,
    io: &mut crate::Io<'_>,
) -> Result<i32> {
    let stack = crate::util::open_stack(layers, remote)?;
    let infos = stack
        .layers()
        .iter()
        .zip(layers)
        .map(|(img, p)| image_info(img, &crate::util::shown(p), list_whiteouts))
        .collect::<Result<Vec<_>>>()?;
    let shown = crate::util::shown(path);
    let v = sheaf_read::info::stack_info(&stack, &shown, infos)
        .map_err(|e| anyhow::Error::new(e).context(shown.clone()))?;
    if json {
        writeln!(io.stdout, "{}", serde_json::to_string_pretty(&v)?)?;
        return Ok(0);
    }
    let tty = io.stdout_is_tty();
    let o = &mut *io.stdout;
    let m = &v.merged;
    writeln!(
        o,
        "stack:        {shown} ({} layers, bottom first; {})",
        v.layers.len(),
        human(m.image_bytes)
    )?;
    let types = m
        .entries_by_type
        .iter()
        .map(|(k, n)| format!("{n} {k}"))
        .collect::<Vec<_>>()
        .join(", ");
    writeln!(o, "merged:       {} inodes ({types})", m.inodes)?;
    writeln!(
        o,
        "              {} logical; {} of the layers' inodes not shown (hidden, replaced, merged)",
        human(m.logical_bytes),
        m.hidden_inodes
    )?;
    let n = v.layers.len();
    for (k, (img, info)) in stack.layers().iter().zip(&v.layers).enumerate() {
        let which = match k {
            0 => " (bottom)",
            _ if k + 1 == n => " (top)",
            _ => "",
        };
        writeln!(o, "\nlayer {} of {n}{which}:", k + 1)?;
        print_info(o, tty, img, info)?;
    }
    Ok(0)
}

/// `sheaf info`'s text for one image.
fn print_info(
    o: &mut dyn Write,
    tty: bool,
    img: &Image,
    v: &sheaf_read::info::ImageInfo,
) -> Result<()> {
    let sb = img.superblock();
    let build = &v.build;
    let meta_bytes = v.metadata_bytes_uncompressed;
    let shown = &v.image;
    writeln!(o, "image:        {shown} ({})", human(img.len()))?;
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
    let types = v
        .entries_by_type
        .as_ref()
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
    let pf = v.prefetch_blocks;
    if pf > 0 {
        writeln!(
            o,
            "prefetch:     {pf} blocks listed for mounts to fetch ahead"
        )?;
    }
    writeln!(
        o,
        "ratio:        {} (logical / image size)",
        crate::util::ratio(sb.logical_bytes, img.len())
    )?;
    if let Some(d) = v.dedup_bytes {
        writeln!(
            o,
            "dedup saved:  {}; holes: {}",
            human(d),
            human(v.hole_bytes.unwrap_or(0))
        )?;
    }
    // "zstd:12 (1 block stored raw, 1 zstd)": blocks that did not shrink
    // are stored raw ("none").
    let by_codec = v
        .blocks_by_codec
        .as_ref()
        .map(|m| {
            m.iter()
                .map(|(k, n)| {
                    // With the bytes they take, where the image recorded it.
                    let bytes = v
                        .stored_by_codec
                        .as_ref()
                        .and_then(|b| b.get(k))
                        .map(|b| format!(" ({})", human(*b)))
                        .unwrap_or_default();
                    match k.as_str() {
                        "none" => format!("{n} stored raw{bytes}"),
                        _ => format!("{n} {k}{bytes}"),
                    }
                })
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default();
    writeln!(
        o,
        "codecs:       {} (blocks: {by_codec})",
        build.compression.as_deref().unwrap_or("?"),
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
        build.builder.as_deref().unwrap_or("?")
    )?;
    if let (Some(wh), Some(opaque)) = (&v.whiteouts, &v.opaque_dirs) {
        writeln!(o, "whiteouts:    {} (hidden in the layers below)", wh.len())?;
        // On a terminal quoted as ls does (an image's names may hold
        // escape sequences).
        let q = |p: &str| match tty {
            true => crate::util::terminal_name(p.as_bytes()),
            false => p.to_string(),
        };
        for p in wh {
            writeln!(o, "  {}", q(p))?;
        }
        writeln!(o, "opaque dirs:  {}", opaque.len())?;
        for p in opaque {
            writeln!(o, "  {}/", q(p))?;
        }
    }
    Ok(())
}

/// Arguments of `sheaf ls`.
#[derive(clap::Args, Debug)]
#[command(
    disable_help_flag = true,
    after_long_help = "As ls(1): names starting with '.' are left out unless -a or -A; -l prints\n\
mode, links, owner, group, size, modification time and name, aligned, after a\n\
'total' line of 1 KiB blocks, with times as GNU ls shows them (--time-style\n\
full-iso, long-iso, iso or +FORMAT for others); on a terminal, names are quoted\n\
as GNU ls quotes them. -R lists PATH and every directory below it as GNU ls -R\n\
does: a 'DIR:' line before each, a blank line between them (PATH as given, '.'\n\
when none is). --json prints one array of entries, paths relative to PATH.\n\
\n\
Examples:\n  sheaf ls -lh data.sheaf some/dir\n  sheaf ls -R base.sheaf,layer.sheaf"
)]
pub struct LsArgs {
    /// The image, or a stack of layers BASE,LAYER,... (later layers win;
    /// OCI whiteouts applied and not shown).
    image: PathBuf,
    /// Directory or file inside the image (default: the root).
    path: Option<std::ffi::OsString>,
    /// Long listing: mode, links, owner, group, size, mtime, name -> target.
    #[arg(short, long)]
    long: bool,
    /// With -l: sizes as 1.5K, 23M, 4.0G (powers of 1024, rounded up).
    #[arg(short = 'h', long)]
    human_readable: bool,
    /// Show entries whose names start with '.', and . and .. too.
    #[arg(short = 'a', long)]
    all: bool,
    /// Show entries whose names start with '.', but not . and ...
    #[arg(short = 'A', long)]
    almost_all: bool,
    /// List a directory itself, not its contents.
    #[arg(short = 'd', long)]
    directory: bool,
    /// With -l: numeric user and group ids.
    #[arg(short = 'n', long)]
    numeric_uid_gid: bool,
    /// With -l: how times are shown: locale (default), full-iso,
    /// long-iso, iso, or +FORMAT (strftime).
    #[arg(long, value_name = "STYLE", default_value = "locale")]
    time_style: String,
    /// List subdirectories too, each under a 'DIR:' line, as GNU ls -R.
    #[arg(short = 'R', long)]
    recursive: bool,
    /// Print a JSON array of entries (path, type, mode, size, links, uid,
    /// gid, user, group, mtime, mtime_nsec, target).
    #[arg(long)]
    json: bool,
    /// Print help.
    #[arg(long, action = clap::ArgAction::Help)]
    help: Option<bool>,
}

impl LsArgs {
    /// The path inside the image named on the command line.
    fn path(&self) -> &[u8] {
        self.path.as_deref().map_or(b"/", |p| p.as_bytes())
    }
}

pub(crate) use sheaf_read::find::mode_string;

/// One entry to list: its image (a layer, for stacks), inode and name.
type Entry<'a> = (&'a Image, Inode, Vec<u8>);

/// How `sheaf ls` prints: the options, the name cache, and what --json
/// collects.
struct Lister<'a> {
    a: &'a LsArgs,
    tty: bool,
    now: i64,
    names: crate::ident::Names,
    json: Vec<serde_json::Value>,
    /// With -R, whether a directory's section was printed yet.
    sections: bool,
}

impl Lister<'_> {
    fn new(a: &LsArgs, tty: bool) -> Result<Lister<'_>> {
        let style = a.time_style.as_str();
        if !matches!(style, "locale" | "full-iso" | "long-iso" | "iso") && !style.starts_with('+') {
            bail!("--time-style {style}: use locale, full-iso, long-iso, iso or +FORMAT");
        }
        Ok(Lister {
            a,
            tty,
            now: crate::find::now().0,
            names: crate::ident::Names::default(),
            json: Vec::new(),
            sections: false,
        })
    }

    /// With -R, the line before a directory's entries, as GNU ls -R prints
    /// it: `DIR:`, DIR the operand (`.` when none was given) joined with
    /// the directory's path below it, after a blank line but the first.
    fn section(&mut self, o: &mut impl Write, rel: &[u8]) -> Result<()> {
        if !self.a.recursive || self.a.json {
            return Ok(());
        }
        let mut dir = self
            .a
            .path
            .as_deref()
            .map_or(b".".to_vec(), |p| p.as_bytes().to_vec());
        if !rel.is_empty() {
            if !dir.ends_with(b"/") {
                dir.push(b'/');
            }
            dir.extend_from_slice(rel);
        }
        if std::mem::replace(&mut self.sections, true) {
            writeln!(o)?;
        }
        writeln!(o, "{}:", self.name(&dir))?;
        Ok(())
    }

    /// How an entry of the directory at `prefix` is named: by its path
    /// below PATH in JSON, by its name in text (as ls, under -R's lines).
    fn entry_name(&self, prefix: &[u8], name: &[u8]) -> Vec<u8> {
        match self.a.json {
            true => join_name(prefix, name),
            false => name.to_vec(),
        }
    }

    /// Whether `name` (its last component) is shown.
    fn shown(&self, name: &[u8]) -> bool {
        self.a.all || self.a.almost_all || !name.starts_with(b".")
    }

    fn name(&self, b: &[u8]) -> String {
        if self.tty {
            crate::util::terminal_name(b)
        } else {
            String::from_utf8_lossy(b).into_owned()
        }
    }

    fn when(&self, sec: i64, nsec: u32) -> String {
        let half_year = 31_556_952 / 2;
        let recent = (self.now - half_year..=self.now).contains(&sec);
        match self.a.time_style.as_str() {
            "full-iso" => {
                let t = crate::find::local_time(sec, "%Y-%m-%d %H:%M:%S");
                let z = crate::find::local_time(sec, "%z");
                format!("{t}.{nsec:09} {z}")
            }
            "long-iso" => crate::find::local_time(sec, "%Y-%m-%d %H:%M"),
            "iso" if recent => crate::find::local_time(sec, "%m-%d %H:%M"),
            "iso" => crate::find::local_time(sec, "%Y-%m-%d "),
            // %N, nanoseconds, as GNU ls's own strftime has it.
            f if f.starts_with('+') => {
                crate::find::local_time(sec, &f[1..].replace("%N", &format!("{nsec:09}")))
            }
            _ if recent => crate::find::local_time(sec, "%b %e %H:%M"),
            _ => crate::find::local_time(sec, "%b %e  %Y"),
        }
    }

    /// Print one batch (a directory's entries, or the operands): with -l,
    /// columns aligned as ls aligns them, after `total` when `total`.
    fn batch(&mut self, o: &mut impl Write, entries: &[Entry<'_>], total: bool) -> Result<()> {
        if self.a.json {
            for (img, ino, name) in entries {
                let v = self.json_entry(img, ino, name)?;
                self.json.push(v);
            }
            return Ok(());
        }
        if !self.a.long {
            for (_, _, name) in entries {
                writeln!(o, "{}", self.name(name))?;
            }
            return Ok(());
        }
        let mut rows = Vec::with_capacity(entries.len());
        let mut blocks = 0u64;
        for (img, ino, name) in entries {
            let r = &ino.rec;
            // 512-byte blocks, summed first (as ls sums st_blocks).
            blocks += ino.stat_blocks();
            let (user, group) = if self.a.numeric_uid_gid {
                (r.uid.to_string(), r.gid.to_string())
            } else {
                (
                    crate::find::name_or_id(self.names.user(r.uid), r.uid),
                    crate::find::name_or_id(self.names.group(r.gid), r.gid),
                )
            };
            let size = match ino.file_type() {
                FileType::CharDevice | FileType::BlockDevice => {
                    format!("{}, {}", libc::major(r.data), libc::minor(r.data))
                }
                _ if self.a.human_readable => crate::util::human_size(ino.stat_size()),
                _ => ino.stat_size().to_string(),
            };
            let target = match ino.file_type() {
                FileType::Symlink => format!(" -> {}", self.name(&img.read_link(ino)?)),
                _ => String::new(),
            };
            rows.push([
                mode_string(r.mode),
                r.nlink.to_string(),
                user,
                group,
                size,
                self.when(r.mtime_sec, r.mtime_nsec),
                format!("{}{target}", self.name(name)),
            ]);
        }
        if total {
            let t = if self.a.human_readable {
                crate::util::human_size(blocks * 512)
            } else {
                blocks.div_ceil(2).to_string()
            };
            writeln!(o, "total {t}")?;
        }
        let w = |i: usize| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0);
        let (w1, w2, w3, w4) = (w(1), w(2), w(3), w(4));
        for r in &rows {
            // Numeric ids are right-aligned, names left-aligned (as ls).
            let (u, g) = if self.a.numeric_uid_gid {
                (format!("{:>w2$}", r[2]), format!("{:>w3$}", r[3]))
            } else {
                (format!("{:<w2$}", r[2]), format!("{:<w3$}", r[3]))
            };
            writeln!(
                o,
                "{} {:>w1$} {u} {g} {:>w4$} {} {}",
                r[0], r[1], r[4], r[5], r[6]
            )?;
        }
        Ok(())
    }

    fn json_entry(&mut self, img: &Image, ino: &Inode, name: &[u8]) -> Result<serde_json::Value> {
        let r = &ino.rec;
        let target = match ino.file_type() {
            FileType::Symlink => Some(String::from_utf8_lossy(&img.read_link(ino)?).into_owned()),
            _ => None,
        };
        Ok(serde_json::json!({
            "path": String::from_utf8_lossy(name),
            "type": ino.file_type().name(),
            "mode": format!("{:04o}", r.mode & 0o7777),
            "size": ino.stat_size(),
            "links": r.nlink,
            "uid": r.uid,
            "gid": r.gid,
            "user": self.names.user(r.uid),
            "group": self.names.group(r.gid),
            "mtime": r.mtime_sec,
            "mtime_nsec": r.mtime_nsec,
            "target": target,
        }))
    }

    fn finish(self, o: &mut impl Write) -> Result<()> {
        if self.a.json {
            writeln!(o, "{}", serde_json::Value::Array(self.json))?;
        }
        Ok(())
    }
}

/// `sheaf ls`.
pub fn ls(a: LsArgs, remote: &crate::util::RemoteArgs, io: &mut crate::Io<'_>) -> Result<i32> {
    if crate::util::stack_layers(&a.image).is_some() {
        return ls_stack(&a, remote, io);
    }
    let img = open_path(&a.image, remote)?;
    let mut l = Lister::new(&a, io.stdout_is_tty())?;
    let path = a.path();
    let start = img.resolve(path)?;
    let mut o = std::io::BufWriter::new(&mut *io.stdout);
    if start.file_type() != FileType::Directory || a.directory {
        let name = if a.directory {
            path
        } else {
            path.rsplit(|&b| b == b'/').next().unwrap_or(path)
        };
        l.batch(&mut o, &[(&img, start, name.to_vec())], false)?;
        return l.finish(&mut o).map(|()| 0);
    }
    let mut stack = vec![(start, Vec::<u8>::new())];
    let mut seen = sheaf_read::Seen::new(&img);
    while let Some((dir, prefix)) = stack.pop() {
        seen.enter(&img, &dir)?;
        l.section(&mut o, &prefix)?;
        let n = img.dir_len(&dir)?;
        let mut subdirs = Vec::new();
        let mut entries: Vec<Entry<'_>> = Vec::new();
        // . and .. in every directory listed, as ls -a (in JSON, at the
        // top only).
        if a.all && !(a.recursive && a.json) {
            entries.push((&img, dir, b".".to_vec()));
            entries.push((&img, img.inode(dir.rec.parent)?, b"..".to_vec()));
        }
        for e in img.read_dir(&dir, 0, n as usize)? {
            if !l.shown(&e.name) {
                continue;
            }
            let ino = img.child(&dir, e.ino, e.file_type)?;
            if a.recursive && e.file_type == FileType::Directory {
                subdirs.push((ino, join_name(&prefix, &e.name)));
            }
            entries.push((&img, ino, l.entry_name(&prefix, &e.name)));
        }
        l.batch(&mut o, &entries, true)?;
        stack.extend(subdirs.into_iter().rev());
    }
    l.finish(&mut o).map(|()| 0)
}

use sheaf_read::info::join_name;

/// `sheaf ls BASE,LAYER,...`: the merged view of a stack.
fn ls_stack(a: &LsArgs, remote: &crate::util::RemoteArgs, io: &mut crate::Io<'_>) -> Result<i32> {
    use sheaf_read::Found;
    let layers = crate::util::stack_layers(&a.image).expect("ls_stack is given a stack");
    let stack = crate::util::open_stack(&layers, remote)?;
    let mut l = Lister::new(a, io.stdout_is_tty())?;
    let path = a.path();
    let mut o = std::io::BufWriter::new(&mut *io.stdout);
    let start = stack.resolve(path)?;
    let dir = match start {
        Found::Dir(d) if !a.directory => d,
        Found::Dir(d) => {
            // The top layer's directory stands for the merged one.
            let (layer, ino) = d.parts[0];
            l.batch(
                &mut o,
                &[(&stack.layers()[layer], ino, path.to_vec())],
                false,
            )?;
            return l.finish(&mut o).map(|()| 0);
        }
        Found::Node(layer, ino) => {
            let name = path.rsplit(|&b| b == b'/').next().unwrap_or(path);
            l.batch(
                &mut o,
                &[(&stack.layers()[layer], ino, name.to_vec())],
                false,
            )?;
            return l.finish(&mut o).map(|()| 0);
        }
    };
    let mut todo = vec![(dir, Vec::<u8>::new())];
    let mut seen = sheaf_read::SeenMerged::new(&stack);
    while let Some((dir, prefix)) = todo.pop() {
        seen.enter(&stack, &dir)?;
        l.section(&mut o, &prefix)?;
        let mut subdirs = Vec::new();
        let mut entries: Vec<Entry<'_>> = Vec::new();
        for e in stack.read_dir(&dir)? {
            if !l.shown(&e.name) {
                continue;
            }
            let img = &stack.layers()[e.layer];
            let ino = stack.entry_inode(&dir, &e)?;
            if a.recursive && e.file_type == FileType::Directory {
                if let Some(Found::Dir(d)) = stack.lookup(&dir, &e.name)? {
                    subdirs.push((d, join_name(&prefix, &e.name)));
                }
            }
            entries.push((&**img, ino, l.entry_name(&prefix, &e.name)));
        }
        l.batch(&mut o, &entries, true)?;
        todo.extend(subdirs.into_iter().rev());
    }
    l.finish(&mut o).map(|()| 0)
}

/// `sheaf cat`.
pub fn cat(
    image: &Path,
    paths: &[std::ffi::OsString],
    remote: &crate::util::RemoteArgs,
    io: &mut crate::Io<'_>,
) -> Result<i32> {
    // One image, or the merged tree of a stack: each path resolves to an
    // inode of one image.
    let stack = match crate::util::stack_layers(image) {
        Some(layers) => crate::util::open_stack(&layers, remote)?,
        None => sheaf_read::Stack::new(vec![std::sync::Arc::new(open_path(image, remote)?)]),
    };
    let resolve =
        |p: &[u8]| -> std::result::Result<(usize, sheaf_read::Inode), sheaf_read::ReadError> {
            Ok(stack.resolve_follow(p)?.shown())
        };
    let block = stack
        .layers()
        .iter()
        .map(|i| i.superblock().block_size)
        .max()
        .unwrap_or(0);
    let out = &mut *io.stdout;
    let mut buf = vec![0u8; block as usize];
    // As cat(1): symlinks inside the image are followed, each file is
    // written in turn, and one that cannot be is named on stderr while the
    // rest still are (exit 1 at the end). A damaged image stops it.
    let mut failed = false;
    for path in paths {
        let shown = path.to_string_lossy();
        let (layer, ino) = match resolve(path.as_bytes()) {
            Ok(i) => i,
            Err(
                e @ (sheaf_read::ReadError::NotFound(_) | sheaf_read::ReadError::TooManyLinks(_)),
            ) => {
                let _ = out.flush();
                let _ = writeln!(
                    io.stderr,
                    "sheaf: error: {}",
                    sheaf_net::redact_text(&e.to_string())
                );
                failed = true;
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        if ino.file_type() != FileType::Regular {
            let _ = out.flush();
            let what = match ino.file_type() {
                FileType::Directory => "is a directory".to_string(),
                t => format!("not a regular file (a {})", t.name()),
            };
            let _ = writeln!(io.stderr, "sheaf: error: {shown}: {what}");
            failed = true;
            continue;
        }
        let img = &stack.layers()[layer];
        let mut off = 0u64;
        loop {
            let n = img.read(&ino, off, &mut buf)?;
            if n == 0 {
                break;
            }
            out.write_all(&buf[..n])?;
            off += n as u64;
        }
    }
    out.flush()?;
    Ok(i32::from(failed))
}

/// `sheaf check`.
pub fn check(
    image: &Path,
    threads: Option<usize>,
    json: bool,
    remote: &crate::util::RemoteArgs,
    io: &mut crate::Io<'_>,
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
        .and_then(|b| b.stats?.hole_bytes)
        .unwrap_or(0);
    let logical = img.superblock().logical_bytes.saturating_sub(holes);
    if json {
        writeln!(
            io.stdout,
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "image": crate::util::shown(image),
                "ok": rep.errors.is_empty(),
                "pages": rep.pages, "blocks": rep.blocks, "inodes": rep.inodes, "entries": rep.entries,
                "block_bytes": rep.block_bytes, "stored_data_bytes": img.superblock().stored_data_bytes,
                "logical_bytes": img.superblock().logical_bytes,
                "data_bytes": logical, "mb_per_s": logical as f64 / secs / 1e6,
                "seconds": secs, "errors": rep.errors,
                "bad_blocks": rep.bad_blocks, "damaged_files": rep.damaged_files,
                "root_digest": hex(&img.root_digest()),
            }))?
        )?;
    } else if rep.errors.is_empty() {
        writeln!(io.stdout,
            "{}: OK: {} pages, {} blocks ({} of data, {} stored), {} inodes, a tree of {} entries verified in {:.2} s ({:.0} MB/s of file data)",
            crate::util::shown(image),
            rep.pages,
            rep.blocks,
            human(rep.block_bytes),
            human(img.superblock().stored_data_bytes),
            rep.inodes,
            rep.entries,
            secs,
            logical as f64 / secs / 1e6
        )?;
    } else {
        for e in &rep.errors {
            let _ = writeln!(io.stderr, "sheaf: {e}");
        }
        // What the damage costs: the files whose data is in a bad block.
        for f in &rep.damaged_files {
            let _ = writeln!(
                io.stderr,
                "sheaf: {}: {f}: damaged (its data is in a bad block)",
                sheaf_net::redact_text(&image.display().to_string())
            );
        }
        let _ = writeln!(
            io.stderr,
            "sheaf: error: {}: {} problem{} found",
            crate::util::shown(image),
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
