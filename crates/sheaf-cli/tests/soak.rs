//! The soak (`make soak`; not part of `make test`): SOAK_READERS readers
//! (default 64) for SOAK_MINUTES (default 10) over four mounts at once —
//! a local image, a URL through the fault proxy whose nginx restarts every
//! minute, a 10-layer union, and a writable overlay with writers too —
//! comparing every byte read with the source. Asserts zero mismatches, zero
//! errors, and no fd or thread growth in the servers; reports the servers'
//! peak RSS. Writes bench/results/DATE-soak.md.

mod common;
use common::servers::{FaultProxy, Nginx};
use common::*;
use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name}={v}: not a number"))
        })
        .unwrap_or(default)
}

/// A tree of `n` files of assorted sizes (some multi-block) under `root`.
fn tree(root: &Path, seed: u64, n: usize) {
    let mut r = Rng::new(seed);
    for i in 0..n {
        let p = root.join(format!("d{}/f{i:04}", i % 17));
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        let size = match i % 10 {
            0 => 600_000 + (i * 997) % 300_000,
            1..=3 => 20_000 + (i * 131) % 60_000,
            _ => (i * 53) % 9_000,
        };
        let data = if i % 2 == 0 {
            r.text(size)
        } else {
            r.bytes(size)
        };
        write(&p, &data);
    }
}

/// Every regular file under `root`, relative path → bytes.
fn contents(root: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut m = BTreeMap::new();
    for rel in walk(root) {
        let p = join(root, &rel);
        let md = fs::symlink_metadata(&p).unwrap();
        if md.is_file() {
            m.insert(PathBuf::from(lossy(&rel)), fs::read(&p).unwrap());
        }
    }
    m
}

/// Server process facts: (fds, threads, VmHWM kB).
fn proc_facts(pid: i32) -> (usize, usize, u64) {
    let fds = fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count());
    let threads = fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count());
    let hwm = fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0);
    (fds, threads, hwm)
}

#[derive(Default)]
struct Tally {
    reads: AtomicU64,
    bytes: AtomicU64,
    mismatches: AtomicU64,
    errors: AtomicU64,
    writes: AtomicU64,
}

/// Read `rel` under `mp` from its start or a random offset to its end,
/// compare with `want`; record the outcome.
fn check_read(mp: &Path, rel: &Path, want: &[u8], r: &mut Rng, t: &Tally, log: &dyn Fn(String)) {
    let p = mp.join(rel);
    let from = if want.is_empty() || r.below(2) == 0 {
        0
    } else {
        r.below(want.len() as u64) as usize
    };
    let res = (|| -> std::io::Result<Vec<u8>> {
        let mut f = fs::File::open(&p)?;
        f.seek(SeekFrom::Start(from as u64))?;
        let mut got = Vec::new();
        f.read_to_end(&mut got)?;
        Ok(got)
    })();
    t.reads.fetch_add(1, Relaxed);
    match res {
        Ok(got) => {
            t.bytes.fetch_add(got.len() as u64, Relaxed);
            if got[..] != want[from..] {
                t.mismatches.fetch_add(1, Relaxed);
                log(format!(
                    "MISMATCH {} from {from}: {} bytes, want {}",
                    p.display(),
                    got.len(),
                    want.len() - from
                ));
            }
        }
        Err(e) => {
            t.errors.fetch_add(1, Relaxed);
            log(format!("ERROR {}: {e}", p.display()));
        }
    }
}

