//! Mount an image and serve it until it is unmounted or the process is told
//! to stop.

use crate::fs::FsConfig;
use crate::kernel::{self, Connection, KernelError};
use fuser::{Config, Filesystem, Session, SessionACL};
use std::io;
use std::path::{Path, PathBuf};

/// Everything a mount needs besides the image.
#[derive(Debug, Clone)]
pub struct MountConfig {
    /// Where to mount (made absolute by [`check_mountpoint`]).
    pub mountpoint: PathBuf,
    /// Shown as the mount's source in `/proc/mounts` (the image path).
    pub fsname: String,
    /// How entries are presented.
    pub fs: FsConfig,
    /// Request-handling threads, each with its own cloned `/dev/fuse` fd;
    /// 0 for [`default_threads`], counted only once the mount is ready.
    pub threads: usize,
    /// Let other users access the mount.
    pub allow_other: bool,
    /// Let root access the mount.
    pub allow_root: bool,
    /// Honour setuid/setgid bits (root only).
    pub suid: bool,
    /// Honour device files (root only).
    pub dev: bool,
    /// Allow executing programs from the mount.
    pub exec: bool,
    /// Mount read-write (an overlay with an upper directory); otherwise the
    /// kernel refuses every write with EROFS before asking us.
    pub writable: bool,
    /// Mount with mount(2) directly instead of `fusermount3` (inside a
    /// private mount namespace: see [`crate::namespace`]).
    pub direct: bool,
    /// Take requests through FUSE over io_uring when the kernel offers it
    /// (Linux 6.14+ with the `fuse` module's `enable_uring` on): requests
    /// are queued per CPU and served by threads pinned there, so a
    /// round trip wakes no other CPU (docs/mount.md). `/dev/fuse` serves
    /// otherwise, and always serves forgets and interrupts.
    pub io_uring: bool,
}

/// Why a mount failed; each renders as one line naming the thing.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    /// The mountpoint is unusable.
    #[error("{}: {problem}", path.display())]
    Mountpoint {
        /// The path given.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// No FUSE device.
    #[error("/dev/fuse: {0}")]
    NoFuse(String),
    /// The kernel or fusermount3 refused.
    #[error("cannot mount on {}: {cause}", path.display())]
    Kernel {
        /// The mountpoint.
        path: PathBuf,
        /// Why.
        cause: KernelError,
    },
    /// The FUSE handshake failed.
    #[error("FUSE handshake on {} failed: {cause}", path.display())]
    Handshake {
        /// The mountpoint.
        path: PathBuf,
        /// Why.
        #[source]
        cause: io::Error,
    },
}

/// Check that `path` can be mounted on and return it made absolute:
/// it exists, is a directory, is not a dead FUSE mount and is not already a
/// mount point.
pub fn check_mountpoint(path: &Path) -> Result<PathBuf, MountError> {
    let bad = |problem: String| MountError::Mountpoint {
        path: path.to_path_buf(),
        problem,
    };
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(bad("not a directory".into())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(bad(format!(
                "does not exist; create it: mkdir -p {}",
                path.display()
            )))
        }
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            return Err(bad(format!(
                "a dead FUSE mount is still attached (transport endpoint is not connected); \
                 run `sheaf umount {}` first",
                path.display()
            )))
        }
        Err(e) => return Err(bad(e.to_string())),
    }
    let abs = path.canonicalize().map_err(|e| bad(e.to_string()))?;
    if let Some(m) = kernel::mount_at(&abs).map_err(|e| bad(e.to_string()))? {
        return Err(bad(format!(
            "already a mount point ({} from {}); unmount it first",
            m.fstype, m.source
        )));
    }
    Ok(abs)
}

