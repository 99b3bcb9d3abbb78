//! Talking to the kernel about mounts: mounting and unmounting, and
//! `/proc/self/mountinfo` to see what is mounted where.
//!
//! A user's mount goes through `fusermount3` (it is setuid root), asked for
//! `auto_unmount`: it then stays alive holding one end of a socket whose
//! other end this process keeps; when this process dies for any reason
//! (kill -9 included) the socket closes and `fusermount3` unmounts, so no
//! "Transport endpoint is not connected" is left behind.
//!
//! Root mounts with mount(2) itself, as libfuse does, which saves starting
//! a program on every mount (most of what a cold mount waits for besides
//! its own binary: docs/mount.md). The watchdog is then a forked child of
//! this process holding the same kind of socket ([`Helper::Forked`]).

use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
use std::ffi::CString;
use std::ffi::OsString;
use std::fs::File;
use std::io::{self, IoSliceMut, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// The setuid helper that mounts and unmounts FUSE filesystems.
pub const FUSERMOUNT: &str = "fusermount3";

/// Where the fuse3 package installs [`FUSERMOUNT`]; libfuse runs it from
/// there before searching `PATH`, and so do we: a search through a long
/// `PATH` of cold directories cost a cold mount 3 ms.
const FUSERMOUNT_PATH: &str = "/usr/bin/fusermount3";

/// A command running [`FUSERMOUNT`].
fn fusermount() -> Command {
    if Path::new(FUSERMOUNT_PATH).exists() {
        Command::new(FUSERMOUNT_PATH)
    } else {
        Command::new(FUSERMOUNT)
    }
}

/// A mounted FUSE connection.
pub struct Connection {
    /// The `/dev/fuse` descriptor of the connection.
    pub fd: OwnedFd,
    /// Our end of the auto-unmount socket; dropping it (or dying) unmounts.
    pub watchdog: UnixStream,
    /// The process that watches the socket.
    pub helper: Helper,
}

/// The process that unmounts when a [`Connection`]'s socket closes with
/// the mount still there.
pub enum Helper {
    /// `fusermount3`, which also made the mount.
    Fusermount(Child),
    /// A forked child of this process (a root mount made with mount(2)).
    Forked(libc::pid_t),
}

impl Helper {
    /// Wait for the watchdog to exit (after the socket was closed).
    fn wait(&mut self) {
        match self {
            Helper::Fusermount(c) => {
                let _ = c.wait();
            }
            Helper::Forked(pid) => {
                let mut status = 0;
                // SAFETY: our own child; a plain wait.
                while unsafe { libc::waitpid(*pid, &mut status, 0) } < 0
                    && io::Error::last_os_error().raw_os_error() == Some(libc::EINTR)
                {
                }
            }
        }
    }
}

impl Connection {
    /// End the connection once its server is done: close the device, and
    /// let the watchdog go. `unmounted`: the server saw the mount go (its
    /// session ended normally). A forked watchdog is then told so, and
    /// leaves alone a later mount at the same place, which may already be
    /// there with the same device number (`umount` does not wait for the
    /// server); otherwise it unmounts as it would after a crash.
    pub fn close(self, unmounted: bool) {
        let Connection {
            fd,
            watchdog,
            helper,
        } = self;
        drop(fd);
        release(watchdog, helper, unmounted)
    }

    /// Log what the watchdog says from now on (a thread: call it once the
    /// process may have threads, i.e. not before entering a namespace).
    pub fn relay_messages(&mut self) {
        let Helper::Fusermount(helper) = &mut self.helper else {
            return;
        };
        if let Some(mut err) = helper.stderr.take() {
            std::thread::spawn(move || {
                let mut s = String::new();
                let _ = err.read_to_string(&mut s);
                for l in s.lines().filter(|l| !l.is_empty()) {
                    // After a normal unmount the watchdog finds nothing to do.
                    if l.ends_with("not mounted") {
                        log::debug!("{l}");
                    } else {
                        log::warn!("{l}");
                    }
                }
            });
        }
    }
}

/// Let a watchdog go (see [`Connection::close`]).
fn release(watchdog: UnixStream, mut helper: Helper, unmounted: bool) {
    if unmounted && matches!(helper, Helper::Forked(_)) {
        let _ = (&watchdog).write_all(&[DISARM]);
    }
    drop(watchdog);
    helper.wait();
}

/// Why mounting or unmounting failed.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// fusermount3 is not installed.
    #[error("{FUSERMOUNT} not found (install the fuse3 package)")]
    NoFusermount,
    /// fusermount3 refused; its own message, and the errno it names.
    #[error("{message}")]
    Refused {
        /// fusermount3's message.
        message: String,
        /// The system error the message ends with, if it is one of
        /// [`REFUSAL_ERRNOS`].
        errno: Option<i32>,
    },
    /// Any other system error.
    #[error("{0}")]
    Io(#[from] io::Error),
}

/// The errors fusermount3 reports that callers act on (EBUSY: the mount
/// is in use; the others say who may mount where).
pub const REFUSAL_ERRNOS: [i32; 6] = [
    libc::EBUSY,
    libc::EPERM,
    libc::EACCES,
    libc::ENOENT,
    libc::EINVAL,
    libc::ENOTCONN,
];

impl KernelError {
    /// The errno of the failure, when it has one: callers decide on this,
    /// never on the message's text.
    pub fn errno(&self) -> Option<i32> {
        match self {
            KernelError::NoFusermount => Some(libc::ENOENT),
            KernelError::Refused { errno, .. } => *errno,
            KernelError::Io(e) => e.raw_os_error(),
        }
    }
}

/// Escape a value for fusermount's comma-separated `-o` list.
fn escape_opt(s: &str) -> String {
    s.replace('\\', "\\\\").replace(',', "\\,")
}

/// Mount a FUSE filesystem at `mountpoint` with kernel/fusermount options
/// `opts` (already comma-joined; `fsname=` is escaped here).
pub fn mount(mountpoint: &Path, fsname: &str, opts: &[String]) -> Result<Connection, KernelError> {
    // SAFETY: plain getter.
    if unsafe { libc::geteuid() } == 0 {
        match mount_watched(mountpoint, fsname, opts) {
            Ok(Some(c)) => return Ok(c),
            // No statx (Linux before 4.11): the watchdog could not tell
            // its mount; fusermount3's does.
            Ok(None) => {}
            // Root without CAP_SYS_ADMIN (a container): fusermount3 decides.
            Err(KernelError::Io(e)) if e.raw_os_error() == Some(libc::EPERM) => {}
            Err(e) => return Err(e),
        }
    }
    let (ours, theirs) = UnixStream::pair()?;
    let mut all = vec![format!("fsname={}", escape_opt(fsname))];
    all.extend(opts.iter().cloned());
    all.push("auto_unmount".into());
    let their_fd: RawFd = theirs.as_raw_fd();
    let mut cmd = fusermount();
    cmd.arg("-o")
        .arg(all.join(","))
        .arg("--")
        .arg(mountpoint)
        .env("_FUSE_COMMFD", their_fd.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: only async-signal-safe fcntl between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            let flags = libc::fcntl(their_fd, libc::F_GETFD);
            if flags < 0 || libc::fcntl(their_fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(KernelError::NoFusermount),
        Err(e) => return Err(e.into()),
    };
    drop(theirs);
    match receive_fd(&ours) {
        // fusermount3 stays as the auto-unmount watchdog.
        Ok(Some(fd)) => Ok(Connection {
            fd,
            watchdog: ours,
            helper: Helper::Fusermount(child),
        }),
        Ok(None) | Err(_) => {
            let mut msg = String::new();
            if let Some(mut err) = child.stderr.take() {
                let _ = err.read_to_string(&mut msg);
            }
            let status = child.wait()?;
            Err(refusal(&msg, &format!("{FUSERMOUNT} failed ({status})")))
        }
    }
}

/// Mount a FUSE filesystem at `mountpoint` with mount(2) itself, without
/// `fusermount3`: for a process that holds `CAP_SYS_ADMIN` over its mount
/// namespace (root, or the creator of a user namespace, where the setuid
/// helper does not work). Returns the `/dev/fuse` descriptor. `opts` are
/// the same words as for [`mount`]; the mount flags among them become flags.
/// There is no auto-unmount watchdog: the caller's namespace going away is
/// what cleans up.
pub fn mount_direct(
    mountpoint: &Path,
    fsname: &str,
    opts: &[String],
) -> Result<OwnedFd, KernelError> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")?;
    let root_mode = std::fs::metadata(mountpoint)?.mode() & libc::S_IFMT;
    let mut flags: libc::c_ulong = 0;
    let mut data = vec![
        format!("fd={}", dev.as_raw_fd()),
        format!("rootmode={root_mode:o}"),
        // SAFETY: plain getters.
        format!("user_id={}", unsafe { libc::getuid() }),
        // SAFETY: plain getter.
        format!("group_id={}", unsafe { libc::getgid() }),
    ];
    for o in opts {
        match o.as_str() {
            "ro" => flags |= libc::MS_RDONLY,
            "rw" => {}
            "nosuid" => flags |= libc::MS_NOSUID,
            "nodev" => flags |= libc::MS_NODEV,
            "noexec" => flags |= libc::MS_NOEXEC,
            "suid" | "dev" | "exec" => {}
            // The type carries it (fuse.SUBTYPE).
            s if s.starts_with("subtype=") => {}
            s => data.push(s.to_string()),
        }
    }
    let (src, target, fstype, data) = (
        c_string(fsname.as_bytes())?,
        cpath(mountpoint)?,
        c_string(b"fuse.sheaf")?,
        c_string(data.join(",").as_bytes())?,
    );
    // SAFETY: valid C strings.
    let r = unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            flags,
            data.as_ptr().cast(),
        )
    };
    if r != 0 {
        return Err(KernelError::Io(io::Error::last_os_error()));
    }
    Ok(OwnedFd::from(dev))
}

