//! Trust across paths: a hostile server, a mistyped site config, secrets in
//! URLs. Each case ends in one line and a non-zero exit, or in nothing
//! unsigned, foreign or secret being used or shown.

mod common;

use common::hostile::{Hostile, Reply};
use common::*;
use std::fs;
use std::path::Path;
use std::sync::Arc;

/// Commands that open a URL without mounting it.
fn open_commands(url: &str) -> Vec<Vec<String>> {
    let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    vec![
        v(&["--timeout", "2", "info", url]),
        v(&["--timeout", "2", "cat", url, "/f"]),
        v(&["--timeout", "2", "ls", url]),
        v(&["--timeout", "2", "check", url]),
    ]
}

fn small_image(dir: &Path, name: &str, content: &str) -> std::path::PathBuf {
    let src = dir.join(format!("{name}-src"));
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("f"), content).unwrap();
    let img = dir.join(format!("{name}.sheaf"));
    build(&src, &img, &[]);
    img
}

/// `sheaf ARGS` with its data segment limited to 192 MiB (RLIMIT_DATA:
/// heap and private mappings), under which an honest image reads as usual:
/// memory stays bounded whatever a server claims or sends.
fn limited(dir: &Path, args: &[String]) -> Out {
    let mut c = std::process::Command::new("prlimit");
    c.arg("--data=201326592")
        .arg("--")
        .arg(bin())
        .args(args)
        .stdin(std::process::Stdio::null())
        .env("SHEAF_CACHE_DIR", dir.join("cache"));
    run_cmd(&mut c)
}

/// A repository server that answers an object request with 300 MiB: the
/// reply is read up to the object's stored length, then refused (it was
/// buffered up to 256 MiB each).
#[test]
fn a_repository_object_longer_than_its_ref_is_refused_unbuffered() {
    let t = tmpdir();
    let img = small_image(t.path(), "img", "published\n");
    let www = t.path().join("www");
    sheaf([
        "publish".as_ref(),
        img.as_os_str(),
        www.join("repo").as_os_str(),
        "--name".as_ref(),
        "img".as_ref(),
    ])
    .ok();
    let root = www.clone();
    let srv = Hostile::start(move |_, r| {
        let path = r.path.trim_start_matches('/');
        if path.contains("/objects/") {
            return Reply::Flood { len: 300 << 20 };
        }
        match fs::read(root.join(path)) {
            Ok(b) => Reply::File(Arc::new(b)),
            Err(_) => Reply::Missing,
        }
    });
    let url = srv.url("/repo/img");
    let o = limited(
        t.path(),
        &[
            "--timeout".into(),
            "2".into(),
            "cat".into(),
            url,
            "/f".into(),
        ],
    );
    o.no_panic();
    assert!(o.code > 0, "{}", o.describe());
    assert!(o.one_err_line().contains("larger than"), "{}", o.describe());
}

#[test]
fn a_length_the_server_claims_is_refused_in_one_line() {
    let t = tmpdir();
    let img = small_image(t.path(), "real", "hello\n");
    let real = fs::read(&img).unwrap();
    // An index probe answer claiming 1 TiB (the client allocated it and
    // aborted), and an image header claiming a 1 TiB file.
    let limited = |args: &[String]| limited(t.path(), args);
    let honest = Arc::new(real.clone());
    let srv = Hostile::start(move |_, _| Reply::File(honest.clone()));
    let o = limited(&["cat".into(), srv.url("/x.sheaf"), "/f".into()]).ok();
    assert_eq!(o.stdout, b"hello\n");
    let mut index_head = sheaf_format::remote::INDEX_MAGIC.to_vec();
    index_head.resize(64, 0);
    // 1 TiB, and just under the 64 MiB an index may have.
    for (head, total) in [
        (index_head.clone(), 1u64 << 40),
        (index_head, (64 << 20) - 1),
        (real[..4096.min(real.len())].to_vec(), 1 << 40),
    ] {
        let srv = Hostile::start(move |_, _| Reply::Claim {
            head: head.clone(),
            total,
        });
        for args in open_commands(&srv.url("/x.sheaf")) {
            let o = limited(&args);
            o.no_panic();
            assert!(o.code > 0, "{}", o.describe());
            let line = o.one_err_line();
            assert!(!line.contains("memory allocation"), "{line}");
        }
    }
}

