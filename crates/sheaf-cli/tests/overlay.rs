//! Union mounts and the writable overlay, on real FUSE mounts: OCI layer
//! rules across several images, what ordinary programs do in an overlay
//! (Python's file API, git, make, pip, tar), POSIX semantics with
//! pjdfstest, and the one-writer rule.

mod common;

use common::*;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

/// `sheaf mount IMAGES... MP [EXTRA...]` (common's [`mount`]) with
/// environment variables for the mount's process.
fn mount_env(images: &[&Path], mp: &Path, extra: &[&str], env: &[(&str, &str)]) -> Mounted {
    let mut c = mount_cmd(images, mp, extra);
    c.envs(env.iter().copied());
    let m = Mounted::run(&mut c, mp);
    assert!(is_mounted(mp));
    m
}

fn files(root: &Path, list: &[(&str, &str)]) {
    for (p, data) in list {
        let p = root.join(p);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        write(&p, data.as_bytes());
    }
}

/// Run `sh -c SCRIPT sh ARGS...` in `dir`, asserting success.
fn sh(dir: &Path, script: &str) -> String {
    let o = Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@example.org")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@example.org")
        .env("HOME", dir)
        .output()
        .expect("sh");
    assert!(
        o.status.success(),
        "{script}: {}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Paths under `root`, relative, sorted, with a type mark.
fn listing(root: &Path) -> Vec<String> {
    let mut v: Vec<String> = walk(root)
        .iter()
        .filter(|p| !p.is_empty())
        .map(|p| {
            let md = fs::symlink_metadata(join(root, p)).unwrap();
            let mark = if md.is_dir() {
                "/"
            } else if md.file_type().is_symlink() {
                "@"
            } else {
                ""
            };
            format!("{}{mark}", lossy(p))
        })
        .collect();
    v.sort();
    v
}

/// Three layers: whiteouts, an opaque directory, a file over a directory
/// and a directory over a file; the union mount shows exactly the merged
/// view (as `sheaf ls` computes it) and never a whiteout.
#[test]
fn a_union_of_three_layers_follows_the_oci_rules() {
    let t = tmpdir();
    let (a, b, c) = (t.path().join("a"), t.path().join("b"), t.path().join("c"));
    files(
        &a,
        &[
            ("keep/x", "a"),
            ("gone", "a"),
            ("opq/old1", "a"),
            ("opq/sub/old2", "a"),
            ("fileoverdir/inner", "a"),
            ("diroverfile", "a"),
            ("back", "a"),
            ("shared/a-only", "a"),
        ],
    );
    files(
        &b,
        &[
            (".wh.gone", ""),
            ("opq/.wh..wh..opq", ""),
            ("opq/new", "b"),
            ("fileoverdir", "b is a file"),
            ("diroverfile/now-a-dir", "b"),
            (".wh.back", ""),
            ("shared/b-only", "b"),
            ("keep/x", "b wins"),
        ],
    );
    files(
        &c,
        &[("back", "c brings it back"), ("shared/.wh.a-only", "")],
    );
    let imgs: Vec<PathBuf> = ["a", "b", "c"]
        .iter()
        .map(|n| t.path().join(format!("{n}.sheaf")))
        .collect();
    for (src, img) in [&a, &b, &c].iter().zip(&imgs) {
        build(src, img, &["-q"]);
    }
    let refs: Vec<&Path> = imgs.iter().map(|p| p.as_path()).collect();
    let mp = t.path().join("mp");
    let m = mount(&refs, &mp, &[]);
    let want = vec![
        "back",
        "diroverfile/",
        "diroverfile/now-a-dir",
        "fileoverdir",
        "keep/",
        "keep/x",
        "opq/",
        "opq/new",
        "shared/",
        "shared/b-only",
    ];
    assert_eq!(listing(&mp), want);
    assert_eq!(fs::read(mp.join("keep/x")).unwrap(), b"b wins");
    assert_eq!(fs::read(mp.join("back")).unwrap(), b"c brings it back");
    assert_eq!(fs::read(mp.join("fileoverdir")).unwrap(), b"b is a file");
    // Hidden names cannot be reached either.
    for p in [
        "gone",
        "opq/old1",
        "opq/sub",
        ".wh.gone",
        "shared/a-only",
        "shared/.wh.a-only",
    ] {
        assert!(fs::symlink_metadata(mp.join(p)).is_err(), "{p} is visible");
    }
    // The same view as `sheaf ls` of the stack.
    let stack = imgs
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(",");
    let o = sheaf(["ls", &stack, "-R"]).ok();
    let mut ls: Vec<String> = ls_r_paths(&o.text())
        .lines()
        .map(|l| l.to_string())
        .collect();
    ls.sort();
    let mut plain: Vec<String> = want
        .iter()
        .map(|w| w.trim_end_matches('/').into())
        .collect();
    plain.sort();
    assert_eq!(ls, plain);
    // Read-only: the kernel refuses writes.
    let e = fs::write(mp.join("new"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS));
    // `--upper` writes nothing into a directory that does not exist.
    m.umount();
    let missing = t.path().join("missing");
    let o = run_cmd(&mut mount_cmd(
        &[&imgs[0]],
        &mp,
        &["--upper", missing.to_str().unwrap()],
    ))
    .fails_with(1);
    assert!(o.one_err_line().contains("missing"), "{}", o.describe());
    assert!(!is_mounted(&mp));
}

/// Python's file API over a lower tree: every change lands in the upper
/// directory, the images never change, a second writer is refused while
/// read-only mounts of the same images work, and the changes survive a
/// remount. With kernel passthrough of upper files (a root server) and
/// without.
#[test]
fn the_overlay_does_what_programs_do() {
    overlay_programs(&[]);
}

#[test]
fn the_overlay_does_what_programs_do_without_passthrough() {
    overlay_programs(&[("SHEAF_NO_PASSTHROUGH", "1")]);
}

fn overlay_programs(env: &[(&str, &str)]) {
    let t = tmpdir();
    let base = t.path().join("base");
    files(
        &base,
        &[
            ("f", "lower file\n"),
            ("trunc", "0123456789"),
            ("mm", "abcdefgh"),
            ("ren/src", "moved"),
            ("ren/over", "replaced"),
            ("tree/a/b/c", "deep"),
            ("tree/top", "top"),
            ("del/x", "x"),
            ("empty-after/y", "y"),
            ("attrs", "attrs"),
            ("mixed", "lower"),
        ],
    );
    let img = t.path().join("base.sheaf");
    build(&base, &img, &["-q"]);
    let digest = sheaf(["root".as_ref(), img.as_os_str()]).ok().text();
    let (mp, up) = (t.path().join("mp"), t.path().join("up"));
    fs::create_dir_all(&up).unwrap();
    let m = mount_env(&[&img], &mp, &["--upper", up.to_str().unwrap()], env);
    let script = r#"
import os, mmap, sys
os.chdir(sys.argv[1])
with open("f", "a") as f: f.write("appended\n")
assert open("f").read() == "lower file\nappended\n"
os.truncate("trunc", 4); assert open("trunc").read() == "0123"
with open("mm", "r+b") as f:
    m = mmap.mmap(f.fileno(), 0); m[0:3] = b"XYZ"; m.flush(); m.close()
assert open("mm").read() == "XYZdefgh"
os.rename("ren/src", "ren/over"); assert open("ren/over").read() == "moved"
assert not os.path.exists("ren/src")
os.rename("tree", "tree2")
assert open("tree2/a/b/c").read() == "deep" and not os.path.exists("tree")
os.mkdir("tree"); assert os.listdir("tree") == []
os.unlink("del/x"); os.rmdir("del"); assert not os.path.exists("del")
os.unlink("empty-after/y"); os.rmdir("empty-after")
os.mkdir("empty-after"); assert os.listdir("empty-after") == []
os.symlink("f", "sl"); assert os.readlink("sl") == "f"
os.link("f", "hl"); assert os.stat("hl").st_ino == os.stat("f").st_ino
assert os.stat("f").st_nlink == 2
os.chmod("attrs", 0o640); assert os.stat("attrs").st_mode & 0o777 == 0o640
os.chown("attrs", 1234, 5678); assert (os.stat("attrs").st_uid, os.stat("attrs").st_gid) == (1234, 5678)
os.utime("attrs", ns=(1_000_000_123, 2_000_000_456)); assert os.stat("attrs").st_mtime_ns == 2_000_000_456
os.setxattr("attrs", "user.k", b"v"); assert os.getxattr("attrs", "user.k") == b"v"
os.removexattr("attrs", "user.k"); assert "user.k" not in os.listxattr("attrs")
fd = os.open("new", os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o600)
os.write(fd, b"fresh"); os.fsync(fd); os.close(fd)
assert os.stat("new").st_mode & 0o777 == 0o600
# A reader of the lower file stays open while a writer copies it up, then
# new opens see the copy (the kernel allows no passthrough and cached
# opens of one file at once: sheaf must pick compatible modes).
r = open("mixed", "rb")
with open("mixed", "ab") as w: w.write(b"+")
assert open("mixed", "rb").read() == b"lower+"
with open("mixed", "r+b") as w2:
    w2.seek(0, 2); w2.write(b"!")
    m = mmap.mmap(w2.fileno(), 0); m[0:1] = b"L"; m.flush(); m.close()
r.close()
with open("mixed", "ab") as w: w.write(b"?")
assert open("mixed", "rb").read() == b"Lower+!?", open("mixed", "rb").read()
for bad in (".wh.x", ".wh..wh..opq"):
    try: open(bad, "w"); raise SystemExit("created " + bad)
    except OSError: pass
"#;
    let o = run_cmd(
        Command::new("/usr/bin/python3")
            .arg("-c")
            .arg(script)
            .arg(&mp),
    );
    o.ok();
    let before = listing(&mp);
    // One writer per upper directory; readers of the images are welcome.
    let mp2 = t.path().join("mp2");
    let o = run_cmd(&mut mount_cmd(
        &[&img],
        &mp2,
        &["--upper", up.to_str().unwrap()],
    ))
    .fails_with(1);
    assert!(o.one_err_line().contains("in use"), "{}", o.describe());
    assert!(!is_mounted(&mp2));
    let r = mount(&[&img], &mp2, &[]);
    assert_eq!(fs::read(mp2.join("f")).unwrap(), b"lower file\n");
    r.umount();
    m.umount();
    // The upper directory holds the changes and the whiteouts.
    let upper = listing(&up);
    for w in ["ren/.wh.src", "tree/.wh..wh..opq", "tree2/a/b/c", "f", "hl"] {
        assert!(
            upper.iter().any(|p| p.trim_end_matches('/') == w),
            "{w} not in {upper:?}"
        );
    }
    assert!(upper.iter().any(|p| p == ".wh.del"), "{upper:?}");
    assert!(
        !upper.iter().any(|p| p.contains(".wh..sheaf-")),
        "{upper:?}"
    );
    // The image is untouched.
    assert_eq!(
        sheaf(["root".as_ref(), img.as_os_str()]).ok().text(),
        digest
    );
    sheaf(["check".as_ref(), img.as_os_str()]).ok();
    // A remount shows the same tree.
    let m = mount(&[&img], &mp, &["--upper", up.to_str().unwrap()]);
    assert_eq!(listing(&mp), before);
    assert_eq!(fs::read(mp.join("mm")).unwrap(), b"XYZdefgh");
    m.umount();
}

/// pjdfstest (the Rust POSIX test suite from crates.io) on the overlay,
/// in a directory copied up from the image.
#[test]
fn pjdfstest_passes_on_the_overlay() {
    if !prerequisite(is_root(), "root, for pjdfstest") {
        return;
    }
    let t = tmpdir();
    fs::set_permissions(t.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let base = t.path().join("base");
    files(&base, &[("work/seed", "lower")]);
    let img = t.path().join("base.sheaf");
    build(&base, &img, &["-q"]);
    let (mp, up) = (t.path().join("mp"), t.path().join("up"));
    fs::create_dir_all(&up).unwrap();
    let m = mount(
        &[&img],
        &mp,
        &["--upper", up.to_str().unwrap(), "-o", "allow_other"],
    );
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/pjdfstest.sh");
    let report = t.path().join("pjdfstest.json");
    let o = run_cmd(
        Command::new("bash")
            .arg(&script)
            .arg(mp.join("work"))
            .arg("--json")
            .arg(&report),
    );
    eprintln!("{}", o.stderr);
    eprintln!("{}", o.text());
    o.ok();
    let r: serde_json::Value = serde_json::from_slice(&fs::read(&report).unwrap()).unwrap();
    let (passed, failed) = (r["passed"].as_u64().unwrap(), r["failed"].as_u64().unwrap());
    eprintln!(
        "pjdfstest on the overlay: {passed} passed, {failed} failed, {} skipped",
        r["skipped"]
    );
    assert!(r["complete"].as_bool().unwrap_or(false), "{r}");
    assert_eq!(failed, 0, "failures: {}", r["failures"]);
    assert!(passed > 300, "{r}");
    m.umount();
}

/// git, make, pip and tar inside an overlay on an image of part of tree K
/// (the Linux source); the committed layer stacked on the image shows
/// exactly what the overlay showed.
#[test]
fn real_programs_in_an_overlay_commit_to_the_same_tree() {
    let Some(k) = real_tree("K") else {
        return;
    };
    let t = tmpdir();
    let base = t.path().join("base");
    fs::create_dir_all(&base).unwrap();
    // A few thousand files: kernel/, lib/ and fs/ext4 of the Linux source.
    for sub in ["kernel", "lib", "fs/ext4"] {
        let dst = base.join(sub);
        fs::create_dir_all(dst.parent().unwrap()).unwrap();
        let st = Command::new("cp")
            .arg("-a")
            .arg(k.join(sub))
            .arg(&dst)
            .status()
            .unwrap();
        assert!(st.success());
    }
    let img = t.path().join("k.sheaf");
    build(&base, &img, &["-q"]);
    let (mp, up) = (t.path().join("mp"), t.path().join("up"));
    fs::create_dir_all(&up).unwrap();
    let m = mount(&[&img], &mp, &["--upper", up.to_str().unwrap()]);
    // git: a repository of the whole tree, then a change it notices.
    sh(&mp, "git init -q && git add -A && git commit -qm base");
    sh(&mp, "echo '/* changed */' >> kernel/fork.c");
    let st = sh(&mp, "git status --porcelain");
    assert_eq!(st.trim(), "M kernel/fork.c");
    sh(
        &mp,
        "git commit -qam change && git log --oneline | wc -l | grep -qx 2",
    );
    // make: a small C project next to the sources.
    files(
        &mp,
        &[
            (
                "proj/hello.c",
                "#include <stdio.h>\nint main(void){puts(\"hello from the overlay\");return 0;}\n",
            ),
            ("proj/Makefile", "hello: hello.c\n\tcc -O1 -o $@ $<\n"),
        ],
    );
    sh(&mp.join("proj"), "make -s");
    assert_eq!(
        sh(&mp.join("proj"), "./hello").trim(),
        "hello from the overlay"
    );
    // pip: install a wheel (built here, no network) into the tree.
    let wheel = t.path().join("sheafdemo-1.0-py3-none-any.whl");
    let mk = r#"
import sys, zipfile, hashlib, base64
files = {
  "sheafdemo/__init__.py": b"GREETING = 'installed in an overlay'\n",
  "sheafdemo-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: sheafdemo\nVersion: 1.0\n",
  "sheafdemo-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
rec = []
for n, d in files.items():
    h = base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b"=").decode()
    rec.append(f"{n},sha256={h},{len(d)}")
rec.append("sheafdemo-1.0.dist-info/RECORD,,")
with zipfile.ZipFile(sys.argv[1], "w") as z:
    for n, d in files.items(): z.writestr(n, d)
    z.writestr("sheafdemo-1.0.dist-info/RECORD", "\n".join(rec) + "\n")
"#;
    run_cmd(
        Command::new("/usr/bin/python3")
            .arg("-c")
            .arg(mk)
            .arg(&wheel),
    )
    .ok();
    let o = run_cmd(
        Command::new("/usr/bin/python3")
            .args([
                "-m",
                "pip",
                "install",
                "-q",
                "--no-index",
                "--no-deps",
                "--target",
            ])
            .arg(mp.join("site"))
            .arg(&wheel),
    );
    o.ok();
    let o = run_cmd(
        Command::new("/usr/bin/python3")
            .args(["-c", "import sheafdemo; print(sheafdemo.GREETING)"])
            .env("PYTHONPATH", mp.join("site")),
    );
    assert_eq!(o.ok().text().trim(), "installed in an overlay");
    // tar -x over existing files (replacing lower ones) and new ones.
    let other = t.path().join("other");
    files(
        &other,
        &[
            ("lib/string.c", "/* replaced by tar */\n"),
            ("kernel/new-from-tar.c", "/* new */\n"),
        ],
    );
    let tarball = t.path().join("x.tar");
    let st = Command::new("tar")
        .arg("-cf")
        .arg(&tarball)
        .arg("-C")
        .arg(&other)
        .args(["lib", "kernel"])
        .status()
        .unwrap();
    assert!(st.success());
    sh(&mp, &format!("tar -xf {}", tarball.display()));
    assert_eq!(
        fs::read(mp.join("lib/string.c")).unwrap(),
        b"/* replaced by tar */\n"
    );
    // Snapshot the view, commit, and compare base + layer with it.
    let snap = t.path().join("snap");
    fs::create_dir_all(&snap).unwrap();
    let st = Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", mp.display()))
        .arg(&snap)
        .status()
        .unwrap();
    assert!(st.success());
    m.umount();
    let layer = t.path().join("layer.sheaf");
    sheaf([
        "commit".as_ref(),
        up.as_os_str(),
        "-o".as_ref(),
        layer.as_os_str(),
        "-q".as_ref(),
    ])
    .ok();
    let mp2 = t.path().join("mp2");
    let m2 = mount(&[&img, &layer], &mp2, &[]);
    let cmp = Cmp {
        dir_mtime: false,
        root: false,
        nlink: false,
        hardlinks: false,
        ..Cmp::all()
    };
    assert_same_tree(&snap, &mp2, cmp);
    // And git still sees a clean tree in the committed view.
    let o = run_cmd(
        Command::new("git")
            .args(["-c", "safe.directory=*", "-C"])
            .arg(&mp2)
            .args(["log", "--oneline"]),
    );
    assert_eq!(o.ok().text().lines().count(), 2);
    m2.umount();
    let ino = fs::metadata(&img).unwrap().ino();
    assert!(ino > 0);
}

/// 25,000 new files (more than this machine's 20,000 descriptor limit)
/// and a directory tree of them: the server keeps no descriptor per file.
#[test]
fn many_files_in_an_overlay_hold_no_descriptors() {
    let t = tmpdir();
    let base = t.path().join("base");
    files(&base, &[("seed", "x")]);
    let img = t.path().join("base.sheaf");
    build(&base, &img, &["-q"]);
    let (mp, up) = (t.path().join("mp"), t.path().join("up"));
    fs::create_dir_all(&up).unwrap();
    let m = mount(&[&img], &mp, &["--upper", up.to_str().unwrap()]);
    let script = r#"
import os, sys
os.chdir(sys.argv[1])
for d in range(25):
    os.mkdir(f"d{d}")
    for f in range(1000):
        with open(f"d{d}/f{f}", "w") as fh: fh.write("x")
n = sum(len(os.listdir(f"d{d}")) for d in range(25))
assert n == 25000, n
"#;
    run_cmd(
        Command::new("/usr/bin/python3")
            .arg("-c")
            .arg(script)
            .arg(&mp),
    )
    .ok();
    let stats = json(&sheaf(["stats".as_ref(), "--json".as_ref(), mp.as_os_str()]).ok());
    let pid = stats["pid"].as_u64().unwrap();
    let fds = fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count();
    assert!(fds < 200, "the server holds {fds} descriptors");
    assert!(stats["nodes"].as_u64().unwrap() > 25000, "{stats}");
    // The text report says what a union has and leaves out what it has
    // not (it printed "read from image 0 B in 0 requests").
    let text = sheaf(["stats".as_ref(), mp.as_os_str()]).ok().text();
    assert!(
        text.contains("(writable)")
            && text.contains("nodes held")
            && !text.contains("read from image"),
        "{text}"
    );
    m.umount();
}
