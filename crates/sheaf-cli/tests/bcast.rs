//! `sheaf bcast` with real Open MPI: 4 ranks as 2 simulated nodes, each rank
//! in its own mount and UTS namespace (its node's host name, its node's
//! directory bind-mounted on the one "node-local" path), over shared memory
//! and over TCP on loopback. Expected values come from the images
//! themselves, read with the sheaf-read library, not from bcast's report.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// A job of `nodes` simulated nodes × `per_node` ranks.
struct Cluster {
    dir: tempfile::TempDir,
    nodes: usize,
    per_node: usize,
}

impl Cluster {
    fn new(nodes: usize, per_node: usize) -> Option<Cluster> {
        if !prerequisite(
            !check_tier() && is_root(),
            "root (namespaces per rank) and mpirun",
        ) {
            return None;
        }
        let ok = Command::new("mpirun").arg("--version").output().is_ok();
        assert!(ok, "mpirun missing: `make test` installs openmpi-bin");
        let v = sheaf(["--version"]).ok().text();
        assert!(v.contains("with MPI"), "sheaf built without MPI: {v}");
        let dir = tmpdir();
        for n in 0..nodes {
            std::fs::create_dir_all(dir.path().join(format!("node{n}"))).unwrap();
        }
        std::fs::create_dir_all(dir.path().join("local")).unwrap();
        std::fs::create_dir_all(dir.path().join("shared")).unwrap();
        let wrap = dir.path().join("node.sh");
        // Rank → node; the node's own host name and local directory.
        write(
            &wrap,
            format!(
                "#!/bin/sh\nn=$((OMPI_COMM_WORLD_RANK / {per_node}))\n\
                 exec unshare --mount --uts --propagation private sh -c \
                 \"hostname simnode$n && mount --bind {d}/node$n {d}/local && exec \\\"\\$@\\\"\" sh \"$@\"\n",
                d = dir.path().display()
            )
            .as_bytes(),
        );
        chmod(&wrap, 0o755);
        Some(Cluster {
            dir,
            nodes,
            per_node,
        })
    }
    fn shared(&self, name: &str) -> PathBuf {
        self.dir.path().join("shared").join(name)
    }
    /// DEST as every rank names it.
    fn dest(&self) -> PathBuf {
        self.dir.path().join("local/p.sheaf")
    }
    /// DEST of node `n`, seen from outside.
    fn node_dest(&self, n: usize) -> PathBuf {
        self.dir.path().join(format!("node{n}/p.sheaf"))
    }
    fn node_dir(&self, n: usize) -> PathBuf {
        self.dir.path().join(format!("node{n}"))
    }
    fn command(&self, btl: &str, args: &[&std::ffi::OsStr]) -> Command {
        let mut c = Command::new("mpirun");
        c.args(["--allow-run-as-root", "--oversubscribe", "-np"])
            .arg((self.nodes * self.per_node).to_string())
            .args(["--mca", "btl", btl])
            // Loopback only, for the runtime and for MPI traffic.
            .args(["--mca", "btl_tcp_if_include", "lo"])
            .args(["--mca", "oob_tcp_if_include", "lo"])
            .arg(self.dir.path().join("node.sh"))
            .arg(bin())
            .arg("bcast")
            .args(args)
            .env("SHEAF_CACHE_DIR", self.dir.path().join("cache"))
            .stdin(std::process::Stdio::null());
        c
    }
    fn bcast(&self, btl: &str, src: &Path, extra: &[&str]) -> Out {
        let mut args: Vec<&std::ffi::OsStr> = vec!["--json".as_ref()];
        args.extend(extra.iter().map(std::ffi::OsStr::new));
        args.push(src.as_os_str());
        let dest = self.dest();
        args.push(dest.as_os_str());
        run_cmd(&mut self.command(btl, &args))
    }
    /// Files left in node directories besides p.sheaf, its lock and sig.
    fn leftovers(&self) -> Vec<String> {
        let mut v = Vec::new();
        for n in 0..self.nodes {
            for e in std::fs::read_dir(self.node_dir(n)).unwrap().flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.ends_with(".tmp") {
                    v.push(format!("node{n}/{name}"));
                }
            }
        }
        v
    }
}

fn report(o: &Out) -> serde_json::Value {
    let text = String::from_utf8_lossy(&o.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| {
            panic!("no JSON report: {}", o.describe());
        });
    serde_json::from_str(line).unwrap()
}

fn tree(dir: &Path, seed: u64, big: usize) {
    let mut rng = Rng::new(seed);
    std::fs::create_dir_all(dir.join("lib")).unwrap();
    write(&dir.join("big.bin"), &rng.bytes(big));
    for i in 0..300 {
        write(&dir.join(format!("lib/m{i}.py")), &rng.text(200 + i * 7));
    }
}

