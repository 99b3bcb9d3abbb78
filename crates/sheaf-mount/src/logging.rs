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

/// How a line on stderr looks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// `sheaf: LEVEL: message`, for a terminal.
    Plain,
    /// containerd's own style, for services:
    /// `time="2026-11-28T20:05:59.123456789Z" level=info msg="..."`.
    Logfmt,
    /// One JSON object per line: `{"time":...,"level":...,"msg":...}`.
    Json,
}

impl std::str::FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "text" | "logfmt" => Ok(Format::Logfmt),
            "json" => Ok(Format::Json),
            "plain" => Ok(Format::Plain),
            _ => Err(format!("{s}: not a log format (text, json)")),
        }
    }
}

struct Logger {
    target: Target,
    prefix: String,
    format: Format,
}

/// A logfmt value as containerd's logger (logrus) writes it: bare when
/// every character is a letter, a digit or one of `-._/@^+`, else quoted
/// (escaped as Go's strconv.Quote does).
fn logfmt_value(v: &str) -> String {
    if !v.is_empty()
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-._/@^+".contains(c))
    {
        return v.to_string();
    }
    // A JSON string is Go's quoting for everything a message holds.
    serde_json::Value::String(v.to_string()).to_string()
}

/// One line of a service's log in `format` (no newline).
pub fn format_line(format: Format, level: log::Level, msg: &str, now: SystemTime) -> String {
    let time = humantime::format_rfc3339_nanos(now).to_string();
    let level = level.as_str().to_lowercase();
    match format {
        Format::Plain => format!("sheaf: {level}: {msg}"),
        Format::Logfmt => format!(
            "time={} level={level} msg={}",
            logfmt_value(&time),
            logfmt_value(msg)
        ),
        Format::Json => serde_json::json!({ "time": time, "level": level, "msg": msg }).to_string(),
    }
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
            Target::Stderr => eprintln!(
                "{}",
                format_line(self.format, r.level(), &msg, SystemTime::now())
            ),
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
    let level = if verbose {
        log::LevelFilter::Debug
    } else {
        log::LevelFilter::Info
    };
    init_with(target, prefix, level, Format::Plain);
}

/// [`init`] for a service: messages at `level` and above, on stderr in
/// `format` (files and syslog keep their own line format).
pub fn init_with(target: Target, prefix: String, level: log::LevelFilter, format: Format) {
    if let Target::Syslog = target {
        // SAFETY: a static identifier string.
        unsafe { libc::openlog(c"sheaf".as_ptr(), libc::LOG_PID, libc::LOG_DAEMON) };
    }
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
    let logger = Logger {
        target,
        prefix,
        format,
    };
    if log::set_boxed_logger(Box::new(logger)).is_ok() {
        log::set_max_level(level);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn service_lines_are_containerds_style() {
        // 2026-11-28T20:05:59.000000123Z, computed by hand: 20,785 days
        // from 1970-01-01 to 2026-11-28, plus 20:05:59.
        let t = UNIX_EPOCH + Duration::new(20_785 * 86_400 + 20 * 3600 + 5 * 60 + 59, 123);
        assert_eq!(
            format_line(Format::Logfmt, log::Level::Info, "sha256:ab: lazy", t),
            r#"time="2026-11-28T20:05:59.000000123Z" level=info msg="sha256:ab: lazy""#
        );
        assert_eq!(
            format_line(Format::Logfmt, log::Level::Warn, "ready", t),
            r#"time="2026-11-28T20:05:59.000000123Z" level=warn msg=ready"#
        );
        assert_eq!(
            format_line(Format::Logfmt, log::Level::Error, "a \"q\"\nb", t),
            r#"time="2026-11-28T20:05:59.000000123Z" level=error msg="a \"q\"\nb""#
        );
        let j: serde_json::Value =
            serde_json::from_str(&format_line(Format::Json, log::Level::Debug, "x=1", t)).unwrap();
        assert_eq!(j["time"], "2026-11-28T20:05:59.000000123Z");
        assert_eq!(j["level"], "debug");
        assert_eq!(j["msg"], "x=1");
    }
}
