//! Where a mount's messages go: stderr (foreground), a file, or syslog.
//!
//! A background mount has no terminal, so errors a reader sees as EIO
//! (a corrupt block, an unreadable image) are explained here, naming the
//! image and the part that failed.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

/// A log destination.
pub enum Target {
    /// Standard error (foreground mounts).
    Stderr,
    /// Appended to a file.
    File(Mutex<File>),
    /// The system log (`journalctl -t sheaf`).
    Syslog,
}

struct Logger {
    target: Target,
    prefix: String,
}

impl log::Log for Logger {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= log::max_level()
    }

    fn log(&self, r: &log::Record) {
        if !self.enabled(r.metadata()) {
            return;
        }
        let msg = format!("{}{}", self.prefix, r.args());
        match &self.target {
            Target::Stderr => eprintln!("sheaf: {}: {msg}", r.level().as_str().to_lowercase()),
            Target::File(f) => {
                let t = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .unwrap_or_default();
                let line = format!(
                    "{}.{:03} {} [{}] {msg}\n",
                    t.as_secs(),
                    t.subsec_millis(),
                    r.level(),
                    std::process::id()
                );
                if let Ok(mut f) = f.lock() {
                    let _ = f.write_all(line.as_bytes());
                }
            }
            Target::Syslog => {
                let pri = match r.level() {
                    log::Level::Error => libc::LOG_ERR,
                    log::Level::Warn => libc::LOG_WARNING,
                    log::Level::Info => libc::LOG_INFO,
                    _ => libc::LOG_DEBUG,
                };
                if let Ok(c) = std::ffi::CString::new(msg) {
                    // SAFETY: constant format string, NUL-terminated argument.
                    unsafe { libc::syslog(pri, c"%s".as_ptr(), c.as_ptr()) };
                }
            }
        }
    }

    fn flush(&self) {}
}

/// Open a log file for appending (created 0600 if missing).
pub fn open_file(path: &Path) -> std::io::Result<Target> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)?;
    Ok(Target::File(Mutex::new(f)))
}

/// Where messages go when no log file is named: the system log when it
/// listens (`/dev/log`), else a file for this mount point
/// ([`default_file`]), so the cause of an EIO is not lost. A file that
/// cannot be made does not stop the mount: the system log is used anyway.
pub fn default_target(mountpoint: &Path) -> Target {
    if Path::new("/dev/log").exists() {
        return Target::Syslog;
    }
    let f = default_file(mountpoint);
    let made = match f.parent() {
        Some(d) => {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(d)
        }
        None => Ok(()),
    };
    made.and_then(|()| open_file(&f)).unwrap_or(Target::Syslog)
}

/// The log file of a mount at `mountpoint` on a machine without a system
/// log: `/var/log/sheaf/` for root, else `$XDG_STATE_HOME/sheaf/log/` (by
/// default `~/.local/state/sheaf/log/`), named after the mount point as
/// systemd names mount units (`/mnt/data` -> `mnt-data.log`).
pub fn default_file(mountpoint: &Path) -> PathBuf {
    let name = mountpoint
        .to_string_lossy()
        .trim_matches('/')
        .replace('/', "-");
    let name = if name.is_empty() { "-".into() } else { name };
    // SAFETY: geteuid has no preconditions.
    let dir = if unsafe { libc::geteuid() } == 0 {
        PathBuf::from("/var/log/sheaf")
    } else {
        std::env::var_os("XDG_STATE_HOME")
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
            .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".local/state")))
            .unwrap_or_else(|| PathBuf::from("/tmp"))
            .join("sheaf/log")
    };
    dir.join(format!("{name}.log"))
}

static DESTINATION: OnceLock<String> = OnceLock::new();

/// Where this process's messages go ("stderr", "syslog" or a file's
/// path), once [`init`] has run: `sheaf stats` shows it.
pub fn destination() -> Option<String> {
    DESTINATION.get().cloned()
}

/// Install the process-wide logger (once; later calls are ignored).
/// `prefix` starts every message, e.g. the mountpoint.
pub fn init(target: Target, prefix: String, verbose: bool) {
    if let Target::Syslog = target {
        // SAFETY: a static identifier string.
        unsafe { libc::openlog(c"sheaf".as_ptr(), libc::LOG_PID, libc::LOG_DAEMON) };
    }
    let level = if verbose {
        log::LevelFilter::Debug
    } else {
        log::LevelFilter::Info
    };
    let _ = DESTINATION.set(match &target {
        Target::Stderr => "stderr".into(),
        Target::Syslog => "syslog".into(),
        Target::File(f) => f
            .lock()
            .ok()
            .and_then(|f| {
                use std::os::fd::AsRawFd;
                std::fs::read_link(format!("/proc/self/fd/{}", f.as_raw_fd())).ok()
            })
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "a file".into()),
    });
    if log::set_boxed_logger(Box::new(Logger { target, prefix })).is_ok() {
        log::set_max_level(level);
    }
}
