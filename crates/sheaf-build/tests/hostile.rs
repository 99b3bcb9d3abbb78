//! Hostile build inputs (issue 53, round two): deep paths, sparse bombs,
//! deep merges, and cancellation inside one large member. Each must build
//! in bounded time and memory or be refused with one line; expected values
//! are computed here, from the inputs, not by the code under test.

use sheaf_build::{build, BuildError, BuildOptions, Input, Progress};
use std::io::Read;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const EIB: u64 = 1 << 60;

fn opts() -> BuildOptions {
    BuildOptions {
        threads: 2,
        ..BuildOptions::default()
    }
}

fn pack(input: &Input, out: &Path) -> Result<(), BuildError> {
    build(
        input,
        out,
        &opts(),
        Arc::new(Progress::default()),
        &AtomicBool::new(false),
    )
    .map(|_| ())
}

/// A plain (ustar/GNU) tar of `entries`: a path and, for a file, its data
/// (`None`: a directory); long paths go in GNU long-name entries.
fn tar_of(entries: &[(Vec<u8>, Option<&[u8]>)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (path, data) in entries {
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o755);
        match data {
            Some(d) => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_size(d.len() as u64);
                b.append_data(&mut h, std::str::from_utf8(path).unwrap(), *d)
                    .unwrap();
            }
            None => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_size(0);
                b.append_data(&mut h, std::str::from_utf8(path).unwrap(), &[][..])
                    .unwrap();
            }
        }
    }
    b.into_inner().unwrap()
}

/// `depth` components named `name`, then `f`.
fn deep_path(depth: usize, name: &str) -> Vec<u8> {
    let mut p = format!("{name}/").repeat(depth).into_bytes();
    p.extend_from_slice(b"f");
    p
}

fn read_at(img: &sheaf_read::Image, path: &[u8], off: u64, n: usize) -> Vec<u8> {
    let ino = img.resolve(path).unwrap();
    let mut buf = vec![0xAA; n];
    let got = img.read(&ino, off, &mut buf).unwrap();
    buf.truncate(got);
    buf
}

/// Run `f` on a thread; fail if it takes longer than `limit`.
fn within<T: Send + 'static>(
    limit: Duration,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(v) => v,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("{what} still busy after {limit:?}")
        }
        Err(_) => panic!("{what} failed (above)"),
    }
}

#[test]
fn a_path_at_the_depth_limit_builds_and_one_deeper_is_refused_in_one_line() {
    let t = tempfile::tempdir().unwrap();
    // 4095 directories and a file: 4096 components, the limit.
    let ok = deep_path(4095, "a");
    let tar = t.path().join("ok.tar");
    std::fs::write(&tar, tar_of(&[(ok.clone(), Some(b"deep".as_slice()))])).unwrap();
    let img = t.path().join("ok.sheaf");
    pack(&Input::TarFile(tar), &img).unwrap();
    let im = sheaf_read::open_path(&img).unwrap();
    assert_eq!(read_at(&im, &ok, 0, 16), b"deep");
    // One level more, and far more (100,000: the 358-byte layer).
    for depth in [4096, 100_000] {
        let bad = deep_path(depth, "a");
        let tar = t.path().join(format!("bad{depth}.tar"));
        std::fs::write(&tar, tar_of(&[(bad, Some(b"x".as_slice()))])).unwrap();
        let out = t.path().join(format!("bad{depth}.sheaf"));
        let start = Instant::now();
        let e = pack(&Input::TarFile(tar), &out).unwrap_err();
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "{:?}",
            start.elapsed()
        );
        let msg = e.to_string();
        assert!(msg.contains("deeper than 4096 levels"), "{msg:.300}");
        assert!(
            !msg.contains('\n') && msg.len() < 600,
            "{} bytes: {msg:.300}",
            msg.len()
        );
        assert!(!out.exists());
    }
}