#[test]
fn a_mistyped_sheaf_config_is_an_error_not_an_empty_policy() {
    let t = tmpdir();
    let img = small_image(t.path(), "img", "x");
    let mp = t.path().join("mp");
    fs::create_dir(&mp).unwrap();
    let missing = t.path().join("confg.toml");
    let o = run_cmd(
        cmd()
            .env("SHEAF_CONFIG", &missing)
            .arg("mount")
            .arg(&img)
            .arg(&mp),
    );
    o.no_panic();
    assert_ne!(o.code, 0, "{}", o.describe());
    let line = o.one_err_line();
    assert!(
        line.contains("SHEAF_CONFIG") && line.contains(&*missing.to_string_lossy()),
        "{line}"
    );
    assert!(!is_mounted(&mp));
    // The same for run and for pools, which read the same file.
    let o = run_cmd(
        cmd()
            .env("SHEAF_CONFIG", &missing)
            .args(["run", "--image"])
            .arg(&img)
            .args(["--", "true"]),
    );
    o.no_panic();
    assert_eq!(o.code, 125, "{}", o.describe());
    assert!(
        o.one_err_line().contains("SHEAF_CONFIG"),
        "{}",
        o.describe()
    );
    let o = run_cmd(cmd().env("SHEAF_CONFIG", &missing).args(["pool", "list"]));
    o.no_panic();
    assert_ne!(o.code, 0, "{}", o.describe());
    assert!(
        o.one_err_line().contains("SHEAF_CONFIG"),
        "{}",
        o.describe()
    );
    // The default path may be absent; an existing named file is read.
    let present = t.path().join("config.toml");
    fs::write(&present, "").unwrap();
    run_cmd(cmd().env("SHEAF_CONFIG", &present).arg("info").arg(&img)).ok();
}

/// A flattened container image whose config runs `echo WHO`.
fn container_image(dir: &Path, who: &str) -> std::path::PathBuf {
    let root = dir.join(format!("{who}-root"));
    oci::base_rootfs(&root);
    let d = root.join(".sheaf.d");
    fs::create_dir_all(&d).unwrap();
    let cfg = serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Cmd": ["/bin/sh", "-c", format!("echo ran-{who} $WHO")], "Env": [format!("WHO={who}")]},
        "rootfs": {"type": "layers", "diff_ids": []}
    });
    fs::write(d.join("config.json"), cfg.to_string()).unwrap();
    let img = dir.join(format!("{who}.sheaf"));
    build(&root, &img, &[]);
    img
}

