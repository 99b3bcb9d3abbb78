//! The image is written through a temporary beside the output, in a
//! directory that may be writable by others: a link planted where the
//! temporary used to be named (`.NAME.sheaf-tmp.PID`) is never written
//! through, and the image gets the mode a plain create would give it.

use sheaf_build::{build, BuildOptions, Input, Progress};
use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

#[test]
fn a_link_planted_beside_the_output_is_never_written_through() {
    let t = tempfile::tempdir().unwrap();
    let victim = t.path().join("victim");
    fs::write(&victim, b"precious").unwrap();
    let src = t.path().join("src");
    fs::create_dir(&src).unwrap();
    fs::write(src.join("a"), b"hello").unwrap();
    let shared = t.path().join("shared");
    fs::create_dir(&shared).unwrap();
    // The names the temporary had: this process's pid and its neighbours'.
    let me = std::process::id();
    let pids = me.saturating_sub(3)..me + 50;
    let planted = pids.len();
    for pid in pids {
        symlink(&victim, shared.join(format!(".out.sheaf.sheaf-tmp.{pid}"))).unwrap();
    }
    let out = shared.join("out.sheaf");
    build(
        &Input::Dir(src),
        &out,
        &BuildOptions::default(),
        Arc::new(Progress::default()),
        &AtomicBool::new(false),
    )
    .unwrap();
    assert_eq!(fs::read(&victim).unwrap(), b"precious");
    assert!(fs::metadata(&out).unwrap().len() > 0);
    let img = sheaf_read::open_path(&out).unwrap();
    let ino = img.resolve(b"a").unwrap();
    let mut b = [0u8; 5];
    assert_eq!(img.read(&ino, 0, &mut b).unwrap(), 5);
    assert_eq!(&b, b"hello");
    // 0666 less the umask, as File::create made it.
    // SAFETY: umask has no preconditions; it is set back at once.
    let umask = unsafe {
        let m = libc::umask(0o022);
        libc::umask(m);
        m
    };
    let mode = fs::metadata(&out).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o666 & !umask);
    // Only the planted links and the image: no temporary left.
    let left = fs::read_dir(&shared).unwrap().count();
    assert_eq!(left, planted + 1);
}