/// Refuse `sheaf mount MOUNTPOINT IMAGE`, the order swapped: one image
/// named whose path is a directory, and a mount point that is a file.
pub fn check_order(images: &[PathBuf], mountpoint: &Path) -> Result<(), MountError> {
    let [image] = images else {
        return Ok(());
    };
    if image.is_dir() && mountpoint.is_file() {
        return Err(MountError::Mountpoint {
            path: mountpoint.to_path_buf(),
            problem: format!(
                "not a directory, and {} is one: the image goes first: sheaf mount {} {}",
                image.display(),
                mountpoint.display(),
                image.display()
            ),
        });
    }
    Ok(())
}

/// Whether the directory `path` holds anything, which a mount on it hides
/// until it is unmounted (mount(8) mounts on it all the same).
pub fn hides_entries(path: &Path) -> bool {
    std::fs::read_dir(path).is_ok_and(|mut d| d.next().is_some())
}

/// Check that the FUSE device exists and that this user may open it
/// (fusermount3, though setuid root, opens it with the user's rights:
/// without them it says only "Permission denied").
pub fn check_fuse_device() -> Result<(), MountError> {
    match std::fs::metadata("/dev/fuse") {
        Ok(_) => {
            // SAFETY: access on a constant C string; geteuid has no
            // preconditions.
            let denied = unsafe {
                libc::geteuid() != 0
                    && libc::access(c"/dev/fuse".as_ptr(), libc::R_OK | libc::W_OK) != 0
            };
            if denied && io::Error::last_os_error().raw_os_error() == Some(libc::EACCES) {
                return Err(MountError::NoFuse(
                    "cannot be opened by this user (permission denied): mounting without root \
                     needs it readable and writable by everyone (mode 0666, Debian's default; \
                     an administrator can restore it: chmod 0666 /dev/fuse)"
                        .into(),
                ));
            }
            Ok(())
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(MountError::NoFuse(
            "missing (load the fuse module, or run the container with --device /dev/fuse)".into(),
        )),
        Err(e) => Err(MountError::NoFuse(e.to_string())),
    }
}

/// A mounted filesystem that is not served yet.
pub struct Mounted<F: Filesystem> {
    session: Session<F>,
    /// The fusermount3 connection (none for a direct mount).
    conn: Option<Connection>,
    mountpoint: PathBuf,
    signals: libc::sigset_t,
}

/// A FUSE connection the kernel has accepted, not yet served.
pub struct Connected {
    conn: Option<Connection>,
    fd: std::os::fd::OwnedFd,
    acl: SessionACL,
}

/// Mount `fs` (a [`crate::SheafFs`] for one image, a [`crate::UnionFs`] for
/// a stack or an overlay) as described by `cfg`. On return the kernel has
/// accepted the connection: the mount is visible and requests queue until
/// [`Mounted::serve`] runs.
///
/// `make` builds the filesystem after SIGINT/SIGTERM/SIGHUP are blocked in
/// this thread, so threads it starts (readahead, prefetch) inherit the block
/// and a stop signal always reaches the thread that unmounts; one delivered
/// to a thread that did not block it would kill the process and leave the
/// mount behind.
///
/// `ready` runs as soon as the kernel has the mount, before `make` and the
/// FUSE handshake: the kernel holds every request until the handshake
/// answers INIT, so a caller waiting for the mount may go on (libfuse's
/// daemonised servers return at the same point). A 16M-entry image, 40
/// alternating rounds, medians, `sheaf mount` returned / root listed:
/// warm 7.15 / 9.95 ms against 8.2 / 10.65 with `ready` after the
/// handshake (docs/mount.md, seventh stop). If the handshake fails after
/// `ready`, the caller's error ends the server and the watchdog (or
/// fusermount3's auto_unmount) takes the mount away.
pub fn mount<F: Filesystem>(
    cfg: &MountConfig,
    make: impl FnOnce() -> F,
    ready: impl FnOnce(),
) -> Result<Mounted<F>, MountError> {
    one_arena();
    block_stop_signals().map_err(|cause| MountError::Handshake {
        path: cfg.mountpoint.clone(),
        cause,
    })?;
    let c = connect(cfg)?;
    ready();
    attach(cfg, c, make())
}

/// One malloc arena: request threads free blocks other threads allocated,
/// and per-thread arenas each kept their own freed multi-MiB holes. glibc
/// fixes its arena limit when the first thread other than the main one
/// takes an arena, so this must come before `make` starts any: called from
/// `attach` only, it came too late and which arenas threads landed in
/// depended on timing (server peak RSS of a 16M-entry walk 71 or 88 MiB,
/// docs/mount.md). Random reads: 1.39 s against 1.37 s, 8 alternating
/// rounds (`MALLOC_ARENA_MAX=1` from the start against the default).
fn one_arena() {
    // SAFETY: an allocator tuning call (glibc's; musl's allocator of the
    // static build has no arenas to limit).
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1)
    };
}

