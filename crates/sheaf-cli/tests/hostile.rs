//! Hostile trees: images whose every page and block hashes correctly (they
//! are re-sealed after the edit, as an attacker or a buggy writer would) but
//! whose tree breaks the rules of format.md §8.5 — a dirent naming an
//! ancestor or the root, a directory listed twice, a parent field that
//! disagrees, a dirent type that disagrees with its inode, names out of
//! order. Every command must end with one line and exit 1 (never loop, never
//! panic); a mount must answer EIO on the bad entries and keep serving the
//! rest, and a `find` over it must finish.

mod common;

use common::*;
use sheaf_format::{StreamId, Superblock};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// The source tree, with inode numbers as the builder assigns them
/// (breadth-first, names sorted): / 0, a 1, f 2, a/b 3, a/g 4, a/b/h 5.
fn source(dir: &Path) -> PathBuf {
    let src = dir.join("src");
    fs::create_dir_all(src.join("a/b")).unwrap();
    write(&src.join("f"), b"top file\n");
    write(&src.join("a/g"), b"middle file\n");
    write(&src.join("a/b/h"), b"deep file\n");
    src
}

const INODE_LEN: usize = 64;
const DIRENT_LEN: usize = 16;

/// Rebuild `img` into `out` after `edit` changed its uncompressed metadata
/// streams; every page, block and the root digest are hashed anew.
fn craft(img: &Path, out: &Path, edit: impl Fn(&mut [Vec<u8>; 5], &Superblock)) {
    craft_counts(img, out, |s, sb| edit(s, sb));
}

/// [`craft`], with the superblock's counts `edit` may change too.
fn craft_counts(img: &Path, out: &Path, edit: impl Fn(&mut [Vec<u8>; 5], &mut Superblock)) {
    let im = sheaf_read::open_path(img).unwrap();
    let mut sb = im.superblock().clone();
    let mut streams: [Vec<u8>; 5] = Default::default();
    for id in StreamId::ALL {
        if id != StreamId::Blocks {
            let len = sb.stream(id).len as usize;
            streams[id as usize] = im.read_stream(id, 0, len).unwrap();
        }
    }
    edit(&mut streams, &mut sb);
    let blocks = (0..sb.block_count as u32)
        .map(|id| im.block_ref(id).unwrap())
        .collect();
    let parts = sheaf_build::rewrite::Parts {
        superblock: sb.clone(),
        streams,
        blocks,
        build_info: Vec::new(),
        ref_bases: im.ref_bases().to_vec(),
    };
    let stored = |_id: u32, r: &sheaf_format::BlockRef| {
        let obj = im.object(r, sb.block_size).map_err(|e| e.to_string())?;
        let (codec, bytes) =
            sheaf_format::remote::decode_object(&obj).map_err(|e| e.to_string())?;
        Ok((codec, bytes.to_vec()))
    };
    sheaf_build::rewrite::rewrite(
        parts,
        &[],
        &stored,
        &sheaf_format::dict::NoDicts,
        out,
        &Default::default(),
        true,
    )
    .unwrap();
}

/// The dirent records of `streams`, with their names.
fn dirents(streams: &[Vec<u8>; 5]) -> Vec<(usize, Vec<u8>)> {
    let d = &streams[StreamId::Dirents as usize];
    let heap = &streams[StreamId::Heap as usize];
    (0..d.len() / DIRENT_LEN)
        .map(|i| {
            let r = &d[i * DIRENT_LEN..][..DIRENT_LEN];
            let off = u64::from_le_bytes(r[0..8].try_into().unwrap()) as usize;
            let len = u16::from_le_bytes(r[8..10].try_into().unwrap()) as usize;
            (i, heap[off..off + len].to_vec())
        })
        .collect()
}