#[test]
fn every_node_gets_the_image_read_once_then_skips_then_gets_only_a_delta() {
    let Some(c) = Cluster::new(2, 2) else { return };
    let src = c.dir.path().join("src");
    tree(&src, 1, 24 << 20);
    let v1 = c.shared("pool-1.sheaf");
    build(&src, &v1, &[]);
    let v1_len = std::fs::metadata(&v1).unwrap().len();
    for btl in ["self,vader", "self,tcp"] {
        for n in 0..c.nodes {
            let _ = std::fs::remove_file(c.node_dest(n));
        }
        let o = c.bcast(btl, &v1, &[]).ok();
        let r = report(&o);
        for n in 0..c.nodes {
            assert_eq!(
                std::fs::read(c.node_dest(n)).unwrap(),
                std::fs::read(&v1).unwrap(),
                "{btl}: node {n}"
            );
        }
        assert_eq!(r["nodes"], 2, "{btl}");
        assert_eq!(r["ranks"], 4, "{btl}");
        // Read once: the whole image, plus at most the index (64 KiB tail +
        // header) a second time while listing objects.
        let read = r["bytes_read"].as_u64().unwrap();
        assert!(
            read >= v1_len && read <= v1_len + (72 << 10),
            "{btl}: read {read} of {v1_len}"
        );
        assert!(c.leftovers().is_empty(), "{:?}", c.leftovers());
    }

    // Repeat: nothing but the header and tail is read, nothing changes.
    let before = std::fs::metadata(c.node_dest(0))
        .unwrap()
        .modified()
        .unwrap();
    let o = c.bcast("self,vader", &v1, &[]).ok();
    let r = report(&o);
    assert_eq!(r["nodes_present"], 2);
    assert!(r["bytes_read"].as_u64().unwrap() <= 72 << 10, "{r}");
    assert_eq!(r["bytes_sent"], 0);
    assert_eq!(
        std::fs::metadata(c.node_dest(0))
            .unwrap()
            .modified()
            .unwrap(),
        before
    );

    // Version 2: one module changed and one file added. Node 1 also holds
    // v1; node 0 holds it only under another name in its directory.
    let mut rng = Rng::new(9);
    write(&src.join("lib/m7.py"), &rng.text(5000));
    write(&src.join("new.bin"), &rng.bytes(3 << 20));
    let v2 = c.shared("pool-2.sheaf");
    build(&src, &v2, &[]);
    std::fs::rename(c.node_dest(0), c.node_dir(0).join("pool-1.sheaf")).unwrap();
    let (new_bytes, _) = new_object_bytes(&v1, &v2);
    let o = c.bcast("self,vader", &v2, &[]).ok();
    let r = report(&o);
    for n in 0..c.nodes {
        assert_eq!(
            std::fs::read(c.node_dest(n)).unwrap(),
            std::fs::read(&v2).unwrap()
        );
    }
    let sent = r["bytes_sent"].as_u64().unwrap();
    let read = r["bytes_read"].as_u64().unwrap();
    assert!(
        sent >= new_bytes && sent as f64 <= 1.1 * new_bytes as f64,
        "sent {sent}, new objects {new_bytes}"
    );
    assert!(
        read as f64 <= 1.1 * new_bytes as f64 + (72 << 10) as f64,
        "read {read}, new objects {new_bytes}"
    );
}

#[test]
fn a_corrupt_source_fails_every_rank_with_one_line_and_leaves_nothing() {
    let Some(c) = Cluster::new(2, 2) else { return };
    let src = c.dir.path().join("src");
    tree(&src, 2, 4 << 20);
    let img = c.shared("bad.sheaf");
    build(&src, &img, &[]);
    // Flip a byte inside the data (the random file's blocks come first).
    let mut b = std::fs::read(&img).unwrap();
    b[1 << 20] ^= 0x40;
    std::fs::write(&img, &b).unwrap();
    let o = c.bcast("self,vader", &img, &[]);
    assert_ne!(o.code, 0, "{}", o.describe());
    o.no_panic();
    let lines: Vec<&str> = o
        .stderr
        .lines()
        .filter(|l| l.starts_with("sheaf: error:"))
        .collect();
    assert_eq!(lines.len(), 4, "one line per rank: {}", o.describe());
    assert!(lines.iter().all(|l| *l == lines[0]), "{lines:?}");
    assert!(lines[0].contains("failed verification"), "{}", lines[0]);
    for n in 0..c.nodes {
        assert!(!c.node_dest(n).exists());
    }
    assert!(c.leftovers().is_empty(), "{:?}", c.leftovers());

    // Truncated: not an image at all.
    std::fs::write(&img, &b[..b.len() / 2]).unwrap();
    let o = c.bcast("self,vader", &img, &[]);
    assert_ne!(o.code, 0);
    let lines: Vec<&str> = o
        .stderr
        .lines()
        .filter(|l| l.starts_with("sheaf: error:"))
        .collect();
    assert_eq!(lines.len(), 4, "{}", o.describe());
    assert!(lines[0].contains("bad.sheaf"), "{}", lines[0]);
    assert!(c.leftovers().is_empty() && !c.node_dest(0).exists());
}

