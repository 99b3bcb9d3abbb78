//! The command line: reproducible output, error handling and exit codes,
//! temporary files, --exclude, --skip-errors, codecs and --json reports.

mod common;

use common::*;
use std::fs;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A tree with enough multi-block data for several compression jobs to be in
/// flight at once (64 KiB blocks).
fn parallel_tree(root: &Path) {
    small_tree(root, 1);
    let mut r = Rng::new(2);
    fs::create_dir(root.join("data")).unwrap();
    for i in 0..12 {
        let mut v = r.text(150_000 + i * 10_000);
        v.extend(r.bytes(40_000));
        write(&root.join(format!("data/part{i:02}.dat")), &v);
    }
    set_all_mtimes(root, |i, _| (1_700_000_000 + i as i64, 1000 * i as u32));
}

#[test]
fn output_does_not_depend_on_thread_count() {
    let t = tmpdir();
    let src = t.path().join("src");
    fs::create_dir(&src).unwrap();
    parallel_tree(&src);
    for codec in ["zstd", "auto"] {
        let mut images = Vec::new();
        for (i, j) in ["1", "2", "2", "3"].iter().enumerate() {
            let img = t.path().join(format!("{codec}-{i}-j{j}.sheaf"));
            build(&src, &img, &["-j", j, "--block-size", "64K", "-c", codec]);
            images.push((img.clone(), fs::read(&img).unwrap()));
        }
        for (img, bytes) in &images[1..] {
            assert!(
                bytes == &images[0].1,
                "{} differs from {} (-c {codec})",
                img.display(),
                images[0].0.display()
            );
        }
        let v = json(&sheaf(["info".as_ref(), images[0].0.as_os_str(), "--json".as_ref()]).ok());
        assert!(
            v["blocks"].as_u64().unwrap() > 20,
            "too few blocks to exercise parallelism: {}",
            v["blocks"]
        );
    }
}

/// Smaller pack blocks for small files: more, smaller blocks, same tree.
#[test]
fn pack_size_cuts_small_files_into_smaller_blocks() {
    let t = tmpdir();
    let src = t.path().join("src");
    fs::create_dir(&src).unwrap();
    parallel_tree(&src);
    let mut blocks = Vec::new();
    for pack in ["1M", "64K"] {
        let img = t.path().join(format!("p{pack}.sheaf"));
        build(&src, &img, &["--block-size", "1M", "--pack-size", pack]).ok();
        let v = json(&sheaf(["info".as_ref(), img.as_os_str(), "--json".as_ref()]).ok());
        blocks.push(v["blocks"].as_u64().unwrap());
        let out = t.path().join(format!("out{pack}"));
        extract(&img, &out).ok();
        assert_same_tree(&src, &out, Cmp::all());
    }
    assert!(blocks[1] > blocks[0], "blocks: {blocks:?}");
}

/// `--archive`: one xz:9 block of 64 MiB holds a whole small tree; flags
/// given with it override the preset's block size, pack size and codec.
#[test]
fn archive_preset_packs_into_64m_xz_blocks_and_given_flags_win() {
    let t = tmpdir();
    let src = t.path().join("src");
    fs::create_dir(&src).unwrap();
    parallel_tree(&src);
    let info = |name: &str, args: &[&str]| {
        let img = t.path().join(format!("{name}.sheaf"));
        build(&src, &img, args).ok();
        let out = t.path().join(format!("{name}.out"));
        extract(&img, &out).ok();
        assert_same_tree(&src, &out, Cmp::all());
        sheaf(["check".as_ref(), img.as_os_str()]).ok();
        json(&sheaf(["info".as_ref(), img.as_os_str(), "--json".as_ref()]).ok())
    };
    let a = info("archive", &["--archive"]);
    assert_eq!(a["block_size"], 64 * 1024 * 1024, "{a}");
    assert_eq!(a["build"]["compression"], "xz:9", "{a}");
    // About 3 MB of files, every one under the 64 MiB pack: one pack.
    assert_eq!(a["blocks"], 1, "{a}");
    assert_eq!(a["blocks_by_codec"]["xz"], 1, "{a}");
    // A smaller block: packs of that block, still xz:9.
    let b = info("archive-1m", &["--archive", "--block-size", "1M"]);
    assert_eq!(b["block_size"], 1024 * 1024, "{b}");
    assert_eq!(b["build"]["compression"], "xz:9", "{b}");
    let logical = b["logical_bytes"].as_u64().unwrap();
    assert_eq!(
        b["blocks"].as_u64().unwrap(),
        logical.div_ceil(1 << 20),
        "{b}"
    );
    // The same block size without the preset: 256 KiB packs, and the
    // files of 256 KiB or more in blocks of their own, so more blocks.
    let d = info("default-1m", &["--block-size", "1M"]);
    assert!(
        d["blocks"].as_u64().unwrap() > b["blocks"].as_u64().unwrap(),
        "{d} {b}"
    );
    let z = info("archive-zstd", &["--archive", "-c", "zstd:3"]);
    assert_eq!(z["block_size"], 64 * 1024 * 1024, "{z}");
    assert_eq!(z["build"]["compression"], "zstd:3", "{z}");
}