#[test]
fn a_deep_chain_of_entries_builds_in_linear_time() {
    // Every level its own entry, as `tar c` writes a deep tree: each
    // entry's parent was found by hashing every prefix of its path, so
    // 4095 levels took the cube of the depth (tens of seconds).
    let t = tempfile::tempdir().unwrap();
    let mut entries = Vec::new();
    let mut p = Vec::new();
    for _ in 0..4095 {
        if !p.is_empty() {
            p.push(b'/');
        }
        p.push(b'a');
        entries.push((p.clone(), None));
    }
    let mut f = p.clone();
    f.extend_from_slice(b"/f");
    entries.push((f.clone(), Some(b"bottom".as_slice())));
    let tar = t.path().join("chain.tar");
    std::fs::write(&tar, tar_of(&entries)).unwrap();
    let img = t.path().join("chain.sheaf");
    let start = Instant::now();
    let (i2, tar2) = (img.clone(), tar.clone());
    within(Duration::from_secs(60), "a 4095-level chain", move || {
        pack(&Input::TarFile(tar2), &i2).unwrap()
    });
    let took = start.elapsed();
    assert!(took < Duration::from_secs(3), "4095 levels took {took:?}");
    let im = sheaf_read::open_path(&img).unwrap();
    assert_eq!(read_at(&im, &f, 0, 16), b"bottom");
}

/// Peak RSS in KiB of running this test binary's test `name` alone with
/// `SHEAF_TEST_INNER` set (so the measure is that build's, not this
/// process's other tests').
#[allow(clippy::zombie_processes)] // reaped by wait4, which gives its rusage
fn peak_rss_of(name: &str) -> (i32, i64) {
    use std::os::unix::process::ExitStatusExt;
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--test-threads", "1", "--nocapture"])
        .env("SHEAF_TEST_INNER", "1")
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut status = 0;
    // SAFETY: a zeroed rusage is valid; wait4 fills it for our own child.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut ru) };
    assert_eq!(pid, child.id() as i32);
    let st = std::process::ExitStatus::from_raw(status);
    (st.code().unwrap_or(-1), ru.ru_maxrss)
}