#[test]
fn an_unsigned_image_under_a_signature_policy_is_refused_before_writing() {
    let Some(c) = Cluster::new(2, 1) else { return };
    let src = c.dir.path().join("src");
    tree(&src, 3, 1 << 20);
    let img = c.shared("unsigned.sheaf");
    build(&src, &img, &[]);
    let key = c.dir.path().join("key");
    let line = sheaf([
        "keygen".as_ref(),
        key.as_os_str(),
        "--identity".as_ref(),
        "ops".as_ref(),
    ])
    .ok()
    .text();
    let signers = c.dir.path().join("allowed_signers");
    write(&signers, line.trim().as_bytes());
    let o = c.bcast(
        "self,vader",
        &img,
        &[
            "--require-signature",
            "--signers",
            signers.to_str().unwrap(),
        ],
    );
    assert_ne!(o.code, 0);
    assert!(o.stderr.contains("signature"), "{}", o.describe());
    for n in 0..c.nodes {
        let entries: Vec<_> = std::fs::read_dir(c.node_dir(n))
            .unwrap()
            .flatten()
            .collect();
        assert!(entries.is_empty(), "node {n} was written to: {entries:?}");
    }
    // Signed, the same broadcast goes through.
    sheaf([
        "sign".as_ref(),
        img.as_os_str(),
        "--key".as_ref(),
        key.as_os_str(),
    ])
    .ok();
    c.bcast(
        "self,vader",
        &img,
        &[
            "--require-signature",
            "--signers",
            signers.to_str().unwrap(),
        ],
    )
    .ok();
    assert!(c.node_dest(1).exists());
}

#[test]
fn a_rank_killed_mid_broadcast_ends_the_job_within_seconds_and_the_next_run_succeeds() {
    let Some(c) = Cluster::new(2, 2) else { return };
    let src = c.dir.path().join("src");
    tree(&src, 4, 160 << 20);
    let img = c.shared("big.sheaf");
    build(&src, &img, &[]);
    let dest = c.dest();
    // Small chunks, one in flight: slow enough to be caught midway.
    let args: Vec<&std::ffi::OsStr> = vec![
        "--chunk".as_ref(),
        "64K".as_ref(),
        "--window".as_ref(),
        "1".as_ref(),
        img.as_os_str(),
        dest.as_os_str(),
    ];
    let mut child = c
        .command("self,vader", &args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until node 1's copy is being written, then kill one rank there.
    let t = Instant::now();
    let tmp_seen = || {
        std::fs::read_dir(c.node_dir(1))
            .unwrap()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
    };
    while !tmp_seen() {
        assert!(t.elapsed() < Duration::from_secs(60), "no copy in progress");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(200));
    let pids = Command::new("pgrep")
        .args(["-f", &format!("{} bcast --chunk", bin())])
        .output()
        .unwrap();
    let pids: Vec<i32> = String::from_utf8_lossy(&pids.stdout)
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    assert!(pids.len() >= 4, "ranks: {pids:?}");
    let killed = Instant::now();
    unsafe { libc::kill(*pids.last().unwrap(), libc::SIGKILL) };
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(10),
            "the job still runs 10 s after a rank was killed"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!status.success());
    for n in 0..c.nodes {
        assert!(
            !c.node_dest(n).exists(),
            "node {n} has a DEST from a failed job"
        );
    }
    // The next run cleans up and succeeds.
    c.bcast("self,vader", &img, &[]).ok();
    assert!(c.leftovers().is_empty(), "{:?}", c.leftovers());
    for n in 0..c.nodes {
        assert_eq!(
            std::fs::metadata(c.node_dest(n)).unwrap().len(),
            std::fs::metadata(&img).unwrap().len()
        );
    }
}

