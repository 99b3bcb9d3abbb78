//! The command line a Unix user expects: `ls` as GNU ls prints the same
//! mounted tree, `find` from relative start paths, usage mistakes answered
//! with what is missing, Ctrl-C as 130, and a server that is not there
//! refused at once.

mod common;

use common::*;
use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// A tree with the kinds `ls -l` shows: sizes from bytes to a few hundred
/// KiB, an old file, a symlink, a hidden file, another owner.
fn tree(root: &Path) {
    fs::create_dir_all(root.join("sub/deep")).unwrap();
    fs::write(root.join("a.txt"), "hello\n").unwrap();
    let mut rng = Rng::new(7);
    fs::write(root.join("big.bin"), rng.bytes(150_000)).unwrap();
    fs::write(root.join("mid.bin"), rng.bytes(5_000)).unwrap();
    fs::write(root.join(".hidden"), "x").unwrap();
    std::os::unix::fs::symlink("a.txt", root.join("link")).unwrap();
    fs::write(root.join("sub/old"), "").unwrap();
    set_mtime(&root.join("sub/old"), 1_577_934_245, 0);
    if is_root() {
        lchown(&root.join("a.txt"), 1000, 1000);
    }
}

/// [`tree`] in `dir/src`, built into `dir/t.sheaf`: (src, image).
fn built(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let src = dir.join("src");
    tree(&src);
    let img = dir.join("t.sheaf");
    sheaf([
        "build".as_ref(),
        src.as_os_str(),
        "-o".as_ref(),
        img.as_os_str(),
    ])
    .ok();
    (src, img)
}

#[test]
fn ls_prints_what_gnu_ls_prints_on_the_mounted_image() {
    if !mounts_allowed() {
        return;
    }
    let sc = Scenario::new(tree).image_name("t.sheaf").build(&[]);
    let (img, mp) = (&sc.img, &sc.mp);
    let _m = sc.mount(&[]);
    for (flags, path) in [
        (vec!["-l"], "."),
        (vec!["-lh"], "."),
        (vec!["-la"], "sub"),
        (vec!["-lA"], "."),
        (vec!["-ln"], "."),
        (vec!["-l", "--time-style=long-iso"], "."),
        (vec!["-l", "--time-style=full-iso"], "sub"),
        (vec!["-ld"], "sub"),
        (vec![], "."),
        (vec!["-A"], "."),
    ] {
        let gnu = run_cmd(
            Command::new("ls")
                .args(&flags)
                .arg(path)
                .current_dir(mp)
                .env("LC_ALL", "C")
                .env("TZ", "UTC"),
        )
        .ok()
        .text();
        let ours = run_cmd(
            cmd()
                .arg("ls")
                .args(&flags)
                .arg(img)
                .arg(path)
                .env("LC_ALL", "C")
                .env("TZ", "UTC"),
        )
        .ok()
        .text();
        // ls -la of a subdirectory: ".." is the image's own parent.
        assert_eq!(ours, gnu, "sheaf ls {flags:?} {path}");
    }
    // --json: one array, sizes and names as stat(2) of the mount says.
    let v = json(&sheaf(["ls".as_ref(), "--json".as_ref(), img.as_os_str()]).ok());
    let big = v
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["path"] == "big.bin")
        .unwrap();
    assert_eq!(big["size"], 150_000);
    assert_eq!(big["type"], "file");
    let link = v
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["path"] == "link")
        .unwrap();
    assert_eq!(link["target"], "a.txt");
    assert!(v.as_array().unwrap().iter().all(|e| e["path"] != ".hidden"));
}

#[test]
fn find_starts_from_relative_paths_and_prints_them_as_given() {
    let t = tmpdir();
    let src = t.path().join("src");
    tree(&src);
    let img = t.path().join("t.sheaf");
    build(&src, &img, &[]);
    let i = img.to_str().unwrap();
    let sorted = |o: Out| {
        let mut v: Vec<String> = o.text().lines().map(String::from).collect();
        v.sort();
        v
    };
    assert_eq!(
        sorted(sheaf(["find", i, "sub"]).ok()),
        ["sub", "sub/deep", "sub/old"]
    );
    assert_eq!(
        sorted(sheaf(["find", i, "/sub"]).ok()),
        ["/sub", "/sub/deep", "/sub/old"]
    );
    assert_eq!(
        sorted(sheaf(["find", i, "sub", "-type", "f"]).ok()),
        ["sub/old"]
    );
    // GNU find on the source, from the same relative start, agrees.
    let gnu = run_cmd(Command::new("find").arg("sub").current_dir(&src)).ok();
    assert_eq!(sorted(sheaf(["find", i, "sub"]).ok()), sorted(gnu));
    // An expression without a start path still starts at the root.
    let o = sorted(sheaf(["find", i, "-name", "old"]).ok());
    assert_eq!(o, ["/sub/old"]);
}