#[test]
fn a_deep_path_of_long_names_costs_its_length_in_memory() {
    if std::env::var_os("SHEAF_TEST_INNER").is_none() {
        let (code, kib) = peak_rss_of("a_deep_path_of_long_names_costs_its_length_in_memory");
        assert_eq!(code, 0, "the inner build failed");
        // The path is 4000 × 101 bytes = 404 KB; every implied directory
        // keeping its whole path cost half of 4000 × 404 KB = 808 MB.
        assert!(kib < 250 << 10, "peak RSS {} MiB", kib >> 10);
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let name = "n".repeat(100);
    let p = deep_path(4000, &name);
    let tar = t.path().join("long.tar");
    std::fs::write(&tar, tar_of(&[(p.clone(), Some(b"long".as_slice()))])).unwrap();
    let img = t.path().join("long.sheaf");
    pack(&Input::TarFile(tar), &img).unwrap();
    let im = sheaf_read::open_path(&img).unwrap();
    assert_eq!(read_at(&im, &p, 0, 16), b"long");
}

#[test]
fn merging_a_3000_level_stack_takes_linear_time() {
    // sheaf merge grew with the cube of the depth: 3000 levels took 32 s.
    let t = tempfile::tempdir().unwrap();
    let p = deep_path(2999, "d");
    let tar = t.path().join("deep.tar");
    std::fs::write(&tar, tar_of(&[(p.clone(), Some(b"merged".as_slice()))])).unwrap();
    let img = t.path().join("deep.sheaf");
    pack(&Input::TarFile(tar), &img).unwrap();
    let layer = Arc::new(sheaf_read::open_path(&img).unwrap());
    let stack = sheaf_read::Stack::new(vec![layer.clone(), layer]);
    let src = sheaf_build::stack_input::StackSource::new(stack);
    let out = t.path().join("merged.sheaf");
    let o2 = out.clone();
    let start = Instant::now();
    within(Duration::from_secs(120), "a 3000-level merge", move || {
        pack(&Input::Entries(Arc::new(src)), &o2).unwrap()
    });
    let took = start.elapsed();
    assert!(took < Duration::from_secs(3), "3000 levels took {took:?}");
    let im = sheaf_read::open_path(&out).unwrap();
    assert_eq!(read_at(&im, &p, 0, 16), b"merged");
}

/// A tar number field: octal, or base-256 when it does not fit.
fn num(field: &mut [u8], v: u64) {
    let s = format!("{v:o}");
    if s.len() < field.len() {
        let w = field.len() - 1;
        field[..w].copy_from_slice(format!("{v:0w$o}").as_bytes());
        field[w] = 0;
    } else {
        field.fill(0);
        field[0] = 0x80;
        let n = field.len();
        field[n - 8..].copy_from_slice(&v.to_be_bytes());
    }
}

fn checksum(h: &mut [u8; 512]) {
    h[148..156].fill(b' ');
    let sum: u32 = h.iter().map(|&b| b as u32).sum();
    h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
}

/// The bytes of segment `i` of `len` bytes: a pattern of its own.
fn seg_bytes(i: usize, len: u64) -> Vec<u8> {
    (0..len)
        .map(|j| (i as u64 * 7 + j % 251) as u8 | 1)
        .collect()
}

/// An old-GNU sparse member (type `S`) `file` of `real` bytes holding
/// `segs`, with extension headers when there are more than four.
fn gnu_sparse_tar(real: u64, segs: &[(u64, u64)]) -> Vec<u8> {
    let mut h = [0u8; 512];
    h[..4].copy_from_slice(b"file");
    num(&mut h[100..108], 0o644);
    num(&mut h[108..116], 0);
    num(&mut h[116..124], 0);
    num(&mut h[124..136], segs.iter().map(|s| s.1).sum());
    num(&mut h[136..148], 0);
    h[156] = b'S';
    h[257..265].copy_from_slice(b"ustar  \0");
    for (i, &(o, l)) in segs.iter().take(4).enumerate() {
        num(&mut h[386 + 24 * i..398 + 24 * i], o);
        num(&mut h[398 + 24 * i..410 + 24 * i], l);
    }
    h[482] = (segs.len() > 4) as u8;
    num(&mut h[483..495], real);
    checksum(&mut h);
    let mut out = h.to_vec();
    let rest: Vec<_> = segs.iter().skip(4).collect();
    let n = rest.chunks(21).count();
    for (k, c) in rest.chunks(21).enumerate() {
        let mut x = [0u8; 512];
        for (i, &&(o, l)) in c.iter().enumerate() {
            num(&mut x[24 * i..24 * i + 12], o);
            num(&mut x[24 * i + 12..24 * i + 24], l);
        }
        x[504] = (k + 1 < n) as u8;
        out.extend_from_slice(&x);
    }
    for (i, &(_, l)) in segs.iter().enumerate() {
        out.extend(seg_bytes(i, l));
    }
    out.resize(out.len().div_ceil(512) * 512 + 1024, 0);
    out
}

/// A PAX 1.0 sparse member (GNU tar `--format=pax -S`).
fn pax_sparse_tar(real: u64, segs: &[(u64, u64)]) -> Vec<u8> {
    let mut map = format!("{}\n", segs.len());
    for (o, l) in segs {
        map.push_str(&format!("{o}\n{l}\n"));
    }
    let mut data = map.into_bytes();
    data.resize(data.len().div_ceil(512) * 512, 0);
    for (i, &(_, l)) in segs.iter().enumerate() {
        data.extend(seg_bytes(i, l));
    }
    let mut b = tar::Builder::new(Vec::new());
    let real_s = real.to_string();
    b.append_pax_extensions([
        ("GNU.sparse.major", b"1".as_slice()),
        ("GNU.sparse.minor", b"0"),
        ("GNU.sparse.name", b"file"),
        ("GNU.sparse.realsize", real_s.as_bytes()),
    ])
    .unwrap();
    let mut h = tar::Header::new_ustar();
    h.set_mode(0o644);
    h.set_size(data.len() as u64);
    h.set_entry_type(tar::EntryType::Regular);
    b.append_data(&mut h, "GNUSparseFile.0/file", &data[..])
        .unwrap();
    b.into_inner().unwrap()
}

/// Check the built `file` against `segs` of `real` bytes: the size, each
/// segment's bytes and the zeros around it.
fn check_sparse(img: &Path, real: u64, segs: &[(u64, u64)]) {
    let im = sheaf_read::open_path(img).unwrap();
    let ino = im.resolve(b"file").unwrap();
    assert_eq!(ino.rec.size, real);
    for (i, &(o, l)) in segs.iter().enumerate() {
        assert_eq!(
            read_at(&im, b"file", o, l as usize),
            seg_bytes(i, l),
            "segment {i}"
        );
        if o >= 16 {
            assert_eq!(
                read_at(&im, b"file", o - 16, 16),
                [0; 16],
                "before segment {i}"
            );
        }
    }
    assert_eq!(read_at(&im, b"file", real / 2 + 12345, 64), [0; 64]);
    assert_eq!(read_at(&im, b"file", real - 1, 8).len(), 1);
}

#[test]
fn sparse_tar_members_claiming_an_exbibyte_build_in_seconds() {
    let t = tempfile::tempdir().unwrap();
    // Segments at the start, at 1 TiB (not block-aligned), and the end
    // (GNU tar's segments hold whole 512-byte records but the last); with
    // 30 segments, the GNU map needs two extension headers.
    let mut segs = vec![(0, 512), ((1 << 40) + 1000, 3072)];
    for i in 0..27u64 {
        segs.push(((1 << 50) + i * (64 << 20), 4096));
    }
    segs.push((EIB - 512, 512));
    for (kind, bytes) in [
        ("gnu", gnu_sparse_tar(EIB, &segs)),
        ("pax", pax_sparse_tar(EIB, &segs)),
    ] {
        let tar = t.path().join(format!("{kind}.tar"));
        std::fs::write(&tar, bytes).unwrap();
        let img = t.path().join(format!("{kind}.sheaf"));
        let i2 = img.clone();
        let start = Instant::now();
        within(Duration::from_secs(60), kind, move || {
            pack(&Input::TarFile(tar), &i2).unwrap()
        });
        // Under a second on a quiet 2-core machine; 2.5 s seen under a
        // load of 4 to 10. Reading the claimed bytes would take years.
        let took = start.elapsed();
        assert!(took < Duration::from_secs(20), "{kind}: {took:?}");
        check_sparse(&img, EIB, &segs);
    }
}

#[test]
fn a_sparse_member_claiming_more_than_a_file_can_hold_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let real = (i64::MAX as u64) + 1;
    // GNU tar ends a map with an empty segment at the size.
    let segs = [(0, 512), (real, 0)];
    for (kind, bytes) in [
        ("gnu", gnu_sparse_tar(real, &segs)),
        ("pax", pax_sparse_tar(real, &segs)),
    ] {
        let tar = t.path().join(format!("{kind}.tar"));
        std::fs::write(&tar, bytes).unwrap();
        let img = t.path().join(format!("{kind}.sheaf"));
        let i2 = img.clone();
        let e = within(Duration::from_secs(10), kind, move || {
            pack(&Input::TarFile(tar), &i2).unwrap_err()
        });
        let msg = e.to_string();
        assert!(!msg.contains('\n'), "{msg}");
        assert!(msg.contains(&i64::MAX.to_string()), "{kind}: {msg}");
        assert!(!img.exists());
    }
}