/// A C string for a system call; an inner NUL is EINVAL, as the kernel
/// would say of such a path.
pub(crate) fn c_string(b: &[u8]) -> io::Result<CString> {
    CString::new(b).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// [`c_string`] of a path.
pub(crate) fn cpath(p: &Path) -> io::Result<CString> {
    c_string(p.as_os_str().as_bytes())
}

/// [`mount_direct`] with a forked watchdog standing in for fusermount3's
/// `auto_unmount`. The child is forked before the mount, so there is no
/// moment when the mount exists without it; it learns the mount's device
/// number once the mount is made, and when the socket closes it unmounts
/// `mountpoint` only if that device is still mounted there. `None` (nothing
/// done) where the kernel has no statx to tell devices apart with.
fn mount_watched(
    mountpoint: &Path,
    fsname: &str,
    opts: &[String],
) -> Result<Option<Connection>, KernelError> {
    Ok(
        watched(mountpoint, || mount_direct(mountpoint, fsname, opts))?.map(|(fd, w)| Connection {
            fd,
            watchdog: w.sock,
            helper: Helper::Forked(w.pid),
        }),
    )
}

/// A forked watchdog over one mount point ([`watched`]).
pub struct Watchdog {
    sock: UnixStream,
    pid: libc::pid_t,
}

impl Watchdog {
    /// Let the watchdog go: `unmounted` (the server saw its mount go)
    /// disarms it; otherwise it detaches the mount if it is still there.
    pub fn close(self, unmounted: bool) {
        release(self.sock, Helper::Forked(self.pid), unmounted)
    }
}

/// Make a mount at `mountpoint` with `mount` under a forked watchdog that
/// stands in for fusermount3's `auto_unmount`. The child is forked before
/// the mount, so there is no moment when the mount exists without it; it
/// learns the mount's device number once the mount is made, and when the
/// socket closes (this process exits, is killed, or closes the
/// [`Watchdog`]) it detaches `mountpoint` only if that device is still
/// mounted there. `None` (nothing done) where the kernel has no statx to
/// tell devices apart with.
pub fn watched<T>(
    mountpoint: &Path,
    mount: impl FnOnce() -> Result<T, KernelError>,
) -> Result<Option<(T, Watchdog)>, KernelError> {
    let target = cpath(mountpoint)?;
    // SAFETY: a stat call on a valid C string.
    let Some(before) = (unsafe { mounted_dev(&target) }) else {
        return Ok(None);
    };
    let (ours, theirs) = UnixStream::pair()?;
    // SAFETY: the child only makes async-signal-safe calls (this process
    // may have threads) and never returns (`watch` ends in `_exit`).
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error().into());
    }
    if pid == 0 {
        // SAFETY: in the forked child, as `watch` requires.
        unsafe { watch(theirs.as_raw_fd(), ours.as_raw_fd(), &target, before) }
    }
    drop(theirs);
    match mount() {
        Ok(made) => {
            // SAFETY: a stat call on a valid C string.
            let dev = unsafe { mounted_dev(&target) }.unwrap_or(0);
            // If this fails the watchdog falls back to `before`.
            let _ = (&ours).write_all(&dev.to_ne_bytes());
            log::debug!("mounted {}; watchdog {pid}", mountpoint.display());
            Ok(Some((made, Watchdog { sock: ours, pid })))
        }
        Err(e) => {
            // Disarmed: nothing was mounted.
            let _ = (&ours)
                .write_all(&[0; 8])
                .and_then(|_| (&ours).write_all(&[DISARM]));
            drop(ours);
            Helper::Forked(pid).wait();
            Err(e)
        }
    }
}