#[test]
fn the_first_screen_says_what_sheaf_is_and_what_most_people_run() {
    for args in [vec!["--help"], vec![]] {
        let o = sheaf(&args);
        let text = if args.is_empty() {
            o.stderr.clone()
        } else {
            o.text()
        };
        assert!(
            text.starts_with("sheaf: pack a directory tree"),
            "{args:?}: {}",
            &text[..text.len().min(200)]
        );
        assert!(text.contains("Most used:"), "{args:?}");
    }
    // The remote flags where they apply, not in every command's help.
    for (cmd, shown) in [
        (vec!["info"], true),
        (vec!["mount"], true),
        (vec!["pool", "load"], true),
        (vec!["keygen"], false),
        (vec!["shell-init"], false),
        (vec!["umount"], false),
        (vec!["pool", "init"], false),
    ] {
        let mut args = cmd.clone();
        args.push("--help");
        let help = sheaf(&args).ok().text();
        assert_eq!(help.contains("--timeout"), shown, "sheaf {cmd:?} --help");
    }
    // Still accepted there (a script may pass them everywhere).
    sheaf(["--timeout", "5", "keygen", "--help"]).ok();
}

#[test]
fn usage_mistakes_say_what_is_missing() {
    let t = tmpdir();
    let src = t.path().join("src");
    tree(&src);
    let img = t.path().join("t.sheaf");
    build(&src, &img, &[]);
    let i = img.to_str().unwrap();
    let o = sheaf(["mount", i]);
    assert_eq!(o.code, 2, "{}", o.describe());
    assert!(
        o.one_err_line().contains("missing the mount point"),
        "{}",
        o.describe()
    );
    let o = sheaf(["run", "-m", i, "--", "true"]);
    assert_ne!(o.code, 0);
    assert!(
        o.one_err_line().contains("missing :DEST"),
        "{}",
        o.describe()
    );
    // A sheaf image given to build: what to use instead.
    let o = sheaf(["build", i, "-o", t.path().join("y.sheaf").to_str().unwrap()]);
    assert_eq!(o.code, 1);
    assert!(
        o.one_err_line().contains("is a sheaf image"),
        "{}",
        o.describe()
    );
    assert!(o.one_err_line().contains("sheaf merge"), "{}", o.describe());
    // An output directory that does not exist is named.
    let o = sheaf([
        "build",
        src.to_str().unwrap(),
        "-o",
        t.path().join("no/dir/y.sheaf").to_str().unwrap(),
    ]);
    assert_eq!(o.code, 1);
    assert!(
        o.one_err_line().contains("y.sheaf: no such directory")
            && o.one_err_line().contains("mkdir -p"),
        "{}",
        o.describe()
    );
    assert!(!t.path().join("no").exists());
    // A stack where one image is read: one line saying what to do (cat
    // reads stacks: cat_and_merge_take_a_stack...).
    let stack = format!("{i},{i}");
    for cmd in ["check", "extract"] {
        let o = sheaf([cmd, stack.as_str()]);
        assert_eq!(o.code, 1, "{cmd}: {}", o.describe());
        assert!(
            o.one_err_line().contains("sheaf merge"),
            "{cmd}: {}",
            o.describe()
        );
    }
    // `ls -h` is human sizes, not help; --help still is help.
    let o = sheaf(["ls", "-lh", i]).ok();
    assert!(
        o.text()
            .lines()
            .any(|l| l.contains(" 147K ") && l.ends_with(" big.bin")),
        "{}",
        o.text()
    );
    assert!(sheaf(["ls", "--help"])
        .ok()
        .text()
        .contains("--human-readable"));
}

#[test]
fn import_with_o_alone_writes_one_merged_image() {
    if !prerequisite(oci::have("skopeo"), "skopeo") {
        return;
    }
    let t = tmpdir();
    let lay = oci::layout(t.path());
    let out = t.path().join("app.sheaf");
    sheaf(["import", &lay.oci("gz"), "-o", out.to_str().unwrap(), "-q"]).ok();
    let o = sheaf(["cat", out.to_str().unwrap(), "/.sheaf.d/config.json"]).ok();
    assert!(o.text().contains("\"architecture\""), "{}", o.text());
}

