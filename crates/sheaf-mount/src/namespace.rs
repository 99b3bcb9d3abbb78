//! Private mount namespaces, for `sheaf run`: mounts that only the command
//! sees, at paths such as `/data` that need not exist and that no user may
//! create, gone when the last process in the namespace exits.
//!
//! [`enter`] moves this process into a new mount namespace (root), or a new
//! user namespace plus mount namespace (anyone, where the kernel allows
//! unprivileged user namespaces), and makes every mount private so nothing
//! propagates back. [`make_dir`] then makes a mount point exist without
//! touching any real filesystem: the nearest existing ancestor is covered
//! by a tmpfs in which a clone of every original entry (`open_tree`, taken
//! before covering) is mounted back (for `/`
//! the tmpfs becomes the new root through `pivot_root`), and the missing
//! directories are created in the tmpfs. FUSE mounts inside the namespace
//! use [`crate::kernel::mount_direct`].

use crate::kernel::cpath;
use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Why a namespace could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum NamespaceError {
    /// The kernel refused a new namespace (the caller may fall back).
    #[error("{0}")]
    Unavailable(String),
    /// A step inside the namespace failed.
    #[error("{what}: {cause}")]
    Step {
        /// What was being done.
        what: String,
        /// Why it failed.
        #[source]
        cause: io::Error,
    },
}

fn step(what: impl Into<String>) -> impl FnOnce(io::Error) -> NamespaceError {
    let what = what.into();
    move |cause| NamespaceError::Step { what, cause }
}

/// What [`enter`] set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    /// A mount namespace only (the caller is root).
    Mount,
    /// A user namespace and a mount namespace.
    UserAndMount,
}

/// Who the process is inside a new user namespace.
#[derive(Debug, Clone, Copy, Default)]
pub struct Identity {
    /// User id inside (default: the same as outside).
    pub uid: Option<u32>,
    /// Group id inside (default: the same as outside).
    pub gid: Option<u32>,
}

fn check(r: libc::c_int) -> io::Result<()> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// A detached clone of the mount tree at `path` (`open_tree`); with
/// `recursive`, the mounts below it too.
fn clone_tree(path: &Path, recursive: bool) -> io::Result<OwnedFd> {
    let c = cpath(path)?;
    let mut flags = libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC;
    if recursive {
        flags |= libc::AT_RECURSIVE as libc::c_uint;
    }
    // SAFETY: valid C string; result checked.
    let fd = unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, c.as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: open_tree just returned it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// Attach a detached mount tree at `to`.
fn attach_tree(tree: &OwnedFd, to: &Path) -> io::Result<()> {
    let t = cpath(to)?;
    // SAFETY: valid descriptor and C strings.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            libc::MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    check(r as libc::c_int)
}

/// Enter a private mount namespace (with a user namespace unless root).
/// Must be called before the process starts any thread.
pub fn enter(id: Identity) -> Result<Isolation, NamespaceError> {
    // SAFETY: plain getters.
    let (euid, uid, gid) = unsafe { (libc::geteuid(), libc::getuid(), libc::getgid()) };
    let iso = if euid == 0 && id.uid.is_none() && id.gid.is_none() {
        // SAFETY: plain syscall.
        if unsafe { libc::unshare(libc::CLONE_NEWNS) } != 0 {
            let e = io::Error::last_os_error();
            return Err(NamespaceError::Unavailable(format!(
                "no private mount namespace: {e}"
            )));
        }
        Isolation::Mount
    } else {
        // SAFETY: plain syscall.
        if unsafe { libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) } != 0 {
            let e = io::Error::last_os_error();
            let why = match e.raw_os_error() {
                Some(libc::EPERM) => {
                    "unprivileged user namespaces are not allowed here (kernel.unprivileged_userns_clone, a seccomp filter, or a container)"
                }
                Some(libc::ENOSPC) => "the user namespace limit is reached (user.max_user_namespaces)",
                Some(libc::EINVAL) => "this kernel or process cannot create user namespaces",
                _ => "user namespaces unavailable",
            };
            return Err(NamespaceError::Unavailable(format!("{why}: {e}")));
        }
        let w = |f: &str, s: String| std::fs::write(f, s).map_err(step(format!("writing {f}")));
        w("/proc/self/setgroups", "deny".into())?;
        w(
            "/proc/self/uid_map",
            format!("{} {uid} 1\n", id.uid.unwrap_or(uid)),
        )?;
        w(
            "/proc/self/gid_map",
            format!("{} {gid} 1\n", id.gid.unwrap_or(gid)),
        )?;
        Isolation::UserAndMount
    };
    // Nothing mounted from now on propagates to the parent namespace.
    // SAFETY: valid C string; null pointers are allowed for these arguments.
    check(unsafe {
        libc::mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        )
    })
    .map_err(step("making mounts private"))?;
    Ok(iso)
}

