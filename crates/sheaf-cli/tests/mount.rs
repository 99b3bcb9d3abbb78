//! `sheaf mount` on real FUSE: trees compared attribute by attribute with
//! their source, concurrent readers, a non-root user, mount/umount cycles,
//! kill -9, signals, fstab, statistics and every refusal.
//!
//! The real trees K (Linux source) and P (a scientific Python stack) come
//! from `bench/setup.sh K P`, which `make test` runs and points
//! `SHEAF_BENCH_DATA` at; run without it, those two tests fail (and the
//! fast tier, `make check`, skips them).

mod common;
#[path = "mount/procs.rs"]
mod procs;
#[path = "mount/uring.rs"]
mod uring;

use common::*;
use procs::{named, servers};
use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

fn stats(mp: &Path) -> serde_json::Value {
    json(&sheaf(["stats".as_ref(), "--json".as_ref(), mp.as_os_str()]).ok())
}

/// A packed copy of `small_tree` plus a few larger files, shared by tests.
fn sample() -> Scenario {
    Scenario::new(|src| {
        small_tree(src, 11);
        let mut r = Rng::new(5);
        for i in 0..6 {
            write(
                &src.join(format!("big{i}.bin")),
                &r.bytes((3 << 20) + i * 77_777),
            );
        }
    })
    .build(&[])
}

/// An image (`one.sheaf`) of a tree holding one file `name` with `data`.
fn one_file(name: &str, data: &[u8], extra: &[&str]) -> Scenario {
    Scenario::new(|src| write(&src.join(name), data))
        .image_name("one.sheaf")
        .build(extra)
}

/// Mount an image of a real tree and compare every entry with the source
/// (types, modes, owners, sizes, mtimes with nanoseconds, nlink, xattrs,
/// symlink targets, hardlink identity, contents), then `diff -r`.
fn real_tree_mounts_identically(name: &str) {
    let Some(src) = real_tree(name) else { return };
    let sc = Scenario::of(&src)
        .image_name(&format!("{name}.sheaf"))
        .build(&[]);
    let mp = sc.mp.clone();
    let _m = sc.mount(&[]);
    assert_tree_eq(&mp, &src);
    assert_diff_r(&src, &mp);
}

#[test]
fn tree_k_mounts_identically() {
    real_tree_mounts_identically("K");
}

#[test]
fn tree_p_mounts_identically() {
    real_tree_mounts_identically("P");
}

#[test]
fn sixteen_concurrent_random_readers_see_the_source() {
    let sc = sample();
    let (src, mp) = (sc.src.clone(), sc.mp.clone());
    let _m = sc.mount(&["-o", "cache_size=8M"]);
    let files: Vec<Vec<u8>> = walk(&src)
        .into_iter()
        .filter(|p| fs::symlink_metadata(join(&src, p)).unwrap().is_file())
        .collect();
    assert!(files.len() > 10);
    std::thread::scope(|s| {
        for th in 0..16u64 {
            let (files, src, mp) = (&files, &src, &mp);
            s.spawn(move || {
                let mut r = Rng::new(100 + th);
                for _ in 0..150 {
                    let p = &files[r.below(files.len() as u64) as usize];
                    let want = fs::read(join(src, p)).unwrap();
                    let mut f = fs::File::open(join(mp, p)).unwrap();
                    let off = r.below(want.len() as u64 + 1);
                    let len = r.below((want.len() as u64 - off).min(3 << 20) + 1) as usize;
                    f.seek(SeekFrom::Start(off)).unwrap();
                    let mut got = vec![0u8; len];
                    let n = read_full(&mut f, &mut got).unwrap();
                    assert_eq!(n, len, "{}: short read", lossy(p));
                    assert!(
                        got == want[off as usize..off as usize + len],
                        "{} @{off}+{len}: wrong bytes",
                        lossy(p)
                    );
                }
            });
        }
    });
    // An 8 MiB cache under 16 readers of 4 MiB blocks must have evicted and
    // reloaded, so this also exercised eviction and single-flight waits.
    let s = stats(&mp);
    assert!(s["block_cache"]["evictions"].as_u64().unwrap() > 0, "{s}");
    assert!(s["block_cache"]["size"].as_u64().unwrap() <= 8 << 20, "{s}");
    assert_eq!(s["image_errors"], 0);
}