#[test]
fn ctrl_c_exits_130_and_a_closed_port_fails_at_once() {
    let t = tmpdir();
    // A build of a large stream, interrupted.
    let mut child = cmd()
        .args(["build", "-", "-o"])
        .arg(t.path().join("x.sheaf"))
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    use std::io::Write;
    // A tar stream that never ends: headers of zero-length files.
    let writer = std::thread::spawn(move || {
        let mut b = tar::Builder::new(&mut stdin);
        for n in 0.. {
            let mut h = tar::Header::new_gnu();
            h.set_size(0);
            h.set_mode(0o644);
            h.set_cksum();
            if b.append_data(&mut h, format!("f{n}"), std::io::empty())
                .is_err()
            {
                break;
            }
        }
        drop(b);
        let _ = stdin.flush();
    });
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let o = child.wait_with_output().unwrap();
    let _ = writer.join();
    assert_eq!(
        o.status.code(),
        Some(130),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // Nothing listening: refused on the first request, not waited for.
    let port = servers::free_port();
    let start = Instant::now();
    let o = sheaf([
        "--timeout",
        "30",
        "info",
        &format!("http://127.0.0.1:{port}/x.sheaf"),
    ]);
    assert_eq!(o.code, 1, "{}", o.describe());
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "waited {:?}: {}",
        start.elapsed(),
        o.describe()
    );
    assert!(
        o.one_err_line().contains("nothing is listening"),
        "{}",
        o.describe()
    );
}

#[test]
fn verify_uses_the_site_signers_as_mount_does() {
    let t = tmpdir();
    let src = t.path().join("src");
    tree(&src);
    let img = t.path().join("t.sheaf");
    build(&src, &img, &[]);
    let (key, signers) = ssh_signer(t.path());
    sheaf_in([
        "sign".as_ref(),
        img.as_os_str(),
        "-k".as_ref(),
        key.as_os_str(),
    ])
    .ok();
    let conf = t.path().join("config.toml");
    fs::write(
        &conf,
        format!("[signatures]\nsigners = \"{}\"\n", signers.display()),
    )
    .unwrap();
    run_cmd(cmd().env("SHEAF_CONFIG", &conf).arg("verify").arg(&img)).ok();
    let none = t.path().join("empty.toml");
    fs::write(&none, "").unwrap();
    let o = run_cmd(cmd().env("SHEAF_CONFIG", &none).arg("verify").arg(&img));
    assert_ne!(o.code, 0);
    assert!(o.one_err_line().contains("--signers"), "{}", o.describe());
}

#[test]
fn extract_says_which_file_exists_and_leaves_nothing_for_a_missing_path() {
    let t = tmpdir();
    let src = t.path().join("src");
    tree(&src);
    let img = t.path().join("t.sheaf");
    build(&src, &img, &[]);
    let out = t.path().join("out");
    run_cmd(cmd().arg("extract").arg(&img).arg("-C").arg(&out)).ok();
    // Again into the same place: the full path of the first file there.
    let o = run_cmd(cmd().arg("extract").arg(&img).arg("-C").arg(&out));
    assert_eq!(o.code, 1, "{}", o.describe());
    let line = o.one_err_line();
    assert!(
        line.contains(&out.display().to_string()) && line.contains("already exists"),
        "{line}"
    );
    // A path the image lacks: refused, and no empty DIR made.
    let fresh = t.path().join("fresh");
    let o = run_cmd(
        cmd()
            .arg("extract")
            .arg(&img)
            .arg("nope")
            .arg("-C")
            .arg(&fresh),
    );
    assert_eq!(o.code, 1, "{}", o.describe());
    assert!(o.one_err_line().contains("nope"), "{}", o.describe());
    assert!(!fresh.exists(), "an empty target was left behind");
    // '..' on the command line is the user's argument, said so.
    let o = run_cmd(
        cmd()
            .arg("extract")
            .arg(&img)
            .arg("sub/../a.txt")
            .arg("-C")
            .arg(&fresh),
    );
    assert_eq!(o.code, 1, "{}", o.describe());
    assert!(
        o.one_err_line().contains("without '..'"),
        "{}",
        o.describe()
    );
    assert!(!fresh.exists());
}