/// Point the dirent named `name` at inode `ino` with type `dtype`.
fn retarget(streams: &mut [Vec<u8>; 5], name: &str, ino: u32, dtype: u8) {
    let (i, _) = dirents(streams)
        .into_iter()
        .find(|(_, n)| n == name.as_bytes())
        .unwrap_or_else(|| panic!("no dirent {name}"));
    let r = &mut streams[StreamId::Dirents as usize][i * DIRENT_LEN..][..DIRENT_LEN];
    r[10] = dtype;
    r[12..16].copy_from_slice(&ino.to_le_bytes());
}

/// Set the parent field of inode `ino`.
fn set_parent(streams: &mut [Vec<u8>; 5], ino: u32, parent: u32) {
    let r = &mut streams[StreamId::Inodes as usize][ino as usize * INODE_LEN..][..INODE_LEN];
    r[52..56].copy_from_slice(&parent.to_le_bytes());
}

const DIR: u8 = 4;
const REG: u8 = 8;

/// The hostile variants: (name, edit, a path whose lookup must fail).
#[allow(clippy::type_complexity)]
fn cases() -> Vec<(&'static str, Box<dyn Fn(&mut [Vec<u8>; 5])>, &'static str)> {
    vec![
        (
            "a dirent names an ancestor",
            Box::new(|s| retarget(s, "h", 1, DIR)),
            "a/b/h",
        ),
        (
            "a dirent names the root",
            Box::new(|s| retarget(s, "g", 0, DIR)),
            "a/g",
        ),
        (
            "a directory is listed twice",
            Box::new(|s| retarget(s, "f", 1, DIR)),
            "",
        ),
        (
            "a parent field disagrees",
            Box::new(|s| set_parent(s, 3, 3)),
            "a/b",
        ),
        (
            "a dirent says directory for a file",
            Box::new(|s| retarget(s, "g", 4, DIR)),
            "a/g",
        ),
        (
            "a dirent says file for a directory",
            Box::new(|s| retarget(s, "b", 3, REG)),
            "a/b",
        ),
        (
            "a name with a slash",
            Box::new(|s| {
                // "g" in a/ becomes "/": an extractor trusting it would
                // write at the root of the filesystem.
                let d = dirents(s);
                let i = d.iter().find(|e| e.1 == b"g").unwrap().0;
                let r = &s[StreamId::Dirents as usize][i * DIRENT_LEN..][..DIRENT_LEN];
                let off = u64::from_le_bytes(r[0..8].try_into().unwrap()) as usize;
                s[StreamId::Heap as usize][off] = b'/';
            }),
            "",
        ),
        (
            "names out of order",
            Box::new(|s| {
                // Swap the name fields of / 's two entries ("a", "f").
                let d = dirents(s);
                let ia = d.iter().find(|e| e.1 == b"a").unwrap().0;
                let iff = d.iter().find(|e| e.1 == b"f").unwrap().0;
                let ds = &mut s[StreamId::Dirents as usize];
                for k in 0..10 {
                    ds.swap(ia * DIRENT_LEN + k, iff * DIRENT_LEN + k);
                }
            }),
            "",
        ),
    ]
}

/// Run `sheaf ARGS` and kill it if it has not ended after 30 s.
fn bounded(args: &[&std::ffi::OsStr]) -> (Out, bool) {
    let t0 = Instant::now();
    let mut c = cmd();
    c.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let mut hung = false;
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            hung = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let o = child.wait_with_output().unwrap();
    (
        Out {
            code: o.status.code().unwrap_or(-1),
            stdout: o.stdout,
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
            what: format!("sheaf {args:?}"),
        },
        hung,
    )
}