/// Mount points this process may create directories under freely: the
/// tmpfs roots that [`make_dir`] made (identified by device number).
#[derive(Debug, Default)]
pub struct Scratch {
    devs: Vec<u64>,
}

/// One entry of a directory about to be covered.
struct Saved {
    name: Vec<u8>,
    /// A detached clone of its mount tree (`open_tree`), for non-symlinks.
    tree: Option<OwnedFd>,
    kind: std::fs::FileType,
    target: Option<PathBuf>,
}

fn save_entries(dir: &Path) -> Result<Vec<Saved>, NamespaceError> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).map_err(step(format!("listing {}", dir.display())))? {
        let e = e.map_err(step(format!("listing {}", dir.display())))?;
        let path = e.path();
        let kind = e
            .file_type()
            .map_err(step(format!("examining {}", path.display())))?;
        if kind.is_symlink() {
            out.push(Saved {
                name: e.file_name().as_bytes().to_vec(),
                tree: None,
                kind,
                target: Some(
                    std::fs::read_link(&path)
                        .map_err(step(format!("reading {}", path.display())))?,
                ),
            });
            continue;
        }
        // A detached copy of the entry and every mount below it, taken
        // before anything covers it.
        let tree = clone_tree(&path, true).map_err(step(format!("cloning {}", path.display())))?;
        out.push(Saved {
            name: e.file_name().as_bytes().to_vec(),
            tree: Some(tree),
            kind,
            target: None,
        });
    }
    Ok(out)
}

/// Mount a tmpfs on `at` (mode `mode`) and bind every saved entry back.
fn cover(at: &Path, mode: u32, saved: &[Saved]) -> Result<u64, NamespaceError> {
    let c = cpath(at).map_err(step(format!("covering {}", at.display())))?;
    let opts = CString::new(format!("mode={:o}", mode & 0o7777)).expect("no NUL");
    // SAFETY: valid C strings.
    check(unsafe {
        libc::mount(
            c"tmpfs".as_ptr(),
            c.as_ptr(),
            c"tmpfs".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            opts.as_ptr().cast(),
        )
    })
    .map_err(step(format!("mounting a tmpfs on {}", at.display())))?;
    for s in saved {
        let path = at.join(OsStr::from_bytes(&s.name));
        let what = || format!("restoring {}", path.display());
        if let Some(t) = &s.target {
            std::os::unix::fs::symlink(t, &path).map_err(step(what()))?;
            continue;
        }
        if s.kind.is_dir() {
            std::fs::create_dir(&path).map_err(step(what()))?;
        } else {
            std::fs::File::create(&path).map_err(step(what()))?;
        }
        let Some(tree) = &s.tree else { continue };
        attach_tree(tree, &path).map_err(step(what()))?;
    }
    std::fs::metadata(at)
        .map(|m| m.dev())
        .map_err(step(format!("examining {}", at.display())))
}