#[test]
fn run_image_opens_the_image_once_and_mounts_only_that_root() {
    if !mounts_allowed() {
        return;
    }
    let t = tmpdir();
    let (key, signers) = ssh_signer(t.path());
    let unsigned = container_image(t.path(), "unsigned");
    let signed_a = container_image(t.path(), "signed-a");
    let signed_b = container_image(t.path(), "signed-b");
    for img in [&signed_a, &signed_b] {
        sheaf([
            "sign".as_ref(),
            img.as_os_str(),
            "-k".as_ref(),
            key.as_os_str(),
        ])
        .ok();
    }
    let strict = t.path().join("strict.toml");
    fs::write(
        &strict,
        format!(
            "[signatures]\nrequire = true\nsigners = \"{}\"\n",
            signers.display()
        ),
    )
    .unwrap();
    let open = t.path().join("open.toml");
    fs::write(&open, "").unwrap();
    let bytes = |p: &Path| Arc::new(fs::read(p).unwrap());
    // (first open, later opens, policy, what must be refused)
    let cases = [
        (&unsigned, &signed_a, &strict, "no trusted signature"),
        (&signed_a, &signed_b, &strict, "root digest"),
        (&signed_a, &unsigned, &strict, "refused"),
        (&unsigned, &signed_b, &open, "root digest"),
    ];
    for (first, later, policy, why) in cases {
        let (first_b, later_b) = (bytes(first), bytes(later));
        // Every open begins with a probe of the first bytes: the first
        // open gets `first`, every later one `later`.
        let probes = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let p = probes.clone();
        let srv = Hostile::start(move |_, r| {
            let n = if r.probe {
                p.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1
            } else {
                p.load(std::sync::atomic::Ordering::SeqCst)
            };
            Reply::File(if n <= 1 {
                first_b.clone()
            } else {
                later_b.clone()
            })
        });
        let o = run_cmd(
            cmd()
                .env("SHEAF_CONFIG", policy)
                .args(["--timeout", "10", "run", "--image"])
                .arg(srv.url("/app.sheaf")),
        );
        o.no_panic();
        assert_eq!(o.code, 125, "{first:?} then {later:?}: {}", o.describe());
        assert!(
            !o.text().contains("ran-"),
            "a command ran: {}",
            o.describe()
        );
        let line = o.one_err_line();
        assert!(line.contains(why), "{first:?} then {later:?}: {line}");
    }
    // A registry reference under the strict policy: refused before anything
    // is fetched, saying how to get a signed image.
    let reg = Hostile::start(|_, _| Reply::Missing);
    let host = format!("127.0.0.1:{}", reg.port);
    let o = run_cmd(
        cmd()
            .env("SHEAF_CONFIG", &strict)
            .args(["run", "--insecure-registry", &host, "--image"])
            .arg(format!("docker://{host}/app:1")),
    );
    assert_eq!(o.code, 125, "{}", o.describe());
    assert!(o.one_err_line().contains("sheaf sign"), "{}", o.describe());
    assert!(
        reg.seen.lock().unwrap().is_empty(),
        "the registry was asked"
    );
    // Served honestly, the signed image runs under the strict policy.
    let a = bytes(&signed_a);
    let srv = Hostile::start(move |_, _| Reply::File(a.clone()));
    let o = run_cmd(
        cmd()
            .env("SHEAF_CONFIG", &strict)
            .args(["run", "--image"])
            .arg(srv.url("/app.sheaf")),
    )
    .ok();
    assert_eq!(o.text(), "ran-signed-a signed-a\n");
}

#[test]
fn credentials_in_urls_stay_out_of_mounts_errors_and_stats() {
    if !mounts_allowed() {
        return;
    }
    let t = tmpdir();
    let img = small_image(t.path(), "img", "secret-free\n");
    let data = Arc::new(fs::read(&img).unwrap());
    let srv = Hostile::start(move |_, _| Reply::File(data.clone()));
    let secrets = ["s3cr3tpw", "t0ps1gnature", "pr0xypw"];
    let url = format!(
        "http://ann:s3cr3tpw@127.0.0.1:{}/img.sheaf?X-Amz-Signature=t0ps1gnature",
        srv.port
    );
    let clean = |what: &str, text: &str| {
        for s in secrets {
            assert!(!text.contains(s), "{what} shows {s}: {text}");
        }
    };
    let mp = t.path().join("mp");
    let m = mount(&[&url], &mp, &[]);
    assert_eq!(fs::read(mp.join("f")).unwrap(), b"secret-free\n");
    clean("/proc/mounts", &fs::read_to_string("/proc/mounts").unwrap());
    clean(
        "/proc/self/mountinfo",
        &fs::read_to_string("/proc/self/mountinfo").unwrap(),
    );
    clean("sheaf stats --json", &m.stats().to_string());
    let o = sheaf(["stats".as_ref(), m.mp.as_os_str()]).ok();
    clean("sheaf stats", &o.text());
    m.umount();
    // Errors: nothing listening, and a proxy with credentials.
    let dead = free_port_now();
    let bad = format!("http://ann:s3cr3tpw@127.0.0.1:{dead}/img.sheaf?sig=t0ps1gnature");
    let o = sheaf(["--timeout", "2", "info", &bad]);
    o.no_panic();
    assert_ne!(o.code, 0);
    clean("an error line", &o.stderr);
    let proxy = format!("http://pu:pr0xypw@127.0.0.1:{dead}");
    let o = sheaf(["--timeout", "2", "--proxy", &proxy, "info", &url]);
    o.no_panic();
    assert_ne!(o.code, 0);
    clean("a proxy error line", &o.stderr);
}

fn free_port_now() -> u16 {
    common::servers::free_port()
}

