//! `s3://BUCKET/KEY` against a real S3 server on loopback: SeaweedFS
//! (`weed server -s3`, authentication on; scripts/deps.sh installs it).
//! A whole image put as one object and a repository written by `sheaf
//! publish … s3://` read back (ls, cat, mount) equal to the source; a wrong
//! secret, a missing bucket and a missing key each end in one line naming
//! the bucket and key, without the secret; a server restart during a read
//! is only a wait; `run --image` takes a container image from a bucket;
//! tree P reads the same bytes over S3 as over HTTP and a full read of it
//! waits out an 8 s outage.

mod common;

use common::servers::SeaweedS3;
use common::*;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// A `sheaf` command that reaches `w` with its credentials (and no AWS
/// setting of the machine's: HOME is a directory without `.aws`).
fn s3cmd(w: &SeaweedS3, home: &Path) -> Command {
    let mut c = cmd();
    s3env(&mut c, w, home);
    c
}

/// The environment of a `sheaf` that reaches `w` as its only S3 service.
fn s3env(c: &mut Command, w: &SeaweedS3, home: &Path) {
    for v in [
        "AWS_PROFILE",
        "AWS_DEFAULT_PROFILE",
        "AWS_SESSION_TOKEN",
        "AWS_ENDPOINT_URL_S3",
        "AWS_CONFIG_FILE",
        "AWS_SHARED_CREDENTIALS_FILE",
        "AWS_NO_SIGN_REQUEST",
        "AWS_S3_FORCE_PATH_STYLE",
        "AWS_DEFAULT_REGION",
    ] {
        c.env_remove(v);
    }
    c.env("HOME", home)
        .env("AWS_ACCESS_KEY_ID", SeaweedS3::ACCESS_KEY)
        .env("AWS_SECRET_ACCESS_KEY", SeaweedS3::SECRET_KEY)
        .env("AWS_ENDPOINT_URL", w.endpoint())
        .env("AWS_REGION", "us-east-1");
}

fn run(mut c: Command, args: &[&str]) -> Out {
    c.args(args);
    run_cmd(&mut c)
}

struct Fixture {
    t: tempfile::TempDir,
    w: SeaweedS3,
    src: PathBuf,
    img: PathBuf,
    home: PathBuf,
}

/// weed with bucket `sheaf`; a tree built with 256 KiB blocks (many
/// objects) put whole as `sheaf/images/img.sheaf` and published as
/// `sheaf/repo/img`.
fn setup() -> Fixture {
    let ok = Command::new(servers_program("weed"))
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "prerequisite missing: weed (SeaweedFS), which scripts/deps.sh installs"
    );
    let t = tmpdir();
    let w = SeaweedS3::start(t.path());
    w.make_bucket("sheaf");
    let src = t.path().join("src");
    fs::create_dir_all(&src).unwrap();
    small_tree(&src, 3);
    let mut rng = Rng::new(41);
    write(&src.join("big.bin"), &rng.bytes(3 << 20));
    write(&src.join("text.txt"), &rng.text(1 << 20));
    let img = t.path().join("img.sheaf");
    build(&src, &img, &["--block-size", "256K", "-f"]);
    w.put_file("sheaf", "images/img.sheaf", &img);
    let home = t.path().join("home");
    fs::create_dir_all(&home).unwrap();
    let f = Fixture {
        t,
        w,
        src,
        img,
        home,
    };
    let o = run(
        f.cmd(),
        &[
            "publish",
            f.img.to_str().unwrap(),
            "s3://sheaf/repo",
            "--name",
            "img",
            "--json",
        ],
    )
    .ok();
    let r = json(&o);
    assert_eq!(r["index"], "s3://sheaf/repo/img", "{r}");
    assert!(r["objects_written"].as_u64().unwrap() > 10, "{r}");
    f
}

fn servers_program(name: &str) -> PathBuf {
    common::servers::program(name)
}

impl Fixture {
    fn cmd(&self) -> Command {
        s3cmd(&self.w, &self.home)
    }