#[test]
fn posix_view_is_read_only_and_complete() {
    let sc = sample();
    let (src, img, mp) = (sc.src.clone(), sc.img.clone(), sc.mp.clone());
    let _m = sc.mount(&[]);
    // Writes of every kind fail with EROFS.
    let f = mp.join("big0.bin");
    let erofs = |r: std::io::Result<()>, what: &str| {
        let e = r.expect_err(what);
        assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{what}: {e}");
    };
    erofs(fs::write(mp.join("new"), b"x"), "create");
    erofs(
        fs::OpenOptions::new().write(true).open(&f).map(drop),
        "open for writing",
    );
    erofs(fs::create_dir(mp.join("d")), "mkdir");
    erofs(fs::remove_file(&f), "unlink");
    erofs(fs::rename(&f, mp.join("x")), "rename");
    erofs(
        fs::set_permissions(&f, fs::Permissions::from_mode(0o777)),
        "chmod",
    );
    erofs(xattr::set(&f, "user.x", b"1"), "setxattr");
    let c = cstr(&f);
    assert_eq!(unsafe { libc::access(c.as_ptr(), libc::W_OK) }, -1);
    assert_eq!(unsafe { libc::access(c.as_ptr(), libc::R_OK) }, 0);
    // statfs: image size and file count.
    let mut sfs: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(cstr(&mp).as_ptr(), &mut sfs) }, 0);
    let inodes: std::collections::BTreeSet<u64> = walk(&src)
        .iter()
        .map(|p| fs::symlink_metadata(join(&src, p)).unwrap().ino())
        .collect();
    assert_eq!(sfs.f_files, inodes.len() as u64);
    let img_len = fs::metadata(&img).unwrap().len();
    assert_eq!(sfs.f_blocks * sfs.f_frsize, img_len.div_ceil(4096) * 4096);
    assert_ne!(sfs.f_flag & libc::ST_RDONLY, 0);
    assert_ne!(sfs.f_flag & libc::ST_NOSUID, 0);
    assert_ne!(sfs.f_flag & libc::ST_NODEV, 0);
    // Stable inode numbers: the same after the kernel forgets them.
    let ino = fs::metadata(&f).unwrap().ino();
    fs::write("/proc/sys/vm/drop_caches", "2").ok();
    assert_eq!(fs::metadata(&f).unwrap().ino(), ino);
    let m = fs::metadata(&f).unwrap();
    assert_eq!(m.blocks(), m.size().div_ceil(512));
    assert!(m.blksize() >= 512);
    // Missing names are ENOENT, repeatedly (the second from the kernel's cache).
    for _ in 0..2 {
        let e = fs::metadata(mp.join("no-such")).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
    }
}

#[test]
fn uid_gid_options_present_another_owner() {
    let sc = sample();
    let mp = sc.mp.clone();
    let _m = sc.mount(&["-o", "uid=4321,gid=8765"]);
    let (src, shown) = (walk(&sc.src), walk(&mp));
    // The mount shows every entry of the source (an empty mount would pass
    // the owner check below vacuously); the root counts too.
    assert!(src.len() > 10);
    assert_eq!(shown, src, "entries shown");
    for p in &shown {
        let m = fs::symlink_metadata(join(&mp, p)).unwrap();
        assert_eq!((m.uid(), m.gid()), (4321, 8765), "{}", lossy(p));
    }
}

#[test]
fn sequential_reads_decompress_ahead() {
    let data = Rng::new(3).text(24 << 20);
    let sc = one_file("stream.txt", &data, &[]);
    let mp = sc.mp.clone();
    let _m = sc.mount(&[]);
    let mut got = Vec::new();
    fs::File::open(mp.join("stream.txt"))
        .unwrap()
        .read_to_end(&mut got)
        .unwrap();
    assert!(got == data, "wrong bytes");
    let s = stats(&mp);
    assert!(s["prefetch"]["queued"].as_u64().unwrap() >= 3, "{s}");
    assert!(s["ops"]["read"]["count"].as_u64().unwrap() > 0);
    assert!(s["bytes_served"].as_u64().unwrap() >= data.len() as u64);
    assert!(s["blocks_decompressed"].as_u64().unwrap() >= 6, "{s}");
    assert!(s["image_bytes_read"].as_u64().unwrap() > 0);
    // The human form names the same things.
    let h = sheaf(["stats".as_ref(), mp.as_os_str()]).ok().text();
    for w in ["block cache", "readahead", "read from image", "read "] {
        assert!(h.contains(w), "{w} missing from:\n{h}");
    }
}

#[test]
fn mount_umount_100_times_leaks_nothing() {
    let sc = sample();
    let mp = sc.mp.clone();
    fs::create_dir(&mp).unwrap();
    let fds = || fs::read_dir("/proc/self/fd").unwrap().count();
    let before = fds();
    let start = Instant::now();
    for i in 0..100 {
        let m = sc.mount(&[]);
        assert!(
            mp.join("big1.bin").exists(),
            "cycle {i}: not ready on return"
        );
        m.umount();
        assert!(!is_mounted(&mp), "cycle {i}: still mounted");
        assert!(servers(&mp).is_empty(), "cycle {i}: server still running");
    }
    eprintln!("100 mount/umount cycles: {:?}", start.elapsed());
    // Tests running alongside open and close descriptors of their own:
    // a leak stays, their pipes and files come and go (and may have been
    // open when `before` was counted).
    let settled = (0..100).any(|_| {
        fds() <= before || {
            std::thread::sleep(Duration::from_millis(20));
            false
        }
    });
    assert!(settled, "descriptors leaked into the test process");
    assert!(fs::read_dir(&mp).unwrap().next().is_none());
}