/// The byte that tells a forked watchdog, after the device number, that
/// the mount is gone and it has nothing to do.
const DISARM: u8 = 1;

/// statx(2) of `target` without asking a FUSE server
/// (`AT_STATX_DONT_SYNC`: a dead or not yet serving one never answers),
/// with `flags` besides. `None` if it fails, also where the kernel has no
/// statx: this is the system call itself, as glibc's wrapper would fall
/// back to a stat that asks the server.
///
/// # Safety
/// Only a syscall: callable in a forked child.
unsafe fn statx_nosync(
    target: &CString,
    flags: libc::c_int,
    mask: libc::c_uint,
) -> Option<libc::statx> {
    let mut x: libc::statx = std::mem::zeroed();
    let r = libc::syscall(
        libc::SYS_statx,
        libc::AT_FDCWD,
        target.as_ptr(),
        libc::AT_STATX_DONT_SYNC | flags,
        mask,
        &mut x as *mut libc::statx,
    );
    (r == 0).then_some(x)
}

/// The device of what is mounted at `target` ([`statx_nosync`]). While a
/// dead server's mount stays, no other mount can have its device number,
/// so the watchdog's comparison is exact. `None` where the kernel has no
/// statx.
///
/// # Safety
/// Only a syscall: callable in a forked child.
unsafe fn mounted_dev(target: &CString) -> Option<u64> {
    statx_nosync(target, 0, libc::STATX_TYPE)
        .map(|x| libc::makedev(x.stx_dev_major, x.stx_dev_minor))
}