#[test]
fn source_date_epoch_and_owner_make_builds_of_copies_identical() {
    let t = tmpdir();
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    for d in [&a, &b] {
        fs::create_dir(d).unwrap();
        small_tree(d, 42);
        // One old file whose mtime is earlier than the epoch: kept as is.
        write(&d.join("old.txt"), b"old\n");
        set_mtime(&d.join("old.txt"), 900_000_000, 5);
    }
    // Copy b: other (later) mtimes, and other owners if we can.
    for (i, p) in walk(&b).iter().enumerate() {
        if p.as_slice() == b"old.txt" {
            continue;
        }
        let full = join(&b, p);
        if is_root() {
            lchown(&full, 1000 + i as u32, 2000);
        }
        set_mtime(&full, 1_750_000_000 + i as i64 * 13, 999_999_999 - i as u32);
    }
    set_mtime(&b, 1_760_000_000, 1);
    let epoch = "1000000000";
    let run = |src: &Path, img: &Path| {
        run_cmd(
            cmd()
                .env("SOURCE_DATE_EPOCH", epoch)
                .arg("build")
                .arg(src)
                .arg("-o")
                .arg(img)
                .args(["--owner", "0:0"]),
        )
        .ok();
    };
    let (ia, ib) = (t.path().join("a.sheaf"), t.path().join("b.sheaf"));
    run(&a, &ia);
    run(&b, &ib);
    assert!(
        fs::read(&ia).unwrap() == fs::read(&ib).unwrap(),
        "images of two copies differ"
    );
    // Every later mtime is clamped to the epoch, earlier ones are kept; owners are 0:0.
    let out = t.path().join("out");
    extract(&ia, &out);
    for p in walk(&out) {
        let md = fs::symlink_metadata(join(&out, &p)).unwrap();
        if p.as_slice() == b"old.txt" {
            assert_eq!(
                (md.mtime(), md.mtime_nsec()),
                (900_000_000, 5),
                "old.txt mtime"
            );
        } else {
            assert_eq!(
                (md.mtime(), md.mtime_nsec()),
                (1_000_000_000, 0),
                "{:?} mtime",
                lossy(&p)
            );
        }
        if is_root() {
            assert_eq!((md.uid(), md.gid()), (0, 0), "{:?} owner", lossy(&p));
        }
    }
    // --mtime sets every mtime, whatever SOURCE_DATE_EPOCH says.
    let im = t.path().join("m.sheaf");
    run_cmd(
        cmd()
            .env("SOURCE_DATE_EPOCH", epoch)
            .arg("build")
            .arg(&a)
            .arg("-o")
            .arg(&im)
            .args(["--mtime", "1234567890"]),
    )
    .ok();
    let l = sheaf([
        "ls".as_ref(),
        im.as_os_str(),
        "-lAR".as_ref(),
        "--time-style=+%s.%N".as_ref(),
    ])
    .ok()
    .text();
    assert!(l.lines().count() > 5);
    // Every entry, under its directory's line and `total` (as GNU ls -lR).
    for line in ls_sections(&l).iter().flat_map(|s| &s.1[1..]) {
        assert!(
            line.contains(" 1234567890.000000000 "),
            "--mtime not applied: {line}"
        );
    }
    // A malformed SOURCE_DATE_EPOCH is an error, not ignored.
    let o = run_cmd(
        cmd()
            .env("SOURCE_DATE_EPOCH", "yesterday")
            .arg("build")
            .arg(&a)
            .arg("-o")
            .arg(t.path().join("e.sheaf")),
    );
    assert_eq!(o.code, 1, "{}", o.describe());
    assert!(o.one_err_line().contains("SOURCE_DATE_EPOCH"));
}

#[test]
fn missing_source_is_one_error_line() {
    let t = tmpdir();
    let img = t.path().join("x.sheaf");
    let o = run_cmd(
        cmd()
            .arg("build")
            .arg(t.path().join("no-such-dir"))
            .arg("-o")
            .arg(&img),
    )
    .fails_with(1);
    let l = o.one_err_line();
    assert!(
        l.starts_with("sheaf: error: ") && l.contains("no-such-dir"),
        "{l}"
    );
    assert!(!img.exists());
    assert!(temp_leftovers(t.path()).is_empty());
}

#[test]
fn existing_output_is_kept_without_force_and_replaced_with_it() {
    let t = tmpdir();
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    fs::create_dir(&a).unwrap();
    fs::create_dir(&b).unwrap();
    small_tree(&a, 1);
    write(&b.join("only-in-b"), b"b\n");
    let img = t.path().join("img.sheaf");
    build(&a, &img, &[]);
    let before = fs::read(&img).unwrap();
    let before_md = fs::metadata(&img).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let o = run_cmd(cmd().arg("build").arg(&b).arg("-o").arg(&img)).fails_with(1);
    let l = o.one_err_line();
    assert!(
        l.contains(&img.display().to_string()) && l.contains("exists"),
        "{l}"
    );
    let after_md = fs::metadata(&img).unwrap();
    assert!(
        fs::read(&img).unwrap() == before,
        "existing image changed without --force"
    );
    assert_eq!(
        (before_md.ino(), before_md.mtime_nsec()),
        (after_md.ino(), after_md.mtime_nsec()),
        "existing image touched"
    );
    assert!(temp_leftovers(t.path()).is_empty());
    // A non-image file is protected the same way.
    let other = t.path().join("notes.txt");
    write(&other, b"precious\n");
    run_cmd(cmd().arg("build").arg(&b).arg("-o").arg(&other))
        .fails_with(1)
        .one_err_line();
    assert_eq!(fs::read(&other).unwrap(), b"precious\n");
    // --force replaces it.
    build(&b, &img, &["--force"]);
    assert!(fs::read(&img).unwrap() != before);
    let ls = sheaf(["ls".as_ref(), img.as_os_str()]).ok().text();
    assert_eq!(ls, "only-in-b\n");
    assert!(temp_leftovers(t.path()).is_empty());
}