#[test]
fn kill_9_gives_an_error_not_a_hang_and_the_mountpoint_recovers() {
    let sc = sample();
    let (src, mp) = (sc.src.clone(), sc.mp.clone());
    let _m = sc.mount(&[]);
    let mut f = fs::File::open(mp.join("big2.bin")).unwrap();
    let pids = servers(&mp);
    assert_eq!(pids.len(), 1, "{pids:?}");
    unsafe { libc::kill(pids[0] as i32, libc::SIGKILL) };
    // A reader with an open file gets an error promptly.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 1 << 20];
        f.seek(SeekFrom::Start(2 << 20)).unwrap();
        tx.send(f.read(&mut buf).map(|_| ())).unwrap();
    });
    let r = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("read hung after kill -9");
    let e = r.expect_err("read succeeded from a dead mount");
    // ECONNABORTED when the read was already queued as the connection died.
    assert!(
        matches!(
            e.raw_os_error(),
            Some(libc::ENOTCONN | libc::EIO | libc::ECONNABORTED)
        ),
        "{e}"
    );
    // The watchdog (fusermount3's for a user, sheaf's own for root)
    // unmounts by itself.
    let deadline = Instant::now() + Duration::from_secs(5);
    while is_mounted(&mp) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!is_mounted(&mp), "mount left behind after kill -9");
    let _m2 = sc.mount(&[]);
    same_content(&src.join("big2.bin"), &mp.join("big2.bin")).unwrap();
}

#[test]
fn root_mounts_without_fusermount3_and_its_watchdog_spares_later_mounts() {
    if !prerequisite(is_root(), "root, to mount with mount(2)") {
        return;
    }
    let sc = sample();
    let (src, img, mp) = (sc.src.clone(), sc.img.clone(), sc.mp.clone());
    fs::create_dir(&mp).unwrap();
    let up = || sheaf(["mount".as_ref(), img.as_os_str(), mp.as_os_str()]).ok();
    up();
    assert!(named("fusermount3", &mp).is_empty(), "fusermount3 started");
    // The watchdog names itself just after its fork: on a loaded machine
    // that may come a moment after the mount is ready.
    let t0 = Instant::now();
    let mut dogs = named("sheaf-watchdog", &mp);
    while dogs.is_empty() && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
        dogs = named("sheaf-watchdog", &mp);
    }
    assert_eq!(dogs.len(), 1, "one watchdog");
    // Its socket and nothing else (not the image, not a pipe that
    // `sheaf mount` waits on).
    let held = fs::read_dir(format!("/proc/{}/fd", dogs[0]))
        .unwrap()
        .count();
    assert_eq!(held, 1, "descriptors the watchdog holds");
    // umount(8) returns before the server has exited, so its watchdog
    // wakes while the next mount, which may get the same device number,
    // is already there: it must leave that one alone.
    for i in 0..20 {
        run_cmd(Command::new("umount").arg(&mp)).ok();
        up();
        assert!(is_mounted(&mp), "cycle {i}: not mounted");
    }
    std::thread::sleep(Duration::from_millis(500));
    assert!(is_mounted(&mp), "a watchdog unmounted a later mount");
    same_content(&src.join("big1.bin"), &mp.join("big1.bin")).unwrap();
    sheaf(["umount".as_ref(), mp.as_os_str()]).ok();
    assert!(!is_mounted(&mp));
    let deadline = Instant::now() + Duration::from_secs(5);
    while !named("sheaf-watchdog", &mp).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        named("sheaf-watchdog", &mp).is_empty(),
        "watchdogs left running"
    );
}

#[test]
fn sigterm_and_sigint_unmount_cleanly() {
    let sc = sample();
    let mp = sc.mp.clone();
    for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        let _m = sc.mount(&[]);
        let pids = servers(&mp);
        assert_eq!(pids.len(), 1);
        unsafe { libc::kill(pids[0] as i32, sig) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while (is_mounted(&mp) || !servers(&mp).is_empty()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!is_mounted(&mp), "signal {sig}: still mounted");
        assert!(
            servers(&mp).is_empty(),
            "signal {sig}: server still running"
        );
    }
}

#[test]
fn foreground_mode_logs_to_stderr_and_stops_on_umount() {
    let sc = sample();
    let (img, mp) = (sc.img.clone(), sc.mp.clone());
    fs::create_dir(&mp).unwrap();
    let child = cmd()
        .arg("mount")
        .arg("-f")
        .arg(&img)
        .arg(&mp)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !is_mounted(&mp) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(mp.join("big0.bin").exists());
    sheaf(["umount".as_ref(), mp.as_os_str()]).ok();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("mounted"), "{err}");
}

#[test]
fn busy_mount_refuses_plain_umount_and_takes_lazy() {
    let sc = sample();
    let mp = sc.mp.clone();
    let _m = sc.mount(&[]);
    let mut busy = Command::new("sleep")
        .arg("30")
        .current_dir(&mp)
        .spawn()
        .unwrap();
    let o = sheaf(["umount".as_ref(), mp.as_os_str()]).fails_with(1);
    assert!(o.one_err_line().contains("busy"), "{}", o.describe());
    assert!(is_mounted(&mp));
    sheaf(["umount".as_ref(), "--lazy".as_ref(), mp.as_os_str()]).ok();
    assert!(!is_mounted(&mp));
    busy.kill().unwrap();
    busy.wait().unwrap();
}