/// A directory for a sparse file as large as its filesystem allows, from
/// 4 EiB down (tmpfs holds 4 EiB; ext4 16 TiB; every filesystem sheaf
/// builds from holds 1 TiB): the directory and the size.
fn sparse_dir() -> (tempfile::TempDir, u64) {
    let sizes = [4 * EIB, 64 << 50, (16 << 40) - (1 << 20), 1 << 40];
    for base in ["/dev/shm", &std::env::temp_dir().display().to_string()] {
        let Ok(d) = tempfile::tempdir_in(base) else {
            continue;
        };
        for &n in &sizes {
            let f = std::fs::File::create(d.path().join("file")).unwrap();
            if f.set_len(n).is_ok() {
                return (d, n);
            }
        }
    }
    panic!("no filesystem here holds a 1 TiB sparse file");
}

#[test]
fn a_directory_with_a_huge_sparse_file_builds_in_bounded_time_and_memory() {
    if std::env::var_os("SHEAF_TEST_INNER").is_none() {
        let (code, kib) =
            peak_rss_of("a_directory_with_a_huge_sparse_file_builds_in_bounded_time_and_memory");
        assert_eq!(code, 0, "the inner build failed");
        // A hole chunk per 4 GiB took 24 bytes per 4 GiB: 24 GB for 4 EiB.
        assert!(kib < 300 << 10, "peak RSS {} MiB", kib >> 10);
        return;
    }
    use std::os::unix::fs::FileExt;
    let (d, real) = sparse_dir();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(d.path().join("file"))
        .unwrap();
    let segs = [(0, 100), (real / 3 + 5, 5000), (real - 200, 200)];
    for (i, &(o, l)) in segs.iter().enumerate() {
        f.write_all_at(&seg_bytes(i, l), o).unwrap();
    }
    drop(f);
    let out = tempfile::tempdir().unwrap();
    let img = out.path().join("sparse.sheaf");
    let start = Instant::now();
    pack(&Input::Dir(d.path().to_path_buf()), &img).unwrap();
    let took = start.elapsed();
    assert!(took < Duration::from_secs(5), "{real} bytes: {took:?}");
    check_sparse(&img, real, &segs);
}