/// The child mounts of the snapshotter and of `pool load` are pinned to
/// the root their parent checked (`sheaf mount --pin`): a server that now
/// serves another image gets a refusal, and nothing is mounted.
#[test]
fn a_pinned_mount_refuses_any_other_root() {
    if !mounts_allowed() {
        return;
    }
    let t = tmpdir();
    let a = small_image(t.path(), "a", "checked\n");
    let b = small_image(t.path(), "b", "swapped\n");
    let root_a = sheaf(["root".as_ref(), a.as_os_str()])
        .ok()
        .text()
        .trim()
        .to_string();
    let served = Arc::new(fs::read(&b).unwrap());
    let srv = Hostile::start(move |_, _| Reply::File(served.clone()));
    let mp = t.path().join("mp");
    fs::create_dir(&mp).unwrap();
    let o = sheaf([
        "mount",
        "--pin",
        &root_a,
        &srv.url("/a.sheaf"),
        mp.to_str().unwrap(),
    ]);
    o.no_panic();
    assert_ne!(o.code, 0, "{}", o.describe());
    assert!(o.one_err_line().contains("root digest"), "{}", o.describe());
    assert!(!is_mounted(&mp));
    // The same through the typed request a parent hands its child on
    // standard input (built here by hand, as a second writer would).
    let hex = root_a.rsplit(':').next().unwrap();
    let request = |source: &str| {
        serde_json::json!({
            "version": 1,
            "images": [{"source": source, "root": hex}],
            "mountpoint": mp,
        })
        .to_string()
        .into_bytes()
    };
    let o = run_with_stdin(
        cmd().args(["mount", "--request", "-"]),
        request(&srv.url("/a.sheaf")),
    );
    o.no_panic();
    assert_ne!(o.code, 0, "{}", o.describe());
    assert!(o.one_err_line().contains("root digest"), "{}", o.describe());
    assert!(!is_mounted(&mp));
    let o = run_with_stdin(
        cmd().args(["mount", "--request", "-"]),
        b"{\"version\":1,\"images\":[],\"mountpoint\":\"/x\"}".to_vec(),
    );
    assert_ne!(o.code, 0);
    assert!(
        o.one_err_line().contains("mount request"),
        "{}",
        o.describe()
    );
    let good = run_with_stdin(
        cmd().args(["mount", "--request", "-"]),
        request(a.to_str().unwrap()),
    )
    .ok();
    drop(good);
    let m = Mounted::adopt(&mp);
    assert_eq!(fs::read(mp.join("f")).unwrap(), b"checked\n");
    m.umount();
    // Pinned to what it serves, or not pinned ('-'): mounted.
    for pin in [root_a.as_str(), "-"] {
        let file = if pin == "-" { &b } else { &a };
        let m = mount(&[file], &mp, &["--pin", pin]);
        assert!(fs::read(mp.join("f")).is_ok());
        m.umount();
    }
    let o = sheaf([
        "mount",
        "--pin",
        "beef",
        a.to_str().unwrap(),
        mp.to_str().unwrap(),
    ]);
    assert_ne!(o.code, 0);
    assert!(
        o.one_err_line().contains("not a root digest"),
        "{}",
        o.describe()
    );
}