/// Each refusal: exit 1, one line naming the thing, nothing mounted, no server.
#[test]
fn every_refusal_is_one_line_and_leaves_nothing() {
    let sc = sample();
    let (img, mp) = (sc.img.clone(), sc.mp.clone());
    fs::create_dir(&mp).unwrap();
    let notdir = sc.dir().join("file");
    write(&notdir, b"x");
    let short = sc.dir().join("short.sheaf");
    fs::write(&short, &fs::read(&img).unwrap()[..4000]).unwrap();
    let flipped = sc.dir().join("flipped.sheaf");
    let mut b = fs::read(&img).unwrap();
    let n = b.len();
    b[n - 100] ^= 0x40; // inside the section table / trailer area
    fs::write(&flipped, &b).unwrap();
    let s = |p: &Path| p.to_string_lossy().into_owned();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec![s(&img), s(&sc.dir().join("absent"))],
            "does not exist; create it: mkdir -p",
        ),
        (vec![s(&img), s(&notdir)], "not a directory"),
        (vec![s(&sc.dir().join("none.sheaf")), s(&mp)], "none.sheaf"),
        (vec![s(&notdir), s(&mp)], "file"),
        (vec![s(&short), s(&mp)], "short.sheaf"),
        (vec![s(&flipped), s(&mp)], "flipped.sheaf"),
        (vec!["-o".into(), "bogus".into(), s(&img), s(&mp)], "bogus"),
        (vec!["-o".into(), "rw".into(), s(&img), s(&mp)], "read-only"),
        (
            vec!["-o".into(), "cache_size=lots".into(), s(&img), s(&mp)],
            "cache_size",
        ),
    ];
    for (args, want) in cases {
        let o = sheaf(std::iter::once("mount".to_string()).chain(args.clone())).fails_with(1);
        let line = o.one_err_line();
        assert!(line.contains(want), "{args:?}: {line}");
        assert!(!is_mounted(&mp), "{args:?}: left a mount");
        assert!(servers(&mp).is_empty(), "{args:?}: left a server");
    }
    // Already mounted.
    let _m = sc.mount(&[]);
    let o = sheaf(["mount".as_ref(), img.as_os_str(), mp.as_os_str()]).fails_with(1);
    assert!(
        o.one_err_line().contains("already a mount point"),
        "{}",
        o.describe()
    );
    assert_eq!(servers(&mp).len(), 1);
    drop(_m);
    // umount / stats of something that is not a sheaf mount.
    let o = sheaf(["umount".as_ref(), mp.as_os_str()]).fails_with(1);
    assert!(o.one_err_line().contains("not mounted"));
    let o = sheaf(["umount", "/proc"]).fails_with(1);
    assert!(o.one_err_line().contains("not a sheaf mount"));
    let o = sheaf(["stats".as_ref(), mp.as_os_str()]).fails_with(1);
    assert!(o.one_err_line().contains("not the root of a sheaf mount"));
}

/// `sheaf` is a small program that mounts one local image itself (a cold
/// mount loads 2 MB, not the whole tool) and runs `sheaf-full` for the rest:
/// the serving process is `sheaf` for a local image and `sheaf-full` for a
/// stack; a refusal reads the same from both; without `sheaf-full` beside
/// it, local mounts still work and everything else names what is missing.
#[test]
fn the_small_sheaf_mounts_local_images_and_hands_the_rest_over() {
    let sc = sample();
    let (src, img) = (sc.src.clone(), sc.img.clone());
    let full = Path::new(bin()).with_file_name("sheaf-full");
    assert!(full.is_file(), "{} is not built", full.display());
    let exe_of = |mp: &Path| -> String {
        let pids = servers(mp);
        assert_eq!(pids.len(), 1, "servers of {}", mp.display());
        let exe = fs::read_link(format!("/proc/{}/exe", pids[0])).unwrap();
        exe.file_name().unwrap().to_string_lossy().into_owned()
    };
    let mp = sc.mp.clone();
    {
        let _m = sc.mount(&["-o", "mem_cache=32M"]);
        assert_eq!(exe_of(&mp), "sheaf");
        same_content(&src.join("big2.bin"), &mp.join("big2.bin")).unwrap();
    }
    {
        let _m = mount(&[&img, &img], &mp, &[]);
        assert_eq!(exe_of(&mp), "sheaf-full");
        same_content(&src.join("big1.bin"), &mp.join("big1.bin")).unwrap();
    }
    // The same refusal, word for word, from either program.
    let bad = sc.dir().join("bad.sheaf");
    fs::write(&bad, &fs::read(&img).unwrap()[..5000]).unwrap();
    let nowhere = sc.dir().join("nowhere");
    for args in [
        vec![bad.as_os_str(), mp.as_os_str()],
        vec![img.as_os_str(), nowhere.as_os_str()],
        vec![
            "-o".as_ref(),
            "threads=0".as_ref(),
            img.as_os_str(),
            mp.as_os_str(),
        ],
    ] {
        let a = sheaf(std::iter::once("mount".as_ref()).chain(args.clone())).fails_with(1);
        let b = run_cmd(Command::new(&full).arg("mount").args(&args)).fails_with(1);
        assert_eq!(a.one_err_line(), b.one_err_line());
        assert!(!is_mounted(&mp));
    }
    // Alone: a local mount still works; other commands say what is missing.
    let alone = sc.dir().join("alone");
    fs::create_dir(&alone).unwrap();
    fs::copy(bin(), alone.join("sheaf")).unwrap();
    let mut c = Command::new(alone.join("sheaf"));
    c.arg("mount").arg(&img).arg(&mp);
    {
        let _m = Mounted::run(&mut c, &mp);
        same_content(&src.join("big0.bin"), &mp.join("big0.bin")).unwrap();
    }
    let o = run_cmd(Command::new(alone.join("sheaf")).arg("--version")).fails_with(127);
    let line = o.one_err_line();
    assert!(line.contains("sheaf-full is missing"), "{line}");
    let o = run_cmd(
        Command::new(alone.join("sheaf"))
            .arg("mount")
            .arg(&img)
            .arg(&img)
            .arg(&mp),
    )
    .fails_with(127);
    assert!(o.one_err_line().contains("sheaf-full is missing"));
    assert!(!is_mounted(&mp));
}