#[test]
fn usage_errors_exit_2_with_one_line() {
    let t = tmpdir();
    let src = t.path().join("src");
    fs::create_dir(&src).unwrap();
    let img = t.path().join("x.sheaf");
    let s = src.to_str().unwrap();
    let i = img.to_str().unwrap();
    for args in [
        vec!["build", s, "-o", i, "--no-such-flag"],
        vec!["build", s],
        vec!["frobnicate"],
        vec!["build", s, "-o", i, "-j", "many"],
        vec!["ls"],
        vec!["check", i, "--bogus"],
    ] {
        let o = sheaf(&args);
        o.no_panic();
        assert_eq!(o.code, 2, "{args:?}:\n{}", o.describe());
        let l = o.one_err_line();
        assert!(l.starts_with("sheaf: "), "{args:?}: {l}");
        assert!(o.stdout.is_empty(), "{args:?}: stdout: {}", o.text());
    }
    assert!(!img.exists());
    assert!(temp_leftovers(t.path()).is_empty());
    // No command at all: the usage (on stderr), still exit 2.
    let o = sheaf(Vec::<&str>::new());
    o.no_panic();
    assert_eq!(o.code, 2, "{}", o.describe());
    assert!(
        o.stderr.contains("Usage:") && o.stdout.is_empty(),
        "{}",
        o.describe()
    );
    // --help and --version are not errors.
    sheaf(["--help"]).ok();
    sheaf(["build", "--help"]).ok();
    assert!(sheaf(["--version"]).ok().text().starts_with("sheaf "));
}

#[test]
fn bad_codec_block_size_and_owner_are_one_line_errors() {
    let t = tmpdir();
    let src = t.path().join("src");
    fs::create_dir(&src).unwrap();
    write(&src.join("f"), b"x");
    let img = t.path().join("x.sheaf");
    for extra in [
        &["-c", "gzip"][..],
        &["-c", "zstd:99"],
        &["-c", "zstd:x"],
        &["-c", "xz:10"],
        &["-c", "lz4:3"],
        &["-c", ""],
        &["--block-size", "3K"],
        &["--block-size", "128M"],
        &["--block-size", "1000"],
        &["--block-size", "lots"],
        &["--block-size", "0"],
        &["--pack-size", "8M"],
        &["--block-size", "64K", "--pack-size", "128K"],
        &["--pack-size", "3K"],
        &["--pack-size", "x"],
        &["--owner", "root"],
        &["--owner", "1:x"],
        &["--exclude", "a[b"],
    ] {
        let o = run_cmd(cmd().arg("build").arg(&src).arg("-o").arg(&img).args(extra));
        o.no_panic();
        assert!(matches!(o.code, 1 | 2), "{extra:?}:\n{}", o.describe());
        let l = o.one_err_line();
        assert!(l.starts_with("sheaf: "), "{extra:?}: {l}");
        assert!(!img.exists(), "{extra:?}: an image was written");
        assert!(
            temp_leftovers(t.path()).is_empty(),
            "{extra:?}: temp file left"
        );
    }
}

#[test]
fn cat_of_a_directory_and_ls_of_a_missing_path_fail_cleanly() {
    let t = tmpdir();
    let src = t.path().join("src");
    fs::create_dir(&src).unwrap();
    small_tree(&src, 3);
    let img = t.path().join("x.sheaf");
    build(&src, &img, &[]);
    let i = img.to_str().unwrap();
    for (args, needle) in [
        (vec!["cat", i, "docs"], "docs"),
        (vec!["cat", i, "/"], "/"),
        (vec!["cat", i, "no/such/file"], "no/such/file"),
        (vec!["cat", i, "README.txt/x"], "README.txt/x"),
        (vec!["ls", i, "no-such-dir"], "no-such-dir"),
        (vec!["ls", i, "docs/missing", "-l"], "docs/missing"),
        (
            vec![
                "extract",
                i,
                "nothing-here",
                "-C",
                t.path().join("o").to_str().unwrap(),
            ],
            "nothing-here",
        ),
    ] {
        let o = sheaf(&args);
        o.no_panic();
        assert_eq!(o.code, 1, "{args:?}:\n{}", o.describe());
        let l = o.one_err_line();
        assert!(
            l.starts_with("sheaf: error: ") && l.contains(needle),
            "{args:?}: {l}"
        );
        assert!(o.stdout.is_empty(), "{args:?}: wrote to stdout");
    }
    // Sanity: the same paths that exist work.
    assert_eq!(
        sheaf(["cat", i, "docs/b.txt"]).ok().stdout,
        fs::read(src.join("docs/b.txt")).unwrap()
    );
    assert_eq!(sheaf(["ls", i, "docs/deep"]).ok().text(), "er\n");
    // cat follows links inside the image, takes several files, names the
    // ones it cannot write and still writes the rest (exit 1), as cat does.
    let readme = fs::read(src.join("README.txt")).unwrap();
    assert_eq!(sheaf(["cat", i, "docs/readme-link"]).ok().stdout, readme);
    let o = sheaf(["cat", i, "docs/b.txt", "nope", "docs/readme-link"]);
    assert_eq!(o.code, 1, "{}", o.describe());
    let mut want = fs::read(src.join("docs/b.txt")).unwrap();
    want.extend_from_slice(&readme);
    assert_eq!(o.stdout, want);
    assert!(
        o.one_err_line().starts_with("sheaf: error: nope"),
        "{}",
        o.describe()
    );
}