    /// `sheaf mount URL MP ARGS...` reaching this fixture's service
    /// (common's [`mount`]).
    fn mount(&self, url: &str, mp: &Path, args: &[&str]) -> Mounted {
        let mut c = mount_cmd(&[url], mp, args);
        s3env(&mut c, &self.w, &self.home);
        Mounted::run(&mut c, mp)
    }
}

const WHOLE: &str = "s3://sheaf/images/img.sheaf";
const REPO: &str = "s3://sheaf/repo/img";

#[test]
fn a_whole_image_and_a_published_repository_read_back_equal_to_the_source() {
    let f = setup();
    let big = fs::read(f.src.join("big.bin")).unwrap();
    for url in [WHOLE, REPO] {
        let ls = run(f.cmd(), &["ls", url]).ok().text();
        assert!(
            ls.contains("big.bin") && ls.contains("text.txt"),
            "{url}: {ls}"
        );
        let got = run(f.cmd(), &["cat", url, "big.bin"]).ok().stdout;
        assert!(got == big, "{url}: cat big.bin gave other bytes");
        let found = run(f.cmd(), &["find", url, "-name", "big.bin"]).ok().text();
        assert_eq!(found.trim(), "/big.bin", "{url}");
    }
    // Publishing again writes no object, only the index.
    let o = run(
        f.cmd(),
        &[
            "publish",
            f.img.to_str().unwrap(),
            "s3://sheaf/repo/",
            "--name",
            "img",
            "--json",
        ],
    )
    .ok();
    let r = json(&o);
    assert_eq!(r["objects_written"], 0, "{r}");
    assert!(r["objects_reused"].as_u64().unwrap() > 10, "{r}");
    if !prerequisite(!check_tier() && is_root(), "root (FUSE mounts)") {
        return;
    }
    for (url, form) in [(WHOLE, "image"), (REPO, "repository")] {
        let spec = format!("{url}:/data");
        let o = run(f.cmd(), &["run", "-m", &spec, "--", "cat", "/data/big.bin"]).ok();
        assert!(o.stdout == big, "{url}: sheaf run read other bytes");
        let mp = f.t.path().join(format!("m-{form}"));
        let m = f.mount(url, &mp, &[]);
        assert_tree_eq(&m.mp, &f.src);
        let s = m.stats();
        assert_eq!(s["remote"]["remote_form"], form, "{s}");
        assert!(s["remote"]["s3_bytes"].as_u64().unwrap() > 0, "{s}");
        let text = s.to_string();
        assert!(!text.contains(SeaweedS3::SECRET_KEY), "{text}");
        let mounts = fs::read_to_string("/proc/mounts").unwrap();
        assert!(!mounts.contains(SeaweedS3::SECRET_KEY));
        m.umount();
    }
}