#[test]
fn no_fuse_device_is_refused_clearly() {
    if !prerequisite(is_root(), "root, to hide /dev/fuse in a private namespace") {
        return;
    }
    let sc = sample();
    let (img, mp) = (sc.img.clone(), sc.mp.clone());
    fs::create_dir(&mp).unwrap();
    // A private mount namespace whose /dev is an empty tmpfs.
    let script = format!(
        "mount -t tmpfs none /dev && exec {} mount {} {}",
        bin(),
        img.display(),
        mp.display()
    );
    let o = run_cmd(Command::new("unshare").args([
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        &script,
    ]))
    .fails_with(1);
    assert!(
        o.one_err_line().contains("/dev/fuse: missing"),
        "{}",
        o.describe()
    );
    assert!(!is_mounted(&mp));
}

/// A user who may use /dev/fuse mounts without root; root itself is kept out
/// unless the user asks for allow_root. Also: a user without access to
/// /dev/fuse gets fusermount3's reason in one line.
#[test]
fn a_non_root_user_mounts_and_unmounts() {
    if !prerequisite(is_root(), "root, to create a test user") {
        return;
    }
    let user = "sheaf-mount-test";
    if Command::new("id")
        .arg(user)
        .output()
        .unwrap()
        .status
        .success()
    {
    } else {
        run_cmd(Command::new("useradd").args(["--no-create-home", "--shell", "/bin/sh", user]))
            .ok();
    }
    let sc = sample();
    let (src, img) = (sc.src.clone(), sc.img.clone());
    // The user owns the tree, so it can walk the source to compare.
    run_cmd(
        Command::new("chown")
            .arg("-R")
            .arg(format!("{user}:{user}"))
            .arg(&src),
    )
    .ok();
    build(&src, &img, &["--force"]).ok();
    fs::set_permissions(sc.dir(), fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(&img, fs::Permissions::from_mode(0o644)).unwrap();
    let mp = sc.dir().join("umnt");
    fs::create_dir(&mp).unwrap();
    run_cmd(Command::new("chown").arg(user).arg(&mp)).ok();
    let as_user = |args: &[&std::ffi::OsStr]| {
        let mut c = Command::new("setpriv");
        c.args(["--reuid", user, "--regid", user, "--init-groups", "--"])
            .arg(bin())
            .args(args);
        run_cmd(&mut c)
    };
    let dev = fs::metadata("/dev/fuse").unwrap().permissions().mode();
    // Without access to /dev/fuse: a clear refusal.
    fs::set_permissions("/dev/fuse", fs::Permissions::from_mode(0o600)).unwrap();
    let o = as_user(&["mount".as_ref(), img.as_os_str(), mp.as_os_str()]).fails_with(1);
    // Said in sheaf's words, what to do with it, not fusermount3's bare
    // "Permission denied".
    assert_eq!(
        o.one_err_line(),
        "sheaf: error: /dev/fuse: cannot be opened by this user (permission denied): mounting \
         without root needs it readable and writable by everyone (mode 0666, Debian's default; \
         an administrator can restore it: chmod 0666 /dev/fuse)",
        "{}",
        o.describe()
    );
    assert!(!is_mounted(&mp));
    // With the usual 0666: works.
    fs::set_permissions("/dev/fuse", fs::Permissions::from_mode(0o666)).unwrap();
    let r = std::panic::catch_unwind(|| {
        as_user(&["mount".as_ref(), img.as_os_str(), mp.as_os_str()]).ok();
        assert!(is_mounted(&mp));
        // Only the user may enter (no allow_other/allow_root): root is refused.
        let e = fs::read_dir(&mp).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EACCES), "{e}");
        // The user sees the source: same listing with attributes, same bytes.
        let listing = |dir: &Path| {
            let mut c = Command::new("setpriv");
            c.args([
                "--reuid",
                user,
                "--regid",
                user,
                "--init-groups",
                "--",
                "find",
            ])
            .arg(dir)
            .args(["-printf", "%P %y %m %U:%G %T@ %n %l\\n"]);
            let mut v: Vec<String> = run_cmd(&mut c)
                .ok()
                .text()
                .lines()
                .map(String::from)
                .collect();
            v.sort();
            v
        };
        assert_eq!(listing(&src), listing(&mp));
        let mut d = Command::new("setpriv");
        d.args([
            "--reuid",
            user,
            "--regid",
            user,
            "--init-groups",
            "--",
            "diff",
            "-r",
            "--no-dereference",
        ])
        .arg(&src)
        .arg(&mp);
        run_cmd(&mut d).ok();
        as_user(&["stats".as_ref(), mp.as_os_str()]).ok();
        as_user(&["umount".as_ref(), mp.as_os_str()]).ok();
        assert!(!is_mounted(&mp));
    });
    fs::set_permissions("/dev/fuse", fs::Permissions::from_mode(dev)).unwrap();
    let _ = Command::new("umount").arg("-l").arg(&mp).output();
    if let Err(e) = r {
        std::panic::resume_unwind(e);
    }
}

