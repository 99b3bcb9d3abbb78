//! Signatures with real OpenSSH tools: `ssh-keygen -Y sign/verify` both ways
//! for ed25519, ecdsa and rsa, a real `ssh-agent`, tampering, and the
//! signature policy of `sheaf mount` (flags and config file).

mod common;

use common::*;
use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

struct Keys {
    dir: PathBuf,
}

impl Keys {
    fn new(dir: &Path) -> Self {
        for (name, args) in [
            ("ed", &["-t", "ed25519"][..]),
            ("ec", &["-t", "ecdsa"]),
            ("rsa", &["-t", "rsa", "-b", "3072"]),
            ("other", &["-t", "ed25519"]),
        ] {
            run_cmd(
                Command::new("ssh-keygen")
                    .args(["-q", "-N", "", "-C", name, "-f"])
                    .arg(dir.join(name))
                    .args(args),
            )
            .ok();
        }
        Keys {
            dir: dir.to_path_buf(),
        }
    }
    fn key(&self, n: &str) -> PathBuf {
        self.dir.join(n)
    }
    fn public(&self, n: &str) -> String {
        let t = fs::read_to_string(self.dir.join(format!("{n}.pub"))).unwrap();
        t.split_whitespace().take(2).collect::<Vec<_>>().join(" ")
    }
    /// allowed_signers trusting ed, ec and rsa as alice@example.org.
    fn allowed(&self, extra: &str) -> PathBuf {
        let p = self.dir.join("allowed_signers");
        let mut t = String::new();
        for k in ["ed", "ec", "rsa"] {
            t.push_str(&format!("alice@example.org {extra}{}\n", self.public(k)));
        }
        fs::write(&p, t).unwrap();
        p
    }
}

