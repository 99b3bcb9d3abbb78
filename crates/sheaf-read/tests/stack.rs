//! The merged view of stacked images: whiteouts, opaque directories, and
//! file/directory replacement across layers, on images built in-process.

use sheaf_read::{Found, Image, Stack};
use std::path::Path;
use std::sync::Arc;

/// Build a layer from `(path, content)` entries; a path ending in `/` is a
/// directory.
fn layer(dir: &Path, name: &str, entries: &[(&str, &str)]) -> Arc<Image> {
    sheaf_testkit::layer(dir, name, entries)
}

fn names(s: &Stack, path: &str) -> Vec<String> {
    let Found::Dir(d) = s.resolve(path.as_bytes()).unwrap() else {
        panic!("{path} is not a directory")
    };
    s.read_dir(&d)
        .unwrap()
        .into_iter()
        .map(|e| String::from_utf8(e.name).unwrap())
        .collect()
}

fn content(s: &Stack, path: &str) -> String {
    let (l, i) = s.resolve(path.as_bytes()).unwrap().shown();
    let img = &s.layers()[l];
    let mut b = vec![0u8; i.rec.size as usize];
    img.read(&i, 0, &mut b).unwrap();
    String::from_utf8(b).unwrap()
}

#[test]
fn whiteouts_opaque_dirs_and_replacements_merge_as_oci_says() {
    let t = tempfile::tempdir().unwrap();
    let base = layer(
        t.path(),
        "base",
        &[
            ("a/x", "base x"),
            ("a/y", "base y"),
            ("b/old", "old"),
            ("b/sub/deep", "deep"),
            ("c/inside", "in c"),
            ("d", "file d"),
            ("keep.txt", "kept"),
            ("gone.txt", "gone"),
            ("same.txt", "base"),
        ],
    );
    let mid = layer(
        t.path(),
        "mid",
        &[
            ("a/.wh.x", ""),
            ("a/z", "mid z"),
            ("b/.wh..wh..opq", ""),
            ("b/new", "new"),
            ("c", "c is a file now"),
            ("d/inner", "d is a dir now"),
            (".wh.gone.txt", ""),
            ("same.txt", "mid"),
        ],
    );
    let top = layer(
        t.path(),
        "top",
        &[("same.txt", "top"), ("a/x", "x is back")],
    );
    let two = Stack::new(vec![base.clone(), mid.clone()]);
    assert_eq!(
        names(&two, "/"),
        ["a", "b", "c", "d", "keep.txt", "same.txt"]
    );
    assert_eq!(names(&two, "a"), ["y", "z"]);
    assert_eq!(names(&two, "b"), ["new"]);
    assert_eq!(names(&two, "d"), ["inner"]);
    assert!(matches!(two.resolve(b"c").unwrap(), Found::Node(1, _)));
    assert_eq!(content(&two, "c"), "c is a file now");
    assert_eq!(content(&two, "a/y"), "base y");
    assert_eq!(content(&two, "same.txt"), "mid");
    for hidden in [
        "a/x",
        "b/old",
        "b/sub",
        "gone.txt",
        "a/.wh.x",
        ".wh.gone.txt",
        "b/.wh..wh..opq",
        "c/inside",
    ] {
        assert!(
            two.resolve(hidden.as_bytes()).is_err(),
            "{hidden} is visible"
        );
    }
    // A third layer brings a whited-out name back and wins over both.
    let three = Stack::new(vec![base.clone(), mid, top]);
    assert_eq!(names(&three, "a"), ["x", "y", "z"]);
    assert_eq!(content(&three, "a/x"), "x is back");
    assert_eq!(content(&three, "same.txt"), "top");
    // One layer is the image itself.
    let one = Stack::new(vec![base]);
    assert_eq!(names(&one, "b"), ["old", "sub"]);
}

/// Describe what a lookup found, for comparing two ways of looking up.
fn describe(f: &Option<Found>) -> String {
    match f {
        None => "none".into(),
        Some(Found::Node(l, i)) => format!("node {l}:{}", i.ino),
        Some(Found::Dir(d)) => format!(
            "dir {:?}",
            d.parts.iter().map(|(l, i)| (*l, i.ino)).collect::<Vec<_>>()
        ),
    }
}

/// Looking names up through an index of a directory many layers share
/// gives exactly what the layer-by-layer lookup gives, for every name any
/// layer holds (whiteouts, opaque dirs, replacements both ways), at the
/// root and one level down.
#[test]
fn indexed_lookups_agree_with_layer_by_layer_lookups() {
    let t = tempfile::tempdir().unwrap();
    let specs: Vec<Vec<(&str, &str)>> = vec![
        vec![
            ("a", "0"),
            ("d/x", "0"),
            ("d/y", "0"),
            ("f/", ""),
            ("g/in", "0"),
            ("h", "0"),
            ("o/old", "0"),
        ],
        vec![
            ("b", "1"),
            ("d/z", "1"),
            (".wh.h", ""),
            ("f", "file over dir"),
            ("o/.wh..wh..opq", ""),
            ("o/new", "1"),
        ],
        vec![
            ("c/", ""),
            ("d/.wh.x", ""),
            ("g", "file over dir"),
            ("h", "back"),
        ],
        vec![
            (".wh.a", ""),
            ("d/w", "3"),
            ("g/", ""),
            ("g/.wh..wh..opq", ""),
            ("e/", ""),
        ],
        vec![
            ("a/", ""),
            ("a/inside", "4"),
            ("d/y", "4 wins"),
            (".wh.b", ""),
            (".wh.f", ""),
            ("f", "5"),
        ],
    ];
    let layers: Vec<_> = specs
        .iter()
        .enumerate()
        .map(|(k, e)| layer(t.path(), &format!("l{k}"), e))
        .collect();
    let s = Stack::new(layers);
    let mut names: Vec<&str> = specs
        .iter()
        .flatten()
        .map(|(p, _)| p.trim_end_matches('/'))
        .collect();
    names.extend(["missing", "d/missing", ".wh.h", "d/.wh.x"]);
    let root = s.root().unwrap();
    let idx = s.index(&root).unwrap();
    let mut checked = 0;
    for n in &names {
        let (dir, idx, leaf) = match n.split_once('/') {
            None => (root.clone(), idx.clone(), *n),
            Some((top, leaf)) => match s.lookup(&root, top.as_bytes()).unwrap() {
                Some(Found::Dir(d)) => {
                    let i = s.index(&d).unwrap();
                    (d, i, leaf)
                }
                _ => continue,
            },
        };
        let slow = s.lookup(&dir, leaf.as_bytes()).unwrap();
        let fast = s.lookup_in(&dir, &idx, leaf.as_bytes()).unwrap();
        assert_eq!(describe(&slow), describe(&fast), "{n}");
        checked += 1;
    }
    assert!(checked > 20, "{checked}");
    // The index shows as many names as a listing.
    assert_eq!(idx.len(), s.read_dir(&root).unwrap().len());
}