/// Names with control bytes reach a terminal quoted, as GNU ls quotes them
/// (`script` gives the commands a pseudo-terminal); to a pipe, raw.
#[test]
fn names_with_control_bytes_are_quoted_on_a_terminal() {
    let t = tmpdir();
    let src = t.path().join("src");
    fs::create_dir(&src).unwrap();
    let evil = "a\x1b]0;pwned\x07\x1b[31mred";
    fs::write(src.join(evil), "x").unwrap();
    std::os::unix::fs::symlink(evil, src.join("link")).unwrap();
    let img = t.path().join("img.sheaf");
    build(&src, &img, &[]);
    // Expected quoting from GNU ls itself, on the same names.
    let gnu = run_cmd(
        std::process::Command::new("ls")
            .args(["--quoting-style=shell-escape", "-1"])
            .arg(&src)
            .env("LC_ALL", "C.UTF-8"),
    )
    .ok()
    .text();
    let quoted = gnu.lines().find(|l| l.contains("red")).unwrap().to_string();
    assert!(!quoted.contains('\x1b'), "{quoted}");
    for (cmdline, want_link) in [
        (format!("{} ls {}", bin(), img.display()), false),
        (format!("{} ls -l {}", bin(), img.display()), true),
        (format!("{} find {}", bin(), img.display()), false),
        (format!("{} find {} -ls", bin(), img.display()), true),
    ] {
        let o = run_cmd(
            std::process::Command::new("script")
                .args(["-qec", &cmdline, "/dev/null"])
                .env("LC_ALL", "C.UTF-8")
                .stdin(std::process::Stdio::null()),
        );
        let out = o.text();
        assert_eq!(o.code, 0, "{cmdline}: {}", o.describe());
        assert!(
            !out.contains('\x1b') && !out.contains('\x07'),
            "{cmdline}: raw control bytes reached the terminal: {out:?}"
        );
        // find prints the path from the image's root, quoted whole.
        let name = if cmdline.contains(" find ") {
            format!("'/{}", &quoted[1..])
        } else {
            quoted.clone()
        };
        assert!(out.contains(&name), "{cmdline}: {out:?} lacks {name}");
        if want_link {
            assert!(
                out.contains(&format!("link -> {quoted}")),
                "{cmdline}: {out:?}"
            );
        }
    }
    // To a pipe, the bytes as they are.
    let o = sheaf(["ls".as_ref(), img.as_os_str()]).ok();
    assert!(o.text().contains(evil));
}

/// A registry that names a token realm on another server (or on plain
/// http) does not get the user's password sent there; a realm at the
/// registry itself does get it (so the test can tell).
#[test]
fn a_token_realm_elsewhere_never_receives_the_users_password() {
    let t = tmpdir();
    // The credentials as a Docker auth file holds them (coreutils' base64).
    let cred = run_with_stdin(
        std::process::Command::new("base64").arg("-w0"),
        b"ann:hunter2pw".to_vec(),
    )
    .ok()
    .text();
    let tokens = Hostile::start(|_, _| Reply::Missing);
    let elsewhere = tokens.url("/token");
    for at_registry in [false, true] {
        let realm = Arc::new(std::sync::Mutex::new(String::new()));
        let r = realm.clone();
        let reg = Hostile::start(move |_, req| {
            if req.path.starts_with("/token") {
                return Reply::Missing;
            }
            Reply::Raw {
                status: "401 Unauthorized".into(),
                headers: format!(
                    "WWW-Authenticate: Bearer realm=\"{}\",service=\"reg\"\r\n",
                    r.lock().unwrap()
                ),
                body: Vec::new(),
            }
        });
        *realm.lock().unwrap() = if at_registry {
            reg.url("/token")
        } else {
            elsewhere.clone()
        };
        let host = format!("127.0.0.1:{}", reg.port);
        let auth = t.path().join(format!("auth-{at_registry}.json"));
        fs::write(
            &auth,
            serde_json::json!({"auths": {host.clone(): {"auth": cred}}}).to_string(),
        )
        .unwrap();
        let out = t.path().join(format!("x-{at_registry}.sheaf"));
        let o = sheaf([
            "import",
            &format!("docker://{host}/app:1"),
            "--insecure-registry",
            &host,
            "--authfile",
            auth.to_str().unwrap(),
            "--flatten",
            "-o",
            out.to_str().unwrap(),
        ]);
        o.no_panic();
        assert_ne!(o.code, 0, "{}", o.describe());
        assert!(!o.stderr.contains("hunter2pw") && !o.stderr.contains(&cred));
        let server = if at_registry { &reg } else { &tokens };
        let asked: Vec<_> = server
            .seen
            .lock()
            .unwrap()
            .iter()
            .filter(|q| q.path.starts_with("/token"))
            .cloned()
            .collect();
        assert!(!asked.is_empty(), "the token realm was never asked");
        let sent = asked.iter().any(|q| {
            q.headers
                .iter()
                .any(|(k, v)| k == "authorization" && v.contains(&cred))
        });
        assert_eq!(
            sent,
            at_registry,
            "credentials sent to {}: {asked:?}",
            realm.lock().unwrap()
        );
    }
}