/// `mount -t fuse.sheaf` and an fstab line, through /sbin/mount.fuse.sheaf.
#[test]
fn mount_8_and_fstab_use_the_helper() {
    if !prerequisite(is_root(), "root, to install /sbin/mount.fuse.sheaf") {
        return;
    }
    let helper = Path::new("/sbin/mount.fuse.sheaf");
    let installed_here = fs::symlink_metadata(helper).is_err();
    if installed_here {
        std::os::unix::fs::symlink(fs::canonicalize(bin()).unwrap(), helper).unwrap();
    }
    let sc = sample();
    let (src, img, mp) = (sc.src.clone(), sc.img.clone(), sc.mp.clone());
    fs::create_dir(&mp).unwrap();
    let r = std::panic::catch_unwind(|| {
        run_cmd(
            Command::new("mount")
                .args(["-t", "fuse.sheaf", "-o", "cache_size=32M"])
                .arg(&img)
                .arg(&mp),
        )
        .ok();
        assert!(is_mounted(&mp));
        same_content(&src.join("big3.bin"), &mp.join("big3.bin")).unwrap();
        run_cmd(Command::new("umount").arg(&mp)).ok();
        assert!(!is_mounted(&mp));
        let fstab = sc.dir().join("fstab");
        fs::write(
            &fstab,
            format!(
                "# test\n{} {} fuse.sheaf defaults,noauto,allow_other,x-systemd.automount 0 0\n",
                img.display(),
                mp.display()
            ),
        )
        .unwrap();
        run_cmd(Command::new("mount").arg("-T").arg(&fstab).arg(&mp)).ok();
        assert!(is_mounted(&mp));
        assert!(mp.join("big4.bin").is_file());
        sheaf(["umount".as_ref(), mp.as_os_str()]).ok();
        assert!(!is_mounted(&mp));
    });
    if installed_here {
        let _ = fs::remove_file(helper);
    }
    let _ = Command::new("umount").arg("-l").arg(&mp).output();
    if let Err(e) = r {
        std::panic::resume_unwind(e);
    }
}

/// A flipped byte in a data block: readers of that file get EIO, the log
/// names the image and the block, other files still read correctly.
#[test]
fn a_corrupt_block_is_eio_with_a_log_line() {
    let a = Rng::new(1).text(6 << 20);
    let sc = one_file("a.txt", &a, &["-c", "none"]);
    let (img, mp) = (sc.img.clone(), sc.mp.clone());
    let mut b = fs::read(&img).unwrap();
    b[64 + 1000] ^= 1; // the first data block starts right after the 64-byte header
    fs::write(&img, &b).unwrap();
    let log = sc.dir().join("mount.log");
    let _m = sc.mount(&["-o", &format!("log={}", log.display())]);
    let e = fs::read(mp.join("a.txt")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    // The second block is intact.
    let mut f = fs::File::open(mp.join("a.txt")).unwrap();
    f.seek(SeekFrom::Start(5 << 20)).unwrap();
    let mut tail = Vec::new();
    f.read_to_end(&mut tail).unwrap();
    assert!(tail == a[5 << 20..]);
    let text = fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("one.sheaf") && text.contains("data block 0"),
        "log:\n{text}"
    );
    // The start is announced, in this order, by the thread that waits for
    // signals while requests are already served (so it may come a moment
    // after the first replies).
    let announced = |text: &str| {
        let mounted = text.find(&format!("mounted {}", img.display()));
        mounted.is_some() && mounted < text.find(&format!("serving {}", mp.display()))
    };
    let t0 = Instant::now();
    while !announced(&fs::read_to_string(&log).unwrap()) && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let text = fs::read_to_string(&log).unwrap();
    assert!(announced(&text), "log:\n{text}");
    assert!(stats(&mp)["image_errors"].as_u64().unwrap() >= 1);
}

