//! `sheaf extract`: unpack with attributes, never outside the target.
//!
//! Safety comes from three rules: every name from the image is checked to be
//! a single path component (no `/`, `.` or `..`); the walk descends only into
//! directories it has just created or verified with `lstat` to be real
//! directories (it `chdir`s into them, so every operation uses one short name
//! and paths of any depth work); and nothing existing is ever replaced
//! (files are created with `O_EXCL`). Symlinks are created as they are, never
//! followed.

use crate::util::human;
use crate::util::open_image as open_path;
use anyhow::{bail, Context, Result};
use sheaf_format::FileType;
use sheaf_read::{Image, Inode};
use std::collections::HashMap;
use std::ffi::{CString, OsStr};
use std::fs;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
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
        value_name = "DIR"
    )]
    dir: PathBuf,
    /// Print a JSON report on stdout.
    #[arg(long)]
    json: bool,
}

#[derive(Default)]
struct Stats {
    entries: u64,
    bytes: u64,
    /// Attributes that could not be set (ownership without root, devices, ...).
    unrestored: u64,
    first_unrestored: Option<String>,
}

struct Ctx<'a> {
    img: &'a Image,
    root: PathBuf,
    /// Inode → path (relative to root) of its first extracted name, for hardlinks.
    links: HashMap<u32, PathBuf>,
    stats: Stats,
    is_root: bool,
    buf: Vec<u8>,
    /// Directories entered, so a hostile image cannot make the walk loop.
    seen: sheaf_read::Seen,
}

fn safe_name(name: &[u8]) -> Result<&OsStr> {
    if !sheaf_format::DirentRecord::is_plain_name(name) {
        bail!(
            "image contains an unsafe entry name {:?}; refusing to extract it",
            String::from_utf8_lossy(name)
        );
    }
    Ok(OsStr::from_bytes(name))
}

/// `sheaf extract`.
pub fn run(a: ExtractArgs, remote: &crate::util::RemoteArgs) -> Result<i32> {
    let img = open_path(&a.image, remote)?;
    fs::create_dir_all(&a.dir).with_context(|| format!("{}", a.dir.display()))?;
    let root = fs::canonicalize(&a.dir).with_context(|| format!("{}", a.dir.display()))?;
    let mut cx = Ctx {
        img: &img,
        root: root.clone(),
        links: HashMap::new(),
        stats: Stats::default(),
        is_root: unsafe { libc::geteuid() } == 0,
        buf: vec![0; img.superblock().block_size as usize],
        seen: sheaf_read::Seen::new(&img),
    };
    let paths = if a.paths.is_empty() {
        vec!["/".into()]
    } else {
        a.paths.clone()
    };
    for p in &paths {
        let p = p.as_bytes();
        let ino = img.resolve(p)?;
        let comps: Vec<&[u8]> = p
            .split(|&b| b == b'/')
            .filter(|c| !c.is_empty() && *c != b".")
            .collect();
        std::env::set_current_dir(&root).with_context(|| root.display().to_string())?;
        let mut rel = PathBuf::new();
        match comps.split_last() {
            None => extract_dir_contents(&mut cx, &ino, &mut rel)?,
            Some((leaf, parents)) => {
                for c in parents {
                    enter_dir(safe_name(c)?, 0o755, &mut rel)?;
                }
                extract_one(&mut cx, &ino, leaf, &mut rel)?;
            }
        }
        if comps.is_empty() {
            std::env::set_current_dir(&root)?;
            set_attrs(&mut cx, &ino, OsStr::new("."))?;
        }
    }
    let s = &cx.stats;
    if a.json {
        println!(
            "{}",
            serde_json::json!({"directory": root, "entries": s.entries, "bytes": s.bytes,
                "unrestored_attributes": s.unrestored, "first_unrestored": s.first_unrestored})
        );
    } else {
        eprintln!(
            "extracted {} entries ({}) into {}",
            s.entries,
            human(s.bytes),
            root.display()
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

/// Create (or verify) a real directory `name` in the cwd and enter it.
fn enter_dir(name: &OsStr, mode: u32, rel: &mut PathBuf) -> Result<()> {
    let shown = || rel.join(name).display().to_string();
    match fs::DirBuilder::new().mode(mode | 0o700).create(name) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let md = fs::symlink_metadata(name).with_context(shown)?;
            if !md.is_dir() {
                bail!("{}: exists and is not a directory", shown());
            }
        }
        Err(e) => return Err(e).with_context(shown),
    }
    std::env::set_current_dir(name).with_context(shown)?;
    rel.push(name);
    Ok(())
}

fn extract_dir_contents(cx: &mut Ctx, dir: &Inode, rel: &mut PathBuf) -> Result<()> {
    cx.seen.enter(cx.img, dir)?;
    let n = cx.img.dir_len(dir)?;
    let mut from = 0;
    while from < n {
        let batch = cx.img.read_dir(dir, from, 4096)?;
        from += batch.len() as u64;
        for e in batch {
            let ino = cx.img.child(dir, e.ino, e.file_type)?;
            extract_one(cx, &ino, &e.name, rel)?;
        }
    }
    Ok(())
}

/// Extract one entry named `name` into the cwd (which is `root/rel`).
fn extract_one(cx: &mut Ctx, ino: &Inode, name: &[u8], rel: &mut PathBuf) -> Result<()> {
    let name = safe_name(name)?;
    cx.stats.entries += 1;
    let r = ino.rec;
    if ino.file_type() == FileType::Directory {
        enter_dir(name, r.mode & 0o7777, rel)?;
        extract_dir_contents(cx, ino, rel)?;
        std::env::set_current_dir("..").with_context(|| rel.display().to_string())?;
        rel.pop();
        return set_attrs(cx, ino, name);
    }
    let rel: &PathBuf = rel;
    let shown = || rel.join(name).display().to_string();
    if r.nlink > 1 {
        if let Some(first) = cx.links.get(&ino.ino) {
            // link(2) does not follow a symlink, so this links the entry itself.
            fs::hard_link(cx.root.join(first), name).with_context(shown)?;
            return Ok(());
        }
        cx.links.insert(ino.ino, rel.join(name));
    }
    match ino.file_type() {
        FileType::Directory => unreachable!("handled above"),
        FileType::Regular => {
            let mut f = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW)
                .open(name)
                .with_context(shown)?;
            let mut off = 0u64;
            let mut buf = std::mem::take(&mut cx.buf);
            while off < r.size {
                let n = cx.img.read(ino, off, &mut buf)?;
                if n == 0 {
                    break;
                }
                // All-zero 64 KiB windows become holes, as they were in the source.
                for w in buf[..n].chunks(64 << 10) {
                    if w.iter().all(|&b| b == 0) {
                        use std::io::Seek;
                        f.seek(std::io::SeekFrom::Current(w.len() as i64))
                            .with_context(shown)?;
                    } else {
                        f.write_all(w).with_context(shown)?;
                    }
                }
                off += n as u64;
            }
            cx.buf = buf;
            f.set_len(r.size).with_context(shown)?;
            cx.stats.bytes += r.size;
        }
        FileType::Symlink => {
            let target = cx.img.read_link(ino)?;
            std::os::unix::fs::symlink(OsStr::from_bytes(&target), name).with_context(shown)?;
        }
        t => {
            let c = CString::new(name.as_bytes()).expect("checked for NUL");
            let dev = if matches!(t, FileType::CharDevice | FileType::BlockDevice) {
                r.data
            } else {
                0
            };
            // SAFETY: valid C string; mknod has no memory effects.
            let rc = unsafe { libc::mknod(c.as_ptr(), r.mode, dev as libc::dev_t) };
            if rc != 0 {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::EPERM) {
                    note(cx, format!("{}: {} needs root", shown(), t.name()));
                    return Ok(());
                }
                return Err(e).with_context(shown);
            }
        }
    }
    set_attrs(cx, ino, name)
}

