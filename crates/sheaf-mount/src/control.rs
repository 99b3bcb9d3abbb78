//! The client side of the control protocol a mount answers on its root:
//! the hidden xattrs [`crate::STATS_XATTR`] and [`crate::PID_XATTR`], or the
//! ioctls [`crate::STATS_IOCTL`] and [`crate::PID_IOCTL`] where the mount
//! answers no xattrs. The server side is in the filesystems
//! (`fs::ops`, `union::fuse`) and [`crate::reply_control`]; both ends share
//! [`Report`], so nothing between them is looked up by a JSON key.
//!
//! ```no_run
//! let c = sheaf_mount::control::Client::connect("/mnt/data".as_ref());
//! let r = c.report()?;
//! println!("{} served by {}", r.image, r.pid);
//! # Ok::<(), sheaf_mount::control::ControlError>(())
//! ```

use crate::stats::Report;
use crate::{CONTROL_LEN, PID_IOCTL, PID_XATTR, STATS_IOCTL, STATS_XATTR};
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Why a mount's root did not answer a control question.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The path is not the root of a sheaf mount (it has no hidden values).
    #[error("{}: not the root of a sheaf mount", path.display())]
    NotSheaf {
        /// The path asked.
        path: PathBuf,
    },
    /// A sheaf mount whose serving process is gone (the kernel answers
    /// "transport endpoint is not connected").
    #[error("{}: the mount's process is gone (run `sheaf umount {}`)", path.display(), path.display())]
    Gone {
        /// The mount point.
        path: PathBuf,
    },
    /// Asking failed otherwise.
    #[error("{}: {source}", path.display())]
    Io {
        /// The path asked.
        path: PathBuf,
        /// The system's answer.
        source: io::Error,
    },
    /// The answer is not a statistics report.
    #[error("{}: bad statistics: {source}", path.display())]
    BadReport {
        /// The mount point.
        path: PathBuf,
        /// What did not parse.
        source: serde_json::Error,
    },
    /// The answer is not a process id.
    #[error("{}: bad process id {answer:?}", path.display())]
    BadPid {
        /// The mount point.
        path: PathBuf,
        /// What it answered.
        answer: String,
    },
}

/// A mount's control protocol, asked at its root. Making one asks nothing:
/// each question goes to the serving process when it is called (nothing
/// the kernel caches answers it), so it always says how the mount is now.
#[derive(Debug, Clone)]
pub struct Client {
    root: PathBuf,
}

impl Client {
    /// The client of the mount whose root is `mountpoint`.
    pub fn connect(mountpoint: &Path) -> Client {
        Client {
            root: mountpoint.to_path_buf(),
        }
    }

    /// The mount point asked.
    pub fn mountpoint(&self) -> &Path {
        &self.root
    }

    /// The hidden value `name` (or the ioctl `cmd` standing for it).
    fn ask(&self, name: &str, cmd: u32) -> Result<Vec<u8>, ControlError> {
        match query(&self.root, name, cmd) {
            Ok(Some(v)) => Ok(v),
            Ok(None) => Err(ControlError::NotSheaf {
                path: self.root.clone(),
            }),
            Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => Err(ControlError::Gone {
                path: self.root.clone(),
            }),
            Err(source) => Err(ControlError::Io {
                path: self.root.clone(),
                source,
            }),
        }
    }

    /// The mount's live statistics: what it serves, its caches and
    /// counters, per-op latencies (`sheaf stats`).
    pub fn report(&self) -> Result<Report, ControlError> {
        decode_report(&self.root, &self.ask(STATS_XATTR, STATS_IOCTL)?)
    }

    /// The process serving the mount.
    pub fn pid(&self) -> Result<u32, ControlError> {
        let v = self.ask(PID_XATTR, PID_IOCTL)?;
        let answer = String::from_utf8_lossy(&v).into_owned();
        answer.parse().map_err(|_| ControlError::BadPid {
            path: self.root.clone(),
            answer,
        })
    }
}

/// The statistics report in `bytes`, as the mount at `mp` answered it.
fn decode_report(mp: &Path, bytes: &[u8]) -> Result<Report, ControlError> {
    serde_json::from_slice(bytes).map_err(|source| ControlError::BadReport {
        path: mp.to_path_buf(),
        source,
    })
}

/// Whether process `pid` still runs (a zombie waiting for its reaper does
/// not: it serves nothing any more).
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(s) => s
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => false,
    }
}