/// A real ssh-agent listening on `sock`, ready when this returns.
fn start_agent(sock: &Path) -> std::process::Child {
    let mut agent = Command::new("ssh-agent")
        .arg("-D")
        .arg("-a")
        .arg(sock)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    // Ready when it accepts a connection: the socket file exists from its
    // bind(2), a moment before its listen(2), and a client in between is
    // refused (seen once in 4 runs of `make check`).
    for _ in 0..500 {
        if std::os::unix::net::UnixStream::connect(sock).is_ok() {
            return agent;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let _ = agent.kill();
    let _ = agent.wait();
    panic!("ssh-agent never listened on {}", sock.display());
}

fn image(dir: &Path) -> PathBuf {
    let src = dir.join("src");
    fs::create_dir_all(&src).unwrap();
    small_tree(&src, 3);
    write(&src.join("data.txt"), &Rng::new(9).text(300_000));
    let img = dir.join("img.sheaf");
    build(&src, &img, &["-c", "none"]).ok();
    img
}

fn root_message(img: &Path) -> Vec<u8> {
    sheaf_in(["root".as_ref(), img.as_os_str()]).ok().stdout
}

/// `sheaf verify IMG --signers ALLOWED EXTRA...` (in-process).
fn verify(img: &Path, allowed: &Path, extra: &[&str]) -> Out {
    let mut a: Vec<&OsStr> = vec![
        "verify".as_ref(),
        img.as_os_str(),
        "--signers".as_ref(),
        allowed.as_os_str(),
    ];
    a.extend(extra.iter().map(OsStr::new));
    sheaf_in(a)
}

#[test]
fn ssh_keygen_and_sheaf_accept_each_others_signatures() {
    let t = tmpdir();
    let keys = Keys::new(t.path());
    let img = image(t.path());
    let allowed = keys.allowed("");
    let msg = t.path().join("msg");
    fs::write(&msg, root_message(&img)).unwrap();
    let sig = PathBuf::from(format!("{}.sig", img.display()));
    for k in ["ed", "ec", "rsa"] {
        // ssh-keygen signs, sheaf verifies (detached IMAGE.sig).
        let _ = fs::remove_file(&sig);
        let _ = fs::remove_file(t.path().join("msg.sig"));
        run_cmd(
            Command::new("ssh-keygen")
                .args(["-Y", "sign", "-n", "sheaf", "-f"])
                .arg(keys.key(k))
                .arg(&msg),
        )
        .ok();
        fs::rename(t.path().join("msg.sig"), &sig).unwrap();
        let o = verify(&img, &allowed, &["--identity", "alice@example.org"]).ok();
        assert!(
            o.text().contains("good, signed by alice@example.org"),
            "{k}: {}",
            o.text()
        );
        // sheaf signs, ssh-keygen verifies.
        sheaf_in([
            "sign".as_ref(),
            img.as_os_str(),
            "-k".as_ref(),
            keys.key(k).as_os_str(),
            "--detached".as_ref(),
            "--force".as_ref(),
        ])
        .ok();
        let v = Command::new("ssh-keygen")
            .args([
                "-Y",
                "verify",
                "-n",
                "sheaf",
                "-I",
                "alice@example.org",
                "-f",
            ])
            .arg(&allowed)
            .arg("-s")
            .arg(&sig)
            .stdin(fs::File::open(&msg).unwrap())
            .output()
            .unwrap();
        assert!(
            v.status.success(),
            "{k}: ssh-keygen -Y verify: {}",
            String::from_utf8_lossy(&v.stderr)
        );
    }
    // Appended signatures: several on one image; root digest unchanged.
    fs::remove_file(&sig).unwrap();
    let before = json(&sheaf_in(["info".as_ref(), img.as_os_str(), "--json".as_ref()]).ok());
    for k in ["ed", "ec", "rsa"] {
        sheaf_in([
            "sign".as_ref(),
            img.as_os_str(),
            "-k".as_ref(),
            keys.key(k).as_os_str(),
        ])
        .ok();
    }
    let after = json(&sheaf_in(["info".as_ref(), img.as_os_str(), "--json".as_ref()]).ok());
    assert_eq!(before["root_digest"], after["root_digest"]);
    assert_eq!(after["signatures"].as_array().unwrap().len(), 3);
    let o = verify(&img, &allowed, &["--full"]).ok();
    assert_eq!(
        o.text().matches("good, signed by").count(),
        3,
        "{}",
        o.text()
    );
    // The image still reads as before.
    sheaf_in(["check".as_ref(), img.as_os_str()]).ok();
}

#[test]
fn a_key_in_ssh_agent_signs_without_leaving_it() {
    let t = tmpdir();
    let keys = Keys::new(t.path());
    let img = image(t.path());
    let sock = t.path().join("agent.sock");
    let mut agent = start_agent(&sock);
    let r = std::panic::catch_unwind(|| {
        run_cmd(
            Command::new("ssh-add")
                .arg(keys.key("ed"))
                .env("SSH_AUTH_SOCK", &sock),
        )
        .ok();
        // Only the public key is given: the agent signs.
        let pubkey = t.path().join("ed.pub");
        run_cmd(
            cmd()
                .arg("sign")
                .arg(&img)
                .arg("-k")
                .arg(&pubkey)
                .env("SSH_AUTH_SOCK", &sock),
        )
        .ok();
        verify(&img, &keys.allowed(""), &[]).ok();
        // A key the agent does not hold: a clear refusal.
        let o = run_cmd(
            cmd()
                .arg("sign")
                .arg(&img)
                .arg("-k")
                .arg(t.path().join("other.pub"))
                .env("SSH_AUTH_SOCK", &sock),
        )
        .fails_with(1);
        assert!(
            o.one_err_line().contains("does not hold the key"),
            "{}",
            o.describe()
        );
    });
    agent.kill().unwrap();
    agent.wait().unwrap();
    if let Err(e) = r {
        std::panic::resume_unwind(e);
    }
}

#[test]
fn rejections_say_exactly_why() {
    let t = tmpdir();
    let keys = Keys::new(t.path());
    let img = image(t.path());
    let allowed = keys.allowed("");
    // No signature.
    let o = verify(&img, &allowed, &[]).fails_with(1);
    assert!(o.text().contains("no signature"), "{}", o.text());
    // Unknown key.
    sheaf_in([
        "sign".as_ref(),
        img.as_os_str(),
        "-k".as_ref(),
        keys.key("other").as_os_str(),
    ])
    .ok();
    let o = verify(&img, &allowed, &[]).fails_with(1);
    assert!(o.text().contains("unknown key"), "{}", o.text());
    // Wrong namespace (signed for git).
    let msg = t.path().join("msg");
    fs::write(&msg, root_message(&img)).unwrap();
    run_cmd(
        Command::new("ssh-keygen")
            .args(["-Y", "sign", "-n", "git", "-f"])
            .arg(keys.key("ed"))
            .arg(&msg),
    )
    .ok();
    fs::rename(t.path().join("msg.sig"), format!("{}.sig", img.display())).unwrap();
    let o = verify(&img, &allowed, &[]).fails_with(1);
    assert!(o.text().contains("wrong namespace 'git'"), "{}", o.text());
    // A signature of another image's root.
    let src2 = t.path().join("src2");
    fs::create_dir(&src2).unwrap();
    write(&src2.join("x"), b"x");
    let other = t.path().join("other.sheaf");
    build(&src2, &other, &[]).ok();
    sheaf_in([
        "sign".as_ref(),
        other.as_os_str(),
        "-k".as_ref(),
        keys.key("ed").as_os_str(),
        "--detached".as_ref(),
    ])
    .ok();
    fs::rename(
        format!("{}.sig", other.display()),
        format!("{}.sig", img.display()),
    )
    .unwrap();
    let o = verify(&img, &allowed, &[]).fails_with(1);
    assert!(o.text().contains("bad signature"), "{}", o.text());
    fs::remove_file(format!("{}.sig", img.display())).unwrap();
    // Expired, not yet valid, namespace not allowed, identity not trusted.
    sheaf_in([
        "sign".as_ref(),
        img.as_os_str(),
        "-k".as_ref(),
        keys.key("ed").as_os_str(),
    ])
    .ok();
    for (opts, want) in [
        ("valid-before=\"20200101\" ", "expired"),
        ("valid-after=\"29990101\" ", "not valid yet"),
        ("namespaces=\"git\" ", "not allowed to sign in namespace"),
    ] {
        let o = verify(&img, &keys.allowed(opts), &[]).fails_with(1);
        assert!(o.text().contains(want), "{opts}: {}", o.text());
    }
    let o = verify(&img, &allowed, &["--identity", "mallory@example.org"]).fails_with(1);
    assert!(
        o.text().contains("not trusted for identity"),
        "{}",
        o.text()
    );
    verify(
        &img,
        &keys.allowed("namespaces=\"sheaf,git\",valid-before=\"29990101Z\" "),
        &[],
    )
    .ok();
    // JSON for scripts.
    let v = json(&verify(&img, &allowed, &["--json"]).ok());
    assert_eq!(v["trusted"], true);
}

#[test]
fn tampering_is_caught_where_it_matters() {
    let t = tmpdir();
    let keys = Keys::new(t.path());
    let img = image(t.path());
    let allowed = keys.allowed("");
    sheaf_in([
        "sign".as_ref(),
        img.as_os_str(),
        "-k".as_ref(),
        keys.key("ed").as_os_str(),
    ])
    .ok();
    // A flipped byte in a data block: the root is intact, --full and check fail.
    let mut b = fs::read(&img).unwrap();
    b[64 + 100] ^= 1;
    let bad = t.path().join("bad.sheaf");
    fs::write(&bad, &b).unwrap();
    verify(&bad, &allowed, &[]).ok();
    let o = verify(&bad, &allowed, &["--full"]).fails_with(1);
    assert!(o.text().contains("damage"), "{}", o.text());
    sheaf_in(["check".as_ref(), bad.as_os_str()]).fails_with(1);
    // Under policy it mounts, and reading the damaged file is EIO with a log line.
    if !mounts_allowed() {
        return;
    }
    let mp = t.path().join("mnt");
    let log = t.path().join("log");
    let guard = mount(
        &[&bad],
        &mp,
        &[
            "--require-signature",
            "--signers",
            allowed.to_str().unwrap(),
            "-o",
            &format!("log={}", log.display()),
        ],
    );
    let mut eio = 0;
    for p in walk(&t.path().join("src")) {
        let f = join(&mp, &p);
        if fs::symlink_metadata(&f).unwrap().is_file() {
            if let Err(e) = fs::read(&f) {
                assert_eq!(e.raw_os_error(), Some(libc::EIO));
                eio += 1;
            }
        }
    }
    guard.umount();
    assert!(eio >= 1, "no file read failed");
    let text = fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("bad.sheaf") && text.contains("data block"),
        "{text}"
    );
    assert!(text.contains("signature trusted"), "{text}");
    // Strip the signature, or flip a byte of the section table: refused
    // before anything is mounted.
    let mut b = fs::read(&img).unwrap();
    let stripped = t.path().join("stripped.sheaf");
    let own = own_len(&img);
    fs::write(&stripped, &b[..own]).unwrap();
    let o = run_cmd(
        cmd()
            .arg("mount")
            .arg("--require-signature")
            .arg("--signers")
            .arg(&allowed)
            .arg(&stripped)
            .arg(&mp),
    )
    .fails_with(1);
    assert!(
        o.one_err_line()
            .contains("refused: no trusted signature (no signature)"),
        "{}",
        o.describe()
    );
    b[own - 64 - 10] ^= 1; // inside the section table
    let flipped = t.path().join("flipped.sheaf");
    fs::write(&flipped, &b).unwrap();
    let o = run_cmd(
        cmd()
            .arg("mount")
            .arg("--require-signature")
            .arg("--signers")
            .arg(&allowed)
            .arg(&flipped)
            .arg(&mp),
    )
    .fails_with(1);
    assert!(
        o.one_err_line().contains("flipped.sheaf"),
        "{}",
        o.describe()
    );
    // A flipped byte in the superblock (the metadata root): refused too.
    let info = json(&sheaf_in(["info".as_ref(), img.as_os_str(), "--json".as_ref()]).ok());
    let sb = info["sections"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["kind"] == 1)
        .unwrap()["offset"]
        .as_u64()
        .unwrap() as usize;
    let mut b2 = fs::read(&img).unwrap();
    b2[sb + 20] ^= 1;
    let rootless = t.path().join("rootless.sheaf");
    fs::write(&rootless, &b2).unwrap();
    let o = run_cmd(
        cmd()
            .arg("mount")
            .arg("--require-signature")
            .arg("--signers")
            .arg(&allowed)
            .arg(&rootless)
            .arg(&mp),
    )
    .fails_with(1);
    assert!(o.one_err_line().contains("superblock"), "{}", o.describe());
    // Replaced signature (an untrusted key's): refused.
    let replaced = t.path().join("replaced.sheaf");
    fs::copy(&stripped, &replaced).unwrap();
    sheaf_in([
        "sign".as_ref(),
        replaced.as_os_str(),
        "-k".as_ref(),
        keys.key("other").as_os_str(),
    ])
    .ok();
    let o = run_cmd(
        cmd()
            .arg("mount")
            .arg("--require-signature")
            .arg("--signers")
            .arg(&allowed)
            .arg(&replaced)
            .arg(&mp),
    )
    .fails_with(1);
    assert!(o.one_err_line().contains("unknown key"), "{}", o.describe());
    assert!(
        fs::read_dir(&mp).unwrap().next().is_none(),
        "something was mounted"
    );
}

/// Length of the image proper (without the appended signature block).
fn own_len(img: &Path) -> usize {
    let b = fs::read(img).unwrap();
    let n = b.len();
    assert_eq!(&b[n - 40..n - 32], b"SHEAFSIG");
    u64::from_le_bytes(b[n - 24..n - 16].try_into().unwrap()) as usize
}

#[test]
fn site_config_requires_signatures_for_everyone() {
    let t = tmpdir();
    let keys = Keys::new(t.path());
    let img = image(t.path());
    let allowed = keys.allowed("");
    let conf = t.path().join("config.toml");
    fs::write(
        &conf,
        format!(
            "[signatures]\nrequire = true\nsigners = \"{}\"\n",
            allowed.display()
        ),
    )
    .unwrap();
    let mp = t.path().join("mnt");
    let mount = |i: &Path| {
        let mut c = mount_cmd(&[i], &mp, &[]);
        c.env("SHEAF_CONFIG", &conf);
        run_cmd(&mut c)
    };
    let o = mount(&img).fails_with(1);
    assert!(
        o.one_err_line().contains("refused: no trusted signature"),
        "{}",
        o.describe()
    );
    sheaf_in([
        "sign".as_ref(),
        img.as_os_str(),
        "-k".as_ref(),
        keys.key("ec").as_os_str(),
    ])
    .ok();
    if mounts_allowed() {
        mount(&img).ok();
        Mounted::adopt(&mp).umount();
    }
    // Expired key under the site policy.
    fs::write(
        &allowed,
        format!(
            "alice@example.org valid-before=\"20200101\" {}\n",
            keys.public("ec")
        ),
    )
    .unwrap();
    let o = mount(&img).fails_with(1);
    assert!(o.one_err_line().contains("expired"), "{}", o.describe());
    // A broken config file is one clear line.
    fs::write(&conf, "[signatures\n").unwrap();
    let o = mount(&img).fails_with(1);
    assert!(o.one_err_line().contains("config.toml"), "{}", o.describe());
}

#[test]
fn keygen_makes_a_key_and_its_allowed_signers_line() {
    let t = tmpdir();
    let img = image(t.path());
    let key = t.path().join("site_key");
    let o = sheaf_in([
        "keygen".as_ref(),
        key.as_os_str(),
        "--identity".as_ref(),
        "ops@site.org".as_ref(),
    ])
    .ok();
    let line = o.text();
    assert!(
        line.starts_with("ops@site.org namespaces=\"sheaf\" ssh-ed25519 "),
        "{line}"
    );
    let allowed = t.path().join("allowed");
    fs::write(&allowed, &line).unwrap();
    sheaf_in([
        "sign".as_ref(),
        img.as_os_str(),
        "-k".as_ref(),
        key.as_os_str(),
    ])
    .ok();
    verify(&img, &allowed, &["--identity", "ops@site.org"]).ok();
    // Refuses to overwrite.
    sheaf_in(["keygen".as_ref(), key.as_os_str()]).fails_with(1);
    // ssh-keygen reads the key it wrote.
    run_cmd(Command::new("ssh-keygen").arg("-y").arg("-f").arg(&key)).ok();
}

/// A passphrase-protected key is used through the agent it was added to.
#[test]
fn a_passphrase_protected_key_signs_through_the_agent() {
    let t = tmpdir();
    let img = image(t.path());
    let key = t.path().join("locked");
    run_cmd(
        Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "correct horse", "-f"])
            .arg(&key),
    )
    .ok();
    // Without an agent: one line saying what to do.
    let o = run_cmd(
        cmd()
            .arg("sign")
            .arg(&img)
            .arg("-k")
            .arg(&key)
            .env_remove("SSH_AUTH_SOCK"),
    )
    .fails_with(1);
    assert!(o.one_err_line().contains("ssh-add"), "{}", o.describe());
    let askpass = t.path().join("askpass");
    fs::write(&askpass, "#!/bin/sh\necho 'correct horse'\n").unwrap();
    chmod(&askpass, 0o755);
    let sock = t.path().join("a.sock");
    let mut agent = start_agent(&sock);
    let r = std::panic::catch_unwind(|| {
        run_cmd(
            Command::new("ssh-add")
                .arg(&key)
                .env("SSH_AUTH_SOCK", &sock)
                .env("SSH_ASKPASS", &askpass)
                .env("SSH_ASKPASS_REQUIRE", "force")
                .env("DISPLAY", ":0")
                .stdin(Stdio::null()),
        )
        .ok();
        run_cmd(
            cmd()
                .arg("sign")
                .arg(&img)
                .arg("-k")
                .arg(&key)
                .env("SSH_AUTH_SOCK", &sock),
        )
        .ok();
        let pubkey = fs::read_to_string(format!("{}.pub", key.display())).unwrap();
        let body: Vec<&str> = pubkey.split_whitespace().take(2).collect();
        let allowed = t.path().join("allowed_locked");
        fs::write(&allowed, format!("ops {}\n", body.join(" "))).unwrap();
        verify(&img, &allowed, &["--identity", "ops"]).ok();
    });
    agent.kill().unwrap();
    agent.wait().unwrap();
    if let Err(e) = r {
        std::panic::resume_unwind(e);
    }
}