/// The watchdog's life: hold socket `fd` (and nothing else) until its other
/// end closes, then, unless the server disarmed it first (a byte after the
/// device number), detach the mount at `target` if it is still ours: the
/// device the server sent, or, if it died before sending one, anything
/// other than `before`, what `target` was before the mount.
///
/// # Safety
/// Call only in a freshly forked child; never returns.
unsafe fn watch(fd: RawFd, server_end: RawFd, target: &CString, before: u64) -> ! {
    let mut all: libc::sigset_t = std::mem::zeroed();
    libc::sigfillset(&mut all);
    // A stop signal for the server's process group is not for it.
    libc::sigprocmask(libc::SIG_SETMASK, &all, std::ptr::null_mut());
    libc::prctl(libc::PR_SET_NAME, c"sheaf-watchdog".as_ptr());
    // Hold nothing of the server's: not its end of the socket (or it would
    // wait for itself), not its image, not the caller's readiness pipe (or
    // `sheaf mount` would wait for it). close_range is Linux 5.9; before
    // that, one close per possible descriptor.
    libc::close(server_end);
    let keep = fd as libc::c_uint;
    let below = keep == 0 || libc::syscall(libc::SYS_close_range, 0, keep - 1, 0) == 0;
    let above = libc::syscall(libc::SYS_close_range, keep + 1, libc::c_uint::MAX, 0) == 0;
    if !(below && above) {
        let mut lim: libc::rlimit = std::mem::zeroed();
        let n = if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
            lim.rlim_cur.min(1 << 16) as RawFd
        } else {
            1024
        };
        for i in (0..n).filter(|&i| i != fd) {
            libc::close(i);
        }
    }
    let mut dev = [0u8; 8];
    let (mut got, mut disarmed) = (0, false);
    loop {
        let mut b = [0u8; 8];
        let n = libc::read(fd, b.as_mut_ptr().cast(), b.len());
        if n == 0 || (n < 0 && *libc::__errno_location() != libc::EINTR) {
            break;
        }
        for &x in &b[..n.max(0) as usize] {
            if got < dev.len() {
                dev[got] = x;
                got += 1;
            } else {
                disarmed |= x == DISARM;
            }
        }
    }
    if disarmed {
        libc::_exit(0)
    }
    let ours = |d: u64| {
        if got == dev.len() && u64::from_ne_bytes(dev) != 0 {
            d == u64::from_ne_bytes(dev)
        } else {
            d != before
        }
    };
    if mounted_dev(target).is_some_and(ours) {
        libc::umount2(target.as_ptr(), libc::MNT_DETACH);
    }
    libc::_exit(0)
}

