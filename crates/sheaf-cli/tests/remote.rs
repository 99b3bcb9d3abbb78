//! Lazy remote images against real servers on loopback: nginx (origin and
//! mirror), squid (a caching proxy) and a fault-injecting proxy. Every test
//! checks that what is read equals the source, whatever sits in between:
//! published repositories, the node cache (also offline, also with damaged
//! entries, also under many mounts and kill -9), failover, and faults that
//! must end in a clear error within the timeout, never in wrong bytes.

mod common;

use common::servers::{FaultProxy, Nginx, Squid};
use common::*;
use serde_json::Value;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A source tree of small files plus two large random ones, built with
/// 256 KiB blocks (many objects) into `www/img.sheaf`, published as
/// `www/repo/img`.
fn setup(dir: &Path) -> (Nginx, PathBuf) {
    let ng = Nginx::start(dir);
    let src = dir.join("src");
    fs::create_dir_all(&src).unwrap();
    small_tree(&src, 5);
    let mut rng = Rng::new(9);
    write(&src.join("big.bin"), &rng.bytes(3 << 20));
    write(&src.join("text.txt"), &rng.text(2 << 20));
    build_and_publish(&src, &ng.www, "img");
    (ng, src)
}

/// Build `src` into `www/NAME.sheaf` and publish it as `www/repo/NAME`;
/// returns publish's JSON report.
fn build_and_publish(src: &Path, www: &Path, name: &str) -> Value {
    let img = www.join(format!("{name}.sheaf"));
    build(src, &img, &["--block-size", "256K", "-f"]).ok();
    json(
        &sheaf([
            "publish".as_ref(),
            img.as_os_str(),
            www.join("repo").as_os_str(),
            "--name".as_ref(),
            name.as_ref(),
            "--json".as_ref(),
        ])
        .ok(),
    )
}

fn cache_arg(c: &Path) -> String {
    format!("--cache-dir={}", c.display())
}

fn http_bytes(s: &Value) -> u64 {
    s["remote"]["http_bytes"].as_u64().unwrap()
}

#[test]
fn a_published_repository_mounts_like_the_image_and_a_new_version_adds_only_new_objects() {
    let t = tmpdir();
    let (ng, src) = setup(t.path());
    let cache = t.path().join("cache");
    let ca = cache_arg(&cache);
    for url in [ng.url("img.sheaf"), ng.url("repo/img")] {
        let m = mount(&[&url], &t.path().join("m1"), &[&ca]);
        assert_tree_eq(&m.mp, &src);
        let s = m.stats();
        let form = if url.ends_with("img") {
            "repository"
        } else {
            "image"
        };
        assert_eq!(s["remote"]["remote_form"], form, "{s}");
        drop(m);
        // The second form found everything the first fetched in the cache.
        sheaf(["cache", "clear", &ca]).ok();
    }
    // Version 2: one small file changed, one added.
    let v1 = build_and_publish(&src, &ng.www, "img");
    assert_eq!(v1["objects_written"], 0, "{v1}");
    write(&src.join("docs/changed.txt"), b"version two\n");
    write(&src.join("new.bin"), &Rng::new(77).bytes(100_000));
    let v2 = build_and_publish(&src, &ng.www, "img2");
    let image_len = fs::metadata(ng.www.join("img2.sheaf")).unwrap().len();
    assert!(
        v2["bytes_written"].as_u64().unwrap() < image_len / 10
            && v2["objects_reused"].as_u64().unwrap() > 0,
        "v2 ({image_len} bytes) rewrote too much: {v2}"
    );
    // Read v1 fully into the cache, then v2: v2 fetches about its new objects.
    let m = mount(&[&ng.url("repo/img")], &t.path().join("m1"), &[&ca]);
    let _ = compare_trees(&src, &m.mp, Cmp::all());
    drop(m);
    let m = mount(&[&ng.url("repo/img2")], &t.path().join("m2"), &[&ca]);
    assert_tree_eq(&m.mp, &src);
    let fetched = http_bytes(&m.stats());
    let budget = v2["bytes_written"].as_u64().unwrap() + v2["index_bytes"].as_u64().unwrap();
    assert!(
        fetched <= budget + 4096,
        "v2 fetched {fetched} bytes; its new objects and index are {budget}"
    );
}

