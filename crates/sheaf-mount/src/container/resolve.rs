//! Resolving paths inside a container root: `openat2(RESOLVE_IN_ROOT |
//! RESOLVE_NO_MAGICLINKS)` where the kernel has it, else a walk that opens
//! one component at a time with `O_NOFOLLOW` and resolves each symlink
//! inside the root; making directories and files, and reading the image's
//! documents, only on the filesystems of the image ([`filesystems_under`]).

use super::*;

/// Symlinks followed in one resolution before giving up with `ELOOP` (the
/// kernel's own limit).
pub(super) const MAX_SYMLINKS: usize = 40;
/// The most of the image's `/etc/passwd` or `/etc/group` that is read.
pub(super) const MAX_DOCUMENT: u64 = 16 << 20;
/// Mode of the directories made in the image (whatever the umask: a
/// writable mount clears the process's).
pub(super) const DIR_MODE: libc::mode_t = 0o755;
/// Mode of the files made in the image.
pub(super) const FILE_MODE: libc::mode_t = 0o644;

pub(super) fn errno(e: i32) -> io::Error {
    io::Error::from_raw_os_error(e)
}

/// `r` (a syscall's return) as `Ok` unless it is negative.
pub(super) fn check(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// The error for a path that leaves the image's own filesystem where
/// something would have to be made or removed.
pub(super) fn outside() -> io::Error {
    io::Error::other("a symlink in the image leads out of it")
}

/// `openat(2)`, retried on `EINTR`.
pub(super) fn openat(
    dir: BorrowedFd,
    name: &CStr,
    flags: libc::c_int,
    mode: libc::mode_t,
) -> io::Result<OwnedFd> {
    loop {
        // SAFETY: a valid descriptor and C string.
        let r = unsafe {
            libc::openat(
                dir.as_raw_fd(),
                name.as_ptr(),
                flags | libc::O_CLOEXEC,
                mode as libc::c_uint,
            )
        };
        match check(r) {
            // SAFETY: a new descriptor, owned by nobody else.
            Ok(fd) => return Ok(unsafe { OwnedFd::from_raw_fd(fd) }),
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
            Err(e) => return Err(e),
        }
    }
}

/// `fstat(2)` (works on `O_PATH` descriptors).
pub(super) fn fstat(fd: BorrowedFd) -> io::Result<libc::stat> {
    // SAFETY: all-zero is a valid `stat`.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and buffer.
    check(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
    Ok(st)
}

pub(super) fn kind(st: &libc::stat) -> libc::mode_t {
    st.st_mode & libc::S_IFMT
}

/// The name under which the kernel reaches exactly `fd`'s file (a magic
/// link it follows to the inode, not to a path): mount targets and
/// reopening go through it.
pub(super) fn fd_path(fd: BorrowedFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// The target of the symlink `fd` (an `O_PATH|O_NOFOLLOW` descriptor).
pub(super) fn read_link(fd: BorrowedFd) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
    // SAFETY: a valid descriptor, an empty C string (the descriptor's own
    // link) and a buffer of the length given.
    let n = unsafe {
        libc::readlinkat(
            fd.as_raw_fd(),
            c"".as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let n = n as usize;
    if n >= buf.len() {
        return Err(errno(libc::ENAMETOOLONG));
    }
    buf.truncate(n);
    Ok(buf)
}

/// The components of `path`, without empty ones and `.`.
pub(super) fn components(path: &[u8]) -> impl DoubleEndedIterator<Item = &[u8]> {
    path.split(|&b| b == b'/')
        .filter(|c| !c.is_empty() && *c != b".")
}

/// Whether `openat2(2)` is known to be missing (`ENOSYS` seen once).
pub(super) static NO_OPENAT2: AtomicBool = AtomicBool::new(false);

/// `path` resolved by the kernel inside the directory `root`, as if `root`
/// were `/` (`RESOLVE_IN_ROOT`: absolute symlinks start again at `root`,
/// `..` stops there), following no magic link of /proc: an `O_PATH`
/// descriptor of what it names (a final symlink is followed too).
pub(super) fn openat2_in_root(root: BorrowedFd, path: &Path) -> io::Result<OwnedFd> {
    let rel: Vec<u8> = components(path.as_os_str().as_bytes())
        .collect::<Vec<_>>()
        .join(&b'/');
    let rel = c_string(if rel.is_empty() { b"." } else { &rel })?;
    // SAFETY: all-zero is a valid `open_how` (no flags).
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_PATH | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS;
    // With RESOLVE_IN_ROOT the kernel answers EAGAIN when a rename
    // elsewhere raced a `..`: try again, a few times.
    for _ in 0..16 {
        // SAFETY: a valid descriptor, C string and `open_how` of the size
        // given.
        let r = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                root.as_raw_fd(),
                rel.as_ptr(),
                &how as *const libc::open_how,
                std::mem::size_of::<libc::open_how>(),
            )
        };
        if r >= 0 {
            // SAFETY: a new descriptor, owned by nobody else.
            return Ok(unsafe { OwnedFd::from_raw_fd(r as libc::c_int) });
        }
        let e = io::Error::last_os_error();
        if !matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EINTR)) {
            return Err(e);
        }
    }
    Err(errno(libc::EAGAIN))
}

