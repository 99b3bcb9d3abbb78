//! One directory with a million entries: built, every entry counted, random
//! names found (and the right ones), absent names not found, `check` passes.

mod common;

use common::*;
use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Instant;

const N: u64 = 1_000_000;
const MTIME0: i64 = 1_000_000_000;

fn name(i: u64) -> String {
    format!("f{i:07}")
}

/// Create files `i` in `range` in `dir`, empty, each with mtime MTIME0 + i
/// (which identifies it), with raw syscalls to keep it fast.
fn create(dir: &Path, range: std::ops::Range<u64>) {
    let d = CString::new(dir.as_os_str().as_bytes()).unwrap();
    let dfd = unsafe {
        libc::open(
            d.as_ptr(),
            libc::O_DIRECTORY | libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    assert!(
        dfd >= 0,
        "open {}: {}",
        dir.display(),
        std::io::Error::last_os_error()
    );
    for i in range {
        let n = CString::new(name(i)).unwrap();
        let fd = unsafe {
            libc::openat(
                dfd,
                n.as_ptr(),
                libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_CLOEXEC,
                0o644,
            )
        };
        assert!(
            fd >= 0,
            "create {}: {}",
            name(i),
            std::io::Error::last_os_error()
        );
        let t = libc::timespec {
            tv_sec: MTIME0 + i as i64,
            tv_nsec: (i % 1000) as libc::c_long,
        };
        assert_eq!(unsafe { libc::futimens(fd, [t, t].as_ptr()) }, 0);
        unsafe { libc::close(fd) };
    }
    unsafe { libc::close(dfd) };
}

#[test]
fn a_million_entries_in_one_directory() {
    let start = Instant::now();
    // tmpfs when there is one: creating and removing a million inodes is much faster there.
    let base = if Path::new("/dev/shm").is_dir() {
        "/dev/shm"
    } else {
        "/tmp"
    };
    let t = tempfile::Builder::new()
        .prefix("sheaf-bigdir-")
        .tempdir_in(base)
        .unwrap();
    let src = t.path().join("src");
    let big = src.join("big");
    fs::create_dir_all(&big).unwrap();
    write(&src.join("README"), b"a big directory\n");
    let threads = 2;
    std::thread::scope(|s| {
        for k in 0..threads {
            let big = &big;
            s.spawn(move || create(big, k * N / threads..(k + 1) * N / threads));
        }
    });
    let made = start.elapsed();

    let img = t.path().join("big.sheaf");
    build(&src, &img, &[]);
    let built = start.elapsed();

    let im = sheaf_read::open_path(&img).unwrap();
    let dir = im.resolve(b"/big").unwrap();
    assert_eq!(im.dir_len(&dir).unwrap(), N);
    assert_eq!(dir.rec.size, N);
    let mut r = Rng::new(77);
    for _ in 0..1000 {
        let i = r.below(N);
        let path = format!("/big/{}", name(i));
        let ino = im
            .resolve(path.as_bytes())
            .unwrap_or_else(|e| panic!("{path}: {e}"));
        assert_eq!(ino.file_type(), sheaf_format::FileType::Regular, "{path}");
        assert_eq!(
            (ino.rec.mtime_sec, ino.rec.mtime_nsec),
            (MTIME0 + i as i64, (i % 1000) as u32),
            "{path} resolved to another entry"
        );
        assert_eq!(ino.rec.size, 0);
        assert_eq!(im.lookup(&dir, name(i).as_bytes()).unwrap(), Some(ino.ino));
    }
    // Entries are listed in name order (= number order here).
    for _ in 0..100 {
        let i = r.below(N);
        let e = im.read_dir(&dir, i, 2).unwrap();
        assert_eq!(e[0].name, name(i).as_bytes(), "entry {i}");
        if i + 1 < N {
            assert_eq!(e[1].name, name(i + 1).as_bytes(), "entry {}", i + 1);
        } else {
            assert_eq!(e.len(), 1);
        }
    }
    // Absent names: between, before and after the present ones.
    let mut absent: Vec<String> = vec![
        "f".into(),
        "e9999999".into(),
        "g".into(),
        "f10000000".into(),
        name(N),
        "F0000001".into(),
        "f000000".into(),
    ];
    while absent.len() < 100 {
        let i = r.below(N);
        absent.push(match r.below(3) {
            0 => format!("{}x", name(i)),
            1 => format!("{}.", &name(i)[..7]),
            _ => name(i)[..1 + r.below(7) as usize].to_string(),
        });
    }
    for n in &absent {
        assert_eq!(
            im.lookup(&dir, n.as_bytes()).unwrap(),
            None,
            "absent name {n:?} was found"
        );
        match im.resolve(format!("/big/{n}").as_bytes()) {
            Err(sheaf_read::ReadError::NotFound(_)) => {}
            other => panic!("absent name {n:?}: {other:?}"),
        }
    }
    drop(im);
    let o = sheaf(["check".as_ref(), img.as_os_str()]).ok();
    assert!(o.text().contains("OK"), "{}", o.describe());
    let checked = start.elapsed();
    let o = sheaf(["ls".as_ref(), img.as_os_str(), "big".as_ref()]).ok();
    assert_eq!(o.stdout.iter().filter(|&&b| b == b'\n').count() as u64, N);
    drop(t);
    eprintln!(
        "bigdir: {N} files made in {:.1} s, built in {:.1} s, checked by {:.1} s, total with ls and cleanup {:.1} s",
        made.as_secs_f64(),
        (built - made).as_secs_f64(),
        checked.as_secs_f64(),
        start.elapsed().as_secs_f64()
    );
}