#[test]
fn a_warm_cache_drops_damaged_objects_and_remounts_offline() {
    let t = tmpdir();
    let (mut ng, src) = setup(t.path());
    let cache = t.path().join("cache");
    let ca = cache_arg(&cache);
    let url = ng.url("img.sheaf");
    let m = mount(&[&url], &t.path().join("m"), &[&ca]);
    assert_tree_eq(&m.mp, &src);
    drop(m);
    // Damage every cached object: each is caught, dropped and fetched again.
    let mut damaged = 0;
    for fan in fs::read_dir(cache.join("objects")).unwrap() {
        for o in fs::read_dir(fan.unwrap().path()).unwrap() {
            let p = o.unwrap().path();
            let mut b = fs::read(&p).unwrap();
            let i = b.len() / 2;
            b[i] ^= 0x10;
            fs::write(&p, b).unwrap();
            damaged += 1;
        }
    }
    assert!(damaged > 10);
    let m = mount(&[&url], &t.path().join("m"), &[&ca]);
    assert_tree_eq(&m.mp, &src);
    let s = m.stats();
    assert!(
        s["disk_cache"]["disk_cache_bad"].as_u64().unwrap() >= damaged - 1,
        "{s}"
    );
    drop(m);
    // The server goes away: the cache alone serves a new mount.
    ng.stop();
    let m = mount(&[&url], &t.path().join("m"), &[&ca]);
    assert_tree_eq(&m.mp, &src);
    assert_eq!(m.stats()["remote"]["offline"], true);
    drop(m);
    // Without that cache, offline is one clear line once --timeout has
    // passed.
    let o = run_cmd(cmd().arg("ls").arg(&url).args(["--timeout", "2"])).fails_with(1);
    assert!(
        o.one_err_line()
            .to_lowercase()
            .contains("connection refused"),
        "{}",
        o.describe()
    );
    let st = json(&sheaf(["cache", "stats", "--json", &ca]).ok());
    assert_eq!(st["indexes"], 1, "{st}");
    assert!(st["objects"].as_u64().unwrap() >= damaged, "{st}");
}

#[test]
fn squid_serves_the_second_node_from_its_cache() {
    let t = tmpdir();
    let (ng, src) = setup(t.path());
    let squid = Squid::start(t.path());
    let proxy = format!("--proxy={}", squid.proxy_url());
    // Two nodes (two node caches) read the repository through squid.
    for node in ["a", "b"] {
        let ca = cache_arg(&t.path().join(format!("cache-{node}")));
        let out = t.path().join(format!("out-{node}"));
        let mut c = cmd();
        c.args(["extract", &ng.url("repo/img"), "-C"])
            .arg(&out)
            .args([&ca, &proxy]);
        run_cmd(&mut c).ok();
        assert_same_tree(
            &src,
            &out,
            Cmp {
                owner: is_root(),
                ..Cmp::all()
            },
        );
    }
    let objects = walk(&ng.www.join("repo/objects"))
        .iter()
        .filter(|p| p.len() > 3)
        .count() as u64;
    let (hits, misses) = squid.wait_hits(2 * objects);
    assert!(
        hits >= objects,
        "squid: {hits} hits, {misses} misses for {objects} objects"
    );
    // The whole-image form goes through squid too (ranges are forwarded).
    let mut c = cmd();
    c.args(["cat", &ng.url("img.sheaf"), "big.bin", &proxy]);
    let o = run_cmd(&mut c).ok();
    assert!(o.stdout == fs::read(src.join("big.bin")).unwrap());
    // http_proxy from the environment works as --proxy does.
    let mut c = cmd();
    c.args(["cat", &ng.url("repo/img"), "text.txt"])
        .env("http_proxy", squid.proxy_url());
    let before = squid.hits();
    let o = run_cmd(&mut c).ok();
    assert!(o.stdout == fs::read(src.join("text.txt")).unwrap());
    assert!(
        squid.hits().0 > before.0,
        "the environment's proxy was not used"
    );
}