/// [`openat2_in_root`] done by hand, for kernels without `openat2(2)`
/// (before 5.6): one component at a time, each opened `O_NOFOLLOW`
/// relative to the directory before it; a symlink is read and its target
/// resolved in its place (an absolute one from `root`), `..` goes back to
/// the directory opened before (never above `root`), and more than
/// [`MAX_SYMLINKS`] links is `ELOOP` (filepath-securejoin's rules).
///
/// With `mkdir_on`, a missing directory is made (mode [`DIR_MODE`]), but
/// only where its parent is on one of those filesystems (the image's),
/// else [`outside`]: a dangling link then has its target made inside the
/// root.
pub(super) fn walk_in_root(
    root: BorrowedFd,
    path: &Path,
    mkdir_on: Option<&[libc::dev_t]>,
) -> io::Result<OwnedFd> {
    let mut todo: VecDeque<Vec<u8>> = components(path.as_os_str().as_bytes())
        .map(<[u8]>::to_vec)
        .collect();
    // The directories walked through below `root`, the last the current.
    let mut dirs: Vec<OwnedFd> = Vec::new();
    let mut links = 0;
    let mut made: Option<Vec<u8>> = None;
    while let Some(name) = todo.pop_front() {
        if name == b".." {
            dirs.pop();
            continue;
        }
        let cur = dirs.last().map_or(root, |d| d.as_fd());
        let cname = c_string(&name)?;
        let fd = match openat(cur, &cname, libc::O_PATH | libc::O_NOFOLLOW, 0) {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => match mkdir_on {
                // Just made, and gone again: give up rather than loop.
                Some(devs) if made.as_deref() != Some(&name[..]) => {
                    make_dir_at(cur, &cname, devs)?;
                    made = Some(name.clone());
                    todo.push_front(name);
                    continue;
                }
                _ => return Err(e),
            },
            r => r?,
        };
        made = None;
        let st = fstat(fd.as_fd())?;
        match kind(&st) {
            libc::S_IFLNK => {
                links += 1;
                if links > MAX_SYMLINKS {
                    return Err(errno(libc::ELOOP));
                }
                let target = read_link(fd.as_fd())?;
                if target.starts_with(b"/") {
                    dirs.clear();
                }
                for c in components(&target).rev() {
                    todo.push_front(c.to_vec());
                }
            }
            libc::S_IFDIR => dirs.push(fd),
            _ if todo.is_empty() => return Ok(fd),
            _ => return Err(errno(libc::ENOTDIR)),
        }
    }
    match dirs.pop() {
        Some(d) => Ok(d),
        None => root.try_clone_to_owned(),
    }
}

/// `path` resolved inside `root` (see [`openat2_in_root`]; [`walk_in_root`]
/// where the kernel has no `openat2`): an `O_PATH` descriptor.
pub(super) fn open_in_root(root: BorrowedFd, path: &Path) -> io::Result<OwnedFd> {
    if !NO_OPENAT2.load(Ordering::Relaxed) {
        match openat2_in_root(root, path) {
            Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => {
                NO_OPENAT2.store(true, Ordering::Relaxed);
            }
            // A seccomp filter refusing the call, or renames racing it
            // each time: the walk decides.
            Err(e) if matches!(e.raw_os_error(), Some(libc::EPERM | libc::EAGAIN)) => {}
            r => return r,
        }
    }
    walk_in_root(root, path, None)
}