#[test]
fn error_messages_do_not_repeat_their_cause() {
    let t = tmpdir();
    let src = t.path().join("src");
    fs::create_dir(&src).unwrap();
    write(&src.join("f"), b"x");
    let d = t.path().to_str().unwrap().to_string();
    let cases: Vec<Vec<String>> = vec![
        vec!["info".into(), d.clone()],
        vec!["check".into(), d.clone()],
        vec!["info".into(), format!("{d}/missing.sheaf")],
        vec![
            "build".into(),
            src.to_str().unwrap().into(),
            "-o".into(),
            format!("{d}/no/such/dir/x.sheaf"),
        ],
    ];
    let mut bad = Vec::new();
    for args in cases {
        let o = sheaf(&args);
        o.no_panic();
        assert_eq!(o.code, 1, "{args:?}:\n{}", o.describe());
        let l = o.one_err_line().to_string();
        let parts: Vec<&str> = l.split(": ").collect();
        if parts.windows(2).any(|w| w[0] == w[1]) {
            bad.push(l);
        }
    }
    assert!(
        bad.is_empty(),
        "error lines repeat their cause:\n  {}",
        bad.join("\n  ")
    );
}

/// A truncated archive fails after the temporary output exists.
#[test]
fn failed_build_leaves_no_temporary_file() {
    let t = tmpdir();
    let src = t.path().join("src");
    fs::create_dir(&src).unwrap();
    parallel_tree(&src);
    let tarball = t.path().join("x.tar");
    let o = run_cmd(
        Command::new("tar")
            .arg("-cf")
            .arg(&tarball)
            .arg("-C")
            .arg(&src)
            .arg("."),
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let full = fs::read(&tarball).unwrap();
    let cut = t.path().join("cut.tar");
    fs::write(&cut, &full[..full.len() * 2 / 3]).unwrap();
    let out_dir = t.path().join("out");
    fs::create_dir(&out_dir).unwrap();
    let img = out_dir.join("x.sheaf");
    let o = run_cmd(
        cmd()
            .arg("build")
            .arg(&cut)
            .arg("-o")
            .arg(&img)
            .args(["--block-size", "64K"]),
    )
    .fails_with(1);
    o.one_err_line();
    assert!(!img.exists());
    assert_eq!(temp_leftovers(&out_dir), Vec::<String>::new());
    assert_eq!(fs::read_dir(&out_dir).unwrap().count(), 0);
}

#[test]
fn interrupted_build_leaves_no_temporary_file() {
    let t = tmpdir();
    let src = t.path().join("src");
    fs::create_dir(&src).unwrap();
    small_tree(&src, 8);
    let tar_out = run_cmd(
        Command::new("tar")
            .arg("-cf")
            .arg("-")
            .arg("-C")
            .arg(&src)
            .arg("."),
    );
    assert_eq!(tar_out.code, 0);
    let mut body = tar_out.stdout;
    // Drop the end-of-archive blocks: the build waits for more input.
    while body.len() >= 512 && body[body.len() - 512..].iter().all(|&b| b == 0) {
        body.truncate(body.len() - 512);
    }
    let out_dir = t.path().join("out");
    fs::create_dir(&out_dir).unwrap();
    let img = out_dir.join("x.sheaf");
    let mut child = cmd()
        .arg("build")
        .arg("-")
        .arg("-o")
        .arg(&img)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(&body).unwrap();
    // Wait for the temporary output to exist, then interrupt.
    let start = Instant::now();
    while temp_leftovers(&out_dir).is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no temporary file appeared"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    std::thread::sleep(Duration::from_millis(100));
    drop(stdin);
    let o = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    // 128 + SIGTERM, as a shell reports a process the signal ended.
    assert_eq!(
        o.status.code(),
        Some(128 + libc::SIGTERM),
        "exit status {:?}: {stderr}",
        o.status
    );
    assert!(stderr.contains("interrupted"), "{stderr}");
    assert!(!img.exists(), "an interrupted build left an image");
    assert_eq!(temp_leftovers(&out_dir), Vec::<String>::new());
}

#[test]
fn exclude_leaves_out_matching_files_and_whole_directories() {
    let t = tmpdir();
    let src = t.path().join("src");
    for d in ["lib/deep/er", "build/sub", "lib/build", "keep", "cache"] {
        fs::create_dir_all(src.join(d)).unwrap();
    }
    for f in [
        "main.o",
        "main.c",
        "lib/x.o",
        "lib/deep/er/y.o",
        "lib/deep/er/y.c",
        "lib/keep.obj",
        "lib/o",
        "build/out.bin",
        "build/sub/z.c",
        "lib/build/nested.c",
        "keep/buildfile",
        "cache/tmp.c",
    ] {
        write(&src.join(f), f.as_bytes());
    }
    let img = t.path().join("x.sheaf");
    build(
        &src,
        &img,
        &[
            "--exclude",
            "*.o",
            "--exclude",
            "build",
            "--exclude",
            "cache",
        ],
    );
    let listing = ls_r_paths(
        &sheaf(["ls".as_ref(), img.as_os_str(), "-R".as_ref()])
            .ok()
            .text(),
    );
    let mut got: Vec<&str> = listing.lines().collect();
    got.sort();
    let want = [
        "keep",
        "keep/buildfile",
        "lib",
        "lib/deep",
        "lib/deep/er",
        "lib/deep/er/y.c",
        "lib/keep.obj",
        "lib/o",
        "main.c",
    ];
    assert_eq!(got, want);
    // A pattern relative to the source root.
    let img2 = t.path().join("y.sheaf");
    build(&src, &img2, &["--exclude", "lib/deep"]);
    let listing = ls_r_paths(
        &sheaf(["ls".as_ref(), img2.as_os_str(), "-R".as_ref()])
            .ok()
            .text(),
    );
    assert!(!listing.contains("lib/deep"), "{listing}");
    assert!(
        listing.contains("lib/x.o\n") && listing.contains("build/sub/z.c\n"),
        "{listing}"
    );
}

/// Run sheaf as nobody (65534), from a copy of the programs (`sheaf` and
/// the `sheaf-full` it runs) any user can run.
fn as_nobody(bin_dir: &Path, args: &[&std::ffi::OsStr]) -> Out {
    let bin = bin_dir.join("sheaf");
    if !bin.exists() {
        for name in ["sheaf", "sheaf-full"] {
            let to = bin_dir.join(name);
            fs::copy(Path::new(common::bin()).with_file_name(name), &to).unwrap();
            chmod(&to, 0o755);
        }
    }
    run_cmd(
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(&bin)
            .args(args)
            .stdin(Stdio::null())
            .env_remove("SOURCE_DATE_EPOCH"),
    )
}

#[test]
fn skip_errors_leaves_out_unreadable_files_and_lists_them() {
    if !prerequisite(is_root(), "root, to run the build as another user") {
        return;
    }
    let t = tmpdir();
    chmod(t.path(), 0o755);
    let src = t.path().join("src");
    fs::create_dir(&src).unwrap();
    small_tree(&src, 4);
    write(&src.join("docs/secret.txt"), b"top secret\n");
    chmod(&src.join("docs/secret.txt"), 0o000);
    chmod(&src.join("docs"), 0o755);
    let out = t.path().join("out");
    fs::create_dir(&out).unwrap();
    chmod(&out, 0o777);
    let img = out.join("x.sheaf");
    let secret = src.join("docs/secret.txt");
    let mut args: Vec<&std::ffi::OsStr> = vec![
        "build".as_ref(),
        src.as_os_str(),
        "-o".as_ref(),
        img.as_os_str(),
    ];
    let o = as_nobody(t.path(), &args);
    o.no_panic();
    assert_eq!(o.code, 1, "{}", o.describe());
    let l = o.one_err_line();
    assert!(
        l.starts_with("sheaf: error: ") && l.contains("secret.txt"),
        "{l}"
    );
    assert!(!img.exists());
    assert!(
        temp_leftovers(&out).is_empty(),
        "temp file left: {:?}",
        temp_leftovers(&out)
    );

    args.push("--skip-errors".as_ref());
    let o = as_nobody(t.path(), &args);
    assert_eq!(o.code, 0, "{}", o.describe());
    assert!(
        o.stderr.contains(&secret.display().to_string()),
        "skipped path not listed: {}",
        o.stderr
    );
    let listing = ls_r_paths(
        &sheaf(["ls".as_ref(), img.as_os_str(), "-R".as_ref()])
            .ok()
            .text(),
    );
    assert!(
        !listing.contains("secret"),
        "skipped file is in the image:\n{listing}"
    );
    assert!(
        listing.contains("docs/b.txt\n") && listing.contains("README.txt\n"),
        "{listing}"
    );
    // The rest of the tree is intact.
    let x = t.path().join("x");
    extract(&img, &x);
    fs::remove_file(&secret).unwrap();
    assert_same_tree(
        &src,
        &x,
        Cmp {
            owner: false,
            dir_mtime: false,
            ..Cmp::all()
        },
    );
}

#[test]
fn every_codec_round_trips() {
    let t = tmpdir();
    let src = t.path().join("src");
    fs::create_dir(&src).unwrap();
    small_tree(&src, 5);
    for (codec, want) in [
        ("zstd", &["zstd"][..]),
        ("zstd:1", &["zstd"]),
        ("zstd:19", &["zstd"]),
        ("lz4", &["lz4"]),
        ("xz", &["xz"]),
        ("xz:0", &["xz"]),
        ("none", &["none"]),
        ("auto", &["zstd", "lz4", "xz"]),
    ] {
        let img = t.path().join(format!("{codec}.sheaf"));
        build(&src, &img, &["-c", codec, "--block-size", "64K"]);
        let out = t.path().join(format!("{codec}.out"));
        extract(&img, &out);
        assert_same_tree(&src, &out, Cmp::all());
        sheaf(["check".as_ref(), img.as_os_str()]).ok();
        let v = json(&sheaf(["info".as_ref(), img.as_os_str(), "--json".as_ref()]).ok());
        let by_codec = v["blocks_by_codec"]
            .as_object()
            .unwrap_or_else(|| panic!("{codec}: {v}"));
        // Text blocks are compressed with the chosen codec; only incompressible ones are raw.
        assert!(
            want.iter().any(|w| by_codec.contains_key(*w)),
            "{codec}: blocks_by_codec {by_codec:?}"
        );
        for k in by_codec.keys() {
            assert!(
                want.contains(&k.as_str()) || k == "none",
                "{codec}: unexpected codec {k} in {by_codec:?}"
            );
        }
        assert_eq!(
            v["build"]["compression"]
                .as_str()
                .map(|s| s.split(':').next().unwrap()),
            Some(codec.split(':').next().unwrap()),
            "{codec}"
        );
    }
}

#[test]
fn json_reports_have_the_expected_keys() {
    let t = tmpdir();
    let src = t.path().join("src");
    fs::create_dir(&src).unwrap();
    small_tree(&src, 6);
    let img = t.path().join("x.sheaf");
    let b = build(&src, &img, &["--json"]);
    let b = json(&b);
    let c = json(&sheaf(["check".as_ref(), img.as_os_str(), "--json".as_ref()]).ok());
    let i = json(&sheaf(["info".as_ref(), img.as_os_str(), "--json".as_ref()]).ok());
    let has = |v: &serde_json::Value, keys: &[&str], what: &str| {
        for k in keys {
            assert!(v.get(*k).is_some(), "{what} --json lacks '{k}': {v}");
        }
    };
    has(
        &b,
        &[
            "image",
            "image_bytes",
            "inodes",
            "logical_bytes",
            "stored_data_bytes",
            "blocks",
            "root_digest",
            "skipped",
            "seconds",
        ],
        "build",
    );
    has(
        &c,
        &[
            "image",
            "ok",
            "pages",
            "blocks",
            "inodes",
            "block_bytes",
            "logical_bytes",
            "seconds",
            "errors",
            "root_digest",
        ],
        "check",
    );
    has(
        &i,
        &[
            "image",
            "image_bytes",
            "root_digest",
            "inodes",
            "entries_by_type",
            "hardlinked_inodes",
            "logical_bytes",
            "stored_data_bytes",
            "compression_ratio",
            "dedup_bytes",
            "hole_bytes",
            "blocks",
            "blocks_by_codec",
            "block_size",
            "page_size",
            "build",
            "sections",
        ],
        "info",
    );
    let len = fs::metadata(&img).unwrap().len();
    assert_eq!(b["image_bytes"].as_u64(), Some(len));
    assert_eq!(i["image_bytes"].as_u64(), Some(len));
    let digest = b["root_digest"].as_str().unwrap();
    assert_eq!(digest.len(), 64);
    assert!(digest.bytes().all(|c| c.is_ascii_hexdigit()));
    assert_eq!(c["root_digest"].as_str(), Some(digest));
    assert_eq!(i["root_digest"].as_str(), Some(digest));
    assert_eq!(c["ok"], serde_json::json!(true));
    assert_eq!(c["errors"], serde_json::json!([]));
    for k in ["inodes", "blocks", "logical_bytes"] {
        assert_eq!(b[k], i[k], "build and info disagree on {k}");
    }
    assert_eq!(c["inodes"], i["inodes"]);
    assert_eq!(c["blocks"], i["blocks"]);
    assert_eq!(b["skipped"], serde_json::json!([]));
    assert_eq!(i["block_size"].as_u64(), Some(4 << 20));
    // extract --json too.
    let x = json(
        &run_cmd(
            cmd()
                .arg("extract")
                .arg(&img)
                .arg("-C")
                .arg(t.path().join("o"))
                .arg("--json"),
        )
        .ok(),
    );
    has(
        &x,
        &["directory", "entries", "bytes", "unrestored_attributes"],
        "extract",
    );
    // `extract IMG DIR` (unsquashfs -d habits): DIR is not in the image, and
    // the one line says how to extract into it.
    let dir = t.path().join("into");
    let o = run_cmd(cmd().arg("extract").arg(&img).arg(&dir));
    assert_eq!(o.code, 1, "{}", o.describe());
    assert_eq!(o.err_lines().len(), 1, "{}", o.describe());
    assert!(
        o.stderr
            .contains(&format!("sheaf extract -C {}", dir.display())),
        "{}",
        o.describe()
    );
    assert!(!dir.exists());
    // check --json of a damaged image: still JSON, ok=false, exit 1.
    let mut bytes = fs::read(&img).unwrap();
    let im = sheaf_read::open_path(&img).unwrap();
    let r = im.block_ref(0).unwrap();
    bytes[(r.offset + r.clen as u64 / 2) as usize] ^= 1;
    let bad = t.path().join("bad.sheaf");
    fs::write(&bad, &bytes).unwrap();
    let o = sheaf(["check".as_ref(), bad.as_os_str(), "--json".as_ref()]).fails_with(1);
    let v = json(&o);
    assert_eq!(v["ok"], serde_json::json!(false));
    assert!(!v["errors"].as_array().unwrap().is_empty());
}

/// The comparison the other tests rely on notices every kind of difference.
#[test]
fn tree_comparison_detects_each_kind_of_difference() {
    let t = tmpdir();
    let a = t.path().join("a");
    fs::create_dir(&a).unwrap();
    small_tree(&a, 9);
    let img = t.path().join("x.sheaf");
    build(&a, &img, &[]);
    let b: PathBuf = t.path().join("b");
    extract(&img, &b);
    assert_same_tree(&a, &b, Cmp::all());
    // One change per path.
    let md = fs::symlink_metadata(b.join("docs/a.txt")).unwrap();
    set_mtime(
        &b.join("docs/a.txt"),
        md.mtime(),
        (md.mtime_nsec() as u32 + 1) % 1_000_000_000,
    );
    chmod(&b.join("docs/b.txt"), 0o640);
    let mut c = fs::read(b.join("README.txt")).unwrap();
    c[100] ^= 1;
    fs::write(b.join("README.txt"), &c).unwrap();
    set_mtime(
        &b.join("README.txt"),
        fs::metadata(a.join("README.txt")).unwrap().mtime(),
        fs::metadata(a.join("README.txt")).unwrap().mtime_nsec() as u32,
    );
    xattr::set(b.join("docs/copy-of-b.txt"), "user.extra", b"1").unwrap();
    let m = fs::symlink_metadata(a.join("docs/copy-of-b.txt")).unwrap();
    set_mtime(
        &b.join("docs/copy-of-b.txt"),
        m.mtime(),
        m.mtime_nsec() as u32,
    );
    fs::remove_file(b.join("docs/readme-link")).unwrap();
    symlink(b"../README", &b.join("docs/readme-link"));
    fs::remove_file(b.join("bin/tool-link")).unwrap();
    fs::copy(b.join("bin/tool"), b.join("bin/tool-link")).unwrap();
    fs::remove_file(b.join("docs/empty.txt")).unwrap();
    let errs = compare_trees(&a, &b, Cmp::all()).join("\n");
    for needle in [
        "\"docs/a.txt\": mtime nsec",
        "\"docs/b.txt\": mode",
        "\"README.txt\": contents differ",
        "\"docs/copy-of-b.txt\": xattrs",
        "\"docs/readme-link\": symlink target",
        "\"bin/tool-link\": nlink",
        "\"bin/tool-link\": shares an inode",
        "\"docs/empty.txt\": missing",
    ] {
        assert!(errs.contains(needle), "comparison missed {needle}:\n{errs}");
    }
}

#[test]
fn an_image_written_inside_its_source_is_not_packed_into_itself() {
    let t = tmpdir();
    let src = t.path().join("src");
    fs::create_dir_all(&src).unwrap();
    write(&src.join("data.txt"), b"payload\n");
    let img = src.join("self.sheaf");
    build(&src, &img, &[]);
    // A second build with --force must leave out the old image too.
    build(&src, &img, &["--force"]);
    let ls = sheaf([std::ffi::OsStr::new("ls"), img.as_os_str()]).ok();
    assert_eq!(ls.text().trim(), "data.txt", "listing: {}", ls.text());
}

#[test]
fn sparse_files_with_the_same_data_at_different_offsets_are_not_merged() {
    // [hole][X] and [X][hole] have the same size and the same stored bytes;
    // they must still read back as themselves (whole-file dedup once
    // ignored holes skipped with SEEK_DATA).
    let t = tmpdir();
    let src = t.path().join("src");
    fs::create_dir_all(&src).unwrap();
    let x = Rng::new(77).bytes(65536);
    let a = fs::File::create(src.join("a")).unwrap();
    a.set_len(65536).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&a, &x, 65536).unwrap();
    write(&src.join("b"), &x);
    fs::OpenOptions::new()
        .write(true)
        .open(src.join("b"))
        .unwrap()
        .set_len(131072)
        .unwrap();
    let img = t.path().join("img.sheaf");
    build(&src, &img, &["--block-size", "64K"]);
    for f in ["a", "b"] {
        let o = sheaf([
            std::ffi::OsStr::new("cat"),
            img.as_os_str(),
            std::ffi::OsStr::new(f),
        ])
        .ok();
        assert!(
            o.stdout == fs::read(src.join(f)).unwrap(),
            "{f} reads back wrong"
        );
    }
}

