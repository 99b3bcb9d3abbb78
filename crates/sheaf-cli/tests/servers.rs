//! The test servers themselves (tests/common/servers.rs) checked with curl:
//! squid caches what nginx serves, and the fault proxy passes bytes through
//! unchanged or breaks them exactly as its mode says.

mod common;

use common::servers::{FaultProxy, Nginx, Squid};
use common::*;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `curl -sS ARGS...`, ignoring any proxy from the environment.
fn curl(args: &[&str]) -> Out {
    let mut c = Command::new("curl");
    c.stdin(Stdio::null()).arg("-sS").args(args);
    for v in [
        "http_proxy",
        "HTTP_PROXY",
        "https_proxy",
        "HTTPS_PROXY",
        "all_proxy",
        "ALL_PROXY",
        "no_proxy",
        "NO_PROXY",
    ] {
        c.env_remove(v);
    }
    run_cmd(&mut c)
}

#[test]
fn squid_serves_a_second_full_fetch_from_its_cache() {
    let t = tmpdir();
    let ng = Nginx::start(t.path());
    let data = Rng::new(7).bytes(2 << 20);
    write(&ng.www.join("f.bin"), &data);
    let sq = Squid::start(t.path());
    let proxy = sq.proxy_url();
    let url = ng.url("f.bin");
    for i in 1..=2 {
        let o = curl(&["-x", &proxy, &url]).ok();
        assert!(o.stdout == data, "fetch {i} through squid: wrong bytes");
        let (hits, misses) = sq.wait_hits(i);
        assert_eq!(
            (hits, misses),
            (i - 1, 1),
            "after fetch {i}:\n{}",
            sq.access_log()
        );
    }
    // A Range request for the cached object is a hit too, with the right bytes.
    let o = curl(&["-x", &proxy, "-r", "1000-1999", &url]).ok();
    assert!(o.stdout == data[1000..2000]);
    assert_eq!(sq.wait_hits(3), (2, 1), "{}", sq.access_log());
    // A Range request for an object not cached is forwarded as it is (a miss).
    write(&ng.www.join("g.bin"), &data);
    let o = curl(&["-x", &proxy, "-r", "5-9", &ng.url("g.bin")]).ok();
    assert!(o.stdout == data[5..10]);
    assert_eq!(sq.wait_hits(4), (2, 2), "{}", sq.access_log());
    assert!(sq.access_log().contains("TCP_MISS/206"));
}

#[test]
fn fault_proxy_passes_or_corrupts_one_byte() {
    let t = tmpdir();
    let ng = Nginx::start(t.path());
    let data = Rng::new(8).bytes(1 << 20);
    write(&ng.www.join("f.bin"), &data);
    let fp = FaultProxy::start(&ng.base(), "pass");
    let (a, b) = (1000, 900_000);
    let range = format!("{a}-{b}");
    let want = &data[a..=b];
    // Reverse proxy, and forward proxy (absolute URL via -x).
    let o = curl(&["-r", &range, &fp.url("f.bin")]).ok();
    assert!(o.stdout == want, "pass (reverse): bytes differ");
    let o = curl(&["-x", &fp.base(), "-r", &range, &ng.url("f.bin")]).ok();
    assert!(o.stdout == want, "pass (forward): bytes differ");
    fp.set_mode("corrupt");
    assert_eq!(fp.mode(), "corrupt");
    for o in [
        curl(&["-r", &range, &fp.url("f.bin")]).ok(),
        curl(&["-x", &fp.base(), "-r", &range, &ng.url("f.bin")]).ok(),
    ] {
        assert_eq!(o.stdout.len(), want.len(), "corrupt changed the length");
        let diff: Vec<usize> = (0..want.len())
            .filter(|&i| o.stdout[i] != want[i])
            .collect();
        assert_eq!(diff.len(), 1, "corrupt changed bytes at {diff:?}");
    }
    assert_eq!(fp.count(), 4);
}

#[test]
fn fault_proxy_truncates_fails_and_hangs() {
    let t = tmpdir();
    let ng = Nginx::start(t.path());
    let data = Rng::new(9).bytes(1 << 20);
    write(&ng.www.join("f.bin"), &data);
    let fp = FaultProxy::start(&ng.base(), "truncate");
    let url = fp.url("f.bin");
    // Truncated: curl sees the connection end before Content-Length bytes.
    let o = curl(&[&url]);
    assert_eq!(o.code, 18, "truncate: curl should fail:\n{}", o.describe());
    assert_eq!(o.stdout.len(), data.len() / 2);
    // A status without touching upstream.
    fp.set_mode("status=404");
    let o = curl(&["-o", "/dev/null", "-w", "%{http_code}", &url]).ok();
    assert_eq!(o.text(), "404");
    // A hanging request blocks neither the control URLs nor other requests.
    fp.set_mode("hang");
    let mut hung = Command::new("curl")
        .args(["-s", "-m", "60", &url])
        .stdout(Stdio::null())
        .spawn()
        .expect("curl");
    let t0 = Instant::now();
    while fp.count() < 3 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the hanging request never arrived"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(hung.try_wait().unwrap().is_none(), "hang answered");
    fp.set_mode("delay=50,pass");
    let o = curl(&["-m", "20", &url]).ok();
    assert!(o.stdout == data, "pass after hang: bytes differ");
    assert!(hung.try_wait().unwrap().is_none(), "hang answered");
    assert_eq!(fp.count(), 4);
    hung.kill().unwrap();
    hung.wait().unwrap();
}
