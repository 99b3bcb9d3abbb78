//! Committing a container's overlayfs upper directory: its whiteouts become
//! a layer's, and nothing the container planted there is written through.
//! Needs root (character devices 0/0 and `trusted.*` attributes are what
//! overlayfs itself writes); `make test` runs it as root.

use sheaf_snapshotter::overlay_to_oci;
use std::fs;
use std::os::unix::fs::{symlink, FileTypeExt};
use std::path::Path;

fn whiteout_device(p: &Path) {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid C string; mknod has no other preconditions.
    let rc = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o600, 0) };
    assert_eq!(
        rc,
        0,
        "mknod {}: {} (root needed)",
        p.display(),
        std::io::Error::last_os_error()
    );
}

fn victim(t: &Path) -> std::path::PathBuf {
    let v = t.join("shadow");
    fs::write(&v, b"root:secret\n").unwrap();
    v
}

#[test]
fn a_whiteout_name_planted_as_a_link_is_refused_and_the_host_file_kept() {
    let t = tempfile::tempdir().unwrap();
    let v = victim(t.path());
    let upper = t.path().join("upper");
    fs::create_dir(&upper).unwrap();
    // In the container: ln -s /etc/shadow /.wh.foo; rm /foo
    whiteout_device(&upper.join("foo"));
    symlink(&v, upper.join(".wh.foo")).unwrap();
    let e = overlay_to_oci(&upper).unwrap_err().to_string();
    assert!(e.contains(".wh.foo") && e.contains("whiteout"), "{e}");
    assert_eq!(fs::read(&v).unwrap(), b"root:secret\n");
    // Nothing was changed: the device is still there.
    assert!(fs::symlink_metadata(upper.join("foo"))
        .unwrap()
        .file_type()
        .is_char_device());
}

#[test]
fn an_opaque_marker_planted_as_a_link_is_refused_and_the_host_file_kept() {
    let t = tempfile::tempdir().unwrap();
    let v = victim(t.path());
    let upper = t.path().join("upper");
    fs::create_dir_all(upper.join("d")).unwrap();
    xattr::set(upper.join("d"), "trusted.overlay.opaque", b"y").unwrap();
    symlink(&v, upper.join("d/.wh..wh..opq")).unwrap();
    assert!(overlay_to_oci(&upper).is_err());
    assert_eq!(fs::read(&v).unwrap(), b"root:secret\n");
    // A link to a directory where a subdirectory was is not walked into.
    let upper2 = t.path().join("upper2");
    fs::create_dir(&upper2).unwrap();
    let outside = t.path().join("outside");
    fs::create_dir(&outside).unwrap();
    xattr::set(&outside, "trusted.overlay.opaque", b"y").unwrap();
    symlink(&outside, upper2.join("sub")).unwrap();
    overlay_to_oci(&upper2).unwrap();
    assert!(fs::read_dir(&outside).unwrap().next().is_none());
    assert!(xattr::get(&outside, "trusted.overlay.opaque")
        .unwrap()
        .is_some());
}

#[test]
fn overlay_whiteouts_become_a_layers() {
    let t = tempfile::tempdir().unwrap();
    let upper = t.path().join("upper");
    fs::create_dir_all(upper.join("x/o")).unwrap();
    whiteout_device(&upper.join("gone"));
    whiteout_device(&upper.join("x/also-gone"));
    fs::write(upper.join("x/o/kept"), b"k").unwrap();
    xattr::set(upper.join("x/o"), "trusted.overlay.opaque", b"y").unwrap();
    overlay_to_oci(&upper).unwrap();
    for (p, expect_file) in [
        (".wh.gone", true),
        ("x/.wh.also-gone", true),
        ("x/o/.wh..wh..opq", true),
    ] {
        let m = fs::symlink_metadata(upper.join(p)).unwrap();
        assert_eq!(m.is_file(), expect_file, "{p}");
        assert_eq!(m.len(), 0, "{p}");
    }
    assert!(fs::symlink_metadata(upper.join("gone")).is_err());
    assert!(fs::symlink_metadata(upper.join("x/also-gone")).is_err());
    assert_eq!(fs::read(upper.join("x/o/kept")).unwrap(), b"k");
    assert!(xattr::get(upper.join("x/o"), "trusted.overlay.opaque")
        .unwrap()
        .is_none());
    // A redirect has no layer form.
    let upper = t.path().join("upper2");
    fs::create_dir_all(upper.join("r")).unwrap();
    xattr::set(upper.join("r"), "trusted.overlay.redirect", b"/elsewhere").unwrap();
    let e = overlay_to_oci(&upper).unwrap_err().to_string();
    assert!(e.contains("redirect"), "{e}");
}