/// Damaged signature blocks: refused in one line, never a panic.
#[test]
fn a_damaged_signature_block_is_refused_cleanly() {
    let t = tmpdir();
    let keys = Keys::new(t.path());
    let img = image(t.path());
    sheaf_in([
        "sign".as_ref(),
        img.as_os_str(),
        "-k".as_ref(),
        keys.key("ed").as_os_str(),
    ])
    .ok();
    let good = fs::read(&img).unwrap();
    let n = good.len();
    type Damage = Box<dyn Fn(&mut Vec<u8>)>;
    let cases: Vec<(&str, Damage)> = vec![
        ("count", Box::new(move |b: &mut Vec<u8>| b[n - 32] = 0xff)),
        (
            "image length",
            Box::new(move |b: &mut Vec<u8>| b[n - 17] = 0x7f),
        ),
        (
            "entries offset",
            Box::new(move |b: &mut Vec<u8>| b[n - 9] = 0x7f),
        ),
        (
            "entries length",
            Box::new(move |b: &mut Vec<u8>| b[n - 8] ^= 0x01),
        ),
        (
            "entry length",
            Box::new(move |b: &mut Vec<u8>| {
                let own = u64::from_le_bytes(b[n - 24..n - 16].try_into().unwrap()) as usize;
                b[own + 3] = 0x7f;
            }),
        ),
        (
            "truncated",
            Box::new(move |b: &mut Vec<u8>| b.truncate(n - 5)),
        ),
    ];
    for (what, f) in cases {
        let mut b = good.clone();
        f(&mut b);
        let bad = t.path().join("bad.sheaf");
        fs::write(&bad, &b).unwrap();
        for sub in ["info", "check"] {
            let o = sheaf_in([sub.as_ref(), bad.as_os_str()]);
            o.no_panic();
            assert_eq!(o.code, 1, "{what} ({sub}): {}", o.describe());
            assert!(
                o.one_err_line().contains("bad.sheaf"),
                "{what}: {}",
                o.describe()
            );
        }
    }
}

