//! How an entry's attributes are shown as ls(1) and find(1) show them:
//! times in local time through strftime(3), `ls -l`'s mode string, owner
//! names or numbers. Shared by `sheaf find`'s printing ([`crate::find`]),
//! `sheaf ls -l` and the Python package.

use sheaf_format::FileType;
use std::ffi::CString;

/// `sec` broken down in local time (`None` past what the C library can).
fn local_tm(sec: i64) -> Option<libc::tm> {
    let t = sec as libc::time_t;
    // SAFETY: a plain C record, filled in by localtime_r.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointers to a time and a record.
    (!unsafe { libc::localtime_r(&t, &mut tm) }.is_null()).then_some(tm)
}

/// `tm` formatted by strftime(3) with `fmt`.
fn strftime(tm: &libc::tm, fmt: &str) -> String {
    let Ok(f) = CString::new(fmt) else {
        return String::new();
    };
    let mut buf = [0u8; 256];
    // SAFETY: the buffer's length is given; the format is NUL-terminated.
    let n = unsafe { libc::strftime(buf.as_mut_ptr().cast(), buf.len(), f.as_ptr(), tm) };
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// `sec` in local time, formatted by strftime(3) with `fmt` (the seconds
/// themselves where the C library cannot break them down).
pub fn local_time(sec: i64, fmt: &str) -> String {
    local_tm(sec).map_or_else(|| sec.to_string(), |tm| strftime(&tm, fmt))
}

/// find's `%Tk` (and `%Ak`, `%Ck`: the same time in an image): strftime's
/// `%k`, but seconds carry find's ten fractional digits, `@` is seconds
/// since the epoch and `+` date and time joined by `+`.
pub(crate) fn time_field(k: u8, sec: i64, nsec: u32) -> String {
    let frac = format!(".{nsec:09}0");
    if k == b'@' {
        return format!("{sec}{frac}");
    }
    // Broken down once for all of the directive's parts.
    let tm = local_tm(sec);
    let at = |fmt: &str| tm.map_or_else(|| sec.to_string(), |tm| strftime(&tm, fmt));
    match k {
        b'+' => format!("{}{frac}", at("%Y-%m-%d+%H:%M:%S")),
        b'S' => format!("{}{frac}", at("%S")),
        b'T' => format!("{}{frac}", at("%H:%M:%S")),
        // %t, %a, %c: ctime(3)'s form with the fraction.
        b't' => format!("{}{frac}{}", at("%a %b %e %H:%M:%S"), at(" %Y")),
        k => at(&format!("%{}", k as char)),
    }
}

/// A user's or group's name, else its number (as ls(1) and find(1) show).
pub fn name_or_id(name: Option<&str>, id: u32) -> String {
    name.map_or_else(|| id.to_string(), str::to_string)
}

/// A mode as `ls -l` shows it: `drwxr-xr-x`.
pub fn mode_string(mode: u32) -> String {
    let t = match FileType::from_mode(mode) {
        Some(FileType::Directory) => 'd',
        Some(FileType::Symlink) => 'l',
        Some(FileType::CharDevice) => 'c',
        Some(FileType::BlockDevice) => 'b',
        Some(FileType::Fifo) => 'p',
        Some(FileType::Socket) => 's',
        _ => '-',
    };
    let mut s = String::from(t);
    for (i, c) in "rwxrwxrwx".chars().enumerate() {
        let bit = 1 << (8 - i);
        let on = mode & bit != 0;
        let special = match i {
            2 => mode & 0o4000 != 0,
            5 => mode & 0o2000 != 0,
            8 => mode & 0o1000 != 0,
            _ => false,
        };
        s.push(match (on, special) {
            (true, false) => c,
            (false, false) => '-',
            (true, true) => {
                if i == 8 {
                    't'
                } else {
                    's'
                }
            }
            (false, true) => {
                if i == 8 {
                    'T'
                } else {
                    'S'
                }
            }
        });
    }
    s
}