#[test]
fn mirrors_take_over_from_a_missing_or_dead_primary() {
    let t = tmpdir();
    let (ng, src) = setup(t.path());
    let empty = Nginx::start_with_root(t.path(), &t.path().join("empty"));
    let mut twin = Nginx::start_with_root(t.path(), &ng.www);
    // 404 on the primary: the mirror serves.
    let big = fs::read(src.join("big.bin")).unwrap();
    for name in ["img.sheaf", "repo/img"] {
        let mut c = cmd();
        c.args([
            "cat",
            &empty.url(name),
            "big.bin",
            "--mirror",
            &ng.url(name),
        ]);
        let o = run_cmd(&mut c).ok();
        assert!(o.stdout == big, "{name}");
    }
    // The primary dies under a mount: reads go on from the mirror.
    let ca = cache_arg(&t.path().join("cache"));
    let m = mount(
        &[&twin.url("repo/img")],
        &t.path().join("m"),
        &["--mirror", &ng.url("repo/img"), &ca],
    );
    assert_eq!(
        fs::read(m.mp.join("text.txt")).unwrap(),
        fs::read(src.join("text.txt")).unwrap()
    );
    twin.stop();
    assert_tree_eq(&m.mp, &src);
    let s = m.stats();
    assert!(s["remote"]["http_failovers"].as_u64().unwrap() >= 1, "{s}");
    assert_eq!(s["remote"]["http_url"], ng.url("repo/img"), "{s}");
    drop(m);
    // After --failback seconds the first route is used again.
    let m = mount(
        &[&empty.url("repo/img")],
        &t.path().join("m"),
        &[
            "--mirror",
            &ng.url("repo/img"),
            "--failback",
            "1",
            "--no-cache",
        ],
    );
    assert_eq!(m.stats()["remote"]["http_url"], ng.url("repo/img"));
    std::thread::sleep(Duration::from_millis(1200));
    let s = m.stats();
    assert_eq!(s["remote"]["http_url"], empty.url("repo/img"), "{s}");
}

#[test]
fn signatures_travel_with_a_published_image() {
    let t = tmpdir();
    let (ng, _src) = setup(t.path());
    let key = t.path().join("key");
    let line = sheaf([
        "keygen".as_ref(),
        key.as_os_str(),
        "--identity".as_ref(),
        "ops".as_ref(),
    ])
    .ok()
    .text();
    let signers = t.path().join("allowed_signers");
    fs::write(&signers, line).unwrap();
    let img = ng.www.join("img.sheaf");
    sheaf([
        "sign".as_ref(),
        img.as_os_str(),
        "-k".as_ref(),
        key.as_os_str(),
    ])
    .ok();
    let repo = ng.www.join("repo");
    sheaf([
        "publish".as_ref(),
        img.as_os_str(),
        repo.as_os_str(),
        "--name".as_ref(),
        "signed".as_ref(),
    ])
    .ok();
    for url in [ng.url("img.sheaf"), ng.url("repo/signed")] {
        let mut c = cmd();
        c.args(["verify", &url, "--signers"]).arg(&signers);
        run_cmd(&mut c).ok();
        let m = mount(
            &[&url],
            &t.path().join("m"),
            &[
                "--require-signature",
                "--signers",
                signers.to_str().unwrap(),
            ],
        );
        assert!(m.mp.join("big.bin").exists());
    }
    // The unsigned repository image is refused.
    let mp = t.path().join("m2");
    fs::create_dir_all(&mp).unwrap();
    let mut c = cmd();
    c.args(["mount", &ng.url("repo/img")])
        .arg(&mp)
        .args(["--require-signature", "--signers"])
        .arg(&signers);
    let o = run_cmd(&mut c).fails_with(1);
    assert!(o.one_err_line().contains("signature"), "{}", o.describe());
}

#[test]
fn a_corrupting_proxy_never_changes_a_byte() {
    let t = tmpdir();
    let (ng, src) = setup(t.path());
    let bad = FaultProxy::start(&ng.base(), "corrupt");
    let big = fs::read(src.join("big.bin")).unwrap();
    // As the only route: a clear error, no bytes of the file.
    for name in ["img.sheaf", "repo/img"] {
        let o = run_cmd(cmd().args(["cat", &bad.url(name), "big.bin"])).fails_with(1);
        assert!(
            o.one_err_line().contains(&bad.url(name)),
            "{}",
            o.describe()
        );
        assert!(o.stdout.len() < big.len(), "wrong bytes were written");
    }
    // First of two routes: verification failures move to the next one.
    let proxies = format!("--proxy={};DIRECT", bad.base());
    for name in ["img.sheaf", "repo/img"] {
        let mut c = cmd();
        c.args(["cat", &ng.url(name), "big.bin", &proxies]);
        let o = run_cmd(&mut c).ok();
        assert!(o.stdout == big, "{name}");
    }
    let m = mount(
        &[&ng.url("repo/img")],
        &t.path().join("m"),
        &[&proxies, &cache_arg(&t.path().join("cache"))],
    );
    assert_tree_eq(&m.mp, &src);
    assert!(bad.count() > 0, "the proxy was not used");
}

