//! The kernel path (`sheaf mount --kernel`): the kernel's EROFS driver
//! serves the tree from a metadata image (`sheaf_erofs::write`), and this
//! process serves the data as one virtual file, the blob ([`BlobFs`]),
//! through FUSE.
//!
//! The FUSE mount that holds the blob is never attached anywhere: it is
//! made with fsopen(2)/fsmount(2) and only this process has it, as a
//! descriptor. The blob is opened through that descriptor and handed to
//! EROFS as `device=/proc/self/fd/N`; then every descriptor is closed, so
//! the EROFS superblock holds the only reference. Unmounting EROFS (by
//! `umount`, `sheaf umount`, or a stop signal to this process) releases the
//! blob, the detached FUSE mount goes with it, and the session ends: the
//! server exits. If the server dies instead, a forked watchdog
//! ([`kernel::watched`]) detaches the EROFS mount, so no mount whose data
//! cannot be read stays behind.

mod blob;
mod cache;
mod fuse;

pub use blob::BlobFs;
pub use cache::{gc, is_metadata_image, prepare, GcReport, PrepareError, Prepared};
pub use fuse::BLOB_NAME;
pub use sheaf_erofs::ErofsError;

use crate::kernel::{self, Watchdog};
use fuser::{Config, Session, SessionACL};
use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

/// What a kernel-path mount needs besides the blob.
#[derive(Debug, Clone)]
pub struct ErofsConfig {
    /// The metadata image (root-only: the kernel trusts it).
    pub meta: PathBuf,
    /// Where to mount (absolute, checked).
    pub mountpoint: PathBuf,
    /// Honour setuid/setgid bits.
    pub suid: bool,
    /// Honour device files.
    pub dev: bool,
    /// Allow executing programs.
    pub exec: bool,
    /// Threads serving the blob (0: [`crate::serve::default_threads`]).
    pub threads: usize,
}

/// Why the kernel path could not mount (the caller serves through FUSE
/// instead, or, asked to require the kernel path, stops here).
#[derive(Debug, thiserror::Error)]
#[error("{step}: {}", sheaf_format::one_line(.cause))]
pub struct ErofsMountError {
    /// What was being done.
    pub step: &'static str,
    /// The kernel's answer.
    #[source]
    pub cause: io::Error,
}

impl ErofsMountError {
    fn new(step: &'static str) -> impl FnOnce(io::Error) -> ErofsMountError {
        move |cause| ErofsMountError { step, cause }
    }

    /// The errno the kernel gave.
    pub fn errno(&self) -> Option<i32> {
        self.cause.raw_os_error()
    }
}

/// A kernel-path mount being served.
pub struct ErofsServing {
    session: std::thread::JoinHandle<io::Result<()>>,
    watchdog: Option<Watchdog>,
    mountpoint: PathBuf,
    signals: libc::sigset_t,
}

// The new mount API's system calls and constants (linux/mount.h); the
// libc crate has the numbers, not the wrappers.
const FSOPEN_CLOEXEC: libc::c_uint = 1;
const FSCONFIG_SET_FLAG: libc::c_uint = 0;
const FSCONFIG_SET_STRING: libc::c_uint = 1;
const FSCONFIG_CMD_CREATE: libc::c_uint = 6;
const FSMOUNT_CLOEXEC: libc::c_uint = 1;
const MOUNT_ATTR_RDONLY: libc::c_uint = 1;
const MOUNT_ATTR_NOSUID: libc::c_uint = 2;
const MOUNT_ATTR_NODEV: libc::c_uint = 4;
const MOUNT_ATTR_NOEXEC: libc::c_uint = 8;

fn fd_result(r: libc::c_long) -> io::Result<OwnedFd> {
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor to us.
    Ok(unsafe { OwnedFd::from_raw_fd(r as RawFd) })
}

