//! User and group names of this machine, as find(1) and ls(1) show and
//! take them: through the C library (NSS: /etc/passwd, LDAP, SSSD...),
//! names cached by id for a walk that asks once per entry.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, CStr, CString};

/// Names already looked up, by id (`None`: no such user or group).
#[derive(Default)]
pub struct Names {
    users: HashMap<u32, Option<String>>,
    groups: HashMap<u32, Option<String>>,
}

impl Names {
    /// The name of user `uid`, if this machine knows one.
    pub fn user(&mut self, uid: u32) -> Option<&str> {
        // SAFETY: getpwuid_r with its own record and buffer.
        let get = |rec, buf, len, res| unsafe { libc::getpwuid_r(uid, rec, buf, len, res) };
        cached(&mut self.users, uid, || {
            lookup(get, |p: &libc::passwd| p.pw_name)
        })
    }

    /// The name of group `gid`, if this machine knows one.
    pub fn group(&mut self, gid: u32) -> Option<&str> {
        // SAFETY: getgrgid_r with its own record and buffer.
        let get = |rec, buf, len, res| unsafe { libc::getgrgid_r(gid, rec, buf, len, res) };
        cached(&mut self.groups, gid, || {
            lookup(get, |g: &libc::group| g.gr_name)
        })
    }
}

fn cached(
    names: &mut HashMap<u32, Option<String>>,
    id: u32,
    look: impl FnOnce() -> Option<String>,
) -> Option<&str> {
    names.entry(id).or_insert_with(look).as_deref()
}

/// The id of user `name`, if this machine knows it.
pub fn uid_of(name: &str) -> Option<u32> {
    let c = CString::new(name).ok()?;
    // SAFETY: getpwnam_r with its own record and buffer; `c` outlives it.
    call(
        |rec, buf, len, res| unsafe { libc::getpwnam_r(c.as_ptr(), rec, buf, len, res) },
        |p: &libc::passwd| p.pw_uid,
    )
}

/// The id of group `name`, if this machine knows it.
pub fn gid_of(name: &str) -> Option<u32> {
    let c = CString::new(name).ok()?;
    // SAFETY: getgrnam_r with its own record and buffer; `c` outlives it.
    call(
        |rec, buf, len, res| unsafe { libc::getgrnam_r(c.as_ptr(), rec, buf, len, res) },
        |g: &libc::group| g.gr_gid,
    )
}

/// Run one of the `get*_r` calls, growing its buffer while it says ERANGE,
/// and read the record it filled.
fn call<T, R>(
    mut get: impl FnMut(*mut T, *mut c_char, usize, *mut *mut T) -> c_int,
    read: impl FnOnce(&T) -> R,
) -> Option<R> {
    let mut buf: Vec<c_char> = vec![0; 1024];
    loop {
        // SAFETY: a plain C record, filled in by `get` before it is read.
        let mut rec: T = unsafe { std::mem::zeroed() };
        let mut res: *mut T = std::ptr::null_mut();
        let rc = get(&mut rec, buf.as_mut_ptr(), buf.len(), &mut res);
        if rc == libc::ERANGE && buf.len() < 1 << 20 {
            buf.resize(buf.len() * 2, 0);
            continue;
        }
        // Not found (rc 0, no result) and errors alike: no name.
        return (rc == 0 && !res.is_null()).then(|| read(&rec));
    }
}

fn lookup<T>(
    get: impl FnMut(*mut T, *mut c_char, usize, *mut *mut T) -> c_int,
    name: impl FnOnce(&T) -> *mut c_char,
) -> Option<String> {
    // SAFETY: the name points into `buf`, alive while `read` runs.
    call(get, |r| {
        unsafe { CStr::from_ptr(name(r)) }
            .to_string_lossy()
            .into_owned()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_is_known_both_ways_and_a_stranger_is_not() {
        let mut n = Names::default();
        assert_eq!(n.user(0), Some("root"));
        assert_eq!(n.group(0), Some("root"));
        assert_eq!(uid_of("root"), Some(0));
        assert_eq!(gid_of("root"), Some(0));
        assert_eq!(uid_of("no-such-user-sheaf"), None);
        assert_eq!(n.user(3_999_999_999), None);
    }
}
