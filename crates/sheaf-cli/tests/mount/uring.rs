//! FUSE over io_uring (Linux 6.14+), switched on and off through the
//! kernel's settings: a part of mount.rs (`mod uring`).

use super::*;

/// The `fuse` module's switch for FUSE over io_uring (Linux 6.14+).
const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// The `kernel.io_uring_disabled` sysctl (2: nobody may set up a ring).
const URING_DISABLED: &str = "/proc/sys/kernel/io_uring_disabled";

/// A kernel setting changed for a test's duration, restored when dropped.
/// The settings used here are global: mounts that other tests make
/// meanwhile may also use (or lose) io_uring, which they must survive.
struct KernelSetting(&'static str, String);

impl KernelSetting {
    fn set(path: &'static str, value: &str) -> Self {
        let was = fs::read_to_string(path).unwrap();
        fs::write(path, value).unwrap();
        KernelSetting(path, was.trim().to_string())
    }
}

impl Drop for KernelSetting {
    fn drop(&mut self) {
        let _ = fs::write(self.0, &self.1);
    }
}

/// How many of the serving process's threads have a name starting with
/// `prefix`.
fn thread_count(pid: i32, prefix: &str) -> usize {
    fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .filter(|t| fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.starts_with(prefix)))
        .count()
}

#[test]
fn io_uring_serves_requests_when_the_kernel_offers_it() {
    if !mounts_allowed()
        || !prerequisite(is_root(), "root (to switch fuse.enable_uring)")
        || !prerequisite(
            Path::new(ENABLE_URING).exists(),
            "a kernel with FUSE over io_uring (6.14+, CONFIG_FUSE_IO_URING)",
        )
        || !prerequisite(
            Path::new(URING_DISABLED).exists(),
            "kernel.io_uring_disabled",
        )
    {
        return;
    }
    let sc = sample();
    let (src, img, mp) = (sc.src.clone(), sc.img.clone(), sc.mp.clone());
    let _on = KernelSetting::set(ENABLE_URING, "Y");
    let m = sc.mount(&[]);
    let pid = m.pid();
    let rings = thread_count(pid, "fuser-ring-");
    assert!(rings > 0, "no io_uring threads");
    assert!(
        thread_count(pid, "fuser-") > rings,
        "the /dev/fuse threads are gone"
    );
    // Concurrent random reads across threads (and so across CPU queues) on
    // the fresh mount, then every entry and byte.
    let reads = |s: &serde_json::Value| s["ops"]["read"]["count"].as_u64().unwrap_or(0);
    let before = m.stats();
    let files: Vec<Vec<u8>> = walk(&src)
        .into_iter()
        .filter(|p| fs::symlink_metadata(join(&src, p)).unwrap().is_file())
        .collect();
    std::thread::scope(|s| {
        for th in 0..4u64 {
            let (files, src, mp) = (&files, &src, &mp);
            s.spawn(move || {
                let mut r = Rng::new(700 + th);
                for _ in 0..100 {
                    let p = &files[r.below(files.len() as u64) as usize];
                    let want = fs::read(join(src, p)).unwrap();
                    let mut f = fs::File::open(join(mp, p)).unwrap();
                    let off = r.below(want.len() as u64 + 1);
                    f.seek(SeekFrom::Start(off)).unwrap();
                    let mut got = Vec::new();
                    f.read_to_end(&mut got).unwrap();
                    assert!(got == want[off as usize..], "{} @{off}", lossy(p));
                }
            });
        }
    });
    // The rings did the work: at least as many requests came through them
    // as reads were served meanwhile (plus the lookups).
    let after = m.stats();
    let ring = after["io_uring_requests"].as_u64().unwrap()
        - before["io_uring_requests"].as_u64().unwrap();
    let read = reads(&after) - reads(&before);
    assert!(
        read > 0 && ring >= read,
        "{ring} ring requests, {read} reads"
    );
    assert_tree_eq(&mp, &src);
    assert_eq!(m.stats()["image_errors"], 0);
    let text = sheaf(["stats".as_ref(), mp.as_os_str()]).ok();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("FUSE over io_uring"), "{text}");
    // Unmounting ends the ring threads and the process.
    sheaf(["umount".as_ref(), mp.as_os_str()]).ok();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !servers(&mp).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(servers(&mp).is_empty(), "server still running after umount");

    // io_uring=off: no rings, same bytes.
    let m = sc.mount(&["-o", "io_uring=off"]);
    assert_eq!(thread_count(m.pid(), "fuser-ring-"), 0);
    same_content(&src.join("big3.bin"), &mp.join("big3.bin")).unwrap();
    assert_eq!(m.stats()["io_uring_requests"], 0);
    sheaf(["umount".as_ref(), mp.as_os_str()]).ok();

    // kill -9 of a server with armed rings: readers get an error, the
    // mount goes away.
    let _m = sc.mount(&[]);
    let pids = servers(&mp);
    assert_eq!(pids.len(), 1, "{pids:?}");
    unsafe { libc::kill(pids[0] as i32, libc::SIGKILL) };
    let deadline = Instant::now() + Duration::from_secs(10);
    while is_mounted(&mp) && Instant::now() < deadline {
        let _ = cmd().arg("umount").arg(&mp).output();
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!is_mounted(&mp), "mount left behind after kill -9");

    // io_uring itself refused (sysctl kernel.io_uring_disabled=2): the
    // mount serves through /dev/fuse and says so once in its log.
    let off = KernelSetting::set(URING_DISABLED, "2");
    let log = sc.dir().join("uring.log");
    let logopt = format!("log={}", log.display());
    let m = sc.mount(&["-o", &logopt]);
    // In a thread: a server that asked for rings it cannot make would leave
    // this read held by the kernel forever.
    let (tx, rx) = std::sync::mpsc::channel();
    let (a, b) = (src.join("big4.bin"), mp.join("big4.bin"));
    std::thread::spawn(move || tx.send(same_content(&a, &b)));
    let served = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("a read hung with io_uring refused");
    let st = m.stats();
    drop(off);
    served.unwrap();
    assert_eq!(st["io_uring_requests"], 0);
    sheaf(["umount".as_ref(), mp.as_os_str()]).ok();
    let text = fs::read_to_string(&log).unwrap();
    assert_eq!(
        text.matches("FUSE over io_uring unavailable").count(),
        1,
        "{text}"
    );
    assert!(text.contains("serving through /dev/fuse"), "{text}");

    // A bad value is refused in one line.
    let o = cmd()
        .args(["mount", "-o", "io_uring=maybe"])
        .arg(&img)
        .arg(&mp)
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("io_uring=maybe: use auto or off"), "{err}");
    assert!(!is_mounted(&mp));
}