/// Zeros without end, after a tar header claiming a 1 TiB regular file.
struct Endless {
    head: Vec<u8>,
    at: usize,
}

impl Read for Endless {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.at < self.head.len() {
            let n = buf.len().min(self.head.len() - self.at);
            buf[..n].copy_from_slice(&self.head[self.at..self.at + n]);
            self.at += n;
            return Ok(n);
        }
        buf.fill(0);
        Ok(buf.len())
    }
}

#[test]
fn cancelling_stops_a_build_inside_one_large_member() {
    // The cancel flag (SIGINT, SIGTERM in the CLI) was polled between
    // entries only: one member of 1 TiB of zeros kept a build going.
    let mut h = tar::Header::new_gnu();
    h.set_path("big").unwrap();
    h.set_mode(0o644);
    h.set_size(1 << 40);
    h.set_entry_type(tar::EntryType::Regular);
    h.set_cksum();
    let src = Endless {
        head: h.as_bytes().to_vec(),
        at: 0,
    };
    let stream = sheaf_build::TarStream {
        name: "endless".into(),
        reader: Arc::new(std::sync::Mutex::new(Box::new(src))),
    };
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("x.sheaf");
    let cancel = Arc::new(AtomicBool::new(false));
    let c2 = cancel.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r = build(
            &Input::Layer(stream),
            &img,
            &opts(),
            Arc::new(Progress::default()),
            &c2,
        );
        let _ = tx.send(r.map(|_| ()));
    });
    std::thread::sleep(Duration::from_millis(500));
    cancel.store(true, Ordering::Relaxed);
    let r = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("still building 5 s after the cancel");
    assert!(matches!(r, Err(BuildError::Interrupted)), "{r:?}");
}