/// `sheaf ls -R` prints what GNU `ls -R` prints for the source tree: a
/// `DIR:` line before each directory's entries, a blank line between
/// directories, the operand as given (`.` when none).
#[test]
fn ls_recursive_prints_the_sections_gnu_ls_prints() {
    let t = tmpdir();
    let src = t.path().join("src");
    for f in [
        "a.txt",
        "B.txt",
        ".hidden",
        "sub/x",
        "sub/.h",
        "sub/deeper/y",
        "sub/with space/z",
        "other/q",
    ] {
        let p = src.join(f);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        write(&p, b"data\n");
    }
    fs::create_dir_all(src.join("sub/empty")).unwrap();
    fs::create_dir_all(src.join(".dotdir/in")).unwrap();
    let img = t.path().join("x.sheaf");
    build(&src, &img, &[]);
    let gnu = |args: &[&str]| -> String {
        let o = run_cmd(
            Command::new("ls")
                .args(args)
                .current_dir(&src)
                .env("LC_ALL", "C"),
        )
        .ok();
        o.text()
    };
    for args in [
        &["-R"][..],
        &["-R", "sub"],
        &["-R", "sub/"],
        &["-Ra", "sub"],
        &["-RA"],
        &["-R", "sub/deeper"],
    ] {
        let mut a: Vec<&std::ffi::OsStr> = vec!["ls".as_ref(), args[0].as_ref(), img.as_os_str()];
        a.extend(args[1..].iter().map(std::ffi::OsStr::new));
        let ours = sheaf(a).ok().text();
        assert_eq!(ours, gnu(args), "ls {args:?}");
    }
    // With -l: the same sections, each with its `total` line first.
    let ours = ls_sections(
        &sheaf(["ls".as_ref(), "-lR".as_ref(), img.as_os_str()])
            .ok()
            .text(),
    );
    let theirs = ls_sections(&gnu(&["-lR"]));
    let dirs = |s: &[(String, Vec<String>)]| s.iter().map(|s| s.0.clone()).collect::<Vec<_>>();
    assert_eq!(dirs(&ours), dirs(&theirs));
    for (d, lines) in &ours {
        assert!(lines[0].starts_with("total "), "{d}: {lines:?}");
    }
}