/// A damaged metadata page other than the root: only the lookups that need
/// it fail (EIO); the rest of the tree stays usable.
#[test]
fn a_damaged_inner_metadata_page_fails_only_what_needs_it() {
    let marker: i64 = 1_234_567_891;
    let sc = Scenario::new(|src| {
        // 3000 files: their inode records span three 64 KiB pages.
        for i in 0..3000 {
            write(&src.join(format!("f{i:04}")), format!("{i}\n").as_bytes());
        }
        set_all_mtimes(src, |_, p| {
            if p == b"f2999" {
                (marker, 0)
            } else {
                (1_600_000_000, 0)
            }
        });
    })
    .image_name("m.sheaf")
    .build(&["-c", "none"]);
    let img = &sc.img;
    let mut b = fs::read(img).unwrap();
    let needle = marker.to_le_bytes();
    let at = b
        .windows(8)
        .position(|w| w == needle)
        .expect("inode record of f2999 in a raw page");
    b[at] ^= 0x01;
    fs::write(img, &b).unwrap();
    // Read through the library (in-process): a lookup that needs the
    // damaged page fails, one that does not still reads its file.
    let o = sheaf_in(["cat".as_ref(), img.as_os_str(), "f2999".as_ref()]).fails_with(1);
    assert!(
        o.one_err_line().starts_with("sheaf: error: "),
        "{}",
        o.describe()
    );
    assert!(o.stdout.is_empty(), "{}", o.describe());
    let o = sheaf_in(["cat".as_ref(), img.as_os_str(), "f0001".as_ref()]).ok();
    assert_eq!(o.stdout, b"1\n");
    if !mounts_allowed() {
        return;
    }
    let (mp, guard) = (&sc.mp, sc.mount(&[]));
    let e = fs::metadata(mp.join("f2999")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    assert_eq!(fs::read(mp.join("f0001")).unwrap(), b"1\n");
    assert_eq!(fs::read(mp.join("f0500")).unwrap(), b"500\n");
    guard.umount();
}

/// About one ECDSA key in 300 that ssh-keygen makes has a private scalar
/// with a leading zero byte, which the ssh-key crate refuses; such a key
/// (kept in tests/support, made by ssh-keygen) still signs, through
/// ssh-keygen, and ssh-keygen verifies the signature.
#[test]
fn an_ecdsa_key_the_crate_cannot_read_still_signs() {
    use std::os::unix::fs::PermissionsExt;
    let t = tmpdir();
    let img = image(t.path());
    let key = t.path().join("ec");
    fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/ecdsa-scalar-leading-zero.key"),
        &key,
    )
    .unwrap();
    // ssh-keygen refuses private keys others can read.
    fs::set_permissions(&key, fs::Permissions::from_mode(0o600)).unwrap();
    let public = run_cmd(Command::new("ssh-keygen").arg("-y").arg("-f").arg(&key))
        .ok()
        .text();
    let signers = t.path().join("signers");
    fs::write(&signers, format!("bob@example.org {public}")).unwrap();
    sheaf_in([
        "sign".as_ref(),
        img.as_os_str(),
        "-k".as_ref(),
        key.as_os_str(),
        "--detached".as_ref(),
    ])
    .ok();
    let sig = t.path().join("img.sheaf.sig");
    let o = run_with_stdin(
        Command::new("ssh-keygen")
            .args(["-Y", "verify", "-n", "sheaf", "-I", "bob@example.org", "-f"])
            .arg(&signers)
            .arg("-s")
            .arg(&sig),
        root_message(&img),
    )
    .ok();
    assert!(
        o.text().contains("Good \"sheaf\" signature"),
        "{}",
        o.text()
    );
    sheaf_in([
        "verify".as_ref(),
        img.as_os_str(),
        "--signers".as_ref(),
        signers.as_os_str(),
    ])
    .ok();
}
