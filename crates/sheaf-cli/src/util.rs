//! Small helpers shared by commands.

use std::sync::atomic::{AtomicBool, Ordering};

/// Parse a size such as `1M`, `256K`, `4096`, `2MiB`.
pub fn parse_size(s: &str) -> Result<u32, String> {
    parse_size64(s)
        .and_then(|n| u32::try_from(n).map_err(|_| format!("'{s}' is too large (at most 4G-1)")))
}

/// Parse a byte size with an optional K/M/G/T suffix (powers of 1024).
pub fn parse_size64(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(t);
    let (num, mul) = match t.chars().last() {
        Some('K' | 'k') => (&t[..t.len() - 1], 1u64 << 10),
        Some('M' | 'm') => (&t[..t.len() - 1], 1 << 20),
        Some('G' | 'g') => (&t[..t.len() - 1], 1 << 30),
        Some('T' | 't') => (&t[..t.len() - 1], 1 << 40),
        _ => (t, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mul))
        .ok_or_else(|| format!("'{s}' is not a size (examples: 64K, 1M, 4M)"))
}

/// Human-readable bytes.
pub fn human(n: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < units.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", units[u])
    }
}

static CANCEL: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    CANCEL.store(true, Ordering::SeqCst);
}

/// Make SIGINT/SIGTERM set a flag that long operations poll, so they can
/// clean up (remove temporary files) instead of dying mid-write.
pub fn cancel_flag() -> &'static AtomicBool {
    // SAFETY: the handler only stores to an atomic, which is signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
    &CANCEL
}

/// Whether stderr is a terminal (progress bars only then).
pub fn stderr_is_tty() -> bool {
    // SAFETY: isatty on a constant fd.
    unsafe { libc::isatty(2) == 1 }
}

/// The bytes of an image named on the command line: a local file, or an
/// `http(s)://` URL read with Range requests.
pub fn image_source(
    arg: &std::path::Path,
) -> anyhow::Result<std::sync::Arc<dyn sheaf_read::Source>> {
    let s = arg.to_string_lossy();
    if sheaf_net::is_url(&s) {
        let src = sheaf_net::HttpSource::open(&s, sheaf_net::HttpOptions::default())
            .map_err(|e| anyhow::anyhow!("{s}: {e}"))?;
        return Ok(std::sync::Arc::new(src));
    }
    let f =
        sheaf_read::FileSource::open(arg).map_err(|e| anyhow::anyhow!("{}: {e}", arg.display()))?;
    Ok(std::sync::Arc::new(f))
}

/// Open an image named on the command line (file or URL).
pub fn open_image(arg: &std::path::Path) -> anyhow::Result<sheaf_read::Image> {
    Ok(sheaf_read::Image::open(image_source(arg)?)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1M"), Ok(1 << 20));
        assert_eq!(parse_size("64KiB"), Ok(64 << 10));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("8G").is_err());
        assert!(parse_size("x").is_err());
    }
}
