//! Building from tar archives made by GNU tar (gnu and pax formats, sparse,
//! compressed, on stdin), compared with the tree they were made from; and
//! hostile or non-tar input.

mod common;

use common::*;
use std::fs;
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

const SPARSE_LEN: u64 = 24 << 20;

/// A tree with what tar can carry: files, dirs, symlinks, hardlinks (one
/// with a long name), long names and paths, a fifo, modes, owners, xattrs,
/// nanosecond mtimes. With `sparse`, also a 24 MiB file with two data runs.
fn tar_tree(root: &Path, sparse: bool) {
    let mut r = Rng::new(99);
    let p = |rel: &str| root.join(rel);
    fs::create_dir_all(p("dir/sub")).unwrap();
    fs::create_dir_all(p("links")).unwrap();
    fs::create_dir_all(p("empty-dir")).unwrap();
    write(&p("file.txt"), &r.text(12_345));
    write(&p("data.bin"), &r.bytes(1_500_000));
    write(&p("empty"), b"");
    write(&p("dir/sub/inner.txt"), &r.text(777));
    write(&p("exec"), b"#!/bin/sh\n");
    chmod(&p("exec"), 0o755);
    write(&p("private"), b"secret\n");
    chmod(&p("private"), 0o600);
    write(&p("setuid"), b"suid\n");
    chmod(&p("setuid"), 0o4755);
    symlink(b"../file.txt", &p("links/rel"));
    symlink(b"/etc/hostname", &p("links/abs"));
    symlink(b"gone", &p("links/dangling"));
    write(&p("hard-a"), &r.text(4000));
    fs::hard_link(p("hard-a"), p("dir/hard-b")).unwrap();
    // Long names: a 150-byte name, and a path of more than 255 bytes.
    let n150 = "n".repeat(150);
    write(&p(&format!("dir/{n150}")), b"long name\n");
    let long_dir = format!("{}/{}/{}", "a".repeat(100), "b".repeat(100), "c".repeat(60));
    fs::create_dir_all(p(&long_dir)).unwrap();
    let long_file = format!("{long_dir}/file-with-a-long-path.txt");
    assert!(long_file.len() > 255);
    write(&p(&long_file), &r.text(3000));
    // A hardlink whose both names are long, and a long symlink target.
    fs::hard_link(
        p(&long_file),
        p(&format!("{long_dir}/second-name-of-the-same-file.txt")),
    )
    .unwrap();
    symlink(long_file.as_bytes(), &p("links/long-target"));
    let c = std::ffi::CString::new(p("fifo").into_os_string().into_encoded_bytes()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    if is_root() {
        mknod(&p("chr"), libc::S_IFCHR | 0o600, libc::makedev(1, 3)).unwrap();
        write(&p("owned"), b"owned\n");
        lchown(&p("owned"), 1234, 5678);
    }
    xattr::set(p("file.txt"), "user.color", b"blue").unwrap();
    xattr::set(p("dir"), "user.dir-attr", b"\x00\x01binary").unwrap();
    if sparse {
        let mut f = fs::File::create(p("sparse.bin")).unwrap();
        f.write_all(&r.bytes(200_000)).unwrap();
        f.seek(SeekFrom::Start(SPARSE_LEN - 300_000)).unwrap();
        f.write_all(&r.bytes(300_000)).unwrap();
    }
    chmod(root, 0o755);
    set_all_mtimes(root, |i, _| {
        (
            1_600_000_000 + i as i64 * 77,
            (i as u32 * 123_456_789 + 5) % 1_000_000_000,
        )
    });
}

struct Case {
    _t: tempfile::TempDir,
    dir: PathBuf,
    src: PathBuf,
}

fn case(sparse: bool) -> Case {
    let t = tmpdir();
    let dir = t.path().to_path_buf();
    let src = dir.join("src");
    fs::create_dir(&src).unwrap();
    tar_tree(&src, sparse);
    Case { _t: t, dir, src }
}

/// Run GNU tar over the case's source tree.
fn gnu_tar(c: &Case, archive: &str, flags: &[&str]) -> PathBuf {
    let out = c.dir.join(archive);
    let o = run_cmd(
        Command::new("tar")
            .args(flags)
            .arg("-cf")
            .arg(&out)
            .arg("-C")
            .arg(&c.src)
            .arg("."),
    );
    assert_eq!(o.code, 0, "tar {flags:?} failed: {}", o.stderr);
    out
}

fn cmp_gnu() -> Cmp {
    Cmp {
        owner: is_root(),
        nsec: false,
        xattrs: false,
        ..Cmp::all()
    }
}

/// Build from `archive`, extract, and compare with the source.
fn round_trip(c: &Case, archive: &Path, cmp: Cmp) -> PathBuf {
    let img = c.dir.join(format!(
        "{}.sheaf",
        archive.file_name().unwrap().to_string_lossy()
    ));
    build(archive, &img, &[]);
    let out = c.dir.join(format!(
        "{}.out",
        archive.file_name().unwrap().to_string_lossy()
    ));
    extract_preserving(&img, &out);
    assert_same_tree(&c.src, &out, cmp);
    img
}

#[test]
fn gnu_format_round_trips() {
    let c = case(false);
    let a = gnu_tar(&c, "gnu.tar", &["--format=gnu"]);
    round_trip(&c, &a, cmp_gnu());
}

#[test]
fn pax_format_with_xattrs_round_trips_with_nanoseconds() {
    let c = case(false);
    let a = gnu_tar(
        &c,
        "pax.tar",
        &["--format=pax", "--xattrs", "--xattrs-include=*"],
    );
    // pax records carry mtimes with nanoseconds and SCHILY.xattr.* records.
    round_trip(
        &c,
        &a,
        Cmp {
            owner: is_root(),
            ..Cmp::all()
        },
    );
}

#[test]
fn pax_format_without_xattrs_round_trips() {
    let c = case(false);
    let a = gnu_tar(&c, "pax-plain.tar", &["--format=pax"]);
    round_trip(
        &c,
        &a,
        Cmp {
            owner: is_root(),
            xattrs: false,
            ..Cmp::all()
        },
    );
}

fn assert_sparse_result(img: &Path, out: &Path) {
    let md = fs::metadata(out.join("sparse.bin")).unwrap();
    assert_eq!(md.len(), SPARSE_LEN);
    assert!(
        md.blocks() * 512 < 4 << 20,
        "extracted sparse.bin uses {} bytes",
        md.blocks() * 512
    );
    let v = json(&sheaf(["info".as_ref(), img.as_os_str(), "--json".as_ref()]).ok());
    assert!(
        v["hole_bytes"].as_u64().unwrap_or(0) >= 16 << 20,
        "hole_bytes {}",
        v["hole_bytes"]
    );
}

#[test]
fn gnu_sparse_archive_round_trips_and_stays_sparse() {
    let c = case(true);
    let a = gnu_tar(&c, "sparse-gnu.tar", &["--format=gnu", "-S"]);
    let img = round_trip(&c, &a, cmp_gnu());
    assert_sparse_result(&img, &c.dir.join("sparse-gnu.tar.out"));
}

#[test]
fn pax_sparse_archive_round_trips() {
    // GNU tar's default sparse encoding in pax archives (GNU.sparse.* records).
    let c = case(true);
    let a = gnu_tar(&c, "sparse-pax.tar", &["--format=pax", "-S"]);
    let img = round_trip(
        &c,
        &a,
        Cmp {
            owner: is_root(),
            xattrs: false,
            ..Cmp::all()
        },
    );
    assert_sparse_result(&img, &c.dir.join("sparse-pax.tar.out"));
}

#[test]
fn compressed_archives_round_trip() {
    let c = case(false);
    for (name, flag) in [
        ("c.tar.gz", "-z"),
        ("c.tar.zst", "--zstd"),
        ("c.tar.xz", "-J"),
        ("c.tar.bz2", "-j"),
    ] {
        let a = gnu_tar(&c, name, &["--format=gnu", flag]);
        round_trip(&c, &a, cmp_gnu());
    }
}

#[test]
fn archive_on_stdin_round_trips() {
    let c = case(false);
    for (name, flags) in [
        (
            "stdin.tar",
            &["--format=pax", "--xattrs", "--xattrs-include=*"][..],
        ),
        ("stdin.tar.zst", &["--format=gnu", "--zstd"][..]),
    ] {
        let a = gnu_tar(&c, name, flags);
        let img = c.dir.join(format!("{name}.sheaf"));
        let f = fs::File::open(&a).unwrap();
        run_cmd(cmd().arg("build").arg("-").arg("-o").arg(&img).stdin(f)).ok();
        let out = c.dir.join(format!("{name}.out"));
        extract_preserving(&img, &out);
        let cmp = if name == "stdin.tar" {
            Cmp {
                owner: is_root(),
                ..Cmp::all()
            }
        } else {
            cmp_gnu()
        };
        assert_same_tree(&c.src, &out, cmp);
    }
}

/// A tar archive written entry by entry with raw (unchecked) names.
struct RawTar(tar::Builder<Vec<u8>>);

impl RawTar {
    fn new() -> Self {
        RawTar(tar::Builder::new(Vec::new()))
    }
    fn entry(&mut self, kind: tar::EntryType, name: &[u8], link: &[u8], data: &[u8]) -> &mut Self {
        let mut h = tar::Header::new_gnu();
        h.as_old_mut().name[..name.len()].copy_from_slice(name);
        h.as_old_mut().linkname[..link.len()].copy_from_slice(link);
        h.set_entry_type(kind);
        h.set_mode(if kind == tar::EntryType::Directory {
            0o755
        } else {
            0o644
        });
        h.set_size(data.len() as u64);
        h.set_mtime(1_600_000_000);
        h.set_cksum();
        self.0.append(&h, data).unwrap();
        self
    }
    fn file(&mut self, name: &[u8], data: &[u8]) -> &mut Self {
        self.entry(tar::EntryType::Regular, name, b"", data)
    }
    fn finish(&mut self) -> Vec<u8> {
        std::mem::replace(&mut self.0, tar::Builder::new(Vec::new()))
            .into_inner()
            .unwrap()
    }
}

/// Everything under `dir`, as relative paths.
fn listing(dir: &Path) -> Vec<String> {
    walk(dir).iter().map(|p| lossy(p)).collect()
}

#[test]
fn parent_directory_entries_never_escape() {
    let t = tmpdir();
    // sandbox/ holds the archive, the image and the extraction target; nothing
    // may appear anywhere else in it.
    let sandbox = t.path().join("sandbox");
    fs::create_dir(&sandbox).unwrap();
    let tarball = RawTar::new()
        .file(b"ok.txt", b"fine\n")
        .file(b"../evil", b"escaped\n")
        .file(b"sub/../../evil2", b"escaped\n")
        .entry(tar::EntryType::Link, b"hl", b"../../etc/passwd", b"")
        .file(b"after.txt", b"still fine\n")
        .finish();
    let a = sandbox.join("evil.tar");
    fs::write(&a, &tarball).unwrap();
    let img = sandbox.join("evil.sheaf");

    // Without --skip-errors: one clean error line naming the entry, no image.
    let o = run_cmd(cmd().arg("build").arg(&a).arg("-o").arg(&img));
    o.no_panic();
    assert_eq!(o.code, 1, "{}", o.describe());
    let line = o.one_err_line();
    assert!(
        line.starts_with("sheaf: error:") && line.contains("evil"),
        "{line}"
    );
    assert!(!img.exists(), "a failed build left an image");
    assert!(
        temp_leftovers(&sandbox).is_empty(),
        "temp files left: {:?}",
        temp_leftovers(&sandbox)
    );

    // With --skip-errors: the escaping entries are skipped and listed.
    let o = run_cmd(
        cmd()
            .arg("build")
            .arg(&a)
            .arg("-o")
            .arg(&img)
            .arg("--skip-errors"),
    )
    .ok();
    for bad in ["../evil", "evil2", "hl"] {
        assert!(
            o.stderr.contains(bad),
            "skipped entry {bad} not reported: {}",
            o.stderr
        );
    }
    let out = sandbox.join("out");
    extract_preserving(&img, &out);
    assert_eq!(listing(&out), ["", "after.txt", "ok.txt"], "extracted tree");
    let mut all = listing(&sandbox);
    all.retain(|p| !p.starts_with("out/") && p != "out");
    assert_eq!(
        all,
        ["", "evil.sheaf", "evil.tar"],
        "something was written outside the target"
    );
    assert_eq!(
        listing(t.path()),
        [
            "",
            "sandbox",
            "sandbox/evil.sheaf",
            "sandbox/evil.tar",
            "sandbox/out",
            "sandbox/out/after.txt",
            "sandbox/out/ok.txt"
        ]
    );
}

#[test]
fn entries_through_an_archived_symlink_never_escape() {
    let t = tmpdir();
    let outside = t.path().join("outside");
    fs::create_dir(&outside).unwrap();
    let target = outside.to_str().unwrap().as_bytes().to_vec();
    let tarball = RawTar::new()
        .entry(tar::EntryType::Symlink, b"link", &target, b"")
        .file(b"link/evil", b"escaped\n")
        .finish();
    let a = t.path().join("sym.tar");
    fs::write(&a, &tarball).unwrap();
    let img = t.path().join("sym.sheaf");
    let o = run_cmd(cmd().arg("build").arg(&a).arg("-o").arg(&img));
    o.no_panic();
    if o.code == 0 {
        // If it was accepted, extraction must still not follow the symlink.
        let x = run_cmd(
            cmd()
                .arg("extract")
                .arg(&img)
                .arg("-C")
                .arg(t.path().join("out")),
        );
        x.no_panic();
    } else {
        assert_eq!(o.code, 1);
        o.one_err_line();
    }
    assert!(
        fs::read_dir(&outside).unwrap().next().is_none(),
        "a file was written through the symlink"
    );
}

/// Whatever the order: a directory replaced by a symlink to the outside and
/// then written through, a hardlink to a name that later becomes such a
/// symlink, and an extraction into a target that already holds symlinks
/// where the image has directories: nothing is ever written outside.
#[test]
fn no_order_of_entries_and_no_existing_tree_lets_a_write_escape() {
    let t = tmpdir();
    let outside = t.path().join("outside");
    fs::create_dir(&outside).unwrap();
    let target = outside.to_str().unwrap().as_bytes().to_vec();
    let orders: Vec<(&str, Vec<u8>)> = vec![
        (
            "dir, then symlink over it, then a file through it",
            RawTar::new()
                .file(b"d/x", b"inside\n")
                .entry(tar::EntryType::Symlink, b"d", &target, b"")
                .file(b"d/y", b"escaped\n")
                .finish(),
        ),
        (
            "hardlink, then its name's directory becomes a symlink",
            RawTar::new()
                .file(b"e/f", b"inside\n")
                .entry(tar::EntryType::Link, b"g", b"e/f", b"")
                .entry(tar::EntryType::Symlink, b"e", &target, b"")
                .entry(tar::EntryType::Link, b"e/h", b"g", b"")
                .finish(),
        ),
        (
            "symlink to a relative outside path, then a directory entry under it",
            RawTar::new()
                .entry(tar::EntryType::Symlink, b"up", b"../../outside", b"")
                .entry(tar::EntryType::Directory, b"up/newdir", b"", b"")
                .file(b"up/newdir/z", b"escaped\n")
                .finish(),
        ),
    ];
    for (what, tarball) in orders {
        let a = t.path().join("order.tar");
        fs::write(&a, &tarball).unwrap();
        let img = t.path().join("order.sheaf");
        let _ = fs::remove_file(&img);
        let o = run_cmd(cmd().arg("build").arg(&a).arg("-o").arg(&img));
        o.no_panic();
        if o.code == 0 {
            let out = t.path().join("out");
            let _ = fs::remove_dir_all(&out);
            run_cmd(cmd().arg("extract").arg(&img).arg("-C").arg(&out)).no_panic();
        } else {
            assert_eq!(o.code, 1, "{what}: {}", o.describe());
            o.one_err_line();
        }
        assert!(
            fs::read_dir(&outside).unwrap().next().is_none(),
            "{what}: a file was written outside"
        );
    }
    // An existing target whose names are symlinks to the outside, where
    // the image has directories and files: extraction must not follow them.
    let src = t.path().join("src");
    fs::create_dir_all(src.join("a/b")).unwrap();
    write(&src.join("a/b/file"), b"data\n");
    write(&src.join("top"), b"top\n");
    let img = t.path().join("plain.sheaf");
    build(&src, &img, &[]);
    let out = t.path().join("existing");
    fs::create_dir_all(&out).unwrap();
    std::os::unix::fs::symlink(&outside, out.join("a")).unwrap();
    std::os::unix::fs::symlink(outside.join("top"), out.join("top")).unwrap();
    let o = run_cmd(cmd().arg("extract").arg(&img).arg("-C").arg(&out));
    o.no_panic();
    assert!(
        fs::read_dir(&outside).unwrap().next().is_none(),
        "extraction followed a symlink already in the target ({})",
        o.describe()
    );
}

/// gzip `data` with the system gzip.
fn gzip(data: &[u8]) -> Vec<u8> {
    let mut g = Command::new("gzip")
        .arg("-c")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    g.stdin.take().unwrap().write_all(data).unwrap();
    g.wait_with_output().unwrap().stdout
}

/// Write `bytes` as `dir/name`, build it, and assert the build fails with
/// one error line naming the archive, leaving no image and no temp file.
/// Returns the image path that must not exist.
#[track_caller]
fn build_fails_naming_the_archive(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let f = dir.join(name);
    fs::write(&f, bytes).unwrap();
    let img = dir.join(format!("{name}.sheaf"));
    let o = run_cmd(cmd().arg("build").arg(&f).arg("-o").arg(&img));
    o.no_panic();
    assert_eq!(o.code, 1, "{name}: {}", o.describe());
    let line = o.one_err_line();
    assert!(
        line.starts_with("sheaf: error: ") && line.contains(name),
        "{name}: the error does not name the archive: {line}"
    );
    assert!(!img.exists(), "{name}: image left behind");
    assert!(
        temp_leftovers(dir).is_empty(),
        "{name}: temp files left: {:?}",
        temp_leftovers(dir)
    );
    img
}

#[test]
fn non_tar_input_gives_one_clean_error() {
    let t = tmpdir();
    let mut r = Rng::new(5);
    let inputs: Vec<(&str, Vec<u8>)> = vec![
        ("random.bin", r.bytes(1 << 20)),
        ("text.txt", b"this is not a tar archive\n".repeat(100)),
        ("zeros.tar", vec![0u8; 10240]),
        ("empty.tar", Vec::new()),
        ("tiny", b"x".to_vec()),
        // A valid gzip stream of something that is not tar.
        ("fake.tar.gz", gzip(&r.bytes(50_000))),
    ];
    for (name, bytes) in inputs {
        let img = build_fails_naming_the_archive(t.path(), name, &bytes);
        // The same on stdin names <stdin>.
        let o = run_with_stdin(cmd().arg("build").arg("-").arg("-o").arg(&img), bytes);
        o.no_panic();
        assert_eq!(o.code, 1, "{name} on stdin: {}", o.describe());
        let line = o.one_err_line();
        assert!(
            line.starts_with("sheaf: error: "),
            "{name} on stdin: {line}"
        );
    }
}

#[test]
fn truncated_archive_gives_one_error_naming_the_archive() {
    let t = tmpdir();
    let mut r = Rng::new(6);
    let mut tb = RawTar::new();
    tb.file(b"a.bin", &r.bytes(300_000));
    let plain = tb.finish();
    let gz = gzip(&plain);
    for (name, bytes) in [
        ("truncated.tar", plain[..100_000].to_vec()),
        ("truncated.tar.gz", gz[..gz.len() / 2].to_vec()),
    ] {
        build_fails_naming_the_archive(t.path(), name, &bytes);
    }
}

#[test]
fn exclude_applies_to_archive_input_as_to_directories() {
    let t = tmpdir();
    let src = t.path().join("src");
    for d in ["build/sub", "lib/deep", "lib/build"] {
        fs::create_dir_all(src.join(d)).unwrap();
    }
    for f in [
        "main.c",
        "main.o",
        "build/a.c",
        "build/sub/z.c",
        "lib/x.o",
        "lib/deep/y.c",
        "lib/keep.c",
        "lib/build/n.c",
    ] {
        write(&src.join(f), f.as_bytes());
    }
    let a = t.path().join("s.tar");
    let o = run_cmd(
        Command::new("tar")
            .arg("-cf")
            .arg(&a)
            .arg("-C")
            .arg(&src)
            .arg("."),
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let excl = [
        "--exclude",
        "*.o",
        "--exclude",
        "build",
        "--exclude",
        "lib/deep",
    ];
    let listing = |input: &Path, img: &str| {
        let img = t.path().join(img);
        build(input, &img, &excl);
        ls_r_paths(
            &sheaf(["ls".as_ref(), img.as_os_str(), "-R".as_ref()])
                .ok()
                .text(),
        )
    };
    let from_dir = listing(&src, "d.sheaf");
    assert_eq!(from_dir, "lib\nmain.c\nlib/keep.c\n", "directory input");
    let from_tar = listing(&a, "t.sheaf");
    assert_eq!(
        from_tar, from_dir,
        "tar input is filtered differently from the same tree as a directory"
    );
}

/// A non-directory at the archive's root (`./` as a file) is refused, as
/// from an entry list (normalize.rs): it once was ignored silently.
/// `--skip-errors` lists it and builds the rest.
#[test]
fn a_non_directory_root_entry_is_refused() {
    let t = tmpdir();
    let a = t.path().join("root-file.tar");
    let mut b = tar::Builder::new(Vec::new());
    for (path, data) in [("./", &b"not a dir"[..]), ("./kept", &b"kept"[..])] {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(0o644);
        h.set_size(data.len() as u64);
        b.append_data(&mut h, path, data).unwrap();
    }
    fs::write(&a, b.into_inner().unwrap()).unwrap();
    let img = t.path().join("root-file.sheaf");
    let o = run_cmd(cmd().arg("build").arg(&a).arg("-o").arg(&img));
    o.no_panic();
    assert_eq!(o.code, 1, "{}", o.describe());
    assert!(
        o.one_err_line().contains("the root must be a directory"),
        "{}",
        o.describe()
    );
    assert!(!img.exists());
    let o = run_cmd(
        cmd()
            .arg("build")
            .arg(&a)
            .arg("-o")
            .arg(&img)
            .arg("--skip-errors"),
    );
    assert_eq!(o.code, 0, "{}", o.describe());
    let o = run_cmd(cmd().arg("cat").arg(&img).arg("kept"));
    assert_eq!(o.stdout, b"kept", "{}", o.describe());
}