/// A server that answered once and then stops answering is waited for up
/// to --timeout; on a terminal a live line says so.
#[test]
fn waiting_for_a_server_shows_a_live_line_on_a_terminal() {
    use common::hostile::{Hostile, Reply};
    let t = tmpdir();
    let src = t.path().join("src");
    tree(&src);
    let img = t.path().join("t.sheaf");
    build(&src, &img, &[]);
    let bytes = std::sync::Arc::new(fs::read(&img).unwrap());
    // The first request (the probe) is answered; every later one dropped.
    let srv = Hostile::start(move |n, _| {
        if n == 0 {
            Reply::File(bytes.clone())
        } else {
            Reply::Drop
        }
    });
    let cmdline = format!(
        "SHEAF_CACHE_DIR={} {} --timeout 3 cat {} /a.txt",
        t.path().join("cache").display(),
        bin(),
        srv.url("/t.sheaf")
    );
    let start = Instant::now();
    let o = run_cmd(
        Command::new("script")
            .args(["-qec", &cmdline, "/dev/null"])
            .stdin(std::process::Stdio::null()),
    );
    let out = o.text();
    assert!(
        start.elapsed() >= Duration::from_secs(3),
        "did not wait: {out:?}"
    );
    let host = format!("127.0.0.1:{}", srv.port);
    assert!(
        out.contains(&format!("sheaf: waiting for {host}: ")) && out.contains(" of 3 (--timeout)"),
        "{out:?}"
    );
    assert!(out.contains("gave up after"), "{out:?}");
    // Not on a terminal: no live line, just the error.
    let o = sheaf(["--timeout", "2", "cat", &srv.url("/t.sheaf"), "/a.txt"]);
    assert!(!o.stderr.contains("waiting for"), "{}", o.describe());
}

/// One way to say the compression ratio: file data over image size, the
/// same in build's summary, commit's and info's.
#[test]
fn build_and_info_say_the_ratio_the_same_way() {
    let t = tmpdir();
    let src = t.path().join("src");
    tree(&src);
    let img = t.path().join("t.sheaf");
    let o = run_cmd(cmd().arg("build").arg(&src).arg("-o").arg(&img));
    assert_eq!(o.code, 0, "{}", o.describe());
    // Expected from the tree and the file: regular files' bytes (and the
    // symlink's target, which an image counts as data too, if it does)
    // over the image's length, as info's JSON also gives them.
    let info = json(&sheaf(["info".as_ref(), "--json".as_ref(), img.as_os_str()]).ok());
    let logical = info["logical_bytes"].as_u64().unwrap();
    let files: u64 = ["a.txt", "big.bin", "mid.bin", ".hidden"]
        .iter()
        .map(|f| fs::metadata(src.join(f)).unwrap().len())
        .sum();
    assert!(logical >= files, "{logical} < {files}");
    let image = fs::metadata(&img).unwrap().len();
    let want = format!("{:.2}x", logical as f64 / image as f64);
    assert!(
        o.stderr.contains(&format!("(ratio {want})")),
        "{}",
        o.stderr
    );
    let text = sheaf(["info".as_ref(), img.as_os_str()]).ok().text();
    assert!(text.contains(&format!("ratio:        {want} ")), "{text}");
}

/// `sheaf mount --json` says what is mounted once it is ready: the serving
/// process and the root digest, as `sheaf stats` and `sheaf root` give them.
#[test]
fn mount_json_names_the_server_and_the_root() {
    if !mounts_allowed() {
        return;
    }
    let sc = Scenario::new(tree).image_name("t.sheaf").build(&[]);
    let (img, mp) = (&sc.img, &sc.mp);
    let o = run_cmd(&mut sc.mount_cmd(&["--json"])).ok();
    let m = Mounted::adopt(mp);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["mountpoint"], mp.to_str().unwrap());
    assert_eq!(v["pid"].as_i64().unwrap() as i32, m.pid());
    let root = sheaf_in(["root".as_ref(), img.as_os_str()]).ok().text();
    let hex = root.trim().rsplit(':').next().unwrap().to_string();
    assert_eq!(v["roots"], serde_json::json!([hex]));
    assert_eq!(v["writable"], false);
    m.umount();
    let o = sheaf([
        "mount",
        "--json",
        "-f",
        img.to_str().unwrap(),
        mp.to_str().unwrap(),
    ]);
    assert_eq!(o.code, 2, "{}", o.describe());
}

