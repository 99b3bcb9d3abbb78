//! Whether a mount takes the kernel path (`-o kernel`, `--kernel`), and
//! taking it: the one place that decides, for `sheaf mount`, `pool load`
//! and the snapshotter's mounts alike.

use crate::options::{KernelPath, MountOptions};
use crate::serve::{serve_erofs, KernelRefused};
use anyhow::{bail, Result};
use sheaf_mount::erofs::{BlobFs, ErofsConfig, PrepareError};
use sheaf_mount::serve::MountConfig;
use sheaf_read::Image;
use std::path::Path;
use std::sync::Arc;

/// What became of a mount asked to take the kernel path.
#[derive(Debug)]
pub enum Outcome {
    /// Mounted (the exit code of the serving call).
    Mounted(i32),
    /// Not taken, for this reason: serve through FUSE and say so.
    Fuse(String),
}

/// Why the kernel path cannot serve a mount with these options, before
/// anything is tried; `None` if it may. `writable`: an overlay with an
/// upper directory.
pub fn cannot(p: &MountOptions, writable: bool) -> Option<String> {
    // SAFETY: a plain getter.
    if unsafe { libc::geteuid() } != 0 {
        return Some("the kernel path needs root (mount(2) of EROFS)".into());
    }
    if writable {
        return Some("a writable overlay is served by sheaf's union".into());
    }
    if p.uid.is_some() || p.gid.is_some() {
        return Some("uid= and gid= are FUSE's; the kernel shows the image's owners".into());
    }
    None
}

/// What a mount asked to take the kernel path does where it cannot: with
/// `kernel=require`, fail with `why`; else serve through FUSE, saying so
/// ([`say_fuse`]).
pub fn fuse_instead(mp: &Path, p: &MountOptions, why: &str) -> Result<()> {
    if p.kernel == KernelPath::Require {
        bail!("{}: kernel=require, but {why}", mp.display());
    }
    say_fuse(mp, why);
    Ok(())
}

/// The one line that says a mount asked to take the kernel path is served
/// through FUSE, and why.
pub fn say_fuse(mp: &Path, why: &str) {
    eprintln!("sheaf: {}: served through FUSE: {why}", mp.display());
}

/// Mount `layers` (one image, or a stack bottom first) at
/// `cfg.mountpoint` through the kernel's EROFS driver: make (or reuse)
/// their metadata image in `p.kernel_cache`, then serve the blob. With `kernel=require` every reason not to is an error; with
/// `auto` it is an [`Outcome::Fuse`] (the caller says it, [`say_fuse`],
/// and serves through FUSE). An image that cannot be read is an
/// error either way.
pub fn mount(
    cfg: &MountConfig,
    p: &MountOptions,
    layers: &[Arc<Image>],
    signer: &str,
    foreground: bool,
) -> Result<Outcome> {
    let fuse = |why: String| -> Result<Outcome> {
        if p.kernel == KernelPath::Require {
            bail!("{}: kernel=require, but {why}", cfg.mountpoint.display());
        }
        Ok(Outcome::Fuse(why))
    };
    debug_assert!(p.kernel != KernelPath::Off, "asked for the kernel path");
    if let Some(why) = cannot(p, false) {
        return fuse(why);
    }
    let prepared = match sheaf_mount::erofs::prepare(layers, &p.kernel_cache) {
        Ok(m) => m,
        Err(PrepareError::Erofs(sheaf_mount::erofs::ErofsError::Read(e))) => return Err(e.into()),
        Err(e) => return fuse(sheaf_format::one_line(&e)),
    };
    if prepared.made {
        log::debug!("wrote {}", prepared.meta.display());
    }
    let ecfg = ErofsConfig {
        meta: prepared.meta,
        mountpoint: cfg.mountpoint.clone(),
        suid: cfg.suid,
        dev: cfg.dev,
        exec: cfg.exec,
        threads: cfg.threads,
    };
    let fs = BlobFs::new(layers.to_vec(), prepared.map);
    match serve_erofs(&ecfg, p, signer, foreground, fs) {
        Ok(code) => Ok(Outcome::Mounted(code)),
        Err(e) => match e.downcast::<KernelRefused>() {
            Ok(KernelRefused(why)) => fuse(format!("the kernel refused: {why}")),
            Err(e) => Err(e),
        },
    }
}
