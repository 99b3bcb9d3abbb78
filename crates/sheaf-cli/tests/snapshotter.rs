//! `sheaf snapshotter` under a real containerd (its own config, sockets and
//! directories), real runc and a real registry, all on loopback: a pull
//! through CRI (as the kubelet pulls) of an imported image fetches no layer
//! blob and stores only the manifest and config; containers run with the
//! right output; an image with a layer sheaf does not have falls back per
//! layer; a restart of the snapshotter leaves a running container reading;
//! removing the images leaves nothing behind; a second containerd namespace
//! shares the lazy layers; under a signature policy unsigned layers take
//! containerd's path; a recorded prefetch list fills the node cache at pull.

#[path = "snapshotter/admin.rs"]
mod admin;
mod common;
#[path = "snapshotter/restart.rs"]
mod restart;
use common::oci::*;
use common::servers::{Nginx, Registry};
use common::*;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

fn sha256_hex(b: &[u8]) -> String {
    use std::io::Write;
    let mut c = Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(b).unwrap();
    let o = c.wait_with_output().unwrap();
    String::from_utf8_lossy(&o.stdout)[..64].to_string()
}

/// Debian's python3 (with python3-grpcio), not a user's.
const PY: &str = "/usr/bin/python3";

struct Snapshotter {
    child: Option<Child>,
    sock: PathBuf,
    root: PathBuf,
    repo: String,
    log: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    /// Where `--metrics` serves the counters.
    metrics_port: u16,
}

