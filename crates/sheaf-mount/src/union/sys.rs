//! The system calls the union makes on its upper directory, as small safe
//! functions returning the FUSE errno to reply with.
//!
//! Most go through `nix`; the extended-attribute calls, which `nix` lacks,
//! are written here against `libc`, and with a zeroed `stat` they are the
//! only `unsafe` code of the union (its other modules deny it). Names are byte strings (a name with a NUL byte is `EINVAL`).
//! Descriptors are `O_PATH` ones for objects the union only names: what
//! cannot take one (chmod, truncate, xattrs, reopening) goes through
//! `/proc/self/fd/N`, which names the object the descriptor holds however it
//! has been renamed since.

use fuser::Errno;
use nix::fcntl::{OFlag, AT_FDCWD};
use nix::sys::stat::{FchmodatFlags, Mode, SFlag, UtimensatFlags};
use nix::sys::time::TimeSpec;
use nix::unistd::{Gid, Uid, UnlinkatFlags};
use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// The errno of an I/O error (`EIO` if it carries none).
pub(super) fn errno_of(e: &io::Error) -> Errno {
    Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO))
}

/// The FUSE errno of a `nix` one (both are the kernel's numbers).
fn nix(e: nix::errno::Errno) -> Errno {
    Errno::from_i32(e as i32)
}

fn cstr(b: &[u8]) -> Result<CString, Errno> {
    CString::new(b).map_err(|_| Errno::EINVAL)
}

/// `/proc/self/fd/N`: reopens or changes the object an `O_PATH` fd names.
pub(super) fn fd_path(fd: BorrowedFd<'_>) -> Vec<u8> {
    format!("/proc/self/fd/{}", fd.as_raw_fd()).into_bytes()
}

/// `/proc/self/fd/N/NAME`: entry `name` of directory `dir`.
fn fd_child_path(dir: BorrowedFd<'_>, name: &[u8]) -> Vec<u8> {
    [&fd_path(dir)[..], b"/", name].concat()
}

/// An all-zero `stat` (a negative lookup's attributes).
pub(super) fn zero_stat() -> libc::stat {
    // SAFETY: `stat` is plain integers, for which all-zero bytes are valid.
    unsafe { std::mem::zeroed() }
}

/// `lstat` of `name` in `dir` (never follows a symlink).
pub(super) fn stat_at(dir: BorrowedFd<'_>, name: &[u8]) -> Result<libc::stat, Errno> {
    nix::sys::stat::fstatat(dir, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW).map_err(nix)
}

/// `stat` of the object `fd` holds (an `O_PATH` descriptor works).
pub(super) fn stat_fd(fd: BorrowedFd<'_>) -> Result<libc::stat, Errno> {
    use nix::fcntl::AtFlags;
    nix::sys::stat::fstatat(
        fd,
        b"".as_slice(),
        AtFlags::AT_EMPTY_PATH | AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .map_err(nix)
}

/// Whether `dir` holds an entry `name`.
pub(super) fn exists_at(dir: BorrowedFd<'_>, name: &[u8]) -> bool {
    stat_at(dir, name).is_ok()
}

/// An `O_PATH` descriptor of `name` in `dir` (a symlink itself, not its
/// target).
pub(super) fn open_path_at(dir: BorrowedFd<'_>, name: &[u8]) -> Result<OwnedFd, Errno> {
    nix::fcntl::openat(
        dir,
        name,
        OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(nix)
}

/// An `O_PATH` descriptor of directory `path` (an I/O error: the caller
/// reports it with the path).
pub(super) fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
        .open(path)
        .map(OwnedFd::from)
}

/// Open `name` in `dir` with `flags` (which include `O_CREAT` and the like)
/// and `mode`.
pub(super) fn open_at(
    dir: BorrowedFd<'_>,
    name: &[u8],
    flags: i32,
    mode: u32,
) -> Result<File, Errno> {
    let fd = nix::fcntl::openat(
        dir,
        name,
        OFlag::from_bits_retain(flags),
        Mode::from_bits_retain(mode),
    )
    .map_err(nix)?;
    Ok(File::from(fd))
}

/// Make an empty regular file `name` in `dir` if it is missing (a whiteout
/// or an opaque marker).
pub(super) fn touch_at(dir: BorrowedFd<'_>, name: &[u8]) -> Result<(), Errno> {
    open_at(
        dir,
        name,
        libc::O_WRONLY | libc::O_CREAT | libc::O_CLOEXEC,
        0o600,
    )
    .map(drop)
}

/// Open the object an `O_PATH` descriptor holds, for I/O with `flags`.
pub(super) fn reopen(fd: BorrowedFd<'_>, flags: i32) -> Result<File, Errno> {
    let fd = nix::fcntl::open(
        fd_path(fd).as_slice(),
        OFlag::from_bits_retain(flags),
        Mode::empty(),
    )
    .map_err(nix)?;
    Ok(File::from(fd))
}

/// Remove `name` from `dir`: a directory with `is_dir`, else anything else.
pub(super) fn unlink_at(dir: BorrowedFd<'_>, name: &[u8], is_dir: bool) -> Result<(), Errno> {
    let how = if is_dir {
        UnlinkatFlags::RemoveDir
    } else {
        UnlinkatFlags::NoRemoveDir
    };
    nix::unistd::unlinkat(dir, name, how).map_err(nix)
}

/// `renameat2`, with `RENAME_NOREPLACE` when `noreplace`.
pub(super) fn rename_at(
    from: BorrowedFd<'_>,
    name: &[u8],
    to: BorrowedFd<'_>,
    newname: &[u8],
    noreplace: bool,
) -> Result<(), Errno> {
    let (a, b) = (cstr(name)?, cstr(newname)?);
    let flags: libc::c_uint = if noreplace { libc::RENAME_NOREPLACE } else { 0 };
    // The system call itself: not every C library wraps renameat2 (musl
    // of the static build does not).
    // SAFETY: valid descriptors and NUL-terminated names.
    let r = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            from.as_raw_fd(),
            a.as_ptr(),
            to.as_raw_fd(),
            b.as_ptr(),
            flags,
        )
    };
    if r < 0 {
        return Err(last());
    }
    Ok(())
}

