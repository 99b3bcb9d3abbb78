//! The listening socket, and keeping it open across restarts.
//!
//! containerd's gRPC client backs off for about a second after a refused
//! dial, so a restart must never close the socket. Two ways keep it open:
//!
//! - **systemd socket activation**: systemd holds the socket
//!   (`sheaf-snapshotter.socket`) and hands it over at each start in
//!   `LISTEN_FDS`/`LISTEN_PID` (sd_listen_fds(3)); connections made while
//!   the service restarts wait in the socket's backlog;
//! - **SIGHUP**: the process finishes the requests it is answering, then
//!   executes itself again (same pid, same arguments, the binary now at its
//!   path) with the socket at descriptor 3 and the same two variables, so
//!   the new image takes it over as from systemd.

use std::ffi::OsString;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

/// The first descriptor systemd passes (`SD_LISTEN_FDS_START`).
const LISTEN_FD: i32 = 3;

/// Why a listening socket handed over is not used.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    /// `LISTEN_FDS` names more than one socket, or is not a number.
    #[error("LISTEN_FDS={0}: the snapshotter listens on exactly one socket (one ListenStream= in its .socket unit)")]
    Count(String),
    /// Descriptor 3 is not a listening unix stream socket.
    #[error("descriptor 3 handed over in LISTEN_FDS is not a listening unix stream socket ({0})")]
    NotListening(&'static str),
    /// A system call failed.
    #[error("{what}")]
    Io {
        /// What was being done.
        what: String,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
}

fn sockopt(fd: i32, opt: i32) -> std::io::Result<i32> {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: v and len are valid for the call; fd is only queried.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            opt,
            (&mut v as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(v)
}

/// The socket handed over by systemd or by this process before a re-exec,
/// if any: `LISTEN_PID` is this process and `LISTEN_FDS` is 1. The
/// variables are removed either way, so the mount children started later
/// do not take the descriptor for theirs.
pub fn inherited() -> Result<Option<UnixListener>, ListenError> {
    let pid = std::env::var("LISTEN_PID").ok();
    let fds = std::env::var("LISTEN_FDS").ok();
    for v in ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"] {
        std::env::remove_var(v);
    }
    let (Some(pid), Some(fds)) = (pid, fds) else {
        return Ok(None);
    };
    if pid.trim().parse::<u32>().ok() != Some(std::process::id()) {
        return Ok(None);
    }
    match fds.trim().parse::<u32>() {
        Ok(0) => return Ok(None),
        Ok(1) => {}
        _ => return Err(ListenError::Count(fds)),
    }
    let io = |what: &str| {
        let what = what.to_string();
        move |source| ListenError::Io { what, source }
    };
    let ty = sockopt(LISTEN_FD, libc::SO_TYPE).map_err(io("descriptor 3"))?;
    if ty != libc::SOCK_STREAM {
        return Err(ListenError::NotListening("not a stream socket"));
    }
    if sockopt(LISTEN_FD, libc::SO_ACCEPTCONN).map_err(io("descriptor 3"))? != 1 {
        return Err(ListenError::NotListening("not listening"));
    }
    if sockopt(LISTEN_FD, libc::SO_DOMAIN).map_err(io("descriptor 3"))? != libc::AF_UNIX {
        return Err(ListenError::NotListening("not a unix socket"));
    }
    // SAFETY: fcntl on a descriptor just checked to be an open socket.
    if unsafe { libc::fcntl(LISTEN_FD, libc::F_SETFD, libc::FD_CLOEXEC) } < 0 {
        return Err(io("descriptor 3")(std::io::Error::last_os_error()));
    }
    // SAFETY: descriptor 3 is an open listening socket nothing else owns
    // (it was handed to this process for this purpose).
    Ok(Some(unsafe { UnixListener::from_raw_fd(LISTEN_FD) }))
}

/// Bind `socket` (its directory made if missing), 0600 whatever the umask:
/// only root may connect, since a connection mounts as root.
pub fn bind(socket: &Path) -> std::io::Result<UnixListener> {
    let _ = std::fs::remove_file(socket);
    if let Some(p) = socket.parent() {
        // trusted-path: the socket's directory the admin named
        std::fs::create_dir_all(p)?;
    }
    // SAFETY: umask has no preconditions; no other thread creates files
    // while the snapshotter has not started serving.
    let old = unsafe { libc::umask(0o177) };
    let l = UnixListener::bind(socket);
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    l
}

/// The path of the running program, as it is now on disk: after a package
/// upgrade `/proc/self/exe` names the replaced file "… (deleted)", and the
/// restart is meant to run the new one.
fn program() -> std::io::Result<PathBuf> {
    let p = std::fs::read_link("/proc/self/exe")?;
    let s = p.as_os_str().as_encoded_bytes();
    Ok(match s.strip_suffix(b" (deleted)") {
        // SAFETY: a prefix of bytes that came from an OsStr, cut at ASCII.
        Some(b) => PathBuf::from(unsafe { OsString::from_encoded_bytes_unchecked(b.to_vec()) }),
        None => p,
    })
}

/// Execute this program again with the same arguments, handing `listener`
/// over at descriptor 3 as systemd would. Returns only on failure.
pub fn reexec(listener: &UnixListener) -> std::io::Error {
    use std::os::unix::process::CommandExt;
    let args: Vec<OsString> = std::env::args_os().collect();
    let exe = match program() {
        Ok(p) => p,
        Err(e) => return e,
    };
    let fd = listener.as_raw_fd();
    // SAFETY: dup2 and fcntl on descriptors this process owns; descriptor
    // 3 is replaced on purpose (whatever held it is closed by exec anyway,
    // every descriptor of this process being close-on-exec).
    unsafe {
        if fd != LISTEN_FD && libc::dup2(fd, LISTEN_FD) < 0 {
            return std::io::Error::last_os_error();
        }
        if libc::fcntl(LISTEN_FD, libc::F_SETFD, 0) < 0 {
            return std::io::Error::last_os_error();
        }
    }
    let mut c = std::process::Command::new(exe);
    if let Some((arg0, rest)) = args.split_first() {
        c.arg0(arg0).args(rest);
    }
    c.env("LISTEN_FDS", "1")
        .env("LISTEN_PID", std::process::id().to_string())
        .exec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_foreign_or_missing_hand_over_is_ignored_and_cleared() {
        std::env::set_var("LISTEN_PID", "1");
        std::env::set_var("LISTEN_FDS", "1");
        assert!(inherited().unwrap().is_none());
        assert!(std::env::var_os("LISTEN_FDS").is_none());
        std::env::set_var("LISTEN_PID", std::process::id().to_string());
        std::env::set_var("LISTEN_FDS", "2");
        assert!(matches!(inherited(), Err(ListenError::Count(_))));
    }
}