/// Refuse to change `dir` unless it is on one of the filesystems `devs`.
pub(super) fn on(dir: BorrowedFd, devs: &[libc::dev_t]) -> io::Result<()> {
    if devs.contains(&fstat(dir)?.st_dev) {
        Ok(())
    } else {
        Err(outside())
    }
}

/// Make the directory `name` in `dir` (on one of `devs`), mode
/// [`DIR_MODE`]; one there already is left as it is.
pub(super) fn make_dir_at(dir: BorrowedFd, name: &CStr, devs: &[libc::dev_t]) -> io::Result<()> {
    on(dir, devs)?;
    // SAFETY: a valid descriptor and C string.
    match check(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), DIR_MODE) }) {
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => return Ok(()),
        r => r?,
    };
    let d = openat(
        dir,
        name,
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
        0,
    )?;
    // SAFETY: a valid descriptor.
    check(unsafe { libc::fchmod(d.as_raw_fd(), DIR_MODE) })?;
    Ok(())
}

/// The directory `path` inside `root`, made (with its parents, on the
/// filesystems `devs` only) if missing: an `O_PATH` descriptor.
pub(super) fn mkdir_all_in_root(
    root: BorrowedFd,
    path: &Path,
    devs: &[libc::dev_t],
) -> io::Result<OwnedFd> {
    let fd = match open_in_root(root, path) {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => walk_in_root(root, path, Some(devs))?,
        r => r?,
    };
    if kind(&fstat(fd.as_fd())?) != libc::S_IFDIR {
        return Err(errno(libc::ENOTDIR));
    }
    Ok(fd)
}

/// Make `name` in `dir` a regular file: one there is kept; a symlink,
/// fifo, device or socket is removed and an empty file (mode
/// [`FILE_MODE`]) made instead, on the filesystems `devs` only; a directory
/// is an error. An `O_PATH` descriptor of the file.
pub(super) fn make_file_at(
    dir: BorrowedFd,
    name: &CStr,
    devs: &[libc::dev_t],
) -> io::Result<OwnedFd> {
    for _ in 0..8 {
        match openat(dir, name, libc::O_PATH | libc::O_NOFOLLOW, 0) {
            Ok(fd) => match kind(&fstat(fd.as_fd())?) {
                libc::S_IFREG => return Ok(fd),
                libc::S_IFDIR => return Err(io::Error::other("is a directory in the image")),
                _ => {
                    on(dir, devs)?;
                    // SAFETY: a valid descriptor and C string.
                    match check(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), 0) }) {
                        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                        r => {
                            r?;
                        }
                    }
                }
            },
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                on(dir, devs)?;
                match openat(
                    dir,
                    name,
                    libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
                    FILE_MODE,
                ) {
                    Ok(f) => {
                        // SAFETY: a valid descriptor.
                        check(unsafe { libc::fchmod(f.as_raw_fd(), FILE_MODE) })?;
                    }
                    Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
                    Err(e) => return Err(e),
                }
            }
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::other("changed while being replaced"))
}

/// [`make_file_at`] for `path` inside `root`, its parents made as by
/// [`mkdir_all_in_root`].
pub(super) fn make_file_in_root(
    root: BorrowedFd,
    path: &Path,
    devs: &[libc::dev_t],
) -> io::Result<OwnedFd> {
    let name = path.file_name().ok_or_else(|| errno(libc::EINVAL))?;
    let parent = path.parent().unwrap_or(Path::new("/"));
    let dir = mkdir_all_in_root(root, parent, devs)?;
    make_file_at(dir.as_fd(), &c_string(name.as_bytes())?, devs)
}