/// `mkdirat`.
pub(super) fn mkdir_at(dir: BorrowedFd<'_>, name: &[u8], mode: u32) -> Result<(), Errno> {
    nix::sys::stat::mkdirat(dir, name, Mode::from_bits_retain(mode)).map_err(nix)
}

/// `symlinkat`: `name` in `dir`, pointing to `target`.
pub(super) fn symlink_at(target: &[u8], dir: BorrowedFd<'_>, name: &[u8]) -> Result<(), Errno> {
    nix::unistd::symlinkat(target, dir, name).map_err(nix)
}

/// `mknodat` with a whole mode (type and permissions).
pub(super) fn mknod_at(
    dir: BorrowedFd<'_>,
    name: &[u8],
    mode: u32,
    dev: libc::dev_t,
) -> Result<(), Errno> {
    nix::sys::stat::mknodat(
        dir,
        name,
        SFlag::from_bits_retain(mode & libc::S_IFMT),
        Mode::from_bits_retain(mode & !libc::S_IFMT),
        dev,
    )
    .map_err(nix)
}

/// A new name `name` in `dir` for the object `fd` holds.
pub(super) fn link_at(fd: BorrowedFd<'_>, dir: BorrowedFd<'_>, name: &[u8]) -> Result<(), Errno> {
    nix::unistd::linkat(
        AT_FDCWD,
        fd_path(fd).as_slice(),
        dir,
        name,
        nix::fcntl::AtFlags::AT_SYMLINK_FOLLOW,
    )
    .map_err(nix)
}

fn ids(uid: Option<u32>, gid: Option<u32>) -> (Option<Uid>, Option<Gid>) {
    (uid.map(Uid::from_raw), gid.map(Gid::from_raw))
}

/// `lchown` of `name` in `dir` (`None`: unchanged).
pub(super) fn chown_at(
    dir: BorrowedFd<'_>,
    name: &[u8],
    uid: Option<u32>,
    gid: Option<u32>,
) -> Result<(), Errno> {
    let (u, g) = ids(uid, gid);
    nix::unistd::fchownat(dir, name, u, g, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW).map_err(nix)
}