fn note(cx: &mut Ctx, what: String) {
    cx.stats.unrestored += 1;
    cx.stats.first_unrestored.get_or_insert(what);
}

/// Owner, xattrs, mode, then mtime (in that order: chown clears setuid and
/// writing xattrs may touch ctime, never mtime).
fn set_attrs(cx: &mut Ctx, ino: &Inode, name: &OsStr) -> Result<()> {
    let r = ino.rec;
    let c = CString::new(name.as_bytes()).expect("checked for NUL");
    let is_link = ino.file_type() == FileType::Symlink;
    // SAFETY: valid C string.
    if unsafe { libc::lchown(c.as_ptr(), r.uid, r.gid) } != 0 && cx.is_root {
        note(
            cx,
            format!(
                "{}: owner: {}",
                name.to_string_lossy(),
                std::io::Error::last_os_error()
            ),
        );
    }
    for (k, v) in cx.img.xattrs(ino)?.0 {
        if let Err(e) = xattr::set(Path::new(name), OsStr::from_bytes(&k), &v) {
            note(
                cx,
                format!(
                    "{}: xattr {}: {e}",
                    name.to_string_lossy(),
                    String::from_utf8_lossy(&k)
                ),
            );
        }
    }
    if !is_link {
        fs::set_permissions(name, fs::Permissions::from_mode(r.mode & 0o7777))
            .with_context(|| name.to_string_lossy().into_owned())?;
    }
    let t = libc::timespec {
        tv_sec: r.mtime_sec as libc::time_t,
        tv_nsec: r.mtime_nsec as libc::c_long,
    };
    // SAFETY: valid C string and a two-element timespec array.
    let rc = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            [t, t].as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if rc != 0 {
        note(
            cx,
            format!(
                "{}: mtime: {}",
                name.to_string_lossy(),
                std::io::Error::last_os_error()
            ),
        );
    }
    Ok(())
}
