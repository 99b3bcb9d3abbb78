//! A container's root filesystem, assembled inside a private mount
//! namespace (see [`crate::namespace`]) around an image already mounted
//! writable at `root`: what `sheaf run --image` gives the command before it
//! `chroot`s there.
//!
//! - `/proc` and `/sys`: the host's, bound recursively (a user namespace
//!   without its own PID namespace may not mount a new proc);
//! - `/dev`: a fresh tmpfs holding only `null zero full random urandom tty`
//!   (bound from the host), `pts` (the host's), `shm` (a new tmpfs) and the
//!   usual links (`fd`, `stdin`, `stdout`, `stderr`, `ptmx`);
//! - the host directories asked for (home, `/tmp`, the working directory),
//!   at the same paths, read-write: the image's command can change them
//!   (`sheaf run --no-home` and `--contain` ask for fewer);
//! - a fresh empty tmpfs (`nosuid,nodev`) at each path asked for instead
//!   (the home and `/tmp` of `--contain`);
//! - the host's `/etc/resolv.conf`, `/etc/hosts`, `/etc/localtime`, each
//!   replacing what the image has there (an image's symlink there is
//!   replaced by a file first);
//! - `/etc/passwd` and `/etc/group`: the image's, plus a line for the
//!   user when it has none, so `id`, `whoami` and `ls -l` know them.
//!
//! The image is not trusted: any of its directories may be a symlink, to
//! an absolute path, climbing with `..`, or looping. Every path in it is
//! resolved inside the root, as the kernel would after `chroot`
//! ([`open_in_root`]: `openat2(2)` with `RESOLVE_IN_ROOT`, or a walk one
//! component at a time where the kernel lacks it); the mounts are made on
//! the descriptors found (by their `/proc/self/fd` names, as runc does);
//! directories and files are made or removed only on the image's own
//! filesystem, so a path the image leads into a host directory already
//! bound there (`/tmp`, say) is refused rather than changed; and nothing is
//! read unless it is a regular file of the image. Nothing outside the root
//! is removed, replaced or made.
//!
//! Nothing here is visible outside the namespace; the changes the mount
//! points need in the image (directories, files) go to its upper layer.
//! Without `--root` they are made as the user, who may not write where the
//! image's root owns the parent (e.g. `$HOME` under `/home`): such an
//! optional mount is left out, and [`assemble`] says which.

use crate::kernel::{c_string, cpath};
use crate::namespace::NamespaceError;
use std::collections::VecDeque;
use std::ffi::CStr;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

mod resolve;
use resolve::*;

/// What to put around the image.
#[derive(Debug, Clone, Default)]
pub struct Rootfs {
    /// Host directories to show at the same paths (e.g. `$HOME`, `/tmp`,
    /// the working directory); missing ones are skipped.
    pub binds: Vec<PathBuf>,
    /// Paths where a fresh empty tmpfs is mounted (after the binds), each
    /// with its mode (e.g. `/tmp` 0o1777, a home 0o700), owned by the
    /// user; one the user may not make in the image is left out (noted).
    pub tmpfs: Vec<(PathBuf, u32)>,
    /// The user the command runs as inside: name, uid, gid, home.
    pub user: Option<User>,
    /// Where to write the composed `/etc/passwd` and `/etc/group`.
    pub scratch: PathBuf,
}

/// A user to make known to the image.
#[derive(Debug, Clone)]
pub struct User {
    /// Login name.
    pub name: String,
    /// Uid inside.
    pub uid: u32,
    /// Gid inside.
    pub gid: u32,
    /// Home directory.
    pub home: String,
}

/// Host files that replace the image's.
pub const HOST_FILES: [&str; 3] = ["/etc/resolv.conf", "/etc/hosts", "/etc/localtime"];
const DEVICES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];

fn step(what: String) -> impl FnOnce(io::Error) -> NamespaceError {
    move |cause| NamespaceError::Step { what, cause }
}