/// I/O errors reach the user as the system's message, as other tools print
/// it, without Rust's " (os error N)".
#[test]
fn io_errors_are_printed_without_os_error_numbers() {
    let t = tmpdir();
    let src = t.path().join("src");
    small_tree(&src, 3);
    let img = t.path().join("x.sheaf");
    build(&src, &img, &[]);
    let file = src.join("README.txt");
    let missing = t.path().join("missing.sheaf");
    let under_file = file.join("x.sheaf");
    let p = |p: &Path| p.to_string_lossy().into_owned();
    for (args, want) in [
        (
            vec!["info".to_string(), p(&missing)],
            "No such file or directory",
        ),
        (vec!["ls".to_string(), p(&under_file)], "Not a directory"),
        // sysfs refuses new files to everyone, root too.
        (
            vec!["build".into(), p(&src), "-o".into(), "/sys/x.sheaf".into()],
            "Permission denied",
        ),
        (
            vec!["extract".into(), p(&img), "-C".into(), p(&under_file)],
            "Not a directory",
        ),
        (
            vec!["cat".into(), p(&missing), "a".into()],
            "No such file or directory",
        ),
    ] {
        let o = sheaf(&args);
        assert_eq!(o.code, 1, "{args:?}: {}", o.describe());
        let l = o.one_err_line();
        assert!(l.contains(want), "{args:?}: {l}");
        assert!(!o.stderr.contains("(os error"), "{args:?}: {l}");
    }
}

