//! Stacks of layers from the command line: `sheaf ls BASE,LAYER,...` shows
//! the merged view, with OCI whiteouts applied and never shown; `sheaf
//! commit` packs an overlay's upper directory as a layer; `sheaf merge`
//! flattens a stack into one image.

mod common;

use common::*;
use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

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
    let o = sheaf_in(["ls", "-R", &stack]).ok();
    assert_eq!(ls_r_paths(&o.text()), "a\nb\nc\na/y\na/z\nb/new\n");
    // A file of the top layer over a directory of the base.
    let o = sheaf_in(["ls", "-l", &stack, "c"]).ok();
    assert!(o.text().starts_with("-rw"), "{}", o.text());
    // Hidden names are not found, and whiteouts cannot be named.
    for p in ["keep", "a/x", "b/old", "a/.wh.x"] {
        let o = sheaf_in(["ls", &stack, p]).fails_with(1);
        assert!(
            o.one_err_line().contains("no such file"),
            "{p}: {}",
            o.describe()
        );
    }
    // The layer's own whiteouts and opaque directories.
    let o = sheaf_in(["info".as_ref(), ti.as_os_str(), "--whiteouts".as_ref()]).ok();
    assert!(
        o.text().contains(
            "whiteouts:    2 (hidden in the layers below)\n  a/x\n  keep\nopaque dirs:  1\n  b/\n"
        ),
        "{}",
        o.text()
    );
    let j = json(
        &sheaf_in([
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
    let o = sheaf_in(["ls", &bad]).fails_with(1);
    assert!(o.one_err_line().contains("nope.sheaf"), "{}", o.describe());
}

/// Write `files` (path, content) under `root`; a path ending in `/` is a directory.
fn tree(root: &Path, files: &[(&str, &str)]) {
    fs::create_dir_all(root).unwrap();
    for (p, c) in files {
        let at = root.join(p.trim_end_matches('/'));
        if p.ends_with('/') {
            fs::create_dir_all(at).unwrap();
        } else {
            fs::create_dir_all(at.parent().unwrap()).unwrap();
            write(&at, c.as_bytes());
        }
    }
}

/// `sheaf commit DIR -o LAYER EXTRA...`.
fn commit(dir: &Path, layer: &Path, extra: &[&str]) -> Out {
    let mut a: Vec<&OsStr> = vec![
        "commit".as_ref(),
        dir.as_os_str(),
        "-o".as_ref(),
        layer.as_os_str(),
    ];
    a.extend(extra.iter().map(OsStr::new));
    sheaf_in(a)
}

/// `sheaf merge IMAGES... -o OUT EXTRA...`.
fn merge(images: &[&Path], out: &Path, extra: &[&str]) -> Out {
    let mut a: Vec<&OsStr> = vec!["merge".as_ref()];
    a.extend(images.iter().map(|p| p.as_os_str()));
    a.extend(["-o".as_ref(), out.as_os_str()]);
    a.extend(extra.iter().map(OsStr::new));
    sheaf_in(a)
}

fn stack_arg(images: &[&Path]) -> String {
    images
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// What an entry is, for comparing listings: type, permissions and content
/// or target.
fn describe_tree(root: &Path) -> Vec<String> {
    walk(root)
        .into_iter()
        .filter(|p| !p.is_empty())
        .map(|p| {
            let at = join(root, &p);
            let md = fs::symlink_metadata(&at).unwrap();
            let what = if md.is_dir() {
                "dir".to_string()
            } else if md.file_type().is_symlink() {
                format!("-> {}", fs::read_link(&at).unwrap().display())
            } else if md.is_file() {
                format!("{:?}", lossy(&fs::read(&at).unwrap()))
            } else {
                "special".to_string()
            };
            format!("{} {:o} {what}", lossy(&p), md.mode() & 0o7777)
        })
        .collect()
}

/// Like a layer's name list, relative paths of `sheaf ls -AR IMAGE`
/// (-A: whiteouts are dot names, which ls leaves out without it).
fn ls_r(image: &str) -> Vec<String> {
    let o = sheaf_in(["ls", "-AR", image]).ok();
    let mut v: Vec<String> = ls_r_paths(&o.text()).lines().map(String::from).collect();
    v.sort();
    v
}

#[test]
fn commit_packs_an_upper_directory_as_a_layer() {
    let t = tmpdir();
    let base = t.path().join("base");
    tree(
        &base,
        &[
            ("a/x", "base x"),
            ("a/y", "base y"),
            ("gone", "deleted in the upper"),
            ("d/old1", "hidden by the opaque dir"),
            ("d/sub/old2", "hidden too"),
            ("keep", "kept"),
        ],
    );
    let upper = t.path().join("upper");
    tree(
        &upper,
        &[
            ("a/x", "changed x"),
            ("a/new", "new file"),
            ("a/empty", ""),
            (".wh.gone", ""),
            ("d/.wh..wh..opq", ""),
            ("d/fresh", "fresh"),
            // An interrupted copy-up's leftovers, a file and a directory.
            (".wh..sheaf-copyup.123", "half a copy"),
            ("a/.wh..sheaf-tmp/partial", "junk"),
        ],
    );
    symlink(b"a/x", &upper.join("link"));
    chmod(&upper.join("a/new"), 0o751);
    let (bi, li) = (t.path().join("base.sheaf"), t.path().join("layer.sheaf"));
    build(&base, &bi, &[]);
    let o = commit(&upper, &li, &["--json"]).ok();
    let j = json(&o);
    assert_eq!(j["upper"], upper.display().to_string().as_str());
    assert_eq!(j["image"], li.display().to_string().as_str());

    // The layer keeps whiteouts and empty files and leaves the leftovers out.
    assert_eq!(
        ls_r(&li.display().to_string()),
        [
            ".wh.gone",
            "a",
            "a/empty",
            "a/new",
            "a/x",
            "d",
            "d/.wh..wh..opq",
            "d/fresh",
            "link"
        ]
    );
    // On its base: the view the overlay showed.
    let stack = stack_arg(&[&bi, &li]);
    assert_eq!(
        ls_r(&stack),
        ["a", "a/empty", "a/new", "a/x", "a/y", "d", "d/fresh", "keep", "link"]
    );
    // Flattened and unpacked: every entry with its content and mode.
    let flat = t.path().join("flat.sheaf");
    merge(&[&bi, &li], &flat, &[]).ok();
    let out = t.path().join("out");
    extract(&flat, &out);
    let expected = t.path().join("expected");
    tree(
        &expected,
        &[
            ("a/x", "changed x"),
            ("a/y", "base y"),
            ("a/new", "new file"),
            ("a/empty", ""),
            ("d/fresh", "fresh"),
            ("keep", "kept"),
        ],
    );
    symlink(b"a/x", &expected.join("link"));
    chmod(&expected.join("a/new"), 0o751);
    assert_eq!(describe_tree(&out), describe_tree(&expected));
    let cmp = Cmp {
        mtime: false,
        nsec: false,
        dir_mtime: false,
        root: false,
        ..Cmp::all()
    };
    assert_same_tree(&expected, &out, cmp);
}

/// A child process holding `flock(LOCK_EX)` on `dir` itself, as a writable
/// mount does; killed (and the lock released) on drop.
struct Locker(std::process::Child);

impl Locker {
    fn hold(dir: &Path) -> Locker {
        let child = std::process::Command::new("sh")
            .arg("-c")
            .arg(r#"exec 9<"$0" && flock -x 9 && exec sleep 60"#)
            .arg(dir)
            .spawn()
            .expect("sh");
        let l = Locker(child);
        // Wait until the lock is taken: a shared try-lock then fails.
        for _ in 0..500 {
            let st = std::process::Command::new("flock")
                .args(["-n", "-s"])
                .arg(dir)
                .arg("true")
                .status()
                .expect("flock");
            if !st.success() {
                return l;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        panic!("the child never locked {}", dir.display());
    }
}

impl Drop for Locker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn commit_refuses_a_dir_in_use_and_a_non_empty_whiteout() {
    let t = tmpdir();
    let upper = t.path().join("upper");
    tree(&upper, &[("a/file", "data"), (".wh.old", "")]);
    let layer = t.path().join("layer.sheaf");
    {
        let _lock = Locker::hold(&upper);
        let o = commit(&upper, &layer, &[]).fails_with(1);
        assert_eq!(
            o.one_err_line(),
            format!(
                "sheaf: error: {}: in use by a writable mount; unmount it first",
                upper.display()
            ),
            "{}",
            o.describe()
        );
        assert!(!layer.exists());
        assert!(temp_leftovers(t.path()).is_empty());
    }
    // Once the mount is gone, the same directory commits.
    commit(&upper, &layer, &["-q"]).ok();
    assert!(layer.exists());

    // A whiteout holding data (or anything but an empty file) cannot be a
    // layer entry: refused, naming it.
    for (name, make) in [
        ("a/.wh.x", "file"),
        (".wh.dir", "dir"),
        (".wh.sym", "symlink"),
    ] {
        let bad = t.path().join(format!("bad-{make}"));
        tree(&bad, &[("a/ok", "fine")]);
        let p = bad.join(name);
        match make {
            "file" => write(&p, b"user data"),
            "dir" => fs::create_dir(&p).unwrap(),
            _ => symlink(b"a/ok", &p),
        }
        let out = t.path().join(format!("bad-{make}.sheaf"));
        let o = commit(&bad, &out, &[]).fails_with(1);
        let line = o.one_err_line();
        assert!(
            line.contains(&p.display().to_string()) && line.contains("empty regular file"),
            "{}",
            o.describe()
        );
        assert!(!out.exists());
        assert!(temp_leftovers(t.path()).is_empty());
    }
    // Not a directory, or missing: one line naming it.
    let o = commit(&t.path().join("nope"), &layer, &["--force"]).fails_with(1);
    assert!(o.one_err_line().contains("nope"), "{}", o.describe());
}

/// Three layers with every kind of override (whiteouts, an opaque
/// directory, a file over a directory and the reverse, hardlinks split by
/// a whiteout, changed modes and xattrs) in `t`, their images bottom
/// first, and the merged tree they must show, made by hand in
/// `t/expected` (mtimes aside: see [`three_layers_cmp`]).
fn three_layers(t: &Path) -> (Vec<PathBuf>, PathBuf) {
    let (l1, l2, l3) = (t.join("l1"), t.join("l2"), t.join("l3"));
    tree(
        &l1,
        &[
            ("etc/conf", "v1"),
            ("etc/old", "removed by l2"),
            ("opaq/a", "hidden by l2"),
            ("opaq/sub/b", "hidden by l2"),
            ("fileoverdir/inner/x", "replaced by a file"),
            ("diroverfile", "replaced by a directory"),
            ("hl/one", "hard"),
            ("hl3/a", "pair, one name whited out"),
            ("gone/deep/file", "whited out by l3"),
            ("bin/tool", "old tool"),
            ("same", "untouched"),
        ],
    );
    fs::hard_link(l1.join("hl/one"), l1.join("hl/two")).unwrap();
    fs::hard_link(l1.join("hl3/a"), l1.join("hl3/b")).unwrap();
    symlink(b"etc/conf", &l1.join("sym"));
    mknod(&l1.join("pipe"), libc::S_IFIFO | 0o640, 0).unwrap();
    chmod(&l1.join("bin/tool"), 0o755);
    xattr::set(l1.join("etc/conf"), "user.layer", b"1").unwrap();
    xattr::set(l1.join("same"), "user.kept", b"yes").unwrap();
    tree(
        &l2,
        &[
            ("etc/conf", "v2"),
            ("etc/.wh.old", ""),
            ("opaq/.wh..wh..opq", ""),
            ("opaq/c", "c from l2"),
            ("fileoverdir", "now a file"),
            ("diroverfile/child", "child"),
            ("hl2/p", "second pair"),
        ],
    );
    fs::hard_link(l2.join("hl2/p"), l2.join("hl2/q")).unwrap();
    xattr::set(l2.join("etc/conf"), "user.layer", b"2").unwrap();
    tree(
        &l3,
        &[
            (".wh.gone", ""),
            ("etc/new", "new in l3"),
            ("hl3/.wh.b", ""),
            ("bin/tool", "new tool"),
        ],
    );
    chmod(&l3.join("bin/tool"), 0o700);
    symlink(b"hl/one", &l3.join("sym2"));
    set_mtime(&l3.join("etc/new"), 1_600_000_000, 123_456_789);
    let imgs: Vec<PathBuf> = ["l1", "l2", "l3"]
        .iter()
        .map(|n| t.join(format!("{n}.sheaf")))
        .collect();
    for (src, img) in [&l1, &l2, &l3].into_iter().zip(&imgs) {
        build(src, img, &[]);
    }
    let expected = t.join("expected");
    tree(
        &expected,
        &[
            ("etc/conf", "v2"),
            ("etc/new", "new in l3"),
            ("opaq/c", "c from l2"),
            ("fileoverdir", "now a file"),
            ("diroverfile/child", "child"),
            ("hl/one", "hard"),
            ("hl2/p", "second pair"),
            ("hl3/a", "pair, one name whited out"),
            ("bin/tool", "new tool"),
            ("same", "untouched"),
        ],
    );
    fs::hard_link(expected.join("hl/one"), expected.join("hl/two")).unwrap();
    fs::hard_link(expected.join("hl2/p"), expected.join("hl2/q")).unwrap();
    symlink(b"etc/conf", &expected.join("sym"));
    symlink(b"hl/one", &expected.join("sym2"));
    mknod(&expected.join("pipe"), libc::S_IFIFO | 0o640, 0).unwrap();
    chmod(&expected.join("bin/tool"), 0o700);
    xattr::set(expected.join("etc/conf"), "user.layer", b"2").unwrap();
    xattr::set(expected.join("same"), "user.kept", b"yes").unwrap();
    (imgs, expected)
}

/// What the merged tree is compared in: everything but mtimes.
fn three_layers_cmp() -> Cmp {
    Cmp {
        mtime: false,
        nsec: false,
        dir_mtime: false,
        root: false,
        ..Cmp::all()
    }
}

#[test]
fn merge_flattens_a_stack_of_three_layers() {
    let t = tmpdir();
    let (imgs, expected) = three_layers(t.path());
    let layers: Vec<&Path> = imgs.iter().map(|p| p.as_path()).collect();
    let flat = t.path().join("flat.sheaf");
    let j = json(&merge(&layers, &flat, &["--json", "-c", "lz4"]).ok());
    assert_eq!(j["image"], flat.display().to_string().as_str());
    assert_eq!(j["layers"].as_array().map(|a| a.len()), Some(3));

    // The same names as the stack shows, and no whiteout left.
    assert_eq!(ls_r(&flat.display().to_string()), ls_r(&stack_arg(&layers)));
    let o = sheaf_in(["info".as_ref(), flat.as_os_str(), "--whiteouts".as_ref()]).ok();
    assert!(
        o.text()
            .contains("whiteouts:    0 (hidden in the layers below)\nopaque dirs:  0\n"),
        "{}",
        o.text()
    );

    let out = t.path().join("out");
    extract(&flat, &out);
    assert_eq!(describe_tree(&out), describe_tree(&expected));
    // Content, modes, owners, link counts, hardlink identity, xattrs.
    assert_same_tree(&expected, &out, three_layers_cmp());
    // Mtimes come from the layer that wins, to the nanosecond.
    let md = fs::metadata(out.join("etc/new")).unwrap();
    assert_eq!((md.mtime(), md.mtime_nsec()), (1_600_000_000, 123_456_789));
    // The image is intact and merging again gives the same bytes.
    sheaf_in(["check".as_ref(), flat.as_os_str()]).ok();
    let again = t.path().join("again.sheaf");
    merge(&layers, &again, &["-q", "-c", "lz4", "-j", "1"]).ok();
    assert_eq!(fs::read(&flat).unwrap(), fs::read(&again).unwrap());
}

/// The same stack mounted through the kernel path (`--kernel`: EROFS
/// metadata of the merged view, one blob over the three layers) shows the
/// tree made by hand, as the merged image does.
#[test]
fn a_stack_through_the_kernel_path_shows_the_merged_tree() {
    if !prerequisite(is_root(), "root (the kernel path mounts EROFS)") || !mounts_allowed() {
        return;
    }
    let t = tmpdir();
    let (imgs, expected) = three_layers(t.path());
    let mp = t.path().join("mnt");
    let cache = format!("kernel_cache={}", t.path().join("kcache").display());
    let m = mount(&imgs, &mp, &["--kernel=require", "-o", &cache]);
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        info.lines()
            .any(|l| l.contains(&format!(" {} ", mp.display())) && l.contains(" - erofs ")),
        "not an EROFS mount at {}",
        mp.display()
    );
    assert_eq!(describe_tree(&mp), describe_tree(&expected));
    assert_same_tree(&expected, &mp, three_layers_cmp());
    let md = fs::metadata(mp.join("etc/new")).unwrap();
    assert_eq!((md.mtime(), md.mtime_nsec()), (1_600_000_000, 123_456_789));
    m.umount();
}

#[test]
fn merge_refuses_bad_inputs_and_leaves_nothing_behind() {
    let t = tmpdir();
    let src = t.path().join("src");
    let mut r = Rng::new(6);
    tree(&src, &[("a/small", "small")]);
    write(&src.join("a/random"), &r.bytes(200_000));
    let good = t.path().join("good.sheaf");
    build(&src, &good, &["-c", "none"]);
    let out = t.path().join("out.sheaf");
    let check = |o: Out, names: &str| {
        let o = o.fails_with(1);
        let line = o.one_err_line();
        assert!(line.contains(names), "{}", o.describe());
        assert!(!out.exists(), "{} was left behind", out.display());
        assert!(temp_leftovers(t.path()).is_empty());
    };
    // A missing layer.
    let missing = t.path().join("missing.sheaf");
    check(merge(&[&good, &missing], &out, &[]), "missing.sheaf");
    // Not an image at all.
    let junk = t.path().join("junk.sheaf");
    write(&junk, &[7u8; 4096]);
    check(merge(&[&junk, &good], &out, &[]), "junk.sheaf");
    // A damaged data block: found while reading it, mid-build.
    let damaged = t.path().join("damaged.sheaf");
    let mut bytes = fs::read(&good).unwrap();
    bytes[64 + 1000] ^= 0xff;
    write(&damaged, &bytes);
    check(merge(&[&damaged], &out, &["--json"]), "damaged.sheaf");
    // An output that cannot be written.
    let nodir = t.path().join("no/such/dir/out.sheaf");
    let o = merge(&[&good], &nodir, &[]).fails_with(1);
    assert!(o.one_err_line().contains("out.sheaf"), "{}", o.describe());
    if !is_root() {
        let ro = t.path().join("ro");
        fs::create_dir(&ro).unwrap();
        chmod(&ro, 0o555);
        let o = merge(&[&good], &ro.join("out.sheaf"), &[]).fails_with(1);
        assert!(o.one_err_line().contains("out.sheaf"), "{}", o.describe());
        assert_eq!(fs::read_dir(&ro).unwrap().count(), 0);
    }
    // An existing output is kept without --force.
    write(&out, b"precious");
    let o = merge(&[&good], &out, &[]).fails_with(1);
    assert!(
        o.one_err_line().contains("already exists"),
        "{}",
        o.describe()
    );
    assert_eq!(fs::read(&out).unwrap(), b"precious");
}

/// Run a shell command line with `$1`... set to `args`, asserting success.
fn sh(script: &str, args: &[&Path]) {
    let st = std::process::Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg("sh")
        .args(args)
        .status()
        .expect("sh");
    assert!(st.success(), "{script}: {st}");
}

/// Copy a tree with modes, owners, mtimes, symlinks and hardlinks (what
/// `cp -a` does, by plain opens).
fn copy_tree(from: &Path, to: &Path) {
    let mut inodes: std::collections::HashMap<u64, PathBuf> = Default::default();
    let paths = walk(from);
    for p in &paths {
        let (src, dst) = (join(from, p), join(to, p));
        let md = fs::symlink_metadata(&src).unwrap();
        if md.is_dir() {
            fs::create_dir_all(&dst).unwrap();
        } else if md.file_type().is_symlink() {
            symlink(
                fs::read_link(&src).unwrap().as_os_str().as_encoded_bytes(),
                &dst,
            );
        } else if let Some(first) = inodes.get(&md.ino()) {
            fs::hard_link(first, &dst).unwrap();
            continue;
        } else {
            write(&dst, &fs::read(&src).unwrap());
            if md.nlink() > 1 {
                inodes.insert(md.ino(), dst.clone());
            }
        }
        lchown(&dst, md.uid(), md.gid());
        if !md.file_type().is_symlink() {
            chmod(&dst, md.mode() & 0o7777);
        }
    }
    // Mtimes last, deepest first, so filling a directory does not change its own.
    for p in paths.iter().rev() {
        let md = fs::symlink_metadata(join(from, p)).unwrap();
        set_mtime(&join(to, p), md.mtime(), md.mtime_nsec() as u32);
    }
}

/// A writable mount's upper directory, committed after unmounting, stacks
/// on its base to give exactly the tree the mount showed.
#[test]
fn a_writable_mount_commits_to_the_tree_it_showed() {
    if !mounts_allowed() {
        return;
    }
    let t = tmpdir();
    let base = t.path().join("base");
    small_tree(&base, 61);
    tree(
        &base,
        &[
            ("old/dir/a", "replaced wholesale"),
            ("old/b", "replaced wholesale"),
            ("drop/me", "deleted"),
        ],
    );
    let bi = t.path().join("base.sheaf");
    build(&base, &bi, &[]);
    let (mp, up) = (t.path().join("mp"), t.path().join("upper"));
    fs::create_dir_all(&up).unwrap();
    let guard = mount(&[&bi], &mp, &["--upper", up.to_str().unwrap()]);
    // Change, add, delete, replace a directory, chmod, link.
    sh(
        r#"cd "$1" && printf 'edited\n' >> README.txt && echo new > docs/new.txt \
           && rm docs/b.txt && rm -r drop && rm -r old && mkdir -p old/fresh \
           && echo fresh > old/fresh/f && chmod 600 bin/random.dat \
           && ln -s docs/new.txt new-link && mkdir -p added/deep && echo deep > added/deep/x"#,
        &[&mp],
    );
    let layer = t.path().join("layer.sheaf");
    // While mounted: refused.
    let o = commit(&up, &layer, &[]).fails_with(1);
    assert!(
        o.one_err_line()
            .ends_with("in use by a writable mount; unmount it first"),
        "{}",
        o.describe()
    );
    let snap = t.path().join("snap");
    copy_tree(&mp, &snap);
    guard.umount();
    // Left over from an interrupted copy-up: never part of the layer.
    write(&up.join(".wh..sheaf-copyup.999"), b"partial");
    commit(&up, &layer, &["-q"]).ok();
    let names = ls_r(&layer.display().to_string());
    assert!(names.iter().any(|n| n == "docs/.wh.b.txt"), "{names:?}");
    assert!(
        !names.iter().any(|n| n.contains(".wh..sheaf-")),
        "{names:?}"
    );
    // The stack shows what the mount showed, and merges into it.
    let flat = t.path().join("flat.sheaf");
    merge(&[&bi, &layer], &flat, &["-q"]).ok();
    let out = t.path().join("out");
    extract(&flat, &out);
    assert_eq!(describe_tree(&out), describe_tree(&snap));
    // The union mount shows the base's hardlinks as separate files; the
    // layers keep them, so the merged image does too.
    let cmp = Cmp {
        dir_mtime: false,
        root: false,
        nlink: false,
        hardlinks: false,
        ..Cmp::all()
    };
    assert_same_tree(&snap, &out, cmp);
    let ino = |p: &str| fs::metadata(out.join(p)).unwrap().ino();
    assert_eq!(ino("bin/tool"), ino("bin/tool-link"));
}

/// `find`, `du` and `info` on a stack `BASE,LAYER` read the merged tree.
/// Expected values come from GNU find and du on the same tree made on disk
/// with cp and rm: the base copied, the paths the top layer's whiteouts
/// hide (and the directory its file replaces) removed, the top copied over,
/// the whiteout files deleted.
#[test]
fn find_du_and_info_on_a_stack_read_the_merged_tree() {
    let t = tmpdir();
    let base = t.path().join("base");
    let top = t.path().join("top");
    let files: [(&Path, &[&str]); 2] = [
        (
            &base,
            &[
                "a/x", "a/y", "a/deep/f", "b/old", "keep", "c/inside", "e/only",
            ],
        ),
        (
            &top,
            &[
                "a/.wh.x",
                "a/z",
                ".wh.keep",
                "b/.wh..wh..opq",
                "b/new",
                "c",
                "e/.wh.only",
                "empty-file",
            ],
        ),
    ];
    for (root, names) in files {
        for f in names {
            let p = root.join(f);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            let data = if f.contains(".wh.") || *f == "empty-file" {
                String::new()
            } else {
                format!("{f} of {}\n", root.display()).repeat(f.len())
            };
            write(&p, data.as_bytes());
        }
    }
    fs::create_dir_all(top.join("newdir/empty")).unwrap();
    std::os::unix::fs::symlink("a/y", base.join("sym")).unwrap();
    let (bi, ti) = (t.path().join("base.sheaf"), t.path().join("top.sheaf"));
    build(&base, &bi, &[]).ok();
    build(&top, &ti, &[]).ok();
    let stack = format!("{},{}", bi.display(), ti.display());

    // The merged tree on disk, by hand from the top layer's whiteouts.
    let m = t.path().join("merged");
    let sh = |script: &str| {
        let o = run_cmd(
            Command::new("bash")
                .args(["-ec", script])
                .current_dir(t.path()),
        )
        .ok();
        o.text()
    };
    sh("mkdir merged && cp -a base/. merged/ \
        && rm -rf merged/a/x merged/keep merged/b merged/c merged/e/only \
        && cp -a top/. merged/ && find merged -name '.wh.*' -delete");
    let gnu = |args: &str| -> Vec<String> {
        let mut v: Vec<String> = sh(&format!("cd merged && {args}"))
            .lines()
            .map(String::from)
            .collect();
        v.sort();
        v
    };
    let ours = |args: &[&str]| -> Vec<String> {
        let mut a = vec!["find", stack.as_str(), "."];
        a.extend(args);
        let mut v: Vec<String> = sheaf_in(a).ok().text().lines().map(String::from).collect();
        v.sort();
        v
    };
    assert!(m.join("a/z").is_file() && !m.join("keep").exists());
    // Every path, then files and links with sizes and types, then -empty.
    assert_eq!(ours(&[]), gnu("find ."));
    assert_eq!(ours(&[]).len(), 14, "{:?}", ours(&[]));
    let printf = ["-type", "f", "-o", "-type", "l"];
    let fmt = "%p %s %y %m\\n";
    assert_eq!(
        ours(&["(", "-type", "f", "-o", "-type", "l", ")", "-printf", fmt]),
        gnu(&format!(
            "find . \\( {} \\) -printf '{fmt}'",
            printf.join(" ")
        ))
    );
    assert_eq!(ours(&["-empty"]), gnu("find . -empty"));
    assert_eq!(ours(&["-empty"]), ["./e", "./empty-file", "./newdir/empty"]);
    assert_eq!(
        ours(&["-depth", "-name", "?"]),
        gnu("find . -depth -name '?'")
    );

    // du: per directory, entries as GNU du --inodes counts them; bytes: the
    // files' and links' apparent sizes.
    let du = |args: &[&str]| -> Vec<String> {
        let mut a = vec!["du"];
        a.extend(args);
        a.extend([stack.as_str(), "."]);
        let mut v: Vec<String> = sheaf_in(a).ok().text().lines().map(String::from).collect();
        v.sort();
        v
    };
    assert_eq!(du(&["--inodes"]), gnu("du --inodes ."));
    let total: u64 = sh("cd merged && find . \\( -type f -o -type l \\) -printf '%s\\n'")
        .lines()
        .map(|l| l.parse::<u64>().unwrap())
        .sum();
    assert_eq!(du(&["-s"]), [format!("{total}\t.")]);

    // info: the merged figures, then each layer's own.
    let count = |kind: &str| gnu(&format!("find . -type {kind}")).len() as u64;
    let v = json(&sheaf_in(["info", "--json", &stack]).ok());
    let merged = &v["merged"];
    assert_eq!(merged["inodes"].as_u64(), Some(gnu("find .").len() as u64));
    assert_eq!(
        merged["entries_by_type"]["directory"].as_u64(),
        Some(count("d"))
    );
    assert_eq!(merged["entries_by_type"]["file"].as_u64(), Some(count("f")));
    assert_eq!(
        merged["entries_by_type"]["symlink"].as_u64(),
        Some(count("l"))
    );
    let file_bytes: u64 = gnu("find . -type f -printf '%s\\n'")
        .iter()
        .map(|l| l.parse::<u64>().unwrap())
        .sum();
    assert_eq!(merged["logical_bytes"].as_u64(), Some(file_bytes));
    let alone =
        |p: &Path| json(&sheaf_in(["info".as_ref(), "--json".as_ref(), p.as_os_str()]).ok());
    let (bj, tj) = (alone(&bi), alone(&ti));
    assert_eq!(v["layers"][0], bj);
    assert_eq!(v["layers"][1], tj);
    let layer_inodes = bj["inodes"].as_u64().unwrap() + tj["inodes"].as_u64().unwrap();
    assert_eq!(
        merged["hidden_inodes"].as_u64(),
        Some(layer_inodes - gnu("find .").len() as u64)
    );
    assert_eq!(
        merged["image_bytes"].as_u64(),
        Some(fs::metadata(&bi).unwrap().len() + fs::metadata(&ti).unwrap().len())
    );
    assert_eq!(v["stack"].as_str(), Some(stack.as_str()));
    let text = sheaf_in(["info", &stack]).ok().text();
    assert!(
        text.starts_with(&format!("stack:        {stack} (2 layers")),
        "{text}"
    );
    let merged_line = format!(
        "merged:       {} inodes ({} directory, {} file, {} symlink)",
        gnu("find .").len(),
        count("d"),
        count("f"),
        count("l")
    );
    assert!(text.contains(&merged_line), "{merged_line}\n{text}");
    assert!(
        text.contains("\nlayer 1 of 2 (bottom):\nimage:        "),
        "{text}"
    );
    assert!(
        text.contains("\nlayer 2 of 2 (top):\nimage:        "),
        "{text}"
    );
    // A path that the top layer hides is not found.
    let o = sheaf_in(["find", &stack, "keep"]).fails_with(1);
    assert!(o.one_err_line().contains("keep"), "{}", o.describe());
}