#[test]
fn without_a_launcher_it_is_a_verified_local_copy() {
    let t = tmpdir();
    let src = t.path().join("src");
    tree(&src, 5, 2 << 20);
    let img = t.path().join("a.sheaf");
    build(&src, &img, &[]);
    let dest = t.path().join("local/sub/a.sheaf");
    let o = sheaf([
        "bcast".as_ref(),
        "--json".as_ref(),
        img.as_os_str(),
        dest.as_os_str(),
    ])
    .ok();
    assert_eq!(std::fs::read(&dest).unwrap(), std::fs::read(&img).unwrap());
    assert_eq!(report(&o)["ranks"], 1);
    // A missing source: one line naming it.
    let o = sheaf([
        "bcast".as_ref(),
        t.path().join("nope.sheaf").as_os_str(),
        dest.as_os_str(),
    ])
    .fails_with(1);
    assert!(o.one_err_line().contains("nope.sheaf"));
    // A destination directory that cannot be created: one line, no panic.
    let o = sheaf([
        "bcast".as_ref(),
        img.as_os_str(),
        "/proc/sheaf-nope/a.sheaf".as_ref(),
    ])
    .fails_with(1);
    o.no_panic();
}

#[test]
fn a_url_source_whole_image_or_published_repository_reaches_every_node() {
    let Some(c) = Cluster::new(2, 2) else { return };
    let ng = common::servers::Nginx::start(&c.dir.path().join("web"));
    let src = c.dir.path().join("src");
    tree(&src, 6, 3 << 20);
    let img = ng.www.join("u.sheaf");
    build(&src, &img, &["--block-size", "256K"]);
    sheaf([
        "publish".as_ref(),
        img.as_os_str(),
        ng.www.join("repo").as_os_str(),
        "--name".as_ref(),
        "u".as_ref(),
    ])
    .ok();
    let want = std::fs::read(&img).unwrap();
    for url in [ng.url("u.sheaf"), ng.url("repo/u")] {
        for n in 0..c.nodes {
            let _ = std::fs::remove_file(c.node_dest(n));
        }
        let _ = std::fs::remove_dir_all(c.dir.path().join("cache"));
        let o = c.bcast("self,vader", Path::new(&url), &[]).ok();
        for n in 0..c.nodes {
            assert_eq!(
                std::fs::read(c.node_dest(n)).unwrap(),
                want,
                "{url}: node {n}"
            );
        }
        let r = report(&o);
        assert_eq!(r["nodes_present"], 0, "{url}");
        // Objects rank 0 fetched while opening (the ref pages) are in the
        // node cache by then and may be taken from it.
        assert!(r["objects_sent"].as_u64() <= r["objects"].as_u64(), "{url}");
        assert!(r["objects_sent"].as_u64().unwrap() > 0, "{url}");
    }
}

#[test]
fn an_s3_source_whole_image_or_published_repository_reaches_every_node() {
    let Some(c) = Cluster::new(2, 2) else { return };
    let w = common::servers::SeaweedS3::start(&c.dir.path().join("s3"));
    // A bucket name of 3 to 63 characters: weed refuses a shorter one
    // once its S3 gateway has registered with the filer (a race at start).
    w.make_bucket("bcast");
    let src = c.dir.path().join("src");
    tree(&src, 7, 3 << 20);
    let img = c.dir.path().join("u.sheaf");
    build(&src, &img, &["--block-size", "256K"]);
    w.put_file("bcast", "u.sheaf", &img);
    let aws = |cmd: &mut Command| {
        cmd.env("AWS_ACCESS_KEY_ID", common::servers::SeaweedS3::ACCESS_KEY)
            .env(
                "AWS_SECRET_ACCESS_KEY",
                common::servers::SeaweedS3::SECRET_KEY,
            )
            .env("AWS_ENDPOINT_URL", w.endpoint())
            .env("AWS_REGION", "us-east-1")
            .env_remove("AWS_PROFILE");
    };
    let mut p = cmd();
    p.args(["publish".as_ref(), img.as_os_str()])
        .args(["s3://bcast/repo", "--name", "u"]);
    aws(&mut p);
    run_cmd(&mut p).ok();
    let want = std::fs::read(&img).unwrap();
    for url in ["s3://bcast/u.sheaf", "s3://bcast/repo/u"] {
        for n in 0..c.nodes {
            let _ = std::fs::remove_file(c.node_dest(n));
        }
        let _ = std::fs::remove_dir_all(c.dir.path().join("cache"));
        let dest = c.dest();
        let mut b = c.command(
            "self,vader",
            &["--json".as_ref(), url.as_ref(), dest.as_os_str()],
        );
        aws(&mut b);
        let o = run_cmd(&mut b).ok();
        for n in 0..c.nodes {
            assert_eq!(
                std::fs::read(c.node_dest(n)).unwrap(),
                want,
                "{url}: node {n}"
            );
        }
        let r = report(&o);
        assert_eq!(r["nodes_present"], 0, "{url}");
        assert!(r["objects_sent"].as_u64().unwrap() > 0, "{url}");
    }
}