/// Run `sheaf ARGS` and return its output and how long it took.
fn timed(args: &[&str]) -> (Out, Duration) {
    let t0 = Instant::now();
    let o = run_cmd(cmd().args(args));
    (o, t0.elapsed())
}

#[test]
fn faults_end_in_a_clear_error_within_the_timeout_never_wrong_bytes() {
    let t = tmpdir();
    let (ng, src) = setup(t.path());
    let fp = FaultProxy::start(&ng.base(), "pass");
    let big = fs::read(src.join("big.bin")).unwrap();
    let url = fp.url("img.sheaf");
    for (mode, expect) in [
        ("truncate", "reading the reply"),
        ("status=503", "HTTP 503"),
        ("hang", "timed out"),
    ] {
        fp.set_mode(mode);
        let (o, took) = timed(&["cat", &url, "big.bin", "--timeout", "3"]);
        let o = o.fails_with(1);
        assert!(
            o.one_err_line().contains(expect) && o.one_err_line().contains(&url),
            "{mode}: {}",
            o.describe()
        );
        assert!(took < Duration::from_secs(15), "{mode}: took {took:?}");
    }
    // Slow but working: right bytes.
    fp.set_mode("delay=20,throttle=20000000");
    let (o, _) = timed(&["cat", &url, "big.bin"]);
    assert!(o.ok().stdout == big);
    // Faults under a mount: EIO within the timeout, then recovery.
    fp.set_mode("pass");
    let m = mount(
        &[&fp.url("repo/img")],
        &t.path().join("m"),
        &[
            "--timeout",
            "3",
            "-o",
            "prefetch_metadata=off",
            "--no-cache",
        ],
    );
    fp.set_mode("hang");
    let t0 = Instant::now();
    let r = fs::read(m.mp.join("big.bin"));
    assert_eq!(
        r.map(|b| b.len()).map_err(|e| e.raw_os_error()),
        Err(Some(libc::EIO))
    );
    assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());
    fp.set_mode("pass");
    assert!(fs::read(m.mp.join("big.bin")).unwrap() == big);
}

#[test]
fn an_outage_shorter_than_the_timeout_is_only_a_wait_and_a_longer_one_is_eio_and_a_log_line() {
    let t = tmpdir();
    let (mut ng, src) = setup(t.path());
    let big = fs::read(src.join("big.bin")).unwrap();
    let text = fs::read(src.join("text.txt")).unwrap();
    let log = t.path().join("mount.log");
    let m = mount(
        &[&ng.url("repo/img")],
        &t.path().join("m"),
        &[
            "--timeout",
            "20",
            "-o",
            &format!("prefetch_metadata=off,log={}", log.display()),
            "--no-cache",
        ],
    );
    // The web server restarts: down for 6 s (longer than the 4 rounds of
    // backoff that used to end in EIO), then back on the same port.
    ng.stop();
    let t0 = Instant::now();
    let mp = m.mp.clone();
    let reader = std::thread::spawn(move || fs::read(mp.join("big.bin")));
    std::thread::sleep(Duration::from_secs(6));
    assert!(
        !reader.is_finished(),
        "the reader did not wait for the server"
    );
    ng.restart();
    let got = reader
        .join()
        .unwrap()
        .expect("a read across a server restart");
    assert!(got == big, "wrong bytes after the restart");
    assert!(t0.elapsed() < Duration::from_secs(15), "{:?}", t0.elapsed());
    let s = m.stats();
    let waited = s["remote"]["http_wait_ms"].as_u64().unwrap();
    assert!(
        s["remote"]["http_retries"].as_u64().unwrap() >= 3 && waited >= 4000,
        "stats do not show the wait: {s}"
    );
    // An outage longer than the timeout: EIO once it has passed (not
    // before), and the reason in the mount's log.
    drop(m);
    let m = mount(
        &[&ng.url("repo/img")],
        &t.path().join("m2"),
        &[
            "--timeout",
            "4",
            "-o",
            &format!("prefetch_metadata=off,log={}", log.display()),
            "--no-cache",
        ],
    );
    assert!(fs::read(m.mp.join("text.txt")).unwrap() == text);
    ng.stop();
    let t0 = Instant::now();
    let r = fs::read(m.mp.join("big.bin"));
    let took = t0.elapsed();
    assert_eq!(
        r.map(|b| b.len()).map_err(|e| e.raw_os_error()),
        Err(Some(libc::EIO))
    );
    assert!(
        took >= Duration::from_millis(3500) && took < Duration::from_secs(12),
        "EIO after {took:?} with --timeout 4"
    );
    let logged = fs::read_to_string(&log).unwrap();
    assert!(
        logged.contains("Connection refused") && logged.contains("gave up after"),
        "no log line for the EIO:\n{logged}"
    );
    // Back again: the same mount reads right bytes.
    ng.restart();
    assert!(fs::read(m.mp.join("big.bin")).unwrap() == big);
}