/// `umount` and `stats` of what is not a sheaf mount: one line each,
/// exit 1, decided without a mount (in-process; mount.rs checks the same
/// after a real mount is gone).
#[test]
fn umount_and_stats_refuse_what_is_not_a_sheaf_mount() {
    let t = tmpdir();
    let d = t.path().as_os_str();
    let o = sheaf_in(["umount".as_ref(), d]).fails_with(1);
    assert!(o.one_err_line().contains("not mounted"), "{}", o.describe());
    let o = sheaf_in(["umount", "/proc"]).fails_with(1);
    assert!(
        o.one_err_line().contains("not a sheaf mount"),
        "{}",
        o.describe()
    );
    let o = sheaf_in(["stats".as_ref(), d]).fails_with(1);
    assert!(
        o.one_err_line().contains("not the root of a sheaf mount"),
        "{}",
        o.describe()
    );
    assert!(o.stdout.is_empty(), "{}", o.describe());
}

/// `sheaf help remote` explains the remote flags; `check` and `info` say
/// block bytes the same way (data and stored), info's codec line is text,
/// not JSON, and a bad block's error names the block once.
#[test]
fn help_remote_and_one_way_to_say_block_bytes() {
    let h = sheaf(["help", "remote"]).ok().text();
    assert!(
        h.starts_with("How remote images are reached and cached"),
        "{h}"
    );
    for f in ["--cache-dir", "--proxy", "--timeout", "--mirror", "ssh://"] {
        assert!(h.contains(f), "{f} missing from: {h}");
    }
    let t = tmpdir();
    let (_, img) = built(t.path());
    let info = json(&sheaf(["info".as_ref(), "--json".as_ref(), img.as_os_str()]).ok());
    let stored = info["stored_data_bytes"].as_u64().unwrap();
    let text = sheaf(["info".as_ref(), img.as_os_str()]).ok().text();
    let codecs = text.lines().find(|l| l.starts_with("codecs:")).unwrap();
    assert!(!codecs.contains('{') && !codecs.contains('"'), "{codecs}");
    let check = sheaf(["check".as_ref(), img.as_os_str()]).ok().text();
    let human_stored = if stored < 1024 {
        format!("{stored} B stored")
    } else {
        format!("{:.1} KiB stored", stored as f64 / 1024.0)
    };
    assert!(check.contains(&human_stored), "{check} / {stored}");
    // A flipped byte in the first data block (right after the 64-byte header).
    let mut bytes = fs::read(&img).unwrap();
    bytes[64 + 10] ^= 0xff;
    fs::write(&img, &bytes).unwrap();
    let o = sheaf(["check".as_ref(), img.as_os_str()]);
    assert_eq!(o.code, 1, "{}", o.describe());
    let line = o.stderr.lines().next().unwrap();
    assert_eq!(line.matches("data block").count(), 1, "{line}");
    assert!(line.contains("checksum mismatch at offset 64"), "{line}");
}

/// `optimize --json` and the new image agree: its root is `sheaf root`'s.
#[test]
fn optimize_json_names_the_new_root() {
    let t = tmpdir();
    let (_, img) = built(t.path());
    let list = t.path().join("first");
    fs::write(&list, "big.bin\n").unwrap();
    let out = t.path().join("o.sheaf");
    let j = json(
        &sheaf_in([
            "optimize".as_ref(),
            img.as_os_str(),
            "--prefetch".as_ref(),
            list.as_os_str(),
            "-o".as_ref(),
            out.as_os_str(),
            "--json".as_ref(),
        ])
        .ok(),
    );
    let root = sheaf_in(["root".as_ref(), out.as_os_str()]).ok().text();
    // `sheaf root` prints "sheaf-root-v1 blake3:HEX".
    assert_eq!(
        root.trim().rsplit(':').next().unwrap(),
        j["root_digest"].as_str().unwrap()
    );
    assert_eq!(
        j["bytes"].as_u64().unwrap(),
        fs::metadata(&out).unwrap().len()
    );
    assert_eq!(j["prefetch_blocks"].as_u64().unwrap(), 1);
}