fn mount(
    src: Option<&Path>,
    target: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> io::Result<()> {
    let src = src.map(cpath).transpose()?;
    let target = cpath(target)?;
    let fstype = fstype.map(|f| c_string(f.as_bytes())).transpose()?;
    let data = data.map(|d| c_string(d.as_bytes())).transpose()?;
    // SAFETY: valid C strings or null pointers.
    let r = unsafe {
        libc::mount(
            src.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
            target.as_ptr(),
            fstype.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
            flags,
            data.as_ref()
                .map_or(std::ptr::null(), |s| s.as_ptr().cast()),
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

// ---------------------------------------------------------------------------
// Resolving paths inside the root.

// Assembling.

/// The container's root, opened once.
struct Root {
    fd: OwnedFd,
    /// The filesystems of the image (see [`filesystems_under`]): the only
    /// ones anything is made on, removed from or read from.
    devs: Vec<libc::dev_t>,
}

impl Root {
    fn open(path: &Path) -> io::Result<Root> {
        let c = cpath(path)?;
        // SAFETY: a valid C string.
        let fd = check(unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        })?;
        // SAFETY: a new descriptor, owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let devs = filesystems_under(fd.as_fd())?;
        Ok(Root { fd, devs })
    }
}

/// Bind `host` onto the file or directory `at` (a descriptor).
fn bind_at(host: &Path, at: BorrowedFd, recursive: bool) -> io::Result<()> {
    let target = fd_path(at);
    let flags = libc::MS_BIND | if recursive { libc::MS_REC } else { 0 };
    match mount(Some(host), &target, None, flags, None) {
        // A user namespace may not bind a tree with locked submounts
        // without them.
        Err(e) if !recursive && e.raw_os_error() == Some(libc::EINVAL) => {
            mount(Some(host), &target, None, flags | libc::MS_REC, None)
        }
        r => r,
    }
}

/// Bind `host` (a directory or file) at the same path under `dir` (the
/// root, or the container's /dev with `host` relative to it), making the
/// mount point on one of `devs`.
fn bind(
    dir: BorrowedFd,
    devs: &[libc::dev_t],
    host: &Path,
    inside: &Path,
    recursive: bool,
) -> Result<(), NamespaceError> {
    let what = format!("binding {} into the container", host.display());
    let is_dir = std::fs::metadata(host)
        .map_err(step(what.clone()))?
        .is_dir();
    let at = if is_dir {
        mkdir_all_in_root(dir, inside, devs)
    } else {
        make_file_in_root(dir, inside, devs)
    }
    .map_err(step(what.clone()))?;
    bind_at(host, at.as_fd(), recursive).map_err(step(what))
}

/// [`bind`] at the same path in the root, where a mount point the user
/// may not make is only noted.
fn bind_optional(root: &Root, host: &Path, notes: &mut Vec<String>) -> Result<(), NamespaceError> {
    match bind(root.fd.as_fd(), &root.devs, host, host, false) {
        Err(NamespaceError::Step { cause, .. })
            if cause.kind() == io::ErrorKind::PermissionDenied =>
        {
            notes.push(format!(
                "{} is not in the image and you may not make it there (--root may); not bound",
                host.display()
            ));
            Ok(())
        }
        r => r,
    }
}

/// `text` (colon-separated lines) with `line` appended unless a line
/// already has `id` in field 2 (the uid of passwd, the gid of group).
fn with_line(text: &str, id: u32, line: String) -> String {
    let id = id.to_string();
    if text
        .lines()
        .any(|l| l.split(':').nth(2) == Some(id.as_str()))
    {
        return text.to_string();
    }
    let mut s = text.to_string();
    if !s.is_empty() && !s.ends_with('\n') {
        s.push('\n');
    }
    s.push_str(&line);
    s
}

/// `passwd` with a line for `u` added when no line has its uid.
pub fn passwd_with(passwd: &str, u: &User) -> String {
    let line = format!("{}:x:{}:{}::{}:/bin/sh\n", u.name, u.uid, u.gid, u.home);
    with_line(passwd, u.uid, line)
}

/// `group` with a line for the user's gid added when none has it.
pub fn group_with(group: &str, u: &User) -> String {
    with_line(group, u.gid, format!("{}:x:{}:\n", u.name, u.gid))
}

/// The container's `/dev` (see the module text).
fn make_dev(root: &Root) -> Result<(), NamespaceError> {
    let what = || "making the container's /dev".to_string();
    let under =
        mkdir_all_in_root(root.fd.as_fd(), Path::new("/dev"), &root.devs).map_err(step(what()))?;
    mount(
        None,
        &fd_path(under.as_fd()),
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NOEXEC,
        Some("mode=755,size=64k"),
    )
    .map_err(step(what()))?;
    // The tmpfs just mounted, found again by the same path.
    let dev = open_in_root(root.fd.as_fd(), Path::new("/dev")).map_err(step(what()))?;
    let dev_dev = fstat(dev.as_fd()).map_err(step(what()))?.st_dev;
    let under_dev = fstat(under.as_fd()).map_err(step(what()))?.st_dev;
    if dev_dev == under_dev || root.devs.contains(&dev_dev) {
        return Err(step(what())(io::Error::other(
            "the image's /dev changed while it was mounted",
        )));
    }
    drop(under);
    for d in DEVICES {
        let host = Path::new("/dev").join(d);
        if host.exists() {
            bind(dev.as_fd(), &[dev_dev], &host, Path::new(d), false)?;
        }
    }
    if Path::new("/dev/pts").is_dir() {
        bind(
            dev.as_fd(),
            &[dev_dev],
            Path::new("/dev/pts"),
            Path::new("pts"),
            true,
        )?;
    }
    let shm = mkdir_all_in_root(dev.as_fd(), Path::new("shm"), &[dev_dev]).map_err(step(what()))?;
    mount(
        None,
        &fd_path(shm.as_fd()),
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV,
        Some("mode=1777"),
    )
    .map_err(step(what()))?;
    for (link, target) in [
        ("fd", c"/proc/self/fd"),
        ("stdin", c"/proc/self/fd/0"),
        ("stdout", c"/proc/self/fd/1"),
        ("stderr", c"/proc/self/fd/2"),
        ("ptmx", c"pts/ptmx"),
    ] {
        let link = c_string(link.as_bytes()).map_err(step(what()))?;
        // SAFETY: valid C strings and descriptor.
        check(unsafe { libc::symlinkat(target.as_ptr(), dev.as_raw_fd(), link.as_ptr()) })
            .map_err(step(what()))?;
    }
    Ok(())
}

/// Write `text` to the host file `at` (in the scratch directory), mode
/// [`FILE_MODE`] whatever the umask: it is bound into the container.
fn write_scratch(at: &Path, text: &str) -> io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(FILE_MODE)
        .open(at)?;
    f.set_permissions(std::fs::Permissions::from_mode(FILE_MODE))?;
    f.write_all(text.as_bytes())
}

/// Assemble the root filesystem at `root` (see the module text). Returns
/// notes on optional mounts left out.
pub fn assemble(root: &Path, r: &Rootfs) -> Result<Vec<String>, NamespaceError> {
    let mut notes = Vec::new();
    let root = Root::open(root).map_err(step(format!(
        "opening the container's root {}",
        root.display()
    )))?;
    let rfd = root.fd.as_fd();
    for p in ["/proc", "/sys"] {
        bind(rfd, &root.devs, Path::new(p), Path::new(p), true)?;
    }
    make_dev(&root)?;
    for b in &r.binds {
        if b.is_dir() {
            bind_optional(&root, b, &mut notes)?;
        }
    }
    for (p, mode) in &r.tmpfs {
        let what = format!("making an empty {} in the container", p.display());
        let at = match mkdir_all_in_root(rfd, p, &root.devs) {
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                notes.push(format!(
                    "{} is not in the image and you may not make it there (--root may); left out",
                    p.display()
                ));
                continue;
            }
            r => r.map_err(step(what.clone()))?,
        };
        mount(
            None,
            &fd_path(at.as_fd()),
            Some("tmpfs"),
            libc::MS_NOSUID | libc::MS_NODEV,
            Some(&format!("mode={mode:o}")),
        )
        .map_err(step(what))?;
    }
    for f in HOST_FILES {
        if Path::new(f).exists() {
            bind_optional(&root, Path::new(f), &mut notes)?;
        }
    }
    if let Some(u) = &r.user {
        for (name, compose) in [
            ("passwd", passwd_with as fn(&str, &User) -> String),
            ("group", group_with),
        ] {
            let at = Path::new("/etc").join(name);
            let what = format!("making the container's /etc/{name}");
            let old = read_in_root(rfd, &at, &root.devs);
            let new = r.scratch.join(name);
            write_scratch(&new, &compose(&old, u)).map_err(step(what.clone()))?;
            let fd = match make_file_in_root(rfd, &at, &root.devs) {
                Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                    notes.push(format!("the image has no /etc/{name} and you may not make one; {} is not known to it", u.name));
                    continue;
                }
                r => r.map_err(step(what.clone()))?,
            };
            mount(Some(&new), &fd_path(fd.as_fd()), None, libc::MS_BIND, None)
                .map_err(step(what))?;
        }
    }
    Ok(notes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user() -> User {
        User {
            name: "ann".into(),
            uid: 1234,
            gid: 99,
            home: "/home/ann".into(),
        }
    }

    #[test]
    fn the_user_is_added_once() {
        let p = passwd_with("root:x:0:0::/root:/bin/sh", &user());
        assert_eq!(
            p,
            "root:x:0:0::/root:/bin/sh\nann:x:1234:99::/home/ann:/bin/sh\n"
        );
        assert_eq!(passwd_with(&p, &user()), p);
        let g = group_with("", &user());
        assert_eq!(g, "ann:x:99:\n");
        assert_eq!(group_with("users:x:99:\n", &user()), "users:x:99:\n");
    }
}