/// Receive the `/dev/fuse` descriptor that fusermount3 sends (SCM_RIGHTS);
/// `None` if it closed the socket without sending one.
fn receive_fd(sock: &UnixStream) -> io::Result<Option<OwnedFd>> {
    let mut byte = [0u8; 1];
    let mut iov = [IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!([RawFd; 1]);
    loop {
        match recvmsg::<()>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(msg) => {
                for c in msg.cmsgs()? {
                    if let ControlMessageOwned::ScmRights(fds) = c {
                        if let Some(&fd) = fds.first() {
                            // SAFETY: the kernel just gave us this descriptor.
                            return Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) }));
                        }
                    }
                }
                return Ok(None);
            }
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Unmount `mountpoint` (lazily: detach now, finish when no longer busy).
pub fn unmount(mountpoint: &Path, lazy: bool) -> Result<(), KernelError> {
    let mut cmd = fusermount();
    cmd.arg("-u");
    if lazy {
        cmd.arg("-z");
    }
    let out = match cmd.arg("--").arg(mountpoint).stdin(Stdio::null()).output() {
        Ok(o) => o,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(KernelError::NoFusermount),
        Err(e) => return Err(e.into()),
    };
    if out.status.success() {
        return Ok(());
    }
    Err(refusal(
        &String::from_utf8_lossy(&out.stderr),
        "unmount failed",
    ))
}

