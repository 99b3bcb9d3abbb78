//! Incremental builds (`sheaf build --base PREV`): a tree is built, then
//! changed in every way the rule distinguishes, and built again against the
//! first image. The expected counts come from the change list below, not
//! from the builder: a file is unchanged when its path, size, mtime, mode
//! and owner are, and only unchanged files are taken from PREV.

mod common;

use common::*;
use std::fs;
use std::path::{Path, PathBuf};

const BS: usize = 64 << 10;
/// Large files: three full blocks each, no tail (so packs hold small files only).
const BIG: usize = 3 * BS;
const SMALL: usize = 30;

struct Case {
    _t: tempfile::TempDir,
    dir: PathBuf,
    src: PathBuf,
    prev: PathBuf,
    /// b1.bin as PREV stored it (changed later without changing size or mtime).
    b1_old: Vec<u8>,
}

fn small_name(i: usize) -> String {
    format!("small/s{i:02}.txt")
}

/// PREV: five large files (one with two names) and thirty small ones (plus
/// a duplicate), all the
/// small ones in one pack block: together they are under half a block, and
/// a pack is only ever ended early once half full.
fn case() -> Case {
    let t = tmpdir();
    let dir = t.path().to_path_buf();
    let src = dir.join("src");
    fs::create_dir_all(src.join("big")).unwrap();
    fs::create_dir_all(src.join("small")).unwrap();
    let mut r = Rng::new(11);
    for i in 0..5 {
        write(&src.join(format!("big/b{i}.bin")), &r.bytes(BIG));
    }
    let mut small_total = 0;
    for i in 0..SMALL {
        let n = 700 + r.below(300) as usize;
        small_total += n;
        write(&src.join(small_name(i)), &r.text(n));
    }
    fs::copy(src.join(small_name(0)), src.join("small/dup.txt")).unwrap();
    // A second name of b3.bin: one inode, counted once below.
    fs::hard_link(src.join("big/b3.bin"), src.join("big/b3.link")).unwrap();
    small_total += fs::metadata(src.join("small/dup.txt")).unwrap().len() as usize;
    assert!(small_total < BS / 2, "small files must share one pack");
    set_all_mtimes(&src, |i, _| (1_700_000_000 + i as i64, 123_456_789));
    let b1_old = fs::read(src.join("big/b1.bin")).unwrap();
    let prev = dir.join("prev.sheaf");
    build(&src, &prev, &["--block-size", "64K"]);
    Case {
        _t: t,
        dir,
        src,
        prev,
        b1_old,
    }
}

/// Rewrite `p` with `data`, keeping (or not) its mtime.
fn rewrite(p: &Path, data: &[u8], keep_mtime: bool) {
    let m = fs::metadata(p).unwrap();
    use std::os::unix::fs::MetadataExt;
    let (s, n) = (m.mtime(), m.mtime_nsec() as u32);
    write(p, data);
    if keep_mtime {
        set_mtime(p, s, n);
    } else {
        set_mtime(p, s + 1000, 0);
    }
}

