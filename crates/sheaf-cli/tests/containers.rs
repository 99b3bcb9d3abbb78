//! Container images through `sheaf import` and `sheaf run --image`, with
//! images made by tests/support/mkoci.py (its own tars and hashlib
//! digests), unpacked independently by umoci, copied by skopeo and served
//! by a real registry on loopback.

mod common;
#[path = "containers/host.rs"]
mod host;
use common::oci::*;
use common::servers::Registry;
use common::*;
use std::fs;
use std::path::Path;
use std::process::Command;

fn json_of(o: &Out) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", o.describe()))
}

fn sha256_hex(b: &[u8]) -> String {
    let o = Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(b)?;
            c.wait_with_output()
        })
        .unwrap();
    String::from_utf8_lossy(&o.stdout)[..64].to_string()
}

#[test]
fn import_matches_umoci_and_one_layer_in_two_encodings_is_stored_once() {
    if !have("umoci") || !have("skopeo") {
        return;
    }
    let t = tmpdir();
    let lay = layout(t.path());
    let repo = t.path().join("repo");
    let flat = t.path().join("gz.sheaf");
    let o = sheaf([
        "import",
        &lay.oci("gz"),
        "--publish",
        repo.to_str().unwrap(),
        "--flatten",
        "-o",
        flat.to_str().unwrap(),
        "--json",
    ])
    .ok();
    let rep = json_of(&o);
    let diffs = lay.strs("diff_ids");
    assert_eq!(rep["manifest"], lay.manifest("gz"));
    let got: Vec<&str> = rep["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["diff_id"].as_str().unwrap())
        .collect();
    assert_eq!(got, diffs);
    for d in &diffs {
        assert!(
            repo.join(format!("layer-sha256-{}", &d[7..])).is_file(),
            "layer {d}"
        );
    }
    for b in lay.strs("gz_blobs") {
        assert!(
            repo.join(format!("blob-sha256-{}.json", &b[7..])).is_file(),
            "blob link {b}"
        );
    }
    let rec: serde_json::Value = serde_json::from_slice(
        &fs::read(repo.join(format!("image-sha256-{}.json", &lay.manifest("gz")[7..]))).unwrap(),
    )
    .unwrap();
    assert_eq!(rec["layers"].as_array().unwrap().len(), 3);

    // The flattened image equals umoci's unpacking of the same image.
    let x = t.path().join("x");
    extract_preserving(&flat, &x).ok();
    let config = fs::read(x.join(".sheaf.d/config.json")).unwrap();
    let manifest: serde_json::Value =
        serde_json::from_slice(&fs::read(lay.blob_path(&lay.manifest("gz"))).unwrap()).unwrap();
    assert_eq!(
        format!("sha256:{}", sha256_hex(&config)),
        manifest["config"]["digest"].as_str().unwrap(),
        "the config is kept byte for byte"
    );
    fs::remove_dir_all(x.join(".sheaf.d")).unwrap();
    let um = t.path().join("um");
    let o = Command::new("umoci")
        .args(["unpack", "--image"])
        .arg(format!("{}:gz", lay.dir.display()))
        .arg(&um)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "umoci: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let diffs_found = compare_trees(
        &um.join("rootfs"),
        &x,
        Cmp {
            root: false,
            // Known gap (docs/containers.md): a directory a layer creates
            // only implicitly (as the parent of an entry) takes that layer's
            // default attributes in the merge instead of keeping the lower
            // layer's; umoci keeps the lower ones.
            dir_mtime: false,
            ..Cmp::all()
        },
    );
    assert!(diffs_found.is_empty(), "{diffs_found:#?}");
    // Spot checks against what mkoci.py wrote, not only against umoci.
    assert_eq!(fs::read(x.join("dup")).unwrap(), b"second version wins\n");
    assert!(!x.join("etc/remove-me").exists());
    assert_eq!(walk(&x.join("opq")), vec![Vec::new(), b"new".to_vec()]);
    assert!(fs::symlink_metadata(x.join("swap")).unwrap().is_file());
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        fs::metadata(x.join("data/a")).unwrap().ino(),
        fs::metadata(x.join("data/b")).unwrap().ino()
    );
    let caps = xattrs(&x.join("usr/bin/capped"));
    let want = lay.summary["cap_hex"].as_str().unwrap();
    let got = caps
        .get(b"security.capability".as_slice())
        .map(|v| v.iter().map(|b| format!("{b:02x}")).collect::<String>());
    assert_eq!(got.as_deref(), Some(want));

    // The zstd encoding of the same layers: nothing new is fetched or written.
    let o = sheaf([
        "import",
        &lay.oci("zst"),
        "--publish",
        repo.to_str().unwrap(),
        "--json",
    ])
    .ok();
    let rep = json_of(&o);
    assert_eq!(rep["fetched_bytes"], 0);
    assert!(rep["layers"]
        .as_array()
        .unwrap()
        .iter()
        .all(|l| l["reused"] == true));
    for b in lay.strs("zst_blobs") {
        let link: serde_json::Value = serde_json::from_slice(
            &fs::read(repo.join(format!("blob-sha256-{}.json", &b[7..]))).unwrap(),
        )
        .unwrap();
        assert!(diffs.contains(&link["diff_id"].as_str().unwrap().to_string()));
    }
    // A docker save archive of it (skopeo's): the same layers.
    let archive = t.path().join("saved.tar");
    let o = Command::new("skopeo")
        .args(["copy", "-q", &lay.oci("gz")])
        .arg(format!("docker-archive:{}:app:1", archive.display()))
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "skopeo: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = sheaf([
        "import",
        &format!("docker-archive:{}", archive.display()),
        "--publish",
        repo.to_str().unwrap(),
        "--json",
    ])
    .ok();
    let rep = json_of(&o);
    assert!(rep["layers"]
        .as_array()
        .unwrap()
        .iter()
        .all(|l| l["reused"] == true));
    // And a fresh flatten from the archive gives the same tree.
    let flat2 = t.path().join("archive.sheaf");
    sheaf([
        "import",
        &format!("docker-archive:{}", archive.display()),
        "--flatten",
        "-o",
        flat2.to_str().unwrap(),
        "-q",
    ])
    .ok();
    let x2 = t.path().join("x2");
    extract_preserving(&flat2, &x2).ok();
    fs::remove_dir_all(x2.join(".sheaf.d")).unwrap();
    // (The roots differ: removing .sheaf.d touched them.)
    let d = compare_trees(
        &x,
        &x2,
        Cmp {
            root: false,
            ..Cmp::all()
        },
    );
    assert!(d.is_empty(), "{d:#?}");
}