#[test]
#[ignore = "the soak: make soak (SOAK_READERS, SOAK_MINUTES)"]
fn soak() {
    assert!(mounts_allowed(), "the soak needs real FUSE mounts");
    let readers = env_num("SOAK_READERS", 64) as usize;
    let minutes = env_num("SOAK_MINUTES", 10);
    let t = tmpdir();
    let root = t.path();

    // 1. A local image.
    let src = root.join("src");
    tree(&src, 1, 1500);
    let img = root.join("img.sheaf");
    build(&src, &img, &["--block-size", "256K"]);

    // 2. The same image over HTTP through the fault proxy; nginx restarts.
    let mut ng = Nginx::start(&root.join("nginx"));
    fs::copy(&img, ng.www.join("img.sheaf")).unwrap();
    let proxy = FaultProxy::start(&ng.base(), "pass");

    // 3. Ten layers: layer i adds L{i}/ and overrides every tenth shared
    // file; the expected view is the layers copied over each other in order.
    let mut layers = Vec::new();
    let merged = root.join("merged");
    fs::create_dir_all(&merged).unwrap();
    for i in 0..10u64 {
        let l = root.join(format!("layer{i}"));
        tree(&l.join(format!("L{i}")), 100 + i, 60);
        let mut r = Rng::new(200 + i);
        fs::create_dir_all(l.join("shared")).unwrap();
        for j in (i as usize..300).step_by(10) {
            write(&l.join(format!("shared/s{j:03}")), &r.text(1000 + j * 7));
        }
        // Every layer also overrides s000..s009 (later layers win).
        for j in 0..10 {
            write(&l.join(format!("shared/s{j:03}")), &r.text(500 + j * 11));
        }
        let li = root.join(format!("layer{i}.sheaf"));
        build(&l, &li, &["--block-size", "128K"]);
        let st = std::process::Command::new("cp")
            .args(["-a", "--"])
            .arg(format!("{}/.", l.display()))
            .arg(&merged)
            .status()
            .unwrap();
        assert!(st.success());
        layers.push(li);
    }

    // 4. A writable overlay over the image.
    let upper = root.join("upper");
    fs::create_dir_all(&upper).unwrap();

    let mps: Vec<PathBuf> = ["local", "http", "union", "overlay"]
        .iter()
        .map(|n| root.join(format!("mnt-{n}")))
        .collect();
    let mount = |args: Vec<std::ffi::OsString>, mp: &Path| {
        let mut c = cmd();
        c.arg("mount").args(args).arg(mp);
        Mounted::run(&mut c, mp)
    };
    let m_local = mount(vec![img.clone().into()], &mps[0]);
    let m_http = mount(
        // A block cache far smaller than the image, so reads keep going to
        // the server through every restart.
        vec![
            "--timeout".into(),
            "60".into(),
            "--no-cache".into(),
            "-o".into(),
            "cache_size=8M".into(),
            proxy.url("img.sheaf").into(),
        ],
        &mps[1],
    );
    let m_union = mount(layers.iter().map(|p| p.clone().into()).collect(), &mps[2]);
    let m_overlay = mount(
        vec!["--upper".into(), upper.clone().into(), img.clone().into()],
        &mps[3],
    );
    let mounts = [&m_local, &m_http, &m_union, &m_overlay];
    let pids: Vec<i32> = mounts.iter().map(|m| m.pid()).collect();
    let before: Vec<_> = pids.iter().map(|&p| proc_facts(p)).collect();

    let want_src = Arc::new(contents(&src));
    let want_merged = Arc::new(contents(&merged));
    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let log_path = root.join("soak.log");
    let log_file = Arc::new(std::sync::Mutex::new(fs::File::create(&log_path).unwrap()));
    let logger = {
        let f = log_file.clone();
        move |s: String| {
            use std::io::Write;
            let _ = writeln!(f.lock().unwrap(), "{s}");
        }
    };
    let deadline = Instant::now() + Duration::from_secs(minutes * 60);
    let mut handles = Vec::new();
    for k in 0..readers {
        let (mps, want_src, want_merged, tally, stop) = (
            mps.clone(),
            want_src.clone(),
            want_merged.clone(),
            tally.clone(),
            stop.clone(),
        );
        let logger = logger.clone();
        handles.push(std::thread::spawn(move || {
            let mut r = Rng::new(1000 + k as u64);
            let which = k % 4;
            let (mp, want) = match which {
                2 => (&mps[2], &want_merged),
                _ => (&mps[which], &want_src),
            };
            let keys: Vec<&PathBuf> = want.keys().collect();
            let mut n = 0u64;
            while !stop.load(Relaxed) {
                // Overlay writers (every other overlay thread): write a file
                // of its own, read it back.
                if which == 3 && k % 8 == 3 {
                    let p = mp.join(format!("w{k}/n{}", n % 20));
                    let data = r.bytes(1000 + (n as usize * 313) % 200_000);
                    let res = fs::create_dir_all(p.parent().unwrap())
                        .and_then(|_| fs::write(&p, &data))
                        .and_then(|_| fs::read(&p));
                    tally.writes.fetch_add(1, Relaxed);
                    match res {
                        Ok(back) if back == data => {}
                        Ok(_) => {
                            tally.mismatches.fetch_add(1, Relaxed);
                            logger(format!("MISMATCH written {}", p.display()));
                        }
                        Err(e) => {
                            tally.errors.fetch_add(1, Relaxed);
                            logger(format!("ERROR writing {}: {e}", p.display()));
                        }
                    }
                } else {
                    let rel = keys[r.below(keys.len() as u64) as usize];
                    check_read(mp, rel, &want[rel], &mut r, &tally, &logger);
                }
                n += 1;
            }
        }));
    }
    // nginx restarts every minute: down 3 s, then back on the same port.
    let mut restarts = 0;
    let mut peak = [0u64; 4];
    let mut next_restart = Instant::now() + Duration::from_secs(60);
    let mut drops = 0;
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_secs(1));
        // The kernel caches file data; dropping it every few seconds sends
        // reads back to the servers (memory pressure on a busy node).
        if is_root() && drops % 4 == 0 {
            let _ = fs::write("/proc/sys/vm/drop_caches", "3");
        }
        drops += 1;
        for (i, &p) in pids.iter().enumerate() {
            peak[i] = peak[i].max(proc_facts(p).2);
        }
        if Instant::now() >= next_restart && Instant::now() + Duration::from_secs(10) < deadline {
            ng.stop();
            std::thread::sleep(Duration::from_secs(3));
            ng.restart();
            restarts += 1;
            next_restart += Duration::from_secs(60);
        }
    }
    stop.store(true, Relaxed);
    for h in handles {
        h.join().unwrap();
    }
    // Let idle threads and connections settle before counting them.
    std::thread::sleep(Duration::from_secs(3));
    let after: Vec<_> = pids.iter().map(|&p| proc_facts(p)).collect();
    // What reached the servers (the rest the kernel's page cache served).
    let served: Vec<(u64, u64)> = mounts
        .iter()
        .map(|m| {
            let s = m.stats();
            (
                s["ops"]["read"]["count"].as_u64().unwrap_or(0),
                s["bytes_served"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    let http = m_http.stats();
    let (retries, waited) = (
        http["remote"]["http_retries"].as_u64().unwrap_or(0),
        http["remote"]["http_wait_ms"].as_u64().unwrap_or(0),
    );
    let names = [
        "local image",
        "URL via fault proxy",
        "10-layer union",
        "overlay",
    ];
    let mut rows = String::new();
    for i in 0..4 {
        rows += &format!(
            "| {} | {} / {:.1} GB | {} → {} | {} → {} | {:.1} |\n",
            names[i],
            served[i].0,
            served[i].1 as f64 / 1e9,
            before[i].0,
            after[i].0,
            before[i].1,
            after[i].1,
            peak[i].max(after[i].2) as f64 / 1024.0
        );
    }
    let (reads, bytes, mism, errs, writes) = (
        tally.reads.load(Relaxed),
        tally.bytes.load(Relaxed),
        tally.mismatches.load(Relaxed),
        tally.errors.load(Relaxed),
        tally.writes.load(Relaxed),
    );
    let report = format!(
        "# Soak, {}\n\n{readers} readers (a quarter on each mount; an eighth of the overlay's write) for \
         {minutes} min; nginx behind the fault proxy restarted {restarts} times (3 s down each); the page \
         cache dropped every 4 s{}.\n\n\
         {reads} reads ({:.1} GB), {writes} write+read-backs: **{mism} mismatches, {errs} errors**.\n\n\
         | mount | FUSE reads / bytes served | fds start → end | threads start → end | peak RSS MiB |\n\
         |---|---|---|---|---|\n{rows}\n\
         The URL mount waited out the restarts: {retries} retry rounds, {waited} ms of waits.\n\n\
         Reproduce: `make soak` (SOAK_READERS, SOAK_MINUTES).\n",
        date_utc("%Y-%m-%d %H:%M UTC"),
        if is_root() { "" } else { " (not: not root)" },
        bytes as f64 / 1e9
    );
    eprintln!("{report}");
    let out = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../bench/results")
        .join(format!("{}-soak.md", date_utc("%Y-%m-%d-%H%M")));
    fs::write(&out, &report).unwrap();
    let log_text = fs::read_to_string(&log_path).unwrap();
    assert_eq!(
        (mism, errs),
        (0, 0),
        "first problems:\n{}",
        log_text.lines().take(20).collect::<Vec<_>>().join("\n")
    );
    assert!(reads > readers as u64 * 10, "only {reads} reads");
    assert!(
        restarts == 0 || retries > 0,
        "{restarts} server restarts, but the URL mount never had to wait: the outage path was not exercised"
    );
    for i in 0..4 {
        assert!(
            after[i].0 <= before[i].0 + 8,
            "{}: fds {} → {}",
            names[i],
            before[i].0,
            after[i].0
        );
        assert!(
            after[i].1 <= before[i].1 + 8,
            "{}: threads {} → {}",
            names[i],
            before[i].1,
            after[i].1
        );
    }
    drop(proxy);
    for m in [m_local, m_http, m_union, m_overlay] {
        m.umount();
    }
}

/// `date -u +FORMAT`.
fn date_utc(format: &str) -> String {
    let o = std::process::Command::new("date")
        .arg("-u")
        .arg(format!("+{format}"))
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}