/// The changes; returns (files expected unchanged, their bytes, files
/// expected read anew, their bytes) under the rule, assuming every block
/// of an unchanged file is copied.
fn change(c: &Case) -> (Vec<String>, Vec<String>) {
    let s = &c.src;
    let mut r = Rng::new(99);
    // Same size, new content, new mtime: read anew.
    rewrite(&s.join("big/b0.bin"), &r.bytes(BIG), false);
    // Same size, new content, mtime restored: unchanged by the rule, so the
    // new image keeps PREV's content (documented).
    rewrite(&s.join("big/b1.bin"), &r.bytes(BIG), true);
    // Mode change only: read anew.
    chmod(&s.join("big/b2.bin"), 0o600);
    // A small file in the shared pack: read anew.
    rewrite(&s.join(small_name(10)), &r.text(900), false);
    // Removed and added.
    fs::remove_file(s.join(small_name(5))).unwrap();
    write(&s.join("small/new.txt"), &r.text(2000));
    let mut unchanged: Vec<String> = ["big/b1.bin", "big/b3.bin", "big/b4.bin", "small/dup.txt"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    unchanged.extend((0..SMALL).filter(|&i| i != 5 && i != 10).map(small_name));
    let anew = ["big/b0.bin", "big/b2.bin", "small/new.txt"]
        .iter()
        .map(|s| s.to_string())
        .chain([small_name(10)])
        .collect();
    (unchanged, anew)
}

fn sizes(src: &Path, files: &[String]) -> u64 {
    files
        .iter()
        .map(|f| fs::metadata(src.join(f)).unwrap().len())
        .sum()
}

fn build_json(src: &Path, img: &Path, extra: &[&str]) -> serde_json::Value {
    let out = build(
        src,
        img,
        &[&["--block-size", "64K", "--json"], extra].concat(),
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Extract `img` and compare it with the changed source, where b1.bin must
/// hold PREV's content; then `sheaf check`.
fn assert_result(c: &Case, img: &Path) {
    let out = c
        .dir
        .join(format!("x-{}", img.file_stem().unwrap().to_string_lossy()));
    extract(img, &out);
    let b1 = out.join("big/b1.bin");
    assert!(
        fs::read(&b1).unwrap() == c.b1_old,
        "b1.bin (size and mtime unchanged) does not hold PREV's content"
    );
    // With b1.bin's source content put back, the trees must be equal in
    // every attribute (writing a file leaves its directory's mtime alone).
    rewrite(&b1, &fs::read(c.src.join("big/b1.bin")).unwrap(), true);
    assert_same_tree(
        &c.src,
        &out,
        Cmp {
            owner: is_root(),
            ..Cmp::all()
        },
    );
    sheaf(["check".as_ref(), img.as_os_str()]).ok();
}

#[test]
fn unchanged_files_come_from_prev() {
    let c = case();
    let (unchanged, anew) = change(&c);
    let img = c.dir.join("next.sheaf");
    let rep = build_json(&c.src, &img, &["--base", c.prev.to_str().unwrap()]);
    let b = &rep["base"];
    assert_eq!(b["reused_files"], unchanged.len() as u64, "{rep:#}");
    assert_eq!(b["reused_bytes"], sizes(&c.src, &unchanged), "{rep:#}");
    assert_eq!(b["packed_files"], anew.len() as u64, "{rep:#}");
    assert_eq!(b["packed_bytes"], sizes(&c.src, &anew), "{rep:#}");
    // b1, b3, b4 (three blocks each) and the one pack block; and b2's
    // three: read again (its mode changed), they are found in PREV by
    // digest and copied rather than compressed.
    assert_eq!(b["copied_blocks"], 4 * 3 + 1, "{rep:#}");
    // The pack keeps the bytes of s05 (removed) and of s10's old version.
    let stale = b["stale_bytes"].as_u64().unwrap();
    assert!(stale > 0 && stale < 2000, "{rep:#}");
    assert_result(&c, &img);

    // A second round on the incremental image: nothing changed, so every
    // file is reused and the image is the same tree.
    let again = c.dir.join("again.sheaf");
    let rep = build_json(&c.src, &again, &["--base", img.to_str().unwrap()]);
    assert_eq!(
        rep["base"]["reused_files"],
        (unchanged.len() + anew.len()) as u64,
        "{rep:#}"
    );
    assert_eq!(rep["base"]["packed_files"], 0, "{rep:#}");
    assert_result(&c, &again);
}

#[test]
fn strict_stale_rule_repacks_a_changed_pack() {
    let c = case();
    let (unchanged, anew) = change(&c);
    let img = c.dir.join("strict.sheaf");
    let rep = build_json(
        &c.src,
        &img,
        &["--base", c.prev.to_str().unwrap(), "--base-stale", "0"],
    );
    let b = &rep["base"];
    // The one pack holds a changed and a removed file: it is not copied, so
    // its unchanged files are read again; only the large ones are reused.
    let big: Vec<String> = unchanged
        .iter()
        .filter(|f| f.starts_with("big/"))
        .cloned()
        .collect();
    assert_eq!(b["reused_files"], big.len() as u64, "{rep:#}");
    assert_eq!(b["reused_bytes"], sizes(&c.src, &big), "{rep:#}");
    assert_eq!(
        b["packed_files"],
        (unchanged.len() - big.len() + anew.len()) as u64,
        "{rep:#}"
    );
    assert_eq!(b["stale_bytes"], 0, "{rep:#}");
    // b1, b3, b4 reused; b2 read again but its blocks found in PREV.
    assert_eq!(b["copied_blocks"], 4 * 3, "{rep:#}");
    assert_result(&c, &img);
}

#[test]
fn corrupt_prev_fails_cleanly() {
    let c = case();
    // Unchanged source: every block of PREV is copied, block 0 included.
    let mut bytes = fs::read(&c.prev).unwrap();
    bytes[64 + 100] ^= 0x40;
    let bad = c.dir.join("bad.sheaf");
    fs::write(&bad, &bytes).unwrap();
    let img = c.dir.join("out.sheaf");
    let out = sheaf([
        "build".as_ref(),
        c.src.as_os_str(),
        "-o".as_ref(),
        img.as_os_str(),
        "--block-size".as_ref(),
        "64K".as_ref(),
        "--base".as_ref(),
        bad.as_os_str(),
    ])
    .fails_with(1);
    let line = out.one_err_line();
    assert!(line.contains(bad.to_str().unwrap()), "{line}");
    assert!(!img.exists(), "output left behind");
    let left: Vec<_> = fs::read_dir(&c.dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("sheaf-tmp"))
        .collect();
    assert!(left.is_empty(), "temporary files left: {left:?}");
}

#[test]
fn incompatible_base_is_refused() {
    let c = case();
    let img = c.dir.join("out.sheaf");
    let prev = c.prev.to_str().unwrap();
    let cases: [(&[&str], &str); 4] = [
        (&["--block-size", "128K"], "block size"),
        (&["--block-size", "64K", "-c", "lz4"], "compression"),
        (&["--block-size", "64K", "--mtime", "0"], "--mtime"),
        (&["--block-size", "64K", "--base-stale", "101"], "101"),
    ];
    for (extra, want) in cases {
        let mut c2 = cmd();
        c2.arg("build")
            .arg(&c.src)
            .arg("-o")
            .arg(&img)
            .args(["--base", prev])
            .args(extra);
        let out = run_cmd(&mut c2);
        assert_ne!(out.code, 0, "{extra:?}: {}", out.describe());
        let line = out.one_err_line();
        assert!(line.contains(want), "{extra:?}: {line}");
        assert!(!img.exists());
    }
    // A tar stream has no place to skip reading from.
    let tar = c.dir.join("t.tar");
    let st = std::process::Command::new("tar")
        .arg("-cf")
        .arg(&tar)
        .arg("-C")
        .arg(&c.src)
        .arg(".")
        .status()
        .unwrap();
    assert!(st.success());
    let out = sheaf([
        "build".as_ref(),
        tar.as_os_str(),
        "-o".as_ref(),
        img.as_os_str(),
        "--block-size".as_ref(),
        "64K".as_ref(),
        "--base".as_ref(),
        c.prev.as_os_str(),
    ])
    .fails_with(1);
    assert!(out.one_err_line().contains("directory"), "{}", out.stderr);
    assert!(!img.exists());
}

#[test]
fn clamped_mtimes_tell_nothing() {
    let c = case();
    // Every mtime is after this, so every one is stored clamped to it, in
    // PREV as in the new build: equal mtimes that say nothing of content.
    let clamp = "1600000000";
    let prev = c.dir.join("clamped.sheaf");
    let mut b = cmd();
    b.env("SOURCE_DATE_EPOCH", clamp)
        .arg("build")
        .arg(&c.src)
        .arg("-o")
        .arg(&prev)
        .args(["--block-size", "64K"]);
    run_cmd(&mut b).ok();
    let img = c.dir.join("next.sheaf");
    let mut b = cmd();
    b.env("SOURCE_DATE_EPOCH", clamp)
        .arg("build")
        .arg(&c.src)
        .arg("-o")
        .arg(&img)
        .args(["--block-size", "64K", "--json", "--base"])
        .arg(&prev);
    let rep: serde_json::Value = serde_json::from_slice(&run_cmd(&mut b).ok().stdout).unwrap();
    // 5 large files (one inode for b3's two names), 30 small ones and dup.
    assert_eq!(rep["base"]["reused_files"], 0, "{rep:#}");
    assert_eq!(rep["base"]["packed_files"], 5 + SMALL as u64 + 1, "{rep:#}");
    sheaf(["check".as_ref(), img.as_os_str()]).ok();
}

#[test]
fn prev_replaced_in_place() {
    let c = case();
    let (unchanged, anew) = change(&c);
    // PREV is both the base and (with -f) the output: it is read until the
    // new image is complete, then replaced.
    let img = c.dir.join("inplace.sheaf");
    fs::copy(&c.prev, &img).unwrap();
    let rep = build_json(&c.src, &img, &["-f", "--base", img.to_str().unwrap()]);
    assert_eq!(
        rep["base"]["reused_files"],
        unchanged.len() as u64,
        "{rep:#}"
    );
    assert_eq!(rep["base"]["packed_files"], anew.len() as u64, "{rep:#}");
    assert_result(&c, &img);
}