/// Without log=: messages go to the system log, or, where there is none
/// (no /dev/log, as on this machine), to a file for the mount point that
/// `sheaf stats` names; stats lists the last errors with the file's path.
#[test]
fn a_background_mount_without_syslog_logs_to_a_file_and_stats_names_the_failing_path() {
    let a = Rng::new(2).text(2 << 20);
    let sc = one_file("a.txt", &a, &["-c", "none"]);
    let (img, mp) = (sc.img.clone(), sc.mp.clone());
    let mut b = fs::read(&img).unwrap();
    b[64 + 1000] ^= 1;
    fs::write(&img, &b).unwrap();
    let state = sc.dir().join("state");
    // A user's state directory, when not root.
    let mut c = sc.mount_cmd(&[]);
    c.env("XDG_STATE_HOME", &state);
    let _m = Mounted::run(&mut c, &mp);
    let e = fs::read(mp.join("a.txt")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    let s = stats(&mp);
    let recent = s["recent_errors"].as_array().expect("recent_errors");
    assert!(!recent.is_empty(), "{s}");
    assert_eq!(recent[0]["path"], "/a.txt", "{s}");
    assert_eq!(recent[0]["op"], "read", "{s}");
    assert!(
        recent[0]["error"]
            .as_str()
            .unwrap()
            .contains("data block 0"),
        "{s}"
    );
    let log = s["log"].as_str().unwrap();
    if Path::new("/dev/log").exists() {
        assert_eq!(log, "syslog");
    } else {
        let canon = fs::canonicalize(&mp).unwrap();
        let name = format!(
            "{}.log",
            canon.to_str().unwrap().trim_matches('/').replace('/', "-")
        );
        let want = if is_root() {
            Path::new("/var/log/sheaf").join(&name)
        } else {
            state.join("sheaf/log").join(&name)
        };
        assert_eq!(Path::new(log), want, "{s}");
        let text = fs::read_to_string(&want).unwrap();
        assert!(
            text.contains("read: ") && text.contains("data block 0"),
            "{text}"
        );
        if is_root() {
            let _ = fs::remove_file(&want);
        }
    }
    let human = sheaf(["stats".as_ref(), mp.as_os_str()]).ok().text();
    assert!(
        human.contains("recent errors") && human.contains(" read /a.txt: "),
        "{human}"
    );
}

/// An image without xattrs answers the first getxattr with ENOSYS, so the
/// kernel stops asking (ls -l asks two or three times per entry); statistics
/// and umount then talk through the root's ioctl. An image with an xattr
/// keeps answering, exactly.
#[test]
fn an_image_without_xattrs_lets_the_kernel_stop_asking_for_them() {
    let sc = Scenario::new(|plain| {
        fs::create_dir_all(plain.join("d")).unwrap();
        for i in 0..200 {
            write(&plain.join(format!("d/f{i}")), format!("{i}\n").as_bytes());
        }
    })
    .image_name("plain.sheaf")
    .build(&[]);
    let (img, mp) = (sc.img.clone(), sc.mp.clone());
    let m = sc.mount(&[]);
    for _ in 0..3 {
        run_cmd(Command::new("ls").arg("-lR").arg(&mp)).ok();
    }
    let s = stats(&mp);
    let asked = s["ops"]["getxattr"]["count"].as_u64().unwrap_or(0);
    assert!(asked <= 1, "getxattr reached the mount {asked} times: {s}");
    assert_eq!(s["pid"].as_i64().unwrap() as u32, servers(&mp)[0]);
    let e = xattr::get(mp.join("d/f1"), "user.k").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EOPNOTSUPP), "{e}");
    m.umount();
    assert!(servers(&mp).is_empty(), "umount waited for the server");
    // A read-only stack of such images does the same; a writable one keeps
    // answering (its upper may get xattrs).
    let m = mount(&[&img, &img], &mp, &[]);
    for _ in 0..3 {
        run_cmd(Command::new("ls").arg("-lR").arg(&mp)).ok();
    }
    let s = stats(&mp);
    assert!(
        s["ops"]["getxattr"]["count"].as_u64().unwrap_or(0) <= 1,
        "{s}"
    );
    m.umount();
    let upper = sc.dir().join("upper");
    fs::create_dir(&upper).unwrap();
    let m = mount(&[&img], &mp, &["--upper", upper.to_str().unwrap()]);
    xattr::set(mp.join("d/f1"), "user.k", b"w").unwrap();
    assert_eq!(
        xattr::get(mp.join("d/f1"), "user.k").unwrap(),
        Some(b"w".to_vec())
    );
    m.umount();

    let attrs = sc.dir().join("attrs");
    fs::create_dir_all(&attrs).unwrap();
    write(&attrs.join("f"), b"x");
    xattr::set(attrs.join("f"), "user.k", b"v").unwrap();
    let img = sc.dir().join("attrs.sheaf");
    build(&attrs, &img, &[]).ok();
    let m = mount(&[&img], &mp, &[]);
    for _ in 0..3 {
        assert_eq!(
            xattr::get(mp.join("f"), "user.k").unwrap(),
            Some(b"v".to_vec())
        );
    }
    assert_eq!(xattr::get(mp.join("f"), "user.other").unwrap(), None);
    let s = stats(&mp);
    assert!(s["ops"]["getxattr"]["count"].as_u64().unwrap() >= 4, "{s}");
    drop(m);
}

