//! Where a mount's messages go: stderr (foreground), a file, or syslog.
//!
//! A background mount has no terminal, so errors a reader sees as EIO
//! (a corrupt block, an unreadable image) are explained here, naming the
//! image and the part that failed.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;
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
    if log::set_boxed_logger(Box::new(Logger { target, prefix })).is_ok() {
        log::set_max_level(level);
    }
}
