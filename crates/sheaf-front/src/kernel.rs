//! Whether a mount takes the kernel path (`-o kernel`, `--kernel`), and
//! taking it: the one place that decides, for `sheaf mount`, `pool load`
//! and the snapshotter's mounts alike.

use crate::options::{KernelPath, MountOptions};
use crate::serve::{serve_erofs, KernelRefused};
use anyhow::{bail, Result};
use sheaf_mount::erofs::{BlobFs, ErofsConfig, PrepareError};
use sheaf_mount::serve::MountConfig;
use sheaf_read::Image;
use std::sync::Arc;

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

/// Mount `layers` (one image, or a stack bottom first) at
/// `cfg.mountpoint` through the kernel's EROFS driver: make (or reuse)
/// their metadata image in `p.kernel_cache`, then serve the blob; the
/// serving call's exit code. `None` where the options do not ask for it
/// (`kernel=off`), and where it cannot be taken with `kernel=auto`: then
/// one line on stderr says why and the caller serves through FUSE. With
/// `kernel=require` every reason not to is an error; an image that cannot
/// be read is an error either way. `writable`: an overlay with an upper
/// directory.
pub fn mount(
    cfg: &MountConfig,
    p: &MountOptions,
    layers: &[Arc<Image>],
    writable: bool,
    signer: &str,
    foreground: bool,
) -> Result<Option<i32>> {
    let fuse = |why: String| -> Result<Option<i32>> {
        if p.kernel == KernelPath::Require {
            bail!("{}: kernel=require, but {why}", cfg.mountpoint.display());
        }
        eprintln!(
            "sheaf: {}: served through FUSE: {why}",
            cfg.mountpoint.display()
        );
        Ok(None)
    };
    if p.kernel == KernelPath::Off {
        return Ok(None);
    }
    if let Some(why) = cannot(p, writable) {
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
        Ok(code) => Ok(Some(code)),
        Err(e) => match e.downcast::<KernelRefused>() {
            Ok(KernelRefused(why)) => fuse(format!("the kernel refused: {why}")),
            Err(e) => Err(e),
        },
    }
}