#[test]
fn a_multi_platform_index_gives_the_host_or_the_named_platform() {
    let t = tmpdir();
    let lay = layout(t.path());
    let host = t.path().join("host.sheaf");
    sheaf([
        "import",
        &lay.oci("multi"),
        "--flatten",
        "-o",
        host.to_str().unwrap(),
        "-q",
    ])
    .ok();
    let arm = t.path().join("arm.sheaf");
    sheaf([
        "import",
        &lay.oci("multi"),
        "--platform",
        "linux/arm64",
        "--flatten",
        "-o",
        arm.to_str().unwrap(),
        "-q",
    ])
    .ok();
    assert_eq!(
        sheaf(["cat", arm.to_str().unwrap(), "/arch"]).ok().stdout,
        b"arm64\n"
    );
    if std::env::consts::ARCH == "x86_64" {
        sheaf(["cat", host.to_str().unwrap(), "/arch"]).fails_with(1);
    }
    let o = sheaf([
        "import",
        &lay.oci("multi"),
        "--platform",
        "linux/s390x",
        "--flatten",
        "-o",
        t.path().join("none.sheaf").to_str().unwrap(),
    ])
    .fails_with(1);
    let line = o.one_err_line();
    assert!(line.contains("no image for platform linux/s390x"), "{line}");
    assert!(line.contains("linux/arm64"), "{line}");
    assert!(!t.path().join("none.sheaf").exists());
}