/// `bcast` from a server that claims lengths or swaps images between
/// requests, and `import` from a registry that claims a 1 TiB layer and
/// then drops the connection: one line, a non-zero exit, nothing left
/// behind, or (for the swap) exactly the first image.
#[test]
fn bcast_and_import_from_a_hostile_server_end_in_one_line() {
    let t = tmpdir();
    let a = small_image(t.path(), "a", "first\n");
    let b = small_image(t.path(), "b", "second, longer than the first\n");
    // A claimed 1 TiB index.
    let mut index_head = sheaf_format::remote::INDEX_MAGIC.to_vec();
    index_head.resize(64, 0);
    let srv = Hostile::start(move |_, _| Reply::Claim {
        head: index_head.clone(),
        total: 1 << 40,
    });
    let dest = t.path().join("node/a.sheaf");
    fs::create_dir_all(dest.parent().unwrap()).unwrap();
    let o = sheaf([
        "--timeout",
        "5",
        "bcast",
        "--mpi",
        "never",
        &srv.url("/a.sheaf"),
        dest.to_str().unwrap(),
    ]);
    o.no_panic();
    assert!(o.code > 0, "{}", o.describe());
    o.one_err_line();
    assert!(!dest.exists());
    assert_eq!(temp_leftovers(dest.parent().unwrap()), Vec::<String>::new());
    // Another image after the first open.
    let (ab, bb) = (
        Arc::new(fs::read(&a).unwrap()),
        Arc::new(fs::read(&b).unwrap()),
    );
    let probes = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let p = probes.clone();
    let srv = Hostile::start(move |_, r| {
        let n = if r.probe {
            p.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1
        } else {
            p.load(std::sync::atomic::Ordering::SeqCst)
        };
        Reply::File(if n <= 1 { ab.clone() } else { bb.clone() })
    });
    let o = sheaf([
        "--timeout",
        "5",
        "bcast",
        "--mpi",
        "never",
        &srv.url("/a.sheaf"),
        dest.to_str().unwrap(),
    ]);
    o.no_panic();
    assert!(o.code > 0, "{}", o.describe());
    assert!(
        o.one_err_line().contains("changed between two opens"),
        "{}",
        o.describe()
    );
    assert!(!dest.exists());
    // A registry whose manifest names a 1 TiB layer, then drops the blob.
    let layer = format!("sha256:{}", "ab".repeat(32));
    let config = serde_json::json!({
        "architecture": "amd64", "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{}", "cd".repeat(32))]}
    })
    .to_string()
    .into_bytes();
    let config_digest =
        run_with_stdin(&mut std::process::Command::new("sha256sum"), config.clone())
            .ok()
            .text()
            .split_whitespace()
            .next()
            .unwrap()
            .to_string();
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": format!("sha256:{config_digest}"), "size": config.len()},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": layer, "size": 1u64 << 40}]
    })
    .to_string()
    .into_bytes();
    let reg = Hostile::start(move |_, r| {
        if r.path.contains("/manifests/") {
            Reply::Raw {
                status: "200 OK".into(),
                headers: "Content-Type: application/vnd.oci.image.manifest.v1+json\r\n".into(),
                body: manifest.clone(),
            }
        } else if r.path.contains(&config_digest) {
            Reply::Raw {
                status: "200 OK".into(),
                headers: String::new(),
                body: config.clone(),
            }
        } else {
            Reply::Claim {
                head: vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3],
                total: 1 << 40,
            }
        }
    });
    let host = format!("127.0.0.1:{}", reg.port);
    let repo = t.path().join("repo");
    let o = sheaf([
        "import",
        &format!("docker://{host}/app:1"),
        "--insecure-registry",
        &host,
        "--publish",
        repo.to_str().unwrap(),
    ]);
    o.no_panic();
    assert!(o.code > 0, "{}", o.describe());
    o.one_err_line();
    let left: Vec<_> = fs::read_dir(&repo)
        .map(|d| d.map(|e| e.unwrap().file_name()).collect())
        .unwrap_or_default();
    assert!(
        left.iter()
            .all(|n| !n.to_string_lossy().starts_with("image-")),
        "an image record was written: {left:?}"
    );
}