/// Make directory `dest` exist in this (private) namespace without
/// creating anything on a real filesystem.
pub fn make_dir(dest: &Path, scratch: &mut Scratch) -> Result<(), NamespaceError> {
    match std::fs::symlink_metadata(dest) {
        Ok(m) if m.is_dir() => return Ok(()),
        Ok(_) => {
            return Err(step(format!("{}", dest.display()))(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "exists and is not a directory",
            )))
        }
        Err(_) => {}
    }
    let mut anc = dest.to_path_buf();
    while !anc.is_dir() {
        if !anc.pop() {
            anc = PathBuf::from("/");
            break;
        }
    }
    let anc = anc
        .canonicalize()
        .map_err(step(format!("resolving {}", anc.display())))?;
    let dev = std::fs::metadata(&anc)
        .map_err(step(format!("examining {}", anc.display())))?
        .dev();
    if !scratch.devs.contains(&dev) {
        let saved = save_entries(&anc)?;
        let mode = std::fs::metadata(&anc)
            .map(|m| m.permissions().mode())
            .unwrap_or(0o755);
        if anc == Path::new("/") {
            new_root(&saved, scratch)?;
        } else {
            let d = cover(&anc, mode, &saved)?;
            scratch.devs.push(d);
        }
    }
    std::fs::create_dir_all(dest).map_err(step(format!("creating {}", dest.display())))
}

/// Replace `/` by a tmpfs holding binds of every original top-level entry.
fn new_root(saved: &[Saved], scratch: &mut Scratch) -> Result<(), NamespaceError> {
    let cwd = std::env::current_dir().ok();
    // Any directory will do to build the new root on: its original is among
    // the saved entries and is bound back from its descriptor.
    let base = saved
        .iter()
        .find(|s| s.kind.is_dir() && s.name == b"tmp")
        .or_else(|| saved.iter().find(|s| s.kind.is_dir()))
        .ok_or_else(|| {
            step("building a new root")(io::Error::other("/ has no directory to build it on"))
        })?;
    let staging = Path::new("/").join(OsStr::from_bytes(&base.name));
    let dev = cover(&staging, 0o755, saved)?;
    let old = staging.join(".sheaf-old-root");
    std::fs::create_dir(&old).map_err(step("building a new root"))?;
    let (n, o) = (
        cpath(&staging).map_err(step("pivot_root"))?,
        cpath(&old).map_err(step("pivot_root"))?,
    );
    // SAFETY: valid C strings.
    check(unsafe { libc::syscall(libc::SYS_pivot_root, n.as_ptr(), o.as_ptr()) as libc::c_int })
        .map_err(step("pivot_root"))?;
    // SAFETY: valid C strings.
    check(unsafe { libc::chdir(c"/".as_ptr()) }).map_err(step("chdir /"))?;
    // SAFETY: valid C string.
    check(unsafe { libc::umount2(c"/.sheaf-old-root".as_ptr(), libc::MNT_DETACH) })
        .map_err(step("detaching the old root"))?;
    let _ = std::fs::remove_dir("/.sheaf-old-root");
    if let Some(d) = cwd {
        let _ = std::env::set_current_dir(d);
    }
    scratch.devs.push(dev);
    Ok(())
}

/// Mount a copy of the mount at `from` (made outside the namespace, e.g. by
/// `fusermount3` where `/dev/fuse` is closed to users) on directory `to`.
pub fn clone_mount(from: &Path, to: &Path) -> Result<(), NamespaceError> {
    let what = || format!("moving {} to {}", from.display(), to.display());
    let tree = clone_tree(from, false).map_err(step(what()))?;
    attach_tree(&tree, to).map_err(step(what()))
}

/// Detach the mount at `path` (inside the namespace).
pub fn detach(path: &Path) -> io::Result<()> {
    let c = cpath(path)?;
    // SAFETY: valid C string.
    check(unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) })
}