/// A stack `BASE,LAYER` is one image syntax: `cat` reads the merged tree
/// (later layer wins, whiteouts hide, links followed across layers),
/// `merge A,B` is `merge A B`, and a command that takes one image (check)
/// refuses it in one line that says to merge.
#[test]
fn cat_and_merge_take_a_stack_and_single_image_commands_say_merge() {
    let t = tmpdir();
    let (lo, hi) = (t.path().join("lo"), t.path().join("hi"));
    fs::create_dir_all(lo.join("etc")).unwrap();
    fs::write(lo.join("etc/motd"), "low\n").unwrap();
    fs::write(lo.join("etc/gone"), "hidden\n").unwrap();
    fs::write(lo.join("data"), "base data\n").unwrap();
    fs::create_dir_all(hi.join("etc")).unwrap();
    fs::write(hi.join("etc/motd"), "high\n").unwrap();
    fs::write(hi.join("etc/.wh.gone"), "").unwrap();
    std::os::unix::fs::symlink("../data", hi.join("etc/data-link")).unwrap();
    let (a, b) = (t.path().join("a.sheaf"), t.path().join("b.sheaf"));
    sheaf([
        "build".as_ref(),
        lo.as_os_str(),
        "-o".as_ref(),
        a.as_os_str(),
    ])
    .ok();
    sheaf([
        "commit".as_ref(),
        hi.as_os_str(),
        "-o".as_ref(),
        b.as_os_str(),
    ])
    .ok();
    let stack = format!("{},{}", a.display(), b.display());
    let o = sheaf([&stack, "etc/motd", "etc/data-link"].iter().fold(
        vec!["cat".to_string()],
        |mut v, s| {
            v.push(s.to_string());
            v
        },
    ));
    assert_eq!(o.code, 0, "{}", o.describe());
    assert_eq!(o.text(), "high\nbase data\n");
    let o = sheaf(["cat", &stack, "etc/gone"]);
    assert_eq!(o.code, 1, "{}", o.describe());
    assert!(
        o.stderr.contains("etc/gone: no such file"),
        "{}",
        o.describe()
    );
    // merge A,B and merge A B write the same image.
    let (m1, m2) = (t.path().join("m1.sheaf"), t.path().join("m2.sheaf"));
    sheaf(["merge", &stack, "-o", m1.to_str().unwrap()]).ok();
    sheaf([
        "merge".as_ref(),
        a.as_os_str(),
        b.as_os_str(),
        "-o".as_ref(),
        m2.as_os_str(),
    ])
    .ok();
    let root = |p: &Path| sheaf_in(["root".as_ref(), p.as_os_str()]).ok().text();
    assert_eq!(root(&m1), root(&m2));
    let o = sheaf(["cat".as_ref(), m1.as_os_str(), "etc/motd".as_ref()]).ok();
    assert_eq!(o.text(), "high\n");
    let o = sheaf(["check", &stack]);
    assert_eq!(o.code, 1, "{}", o.describe());
    let l = o.err_lines();
    assert_eq!(l.len(), 1, "{}", o.describe());
    assert!(l[0].contains("sheaf merge"), "{}", l[0]);
}

/// On a terminal `build` draws a live progress bar (bytes in of the total,
/// files, bytes out, rate and ETA) and clears it before its summary; to a
/// pipe it prints the summary alone.
#[test]
fn build_shows_a_progress_bar_on_a_terminal_only() {
    let t = tmpdir();
    let src = t.path().join("src");
    fs::create_dir_all(&src).unwrap();
    let mut rng = Rng::new(9);
    for i in 0..8 {
        fs::write(src.join(format!("f{i}.txt")), rng.text(1 << 20)).unwrap();
    }
    let img = t.path().join("t.sheaf");
    // xz at its slowest, so the build outlasts a few redraws (one per 100 ms).
    let cmdline = format!(
        "{} build {} -o {} -c xz:9",
        bin(),
        src.display(),
        img.display()
    );
    let o = run_cmd(
        Command::new("script")
            .args(["-qec", &cmdline, "/dev/null"])
            .env("COLUMNS", "200")
            .stdin(std::process::Stdio::null()),
    );
    assert_eq!(o.code, 0, "{}", o.describe());
    let out = o.text();
    assert!(
        out.contains("/8.00 MiB in, ") && out.contains(" files, ") && out.contains("ETA"),
        "no progress bar: {out:?}"
    );
    assert!(
        out.contains("8 files") || out.contains(" files, "),
        "{out:?}"
    );
    // The summary comes after the bar is cleared.
    let summary = out.rfind("t.sheaf: ").expect("summary");
    assert!(out.rfind("ETA").unwrap() < summary, "{out:?}");
    // To a pipe: the summary line only.
    let o = run_cmd(cmd().args([
        "build".as_ref(),
        src.as_os_str(),
        "-o".as_ref(),
        img.as_os_str(),
        "-f".as_ref(),
    ]));
    assert_eq!(o.code, 0, "{}", o.describe());
    assert_eq!(o.err_lines().len(), 1, "{}", o.describe());
    assert!(!o.stderr.contains("ETA"), "{}", o.describe());
}
