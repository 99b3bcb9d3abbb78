//! The README's commands, run as a reader would type them.
//!
//! The quick start runs verbatim, in order, in a home directory of its own
//! (only `make install` is left to tests/install.rs). Every other command
//! line of the README's `sh` blocks either runs here — the example host
//! `files.example.org` replaced by a real nginx on loopback, the squid in
//! `--proxy` by a real squid, `/srv/www` by a directory the test serves — or
//! is listed in `ELSEWHERE` with the test that covers it. A new README line
//! that is neither fails this test, so the README cannot drift from what
//! sheaf does.

mod common;
use common::servers::{Nginx, Squid};
use common::*;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

const README: &str = include_str!("../../../README.md");

/// Lines not run here (matched by a substring), with where they are tested.
const ELSEWHERE: &[(&str, &str)] = &[
    ("make install", "tests/install.rs (make install, DESTDIR)"),
    ("make deb", "tests/install.rs (make deb, dpkg -i)"),
    (
        "make build && pip install",
        "crates/sheaf-py/tests/test_wheel.py",
    ),
    (
        "mount -t fuse.sheaf",
        "tests/mount.rs (needs /sbin/mount.fuse.sheaf)",
    ),
    (
        "sheaf mount --kernel",
        "tests/kernel.rs (root: the kernel's EROFS)",
    ),
    ("ssh://", "tests/ssh.rs (a real sshd)"),
    ("s3://", "tests/s3.rs (SeaweedFS with authentication)"),
    ("sheaf pool build", "tests/pool.rs"),
    (
        "srun",
        "tests/bcast.rs and tests/cluster.rs (mpirun; no Slurm here)",
    ),
    ("sheaf pool load", "tests/pool.rs (real Lmod)"),
    ("docker://", "tests/containers.rs (a real registry)"),
    (
        "sheaf snapshotter",
        "tests/snapshotter.rs (a real containerd)",
    ),
];

/// The `sh` blocks of the README: (the heading above, the command lines,
/// continuation lines joined).
fn sh_blocks() -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    let mut heading = String::new();
    let mut block: Option<Vec<&str>> = None;
    for line in README.lines() {
        match &mut block {
            None if line.starts_with("## ") => heading = line[3..].to_string(),
            None if line.trim() == "```sh" => block = Some(Vec::new()),
            None => {}
            Some(b) if line.trim() == "```" => {
                out.push((heading.clone(), sh_lines(std::mem::take(b))));
                block = None;
            }
            Some(b) => b.push(line),
        }
    }
    assert!(block.is_none(), "README: an sh block is not closed");
    out
}

/// Write a file, making its directories.
fn put(p: &Path, data: &[u8]) {
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    write(p, data);
}

/// Write the files the README's examples name.
fn fixture(work: &Path, home: &Path) {
    let ds = work.join("dataset");
    put(&ds.join("sub/notes.txt"), b"the notes of the quick start\n");
    put(&ds.join("sub/results.csv"), b"id,value\n1,0.5\n2,0.25\n");
    for i in 0..40 {
        put(
            &ds.join(format!("runs/run{i:02}.txt")),
            format!("run {i}\n").repeat(100 + i).as_bytes(),
        );
    }
    symlink(b"sub/notes.txt", &ds.join("latest"));
    let tar = Command::new("sh")
        .arg("-c")
        .arg("tar -cf - -C dataset . | zstd -q -o release.tar.zst")
        .current_dir(work)
        .status()
        .unwrap();
    assert!(tar.success(), "tar | zstd");
    // Layers: base.sheaf, and project.sheaf that adds a file and hides one.
    let layer = work.join("project-layer");
    put(&layer.join("sub/added.txt"), b"added by the project\n");
    put(&layer.join("runs/.wh.run00.txt"), b"");
    for (src, img) in [
        ("dataset", "base.sheaf"),
        ("project-layer", "project.sheaf"),
    ] {
        build(&work.join(src), &work.join(img), &["-q"]).ok();
    }
    fs::write(work.join("files.txt"), "sub/notes.txt\nsub/results.csv\n").unwrap();
    fs::write(
        work.join("analyse.py"),
        "import os, sys\nprint(sorted(os.listdir(sys.argv[1])))\n",
    )
    .unwrap();
    fs::write(work.join("Makefile"), "all:\n\tls /opt/sw/sub\n").unwrap();
    // The signing key and allowed_signers the "Sign and verify" block names.
    let ssh = home.join(".ssh");
    fs::create_dir_all(&ssh).unwrap();
    run_cmd(
        Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-C", "me", "-f"])
            .arg(ssh.join("id_ed25519")),
    )
    .ok();
    let public = fs::read_to_string(ssh.join("id_ed25519.pub")).unwrap();
    fs::write(
        work.join("allowed_signers"),
        format!("me@example.org {public}"),
    )
    .unwrap();
    for mp in ["data", "p", "w"] {
        fs::create_dir_all(home.join(mp)).unwrap();
    }
}