#[test]
fn a_wrong_secret_a_missing_bucket_and_a_missing_key_each_give_one_line() {
    let f = setup();
    let check = |mut c: Command, url: &str, names: &[&str], what: &str| {
        c.args(["ls", url, "--timeout", "10"]);
        let t0 = Instant::now();
        let o = run_cmd(&mut c).fails_with(1);
        assert!(t0.elapsed() < Duration::from_secs(8), "{what}: waited");
        let line = o.one_err_line().to_string();
        for n in names {
            assert!(line.contains(n), "{what}: {line:?} does not name {n}");
        }
        assert!(line.contains(what), "{what}: {line:?}");
        for secret in [SeaweedS3::SECRET_KEY, "wrongSecret"] {
            assert!(!line.contains(secret), "{line}");
        }
        line
    };
    let mut c = f.cmd();
    c.env("AWS_SECRET_ACCESS_KEY", "wrongSecret");
    let l = check(c, REPO, &["s3://sheaf/repo/img"], "access denied");
    assert!(l.contains("AWS_SECRET_ACCESS_KEY"), "{l}");
    check(
        f.cmd(),
        "s3://nosuchbucket/x.sheaf",
        &["nosuchbucket"],
        "no such bucket",
    );
    check(
        f.cmd(),
        "s3://sheaf/images/nope.sheaf",
        &["sheaf", "images/nope.sheaf"],
        "no such key",
    );
    // A store that accepts connections but never answers: an error once
    // --timeout has passed, not a hang.
    f.w.freeze(true);
    let t0 = Instant::now();
    let o = run(f.cmd(), &["ls", WHOLE, "--timeout", "3"]).fails_with(1);
    let took = t0.elapsed();
    f.w.freeze(false);
    assert!(
        took >= Duration::from_millis(2500) && took < Duration::from_secs(10),
        "{took:?}"
    );
    assert!(
        o.one_err_line().contains("gave up after"),
        "{}",
        o.describe()
    );
    // No credentials at all: anonymous, which this server refuses.
    let mut c = f.cmd();
    c.env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY");
    let l = check(c, WHOLE, &["s3://sheaf/images/img.sheaf"], "access denied");
    assert!(l.contains("anonymous"), "{l}");
    // Credentials from a profile in ~/.aws, as the AWS tools take them.
    let aws = f.home.join(".aws");
    fs::create_dir_all(&aws).unwrap();
    write(
        &aws.join("credentials"),
        format!(
            "[lab]\naws_access_key_id = {}\naws_secret_access_key = {}\n",
            SeaweedS3::ACCESS_KEY,
            SeaweedS3::SECRET_KEY
        )
        .as_bytes(),
    );
    write(
        &aws.join("config"),
        format!(
            "[profile lab]\nregion = us-east-1\nendpoint_url = {}\n",
            f.w.endpoint()
        )
        .as_bytes(),
    );
    let mut c = f.cmd();
    c.env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .env_remove("AWS_ENDPOINT_URL")
        .env("AWS_PROFILE", "lab");
    let ls = run(c, &["ls", REPO]).ok().text();
    assert!(ls.contains("big.bin"), "{ls}");
}

#[test]
fn a_server_restart_during_a_read_is_only_a_wait() {
    let mut f = setup();
    if !prerequisite(!check_tier() && is_root(), "root (FUSE mounts)") {
        return;
    }
    let big = fs::read(f.src.join("big.bin")).unwrap();
    let mp = f.t.path().join("m");
    let m = f.mount(
        REPO,
        &mp,
        &[
            "--timeout",
            "90",
            "--no-cache",
            "-o",
            "prefetch_metadata=off",
        ],
    );
    f.w.stop();
    let p = m.mp.join("big.bin");
    let reader = std::thread::spawn(move || fs::read(p));
    std::thread::sleep(Duration::from_secs(8));
    assert!(
        !reader.is_finished(),
        "the reader did not wait for the server"
    );
    f.w.restart();
    let got = reader.join().unwrap().expect("a read across a restart");
    assert!(got == big, "wrong bytes after the restart");
    let s = m.stats();
    assert!(
        s["remote"]["s3_retries"].as_u64().unwrap() >= 3,
        "stats do not show the wait: {s}"
    );
}

/// Put every file under `dir` as `bucket/prefix/REL`.
fn put_tree(w: &SeaweedS3, bucket: &str, prefix: &str, dir: &Path, rel: &str) {
    for e in fs::read_dir(dir.join(rel)).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let r = if rel.is_empty() {
            name
        } else {
            format!("{rel}/{name}")
        };
        if e.file_type().unwrap().is_dir() {
            put_tree(w, bucket, prefix, dir, &r);
        } else {
            w.put_file(bucket, &format!("{prefix}/{r}"), &dir.join(&r));
        }
    }
}

