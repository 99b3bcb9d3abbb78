//! Stacks of layers from the command line: `sheaf ls BASE,LAYER,...` shows
//! the merged view, with OCI whiteouts applied and never shown.

mod common;

use common::*;
use std::fs;

#[test]
fn ls_on_a_stack_shows_the_merged_view() {
    let t = tmpdir();
    let base = t.path().join("base");
    let top = t.path().join("top");
    for (root, files) in [
        (&base, &["a/x", "a/y", "b/old", "keep", "c/inside"][..]),
        (
            &top,
            &["a/.wh.x", "a/z", ".wh.keep", "b/.wh..wh..opq", "b/new", "c"][..],
        ),
    ] {
        for f in files {
            let p = root.join(f);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            write(&p, f.as_bytes());
        }
    }
    let (bi, ti) = (t.path().join("base.sheaf"), t.path().join("top.sheaf"));
    build(&base, &bi, &[]).ok();
    build(&top, &ti, &[]).ok();
    let stack = format!("{},{}", bi.display(), ti.display());
    let o = sheaf(["ls", "-R", &stack]).ok();
    assert_eq!(o.text(), "a\nb\nc\na/y\na/z\nb/new\n");
    // A file of the top layer over a directory of the base.
    let o = sheaf(["ls", "-l", &stack, "c"]).ok();
    assert!(o.text().starts_with("-rw"), "{}", o.text());
    // Hidden names are not found, and whiteouts cannot be named.
    for p in ["keep", "a/x", "b/old", "a/.wh.x"] {
        let o = sheaf(["ls", &stack, p]).fails_with(1);
        assert!(
            o.one_err_line().contains("no such file"),
            "{p}: {}",
            o.describe()
        );
    }
    // The layer's own whiteouts and opaque directories.
    let o = sheaf(["info".as_ref(), ti.as_os_str(), "--whiteouts".as_ref()]).ok();
    assert!(
        o.text().contains(
            "whiteouts:    2 (hidden in the layers below)\n  a/x\n  keep\nopaque dirs:  1\n  b/\n"
        ),
        "{}",
        o.text()
    );
    let j = json(
        &sheaf([
            "info".as_ref(),
            ti.as_os_str(),
            "--whiteouts".as_ref(),
            "--json".as_ref(),
        ])
        .ok(),
    );
    assert_eq!(j["whiteouts"], serde_json::json!(["a/x", "keep"]));
    assert_eq!(j["opaque_dirs"], serde_json::json!(["b"]));
    // One missing layer: one line naming it.
    let bad = format!("{},{}", bi.display(), t.path().join("nope.sheaf").display());
    let o = sheaf(["ls", &bad]).fails_with(1);
    assert!(o.one_err_line().contains("nope.sheaf"), "{}", o.describe());
}
