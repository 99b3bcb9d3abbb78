//! Trees deeper than PATH_MAX (4096 bytes) pack from a directory and unpack.

mod common;

use common::*;
use std::process::Command;

/// `find DIR` listing (relative path, type, size, mode), sorted; find walks
/// with relative directory handles, so it copes with any depth.
fn listing(dir: &std::path::Path) -> String {
    let o = Command::new("find")
        .arg(".")
        .args(["-printf", "%P %y %s %m\n"])
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "find failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let mut lines: Vec<_> = String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with(" d"))
        .map(|l| {
            // Directory sizes differ between filesystems; keep type and mode.
            let f: Vec<_> = l.rsplitn(4, ' ').collect();
            if f[2] == "d" {
                format!("{} d {}", f[3], f[0])
            } else {
                l.to_string()
            }
        })
        .collect();
    lines.sort();
    lines.join("\n")
}

#[test]
fn a_tree_deeper_than_path_max_round_trips() {
    let t = tmpdir();
    let src = t.path().join("src");
    std::fs::create_dir(&src).unwrap();
    // 90 levels of 100-byte names: 9 KB paths. Made with chdir in a child
    // process, since paths this long cannot be named in one system call.
    let script = r#"
import os, sys
os.chdir(sys.argv[1])
for i in range(90):
    d = ("d%02d" % i) + "x" * 97
    os.mkdir(d)
    os.chdir(d)
    if i % 30 == 29:
        with open("mid%d.txt" % i, "w") as f:
            f.write("middle %d\n" % i)
with open("bottom.txt", "w") as f:
    f.write("the bottom\n" * 1000)
os.symlink("bottom.txt", "link")
"#;
    let st = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(&src)
        .status()
        .unwrap();
    assert!(st.success());
    let img = t.path().join("deep.sheaf");
    build(&src, &img, &[]);
    let out = t.path().join("out");
    extract(&img, &out);
    assert_eq!(listing(&src), listing(&out));
    // The deepest file reads back through the CLI by its 9 KB path.
    let mut p = String::new();
    for i in 0..90 {
        p.push_str(&format!("d{i:02}{}/", "x".repeat(97)));
    }
    p.push_str("bottom.txt");
    let o = sheaf([
        std::ffi::OsStr::new("cat"),
        img.as_os_str(),
        std::ffi::OsStr::new(&p),
    ])
    .ok();
    assert_eq!(o.stdout, b"the bottom\n".repeat(1000));
}