/// fusermount3's first message line, without its program-name prefix
/// (`fallback` if it said nothing).
fn refusal(stderr: &str, fallback: &str) -> KernelError {
    let line = stderr
        .lines()
        .map(|l| l.trim_start_matches("fusermount3: ").trim())
        .find(|l| !l.is_empty())
        .unwrap_or(fallback);
    // fusermount3 ends its messages with strerror(errno).
    let errno = REFUSAL_ERRNOS
        .into_iter()
        .find(|&n| line.ends_with(nix::errno::Errno::from_raw(n).desc()));
    KernelError::Refused {
        message: line.to_string(),
        errno,
    }
}

/// One line of `/proc/self/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// Where it is mounted.
    pub mountpoint: PathBuf,
    /// Filesystem type, e.g. `fuse.sheaf`.
    pub fstype: String,
    /// Source (for sheaf: the image).
    pub source: String,
    /// The filesystem's device number (`MAJOR:MINOR`), as `st_dev` of its
    /// files shows it.
    pub dev: libc::dev_t,
    /// Who made the mount, for FUSE: the `user_id=` the kernel shows (the
    /// uid of the process that opened the FUSE device).
    pub owner: Option<u32>,
}

impl MountEntry {
    /// A sheaf mount: one served through FUSE (`fuse.sheaf`), or a
    /// kernel-path mount (EROFS on a metadata image sheaf wrote,
    /// [`crate::erofs::is_metadata_image`]).
    pub fn is_sheaf(&self) -> bool {
        self.fstype == "fuse.sheaf" || self.is_kernel_path()
    }

    /// A kernel-path mount (`sheaf mount --kernel`).
    pub fn is_kernel_path(&self) -> bool {
        self.fstype == "erofs" && crate::erofs::is_metadata_image(Path::new(&self.source))
    }
}

/// Undo mountinfo's octal escapes (`\040` for a space).
fn unescape(s: &str) -> OsString {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        if let (b'\\', Some(d)) = (b[i], octal) {
            let v = (d[0] - b'0') as u32 * 64 + (d[1] - b'0') as u32 * 8 + (d[2] - b'0') as u32;
            out.push(v as u8);
            i += 4;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    std::os::unix::ffi::OsStringExt::from_vec(out)
}

/// Parse mountinfo text.
pub fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    let mut v = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        let Some(sep) = f.iter().position(|&x| x == "-") else {
            continue;
        };
        if f.len() < 5 || f.len() < sep + 3 {
            continue;
        }
        v.push(MountEntry {
            mountpoint: PathBuf::from(unescape(f[4])),
            fstype: f[sep + 1].to_string(),
            source: unescape(f[sep + 2]).to_string_lossy().into_owned(),
            dev: f[2]
                .split_once(':')
                .and_then(|(a, b)| Some(libc::makedev(a.parse().ok()?, b.parse().ok()?)))
                .unwrap_or(0),
            owner: f.get(sep + 3).and_then(|o| {
                o.split(',')
                    .find_map(|kv| kv.strip_prefix("user_id="))
                    .and_then(|u| u.parse().ok())
            }),
        });
    }
    v
}

/// Every mount this process sees (`/proc/self/mountinfo`), in its order.
pub fn mount_table() -> io::Result<Vec<MountEntry>> {
    let mut s = String::new();
    File::open("/proc/self/mountinfo")?.read_to_string(&mut s)?;
    Ok(parse_mountinfo(&s))
}

/// The mount at exactly `path` (the last one, if stacked), if any.
pub fn mount_at(path: &Path) -> io::Result<Option<MountEntry>> {
    // One statx answers the common "no" without reading the mount table,
    // which has hundreds of lines on a cluster node (0.2 ms of a warm
    // `sheaf mount` even here).
    if is_mount_root(path) == Some(false) {
        return Ok(None);
    }
    Ok(mount_table()?
        .into_iter()
        .rev()
        .find(|m| m.mountpoint.as_os_str().as_bytes() == path.as_os_str().as_bytes()))
}