/// The request threads of a mount that does not say: they block on disk
/// or network reads, so there are more than cores: with 2 per core, 4
/// readers of cold small files on 2 cores left every lookup queued behind
/// their reads (p99 8 ms; bench/default-image.sh).
pub fn default_threads() -> usize {
    (cpus() * 4).clamp(8, 32)
}

/// CPUs this process may use, found once: the standard library reads the
/// cgroup's quota files each time it is asked, and a server asks several
/// times as it starts (after the mount is ready, so the waiting `sheaf
/// mount` does not wait for those reads).
pub fn cpus() -> usize {
    static CPUS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CPUS.get_or_init(|| std::thread::available_parallelism().map_or(1, usize::from))
}

/// The kernel half of [`mount`]: mount at `cfg.mountpoint` and return the
/// connection. Starts no thread (a caller may still enter a namespace).
pub fn connect(cfg: &MountConfig) -> Result<Connected, MountError> {
    check_fuse_device()?;
    let mut opts: Vec<String> = vec![
        if cfg.writable { "rw" } else { "ro" }.into(),
        "default_permissions".into(),
    ];
    opts.push("subtype=sheaf".into());
    opts.push(if cfg.suid { "suid" } else { "nosuid" }.into());
    opts.push(if cfg.dev { "dev" } else { "nodev" }.into());
    if !cfg.exec {
        opts.push("noexec".into());
    }
    let acl = if cfg.allow_other {
        opts.push("allow_other".into());
        SessionACL::All
    } else if cfg.allow_root {
        opts.push("allow_root".into());
        SessionACL::RootAndOwner
    } else if cfg.direct {
        // Inside a user namespace the caller's ids differ from the ids the
        // kernel reports; the kernel already lets only the mounter in.
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    let kernel_err = |cause| MountError::Kernel {
        path: cfg.mountpoint.clone(),
        cause,
    };
    let (conn, fd) = if cfg.direct {
        let fd = kernel::mount_direct(&cfg.mountpoint, &cfg.fsname, &opts).map_err(kernel_err)?;
        (None, fd)
    } else {
        let conn = kernel::mount(&cfg.mountpoint, &cfg.fsname, &opts).map_err(kernel_err)?;
        let fd = conn.fd.try_clone().map_err(|cause| MountError::Handshake {
            path: cfg.mountpoint.clone(),
            cause,
        })?;
        (Some(conn), fd)
    };
    Ok(Connected { conn, fd, acl })
}

impl Connected {
    /// Serve with every request allowed through (the kernel checks who may
    /// enter; for a mount moved into a user namespace, where ids differ).
    pub fn allow_all(&mut self) {
        self.acl = SessionACL::All;
    }
}

/// The serving half of [`mount`]: attach `fs` to connection `c`.
pub fn attach<F: Filesystem>(
    cfg: &MountConfig,
    c: Connected,
    fs: F,
) -> Result<Mounted<F>, MountError> {
    // For callers that connect first (`sheaf run`); binds only if no thread
    // has taken an arena yet.
    one_arena();
    // Before any request thread starts, so that only the signal thread sees them.
    let signals = block_stop_signals().map_err(|cause| MountError::Handshake {
        path: cfg.mountpoint.clone(),
        cause,
    })?;
    let Connected { mut conn, fd, acl } = c;
    if let Some(c) = &mut conn {
        c.relay_messages();
    }
    let threads = match cfg.threads {
        0 => default_threads(),
        n => n,
    };
    let mut fc = Config::default();
    fc.n_threads = Some(threads);
    fc.clone_fd = true;
    if cfg.io_uring {
        // The same number of threads, spread over the kernel's per-CPU queues.
        fc.io_uring_threads = threads.div_ceil(cpus()).max(1);
    }
    let session = Session::from_fd(fs, fd, acl, fc).map_err(|cause| MountError::Handshake {
        path: cfg.mountpoint.clone(),
        cause,
    })?;
    Ok(Mounted {
        session,
        conn,
        mountpoint: cfg.mountpoint.clone(),
        signals,
    })
}

impl<F: Filesystem> Mounted<F> {
    /// Serve requests until the filesystem is unmounted. SIGINT, SIGTERM and
    /// SIGHUP unmount it (lazily, so open files do not keep it alive).
    /// `announce` (if not empty) is logged, then "serving MOUNTPOINT", from
    /// the thread that waits for signals while the request threads start:
    /// a first syslog line reads the time zone and connects to the log
    /// socket, and the first requests (the `ls` after a mount) must not wait
    /// for that.
    pub fn serve(self, announce: String) -> io::Result<()> {
        let Mounted {
            session,
            conn,
            mountpoint,
            signals,
        } = self;
        let mut lines = Vec::new();
        if !announce.is_empty() {
            lines.push(announce);
        }
        lines.push(format!("serving {}", mountpoint.display()));
        unmount_on_signal(mountpoint.clone(), signals, lines)?;
        let r = session.run();
        finish(conn, r.is_ok());
        log::info!("unmounted {}", mountpoint.display());
        r
    }

    /// Serve requests in a new thread until the filesystem is unmounted,
    /// leaving signals to the caller (`sheaf run` forwards them to its
    /// command and unmounts when the command ends).
    pub fn spawn(self) -> io::Result<std::thread::JoinHandle<io::Result<()>>> {
        let Mounted { session, conn, .. } = self;
        std::thread::Builder::new()
            .name("sheaf-session".into())
            .spawn(move || {
                let r = session.run();
                finish(conn, r.is_ok());
                r
            })
    }
}

/// The thread that waits for a stop signal (SIGINT, SIGTERM, SIGHUP,
/// blocked in every other thread: [`block_stop_signals`]) and then
/// unmounts `mp` lazily, so open files do not keep it; it first logs
/// `lines` (off the request threads' way: a first syslog line reads the
/// time zone and connects to the log socket). Every server has one.
pub(crate) fn unmount_on_signal(
    mp: PathBuf,
    signals: libc::sigset_t,
    lines: Vec<String>,
) -> io::Result<()> {
    std::thread::Builder::new()
        .name("sheaf-signals".into())
        .spawn(move || {
            for l in lines {
                log::info!("{l}");
            }
            let mut sig: libc::c_int = 0;
            // SAFETY: `signals` is an initialised set; `sig` is valid.
            if unsafe { libc::sigwait(&signals, &mut sig) } != 0 {
                return;
            }
            log::info!("signal {sig}: unmounting {}", mp.display());
            if let Err(e) = kernel::unmount(&mp, true) {
                // Exiting closes the watchdog socket: the watchdog unmounts.
                log::error!("unmount of {} failed: {e}; exiting", mp.display());
                std::process::exit(1);
            }
        })?;
    Ok(())
}

/// Close a watched connection and reap the watchdog.
fn finish(conn: Option<Connection>, unmounted: bool) {
    if let Some(c) = conn {
        c.close(unmounted);
    }
}

/// Block SIGINT/SIGTERM/SIGHUP in this thread (and so in every thread it
/// starts later) and return the set, for the thread that waits for them.
pub(crate) fn block_stop_signals() -> io::Result<libc::sigset_t> {
    // SAFETY: plain sigset manipulation on a local.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        let r = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        if r != 0 {
            return Err(io::Error::from_raw_os_error(r));
        }
        Ok(set)
    }
}