impl Snapshotter {
    fn start(dir: &Path, repo: &str) -> Snapshotter {
        Self::start_with_env(dir, repo, Vec::new())
    }
    fn start_with_env(dir: &Path, repo: &str, env: Vec<(String, String)>) -> Snapshotter {
        let mut s = Snapshotter {
            child: None,
            sock: dir.join("sheaf.sock"),
            root: dir.join("sn"),
            repo: repo.to_string(),
            log: dir.join("snapshotter.log"),
            args: Vec::new(),
            env,
            metrics_port: common::servers::free_port(),
        };
        s.spawn();
        s
    }
    fn spawn(&mut self) {
        let _ = fs::remove_file(&self.sock);
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = cmd()
            .arg("snapshotter")
            .arg("--socket")
            .arg(&self.sock)
            .arg("--root")
            .arg(&self.root)
            .arg("--repo")
            .arg(&self.repo)
            .arg(format!("--metrics=127.0.0.1:{}", self.metrics_port))
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
        let t0 = Instant::now();
        while !self.sock.exists() {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "snapshotter did not start: {}",
                common::servers::tail(&self.log, 20)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let _ = c.wait();
        }
    }
    fn restart(&mut self) {
        self.stop();
        self.spawn();
    }
    fn status(&self) -> String {
        match self.child.as_ref().map(|c| c.id()) {
            Some(pid) => fs::read_to_string(format!("/proc/{pid}/status"))
                .map(|s| s.lines().take(3).collect::<Vec<_>>().join("; "))
                .unwrap_or_else(|e| format!("gone: {e}")),
            None => "not started".into(),
        }
    }
    /// A sample of `--metrics`' text, e.g.
    /// `sheaf_snapshotter_layers_total{path="lazy"}`.
    fn metric(&self, sample: &str) -> u64 {
        let (code, text) = common::servers::http_get(self.metrics_port, "/metrics");
        assert_eq!(code, 200, "{text}");
        text.lines()
            .find_map(|l| l.strip_prefix(sample)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {sample} in:\n{text}"))
    }
    fn state(&self) -> serde_json::Value {
        serde_json::from_slice(&fs::read(self.root.join("state.json")).unwrap()).unwrap()
    }
}

impl Drop for Snapshotter {
    fn drop(&mut self) {
        self.stop();
    }
}

struct Containerd {
    child: Option<Child>,
    dir: PathBuf,
    sock: PathBuf,
    log: PathBuf,
}

impl Containerd {
    fn start(dir: &Path, registry: &str, snapshotter_sock: &Path) -> Containerd {
        let d = dir.join("containerd");
        fs::create_dir_all(&d).unwrap();
        let sock = d.join("containerd.sock");
        let cfg = d.join("config.toml");
        fs::write(
            &cfg,
            format!(
                r#"version = 2
root = "{root}"
state = "{state}"
[grpc]
  address = "{sock}"
[ttrpc]
  address = "{sock}.ttrpc"
[proxy_plugins]
  [proxy_plugins.sheaf]
    type = "snapshot"
    address = "{sn}"
[plugins."io.containerd.grpc.v1.cri"]
  disable_tcp_service = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "sheaf"
    disable_snapshot_annotations = false
  [plugins."io.containerd.grpc.v1.cri".registry.mirrors."{registry}"]
    endpoint = ["http://{registry}"]
"#,
                root = d.join("root").display(),
                state = d.join("state").display(),
                sock = sock.display(),
                sn = snapshotter_sock.display(),
            ),
        )
        .unwrap();
        let log = d.join("containerd.log");
        let out = fs::File::create(&log).unwrap();
        let child = Command::new(server_program("containerd"))
            .arg("--config")
            .arg(&cfg)
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap();
        let c = Containerd {
            child: Some(child),
            dir: d,
            sock,
            log,
        };
        let t0 = Instant::now();
        while !c.ctr(&["version"]).stderr.is_empty() || c.ctr(&["version"]).code != 0 {
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "containerd did not start: {}",
                common::servers::tail(&c.log, 30)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        c
    }
    fn ctr(&self, args: &[&str]) -> Out {
        self.ctr_in("k8s.io", args)
    }
    fn ctr_in(&self, ns: &str, args: &[&str]) -> Out {
        run_cmd(
            Command::new("ctr")
                .arg("--address")
                .arg(&self.sock)
                .args(["--namespace", ns])
                .args(args),
        )
    }
    /// PullImage through CRI: the labels a remote snapshotter needs.
    fn pull(&self, image: &str) -> String {
        // Just after a snapshotter restart, containerd's connection to it
        // may still be backing off (UNAVAILABLE): ask again for a while.
        let t0 = Instant::now();
        let o = loop {
            let o = run_cmd(
                Command::new(PY)
                    .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/cri_pull.py"))
                    .arg(&self.sock)
                    .arg(image),
            );
            if o.code == 0
                || !o.stderr.contains("StatusCode.UNAVAILABLE")
                || t0.elapsed() > Duration::from_secs(20)
            {
                break o;
            }
            std::thread::sleep(Duration::from_millis(500));
        };
        assert_eq!(
            o.code,
            0,
            "CRI pull {image}: {}\n{}",
            o.stderr,
            common::servers::tail(&self.log, 20)
        );
        o.text().trim().to_string()
    }
    fn run(&self, image: &str, id: &str, command: &[&str]) -> Out {
        let mut args = vec!["run", "--rm", "--snapshotter", "sheaf", image, id];
        args.extend(command);
        self.ctr(&args)
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        // Shims outlive containerd: end every task first.
        for id in self.ctr(&["task", "ls", "-q"]).text().lines() {
            self.ctr(&["task", "kill", "-s", "KILL", id]);
            self.ctr(&["task", "delete", "-f", id]);
        }
        if let Some(mut c) = self.child.take() {
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let _ = c.wait();
        }
        let _ = &self.dir;
    }
}

/// Mount points under `dir` (FUSE unions the snapshotter made).
fn mounts_under(dir: &Path) -> Vec<String> {
    let d = dir.to_string_lossy().into_owned();
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
        .filter(|m| m.starts_with(&d))
        .collect()
}

fn unmount_all(dir: &Path) {
    for m in mounts_under(dir) {
        let _ = Command::new("umount").arg("-l").arg(&m).status();
    }
}

#[test]
fn containerd_starts_imported_images_lazily_and_falls_back_per_layer() {
    run_scenario(scenario);
}

/// Run `scenario` in a temporary directory when containerd, a registry,
/// skopeo, runc and grpcio are here (else the missing one fails the test),
/// with the snapshotter's log shown on failure and every mount it left
/// undone.
fn run_scenario(scenario: fn(&Path)) {
    if !mounts_allowed()
        || !have("docker-registry")
        || !have("skopeo")
        || !have("containerd")
        || !prerequisite(
            Command::new(PY)
                .args(["-c", "import grpc"])
                .status()
                .is_ok_and(|s| s.success()),
            "python3-grpcio",
        )
        || !prerequisite(
            Command::new("runc").arg("--version").output().is_ok(),
            "runc",
        )
    {
        return;
    }
    let t = tmpdir();
    let r = std::panic::catch_unwind(|| scenario(t.path()));
    if r.is_err() {
        eprintln!(
            "snapshotter log:\n{}",
            common::servers::tail(&t.path().join("snapshotter.log"), 30)
        );
    }
    unmount_all(t.path());
    if let Err(e) = r {
        std::panic::resume_unwind(e);
    }
}

/// `sheaf import docker://HOST/NAME --publish REPO`: the image in the
/// test registry as a repository the snapshotter reads layers from.
fn publish(host: &str, name: &str, repo: &Path) {
    sheaf([
        "import",
        &format!("docker://{host}/{name}"),
        "--insecure-registry",
        host,
        "--publish",
        repo.to_str().unwrap(),
        "-q",
    ])
    .ok();
}

/// The site's `[mount] kernel = "require"`: the snapshotter's read-only
/// stack of a container's layers (overlayfs's lower directory) is the
/// kernel's EROFS mount of their merged view, and the container sees what
/// it sees through FUSE: whiteouts, hardlinks, a replaced directory, an
/// opaque one.
#[test]
fn containerd_runs_an_image_on_the_kernel_path_when_the_site_says_so() {
    if !prerequisite(is_root(), "root (the kernel path mounts EROFS)") {
        return;
    }
    run_scenario(kernel_scenario);
}

fn kernel_scenario(t: &Path) {
    let lay = layout(t);
    let reg = Registry::start(t);
    reg.push(&lay.oci("gz"), "app:1");
    let host = reg.host();
    let repo = t.join("repo");
    publish(&host, "app:1", &repo);
    let conf = t.join("site.toml");
    write(
        &conf,
        format!(
            "[mount]\nkernel = \"require\"\nkernel_cache = \"{}\"\n",
            t.join("kcache").display()
        )
        .as_bytes(),
    );
    let sn = Snapshotter::start_with_env(
        t,
        repo.to_str().unwrap(),
        vec![("SHEAF_CONFIG".into(), conf.display().to_string())],
    );
    let ctd = Containerd::start(t, &host, &sn.sock);
    let image = format!("{host}/app:1");
    ctd.pull(&image);
    let script = "cat /data/a /data/b /swap /dup; ls /opq /data; cat /etc/remove-me 2>/dev/null || echo removed; id -u; echo $FOO; pwd";
    let o = ctd.run(&image, "k1", &["/bin/sh", "-c", script]).ok();
    assert_eq!(
        o.text(),
        "two names, one file\ntwo names, one file\nnow a file\nsecond version wins\n/data:\na\nb\nsym\n\n/opq:\nnew\nremoved\n0\nbar\n/work\n"
    );
    // The layers' mount under the snapshotter's root is EROFS.
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let root = sn.root.display().to_string();
    assert!(
        info.lines().any(
            |l| l.split(' ').nth(4).is_some_and(|m| m.starts_with(&root))
                && l.contains(" - erofs ")
        ),
        "no EROFS mount under {root}:\n{info}"
    );
}

/// The repository in an S3 bucket (SeaweedFS, authentication on): the
/// snapshotter's `--repo s3://…` finds the layers `import --publish`
/// wrote there, and containerd runs the image on them, lazily.
#[test]
fn containerd_runs_an_image_lazily_from_a_repository_in_a_bucket() {
    run_scenario(s3_scenario);
}

fn s3_scenario(t: &Path) {
    use common::servers::SeaweedS3;
    let lay = layout(t);
    let reg = Registry::start(t);
    reg.push(&lay.oci("gz"), "app:1");
    let host = reg.host();
    let w = SeaweedS3::start(t);
    w.make_bucket("sheaf");
    let home = t.join("home");
    fs::create_dir_all(&home).unwrap();
    let env: Vec<(String, String)> = [
        ("HOME", home.to_str().unwrap().to_string()),
        ("AWS_ACCESS_KEY_ID", SeaweedS3::ACCESS_KEY.to_string()),
        ("AWS_SECRET_ACCESS_KEY", SeaweedS3::SECRET_KEY.to_string()),
        ("AWS_ENDPOINT_URL", w.endpoint()),
        ("AWS_REGION", "us-east-1".to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let mut c = cmd();
    c.envs(env.iter().map(|(k, v)| (k, v))).args([
        "import",
        &format!("docker://{host}/app:1"),
        "--insecure-registry",
        &host,
        "--publish",
        "s3://sheaf/repo",
        "-q",
    ]);
    run_cmd(&mut c).ok();
    let sn = Snapshotter::start_with_env(t, "s3://sheaf/repo", env);
    let ctd = Containerd::start(t, &host, &sn.sock);
    let image = format!("{host}/app:1");
    let before = reg.gets().len();
    ctd.pull(&image);
    let gets = reg.gets()[before..].to_vec();
    for b in &lay.strs("gz_blobs") {
        assert!(
            !gets.iter().any(|g| g.ends_with(b.as_str())),
            "layer {b} fetched from the registry: {gets:#?}"
        );
    }
    assert_eq!(sn.state()["lazy_layers"], 3);
    let o = ctd.run(&image, "c1", &[]).ok();
    assert_eq!(o.text(), "FOO=bar\n/work\nhello from layer 1\n");
}

fn scenario(t: &Path) {
    let lay = layout(t);
    let reg = Registry::start(t);
    reg.push(&lay.oci("gz"), "app:1");
    reg.push(&lay.oci("extra"), "app:2");
    let host = reg.host();
    // The repository as a site serves it: over HTTP (layers through the
    // node cache).
    let www = t.join("www");
    let repo = www.join("repo");
    publish(&host, "app:1", &repo);
    let nginx = Nginx::start_with_root(t, &www);
    let mut sn = Snapshotter::start(t, &nginx.url("repo"));
    let ctd = Containerd::start(t, &host, &sn.sock);
    let image = format!("{host}/app:1");

    // A CRI pull fetches the manifest and config, no layer blob.
    let before = reg.gets().len();
    ctd.pull(&image);
    let gets = reg.gets()[before..].to_vec();
    let gz = lay.strs("gz_blobs");
    for b in &gz {
        assert!(
            !gets.iter().any(|g| g.ends_with(b.as_str())),
            "layer {b} fetched: {gets:#?}"
        );
    }
    assert!(gets.iter().any(|g| g.contains("/manifests/")), "{gets:#?}");
    let manifest: serde_json::Value =
        serde_json::from_slice(&fs::read(lay.blob_path(&lay.manifest("gz"))).unwrap()).unwrap();
    let config = manifest["config"]["digest"].as_str().unwrap().to_string();
    let content: Vec<String> = ctd
        .ctr(&["content", "ls", "-q"])
        .ok()
        .text()
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(
        content.len(),
        2,
        "only the manifest and the config: {content:?}"
    );
    assert!(content.contains(&config));
    assert!(!content.iter().any(|c| gz.contains(c)));
    assert_eq!(sn.state()["lazy_layers"], 3);

    // Containers run on the lazy layers: Cmd, Env, WorkingDir, whiteouts,
    // hardlinks, a replaced directory; the same as `sheaf run --image`.
    let o = ctd.run(&image, "c1", &[]).ok();
    assert_eq!(o.text(), "FOO=bar\n/work\nhello from layer 1\n");
    let script = "cat /data/a /data/b /swap /dup; ls /opq /data; cat /etc/remove-me 2>/dev/null || echo removed; id -u; echo $FOO; pwd";
    let o = ctd.run(&image, "c2", &["/bin/sh", "-c", script]);
    let via_ctr = o.text();
    let o2 = sheaf([
        "--cache-dir",
        t.join("cache").to_str().unwrap(),
        "run",
        "--insecure-registry",
        &host,
        "--image",
        &format!("docker://{host}/app:1"),
        "--",
        "/bin/sh",
        "-c",
        script,
    ])
    .ok();
    assert_eq!(via_ctr, o2.text());
    assert_eq!(
        via_ctr,
        "two names, one file\ntwo names, one file\nnow a file\nsecond version wins\n/data:\na\nb\nsym\n\n/opq:\nnew\nremoved\n0\nbar\n/work\n"
    );

    // An image whose top layer sheaf lacks: the base layers are the same
    // snapshots; only that layer is fetched, applied and packed.
    let before = reg.gets().len();
    ctd.pull(&format!("{host}/app:2"));
    let gets = reg.gets()[before..].to_vec();
    let extra = lay.strs("extra_blobs");
    assert_eq!(
        gets.iter()
            .filter(|g| g.ends_with(extra[3].as_str()))
            .count(),
        1,
        "{gets:#?}"
    );
    for b in &gz {
        assert!(!gets.iter().any(|g| g.ends_with(b.as_str())), "{gets:#?}");
    }
    let o = ctd
        .run(
            &format!("{host}/app:2"),
            "c3",
            &["/bin/cat", "/extra", "/etc/greeting"],
        )
        .ok();
    assert_eq!(o.text(), "only in the extra image\nhello from layer 1\n");
    let st = sn.state();
    assert_eq!(
        (st["lazy_layers"].as_u64(), st["applied_layers"].as_u64()),
        (Some(3), Some(1))
    );
    // Each decision is logged, as the counters count them, and served
    // the same in Prometheus's format.
    let log = fs::read_to_string(&sn.log).unwrap();
    assert_eq!(log.matches(": lazy, from ").count(), 3, "{log}");
    assert_eq!(
        log.matches("applied by containerd and packed").count(),
        1,
        "{log}"
    );
    assert_eq!(
        sn.metric(r#"sheaf_snapshotter_layers_total{path="lazy"}"#),
        3
    );
    assert_eq!(
        sn.metric(r#"sheaf_snapshotter_layers_total{path="applied"}"#),
        1
    );
    assert!(
        log.lines()
            .all(|l| l.starts_with("time=\"") && l.contains(" level=")),
        "{log}"
    );

    // A restart of the snapshotter under a running container.
    ctd.ctr(&[
        "run",
        "-d",
        "--snapshotter",
        "sheaf",
        &image,
        "long",
        "/bin/sleep",
        "120",
    ])
    .ok();
    // containerd's connection to the plugin backs off after a refused
    // dial (the restart's gap): ask again for a few seconds.
    let keys = |c: &Containerd, sn: &Snapshotter| {
        let t0 = Instant::now();
        let o = loop {
            let o = c.ctr(&["snapshots", "--snapshotter", "sheaf", "ls"]);
            if o.code == 0 || t0.elapsed() > Duration::from_secs(15) {
                break o;
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        assert_eq!(
            o.code,
            0,
            "{}\nsnapshotter {:?} log:\n{}",
            o.stderr,
            sn.status(),
            common::servers::tail(&sn.log, 20)
        );
        let mut v: Vec<String> = o
            .text()
            .lines()
            .skip(1)
            .map(|l| l.split_whitespace().next().unwrap_or("").to_string())
            .collect();
        v.sort();
        v
    };
    let before = keys(&ctd, &sn);
    sn.restart();
    let o = ctd
        .ctr(&[
            "task",
            "exec",
            "--exec-id",
            "e1",
            "long",
            "/bin/cat",
            "/etc/greeting",
        ])
        .ok();
    assert_eq!(o.text(), "hello from layer 1\n");
    assert_eq!(keys(&ctd, &sn), before, "the snapshots survive the restart");
    // Their mounts stayed alive: no line says one was made again.
    let log = fs::read_to_string(&sn.log).unwrap();
    assert_eq!(
        log.matches("mounted again after a restart").count(),
        0,
        "{log}"
    );
    // A union mount whose server and watchdog were both killed stays as a
    // dead mount; the restarted snapshotter detaches and makes it again.
    let unions: Vec<PathBuf> = fs::read_dir(sn.root.join("snapshots"))
        .unwrap()
        .flatten()
        .map(|e| e.path().join("fs"))
        .filter(|f| is_mounted(f) && f.join("etc/greeting").is_file())
        .collect();
    assert!(!unions.is_empty(), "no union mount with /etc/greeting");
    let fsd = &unions[0];
    let server = json(&sheaf(["stats".as_ref(), "--json".as_ref(), fsd.as_os_str()]).ok())["pid"]
        .as_u64()
        .unwrap() as i32;
    let watchdogs: Vec<i32> = fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let stat = fs::read_to_string(e.path().join("stat")).ok()?;
            let (head, rest) = stat.rsplit_once(')')?;
            let ppid: i32 = rest.split_whitespace().nth(1)?.parse().ok()?;
            (ppid == server && head.ends_with("(sheaf-watchdog"))
                .then(|| e.file_name().to_string_lossy().parse().ok())?
        })
        .collect();
    for p in watchdogs.iter().chain([&server]) {
        unsafe { libc::kill(*p, libc::SIGKILL) };
    }
    let t0 = Instant::now();
    // (stat answers from what the kernel cached; the stats ask the server.)
    while sheaf(["stats".as_ref(), fsd.as_os_str()]).code == 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the mount did not die: server {server}, watchdogs {watchdogs:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(is_mounted(fsd), "the dead mount went away by itself");
    sn.restart();
    // Answered once the mounts are made again (the socket listens before).
    keys(&ctd, &sn);
    assert_eq!(
        fs::read_to_string(fsd.join("etc/greeting")).unwrap(),
        "hello from layer 1\n",
        "the dead mount was not made again: {}",
        common::servers::tail(&sn.log, 20)
    );
    // One line for the one mount made again, none for those alive.
    let log = fs::read_to_string(&sn.log).unwrap();
    assert_eq!(
        log.matches("its mount had died; mounting again").count(),
        1,
        "{log}"
    );
    assert_eq!(
        log.matches("mounted again after a restart").count(),
        1,
        "{log}"
    );
    ctd.ctr(&["task", "kill", "-s", "KILL", "long"]);
    let t0 = Instant::now();
    while ctd.ctr(&["task", "delete", "long"]).code != 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "task long did not end"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    ctd.ctr(&["containers", "rm", "long"]).ok();

    // A second containerd namespace prepares the base layer as CRI would:
    // committed at once over the same repository layer, readable there,
    // removable there without touching k8s.io's.
    let diffs = lay.strs("diff_ids");
    let chain0 = diffs[0].clone();
    // Under a lease, as a client holds what it prepares: containerd's
    // garbage collector would otherwise take the unreferenced snapshot
    // while it is being inspected.
    ctd.ctr_in("other", &["leases", "create", "--id", "sheaf-test-hold"])
        .ok();
    let o = run_cmd(
        Command::new(PY)
            .env("SNAP_LEASE", "sheaf-test-hold")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/snap_prepare.py"))
            .arg(&ctd.sock)
            .args(["other", "sheaf", &format!("extract-1 {chain0}"), ""])
            .arg(format!("containerd.io/snapshot.ref={chain0}"))
            .arg(format!("containerd.io/snapshot/cri.layer-digest={}", gz[0])),
    )
    .ok();
    assert_eq!(o.text().trim(), "exists");
    let ls = ctd
        .ctr_in("other", &["snapshots", "--snapshotter", "sheaf", "ls"])
        .ok()
        .text();
    assert!(
        ls.lines()
            .any(|l| l.starts_with(&chain0) && l.contains("Committed")),
        "{ls}"
    );
    // containerd names a remotely committed snapshot by its chain ID,
    // which is the same in every namespace: one snapshot, shared.
    let st = sn.state();
    let base_snaps: Vec<&String> = st["snaps"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(_, v)| v["parent"] == "")
        .map(|(k, _)| k)
        .collect();
    assert_eq!(base_snaps, vec![&chain0], "{st:#}");
    assert_eq!(st["lazy_layers"], 3, "nothing new was mounted: {st:#}");
    let mj = ctd
        .ctr_in(
            "other",
            &[
                "snapshots",
                "--snapshotter",
                "sheaf",
                "view",
                "--mounts",
                "v-other",
                &chain0,
            ],
        )
        .ok()
        .text();
    let mounts: serde_json::Value =
        serde_json::from_str(&mj).unwrap_or_else(|e| panic!("{e}: {mj}"));
    let src = mounts[0]["Source"]
        .as_str()
        .or(mounts[0]["source"].as_str())
        .unwrap()
        .to_string();
    assert_eq!(
        fs::read_to_string(Path::new(&src).join("etc/greeting")).unwrap(),
        "hello from layer 1\n"
    );
    ctd.ctr_in(
        "other",
        &["snapshots", "--snapshotter", "sheaf", "rm", "v-other"],
    )
    .ok();
    // (containerd's garbage collector may have taken the unreferenced
    // snapshot already.)
    let o = ctd.ctr_in(
        "other",
        &["snapshots", "--snapshotter", "sheaf", "rm", &chain0],
    );
    assert!(
        o.code == 0 || o.stderr.contains("not found"),
        "{}",
        o.stderr
    );
    ctd.ctr_in("other", &["leases", "delete", "sheaf-test-hold"])
        .ok();
    assert!(!ctd
        .ctr_in("other", &["snapshots", "--snapshotter", "sheaf", "ls"])
        .ok()
        .text()
        .contains(&chain0));
    let o = ctd.run(&image, "c4", &["/bin/cat", "/etc/greeting"]).ok();
    assert_eq!(
        o.text(),
        "hello from layer 1\n",
        "k8s.io's layers are untouched"
    );

    // A container's root is kernel overlayfs (its upper directory in the
    // snapshotter's root) over a read-only union of the layers; committed,
    // overlayfs's whiteouts and opaque directories become a layer's.
    let chain1 = format!(
        "sha256:{}",
        sha256_hex(format!("{chain0} {}", diffs[1]).as_bytes())
    );
    let top = format!(
        "sha256:{}",
        sha256_hex(format!("{chain1} {}", diffs[2]).as_bytes())
    );
    let field = |v: &serde_json::Value, k: &str| {
        v.get(k)
            .or_else(|| v.get(k.to_lowercase()))
            .cloned()
            .unwrap_or_default()
    };
    let mj = ctd
        .ctr(&[
            "snapshots",
            "--snapshotter",
            "sheaf",
            "prepare",
            "--mounts",
            "root-1",
            &top,
        ])
        .ok()
        .text();
    let m: serde_json::Value = serde_json::from_str(&mj).unwrap_or_else(|e| panic!("{e}: {mj}"));
    assert_eq!(field(&m[0], "Type"), "overlay", "{mj}");
    let opts: Vec<String> = field(&m[0], "Options")
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o.as_str().unwrap().to_string())
        .collect();
    assert!(
        opts.iter()
            .any(|o| o.starts_with(&format!("upperdir={}", sn.root.display()))),
        "{opts:?}"
    );
    let rootdir = t.join("root-1");
    fs::create_dir_all(&rootdir).unwrap();
    run_cmd(
        Command::new("mount")
            .args(["-t", "overlay", "overlay", "-o", &opts.join(",")])
            .arg(&rootdir),
    )
    .ok();
    assert_eq!(
        fs::read_to_string(rootdir.join("etc/greeting")).unwrap(),
        "hello from layer 1\n"
    );
    fs::remove_file(rootdir.join("etc/greeting")).unwrap();
    fs::remove_dir_all(rootdir.join("data")).unwrap();
    fs::create_dir(rootdir.join("data")).unwrap();
    fs::write(rootdir.join("data/new"), "new\n").unwrap();
    fs::write(rootdir.join("added"), "added\n").unwrap();
    run_cmd(Command::new("umount").arg(&rootdir)).ok();
    ctd.ctr(&[
        "snapshots",
        "--snapshotter",
        "sheaf",
        "commit",
        "committed-1",
        "root-1",
    ])
    .ok();
    let vj = ctd
        .ctr(&[
            "snapshots",
            "--snapshotter",
            "sheaf",
            "view",
            "--mounts",
            "view-1",
            "committed-1",
        ])
        .ok()
        .text();
    let v: serde_json::Value = serde_json::from_str(&vj).unwrap_or_else(|e| panic!("{e}: {vj}"));
    let src = PathBuf::from(field(&v[0], "Source").as_str().unwrap());
    assert!(!src.join("etc/greeting").exists(), "the deletion is kept");
    let mut names: Vec<String> = fs::read_dir(src.join("data"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, vec!["new"], "the opaque directory is kept");
    assert_eq!(fs::read_to_string(src.join("added")).unwrap(), "added\n");
    assert!(src.join("bin/sh").exists());
    // ctr makes these without a lease, so containerd's garbage collector may
    // take them first ("not found"). When it took the view, containerd 1.6
    // can keep the view in its parent's list of children, and removing the
    // parent then says "with child" until the collector takes the parent
    // too; the wait below checks that nothing is left in the end.
    let o = ctd.ctr(&["snapshots", "--snapshotter", "sheaf", "rm", "view-1"]);
    let view_collected = o.code != 0 && o.stderr.contains("not found");
    assert!(o.code == 0 || view_collected, "{}", o.stderr);
    let o = ctd.ctr(&["snapshots", "--snapshotter", "sheaf", "rm", "committed-1"]);
    assert!(
        o.code == 0
            || o.stderr.contains("not found")
            || (view_collected && o.stderr.contains("cannot remove snapshot with child")),
        "{}",
        o.stderr
    );

    // Removing the images leaves nothing: no snapshot, mount or directory.
    for name in ctd.ctr(&["images", "ls", "-q"]).ok().text().lines() {
        ctd.ctr(&["images", "rm", "--sync", name]).ok();
    }
    let t0 = Instant::now();
    let mut collected = Instant::now();
    loop {
        let st = sn.state();
        let left = st["snaps"].as_object().map_or(0, |m| m.len());
        let mounts = mounts_under(&sn.root);
        let dirs = fs::read_dir(sn.root.join("snapshots")).unwrap().count();
        if left == 0 && mounts.is_empty() && dirs == 0 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "left behind: {left} snapshots, mounts {mounts:?}, {dirs} directories; \
             snapshotter state {st}; containerd lists:\n{}",
            ctd.ctr(&["snapshots", "--snapshotter", "sheaf", "ls"])
                .text()
        );
        // containerd collects again on its next change (its scheduler);
        // one pass whose removal came too early leaves the rest for it, so
        // every 10 s the test makes such a change: a lease, deleted with
        // a synchronous collection.
        if collected.elapsed() > Duration::from_secs(10) {
            let lease = ctd.ctr(&["leases", "create"]).ok().text();
            ctd.ctr(&["leases", "delete", "--sync", lease.trim()]).ok();
            collected = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(200));
    }

    // Under a signature policy, only signed layers are lazy; the unsigned
    // one is fetched and applied by containerd. A recorded prefetch list
    // fills the (new, empty) node cache during the pull: with the web
    // server gone, the container still runs.
    let (key, signers) = ssh_signer(t);
    for i in [0, 2] {
        let l = repo.join(format!("layer-sha256-{}", &diffs[i][7..]));
        sheaf(["sign", l.to_str().unwrap(), "-k", key.to_str().unwrap()]).ok();
    }
    let mut list: Vec<String> = Vec::new();
    let base = t.join("base");
    let mut stack = vec![base.clone()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                list.push(format!("/{}", p.strip_prefix(&base).unwrap().display()));
            }
        }
    }
    list.push("/etc/greeting".into());
    fs::write(
        repo.join(format!("prefetch-sha256-{}.txt", &lay.manifest("gz")[7..])),
        list.join("\n") + "\n",
    )
    .unwrap();
    sn.args = vec![
        "--require-signature".into(),
        "--signers".into(),
        signers.display().to_string(),
    ];
    sn.restart();
    keys(&ctd, &sn);
    let before = reg.gets().len();
    ctd.pull(&image);
    let gets = reg.gets()[before..].to_vec();
    // The signed base layer is not fetched, the unsigned one is. (Once a
    // layer must be applied, containerd's unpacker fetches every layer
    // above it too, whether or not their snapshots then come lazily.)
    let count = |b: &str| gets.iter().filter(|g| g.ends_with(b)).count();
    assert_eq!((count(&gz[0]), count(&gz[1])), (0, 1), "{gets:#?}");
    let st = sn.state();
    assert_eq!(st["refused_layers"], 1, "{st:#}");
    assert_eq!(st["lazy_layers"], 5, "3 before, and layers 0 and 2: {st:#}");
    assert_eq!(st["prefetched_layers"], 2, "{st:#}");
    // The prefetches are `sheaf cache fetch` children: wait for them.
    let t0 = Instant::now();
    while fs::read_dir("/proc").unwrap().flatten().any(|e| {
        fs::read(e.path().join("cmdline")).is_ok_and(|c| {
            let c = String::from_utf8_lossy(&c);
            c.contains("cache\0fetch") && c.contains(&nginx.url("repo"))
        })
    }) {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "prefetch did not end"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(nginx);
    let o = ctd.run(&image, "c5", &[]).ok();
    assert_eq!(o.text(), "FOO=bar\n/work\nhello from layer 1\n");
    for name in ctd.ctr(&["images", "ls", "-q"]).ok().text().lines() {
        ctd.ctr(&["images", "rm", "--sync", name]).ok();
    }
    drop(ctd);
    sn.stop();
}

/// A connection to the snapshotter mounts as root: its socket is 0600
/// whatever the umask it was started under (it followed the umask, so
/// under umask 000 any local user could connect).
#[test]
fn the_snapshotter_socket_is_root_only_whatever_the_umask() {
    if !prerequisite(
        is_root(),
        "root (the snapshotter serves containerd as root)",
    ) {
        return;
    }
    let t = tmpdir();
    let sock = t.path().join("s.sock");
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg("umask 000; exec \"$@\"")
        .arg("sh")
        .arg(bin())
        .arg("snapshotter")
        .arg("--socket")
        .arg(&sock)
        .arg("--root")
        .arg(t.path().join("sn"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let mut child = c.spawn().unwrap();
    let t0 = Instant::now();
    while !sock.exists() && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let mode = fs::symlink_metadata(&sock).map(|m| {
        use std::os::unix::fs::PermissionsExt;
        m.permissions().mode() & 0o777
    });
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let _ = child.wait();
    assert_eq!(mode.unwrap(), 0o600);
}
