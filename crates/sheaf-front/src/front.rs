//! The small `sheaf` executable: which commands it runs itself, and
//! handing every other one to `sheaf-full`.
//!
//! It runs one thing itself: a read-only mount of one local image, in the
//! background, with no signature policy in force (`sheaf mount [-o OPTS]
//! IMAGE MOUNTPOINT`, and `mount.fuse.sheaf` as mount(8) runs it). Anything
//! else, and any failure before or during that mount, goes to `sheaf-full`
//! with the same arguments, so that every message and every other rule
//! comes from one place (a failed mount leaves nothing behind, so trying
//! it again there is safe).

use crate::options::{helper_args, is_helper, MountOptions, RemoteOptions};
use sheaf_mount::serve::check_mountpoint;
use sheaf_read::{CountingSource, FileSource, Image, ImageOptions};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// The environment variable through which `sheaf-full` learns the path of
/// the `sheaf` that ran it (for the paths it prints into shell functions,
/// modulefiles and unit files).
pub const EXE_ENV: &str = "SHEAF_EXE";

/// Name of the whole tool's executable.
pub const FULL: &str = "sheaf-full";

/// Run a local mount if `args` (the whole argv) asks for one this program
/// can serve: `Some(exit code)` once the mount is up, `None` to hand over.
pub fn try_mount(args: &[OsString]) -> Option<i32> {
    let started = Instant::now();
    let (image, mountpoint, options, from_fstab) = if is_helper(args.first().map(|a| a.as_os_str()))
    {
        let h = helper_args(args[1..].to_vec()).ok()?;
        if h.foreground {
            return None;
        }
        (h.image, h.mountpoint, h.options, true)
    } else {
        let (image, mountpoint, options) = mount_args(args)?;
        (image, mountpoint, options, false)
    };
    let s = image.to_string_lossy();
    if sheaf_net::is_url(&s) || s.contains(',') {
        return None;
    }
    let p = MountOptions::parse(&options, from_fstab).ok()?;
    // Network options and signatures are the whole tool's business.
    if p.remote != RemoteOptions::default() {
        return None;
    }
    let policy = sheaf_trust::Policy::load(false, None, None).ok()?;
    if policy.require {
        return None;
    }
    let mp = check_mountpoint(&mountpoint).ok()?;
    // The whole tool warns that what it holds is hidden (once).
    if sheaf_mount::serve::hides_entries(&mp) {
        return None;
    }
    let file = FileSource::open(&image).ok()?;
    let src = Arc::new(CountingSource::new(Arc::new(file)));
    let opts = ImageOptions {
        block_cache_bytes: p.cache_size,
        ..Default::default()
    };
    let img = Arc::new(Image::open_with(src.clone(), opts).ok()?);
    img.root().ok()?;
    let fs = crate::serve::image_fs(
        &img,
        p.fs_config(),
        p.prefetch_metadata,
        p.prefetch.as_deref(),
        false,
    )
    .ok()?;
    let cfg = p.mount_config(mp, crate::options::local_fsname(&image), false);
    // Here too, so that a cold `sheaf mount --kernel` does not load the
    // whole tool; a refusal goes to it (it says why, as for any mount).
    let layers = std::slice::from_ref(&img);
    if let Some(code) = crate::kernel::mount(&cfg, &p, layers, false, "", false).ok()? {
        return Some(code);
    }
    crate::serve::serve_image(cfg, &p, "", started, false, img, src, fs).ok()
}

/// `sheaf mount [-o OPTS]... IMAGE MOUNTPOINT` in the forms clap accepts
/// for these flags (`-o X`, `-oX`, `-o=X`); anything else: `None`.
fn mount_args(args: &[OsString]) -> Option<(PathBuf, PathBuf, Vec<String>)> {
    if args.get(1)?.as_os_str() != "mount" {
        return None;
    }
    let mut pos = Vec::new();
    let mut options = Vec::new();
    let mut it = args[2..].iter();
    while let Some(a) = it.next() {
        let s = a.to_str()?;
        if s == "--kernel" {
            options.push("kernel=auto".into());
        } else if let Some(when) = s.strip_prefix("--kernel=") {
            options.push(format!("kernel={when}"));
        } else if s == "-o" {
            options.push(it.next()?.to_str()?.to_string());
        } else if let Some(v) = s.strip_prefix("-o") {
            options.push(v.strip_prefix('=').unwrap_or(v).to_string());
        } else if s.starts_with('-') {
            return None;
        } else {
            pos.push(PathBuf::from(a));
        }
    }
    let [image, mountpoint] = <[PathBuf; 2]>::try_from(pos).ok()?;
    Some((image, mountpoint, options))
}

/// Where `sheaf-full` is: beside this program (a build tree, or one
/// directory for both), else in `../libexec/sheaf/` (as `make install`
/// puts it).
pub fn full_path(me: &Path) -> Option<PathBuf> {
    let dir = me.parent()?;
    [dir.join(FULL), dir.join("../libexec/sheaf").join(FULL)]
        .into_iter()
        .find(|p| p.is_file())
}

/// Run `sheaf-full` with `args` (argv[0] kept, so that it knows when it is
/// mount(8)'s helper). Returns only on failure, with the message to print.
pub fn hand_over(args: &[OsString]) -> String {
    use std::os::unix::process::CommandExt;
    let me = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            return format!(
                "cannot find this program's path: {}",
                sheaf_format::one_line(&e)
            )
        }
    };
    let Some(full) = full_path(&me) else {
        return format!(
            "{FULL} is missing: it belongs beside {} or in {} (reinstall sheaf)",
            me.display(),
            me.parent()
                .unwrap_or(Path::new("."))
                .join("../libexec/sheaf")
                .display()
        );
    };
    let mut cmd = std::process::Command::new(&full);
    if let Some(a0) = args.first() {
        cmd.arg0(a0);
    }
    let err = cmd.args(args.iter().skip(1)).env(EXE_ENV, &me).exec();
    format!("{}: {}", full.display(), sheaf_format::one_line(&err))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(a: &[&str]) -> Vec<OsString> {
        a.iter().map(OsString::from).collect()
    }

    #[test]
    fn only_a_plain_local_mount_is_taken() {
        let m = mount_args(&v(&[
            "sheaf", "mount", "-o", "ro", "-ouid=1", "-o=gid=2", "a", "b",
        ]));
        let (i, mp, o) = m.unwrap();
        assert_eq!(
            (i.as_path(), mp.as_path()),
            (Path::new("a"), Path::new("b"))
        );
        assert_eq!(o, ["ro", "uid=1", "gid=2"]);
        for other in [
            &["sheaf", "mount", "a"][..],
            &["sheaf", "mount", "a", "b", "c"],
            &["sheaf", "mount", "-f", "a", "b"],
            &["sheaf", "mount", "--upper", "u", "a", "b"],
            &["sheaf", "mount", "--help"],
            &["sheaf", "mount", "a", "b", "-o"],
            &["sheaf", "--cache-dir", "x", "mount", "a", "b"],
            &["sheaf", "build", "a", "-o", "b"],
            &["sheaf"],
        ] {
            assert!(mount_args(&v(other)).is_none(), "{other:?}");
        }
    }
}