/// A tar archive, a compressed file, a SquashFS image or a text file given
/// where an image goes is named for what it is, with the command that
/// does what the user meant; `build` says what it takes.
#[test]
fn foreign_files_are_named_with_the_command_that_was_meant() {
    let t = tmpdir();
    let d = t.path();
    fs::create_dir_all(d.join("data/sub")).unwrap();
    write(&d.join("data/sub/a.txt"), b"a\n");
    for (name, flags) in [("ds.tar", "-cf"), ("ds.tar.gz", "-czf")] {
        run_cmd(
            Command::new("tar")
                .args([flags, name, "data"])
                .current_dir(d),
        )
        .ok();
    }
    // A SquashFS superblock begins with its magic, 0x73717368
    // little-endian: "hsqs".
    let mut sqfs = b"hsqs".to_vec();
    sqfs.resize(4096, 0);
    write(&d.join("old.sqfs"), &sqfs);
    write(&d.join("notes.txt"), b"not an image at all\n");
    fs::create_dir(d.join("mp")).unwrap();
    let p = |n: &str| d.join(n).to_string_lossy().into_owned();
    let expect = [
        (
            "ds.tar",
            format!("{} is a tar archive, not a sheaf image; pack it: sheaf build {} -o ds.sheaf", p("ds.tar"), p("ds.tar")),
        ),
        (
            "ds.tar.gz",
            format!("{} is a gzip-compressed file, not a sheaf image; if it holds a tar archive, pack it: sheaf build {} -o ds.sheaf", p("ds.tar.gz"), p("ds.tar.gz")),
        ),
        (
            "old.sqfs",
            format!("{} is a SquashFS image, not a sheaf image; convert it: sqfs2tar {} | sheaf build - -o old.sheaf (sqfs2tar: Debian's squashfs-tools-ng)", p("old.sqfs"), p("old.sqfs")),
        ),
        (
            "notes.txt",
            format!("{} is not a sheaf image (it does not begin with a sheaf header); sheaf build makes one from a directory or a tar archive", p("notes.txt")),
        ),
    ];
    for (file, want) in &expect {
        let f = p(file);
        for args in [
            vec!["info", &f],
            vec!["ls", &f],
            vec!["cat", &f, "data/sub/a.txt"],
            vec!["check", &f],
            vec!["du", &f],
            vec!["find", &f],
            vec!["mount", &f, &p("mp")],
        ] {
            let o = sheaf(&args);
            assert_eq!(o.code, 1, "{args:?}: {}", o.describe());
            assert_eq!(
                o.one_err_line(),
                format!("sheaf: error: {want}"),
                "{args:?}"
            );
        }
    }
    // What the message says to run does it.
    let img = d.join("ds.sheaf");
    build(&d.join("ds.tar"), &img, &[]);
    build(&d.join("ds.tar.gz"), &d.join("ds2.sheaf"), &[]);
    let o = sheaf(["cat".as_ref(), img.as_os_str(), "data/sub/a.txt".as_ref()]).ok();
    assert_eq!(o.text(), "a\n");
    // build: what it takes, instead of a tar parser's complaint.
    gzip(&d.join("notes.txt"));
    let takes = "sheaf build takes a directory, a tar archive (plain or .gz, .zst, .xz, .bz2) or - for a tar on standard input";
    for (file, want) in [
        ("notes.txt", format!("{} is neither a directory nor a tar archive; {takes}", p("notes.txt"))),
        ("notes.txt.gz", format!("{} is a gzip-compressed file that does not hold a tar archive; {takes}", p("notes.txt.gz"))),
        ("old.sqfs", format!("{} is a SquashFS image, not a directory or a tar archive; convert it: sqfs2tar {} | sheaf build - -o IMAGE (sqfs2tar: Debian's squashfs-tools-ng)", p("old.sqfs"), p("old.sqfs"))),
    ] {
        let out = d.join("x.sheaf");
        let o = sheaf(["build".as_ref(), d.join(file).as_os_str(), "-o".as_ref(), out.as_os_str()]);
        assert_eq!(o.code, 1, "{file}: {}", o.describe());
        assert_eq!(o.one_err_line(), format!("sheaf: error: {want}"));
        assert!(!out.exists());
    }
}

/// `gzip -k FILE`, asserting success.
fn gzip(f: &Path) {
    run_cmd(Command::new("gzip").arg("-k").arg(f)).ok();
}

/// mksquashfs's order, `sheaf build SRC OUT`: a usage error (exit 2) giving
/// the line meant, and nothing written.
#[test]
fn build_src_out_says_the_output_goes_after_o() {
    let t = tmpdir();
    let src = t.path().join("src");
    small_tree(&src, 5);
    let out = t.path().join("out.sheaf");
    let (s, o) = (src.display().to_string(), out.display().to_string());
    let r = sheaf(["build", &s, &o]);
    assert_eq!(r.code, 2, "{}", r.describe());
    assert_eq!(
        r.one_err_line(),
        format!(
            "sheaf: the output goes after -o: sheaf build {s} -o {o} (see 'sheaf build --help')"
        )
    );
    assert!(!out.exists());
    // What it says to run works.
    sheaf(["build", &s, "-o", &o]).ok();
    assert!(out.exists());
}