/// Whether `path` is the root of a mount, where the kernel says
/// (`STATX_ATTR_MOUNT_ROOT`, Linux 5.8+); `None` if it cannot tell.
fn is_mount_root(path: &Path) -> Option<bool> {
    let target = cpath(path).ok()?;
    let root = libc::STATX_ATTR_MOUNT_ROOT as u64;
    // SAFETY: a statx call on a valid C string.
    let x = unsafe { statx_nosync(&target, libc::AT_NO_AUTOMOUNT, 0) }?;
    (x.stx_attributes_mask & root != 0).then_some(x.stx_attributes & root != 0)
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_refusal_carries_the_errno_its_message_ends_with() {
        let e = refusal(
            "fusermount3: failed to unmount /mnt/x: Device or resource busy\n",
            "unmount failed",
        );
        assert_eq!(e.errno(), Some(libc::EBUSY));
        assert_eq!(
            e.to_string(),
            "failed to unmount /mnt/x: Device or resource busy"
        );
        let e = refusal(
            "fusermount3: entry for /mnt/x not found in /etc/mtab\n",
            "x",
        );
        assert_eq!(e.errno(), None);
        let e = refusal("", "unmount failed");
        assert_eq!((e.errno(), e.to_string()), (None, "unmount failed".into()));
        assert_eq!(
            KernelError::Io(io::Error::from_raw_os_error(libc::EBUSY)).errno(),
            Some(libc::EBUSY)
        );
    }
    use super::*;

    #[test]
    fn mountinfo_fields_are_unescaped_and_carry_device_and_owner() {
        assert_eq!(unescape(r"/a\040b\134c\011"), OsString::from("/a b\\c\t"));
        assert_eq!(unescape(r"/x\04"), OsString::from(r"/x\04"));
        let line = "36 35 0:42 / /mnt/a\\040b rw,nosuid - fuse.sheaf /i.sheaf rw,user_id=1000,group_id=1000\n";
        let m = &parse_mountinfo(line)[0];
        assert_eq!(m.mountpoint, Path::new("/mnt/a b"));
        assert_eq!(m.fstype, "fuse.sheaf");
        assert_eq!(m.dev, libc::makedev(0, 42));
        assert_eq!(m.owner, Some(1000));
        // The device numbers agree with stat(2) of a real mount.
        let root = mount_table()
            .unwrap()
            .into_iter()
            .find(|m| m.mountpoint == Path::new("/proc"));
        use std::os::unix::fs::MetadataExt;
        assert_eq!(root.unwrap().dev, std::fs::metadata("/proc").unwrap().dev());
    }

    #[test]
    fn mount_roots_are_told_by_statx() {
        // Expected values from the mount table itself.
        let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let mounted = |p: &str| {
            parse_mountinfo(&table)
                .iter()
                .any(|m| m.mountpoint == Path::new(p))
        };
        for p in ["/", "/proc", "/etc"] {
            let root = is_mount_root(Path::new(p)).expect("Linux 5.8+ tells mount roots");
            assert_eq!(root, mounted(p), "{p}");
        }
        assert_eq!(is_mount_root(Path::new("/no/such/dir")), None);
    }

    #[test]
    fn mountinfo_lines_are_parsed_and_unescaped() {
        let t = "36 35 98:0 / /mnt/a\\040b rw,noatime master:1 - fuse.sheaf /x/img\\040.sheaf ro,user_id=0\n\
                 37 35 0:5 / /proc rw - proc proc rw\n";
        let m = parse_mountinfo(t);
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].mountpoint, PathBuf::from("/mnt/a b"));
        assert_eq!(m[0].fstype, "fuse.sheaf");
        assert_eq!(m[0].source, "/x/img .sheaf");
        assert_eq!(m[1].fstype, "proc");
    }

    #[test]
    fn fsname_commas_are_escaped() {
        assert_eq!(escape_opt("a,b\\c"), "a\\,b\\\\c");
    }
}
