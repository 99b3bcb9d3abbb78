//! Serving a mount: in the foreground, or from a background process that
//! tells the waiting command whether the mount came up; and how a single
//! image is served.

use crate::options::MountOptions;
use anyhow::{bail, Context, Result};
use sheaf_mount::serve::MountConfig;
use sheaf_mount::{logging, FsConfig, SheafFs};
use sheaf_read::{CountingSource, Image};
use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// The settings of a single-image mount completed from its image:
/// metadata prefetch (default: for URLs) and the blocks to fetch first
/// (`-o prefetch=FILE`'s files, none for `prefetch=none`, else the list
/// stored in the image).
pub fn image_fs(
    img: &Image,
    mut fs: FsConfig,
    prefetch_metadata: Option<bool>,
    prefetch: Option<&Path>,
    remote: bool,
) -> Result<FsConfig> {
    fs.prefetch_metadata = prefetch_metadata.unwrap_or(remote);
    fs.prefetch_list = match prefetch {
        Some(f) if f.as_os_str() == "none" => Vec::new(),
        Some(f) => crate::paths::prefetch_blocks(img, f)?,
        None => img.prefetch_list()?,
    };
    Ok(fs)
}

/// Serve one image read-only ([`serve_mount`]). `SheafFs::new` runs where
/// the mount is served, after the fork that daemonises it: it starts threads.
#[allow(clippy::too_many_arguments)]
pub fn serve_image(
    mut cfg: MountConfig,
    p: &MountOptions,
    signer: &str,
    started: Instant,
    foreground: bool,
    img: Arc<Image>,
    src: Arc<CountingSource>,
    fs: FsConfig,
) -> Result<i32> {
    cfg.fs = fs.clone();
    cfg.io_uring = p.io_uring;
    serve_mount(&cfg, p, signer, started, foreground, move || {
        SheafFs::new(img, src, fs)
    })
}

/// Mount the filesystem `make` builds and serve it: in the foreground, or
/// from a background process once the mount is ready. `signer` is appended
/// to the log line that says the mount is up.
pub fn serve_mount<F: sheaf_mount::Filesystem>(
    cfg: &MountConfig,
    p: &MountOptions,
    signer: &str,
    started: Instant,
    foreground: bool,
    make: impl FnOnce() -> F,
) -> Result<i32> {
    serve_with(
        &cfg.mountpoint,
        p,
        foreground,
        |ready| Ok(sheaf_mount::serve::mount(cfg, make, ready)?),
        |m| {
            let announce = if foreground {
                format!(
                    "mounted {} in {:.1} ms{signer}",
                    cfg.fsname,
                    started.elapsed().as_secs_f64() * 1e3
                )
            } else {
                format!("mounted {}{signer}", cfg.fsname)
            };
            m.serve(announce)
        },
    )
}

/// Why the kernel path was not taken, when the kernel said so after the
/// serving process was forked: the caller serves through FUSE instead
/// (or, with `kernel=require`, fails with this line).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct KernelRefused(pub String);

/// Serve `fs`'s blob to the kernel's EROFS mount of `cfg.meta`
/// ([`sheaf_mount::erofs`]): in the foreground, or from a background
/// process once the mount is up. A refusal of the kernel is a
/// [`KernelRefused`].
pub fn serve_erofs(
    cfg: &sheaf_mount::erofs::ErofsConfig,
    p: &MountOptions,
    signer: &str,
    foreground: bool,
    fs: sheaf_mount::erofs::BlobFs,
) -> Result<i32> {
    serve_with(
        &cfg.mountpoint,
        p,
        foreground,
        |ready| {
            let s = sheaf_mount::erofs::mount(cfg, fs)
                .map_err(|e| anyhow::Error::new(KernelRefused(e.to_string())))?;
            ready();
            Ok(s)
        },
        |s| {
            log::info!(
                "mounted {} with the kernel's EROFS{signer}",
                cfg.meta.display()
            );
            s.serve()
        },
    )
}

/// The process that serves the last mount [`serve_with`] made in the
/// background (for `sheaf mount --json` of a mount that has no control
/// file to ask: the kernel path's).
static SERVER: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// The pid of the process serving the last background mount this process
/// made, if any.
pub fn last_server() -> Option<u32> {
    match SERVER.load(std::sync::atomic::Ordering::Relaxed) {
        0 => None,
        p => Some(p as u32),
    }
}