#[test]
fn every_command_ends_with_one_line_on_a_hostile_tree() {
    let t = tmpdir();
    let src = source(t.path());
    let good = t.path().join("good.sheaf");
    build(&src, &good, &[]);
    // The fixture is what the cases assume (ids from the builder's rule).
    let im = sheaf_read::open_path(&good).unwrap();
    for (path, ino) in [("a", 1), ("f", 2), ("a/b", 3), ("a/g", 4), ("a/b/h", 5)] {
        assert_eq!(im.resolve(path.as_bytes()).unwrap().ino, ino, "{path}");
    }
    // Re-sealing an unedited image keeps a good image.
    let same = t.path().join("same.sheaf");
    craft(&good, &same, |_, _| {});
    sheaf(["check".as_ref(), same.as_os_str()]).ok();
    for (name, edit, bad_path) in cases() {
        let img = t.path().join("hostile.sheaf");
        craft(&good, &img, |s, _| edit(s));
        let out = t.path().join("x");
        let _ = fs::remove_dir_all(&out);
        let merged = t.path().join("merged.sheaf");
        let i = img.as_os_str();
        // Commands that read every entry must refuse the image; `info
        // --whiteouts` reads only names and directories, so it must end,
        // and fail cleanly if it meets the damage.
        let runs: Vec<(Vec<&std::ffi::OsStr>, bool)> = vec![
            (vec!["ls".as_ref(), "-lR".as_ref(), i], true),
            (vec!["check".as_ref(), i], true),
            (
                vec!["extract".as_ref(), i, "-C".as_ref(), out.as_os_str()],
                true,
            ),
            (vec!["info".as_ref(), "--whiteouts".as_ref(), i], false),
            (
                vec![
                    "merge".as_ref(),
                    i,
                    "-o".as_ref(),
                    merged.as_os_str(),
                    "-f".as_ref(),
                ],
                true,
            ),
        ];
        for (args, must_fail) in runs {
            let (o, hung) = bounded(&args);
            assert!(!hung, "{name}: {:?} did not end", args);
            o.no_panic();
            if !must_fail && o.code == 0 {
                continue;
            }
            let o = o.fails_with(1);
            // `check` lists each problem, then a summary line.
            let line = if args[0] == "check" {
                o.err_lines().join("\n")
            } else {
                o.one_err_line().to_string()
            };
            assert!(
                line.contains("hostile.sheaf"),
                "{name}: {:?}: {}",
                args,
                o.describe()
            );
        }
        assert!(!merged.exists(), "{name}: merge left an output");
        // Nothing was written outside the extraction directory.
        assert_eq!(
            fs::read_dir(t.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(
                    |n| !["src", "good.sheaf", "same.sheaf", "hostile.sheaf", "x"]
                        .contains(&n.as_str())
                )
                .collect::<Vec<_>>(),
            Vec::<String>::new(),
            "{name}: extract wrote beside its target"
        );
        if !bad_path.is_empty() {
            let (o, hung) = bounded(&["cat".as_ref(), i, bad_path.as_ref()]);
            assert!(!hung, "{name}: cat did not end");
            o.no_panic();
            o.fails_with(1);
        }
    }
}

#[test]
fn a_mount_of_a_hostile_tree_answers_eio_on_bad_entries_and_serves_the_rest() {
    if !mounts_allowed() {
        return;
    }
    let t = tmpdir();
    let src = source(t.path());
    let good = t.path().join("good.sheaf");
    build(&src, &good, &[]);
    for (name, edit, bad_path) in cases() {
        let img = t.path().join("hostile.sheaf");
        craft(&good, &img, |s, _| edit(s));
        let mp = t.path().join("mp");
        // Listings with attributes for every entry: a bad one is still
        // listed by name (node 0, but its dirent keeps its inode number,
        // which glibc's readdir needs to show it).
        let _m = mount(&[&img], &mp, &["-o", "readdirplus=always"]);
        // A whole-tree walk ends (GNU find, bounded by a timeout).
        let t0 = Instant::now();
        let st = std::process::Command::new("timeout")
            .args(["30", "find"])
            .arg(&mp)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert_ne!(st.code(), Some(124), "{name}: find over the mount hung");
        assert!(t0.elapsed() < Duration::from_secs(30));
        if !bad_path.is_empty() {
            let (parent, leaf) = bad_path.rsplit_once('/').unwrap_or(("", bad_path));
            let names: Vec<String> = fs::read_dir(mp.join(parent))
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            assert!(
                names.iter().any(|n| n == leaf),
                "{name}: {leaf} is missing from the listing of /{parent}: {names:?}"
            );
            let e = fs::symlink_metadata(mp.join(bad_path))
                .map(|_| ())
                .map_err(|e| e.raw_os_error());
            assert_eq!(e, Err(Some(libc::EIO)), "{name}: {bad_path}");
        }
        // What the edit did not touch reads right.
        // (Out of order, a lookup of "a" may find another entry: the
        // image's own word, not wrong bytes.)
        if ![
            "a dirent says directory for a file",
            "a dirent names the root",
            "names out of order",
            "a name with a slash",
        ]
        .contains(&name)
        {
            assert_eq!(
                fs::read(mp.join("a/g")).unwrap(),
                b"middle file\n",
                "{name}"
            );
        }
    }
}

/// Issue 53: a 1 TiB hole costs nothing to extract. The image stores the
/// hole as no data (a few KB); extraction must not read, scan or write its
/// zeros, and the file comes out sparse with the same bytes.
#[test]
fn a_file_with_a_huge_hole_extracts_sparse_and_fast() {
    use std::os::unix::fs::{FileExt, MetadataExt};
    const SIZE: u64 = 1 << 40;
    const MID: u64 = 512 << 30;
    let t = tmpdir();
    let src = t.path().join("src");
    fs::create_dir(&src).unwrap();
    let f = fs::File::create(src.join("sparse")).unwrap();
    f.set_len(SIZE).unwrap();
    f.write_all_at(b"middle", MID).unwrap();
    f.write_all_at(b"end", SIZE - 3).unwrap();
    drop(f);
    let img = t.path().join("sparse.sheaf");
    build(&src, &img, &[]);
    assert!(
        fs::metadata(&img).unwrap().len() < 64 << 10,
        "image is small"
    );
    let out = t.path().join("out");
    let t0 = Instant::now();
    let (o, hung) = bounded(&[
        "extract".as_ref(),
        img.as_os_str(),
        "-C".as_ref(),
        out.as_os_str(),
    ]);
    assert!(!hung, "extract of a 1 TiB hole still busy after 30 s");
    o.ok();
    assert!(t0.elapsed() < Duration::from_secs(30));
    let got = fs::File::open(out.join("sparse")).unwrap();
    let md = got.metadata().unwrap();
    assert_eq!(md.len(), SIZE);
    // A few KB written: a block or two around each piece of data.
    assert!(md.blocks() < 2048, "{} blocks allocated", md.blocks());
    let at = |off: u64, n: usize| {
        let mut b = vec![0xAAu8; n];
        got.read_exact_at(&mut b, off).unwrap();
        b
    };
    assert_eq!(at(0, 4096), vec![0u8; 4096]);
    assert_eq!(at(MID - 2, 10), b"\0\0middle\0\0");
    assert_eq!(at(MID + (100 << 30), 4096), vec![0u8; 4096]);
    assert_eq!(at(SIZE - 5, 5), b"\0\0end");
}

/// A chain of `depth` directories `d/d/...` with a file `f` holding
/// "bottom" at the bottom. sheaf build refuses paths deeper than 4096
/// levels, so (as an image author with another writer would) the image of
/// `d/f` is re-sealed with its directory record repeated: inode 0 the
/// root, 1..=depth the chain (each the parent of the next), depth+1 `f`;
/// dirent i names inode i+1.
fn chain_image(dir: &Path, depth: usize) -> PathBuf {
    let src = dir.join("chain-src");
    if !src.exists() {
        fs::create_dir_all(src.join("d")).unwrap();
        write(&src.join("d/f"), b"bottom\n");
    }
    let base = dir.join("chain1.sheaf");
    if !base.exists() {
        build(&src, &base, &[]);
    }
    let img = dir.join(format!("chain{depth}.sheaf"));
    craft_counts(&base, &img, |s, sb| {
        let ino = &s[StreamId::Inodes as usize];
        let (root, d, f) = (
            ino[..INODE_LEN].to_vec(),
            ino[INODE_LEN..2 * INODE_LEN].to_vec(),
            ino[2 * INODE_LEN..3 * INODE_LEN].to_vec(),
        );
        let de = &s[StreamId::Dirents as usize];
        let (to_d, to_f) = (
            de[..DIRENT_LEN].to_vec(),
            de[DIRENT_LEN..2 * DIRENT_LEN].to_vec(),
        );
        let mut inodes = root;
        let mut dirents = Vec::new();
        for i in 1..=depth as u32 {
            let mut r = d.clone();
            r[40..48].copy_from_slice(&u64::from(i).to_le_bytes());
            r[52..56].copy_from_slice(&(i - 1).to_le_bytes());
            inodes.extend_from_slice(&r);
            let mut e = to_d.clone();
            e[12..16].copy_from_slice(&i.to_le_bytes());
            dirents.extend_from_slice(&e);
        }
        inodes.extend_from_slice(&f);
        let mut e = to_f.clone();
        e[12..16].copy_from_slice(&(depth as u32 + 1).to_le_bytes());
        dirents.extend_from_slice(&e);
        s[StreamId::Inodes as usize] = inodes;
        s[StreamId::Dirents as usize] = dirents;
        sb.inode_count = depth as u64 + 2;
        sb.dirent_count = depth as u64 + 1;
    });
    img
}

/// `rm -rf`: std's `remove_dir_all` recurses, GNU rm walks any depth.
fn rm_rf(p: &Path) {
    let st = std::process::Command::new("rm")
        .arg("-rf")
        .arg(p)
        .status()
        .unwrap();
    assert!(st.success());
}

/// [`bounded`] with stdout thrown away (a deep listing is large, and a
/// pipe nobody reads would stall it).
fn bounded_quiet(args: &[&std::ffi::OsStr]) -> (Out, bool) {
    let t0 = Instant::now();
    let mut c = cmd();
    c.args(args).stdout(Stdio::null()).stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let mut hung = false;
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            hung = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let o = child.wait_with_output().unwrap();
    (
        Out {
            code: o.status.code().unwrap_or(-1),
            stdout: o.stdout,
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
            what: format!("sheaf {args:?}"),
        },
        hung,
    )
}

/// Issue 53: extract (and the walks of ls -R, find, du -a, info) of a
/// 5,000- and a 20,000-deep image overflowed the stack (SIGABRT, 134).
/// Every one must end, extract with the whole chain.
#[test]
fn a_very_deep_image_extracts_and_walks_without_overflowing() {
    let t = tmpdir();
    for depth in [5_000, 20_000] {
        let t0 = Instant::now();
        let img = chain_image(t.path(), depth);
        eprintln!("built {depth} deep in {:?}", t0.elapsed());
        let out = t.path().join(format!("out{depth}"));
        let (o, hung) = bounded_quiet(&[
            "extract".as_ref(),
            img.as_os_str(),
            "-C".as_ref(),
            out.as_os_str(),
        ]);
        assert!(!hung, "extract {depth} deep hung");
        assert_eq!(o.code, 0, "{depth} deep: {}", o.describe());
        // GNU find walks any depth: the deepest level and the file's bytes.
        let f = std::process::Command::new("find")
            .args([
                ".", "-name", "f", "-printf", "%d\\n", "-execdir", "cat", "{}", ";",
            ])
            .current_dir(&out)
            .output()
            .unwrap();
        assert!(f.status.success(), "{}", String::from_utf8_lossy(&f.stderr));
        assert_eq!(
            String::from_utf8(f.stdout).unwrap(),
            format!("{}\nbottom\n", depth + 1)
        );
        for args in [
            &["ls", "-R"][..],
            &["find"],
            &["find", "-name", "f"],
            &["du", "-a"],
            &["info", "--whiteouts"],
        ] {
            let mut a: Vec<&std::ffi::OsStr> = vec![args[0].as_ref(), img.as_os_str()];
            a.extend(args[1..].iter().map(std::ffi::OsStr::new));
            let (o, hung) = bounded_quiet(&a);
            assert!(!hung, "{args:?} {depth} deep hung");
            assert_eq!(o.code, 0, "{args:?} {depth} deep: {}", o.describe());
        }
        rm_rf(&out);
    }
}
