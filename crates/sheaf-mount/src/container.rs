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
//!   at the same paths;
//! - the host's `/etc/resolv.conf`, `/etc/hosts`, `/etc/localtime`, each
//!   replacing what the image has there (an image's symlink is replaced by
//!   a file first: an absolute link would resolve on the host);
//! - `/etc/passwd` and `/etc/group`: the image's, plus a line for the
//!   user when it has none, so `id`, `whoami` and `ls -l` know them.
//!
//! Nothing here is visible outside the namespace; the changes the mount
//! points need in the image (directories, files) go to its upper layer.
//! Without `--root` they are made as the user, who may not write where the
//! image's root owns the parent (e.g. `$HOME` under `/home`): such an
//! optional mount is left out, and [`assemble`] says which.

use crate::kernel::{c_string, cpath};
use crate::namespace::NamespaceError;
use std::io;
use std::path::{Path, PathBuf};

/// What to put around the image.
#[derive(Debug, Clone, Default)]
pub struct Rootfs {
    /// Host directories to show at the same paths (e.g. `$HOME`, `/tmp`,
    /// the working directory); missing ones are skipped.
    pub binds: Vec<PathBuf>,
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

/// Bind `host` (a directory or file) at the same path under `root`,
/// creating the mount point in the image.
fn bind(root: &Path, host: &Path, recursive: bool) -> Result<(), NamespaceError> {
    let rel = host.strip_prefix("/").unwrap_or(host);
    let at = root.join(rel);
    let what = format!("binding {} into the container", host.display());
    let is_dir = std::fs::metadata(host)
        .map_err(step(what.clone()))?
        .is_dir();
    if is_dir {
        std::fs::create_dir_all(&at).map_err(step(what.clone()))?;
    } else {
        make_file(&at).map_err(step(what.clone()))?;
    }
    let flags = libc::MS_BIND | if recursive { libc::MS_REC } else { 0 };
    match mount(Some(host), &at, None, flags, None) {
        // A user namespace may not bind a tree with locked submounts
        // without them.
        Err(e) if !recursive && e.raw_os_error() == Some(libc::EINVAL) => {
            mount(Some(host), &at, None, flags | libc::MS_REC, None).map_err(step(what))
        }
        r => r.map_err(step(what)),
    }
}

/// [`bind`], where a mount point the user may not make is only noted.
fn bind_optional(root: &Path, host: &Path, notes: &mut Vec<String>) -> Result<(), NamespaceError> {
    match bind(root, host, false) {
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

/// Make `at` a regular file (replacing a symlink, which could point out).
fn make_file(at: &Path) -> io::Result<()> {
    match std::fs::symlink_metadata(at) {
        Ok(m) if m.file_type().is_file() => return Ok(()),
        Ok(m) if m.is_dir() => return Err(io::Error::other("is a directory in the image")),
        Ok(_) => std::fs::remove_file(at)?,
        Err(_) => {}
    }
    if let Some(p) = at.parent() {
        std::fs::create_dir_all(p)?;
    }
    std::fs::File::create(at).map(drop)
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

/// Assemble the root filesystem at `root` (see the module text). Returns
/// notes on optional mounts left out.
pub fn assemble(root: &Path, r: &Rootfs) -> Result<Vec<String>, NamespaceError> {
    let mut notes = Vec::new();
    bind(root, Path::new("/proc"), true)?;
    bind(root, Path::new("/sys"), true)?;
    let dev = root.join("dev");
    let what = || "making the container's /dev".to_string();
    std::fs::create_dir_all(&dev).map_err(step(what()))?;
    mount(
        None,
        &dev,
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NOEXEC,
        Some("mode=755,size=64k"),
    )
    .map_err(step(what()))?;
    for d in DEVICES {
        let host = Path::new("/dev").join(d);
        if host.exists() {
            bind(root, &host, false)?;
        }
    }
    if Path::new("/dev/pts").is_dir() {
        bind(root, Path::new("/dev/pts"), true)?;
    }
    std::fs::create_dir_all(dev.join("shm")).map_err(step(what()))?;
    mount(
        None,
        &dev.join("shm"),
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV,
        Some("mode=1777"),
    )
    .map_err(step(what()))?;
    for (link, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
        ("ptmx", "pts/ptmx"),
    ] {
        std::os::unix::fs::symlink(target, dev.join(link)).map_err(step(what()))?;
    }
    for b in &r.binds {
        if b.is_dir() {
            bind_optional(root, b, &mut notes)?;
        }
    }
    for f in HOST_FILES {
        if Path::new(f).exists() {
            bind_optional(root, Path::new(f), &mut notes)?;
        }
    }
    if let Some(u) = &r.user {
        for (name, compose) in [
            ("passwd", passwd_with as fn(&str, &User) -> String),
            ("group", group_with),
        ] {
            let at = root.join("etc").join(name);
            let what = format!("making the container's /etc/{name}");
            let old = std::fs::read_to_string(&at).unwrap_or_default();
            let new = r.scratch.join(name);
            std::fs::write(&new, compose(&old, u)).map_err(step(what.clone()))?;
            match make_file(&at) {
                Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                    notes.push(format!("the image has no /etc/{name} and you may not make one; {} is not known to it", u.name));
                    continue;
                }
                r => r.map_err(step(what.clone()))?,
            }
            mount(Some(&new), &at, None, libc::MS_BIND, None).map_err(step(what))?;
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