fn nothing_left(repo: &Path) -> Vec<String> {
    let mut left = Vec::new();
    if let Ok(rd) = fs::read_dir(repo) {
        for e in rd.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if n.starts_with(".sheaf-import-") || n.starts_with("image-") || n.starts_with(".tmp") {
                left.push(n);
            }
        }
    }
    left
}

#[test]
fn a_tampered_or_truncated_blob_stops_the_import_and_leaves_nothing() {
    let t = tmpdir();
    let lay = layout(t.path());
    let blobs = lay.strs("gz_blobs");
    let diffs = lay.strs("diff_ids");
    let victim = lay.blob_path(&blobs[1]);
    let good = fs::read(&victim).unwrap();
    for (what, bytes) in [
        ("tampered", {
            let mut b = good.clone();
            let i = b.len() / 2;
            b[i] ^= 0x40;
            b
        }),
        ("truncated", good[..good.len() - 100].to_vec()),
        ("longer", [good.clone(), b"trailing".to_vec()].concat()),
    ] {
        fs::write(&victim, &bytes).unwrap();
        let repo = t.path().join(format!("repo-{what}"));
        let flat = t.path().join(format!("{what}.sheaf"));
        let o = sheaf([
            "import",
            &lay.oci("gz"),
            "--publish",
            repo.to_str().unwrap(),
            "--flatten",
            "-o",
            flat.to_str().unwrap(),
            "-q",
        ])
        .fails_with(1);
        let line = o.one_err_line();
        assert!(
            line.contains(&blobs[1]) && line.contains("does not match its digest"),
            "{what}: {line}"
        );
        assert!(!flat.exists(), "{what}: no merged image");
        assert!(
            !repo
                .join(format!("layer-sha256-{}", &diffs[1][7..]))
                .exists(),
            "{what}"
        );
        assert_eq!(nothing_left(&repo), Vec::<String>::new(), "{what}");
        assert!(
            nothing_left(t.path()).is_empty(),
            "{what}: temporaries beside the output"
        );
    }
    fs::write(&victim, &good).unwrap();
}

#[test]
fn absolute_and_climbing_layer_paths_are_refused() {
    let t = tmpdir();
    for (i, bad) in ["/etc/evil", "../evil", "a/../../evil"].iter().enumerate() {
        let dir = t.path().join(format!("bad{i}"));
        let o = Command::new("python3")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/mkoci.py"))
            .arg(&dir)
            .arg(t.path())
            .args(["--hostile", bad])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let flat = t.path().join(format!("bad{i}.sheaf"));
        let o = sheaf([
            "import",
            &format!("oci:{}:bad", dir.display()),
            "--flatten",
            "-o",
            flat.to_str().unwrap(),
        ])
        .fails_with(1);
        let line = o.one_err_line();
        assert!(line.contains("evil"), "{bad}: {line}");
        assert!(!flat.exists());
    }
}