#[test]
fn a_pool_location_in_a_bucket_is_listed_and_loads() {
    let f = setup();
    if !prerequisite(!check_tier() && is_root(), "root (FUSE mounts)") {
        return;
    }
    let pool = f.t.path().join("pool");
    sheaf(["pool".as_ref(), "init".as_ref(), pool.as_os_str()]).ok();
    let bin = pool.join("install/hello/1.0/bin");
    fs::create_dir_all(&bin).unwrap();
    write(&bin.join("hello"), b"#!/bin/sh\necho hello from s3\n");
    chmod(&bin.join("hello"), 0o755);
    fs::create_dir_all(pool.join("modulefiles/hello")).unwrap();
    write(
        &pool.join("modulefiles/hello/1.0.lua"),
        b"local root = myFileName():match(\"(.*)/modulefiles/\")\n\
          prepend_path(\"PATH\", pathJoin(root, \"install/hello/1.0/bin\"))\n",
    );
    let built = f.t.path().join("build/sw/1.0.sheaf");
    fs::create_dir_all(built.parent().unwrap()).unwrap();
    sheaf([
        "pool".as_ref(),
        "build".as_ref(),
        pool.as_os_str(),
        "-o".as_ref(),
        built.as_os_str(),
        "--name".as_ref(),
        "sw/1.0".as_ref(),
    ])
    .ok();
    // A location written locally, then copied into the bucket as is.
    let loc = f.t.path().join("loc");
    sheaf([
        "pool".as_ref(),
        "publish".as_ref(),
        built.as_os_str(),
        loc.as_os_str(),
    ])
    .ok();
    put_tree(&f.w, "sheaf", "pools", &loc, "");
    let conf = f.t.path().join("config.toml");
    write(
        &conf,
        format!(
            "[pools]\nlocations = [\"s3://sheaf/pools\"]\nlocal = \"{}\"\nmounts = \"{}\"\n",
            f.t.path().join("local").display(),
            f.t.path().join("mnt").display()
        )
        .as_bytes(),
    );
    let mut c = f.cmd();
    c.env("SHEAF_CONFIG", &conf);
    let av = run(c, &["pool", "avail", "--json"]).ok();
    let offers = json(&av);
    assert_eq!(offers[0]["pool"], "sw/1.0", "{}", av.describe());
    assert_eq!(offers[0]["source"], "s3://sheaf/pools/sw/1.0", "{offers}");
    let mp = f.t.path().join("mnt/sw/1.0");
    let mut c = f.cmd();
    c.env("SHEAF_CONFIG", &conf);
    let o = run(c, &["pool", "load", "sw/1.0", "--sh"]);
    let _guard = Mounted::adopt(&mp);
    assert_eq!(o.code, 0, "{}", o.describe());
    let ran = run_cmd(&mut Command::new(mp.join("install/hello/1.0/bin/hello"))).ok();
    assert_eq!(ran.text().trim(), "hello from s3");
    assert_eq!(
        fs::read(f.t.path().join("local/sw/1.0.sheaf")).unwrap(),
        fs::read(&built).unwrap(),
        "the node-local copy is the built image"
    );
    sheaf(["umount".as_ref(), mp.as_os_str()]).ok();
}

#[test]
fn import_publishes_layers_links_and_the_record_into_a_bucket() {
    let f = setup();
    let lay = common::oci::layout(f.t.path());
    let o = run(
        f.cmd(),
        &[
            "import",
            &lay.oci("gz"),
            "--publish",
            "s3://sheaf/ctr",
            "--json",
        ],
    )
    .ok();
    let rep = json(&o);
    let record = rep["record"].as_str().unwrap().to_string();
    assert!(
        record.starts_with("s3://sheaf/ctr/image-sha256-") && record.ends_with(".json"),
        "{rep}"
    );
    let layers = rep["layers"].as_array().unwrap().clone();
    assert!(!layers.is_empty(), "{rep}");
    for l in &layers {
        assert_eq!(l["reused"], false, "{l}");
        let url = format!("s3://sheaf/ctr/{}", l["layer"].as_str().unwrap());
        run(f.cmd(), &["check", &url]).ok();
    }
    // The links and the record are in the bucket, as for a directory.
    let (st, body) = common::servers::http_get(
        f.w.filer_port,
        &format!("/buckets/sheaf/ctr/{}", record.rsplit('/').next().unwrap()),
    );
    assert_eq!(st, 200, "{body}");
    assert!(body.contains("\"layers\""), "{body}");
    // The zstd encoding of the same layers: all already there.
    let o = run(
        f.cmd(),
        &[
            "import",
            &lay.oci("zst"),
            "--publish",
            "s3://sheaf/ctr",
            "--json",
        ],
    )
    .ok();
    let rep = json(&o);
    assert_eq!(rep["fetched_bytes"], 0, "{rep}");
    assert!(
        rep["layers"]
            .as_array()
            .unwrap()
            .iter()
            .all(|l| l["reused"] == true),
        "{rep}"
    );
}