/// A walker that never stats files (`find`) gets them listed by name and
/// type only, so the kernel makes no inode for them and sheaf reads no inode
/// record: every name is still listed (the dirent carries the real inode
/// number; with 0 glibc would skip it), a lookup of a file answers its real
/// attributes, and a tool that stats what it lists (`ls -l`) sees exactly
/// what the source has.
#[test]
fn find_lists_files_without_attributes_and_stat_still_sees_them() {
    let mut expect = vec![String::new()];
    let sc = Scenario::new(|src| {
        for d in 0..20 {
            fs::create_dir_all(src.join(format!("d{d}/sub"))).unwrap();
            expect.push(format!("/d{d}"));
            expect.push(format!("/d{d}/sub"));
            for f in 0..30 {
                let p = format!("/d{d}/f{f}");
                write(&src.join(&p[1..]), p.as_bytes());
                expect.push(p);
            }
            symlink(b"f0", &src.join(format!("d{d}/sub/link")));
            expect.push(format!("/d{d}/sub/link"));
        }
    })
    .build(&[]);
    expect.sort();
    let (src, mp) = (sc.src.clone(), sc.mp.clone());
    let m = sc.mount(&[]);

    // `find` from its own process: every name, and no lookup per file.
    let out = run_cmd(Command::new("find").arg(&mp)).ok();
    let mut listed: Vec<String> = String::from_utf8(out.stdout.clone())
        .unwrap()
        .lines()
        .map(|l| l.strip_prefix(mp.to_str().unwrap()).unwrap().to_string())
        .collect();
    listed.sort();
    assert_eq!(listed, expect);
    let lookups = || stats(&mp)["ops"]["lookup"]["count"].as_u64().unwrap_or(0);
    let before = lookups();
    assert!(
        before < 20 * 30 / 2,
        "find made {before} lookups for 600 files it only had to name"
    );
    // The kernel made no entry for a listed file: its first stat asks.
    let md = mp.join("d3/f7").symlink_metadata().unwrap();
    assert_eq!(md.size(), "/d3/f7".len() as u64);
    assert_eq!(lookups(), before + 1, "the file was listed with attributes");

    // Every dirent's inode number is the one stat gives, and stat agrees
    // with the source.
    for d in 0..20 {
        for e in fs::read_dir(mp.join(format!("d{d}"))).unwrap() {
            let e = e.unwrap();
            let md = e.path().symlink_metadata().unwrap();
            use std::os::unix::fs::DirEntryExt;
            assert_eq!(e.ino(), md.ino(), "{}", e.path().display());
            let s = src.join(e.path().strip_prefix(&mp).unwrap());
            let sm = s.symlink_metadata().unwrap();
            // (A directory's size is its own business: sheaf's is its
            // entry count.)
            let size = |m: &fs::Metadata| if m.is_dir() { 0 } else { m.size() };
            assert_eq!(
                (md.mode(), size(&md), md.mtime(), md.mtime_nsec()),
                (sm.mode(), size(&sm), sm.mtime(), sm.mtime_nsec()),
                "{}",
                e.path().display()
            );
        }
    }
    assert_tree_eq(&mp, &src);
    drop(m);
}

/// The usual mistakes get the command that was meant: the order swapped, a
/// mount point that does not exist (the mkdir -p), `umount` of a path that
/// does not exist; a mount point that holds files is mounted on with a
/// one-line warning that they are hidden until the unmount.
#[test]
fn mount_mistakes_get_the_command_that_was_meant() {
    let t = tmpdir();
    let src = t.path().join("src");
    fs::create_dir(&src).unwrap();
    fs::write(src.join("in-image.txt"), "from the image\n").unwrap();
    let img = t.path().join("x.sheaf");
    build(&src, &img, &[]);
    let mp = t.path().join("mp");
    fs::create_dir(&mp).unwrap();
    let (i, m) = (img.display().to_string(), mp.display().to_string());
    let o = sheaf(["mount", &m, &i]);
    assert_eq!(o.code, 1, "{}", o.describe());
    assert_eq!(
        o.one_err_line(),
        format!("sheaf: error: {i}: not a directory, and {m} is one: the image goes first: sheaf mount {i} {m}")
    );
    let missing = t.path().join("no/such/mp").display().to_string();
    let o = sheaf(["mount", &i, &missing]);
    assert_eq!(o.code, 1, "{}", o.describe());
    assert_eq!(
        o.one_err_line(),
        format!("sheaf: error: {missing}: does not exist; create it: mkdir -p {missing}")
    );
    let o = sheaf(["umount", &missing]);
    assert_eq!(o.code, 1, "{}", o.describe());
    assert_eq!(
        o.one_err_line(),
        format!("sheaf: error: {missing}: no such file or directory (nothing is mounted there)")
    );
    if !mounts_allowed() {
        return;
    }
    // A mount point with a file in it: mounted, with the warning.
    fs::write(mp.join("mine.txt"), "hidden while mounted\n").unwrap();
    let o = sheaf(["mount", &i, &m]).ok();
    assert_eq!(
        o.err_lines(),
        [format!(
            "sheaf: warning: {m} is not empty: what it holds is hidden while the image is mounted"
        )]
    );
    assert_eq!(
        fs::read_to_string(mp.join("in-image.txt")).unwrap(),
        "from the image\n"
    );
    assert!(!mp.join("mine.txt").exists());
    sheaf(["umount", &m]).ok();
    assert_eq!(
        fs::read_to_string(mp.join("mine.txt")).unwrap(),
        "hidden while mounted\n"
    );
    // An empty one: no warning.
    let empty = t.path().join("empty");
    fs::create_dir(&empty).unwrap();
    let e = empty.display().to_string();
    let o = sheaf(["mount", &i, &e]).ok();
    assert!(o.stderr.is_empty(), "{}", o.describe());
    sheaf(["umount", &e]).ok();
}