#[test]
fn a_registry_serves_the_import_and_shared_layers_are_fetched_once() {
    if !have("docker-registry") || !have("skopeo") {
        return;
    }
    let t = tmpdir();
    let lay = layout(t.path());
    let reg = Registry::start(t.path());
    reg.push(&lay.oci("gz"), "team/app:1");
    reg.push(&lay.oci("extra"), "team/app:2");
    let repo = t.path().join("repo");
    let r = repo.to_str().unwrap();
    let host = reg.host();
    let url1 = format!("docker://{host}/team/app:1");

    // HTTPS unless the host is named insecure: one line, nothing written.
    let o = sheaf(["import", &url1, "--publish", r]).fails_with(1);
    assert!(o.one_err_line().contains(&host), "{}", o.one_err_line());

    let o = sheaf([
        "import",
        &url1,
        "--insecure-registry",
        &host,
        "--publish",
        r,
        "--json",
    ])
    .ok();
    let rep = json_of(&o);
    assert_eq!(rep["layers"].as_array().unwrap().len(), 3);
    let gets = reg.gets();
    let blob_gets = |gets: &[String], b: &str| gets.iter().filter(|g| g.ends_with(b)).count();
    for b in lay.strs("gz_blobs") {
        assert_eq!(blob_gets(&gets, &b), 1, "{b} fetched once: {gets:#?}");
    }
    // The second image shares the three base layers: only its own is fetched.
    let o = sheaf([
        "import",
        &format!("docker://{host}/team/app:2"),
        "--insecure-registry",
        &host,
        "--publish",
        r,
        "--json",
    ])
    .ok();
    let rep = json_of(&o);
    let new: Vec<&serde_json::Value> = rep["layers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["reused"] == false)
        .collect();
    assert_eq!(new.len(), 1);
    assert_eq!(new[0]["diff_id"], lay.summary["extra_diff_id"]);
    let gets = reg.gets();
    for b in lay.strs("gz_blobs") {
        assert_eq!(blob_gets(&gets, &b), 1, "{b} not fetched again");
    }
    let extra = lay.strs("extra_blobs");
    assert_eq!(blob_gets(&gets, &extra[3]), 1);

    // Publishing and flattening at once: the layers come from the
    // repository, nothing is fetched again.
    let both = t.path().join("both.sheaf");
    let o = sheaf([
        "import",
        &format!("docker://{host}/team/app:2"),
        "--insecure-registry",
        &host,
        "--publish",
        r,
        "--flatten",
        "-o",
        both.to_str().unwrap(),
        "--json",
    ])
    .ok();
    assert_eq!(json_of(&o)["fetched_bytes"], 0);
    let gets = reg.gets();
    for b in lay.strs("gz_blobs").iter().chain(&extra[3..]) {
        assert_eq!(blob_gets(&gets, b), 1, "{b} not fetched again");
    }
    let x = t.path().join("both");
    extract_preserving(&both, &x).ok();
    assert_eq!(
        fs::read(x.join("extra")).unwrap(),
        b"only in the extra image\n"
    );
    assert_eq!(
        fs::read(x.join("data/b")).unwrap(),
        b"two names, one file\n"
    );
    assert!(!x.join("etc/remove-me").exists());

    // By digest, the record's manifest.
    let m = rep["manifest"].as_str().unwrap().to_string();
    let flat = t.path().join("bydigest.sheaf");
    sheaf([
        "import",
        &format!("docker://{host}/team/app@{m}"),
        "--insecure-registry",
        &host,
        "--flatten",
        "-o",
        flat.to_str().unwrap(),
        "-q",
    ])
    .ok();
    assert_eq!(
        sheaf(["cat", flat.to_str().unwrap(), "/extra"]).ok().stdout,
        b"only in the extra image\n"
    );
    // A missing tag: the registry's own words, one line.
    let o = sheaf([
        "import",
        &format!("docker://{host}/team/app:nope"),
        "--insecure-registry",
        &host,
        "--publish",
        r,
    ])
    .fails_with(1);
    assert!(
        o.one_err_line().contains("MANIFEST_UNKNOWN"),
        "{}",
        o.one_err_line()
    );
}

#[test]
fn run_image_gives_the_configured_process_a_container_root() {
    if !mounts_allowed() || !have("docker-registry") || !have("skopeo") {
        return;
    }
    let t = tmpdir();
    let lay = layout(t.path());
    let flat = t.path().join("gz.sheaf");
    sheaf([
        "import",
        &lay.oci("gz"),
        "--flatten",
        "-o",
        flat.to_str().unwrap(),
        "-q",
    ])
    .ok();
    let f = flat.to_str().unwrap();
    // No command: Entrypoint + Cmd, in WorkingDir, with Env.
    let o = sheaf(["run", "--image", f]).ok();
    assert_eq!(o.text(), "FOO=bar\n/work\nhello from layer 1\n");
    // A command, an --env, the layers' results, the host's /etc/hosts.
    let o = sheaf([
        "run",
        "--image",
        f,
        "-e",
        "FOO=baz",
        "--",
        "/bin/sh",
        "-c",
        "echo $FOO; cat /data/b /swap; ls /opq; ls /etc; cat /etc/hosts",
    ])
    .ok();
    let mut names = vec!["greeting", "passwd", "hosts", "group"];
    for f in ["resolv.conf", "localtime"] {
        if Path::new("/etc").join(f).exists() {
            names.push(f);
        }
    }
    names.sort();
    let listing: String = names.iter().map(|n| format!("{n}\n")).collect();
    let hosts = fs::read_to_string("/etc/hosts").unwrap();
    assert_eq!(
        o.text(),
        format!("baz\ntwo names, one file\nnow a file\nnew\n{listing}{hosts}")
    );
    // --upper keeps the changes; the image is unchanged.
    let upper = t.path().join("upper");
    fs::create_dir(&upper).unwrap();
    sheaf([
        "run",
        "--image",
        f,
        "--upper",
        upper.to_str().unwrap(),
        "--",
        "/bin/sh",
        "-c",
        "echo kept > /work/new",
    ])
    .ok();
    assert_eq!(fs::read(upper.join("work/new")).unwrap(), b"kept\n");
    sheaf(["cat", f, "/work/new"]).fails_with(1);
    // Straight from a registry: imported into the node cache, then run.
    let reg = Registry::start(t.path());
    reg.push(&lay.oci("gz"), "app:1");
    let host = reg.host();
    let o = sheaf([
        "--cache-dir",
        t.path().join("cache").to_str().unwrap(),
        "run",
        "--insecure-registry",
        &host,
        "--image",
        &format!("docker://{host}/app:1"),
    ])
    .ok();
    assert_eq!(o.text(), "FOO=bar\n/work\nhello from layer 1\n");
    // The tag's manifest was asked for once, though it is resolved to name
    // the cache file before the import reads it.
    let manifest_gets = reg
        .gets()
        .iter()
        .filter(|g| g.ends_with("/manifests/1"))
        .count();
    assert_eq!(manifest_gets, 1, "{:#?}", reg.gets());
    // A plain (non-container) image is one line.
    let src = t.path().join("plain");
    fs::create_dir(&src).unwrap();
    fs::write(src.join("f"), "x").unwrap();
    let plain = t.path().join("plain.sheaf");
    build(&src, &plain, &[]).ok();
    // --mount destinations are inside the container.
    let spec = format!("{}:/mnt/plain", plain.display());
    let o = sheaf([
        "run",
        "--image",
        f,
        "--mount",
        &spec,
        "--",
        "/bin/cat",
        "/mnt/plain/f",
    ])
    .ok();
    assert_eq!(o.stdout, b"x");
    let o = sheaf(["run", "--image", plain.to_str().unwrap(), "--", "true"]).fails_with(125);
    assert!(
        o.one_err_line().contains("not a container image"),
        "{}",
        o.one_err_line()
    );
}

#[test]
fn imported_layers_and_image_records_are_signed_and_the_policy_applies() {
    let t = tmpdir();
    let lay = layout(t.path());
    let repo = t.path().join("repo");
    sheaf([
        "import",
        &lay.oci("gz"),
        "--publish",
        repo.to_str().unwrap(),
        "-q",
    ])
    .ok();
    let (key, signers) = ssh_signer(t.path());
    let diffs = lay.strs("diff_ids");
    let layer = |i: usize| repo.join(format!("layer-sha256-{}", &diffs[i][7..]));
    let s = signers.to_str().unwrap();

    // A layer is an image: unsigned, the policy refuses it; signed in the
    // repository (the index gains the signature), it mounts.
    let mp = t.path().join("mp");
    fs::create_dir(&mp).unwrap();
    let l0 = layer(0);
    let l0s = l0.to_str().unwrap();
    let o = sheaf([
        "mount",
        l0s,
        mp.to_str().unwrap(),
        "--require-signature",
        "--signers",
        s,
    ])
    .fails_with(1);
    assert!(
        o.one_err_line().contains("no trusted signature"),
        "{}",
        o.stderr
    );
    sheaf(["sign", l0s, "-k", key.to_str().unwrap()]).ok();
    let m = mount(&[l0s], &mp, &["--require-signature", "--signers", s]);
    assert!(mp.join("bin/sh").exists());
    drop(m);
    let v = json_of(&sheaf(["verify", l0s, "--signers", s, "--json"]).ok());
    assert_eq!(v["trusted"], true);

    // The record names each layer's root, as `sheaf root` reads it.
    let rec_path = repo.join(format!("image-sha256-{}.json", &lay.manifest("gz")[7..]));
    let rec: serde_json::Value = serde_json::from_slice(&fs::read(&rec_path).unwrap()).unwrap();
    let layers = rec["layers"].as_array().unwrap();
    assert_eq!(layers.len(), diffs.len());
    for (i, l) in layers.iter().enumerate() {
        let root = sheaf(["root", layer(i).to_str().unwrap()]).ok().text();
        let want = root
            .trim_end()
            .strip_prefix("sheaf-root-v1 ")
            .unwrap()
            .to_string();
        assert_eq!(l["root"].as_str().unwrap(), want, "layer {i}");
    }
    let r = rec_path.to_str().unwrap();
    sheaf(["verify", r, "--signers", s]).fails_with(1);
    sheaf(["sign", r, "-k", key.to_str().unwrap()]).ok();
    assert!(repo
        .join(format!(
            "{}.sig",
            rec_path.file_name().unwrap().to_str().unwrap()
        ))
        .exists());
    let v = json_of(&sheaf(["verify", r, "--signers", s, "--json"]).ok());
    assert_eq!(v["trusted"], true);
    assert!(v["layers"]
        .as_array()
        .unwrap()
        .iter()
        .all(|l| l["matches"] == true));

    // A layer swapped in the repository breaks the record's promise.
    let l1 = layer(1);
    let saved = fs::read(&l1).unwrap();
    fs::copy(&l0, &l1).unwrap();
    let o = sheaf(["verify", r, "--signers", s]).fails_with(1);
    assert!(o.text().contains("but the record says"), "{}", o.text());
    fs::write(&l1, saved).unwrap();
    sheaf(["verify", r, "--signers", s]).ok();
    // A record changed by one byte is no longer the signed one.
    let mut bytes = fs::read(&rec_path).unwrap();
    bytes.push(b'\n');
    fs::write(&rec_path, &bytes).unwrap();
    let o = sheaf(["verify", r, "--signers", s]).fails_with(1);
    assert!(o.text().contains("rejected"), "{}", o.text());
}

#[test]
fn a_registry_asking_for_basic_auth_gets_credentials_from_files_and_helpers() {
    use std::os::unix::fs::PermissionsExt;
    if !have("docker-registry") || !have("skopeo") {
        return;
    }
    let t = tmpdir();
    let lay = layout(t.path());
    let reg = Registry::start_with_auth(t.path(), "alice", "s3cret pass");
    reg.push(&lay.oci("gz"), "app:1");
    let host = reg.host();
    let image = format!("docker://{host}/app:1");
    let home = t.path().join("home");
    fs::create_dir_all(home.join(".docker")).unwrap();
    let import = |out: &str, extra: &[&str], path: Option<&Path>| {
        let mut c = cmd();
        c.env("HOME", &home)
            .env_remove("REGISTRY_AUTH_FILE")
            .env_remove("XDG_RUNTIME_DIR")
            .args([
                "import",
                &image,
                "--insecure-registry",
                &host,
                "--flatten",
                "-o",
            ])
            .arg(t.path().join(out))
            .args(extra)
            .arg("-q");
        if let Some(p) = path {
            c.env(
                "PATH",
                format!("{}:{}", p.display(), std::env::var("PATH").unwrap()),
            );
        }
        run_cmd(&mut c)
    };
    // No credentials: one line, the registry's refusal.
    let o = import("none.sheaf", &[], None).fails_with(1);
    let line = o.one_err_line().to_string();
    assert!(
        line.contains(&host) && line.contains("wants a user name and password"),
        "{line}"
    );
    assert!(!t.path().join("none.sheaf").exists());

    // An auth file (`--authfile`, the containers-auth.json format).
    let b64 = |s: &str| {
        let o = run_with_stdin(Command::new("base64").arg("-w0"), s.as_bytes().to_vec()).ok();
        o.text()
    };
    let authfile = t.path().join("auth.json");
    fs::write(
        &authfile,
        format!(
            r#"{{"auths":{{"{host}":{{"auth":"{}"}}}}}}"#,
            b64("alice:s3cret pass")
        ),
    )
    .unwrap();
    import(
        "file.sheaf",
        &["--authfile", authfile.to_str().unwrap()],
        None,
    )
    .ok();

    // ~/.docker/config.json naming a credential helper for this registry:
    // docker-credential-NAME get, the server on stdin, JSON on stdout.
    let bin_dir = t.path().join("helpers");
    fs::create_dir_all(&bin_dir).unwrap();
    let helper = bin_dir.join("docker-credential-sheaftest");
    fs::write(
        &helper,
        format!(
            "#!/bin/sh\n[ \"$1\" = get ] || exit 1\nread server\necho \"$server\" >> {log}\nif [ \"$server\" = {host} ]; then\n  printf '{{\"ServerURL\":\"%s\",\"Username\":\"alice\",\"Secret\":\"s3cret pass\"}}' \"$server\"\nelse\n  echo 'credentials not found in native keychain'; exit 1\nfi\n",
            log = t.path().join("helper.log").display()
        ),
    )
    .unwrap();
    fs::set_permissions(&helper, fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(
        home.join(".docker/config.json"),
        format!(r#"{{"auths":{{"{host}":{{}}}},"credHelpers":{{"{host}":"sheaftest"}}}}"#),
    )
    .unwrap();
    import("helper.sheaf", &[], Some(&bin_dir)).ok();
    assert_eq!(
        fs::read_to_string(t.path().join("helper.log")).unwrap(),
        format!("{host}\n")
    );
    // credsStore: the same helper for every registry.
    fs::write(
        home.join(".docker/config.json"),
        r#"{"credsStore":"sheaftest"}"#,
    )
    .unwrap();
    import("store.sheaf", &[], Some(&bin_dir)).ok();
    // The three imports are the same image.
    let root = |f: &str| {
        sheaf(["root", t.path().join(f).to_str().unwrap()])
            .ok()
            .text()
    };
    assert_eq!(root("file.sheaf"), root("helper.sheaf"));
    assert_eq!(root("file.sheaf"), root("store.sheaf"));
    // A helper that has nothing for the registry: refused as with none.
    fs::write(
        home.join(".docker/config.json"),
        format!(r#"{{"credHelpers":{{"{host}":"missing-helper"}}}}"#),
    )
    .unwrap();
    let o = import("gone.sheaf", &[], Some(&bin_dir)).fails_with(1);
    assert!(
        o.one_err_line().contains("wants a user name and password"),
        "{}",
        o.stderr
    );
}