/// `lchown` of the object `fd` holds (`None`: unchanged).
pub(super) fn chown_fd(
    fd: BorrowedFd<'_>,
    uid: Option<u32>,
    gid: Option<u32>,
) -> Result<(), Errno> {
    use nix::fcntl::AtFlags;
    let (u, g) = ids(uid, gid);
    nix::unistd::fchownat(
        fd,
        b"".as_slice(),
        u,
        g,
        AtFlags::AT_EMPTY_PATH | AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .map_err(nix)
}

/// `chmod` of `name` in `dir` (follows a symlink, as `chmod` does).
pub(super) fn chmod_at(dir: BorrowedFd<'_>, name: &[u8], mode: u32) -> Result<(), Errno> {
    nix::sys::stat::fchmodat(
        dir,
        name,
        Mode::from_bits_retain(mode),
        FchmodatFlags::FollowSymlink,
    )
    .map_err(nix)
}

/// `chmod` of the object `fd` holds.
pub(super) fn chmod_fd(fd: BorrowedFd<'_>, mode: u32) -> Result<(), Errno> {
    chmod_at(AT_FDCWD, &fd_path(fd), mode)
}

/// `truncate` of the object `fd` holds.
pub(super) fn truncate_fd(fd: BorrowedFd<'_>, size: u64) -> Result<(), Errno> {
    nix::unistd::truncate(fd_path(fd).as_slice(), size as libc::off_t).map_err(nix)
}

/// `utimensat` of `name` in `dir`, never following a symlink.
pub(super) fn utimens_at(
    dir: BorrowedFd<'_>,
    name: &[u8],
    times: [libc::timespec; 2],
) -> Result<(), Errno> {
    let [a, m] = times.map(TimeSpec::from);
    nix::sys::stat::utimensat(dir, name, &a, &m, UtimensatFlags::NoFollowSymlink).map_err(nix)
}

/// `utimensat` of the object `fd` holds.
pub(super) fn utimens_fd(fd: BorrowedFd<'_>, times: [libc::timespec; 2]) -> Result<(), Errno> {
    let [a, m] = times.map(TimeSpec::from);
    nix::sys::stat::utimensat(
        AT_FDCWD,
        fd_path(fd).as_slice(),
        &a,
        &m,
        UtimensatFlags::FollowSymlink,
    )
    .map_err(nix)
}

/// The target of the symlink `fd` holds.
pub(super) fn readlink_fd(fd: BorrowedFd<'_>) -> Result<Vec<u8>, Errno> {
    let t = nix::fcntl::readlinkat(fd, b"".as_slice()).map_err(nix)?;
    Ok(t.as_bytes().to_vec())
}

/// The entries of the directory `fd` holds.
pub(super) fn read_dir(fd: BorrowedFd<'_>) -> Result<std::fs::ReadDir, Errno> {
    std::fs::read_dir(std::ffi::OsStr::from_bytes(&fd_path(fd))).map_err(|e| errno_of(&e))
}

/// `fstatvfs` of the filesystem holding `fd`.
pub(super) fn statvfs_fd(fd: BorrowedFd<'_>) -> Result<nix::sys::statvfs::Statvfs, Errno> {
    nix::sys::statvfs::fstatvfs(fd).map_err(nix)
}

/// Whether this process runs as root (may chown, register backing files).
pub(super) fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Set the process umask to 0 (see [`super::UnionFs::new`]).
pub(super) fn clear_umask() {
    nix::sys::stat::umask(Mode::empty());
}

/// The errno `setxattr` and friends left, for a negative return.
fn last() -> Errno {
    errno_of(&io::Error::last_os_error())
}

/// `setxattr(path, name, value, flags)`.
fn xattr_set(path: &[u8], name: &[u8], value: &[u8], flags: i32) -> Result<(), Errno> {
    let (p, n) = (cstr(path)?, cstr(name)?);
    // SAFETY: `p` and `n` are NUL-terminated and live across the call; the
    // kernel reads `value.len()` bytes from `value`, which has that many.
    let r = unsafe {
        libc::setxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            flags,
        )
    };
    if r < 0 {
        return Err(last());
    }
    Ok(())
}

/// Extended attribute `name` of the object `fd` holds, with `flags`
/// (`XATTR_CREATE`, `XATTR_REPLACE`).
pub(super) fn xattr_set_fd(
    fd: BorrowedFd<'_>,
    name: &[u8],
    value: &[u8],
    flags: i32,
) -> Result<(), Errno> {
    xattr_set(&fd_path(fd), name, value, flags)
}

/// Extended attribute `key` of entry `name` in `dir` (follows a symlink).
pub(super) fn xattr_set_at(
    dir: BorrowedFd<'_>,
    name: &[u8],
    key: &[u8],
    value: &[u8],
) -> Result<(), Errno> {
    xattr_set(&fd_child_path(dir, name), key, value, 0)
}

/// Call `get(buf)` (a `getxattr`-style call: the size it needs when `buf` is
/// empty) until the value fits: it may grow between the size query and the
/// read.
fn sized(mut get: impl FnMut(&mut [u8]) -> isize) -> Result<Vec<u8>, Errno> {
    loop {
        let len = get(&mut []);
        if len < 0 {
            return Err(last());
        }
        let mut buf = vec![0u8; len as usize];
        let got = get(&mut buf);
        if got >= 0 {
            buf.truncate(got as usize);
            return Ok(buf);
        }
        let e = last();
        if e != Errno::ERANGE {
            return Err(e);
        }
    }
}

/// The value of extended attribute `name` of the object `fd` holds.
pub(super) fn xattr_get_fd(fd: BorrowedFd<'_>, name: &[u8]) -> Result<Vec<u8>, Errno> {
    let (p, n) = (cstr(&fd_path(fd))?, cstr(name)?);
    sized(|buf| {
        // SAFETY: `p` and `n` are NUL-terminated and outlive the call; the
        // kernel writes at most `buf.len()` bytes to `buf` (none for an
        // empty one, a size query).
        unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) }
    })
}

/// The extended attribute names (each NUL-terminated) of the object `fd`
/// holds.
pub(super) fn xattr_list_fd(fd: BorrowedFd<'_>) -> Result<Vec<u8>, Errno> {
    let p = cstr(&fd_path(fd))?;
    sized(|buf| {
        // SAFETY: `p` is NUL-terminated and outlives the call; the kernel
        // writes at most `buf.len()` bytes to `buf`.
        unsafe { libc::listxattr(p.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) }
    })
}

/// Remove extended attribute `name` of the object `fd` holds.
pub(super) fn xattr_remove_fd(fd: BorrowedFd<'_>, name: &[u8]) -> Result<(), Errno> {
    let (p, n) = (cstr(&fd_path(fd))?, cstr(name)?);
    // SAFETY: both are NUL-terminated and live across the call.
    if unsafe { libc::removexattr(p.as_ptr(), n.as_ptr()) } < 0 {
        return Err(last());
    }
    Ok(())
}