#[test]
fn a_cache_deleted_or_unusable_under_a_mount_costs_only_refetches() {
    let t = tmpdir();
    let (_ng, src) = setup(t.path());
    let cache = t.path().join("cache");
    let log = t.path().join("mount.log");
    let m = mount(
        &[&_ng.url("repo/img")],
        &t.path().join("m"),
        &[&cache_arg(&cache), "-o", &format!("log={}", log.display())],
    );
    let text = fs::read(src.join("text.txt")).unwrap();
    assert!(fs::read(m.mp.join("text.txt")).unwrap() == text);
    assert!(cache.join("objects").is_dir());
    // Deleted (moved away in one step, then removed: background prefetch
    // may be writing into it): reads go on, and the cache is made again.
    let gone = |n: &str| {
        let trash = t.path().join(n);
        fs::rename(&cache, &trash).unwrap();
        fs::remove_dir_all(&trash).unwrap();
    };
    gone("trash1");
    let big = fs::read(src.join("big.bin")).unwrap();
    assert!(fs::read(m.mp.join("big.bin")).unwrap() == big);
    assert!(
        cache.join("objects").is_dir(),
        "the cache was not made again"
    );
    // Unusable (a file where the directory was, as a full or broken disk
    // would make every write fail): reads go on from the network, with one
    // warning in the log however many writes fail.
    gone("trash2");
    fs::write(&cache, b"not a directory").unwrap();
    assert_tree_eq(&m.mp, &src);
    let s = m.stats();
    assert!(
        s["disk_cache"]["disk_cache_write_errors"].as_u64().unwrap() > 1,
        "{s}"
    );
    let logged = fs::read_to_string(&log).unwrap();
    assert_eq!(
        logged.matches("cannot store objects").count(),
        1,
        "one warning expected:\n{logged}"
    );
}

