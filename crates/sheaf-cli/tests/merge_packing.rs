//! `sheaf merge` packs like `sheaf build` (docs/layers.md): an image merged
//! from a base and a small layer is within a few percent of the image
//! `sheaf build` makes of the same tree materialised on disk (which does not
//! go through merge), with a trained dictionary as that one has, its data
//! stored in as many bytes, and extracts to that tree. `sheaf commit` is a build of the upper directory:
//! the same bytes.

mod common;

use common::*;
use std::fs;
use std::path::Path;

/// Source-like text: lines drawn from a vocabulary every file shares (what
/// a dictionary learns), with numbers that differ.
fn code(r: &mut Rng, n: usize) -> Vec<u8> {
    const HEAD: &[&str] = &[
        "def",
        "class",
        "return",
        "import",
        "from . import",
        "if not",
        "raise ValueError(",
        "self.assertEqual(",
        "logger.debug(\"",
        "yield",
    ];
    const SYL: &[&str] = &[
        "arr", "dtype", "axis", "shape", "buf", "fft", "lin", "alg", "core", "ma", "io", "nd",
    ];
    let word = |i: u64| -> String {
        let mut x = i * 2_654_435_761 % 1_000_003;
        let mut w = String::new();
        for _ in 0..3 {
            w.push_str(SYL[(x % SYL.len() as u64) as usize]);
            x /= SYL.len() as u64;
        }
        w
    };
    let mut v = Vec::with_capacity(n + 120);
    while v.len() < n {
        let h = HEAD[r.below(HEAD.len() as u64) as usize];
        let (a, b) = (r.below(2500), r.below(2500));
        let line = format!(
            "    {h} {}_{}({}, {})\n",
            word(a),
            word(b),
            r.below(4096),
            word(a ^ b)
        );
        v.extend_from_slice(line.as_bytes());
    }
    v.truncate(n);
    v
}

/// [`write`], making the parent directories first.
fn put(p: &Path, data: &[u8]) {
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    write(p, data);
}

/// One version of a package: the same 60 modules in every version, each
/// changed in a line or two from the first version's (versions side by
/// side compress against each other, as in a software pool).
fn package(root: &Path, version: &str, seed: u64) {
    for i in 0..60u64 {
        let mut r = Rng::new(1000 + i);
        let mut m = code(&mut r, 6000 + (i as usize * 97) % 3000);
        let mut v = Rng::new(seed * 100 + i);
        for _ in 0..2 {
            let at = v.below(m.len() as u64 - 40) as usize;
            m[at..at + 30].copy_from_slice(&code(&mut v, 30));
        }
        put(
            &root.join(format!("pkgs/numlib/{version}/numlib/m{i:02}.py")),
            &m,
        );
    }
}

/// The base tree: over 16 MiB of small source files (enough to train a
/// dictionary), three versions of a package, and two versions of a large
/// text file (reference blocks).
fn base_tree(root: &Path) {
    let mut r = Rng::new(7);
    for i in 0..5200 {
        let n = 800 + r.below(5400) as usize;
        put(
            &root.join(format!("src/d{:02}/f{i:04}.py", i / 60)),
            &code(&mut r, n),
        );
    }
    for (k, v) in ["1.24.4", "1.26.4", "2.0.2"].iter().enumerate() {
        package(root, v, k as u64 + 1);
    }
    let mut big = code(&mut Rng::new(9), 5 << 20);
    put(&root.join("data/blob-1.0.bin"), &big);
    big[3 << 20..(3 << 20) + 4096].fill(7);
    put(&root.join("data/blob-1.1.bin"), &big);
}