/// Counts, in the kernel (an iptables rule on loopback), the bytes a
/// server sends from one TCP port; removed when dropped.
struct PortCounter {
    port: u16,
}

impl PortCounter {
    fn rule(port: u16) -> Vec<String> {
        format!("OUTPUT -o lo -p tcp --sport {port} -m comment --comment sheaf-test-{port}")
            .split(' ')
            .map(String::from)
            .collect()
    }

    fn new(port: u16) -> PortCounter {
        let o = run_cmd(
            Command::new("iptables")
                .args(["-w", "-I"])
                .args(Self::rule(port)),
        );
        assert_eq!(
            o.code,
            0,
            "iptables (scripts/deps.sh installs it): {}",
            o.describe()
        );
        PortCounter { port }
    }

    /// Bytes (IP packets, headers included) sent from the port so far.
    fn bytes(&self) -> u64 {
        let o = run_cmd(Command::new("iptables").args(["-w", "-L", "OUTPUT", "-v", "-x", "-n"]))
            .ok()
            .text();
        let tag = format!("sheaf-test-{}", self.port);
        let line = o.lines().find(|l| l.contains(&tag)).expect("the rule");
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }
}

impl Drop for PortCounter {
    fn drop(&mut self) {
        let _ = Command::new("iptables")
            .args(["-w", "-D"])
            .args(Self::rule(self.port))
            .status();
    }
}

/// Tree P (the Python stack) published to the bucket and, byte for byte the
/// same objects, to a directory nginx serves. A cold `import numpy,
/// scipy.linalg, pandas` through an `s3://` mount reads within 5% of what
/// the same import reads through an `http://` mount (both counted by the
/// kernel: bytes the server's port sent; no node cache); and a
/// full extraction of the tree from the bucket, with the server stopped for
/// 8 s in the middle, ends without an error and equal to the source.
#[test]
fn tree_p_over_s3_reads_what_http_reads_and_waits_out_an_outage() {
    let mut f = setup();
    if !prerequisite(!check_tier() && is_root(), "root (FUSE mounts)") {
        return;
    }
    let Some(p) = real_tree("P") else { return };
    let img = f.t.path().join("P.sheaf");
    build(&p, &img, &["-f"]);
    let www = f.t.path().join("www");
    fs::create_dir_all(&www).unwrap();
    for dest in ["s3://sheaf/trees", www.join("trees").to_str().unwrap()] {
        run(
            f.cmd(),
            &["publish", img.to_str().unwrap(), dest, "--name", "P"],
        )
        .ok();
    }
    let nginx = common::servers::Nginx::start_with_root(f.t.path(), &www);
    let import = "import numpy, scipy.linalg, pandas";
    let port_of = |url: &str| -> u16 {
        let hostport = url.split('/').nth(2).unwrap();
        hostport.rsplit(':').next().unwrap().parse().unwrap()
    };
    let cold_import = |url: &str, server: &str, tag: &str| -> u64 {
        let counter = PortCounter::new(port_of(server));
        let mp = f.t.path().join(format!("m-{tag}"));
        let m = f.mount(url, &mp, &["--no-cache"]);
        let before = counter.bytes();
        let o = run_cmd(
            Command::new("python3")
                .args(["-c", import])
                .env("PYTHONPATH", &m.mp)
                .env("PYTHONDONTWRITEBYTECODE", "1"),
        );
        assert_eq!(o.code, 0, "{tag}: {}", o.describe());
        let n = counter.bytes() - before;
        m.umount();
        n
    };
    let over_s3 = cold_import("s3://sheaf/trees/P", &f.w.endpoint(), "s3");
    let over_http = cold_import(&nginx.url("trees/P"), &nginx.base(), "http");
    assert!(
        over_http > 5_000_000,
        "the import read only {over_http} bytes over HTTP"
    );
    let ratio = over_s3 as f64 / over_http as f64;
    eprintln!(
        "cold import: {over_s3} bytes sent by the S3 gateway, {over_http} by nginx ({ratio:.3}x)"
    );
    assert!(
        (0.95..=1.05).contains(&ratio),
        "a cold import read {over_s3} bytes over S3 and {over_http} over HTTP ({ratio:.3}x)"
    );

    // The outage: extraction starts, the server goes away for 8 s.
    let out = f.t.path().join("out");
    let mut c = f.cmd();
    c.args([
        "extract",
        "s3://sheaf/trees/P",
        "--no-cache",
        "--timeout",
        "120",
        "-C",
    ])
    .arg(&out);
    let started = Instant::now();
    let extract = std::thread::spawn(move || run_cmd(&mut c));
    // Stop once the extraction is under way (some files written).
    while fs::read_dir(&out).map_or(0, |d| d.count()) == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the extraction did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    f.w.stop();
    std::thread::sleep(Duration::from_secs(8));
    let finished_early = extract.is_finished();
    f.w.restart();
    let o = extract.join().unwrap();
    assert_eq!(o.code, 0, "{}", o.describe());
    eprintln!(
        "full extraction across an 8 s outage: {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert!(
        !finished_early,
        "the extraction ended before the server came back (too small a tree to test the outage)"
    );
    let d = run_cmd(
        Command::new("diff")
            .arg("-r")
            .arg("--no-dereference")
            .arg(&p)
            .arg(&out),
    );
    assert_eq!(d.code, 0, "the extracted tree differs:\n{}", d.describe());
}