#[test]
fn the_readme_commands_run_as_written() {
    if !mounts_allowed() {
        return;
    }
    prerequisite(
        Command::new("ssh-keygen").arg("-?").output().is_ok(),
        "ssh-keygen (openssh-client)",
    );
    let t = tmpdir();
    // The quick start and the task blocks each start from the fixture in
    // a directory and home of their own, as two readers would.
    let www = t.path().join("www");
    let places =
        ["quick", "tasks"].map(|p| (t.path().join(p).join("work"), t.path().join(p).join("home")));
    for d in places.iter().flat_map(|(w, h)| [w, h]).chain([&www]) {
        fs::create_dir_all(d).unwrap();
    }
    for (work, home) in &places {
        fixture(work, home);
    }
    let nginx = Nginx::start_with_root(t.path(), &www);
    let squid = Squid::start(t.path());
    let bin_dir = Path::new(bin()).parent().unwrap().to_path_buf();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap());
    let cache = t.path().join("cache");
    let mountpoints: Vec<_> = places
        .iter()
        .flat_map(|(_, home)| ["data", "p", "w"].map(|m| home.join(m)))
        .collect();
    let umount_all = || {
        for mp in &mountpoints {
            if is_mounted(mp) {
                sheaf(["umount".as_ref(), mp.as_os_str()]).ok();
            }
        }
    };
    let run = |(work, home): &(PathBuf, PathBuf), line: &str| -> Out {
        let line = line
            .replace("https://files.example.org", &nginx.base())
            .replace("http://squid:3128", &squid.proxy_url())
            .replace("/srv/www", &www.to_string_lossy());
        // Mounts the line does not use are taken down first (a reader
        // unmounts between examples); a line that uses a mount keeps it.
        if !line.contains("~/") || line.contains("sheaf mount") {
            umount_all();
        }
        let mut c = Command::new("bash");
        c.args(["-eo", "pipefail", "-c", &line])
            .current_dir(work)
            .env("HOME", home)
            .env("PATH", &path)
            .env("SHEAF_CACHE_DIR", &cache)
            .stdin(std::process::Stdio::null());
        for v in [
            "SHEAF_PROXY",
            "http_proxy",
            "https_proxy",
            "SOURCE_DATE_EPOCH",
        ] {
            c.env_remove(v);
        }
        let o = run_cmd(&mut c);
        assert!(
            o.code == 0,
            "README line failed (exit {}): {line}\nstdout: {}\nstderr: {}",
            o.code,
            o.text(),
            o.stderr
        );
        o
    };

    let blocks = sh_blocks();
    // The quick start, verbatim and in order.
    let (_, quick) = blocks
        .iter()
        .find(|(h, _)| h == "Quick start")
        .expect("README has a Quick start block");
    assert!(quick.len() <= 15, "the quick start is at most 15 lines");
    let mut outputs = Vec::new();
    for line in quick {
        if line.starts_with("make install") {
            continue;
        }
        outputs.push((line.clone(), run(&places[0], line)));
    }
    let said = |needle: &str| {
        outputs
            .iter()
            .find(|(l, _)| l.contains(needle))
            .unwrap_or_else(|| panic!("quick start has a line with {needle}"))
            .1
            .text()
    };
    assert_eq!(said("sheaf cat"), "the notes of the quick start\n");
    assert_eq!(said("ls ~/data/sub"), "notes.txt\nresults.csv\n");
    assert!(said("sheaf ls -l").contains("notes.txt"));
    // 46 entries: the root, sub/ and its 2 files, runs/ and its 40, latest.
    let info = said("sheaf info");
    assert!(info.contains("46"), "info counts 46 entries:\n{info}");
    assert!(!is_mounted(&mountpoints[0]), "the quick start unmounts");

    // Every other line: run here, or tested elsewhere.
    let mut ran = 0;
    for (heading, lines) in &blocks {
        if heading == "Quick start" {
            continue;
        }
        for line in lines {
            if ELSEWHERE.iter().any(|(s, _)| line.contains(s)) {
                continue;
            }
            let o = run(&places[1], line);
            ran += 1;
            // Spot checks whose expected values come from the fixture.
            if line.starts_with("sheaf find dataset.sheaf /sub -name '*.txt'") {
                let notes = places[1].0.join("dataset/sub/notes.txt");
                let size = fs::metadata(notes).unwrap().len();
                assert_eq!(o.text(), format!("{size} /sub/notes.txt\n"));
            }
            if line.starts_with("sheaf ls -R base.sheaf,project.sheaf") {
                assert!(o.text().contains("added.txt") && !o.text().contains("run00.txt"));
            }
            if line.starts_with("sheaf run --mount dataset.sheaf:/data") {
                assert_eq!(o.text(), "['latest', 'runs', 'sub']\n");
            }
        }
        umount_all();
    }
    eprintln!("{ran} README lines ran here");
    assert!(ran >= 30, "only {ran} README lines ran");
    // What the Layers block committed and merged reads back.
    let flat = places[1].0.join("flat.sheaf");
    let merged = sheaf(["cat", &flat.to_string_lossy(), "sub/notes.txt"]);
    assert_eq!(merged.ok().text(), "the notes of the quick start\n");
}