/// The change set, written both as an upper directory (`upper`, with a
/// whiteout for the removal) and applied to `tree` itself.
fn change(tree: &Path, upper: &Path) {
    let mut r = Rng::new(11);
    fs::create_dir_all(upper).unwrap();
    for rel in ["src/d03/f0200.py", "src/d40/f2400.py", "src/d85/f5100.py"] {
        let data = code(&mut r, 3000);
        put(&tree.join(rel), &data);
        put(&upper.join(rel), &data);
    }
    fs::remove_file(tree.join("src/d10/f0610.py")).unwrap();
    put(&upper.join("src/d10/.wh.f0610.py"), b"");
    for i in 0..5 {
        let data = code(&mut r, 2000 + i * 300);
        let rel = format!("src/new/n{i}.py");
        put(&tree.join(&rel), &data);
        put(&upper.join(&rel), &data);
    }
    // A new version of the package, whose files belong beside the others.
    package(tree, "2.1.0", 4);
    package(upper, "2.1.0", 4);
}

fn size(p: &Path) -> u64 {
    fs::metadata(p).unwrap().len()
}

fn info(img: &Path) -> serde_json::Value {
    json(&sheaf_in(["info".as_ref(), img.as_os_str(), "--json".as_ref()]).ok())
}

#[test]
fn merge_packs_within_a_few_percent_of_build_with_its_dictionary() {
    let t = tmpdir();
    let (base, merged_tree, upper) = (
        t.path().join("base"),
        t.path().join("merged-tree"),
        t.path().join("upper"),
    );
    base_tree(&base);
    base_tree(&merged_tree);
    change(&merged_tree, &upper);
    let img = |n: &str| t.path().join(n);
    build(&base, &img("base.sheaf"), &[]);
    sheaf_in([
        "commit".as_ref(),
        upper.as_os_str(),
        "-o".as_ref(),
        img("layer.sheaf").as_os_str(),
    ])
    .ok();
    let merged = img("merged.sheaf");
    sheaf_in([
        "merge".as_ref(),
        img("base.sheaf").as_os_str(),
        img("layer.sheaf").as_os_str(),
        "-o".as_ref(),
        merged.as_os_str(),
    ])
    .ok();
    let built = img("built.sheaf");
    build(&merged_tree, &built, &[]);

    // Packed alike: a dictionary section (format.md §4, kind 4) and packs
    // compressed with it in each, and sizes within 2%.
    let (m, b) = (info(&merged), info(&built));
    let dict_section = |j: &serde_json::Value| {
        j["sections"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["kind"] == 4)
            .count()
    };
    let dict_blocks = |j: &serde_json::Value| j["blocks_by_codec"]["zstd+dict"].as_u64();
    assert_eq!(dict_section(&b), 1, "the build trains a dictionary: {b}");
    assert_eq!(dict_section(&m), 1, "so does the merge: {m}");
    assert!(dict_blocks(&b).unwrap_or(0) >= 10, "{b}");
    assert!(dict_blocks(&m).unwrap_or(0) >= 10, "{m}");
    let (ms, bs) = (size(&merged), size(&built));
    let diff = ms.abs_diff(bs) as f64 / bs as f64;
    assert!(
        diff <= 0.02,
        "merged {ms} bytes, built {bs}: {:.1}% apart",
        diff * 100.0
    );
    // The walk gives the tree's entries in a directory scan's order, so the
    // data is packed exactly alike: only metadata (directory mtimes) differs.
    for k in ["stored_data_bytes", "blocks_by_codec", "stored_by_codec"] {
        assert_eq!(m[k], b[k], "{k}");
    }

    // Both extract to the merged tree.
    let cmp = Cmp {
        mtime: false,
        nsec: false,
        dir_mtime: false,
        root: false,
        ..Cmp::all()
    };
    for (name, image) in [("m", &merged), ("b", &built)] {
        let out = t.path().join(format!("out-{name}"));
        extract(image, &out);
        assert_same_tree(&merged_tree, &out, cmp);
    }

    // `commit` is a build of the upper directory: the same bytes.
    let upper_built = img("upper-built.sheaf");
    build(&upper, &upper_built, &[]);
    assert_eq!(
        fs::read(img("layer.sheaf")).unwrap(),
        fs::read(&upper_built).unwrap(),
        "commit and build of one directory differ"
    );
}