fn fsconfig(
    fs: &OwnedFd,
    cmd: libc::c_uint,
    key: Option<&str>,
    value: Option<&str>,
) -> io::Result<()> {
    let key = key.map(|k| CString::new(k).expect("no NUL in a key"));
    let value = value.map(|v| CString::new(v).expect("no NUL in a value"));
    // SAFETY: valid descriptor and C strings (or null where the command takes none).
    let r = unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            fs.as_raw_fd(),
            cmd,
            key.as_ref().map_or(std::ptr::null(), |k| k.as_ptr()),
            value.as_ref().map_or(std::ptr::null(), |v| v.as_ptr()),
            0,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A detached FUSE mount on `/dev/fuse` descriptor `dev`: its mount
/// descriptor.
fn detached_fuse(dev: &OwnedFd) -> io::Result<OwnedFd> {
    // SAFETY: a plain system call with a C string.
    let fs =
        fd_result(unsafe { libc::syscall(libc::SYS_fsopen, c"fuse".as_ptr(), FSOPEN_CLOEXEC) })?;
    let fd = dev.as_raw_fd().to_string();
    fsconfig(&fs, FSCONFIG_SET_STRING, Some("fd"), Some(&fd))?;
    fsconfig(&fs, FSCONFIG_SET_STRING, Some("rootmode"), Some("40000"))?;
    fsconfig(&fs, FSCONFIG_SET_STRING, Some("user_id"), Some("0"))?;
    fsconfig(&fs, FSCONFIG_SET_STRING, Some("group_id"), Some("0"))?;
    // EROFS reads the blob in the context of whoever reads a file.
    fsconfig(&fs, FSCONFIG_SET_FLAG, Some("allow_other"), None)?;
    fsconfig(&fs, FSCONFIG_CMD_CREATE, None, None)?;
    let attrs = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC;
    // SAFETY: a plain system call on a descriptor we own.
    fd_result(unsafe { libc::syscall(libc::SYS_fsmount, fs.as_raw_fd(), FSMOUNT_CLOEXEC, attrs) })
}

/// Read `meta` through, so that the kernel's first walk finds it in the
/// page cache instead of waiting on the disk block by block.
fn read_ahead(meta: &File) -> io::Result<()> {
    let mut buf = vec![0u8; 1 << 20];
    let mut f = meta;
    while f.read(&mut buf)? > 0 {}
    Ok(())
}

/// Mount `cfg.meta` at `cfg.mountpoint` with EROFS, the blob served from
/// `fs`. On return the mount is visible and served; [`ErofsServing::serve`]
/// waits for its end. Root only (the caller checks, and falls back).
pub fn mount(cfg: &ErofsConfig, fs: BlobFs) -> Result<ErofsServing, ErofsMountError> {
    let signals = crate::serve::block_stop_signals().map_err(ErofsMountError::new("signals"))?;
    let meta = File::open(&cfg.meta).map_err(ErofsMountError::new("the metadata image"))?;
    read_ahead(&meta).map_err(ErofsMountError::new("reading the metadata image"))?;
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .map_err(ErofsMountError::new("/dev/fuse"))?;
    let dev = OwnedFd::from(dev);
    let mnt = detached_fuse(&dev).map_err(ErofsMountError::new("a detached FUSE mount"))?;
    let mut fc = Config::default();
    fc.n_threads = Some(match cfg.threads {
        0 => crate::serve::default_threads(),
        n => n,
    });
    fc.clone_fd = true;
    let session = Session::from_fd(fs, dev, SessionACL::All, fc)
        .map_err(ErofsMountError::new("the FUSE session"))?;
    let session = std::thread::Builder::new()
        .name("sheaf-blob".into())
        .spawn(move || session.run())
        .map_err(ErofsMountError::new("the FUSE session"))?;
    let name = CString::new(BLOB_NAME).expect("no NUL");
    // SAFETY: a plain openat on a descriptor we own and a C string.
    let blob = fd_result(unsafe {
        libc::openat(
            mnt.as_raw_fd(),
            name.as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        ) as libc::c_long
    })
    .map_err(ErofsMountError::new("opening the blob"))?;
    let mut flags = libc::MS_RDONLY;
    if !cfg.suid {
        flags |= libc::MS_NOSUID;
    }
    if !cfg.dev {
        flags |= libc::MS_NODEV;
    }
    if !cfg.exec {
        flags |= libc::MS_NOEXEC;
    }
    let mount_erofs = || -> Result<(), kernel::KernelError> {
        let src = kernel::cpath(&cfg.meta)?;
        let target = kernel::cpath(&cfg.mountpoint)?;
        let data =
            CString::new(format!("device=/proc/self/fd/{}", blob.as_raw_fd())).expect("no NUL");
        // SAFETY: valid C strings.
        let r = unsafe {
            libc::mount(
                src.as_ptr(),
                target.as_ptr(),
                c"erofs".as_ptr(),
                flags,
                data.as_ptr().cast(),
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error().into());
        }
        Ok(())
    };
    let watchdog = match kernel::watched(&cfg.mountpoint, mount_erofs) {
        Ok(Some((_, w))) => Some(w),
        Ok(None) => {
            mount_erofs().map_err(|e| ErofsMountError::new("mounting EROFS")(e.into()))?;
            None
        }
        Err(e) => return Err(ErofsMountError::new("mounting EROFS")(e.into())),
    };
    // EROFS holds the blob now; the mount ends with it.
    drop(blob);
    drop(mnt);
    drop(meta);
    Ok(ErofsServing {
        session,
        watchdog,
        mountpoint: cfg.mountpoint.clone(),
        signals,
    })
}

impl From<kernel::KernelError> for io::Error {
    fn from(e: kernel::KernelError) -> io::Error {
        match e {
            kernel::KernelError::Io(e) => e,
            other => io::Error::other(other.to_string()),
        }
    }
}

impl ErofsServing {
    /// Serve the blob until the EROFS mount is gone. SIGINT, SIGTERM and
    /// SIGHUP unmount it (lazily: open files keep it, and the blob, until
    /// they close).
    pub fn serve(self) -> io::Result<()> {
        let ErofsServing {
            session,
            watchdog,
            mountpoint,
            signals,
        } = self;
        crate::serve::unmount_on_signal(
            mountpoint.clone(),
            signals,
            vec![format!("serving {} (kernel EROFS)", mountpoint.display())],
        )?;
        let r = session
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("the blob's session panicked")));
        if let Some(w) = watchdog {
            w.close(r.is_ok());
        }
        log::info!("unmounted {}", Path::new(&mountpoint).display());
        r
    }
}