/// The text of `path` in the image (inside `root`, on `devs`): empty unless
/// it is a regular file there; at most [`MAX_DOCUMENT`] bytes.
pub(super) fn read_in_root(root: BorrowedFd, path: &Path, devs: &[libc::dev_t]) -> String {
    let read = || -> io::Result<Vec<u8>> {
        let fd = open_in_root(root, path)?;
        let st = fstat(fd.as_fd())?;
        if kind(&st) != libc::S_IFREG || !devs.contains(&st.st_dev) {
            return Ok(Vec::new());
        }
        // The very file checked (a regular one: opening it cannot block).
        let mut out = Vec::new();
        std::fs::File::open(fd_path(fd.as_fd()))?
            .take(MAX_DOCUMENT)
            .read_to_end(&mut out)?;
        Ok(out)
    };
    read()
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------
/// The filesystems mounted at or below the directory `root` before the
/// container is assembled, besides its own: the image (under a tmpfs when
/// sheaf covered it to make a `--mount` destination), sheaf's tmpfs
/// covers and the `--mount` images: all sheaf's own. What is bound there
/// from the host afterwards (`/proc`, `/sys`, `/tmp`, ...) is not among
/// them, so a symlink of the image leading into it changes nothing there.
pub(super) fn filesystems_under(root: BorrowedFd) -> io::Result<Vec<libc::dev_t>> {
    let mut devs = vec![fstat(root)?.st_dev];
    let at = std::fs::read_link(fd_path(root))?;
    for m in crate::kernel::mount_table()? {
        if m.mountpoint.starts_with(&at) && !devs.contains(&m.dev) {
            devs.push(m.dev);
        }
    }
    Ok(devs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, MetadataExt};

    /// A root full of hostile links next to an `outside` directory they
    /// aim at, which must never change.
    struct Fixture {
        _t: tempfile::TempDir,
        root: PathBuf,
        outside: PathBuf,
        fd: OwnedFd,
        dev: libc::dev_t,
    }

    fn fixture() -> Fixture {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        let outside = t.path().join("outside");
        std::fs::create_dir_all(root.join("usr/lib")).unwrap();
        std::fs::write(root.join("usr/lib/real"), "in").unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("passwd"), "secret").unwrap();
        symlink("/usr/share/zoneinfo/UTC", outside.join("localtime")).unwrap();
        let o = outside.to_str().unwrap();
        let links: [(&str, String); 8] = [
            ("lib", "usr/lib".into()),
            ("abs", "/lib".into()),
            ("up", "..".into()),
            ("etc", o.into()),
            ("climb", format!("../../../../../../../..{o}")),
            ("loop_a", "loop_b".into()),
            ("loop_b", "/loop_a".into()),
            ("dangling", "/made/here".into()),
        ];
        for (name, target) in links {
            symlink(target, root.join(name)).unwrap();
        }
        let c = cpath(&root).unwrap();
        // SAFETY: a valid C string.
        let fd =
            check(unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_DIRECTORY) }).unwrap();
        // SAFETY: new.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let dev = fstat(fd.as_fd()).unwrap().st_dev;
        Fixture {
            _t: t,
            root,
            outside,
            fd,
            dev,
        }
    }

    /// Every entry of `dir` with its type, mode, size, mtime, content.
    fn listing(dir: &Path) -> Vec<String> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            let body = if m.is_file() {
                std::fs::read_to_string(&p).unwrap()
            } else if m.file_type().is_symlink() {
                std::fs::read_link(&p).unwrap().display().to_string()
            } else {
                String::new()
            };
            out.push(format!(
                "{} {:o} {} {}.{} {body}",
                p.display(),
                m.mode(),
                m.size(),
                m.mtime(),
                m.mtime_nsec()
            ));
        }
        out.sort();
        out
    }

    fn ino(fd: &OwnedFd) -> u64 {
        fstat(fd.as_fd()).unwrap().st_ino
    }

    fn ino_of(p: &Path) -> u64 {
        std::fs::symlink_metadata(p).unwrap().ino()
    }

    fn os_err<T: std::fmt::Debug>(r: io::Result<T>) -> i32 {
        r.unwrap_err().raw_os_error().unwrap_or(-1)
    }

    /// The resolvers: the kernel's (where it has openat2) and the walk.
    type Resolve = fn(BorrowedFd, &Path) -> io::Result<OwnedFd>;

    fn resolvers() -> Vec<(&'static str, Resolve)> {
        fn walk(root: BorrowedFd, path: &Path) -> io::Result<OwnedFd> {
            walk_in_root(root, path, None)
        }
        let mut v = vec![("walk", walk as Resolve)];
        let f = fixture();
        let e = openat2_in_root(f.fd.as_fd(), Path::new("/")).err();
        if e.and_then(|e| e.raw_os_error()) != Some(libc::ENOSYS) {
            v.push(("openat2", openat2_in_root as Resolve));
        } else {
            eprintln!("no openat2 here: the walk alone is tested");
        }
        v
    }

    #[test]
    fn paths_resolve_inside_the_root_by_both_resolvers() {
        for (how, resolve) in resolvers() {
            let f = fixture();
            let before = listing(&f.outside);
            let r = |p: &str| resolve(f.fd.as_fd(), Path::new(p));
            let real = ino_of(&f.root.join("usr/lib/real"));
            for p in [
                "usr/lib/real",
                "/lib/real",
                "abs/real",
                "lib/../lib/real",
                "../../../usr/lib/real",
                "up/up/up/abs/real",
                "/up/lib/./real",
            ] {
                assert_eq!(ino(&r(p).unwrap()), real, "{how}: {p}");
            }
            for p in ["/", "..", "up", "up/..", "lib/../.."] {
                assert_eq!(ino(&r(p).unwrap()), ino_of(&f.root), "{how}: {p}");
            }
            // The hostile links lead to paths inside the root, not out.
            for p in ["etc/passwd", "climb/passwd", "etc", "climb/localtime"] {
                assert_eq!(os_err(r(p)), libc::ENOENT, "{how}: {p}");
            }
            assert_eq!(os_err(r("loop_a")), libc::ELOOP, "{how}");
            assert_eq!(os_err(r("loop_b/x")), libc::ELOOP, "{how}");
            assert_eq!(os_err(r("usr/lib/real/x")), libc::ENOTDIR, "{how}");
            assert_eq!(os_err(r("dangling")), libc::ENOENT, "{how}");
            assert_eq!(listing(&f.outside), before, "{how}");
        }
    }

    #[test]
    fn too_many_links_are_a_loop_and_forty_are_not() {
        for (how, resolve) in resolvers() {
            let f = fixture();
            // l0 -> l1 -> ... -> l40 -> usr: 41 links from l0, 40 from l1.
            for i in 0..40 {
                symlink(format!("l{}", i + 1), f.root.join(format!("l{i}"))).unwrap();
            }
            symlink("usr", f.root.join("l40")).unwrap();
            let r = |p: &str| resolve(f.fd.as_fd(), Path::new(p));
            assert_eq!(os_err(r("l0/lib/real")), libc::ELOOP, "{how}");
            assert_eq!(
                ino(&r("l1/lib/real").unwrap()),
                ino_of(&f.root.join("usr/lib/real")),
                "{how}"
            );
        }
    }

    #[test]
    fn directories_are_made_inside_the_root_and_only_on_its_filesystem() {
        let f = fixture();
        let before = listing(&f.outside);
        let o = f.outside.strip_prefix("/").unwrap();
        let fd = mkdir_all_in_root(f.fd.as_fd(), Path::new("/etc/sub"), &[f.dev]).unwrap();
        let inside = f.root.join(o).join("sub");
        assert_eq!(ino(&fd), ino_of(&inside));
        assert_eq!(std::fs::metadata(&inside).unwrap().mode() & 0o7777, 0o755);
        let fd = mkdir_all_in_root(f.fd.as_fd(), Path::new("climb/other"), &[f.dev]).unwrap();
        assert_eq!(ino(&fd), ino_of(&f.root.join(o).join("other")));
        // A dangling link's target is made, inside.
        let fd = mkdir_all_in_root(f.fd.as_fd(), Path::new("dangling/x"), &[f.dev]).unwrap();
        assert_eq!(ino(&fd), ino_of(&f.root.join("made/here/x")));
        // The walk alone does the same.
        let fd = walk_in_root(f.fd.as_fd(), Path::new("/up/etc/walked"), Some(&[f.dev])).unwrap();
        assert_eq!(ino(&fd), ino_of(&f.root.join(o).join("walked")));
        let e = mkdir_all_in_root(f.fd.as_fd(), Path::new("loop_a/x"), &[f.dev]);
        assert_eq!(os_err(e), libc::ELOOP);
        let e = mkdir_all_in_root(f.fd.as_fd(), Path::new("usr/lib/real/x"), &[f.dev]);
        assert_eq!(os_err(e), libc::ENOTDIR);
        // On another filesystem (here: said to be) nothing is made.
        let e = mkdir_all_in_root(f.fd.as_fd(), Path::new("new/dir"), &[f.dev + 1]).unwrap_err();
        assert_eq!(e.to_string(), outside().to_string());
        assert!(!f.root.join("new").exists());
        assert_eq!(listing(&f.outside), before);
    }

    #[test]
    fn files_are_made_or_replaced_inside_the_root_only() {
        let f = fixture();
        let before = listing(&f.outside);
        let o = f.outside.strip_prefix("/").unwrap();
        let make = |p: &str| make_file_in_root(f.fd.as_fd(), Path::new(p), &[f.dev]);
        // Through the absolute and the climbing link: made inside.
        for p in ["/etc/passwd", "climb/localtime"] {
            let fd = make(p).unwrap();
            let name = Path::new(p).file_name().unwrap();
            let inside = f.root.join(o).join(name);
            assert_eq!(ino(&fd), ino_of(&inside), "{p}");
            let m = std::fs::symlink_metadata(&inside).unwrap();
            assert!(
                m.is_file() && m.len() == 0 && m.mode() & 0o7777 == 0o644,
                "{p}"
            );
        }
        // A last component that is a link (here to a file outside), a fifo
        // or a socket is replaced; a regular file kept; a directory refused.
        std::fs::create_dir(f.root.join("e")).unwrap();
        symlink(f.outside.join("passwd"), f.root.join("e/hosts")).unwrap();
        let c = cpath(&f.root.join("e/fifo")).unwrap();
        // SAFETY: a valid C string.
        check(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }).unwrap();
        std::os::unix::net::UnixListener::bind(f.root.join("e/sock")).unwrap();
        std::fs::write(f.root.join("e/kept"), "kept").unwrap();
        std::fs::create_dir(f.root.join("e/dir")).unwrap();
        for n in ["hosts", "fifo", "sock"] {
            let fd = make(&format!("e/{n}")).unwrap();
            let m = std::fs::symlink_metadata(f.root.join("e").join(n)).unwrap();
            assert!(m.is_file() && m.len() == 0, "{n}");
            assert_eq!(ino(&fd), m.ino(), "{n}");
        }
        make("e/kept").unwrap();
        assert_eq!(std::fs::read(f.root.join("e/kept")).unwrap(), b"kept");
        let e = make("e/dir").unwrap_err();
        assert!(e.to_string().contains("is a directory in the image"), "{e}");
        assert_eq!(os_err(make("loop_a/x")), libc::ELOOP);
        // Not on the image's filesystem: neither removed nor made.
        symlink("x", f.root.join("e/link")).unwrap();
        for n in ["e/link", "e/absent"] {
            let e = make_file_in_root(f.fd.as_fd(), Path::new(n), &[f.dev + 1]).unwrap_err();
            assert_eq!(e.to_string(), outside().to_string(), "{n}");
        }
        assert!(std::fs::symlink_metadata(f.root.join("e/link"))
            .unwrap()
            .file_type()
            .is_symlink());
        assert!(!f.root.join("e/absent").exists());
        assert_eq!(listing(&f.outside), before);
    }

    #[test]
    fn the_filesystems_under_a_directory_come_from_mountinfo() {
        let f = fixture();
        assert_eq!(filesystems_under(f.fd.as_fd()).unwrap(), vec![f.dev]);
        let c = cpath(Path::new("/")).unwrap();
        // SAFETY: a valid C string.
        let fd =
            check(unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_DIRECTORY) }).unwrap();
        // SAFETY: new.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let all = filesystems_under(fd.as_fd()).unwrap();
        let proc_dev = std::fs::metadata("/proc").unwrap().dev();
        assert!(all.contains(&proc_dev), "{all:?}");
    }

    #[test]
    fn only_a_regular_file_of_the_image_is_read() {
        let f = fixture();
        let read = |p: &str| read_in_root(f.fd.as_fd(), Path::new(p), &[f.dev]);
        std::fs::create_dir(f.root.join("e")).unwrap();
        std::fs::write(f.root.join("e/passwd"), "root:x:0:0::/:/bin/sh\n").unwrap();
        symlink("/e/passwd", f.root.join("e/link")).unwrap();
        let c = cpath(&f.root.join("e/fifo")).unwrap();
        // SAFETY: a valid C string.
        check(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }).unwrap();
        assert_eq!(read("e/passwd"), "root:x:0:0::/:/bin/sh\n");
        assert_eq!(read("e/link"), "root:x:0:0::/:/bin/sh\n");
        // A fifo is not opened (that would block), the host's file is not
        // reached, nor one on another filesystem.
        assert_eq!(read("e/fifo"), "");
        assert_eq!(read("etc/passwd"), "");
        assert_eq!(read("e"), "");
        assert_eq!(
            read_in_root(f.fd.as_fd(), Path::new("e/passwd"), &[f.dev + 1]),
            ""
        );
    }
}
