//! Images over ssh:// against a real sshd on loopback (its own host key and
//! config), through the real OpenSSH client: the commands and a mount read
//! exactly the source; an sshd restart under a mount is a wait, a longer
//! outage EIO past --timeout; a wrong host key is refused with ssh's own
//! words; a missing file is one line.

mod common;
use common::servers::Sshd;
use common::*;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// The image of `small_tree` and its ssh:// URL on `sshd`.
fn image_over_ssh(t: &Path, sshd: &Sshd) -> (std::path::PathBuf, std::path::PathBuf, String) {
    let src = t.join("src");
    small_tree(&src, 7);
    // More than one read's worth of many files, so reads pipeline.
    let mut r = Rng::new(3);
    std::fs::create_dir_all(src.join("many")).unwrap();
    for i in 0..300 {
        write(&src.join(format!("many/f{i:03}")), &r.bytes(3000 + i * 37));
    }
    let img = t.join("img.sheaf");
    build(&src, &img, &["--block-size", "64K"]);
    let url = format!(
        "ssh://{}@127.0.0.1:{}{}",
        sshd.user,
        sshd.port,
        img.display()
    );
    (src, img, url)
}

fn with_ssh(sshd: &Sshd, args: &[&str]) -> Out {
    let mut c = cmd();
    c.args(args).env("SHEAF_SSH", sshd.ssh_command());
    run_cmd(&mut c)
}

#[test]
fn commands_and_a_mount_over_ssh_read_exactly_the_source() {
    let t = tmpdir();
    let sshd = Sshd::start(t.path());
    let (src, img, url) = image_over_ssh(t.path(), &sshd);
    // info / check / cat / extract over ssh:// equal the local image's.
    let local = json(&sheaf(["info".as_ref(), "--json".as_ref(), img.as_os_str()]).ok());
    let remote = json(&with_ssh(&sshd, &["info", "--json", &url]).ok());
    assert_eq!(remote["root"], local["root"], "{remote}");
    with_ssh(&sshd, &["check", &url]).ok();
    let cat = with_ssh(&sshd, &["cat", &url, "/bin/tool"]).ok();
    assert_eq!(cat.stdout, std::fs::read(src.join("bin/tool")).unwrap());
    let out = t.path().join("out");
    with_ssh(
        &sshd,
        &["extract", &url, "-C", out.to_str().unwrap(), "--no-cache"],
    )
    .ok();
    assert_same_tree(&src, &out, Cmp::all());
    if !mounts_allowed() {
        return;
    }
    let mp = t.path().join("mp");
    let mut c = cmd();
    c.args(["mount", "--no-cache", &url])
        .arg(&mp)
        .env("SHEAF_SSH", sshd.ssh_command());
    let m = Mounted::run(&mut c, &mp);
    assert_same_tree(&src, &mp, Cmp::all());
    let st = m.stats();
    assert!(st["remote"]["ssh_bytes"].as_u64().unwrap() > 0, "{st}");
    m.umount();
}

#[test]
fn an_sshd_restart_is_a_wait_and_a_long_outage_is_eio_past_the_timeout() {
    if !mounts_allowed() {
        return;
    }
    let t = tmpdir();
    let mut sshd = Sshd::start(t.path());
    let (src, _img, url) = image_over_ssh(t.path(), &sshd);
    let mp = t.path().join("mp");
    let mut c = cmd();
    c.args(["mount", "--no-cache", "--timeout", "20", &url])
        .arg(&mp)
        .env("SHEAF_SSH", sshd.ssh_command());
    let m = Mounted::run(&mut c, &mp);
    // A first read works; then sshd (and the session) goes away for 3 s.
    same_content(&src.join("many/f000"), &mp.join("many/f000")).unwrap();
    sshd.stop();
    let reader = {
        let (a, b) = (src.join("bin/tool"), mp.join("bin/tool"));
        std::thread::spawn(move || same_content(&a, &b))
    };
    std::thread::sleep(Duration::from_secs(3));
    sshd.restart();
    if let Err(e) = reader.join().unwrap() {
        panic!(
            "a read across an sshd restart failed: {e}\nstats: {}",
            m.stats()
        );
    }
    assert_same_tree(&src, &mp, Cmp::all());
    let st = m.stats();
    assert!(
        st["remote"]["ssh_reconnects"].as_u64().unwrap() >= 1,
        "{st}"
    );
    m.umount();

    // --timeout 3 and sshd gone for good: EIO within the timeout (and a
    // margin), not a hang.
    let mut c = cmd();
    c.args(["mount", "--no-cache", "--timeout", "3", &url])
        .arg(&mp)
        .env("SHEAF_SSH", sshd.ssh_command());
    let m = Mounted::run(&mut c, &mp);
    sshd.stop();
    let t0 = Instant::now();
    let e = std::fs::read(mp.join("many/f123")).unwrap_err();
    let took = t0.elapsed();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    assert!(took < Duration::from_secs(15), "EIO took {took:?}");
    assert!(took >= Duration::from_secs(2), "gave up early: {took:?}");
    m.umount();
}

#[test]
fn a_wrong_host_key_is_refused_with_ssh_s_own_words_and_a_missing_file_is_one_line() {
    let t = tmpdir();
    let sshd = Sshd::start(t.path());
    let (_src, _img, url) = image_over_ssh(t.path(), &sshd);
    // known_hosts naming another key for this server.
    let other = t.path().join("other_key");
    let o = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(&other)
        .output()
        .unwrap();
    assert!(o.status.success());
    let pubkey = std::fs::read_to_string(other.with_extension("pub")).unwrap();
    let kh = t.path().join("known_hosts");
    write(
        &kh,
        format!("[127.0.0.1]:{} {}", sshd.port, pubkey.trim()).as_bytes(),
    );
    let strict = sshd
        .ssh_command()
        .replace(
            "UserKnownHostsFile=/dev/null",
            &format!("UserKnownHostsFile={}", kh.display()),
        )
        .replace("StrictHostKeyChecking=no", "StrictHostKeyChecking=yes");
    let t0 = Instant::now();
    let mut c = cmd();
    c.args(["info", &url]).env("SHEAF_SSH", &strict);
    let o = run_cmd(&mut c);
    assert_ne!(o.code, 0);
    assert!(t0.elapsed() < Duration::from_secs(10), "refusal waited");
    let lines = o.err_lines();
    assert_eq!(lines.len(), 1, "{}", o.describe());
    assert!(
        lines[0].contains("Host key verification failed") && lines[0].contains("ssh://"),
        "{}",
        o.describe()
    );
    // A missing image: one line naming it, at once.
    let missing = format!("ssh://127.0.0.1:{}/nonexistent/x.sheaf", sshd.port);
    let o = with_ssh(&sshd, &["info", &missing]);
    assert_ne!(o.code, 0);
    assert_eq!(o.err_lines().len(), 1, "{}", o.describe());
    assert!(
        o.stderr.contains("/nonexistent/x.sheaf"),
        "{}",
        o.describe()
    );
}
