//! Issue 53 (hostile input, round two): credentials in a URL, against a
//! real nginx started by the test. The process serving a mount of
//! `http://alice:s3cr3t@…?X-Amz-Signature=…` carries no secret in its
//! command line or environment (`ps` shows those to every user), and what
//! sheaf prints about the image (info, stats, in text and JSON) shows the
//! URL redacted.

mod common;

use common::servers::Nginx;
use common::*;
use std::fs;
use std::path::Path;

const SECRETS: [&str; 5] = ["s3cr3t", "deadbeef0123", "AKIASECRET", "m1rr0r", "0pt10n"];

/// `url` with a password and a presigned query (nginx serves the file
/// whatever they say: the secrets only travel).
fn with_secrets(url: &str) -> String {
    format!(
        "{}?X-Amz-Signature=deadbeef0123&X-Amz-Credential=AKIASECRET",
        url.replacen("http://", "http://alice:s3cr3t@", 1)
    )
}

fn assert_no_secret(what: &str, bytes: &[u8]) {
    for s in SECRETS {
        assert!(
            !bytes.windows(s.len()).any(|w| w == s.as_bytes()),
            "{what} holds {s:?}: {}",
            String::from_utf8_lossy(bytes)
        );
    }
}

/// Every process of ours whose command line names sheaf: (pid, cmdline).
fn sheaf_processes() -> Vec<(u32, Vec<u8>)> {
    let mut v = Vec::new();
    for e in fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmdline) = fs::read(e.path().join("cmdline")) else {
            continue;
        };
        if cmdline.windows(5).any(|w| w == b"sheaf") {
            v.push((pid, cmdline));
        }
    }
    v
}

#[test]
fn a_mount_of_a_url_with_credentials_keeps_them_out_of_argv_and_output() {
    let t = tmpdir();
    let ng = Nginx::start(t.path());
    let src = t.path().join("src");
    fs::create_dir_all(&src).unwrap();
    small_tree(&src, 53);
    build(&src, &ng.www.join("img.sheaf"), &[]).ok();
    let url = with_secrets(&ng.url("img.sheaf"));
    // The form every output must show (the redaction rule, written out).
    let shown = format!(
        "{}?X-Amz-Signature=***&X-Amz-Credential=***",
        ng.url("img.sheaf")
            .replacen("http://", "http://alice:***@", 1)
    );
    let mp = t.path().join("mnt");
    let guard = mount(&[url.as_str()], &mp, &[]);
    assert_tree_eq(&mp, &src);
    let pid = guard.pid() as u32;
    // The serving process: no secret in its command line or environment.
    let dir = Path::new("/proc").join(pid.to_string());
    let cmdline = fs::read(dir.join("cmdline")).unwrap();
    assert!(!cmdline.is_empty());
    assert_no_secret("the serving process's cmdline", &cmdline);
    assert_no_secret(
        "the serving process's environ",
        &fs::read(dir.join("environ")).unwrap(),
    );
    // Nor any other sheaf process still running.
    let procs = sheaf_processes();
    assert!(procs.iter().any(|(p, _)| *p == pid), "{procs:?}");
    for (p, cmdline) in &procs {
        assert_no_secret(&format!("pid {p}'s cmdline"), cmdline);
        if let Ok(env) = fs::read(format!("/proc/{p}/environ")) {
            assert_no_secret(&format!("pid {p}'s environ"), &env);
        }
    }
    // What sheaf prints about the mount and the image.
    let stats = json(&sheaf(["stats".as_ref(), "--json".as_ref(), mp.as_os_str()]).ok());
    assert_eq!(stats["image"].as_str(), Some(shown.as_str()), "{stats}");
    for out in [
        sheaf(["stats".as_ref(), mp.as_os_str()]).ok(),
        sheaf(["stats".as_ref(), "--json".as_ref(), mp.as_os_str()]).ok(),
        sheaf(["info", url.as_str()]).ok(),
        sheaf(["info", "--json", url.as_str()]).ok(),
        sheaf(["check", url.as_str()]).ok(),
    ] {
        assert_no_secret("output", &out.stdout);
        assert_no_secret("stderr", out.stderr.as_bytes());
    }
    let info = json(&sheaf(["info", "--json", url.as_str()]).ok());
    assert_eq!(info["image"].as_str(), Some(shown.as_str()));
    let text = sheaf(["info", url.as_str()]).ok().text();
    assert!(text.contains(&format!("image:        {shown} (")), "{text}");
    // /proc/mounts too (redacted before this issue; kept so).
    assert_no_secret("/proc/mounts", &fs::read("/proc/self/mounts").unwrap());
    // A missing image: the error names it redacted.
    let bad = sheaf(["info", with_secrets(&ng.url("missing.sheaf")).as_str()]);
    assert_no_secret("an error", bad.stderr.as_bytes());
    guard.umount();
    // A plain image URL with mirrors that hold credentials (a flag and a
    // mount option): the serving process's command line holds neither,
    // for they reach it in its request.
    let plain = ng.url("img.sheaf");
    let guard = mount(
        &[plain.as_str()],
        &mp,
        &[
            "--mirror=http://bob:m1rr0r@127.0.0.1:9/",
            "-o",
            "ro,mirror=http://carol:0pt10n@127.0.0.1:9/",
        ],
    );
    assert_tree_eq(&mp, &src);
    for (p, cmdline) in sheaf_processes() {
        assert_no_secret(&format!("pid {p}'s cmdline"), &cmdline);
    }
    let daemon = fs::read(format!("/proc/{}/cmdline", guard.pid())).unwrap();
    assert!(
        daemon.windows(9).any(|w| w == b"--request"),
        "{}",
        String::from_utf8_lossy(&daemon)
    );
    guard.umount();
}