/// The one way a mount is served: `mount` makes it (calling `ready` once
/// the kernel has it), `serve` serves it until it is gone. In the
/// foreground, logging to stderr; else from a background process that
/// tells the waiting command, through a pipe, whether the mount came up
/// (and, for a [`KernelRefused`], that the kernel path was refused).
fn serve_with<S>(
    mp: &Path,
    p: &MountOptions,
    foreground: bool,
    mount: impl FnOnce(&mut dyn FnMut()) -> Result<S>,
    serve: impl FnOnce(S) -> std::io::Result<()>,
) -> Result<i32> {
    let prefix = format!("{}: ", mp.display());
    let log_target = |stderr: bool| -> Result<logging::Target> {
        Ok(match &p.log {
            Some(f) => {
                logging::open_file(f).with_context(|| format!("log file {}", f.display()))?
            }
            None if stderr => logging::Target::Stderr,
            None => logging::default_target(mp),
        })
    };
    if foreground {
        logging::init(log_target(true)?, prefix, p.debug);
        let m = mount(&mut || ())?;
        serve(m).context("serving the mount")?;
        return Ok(0);
    }
    let target = log_target(false)?;
    // A pipe tells the waiting parent whether the mount came up.
    let mut fds = [0; 2];
    // SAFETY: fds is a valid 2-element array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        bail!("pipe: {}", std::io::Error::last_os_error());
    }
    // SAFETY: pipe2 just returned these descriptors.
    let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: for a local image nothing above starts threads. For a URL the
    // HTTP client that opened the image owns a runtime thread, which the
    // child does not get: the child never touches that client (sheaf-net
    // builds one per process id and forgets an inherited one without
    // joining its thread), and no lock is held across the fork, so the
    // child only runs code that does not rely on the parent's threads.
    match unsafe { libc::fork() } {
        -1 => bail!("fork: {}", std::io::Error::last_os_error()),
        0 => {
            drop(rd);
            let mut wr = Some(std::fs::File::from(wr));
            detach();
            logging::init(target, prefix, p.debug);
            // "K" once the kernel has the mount (requests wait for the
            // handshake that follows), before the first log line: syslog's
            // first line reads the time zone files, cold after a reboot.
            let mut ready = || {
                if let Some(mut w) = wr.take() {
                    let _ = w.write_all(b"K");
                }
            };
            match mount(&mut ready) {
                Ok(m) => {
                    let code = match serve(m) {
                        Ok(()) => 0,
                        Err(e) => {
                            log::error!("serving failed: {e}");
                            1
                        }
                    };
                    std::process::exit(code);
                }
                Err(e) => {
                    match wr {
                        Some(mut wr) => {
                            let kind = if e.is::<KernelRefused>() { 'F' } else { 'E' };
                            let _ = write!(wr, "{kind}{e}");
                        }
                        // The parent has returned: the log has it, and
                        // exiting unmounts (the watchdog).
                        None => log::error!("{e}"),
                    }
                    std::process::exit(1);
                }
            }
        }
        child => {
            SERVER.store(child, std::sync::atomic::Ordering::Relaxed);
            drop(wr);
            // "K" is all there is to read: return on it rather than wait
            // for the end of the pipe, which comes only once the server
            // (and its watchdog, forked holding a copy) got to close it.
            let mut rd = std::fs::File::from(rd);
            let mut first = [0u8; 1];
            let n = loop {
                match rd.read(&mut first) {
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    r => break r?,
                }
            };
            match (n, first[0]) {
                (1, b'K') => Ok(0),
                (1, kind @ (b'E' | b'F')) => {
                    let mut msg = String::new();
                    rd.read_to_string(&mut msg)?;
                    if kind == b'F' {
                        return Err(KernelRefused(msg).into());
                    }
                    bail!("{msg}")
                }
                _ => bail!(
                    "the mount process for {} exited before the mount was ready (see its log)",
                    mp.display()
                ),
            }
        }
    }
}

/// Become a background process: own session, no terminal, cwd `/`.
fn detach() {
    // SAFETY: plain syscalls on descriptors this process owns.
    unsafe {
        libc::setsid();
        let _ = libc::chdir(c"/".as_ptr());
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        if null >= 0 {
            for fd in 0..3 {
                libc::dup2(null, fd);
            }
            if null > 2 {
                libc::close(null);
            }
        }
    }
}
