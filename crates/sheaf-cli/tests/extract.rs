//! `sheaf extract` of an untrusted image (issue 53, round two): by default
//! no device node is made and setuid/setgid bits are cleared from files,
//! each counted once on stderr and in `--json`; `-p`/`--preserve` restores
//! both, for system trees (docs/trust.md).

mod common;

use common::*;
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;

fn mode_of(p: &Path) -> u32 {
    fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

#[test]
fn devices_and_setuid_need_preserve() {
    // A user can make neither a device nor a root-owned setuid file to put
    // in the image.
    if !prerequisite(is_root(), "root (device nodes and root's setuid files)") {
        return;
    }
    let t = tmpdir();
    let src = t.path().join("src");
    fs::create_dir(&src).unwrap();
    mknod(&src.join("mem"), libc::S_IFCHR | 0o666, libc::makedev(1, 3)).unwrap();
    chmod(&src.join("mem"), 0o666);
    write(&src.join("suid"), b"#!/bin/sh\nid\n");
    chmod(&src.join("suid"), 0o4755);
    write(&src.join("sgid"), b"#!/bin/sh\nid\n");
    chmod(&src.join("sgid"), 0o2711);
    fs::create_dir(src.join("shared")).unwrap();
    chmod(&src.join("shared"), 0o2775);
    let img = t.path().join("img.sheaf");
    build(&src, &img, &["-q"]);

    // Default: no device, setuid/setgid cleared from files (a setgid
    // directory keeps its bit), one line for each.
    let out = t.path().join("default");
    let o = extract(&img, &out);
    assert!(
        fs::symlink_metadata(out.join("mem")).is_err(),
        "a device was made without --preserve"
    );
    assert_eq!(mode_of(&out.join("suid")), 0o755);
    assert_eq!(mode_of(&out.join("sgid")), 0o711);
    assert_eq!(mode_of(&out.join("shared")), 0o2775);
    assert_eq!(fs::metadata(out.join("suid")).unwrap().uid(), 0);
    let lines = o.err_lines();
    let dev: Vec<_> = lines.iter().filter(|l| l.contains("device")).collect();
    assert_eq!(dev.len(), 1, "{}", o.describe());
    assert!(dev[0].contains("1 device not created") && dev[0].contains("mem"));
    let sid: Vec<_> = lines.iter().filter(|l| l.contains("setuid")).collect();
    assert_eq!(sid.len(), 1, "{}", o.describe());
    assert!(sid[0].contains("cleared on 2 files"), "{}", sid[0]);
    assert!(!o.stderr.contains("could not be restored"), "{}", o.stderr);

    // The counts in --json.
    let out = t.path().join("json");
    let o = sheaf_in([
        "extract".as_ref(),
        img.as_os_str(),
        "-C".as_ref(),
        out.as_os_str(),
        "--json".as_ref(),
    ])
    .ok();
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["skipped_devices"], 1);
    assert_eq!(j["first_skipped_device"], "mem");
    assert_eq!(j["setuid_cleared"], 2);
    assert_eq!(j["entries"], 4);

    // --preserve (and tar's -p): both come back as the image has them.
    for flag in ["--preserve", "-p"] {
        let out = t.path().join(format!("preserve{flag}"));
        let o = sheaf_in([
            "extract".as_ref(),
            img.as_os_str(),
            "-C".as_ref(),
            out.as_os_str(),
            flag.as_ref(),
        ])
        .ok();
        let m = fs::symlink_metadata(out.join("mem")).unwrap();
        assert!(m.file_type().is_char_device(), "{flag}");
        assert_eq!(m.rdev(), libc::makedev(1, 3), "{flag}");
        assert_eq!(mode_of(&out.join("mem")), 0o666, "{flag}");
        assert_eq!(mode_of(&out.join("suid")), 0o4755, "{flag}");
        assert_eq!(mode_of(&out.join("sgid")), 0o2711, "{flag}");
        assert!(
            !o.stderr.contains("not created") && !o.stderr.contains("cleared"),
            "{}",
            o.describe()
        );
    }
}

/// Into a directory that has the files: without -f a one-line refusal
/// naming -f; with it (as `unsquashfs -f`) every entry is the image's,
/// what DIR had besides stays, and a symlink planted where an entry goes
/// is replaced, never followed (what it points to is untouched).
#[test]
fn extract_f_replaces_existing_files_without_following_planted_symlinks() {
    let t = tmpdir();
    let src = t.path().join("src");
    for (p, data) in [
        ("a.txt", "new a\n"),
        ("sub/b.txt", "new b\n"),
        ("sub/deep/c.txt", "new c\n"),
        ("d/e.txt", "new e\n"),
    ] {
        let p = src.join(p);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, data).unwrap();
    }
    std::os::unix::fs::symlink("a.txt", src.join("link")).unwrap();
    let img = t.path().join("t.sheaf");
    build(&src, &img, &[]);
    // Outside DIR: what planted symlinks point to.
    let outside = t.path().join("outside");
    fs::create_dir_all(outside.join("dir")).unwrap();
    fs::write(outside.join("victim.txt"), "victim\n").unwrap();
    let out = t.path().join("out");
    fs::create_dir_all(out.join("sub/deep")).unwrap();
    fs::write(out.join("a.txt"), "old a, longer than the new one\n").unwrap();
    std::os::unix::fs::symlink(outside.join("victim.txt"), out.join("sub/b.txt")).unwrap();
    fs::write(out.join("sub/extra.txt"), "mine\n").unwrap();
    fs::write(out.join("link"), "a file where the link goes\n").unwrap();
    std::os::unix::fs::symlink(outside.join("dir"), out.join("d")).unwrap();
    let untouched = |what: &str| {
        assert_eq!(
            fs::read_to_string(outside.join("victim.txt")).unwrap(),
            "victim\n",
            "{what}"
        );
        assert_eq!(
            fs::read_dir(outside.join("dir")).unwrap().count(),
            0,
            "{what}"
        );
    };
    let o = run_cmd(cmd().arg("extract").arg(&img).arg("-C").arg(&out));
    assert_eq!(o.code, 1, "{}", o.describe());
    let line = o.one_err_line();
    assert!(
        line.contains("already exists") && line.contains("-f"),
        "{line}"
    );
    untouched("without -f");
    let o = run_cmd(cmd().arg("extract").arg("-f").arg(&img).arg("-C").arg(&out));
    assert_eq!(o.code, 0, "{}", o.describe());
    untouched("with -f");
    // Every entry is the source's.
    for rel in walk(&src) {
        let (s, d) = (join(&src, &rel), join(&out, &rel));
        let (sm, dm) = (
            fs::symlink_metadata(&s).unwrap(),
            fs::symlink_metadata(&d).unwrap(),
        );
        assert_eq!(sm.file_type(), dm.file_type(), "{}", lossy(&rel));
        if sm.is_file() {
            assert_eq!(
                fs::read(&s).unwrap(),
                fs::read(&d).unwrap(),
                "{}",
                lossy(&rel)
            );
        } else if sm.file_type().is_symlink() {
            assert_eq!(fs::read_link(&s).unwrap(), fs::read_link(&d).unwrap());
        }
    }
    // Merged: what DIR had that the image has not stays.
    assert_eq!(
        fs::read_to_string(out.join("sub/extra.txt")).unwrap(),
        "mine\n"
    );
    // --force is the long name.
    let o = run_cmd(
        cmd()
            .arg("extract")
            .arg("--force")
            .arg(&img)
            .arg("-C")
            .arg(&out),
    );
    assert_eq!(o.code, 0, "{}", o.describe());
    untouched("again");
}