/// Wait up to `timeout` for process `pid` to exit (a serving process after
/// its mount is taken down, so that a script's next step sees it gone).
/// Whether it did.
pub fn wait_exit(pid: u32, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if !alive(pid) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Ask the mount at `mp` (its root) for a hidden value: the xattr `name`,
/// or, on a mount that answers no xattrs at all (its image has none), the
/// ioctl `cmd`. `Ok(None)`: not a sheaf mount's root. Either way the
/// question reaches the mount's server (nothing the kernel caches), so a
/// mount whose server is gone answers ENOTCONN here ([`is_dead`]).
pub fn query(mp: &Path, name: &str, cmd: u32) -> io::Result<Option<Vec<u8>>> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(mp.as_os_str().as_bytes())?;
    let key = std::ffi::CString::new(name)?;
    // The largest value an xattr may have (XATTR_SIZE_MAX).
    let mut buf = vec![0u8; 64 << 10];
    // SAFETY: NUL-terminated path and name; buf is buf.len() bytes.
    let n = unsafe {
        libc::getxattr(
            path.as_ptr(),
            key.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n >= 0 {
        buf.truncate(n as usize);
        return Ok(Some(buf));
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::ENODATA) => return Ok(None),
        Some(libc::EOPNOTSUPP) => {}
        _ => return Err(e),
    }
    use std::os::fd::AsRawFd;
    let dir = std::fs::File::open(mp)?;
    let mut buf = vec![0u8; CONTROL_LEN];
    // SAFETY: the buffer is CONTROL_LEN bytes, the size `cmd` encodes.
    let r = unsafe { libc::ioctl(dir.as_raw_fd(), cmd as _, buf.as_mut_ptr()) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENOTTY) | Some(libc::ENOSYS) | Some(libc::EINVAL) => Ok(None),
            _ => Err(e),
        };
    }
    let n = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    buf.truncate(n);
    Ok(Some(buf))
}

/// Whether `mp` is a FUSE mount whose server is gone: still in the mount
/// table, but what reaches it fails with "transport endpoint is not
/// connected" (what the kernel cached, such as the root's attributes,
/// still answers, so a `stat` does not tell).
pub fn is_dead(mp: &Path) -> bool {
    matches!(
        query(mp, STATS_XATTR, STATS_IOCTL),
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTCONN | libc::ECONNABORTED))
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    #[test]
    fn a_plain_directory_is_not_a_sheaf_mount() {
        let t = tempfile::tempdir().unwrap();
        let c = Client::connect(t.path());
        let e = c.report().unwrap_err();
        assert!(matches!(e, ControlError::NotSheaf { .. }), "{e:?}");
        assert_eq!(
            e.to_string(),
            format!("{}: not the root of a sheaf mount", t.path().display())
        );
        assert!(matches!(c.pid(), Err(ControlError::NotSheaf { .. })));
        assert!(!is_dead(t.path()));
    }

    #[test]
    fn a_missing_path_says_what_the_system_said() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("nothing");
        let e = Client::connect(&p).report().unwrap_err();
        match &e {
            ControlError::Io { path, source } => {
                assert_eq!(path, &p);
                assert_eq!(source.raw_os_error(), Some(libc::ENOENT));
            }
            other => panic!("expected an I/O error, got {other:?}"),
        }
        assert!(e.to_string().starts_with(&format!("{}: ", p.display())));
    }

    #[test]
    fn a_report_decodes_to_what_the_server_encoded() {
        let mut r = Report {
            image: "a.sheaf,b.sheaf".into(),
            roots: vec!["00ff".into(), "ee11".into()],
            pid: 4242,
            uptime_s: 1.5,
            bytes_served: 1 << 20,
            layers: Some(vec!["a.sheaf".into(), "b.sheaf".into()]),
            upper: Some(true),
            ..Default::default()
        };
        r.ops.insert(
            "read".into(),
            crate::stats::OpReport {
                count: 7,
                errors: 1,
                ..Default::default()
            },
        );
        let mp = Path::new("/mnt/x");
        let back = decode_report(mp, &r.to_bytes()).unwrap();
        assert_eq!(back.image, "a.sheaf,b.sheaf");
        assert_eq!(back.roots, ["00ff", "ee11"]);
        assert_eq!(back.pid, 4242);
        assert_eq!(back.upper, Some(true));
        assert_eq!(back.ops["read"].count, 7);
        assert_eq!(back.ops["read"].errors, 1);
        let e = decode_report(mp, b"{\"image\": 3}").unwrap_err();
        assert!(matches!(e, ControlError::BadReport { .. }), "{e:?}");
        assert!(e.to_string().starts_with("/mnt/x: bad statistics: "), "{e}");
    }

    #[test]
    fn a_process_is_alive_until_it_exits_and_a_zombie_is_not() {
        assert!(alive(std::process::id()));
        let mut child = Command::new("sleep")
            .arg("10")
            .stdin(Stdio::null())
            .spawn()
            .expect("sleep(1)");
        let pid = child.id();
        assert!(alive(pid));
        // Still running: the wait gives up after its timeout.
        let t = Instant::now();
        assert!(!wait_exit(pid, Duration::from_millis(60)));
        assert!(t.elapsed() >= Duration::from_millis(60));
        child.kill().unwrap();
        // Killed but not reaped: a zombie, which serves nothing.
        assert!(wait_exit(pid, Duration::from_secs(5)));
        assert!(!alive(pid));
        child.wait().unwrap();
        assert!(!alive(pid));
    }
}
