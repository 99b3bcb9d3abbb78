//! The test servers themselves (tests/common/servers.rs) checked with curl,
//! ssh and sshfs: squid caches what nginx serves, the fault proxy passes
//! bytes through unchanged or breaks them exactly as its mode says, and sshd
//! runs commands (exit codes kept) and serves sshfs through a remote command
//! given as `sftp_server=`.

mod common;

use common::servers::{is_mount_point, FaultProxy, Nginx, Squid, Sshd};
use common::*;
use std::fs;
use std::path::Path;
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

#[test]
fn sshd_runs_commands_and_keeps_exit_codes() {
    let t = tmpdir();
    let sshd = Sshd::start_with_env(t.path(), &[("SHEAF_TEST_VAR", "a b")]);
    let o = run_cmd(sshd.ssh().arg("true"));
    assert_eq!(
        o.code,
        0,
        "ssh true:\n{}\nsshd log:\n{}",
        o.describe(),
        sshd.log_text()
    );
    assert_eq!(
        o.stdout, b"",
        "the session writes nothing of its own to stdout"
    );
    run_cmd(sshd.ssh().arg("exit 3")).fails_with(3);
    run_cmd(sshd.ssh().arg("false")).fails_with(1);
    // Arguments reach the remote shell joined with spaces; stdout and stderr
    // come back separately; SetEnv applies to every session.
    let o = run_cmd(
        sshd.ssh()
            .args(["echo", "out;", "echo err >&2;", "echo \"$SHEAF_TEST_VAR\""]),
    )
    .ok();
    assert_eq!(o.text(), "out\na b\n");
    assert_eq!(o.stderr, "err\n");
    // The binary under test runs by its absolute path, as the test's user.
    let o = run_cmd(sshd.ssh().arg(format!("{} --version; id -un", bin()))).ok();
    let text = o.text();
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines.len() == 2 && lines[0].starts_with("sheaf "),
        "{}",
        o.describe()
    );
    assert_eq!(lines[1], sshd.user);
    // stdin is forwarded when the caller gives one.
    let o = run_with_stdin(sshd.ssh().arg("wc -c"), vec![b'x'; 100_000]);
    assert_eq!(o.code, 0, "{}", o.describe());
    assert_eq!(o.text().trim(), "100000");
    // Stopping the server ends running sessions and their commands; then
    // connections fail (255: ssh itself failed).
    let marker = "987654.321";
    let mut session = sshd
        .ssh()
        .arg(format!("exec sleep {marker}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while sleepers(marker) == 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "remote sleep never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut sshd = sshd;
    sshd.stop();
    assert_eq!(sleepers(marker), 0, "the session's command outlived sshd");
    let t0 = Instant::now();
    while session.try_wait().unwrap().is_none() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "ssh client still connected"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    run_cmd(sshd.ssh().arg("true")).fails_with(255);
}

/// Live `sleep ARG` processes.
fn sleepers(arg: &str) -> usize {
    let want = format!("sleep\0{arg}\0");
    fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            let p = e.path();
            fs::read(p.join("cmdline")).is_ok_and(|c| c == want.as_bytes())
                && !fs::read_to_string(p.join("stat"))
                    .unwrap_or_default()
                    .rsplit_once(')')
                    .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
        })
        .count()
}

const SFTP_SERVER: &str = "/usr/lib/openssh/sftp-server";

#[test]
fn sshfs_mounts_through_sftp_server_as_a_remote_command() {
    assert!(
        Path::new(SFTP_SERVER).is_file(),
        "{SFTP_SERVER} missing (apt-get install openssh-server)"
    );
    let t = tmpdir();
    let sshd = Sshd::start(t.path());
    let export = t.path().join("export");
    fs::create_dir_all(export.join("sub")).unwrap();
    let data = Rng::new(11).bytes(3 << 20);
    write(&export.join("sub/f.bin"), &data);
    write(&export.join("hello.txt"), b"hello\n");
    let export = export.canonicalize().unwrap();
    let mp = t.path().join("mnt");
    let mut m = sshd.sshfs(SFTP_SERVER, &export.to_string_lossy(), &mp);
    let mp = m.mountpoint.clone();
    assert!(is_mount_point(&mp));
    let fstype = fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(&*mp.to_string_lossy()))
        .map(|l| l.to_string())
        .unwrap();
    assert!(fstype.contains(" fuse.sshfs "), "{fstype}");
    // Written on the server side, read through the mount.
    assert_eq!(fs::read(mp.join("hello.txt")).unwrap(), b"hello\n");
    assert!(
        fs::read(mp.join("sub/f.bin")).unwrap() == data,
        "sub/f.bin: bytes differ through sshfs"
    );
    let mut names: Vec<String> = fs::read_dir(&mp)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["hello.txt", "sub"]);
    // Written after mounting on the server side, and through the mount.
    write(&export.join("later.txt"), b"later\n");
    assert_eq!(fs::read(mp.join("later.txt")).unwrap(), b"later\n");
    write(&mp.join("back.txt"), b"back\n");
    assert_eq!(fs::read(export.join("back.txt")).unwrap(), b"back\n");
    // sftp-server ran as a plain command (sshfs gives it to ssh as the remote
    // command when it has a `/`), not as the sftp subsystem.
    let log = sshd.log_text();
    assert!(
        log.contains(&format!("Starting session: command for {}", sshd.user)),
        "sshd log:\n{log}"
    );
    assert!(
        !log.contains("subsystem request for sftp"),
        "sshd log:\n{log}"
    );
    m.unmount()
        .unwrap_or_else(|e| panic!("{e}\n{}", m.log_text()));
    assert!(!is_mount_point(&mp));
    assert!(fs::read_dir(&mp).unwrap().next().is_none());
}

#[test]
fn sshfs_runs_a_remote_command_with_arguments_and_unmounts_on_panic() {
    let t = tmpdir();
    let sshd = Sshd::start(t.path());
    let export = t.path().join("export");
    fs::create_dir_all(&export).unwrap();
    write(&export.join("x.txt"), b"x\n");
    let export = export.canonicalize().unwrap();
    // A command with arguments (as `sheaf run ... -- sftp-server` will be):
    // here sftp-server starting in EXPORT, so the empty remote path is it.
    let remote = format!(
        "/usr/bin/env SHEAF_UNUSED=1 {SFTP_SERVER} -d {}",
        export.display()
    );
    let mp = t.path().join("mnt");
    fs::create_dir_all(&mp).unwrap();
    let mp = mp.canonicalize().unwrap();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _m = sshd.sshfs(&remote, "", &mp);
        assert_eq!(fs::read(mp.join("x.txt")).unwrap(), b"x\n");
        assert!(is_mount_point(&mp));
        panic!("deliberate panic (expected): the guard must unmount while unwinding");
    }));
    assert!(r.is_err());
    // The guard unmounted it while unwinding.
    assert!(
        !is_mount_point(&mp),
        "still mounted after the guard dropped"
    );
    // A failing remote command makes sshfs fail, with its stderr in the panic.
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        sshd.sshfs("/bin/sh -c 'echo no-such-image >&2; exit 1'", "", &mp);
    }));
    let msg = r
        .err()
        .and_then(|e| e.downcast_ref::<String>().cloned())
        .expect("sshfs through a failing command should panic");
    assert!(msg.contains("no-such-image"), "{msg}");
    assert!(!is_mount_point(&mp));
}
