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