/// `run --image s3://…`: a container root (the host's /bin/sh and the
/// libraries it links, and a config the way `import --flatten` writes it)
/// read from the bucket; its process prints a file of the image.
#[test]
fn run_image_takes_a_container_image_from_a_bucket() {
    let f = setup();
    if !prerequisite(!check_tier() && is_root(), "root (FUSE mounts)") {
        return;
    }
    let root = f.t.path().join("rootfs");
    fs::create_dir_all(root.join("bin")).unwrap();
    fs::create_dir_all(root.join("etc")).unwrap();
    fs::create_dir_all(root.join(".sheaf.d")).unwrap();
    fs::copy("/bin/sh", root.join("bin/sh")).unwrap();
    let ldd = run_cmd(Command::new("ldd").arg("/bin/sh")).ok().text();
    for lib in ldd.split_whitespace().filter(|w| w.starts_with('/')) {
        let to = root.join(lib.trim_start_matches('/'));
        fs::create_dir_all(to.parent().unwrap()).unwrap();
        fs::copy(lib, &to).unwrap();
    }
    let greeting = "hello from a bucket";
    write(
        &root.join("etc/greeting"),
        format!("{greeting}\n").as_bytes(),
    );
    write(
        &root.join(".sheaf.d/config.json"),
        br#"{"architecture":"amd64","os":"linux","config":{"Cmd":["/bin/sh","-c","read x < /etc/greeting; echo \"$x\""]},"rootfs":{"type":"layers","diff_ids":[]}}"#,
    );
    let img = f.t.path().join("root.sheaf");
    build(&root, &img, &["-f"]);
    f.w.put_file("sheaf", "containers/root.sheaf", &img);
    let o = run(
        f.cmd(),
        &["run", "--image", "s3://sheaf/containers/root.sheaf"],
    )
    .ok();
    assert_eq!(o.text(), format!("{greeting}\n"));
    // A key that is not there: a failure in one line naming it.
    let o = run(
        f.cmd(),
        &["run", "--image", "s3://sheaf/containers/none.sheaf"],
    );
    assert_ne!(o.code, 0);
    assert!(
        o.one_err_line().contains("containers/none.sheaf"),
        "{}",
        o.describe()
    );
}