#[test]
fn eight_mounts_share_one_cache_through_kill_9() {
    let t = tmpdir();
    let (mut ng, src) = setup(t.path());
    let src2 = t.path().join("src2");
    fs::create_dir_all(&src2).unwrap();
    small_tree(&src2, 5);
    write(&src2.join("big.bin"), &Rng::new(9).bytes(3 << 20));
    write(&src2.join("other.bin"), &Rng::new(10).bytes(1 << 20));
    build_and_publish(&src2, &ng.www, "img2");
    let cache = t.path().join("cache");
    let ca = cache_arg(&cache);
    let mounts: Vec<(Mounted, PathBuf)> = (0..8)
        .map(|i| {
            let (name, s) = if i % 2 == 0 {
                ("repo/img", &src)
            } else {
                ("repo/img2", &src2)
            };
            (
                mount(&[&ng.url(name)], &t.path().join(format!("m{i}")), &[&ca]),
                s.clone(),
            )
        })
        .collect();
    let victim = mounts[2].0.pid();
    let results: Vec<Vec<String>> = std::thread::scope(|sc| {
        let hs: Vec<_> = mounts
            .iter()
            .enumerate()
            .map(|(i, (m, s))| {
                sc.spawn(move || {
                    if i == 2 {
                        // Let it start fetching, then kill it mid-read.
                        std::thread::sleep(Duration::from_millis(150));
                        unsafe { libc::kill(victim, libc::SIGKILL) };
                        return Vec::new();
                    }
                    compare_trees(s, &m.mp, Cmp::all())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, r) in results.iter().enumerate() {
        assert!(r.is_empty(), "mount {i}: {r:?}");
    }
    drop(mounts);
    // Consistent afterwards: stats match the files, and both versions
    // remount offline from the cache alone and read back exactly.
    let st = json(&sheaf(["cache", "stats", "--json", &ca]).ok());
    let files = walk(&cache.join("objects"))
        .iter()
        .filter(|p| p.len() > 3)
        .count() as u64;
    assert_eq!(st["objects"].as_u64().unwrap(), files, "{st}");
    ng.stop();
    for (name, s) in [("repo/img", &src), ("repo/img2", &src2)] {
        let m = mount(&[&ng.url(name)], &t.path().join("offline"), &[&ca]);
        assert_same_tree(s, &m.mp, Cmp::all());
    }
    sheaf(["cache", "gc", "1", &ca]).ok();
    let st = json(&sheaf(["cache", "stats", "--json", &ca]).ok());
    assert_eq!(st["objects"], 0, "{st}");
}

#[test]
fn a_recorded_workload_is_prefetched_at_mount() {
    let t = tmpdir();
    let (ng, src) = setup(t.path());
    let list = t.path().join("workload.list");
    let url = ng.url("img.sheaf");
    let m = mount(
        &[&url],
        &t.path().join("m"),
        &["-o", &format!("record={}", list.display()), "--no-cache"],
    );
    let read = ["text.txt", "docs/a.txt", "big.bin"];
    for f in read {
        if m.mp.join(f).exists() {
            fs::read(m.mp.join(f)).unwrap();
        }
    }
    drop(m);
    std::thread::sleep(Duration::from_millis(300));
    let recorded = fs::read_to_string(&list).unwrap();
    let want: Vec<&str> = read
        .iter()
        .copied()
        .filter(|f| src.join(f).exists())
        .collect();
    assert_eq!(recorded.lines().collect::<Vec<_>>(), want);
    // Mounted with the list, the blocks arrive before they are read.
    let wait_prefetch = |m: &Mounted| {
        let t0 = Instant::now();
        loop {
            let s = m.stats();
            if s["prefetch"]["background_bytes"].as_u64().unwrap() > 0 {
                return s;
            }
            assert!(t0.elapsed() < Duration::from_secs(20), "no prefetch: {s}");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let check = |m: &Mounted| {
        let s0 = wait_prefetch(m);
        for f in &want {
            assert!(fs::read(m.mp.join(f)).unwrap() == fs::read(src.join(f)).unwrap());
        }
        let s1 = m.stats();
        assert_eq!(
            s0["remote"]["http_requests"], s1["remote"]["http_requests"],
            "reads went to the network after the prefetch:\n{s0}\n{s1}"
        );
    };
    let m = mount(
        &[&url],
        &t.path().join("m"),
        &[
            "-o",
            &format!("prefetch={},readahead=0", list.display()),
            &cache_arg(&t.path().join("c1")),
        ],
    );
    check(&m);
    drop(m);
    // Built into the image: placed first, listed, fetched without options.
    let img = ng.www.join("pf.sheaf");
    build(
        &src,
        &img,
        &["--block-size", "256K", "--prefetch", list.to_str().unwrap()],
    )
    .ok();
    let m = mount(
        &[&ng.url("pf.sheaf")],
        &t.path().join("m"),
        &["-o", "readahead=0", &cache_arg(&t.path().join("c2"))],
    );
    check(&m);
    assert_tree_eq(&m.mp, &src);
    drop(m);
    // Or rewritten from the published image (data copied, not recompressed).
    let opt = ng.www.join("opt.sheaf");
    let mut c = cmd();
    c.args(["optimize", &url, "--prefetch"])
        .arg(&list)
        .arg("-o")
        .arg(&opt);
    run_cmd(&mut c).ok();
    sheaf(["check".as_ref(), opt.as_os_str()]).ok();
    let m = mount(
        &[&ng.url("opt.sheaf")],
        &t.path().join("m"),
        &["-o", "readahead=0", &cache_arg(&t.path().join("c3"))],
    );
    check(&m);
    assert_tree_eq(&m.mp, &src);
}

/// `openssl` with arguments, which must succeed.
fn openssl(dir: &Path, args: &[&str]) {
    let o = std::process::Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl");
    assert!(
        o.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn https_is_verified_against_the_system_roots() {
    let t = tmpdir();
    let d = t.path();
    // A private CA and a server certificate for 127.0.0.1 signed by it.
    openssl(
        d,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=sheaf test CA",
        ],
    );
    openssl(
        d,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "srv.key",
            "-out",
            "srv.csr",
            "-subj",
            "/CN=127.0.0.1",
        ],
    );
    fs::write(
        d.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n",
    )
    .unwrap();
    openssl(
        d,
        &[
            "x509",
            "-req",
            "-in",
            "srv.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "srv.pem",
            "-days",
            "2",
            "-extfile",
            "ext.cnf",
        ],
    );
    let src = d.join("src");
    fs::create_dir_all(&src).unwrap();
    small_tree(&src, 3);
    let www = d.join("www");
    fs::create_dir_all(&www).unwrap();
    build(&src, &www.join("img.sheaf"), &[]).ok();
    let ng = Nginx::start_tls(d, &www, &d.join("srv.pem"), &d.join("srv.key"));
    let url = ng.url("img.sheaf");
    assert!(url.starts_with("https://"));
    // Not trusted by the system roots: refused, in one line, at once
    // (waiting until --timeout would not make it trusted).
    let t0 = Instant::now();
    let o = run_cmd(
        cmd()
            .args(["ls", &url])
            .env("SSL_CERT_FILE", d.join("srv.csr")),
    )
    .fails_with(1);
    assert!(o.one_err_line().contains(&url), "{}", o.describe());
    assert!(
        t0.elapsed() < Duration::from_secs(15),
        "{:?}: {}",
        t0.elapsed(),
        o.describe()
    );
    // With the CA among the roots (SSL_CERT_FILE, as for a site CA bundle).
    let mut c = cmd();
    c.args(["cat", &url, "README.txt"])
        .env("SSL_CERT_FILE", d.join("ca.pem"));
    let o = run_cmd(&mut c).ok();
    assert!(o.stdout == fs::read(src.join("README.txt")).unwrap());
}

#[test]
fn fstab_style_mount_options_set_the_cache_mirrors_and_timeout() {
    let t = tmpdir();
    let (ng, src) = setup(t.path());
    let empty = Nginx::start_with_root(t.path(), &t.path().join("empty"));
    let cache = t.path().join("fstab-cache");
    let opts = format!(
        "ro,cache_dir={},cache_quota=1G,mirror={},timeout=5,failback=600",
        cache.display(),
        ng.url("repo/img")
    );
    let m = mount(
        &[&empty.url("repo/img")],
        &t.path().join("m"),
        &["-o", &opts],
    );
    assert_tree_eq(&m.mp, &src);
    let s = m.stats();
    assert_eq!(
        s["disk_cache"]["disk_cache"],
        cache.display().to_string(),
        "{s}"
    );
    assert_eq!(s["disk_cache"]["disk_cache_quota"], 1u64 << 30, "{s}");
    assert_eq!(s["remote"]["http_url"], ng.url("repo/img"), "{s}");
    drop(m);
    let o = run_cmd(cmd().args([
        "mount",
        "-o",
        "timeout=soon",
        &ng.url("img.sheaf"),
        "/nonexistent",
    ]))
    .fails_with(1);
    assert!(
        o.one_err_line().contains("timeout=soon"),
        "{}",
        o.describe()
    );
}

#[test]
fn cache_fetch_fills_the_node_cache_with_the_listed_files_only() {
    let t = tmpdir();
    let (mut ng, src) = setup(t.path());
    let cache = t.path().join("cache");
    let ca = cache_arg(&cache);
    let url = ng.url("repo/img");
    let list = t.path().join("list");
    fs::write(&list, "/text.txt\n/no/such/file\n").unwrap();
    let fetch = || {
        json(
            &sheaf([
                "cache",
                "fetch",
                &url,
                "--list",
                list.to_str().unwrap(),
                "--json",
                &ca,
            ])
            .ok(),
        )
    };
    let v = fetch();
    // 2 MiB of text in 256 KiB blocks.
    assert_eq!(v["blocks"], 8, "{v}");
    assert!(v["data_bytes_fetched"].as_u64().unwrap() > 0, "{v}");
    // A second fetch finds everything in the cache.
    let v = fetch();
    assert_eq!(v["data_bytes_fetched"], 0, "{v}");
    assert_eq!(v["metadata_bytes_fetched"], 0, "{v}");
    // With the server gone, the listed file reads from the cache alone and
    // equals the source; an unlisted one cannot be read.
    ng.stop();
    let o = sheaf(["cat", &url, "/text.txt", &ca, "--timeout", "2"]).ok();
    assert_eq!(o.stdout, fs::read(src.join("text.txt")).unwrap());
    sheaf(["cat", &url, "/big.bin", &ca, "--timeout", "2"]).fails_with(1);
    // A local image needs no fetching: one line.
    let o = sheaf([
        "cache",
        "fetch",
        t.path().join("www/img.sheaf").to_str().unwrap(),
        &ca,
    ])
    .fails_with(1);
    assert!(o.one_err_line().contains("only URLs"), "{}", o.stderr);
}

/// `sheaf mount ... URL MP`, spawned with its output piped, returning
/// the output and how long it took.
fn timed_mount(url: &str, mp: &Path, args: &[&str]) -> (Out, Duration) {
    let t0 = Instant::now();
    let o = run_cmd(&mut mount_cmd(&[url], mp, args));
    (o, t0.elapsed())
}

#[test]
fn wait_for_server_waits_for_a_server_never_reached_and_without_it_the_mount_fails_at_once() {
    let t = tmpdir();
    let (mut ng, src) = setup(t.path());
    let url = ng.url("img.sheaf");
    let mp = t.path().join("m");
    ng.stop();
    // Without the switch, as before: nothing listening fails at once.
    let (o, took) = timed_mount(&url, &mp, &["--timeout", "20", "--no-cache"]);
    let o = o.fails_with(1);
    let line = o.one_err_line();
    assert!(
        line.contains(&url) && line.contains("connection refused"),
        "{}",
        o.describe()
    );
    assert!(took < Duration::from_secs(2), "failed after {took:?}");
    assert!(!is_mounted(&mp));
    // With it and a server that never comes back: the waiting line once,
    // then one error line naming the URL once --timeout has passed.
    let (o, took) = timed_mount(
        &url,
        &mp,
        &["--wait-for-server", "--timeout", "3", "--no-cache"],
    );
    let o = o.fails_with(1);
    let lines = o.err_lines();
    assert!(
        lines.len() == 2
            && lines[0] == format!("sheaf: waiting for {url} (connection refused), up to 3 s")
            && lines[1].starts_with(&format!("sheaf: error: {url}: "))
            && lines[1].contains("gave up after"),
        "{}",
        o.describe()
    );
    assert!(
        took >= Duration::from_millis(2900) && took < Duration::from_secs(6),
        "gave up after {took:?} with --timeout 3"
    );
    assert!(!is_mounted(&mp));
    // With it and the server back after 3 s: the mount waits, then
    // serves the source's bytes.
    let c = mount_cmd(
        &[&url],
        &mp,
        &["--wait-for-server", "--timeout", "20", "--no-cache"],
    )
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(3));
    ng.restart();
    let o = c.wait_with_output().unwrap();
    let m = Mounted::adopt(&mp);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "the mount failed: {err}");
    assert!(t0.elapsed() < Duration::from_secs(12), "{:?}", t0.elapsed());
    assert_eq!(
        err.trim_end(),
        format!("sheaf: waiting for {url} (connection refused), up to 20 s"),
    );
    assert!(is_mounted(&mp));
    assert!(
        fs::read(m.mp.join("big.bin")).unwrap() == fs::read(src.join("big.bin")).unwrap(),
        "wrong bytes"
    );
    assert!(fs::read(m.mp.join("text.txt")).unwrap() == fs::read(src.join("text.txt")).unwrap());
}

#[test]
fn a_mount_request_with_wait_for_server_waits_for_the_server() {
    let t = tmpdir();
    let (mut ng, src) = setup(t.path());
    let url = ng.url("repo/img");
    let mp = t.path().join("m");
    fs::create_dir_all(&mp).unwrap();
    let req = serde_json::json!({
        "version": 1,
        "images": [{"source": url}],
        "mountpoint": mp,
        "wait_for_server": true,
    });
    ng.stop();
    let t0 = Instant::now();
    let back = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(2));
        ng.restart();
        ng
    });
    let o = run_with_stdin(
        cmd().args(["--timeout", "20", "mount", "--request", "-"]),
        req.to_string().into_bytes(),
    );
    let mut ng = back.join().unwrap();
    let m = Mounted::adopt(&mp);
    let o = o.ok();
    assert!(t0.elapsed() < Duration::from_secs(12), "{:?}", t0.elapsed());
    assert!(
        o.stderr
            .contains(&format!("sheaf: waiting for {url} (connection refused)")),
        "{}",
        o.describe()
    );
    assert!(fs::read(m.mp.join("big.bin")).unwrap() == fs::read(src.join("big.bin")).unwrap());
    drop(m);
    // Without the field (an older asker): fails at once, as before.
    ng.stop();
    let mut old = req.clone();
    old.as_object_mut().unwrap().remove("wait_for_server");
    let t0 = Instant::now();
    let o = run_with_stdin(
        cmd().args(["--timeout", "20", "mount", "--request", "-"]),
        old.to_string().into_bytes(),
    )
    .fails_with(1);
    assert!(
        o.one_err_line().contains("connection refused"),
        "{}",
        o.describe()
    );
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    assert!(!is_mounted(&mp));
}
