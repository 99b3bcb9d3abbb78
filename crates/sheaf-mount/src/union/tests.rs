//! The operations of a writable union, called directly (no FUSE, no mount)
//! on small images built here and a temporary upper directory. What each
//! test expects comes from what it wrote, checked in the upper directory
//! itself (the layer format `sheaf commit` packs) and through the ops.

use super::{Caller, UnionConfig, UnionFs};
use fuser::{BackingId, Errno, FileAttr, INodeNo, RenameFlags};
use std::fs;
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const ROOT: INodeNo = INodeNo(1);

/// One entry of a layer: a path (a directory if it ends in `/`) and its
/// content.
fn e(path: &str, content: impl AsRef<[u8]>) -> (String, Vec<u8>) {
    (path.to_string(), content.as_ref().to_vec())
}

/// Build layer image `name` in `dir` from `entries` (in-process).
fn layer(dir: &Path, name: &str, entries: &[(String, Vec<u8>)]) -> PathBuf {
    sheaf_testkit::image(dir, name, entries)
}

/// A writable union of layers (bottom first) over an empty upper directory.
struct Fixture {
    _tmp: tempfile::TempDir,
    upper: PathBuf,
    images: Vec<PathBuf>,
    fs: UnionFs,
}

fn fixture(layers: &[&[(String, Vec<u8>)]]) -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let images: Vec<PathBuf> = layers
        .iter()
        .enumerate()
        .map(|(k, l)| layer(tmp.path(), &format!("l{k}"), l))
        .collect();
    let upper = tmp.path().join("upper");
    fs::create_dir(&upper).unwrap();
    let opened = images
        .iter()
        .map(|p| Arc::new(sheaf_read::open_path(p).unwrap()))
        .collect();
    let fs = UnionFs::new(
        opened,
        UnionConfig {
            upper: Some(upper.clone()),
            upper_lock: None,
        },
    )
    .unwrap();
    Fixture {
        _tmp: tmp,
        upper,
        images,
        fs,
    }
}

fn me() -> Caller {
    Caller {
        uid: nix::unistd::geteuid().as_raw(),
        gid: nix::unistd::getegid().as_raw(),
    }
}

/// Tests never run in kernel passthrough: nothing registers a backing file.
fn no_backing(_: &fs::File) -> io::Result<BackingId> {
    Err(io::Error::other("no passthrough without FUSE"))
}

fn lookup(fs: &UnionFs, dir: INodeNo, name: &str) -> Option<FileAttr> {
    fs.lookup(dir, name.as_bytes()).unwrap()
}

/// The node of `path` (each component looked up once).
fn node(fs: &UnionFs, path: &str) -> INodeNo {
    path.split('/').fold(ROOT, |dir, name| {
        lookup(fs, dir, name)
            .unwrap_or_else(|| panic!("{path}: no {name}"))
            .ino
    })
}

/// Everything in file `ino`, read through an open handle.
fn cat(fs: &UnionFs, ino: INodeNo) -> Vec<u8> {
    let o = fs.open(ino, libc::O_RDONLY, no_backing).unwrap();
    let mut out = Vec::new();
    loop {
        let b = fs.read(ino, o.fh, out.len() as u64, 1 << 16).unwrap();
        if b.is_empty() {
            break;
        }
        out.extend_from_slice(&b);
    }
    fs.release(o.fh);
    out
}

/// The names the merged directory `dir` lists (without `.` and `..`).
fn listing(fs: &UnionFs, dir: INodeNo) -> Vec<String> {
    let fh = fs.opendir(dir).unwrap();
    let mut names = Vec::new();
    fs.readdir(dir, fh, 0, |_, _, _, name| {
        names.push(name.to_string_lossy().into_owned());
        false
    })
    .unwrap();
    fs.releasedir(fh);
    let mut names: Vec<_> = names
        .into_iter()
        .filter(|n| n != "." && n != "..")
        .collect();
    names.sort();
    names
}

/// The names in upper directory `dir`, sorted.
fn upper_names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Whether `p` is an empty regular file (a whiteout or opaque marker).
fn is_marker(p: &Path) -> bool {
    fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_file() && m.len() == 0)
}

fn sorted(v: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = v.iter().map(|s| s.to_string()).collect();
    v.sort();
    v
}

#[test]
fn writing_a_lower_file_copies_it_up_whole_and_leaves_the_image_alone() {
    // Over two read chunks (1 MiB each), so the copy loop goes round.
    let big: Vec<u8> = (0..2_500_000u32).map(|i| (i % 251) as u8).collect();
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    fs::create_dir_all(src.join("dir")).unwrap();
    fs::write(src.join("dir/file"), &big).unwrap();
    fs::write(src.join("dir/other"), "untouched").unwrap();
    fs::set_permissions(src.join("dir/file"), fs::Permissions::from_mode(0o640)).unwrap();
    let image = tmp.path().join("base.sheaf");
    sheaf_testkit::build_dir(&src, &image, &sheaf_build::BuildOptions::default());
    let image_bytes = fs::read(&image).unwrap();
    let upper = tmp.path().join("upper");
    fs::create_dir(&upper).unwrap();
    let union = UnionFs::new(
        vec![Arc::new(sheaf_read::open_path(&image).unwrap())],
        UnionConfig {
            upper: Some(upper.clone()),
            upper_lock: None,
        },
    )
    .unwrap();

    let f = node(&union, "dir/file");
    // Reading does not copy up.
    assert_eq!(cat(&union, f), big);
    assert_eq!(upper_names(&upper), Vec::<String>::new());

    let o = union.open(f, libc::O_WRONLY, no_backing).unwrap();
    assert_eq!(union.write(o.fh, 1_000_000, b"CHANGED").unwrap(), 7);
    union.release(o.fh);

    let mut want = big.clone();
    want[1_000_000..1_000_007].copy_from_slice(b"CHANGED");
    assert_eq!(fs::read(upper.join("dir/file")).unwrap(), want);
    assert_eq!(cat(&union, f), want);
    let m = fs::metadata(upper.join("dir/file")).unwrap();
    assert_eq!(m.mode() & 0o7777, 0o640);
    // Only what changed is in the upper directory, and no temporary.
    assert_eq!(upper_names(&upper), sorted(&["dir"]));
    assert_eq!(upper_names(&upper.join("dir")), sorted(&["file"]));
    assert_eq!(
        listing(&union, node(&union, "dir")),
        sorted(&["file", "other"])
    );
    // The image is as it was.
    assert_eq!(fs::read(&image).unwrap(), image_bytes);
    let again = sheaf_read::Stack::new(vec![Arc::new(sheaf_read::open_path(&image).unwrap())]);
    let (l, i) = again.resolve(b"dir/file").unwrap().shown();
    let mut b = vec![0u8; big.len()];
    assert_eq!(again.layers()[l].read(&i, 0, &mut b).unwrap(), big.len());
    assert_eq!(b, big);
}

#[test]
fn unlinking_a_lower_file_leaves_an_empty_whiteout() {
    let fx = fixture(&[&[e("a/x", "x"), e("a/y", "y")]]);
    let fs = &fx.fs;
    let a = node(fs, "a");
    fs.unlink(a, b"x").unwrap();
    assert!(is_marker(&fx.upper.join("a/.wh.x")));
    assert_eq!(upper_names(&fx.upper.join("a")), sorted(&[".wh.x"]));
    assert!(lookup(fs, a, "x").is_none());
    assert_eq!(listing(fs, a), sorted(&["y"]));
    assert_eq!(fs.unlink(a, b"x"), Err(Errno::ENOENT));
    // Bookkeeping names are neither shown nor made.
    assert!(lookup(fs, a, ".wh.x").is_none());
    assert_eq!(
        fs.create(me(), a, b".wh.z", 0o644, libc::O_WRONLY, no_backing)
            .err(),
        Some(Errno::EINVAL)
    );

    // A name only the upper directory had goes without a whiteout.
    let (n, o) = fs
        .create(me(), a, b"new", 0o644, libc::O_WRONLY, no_backing)
        .unwrap();
    fs.release(o.fh);
    fs.forget(n.ino, 1);
    fs.unlink(a, b"new").unwrap();
    assert_eq!(upper_names(&fx.upper.join("a")), sorted(&[".wh.x"]));

    // Created again, the name comes back and its whiteout goes.
    let (_, o) = fs
        .create(me(), a, b"x", 0o644, libc::O_WRONLY, no_backing)
        .unwrap();
    fs.write(o.fh, 0, b"again").unwrap();
    fs.release(o.fh);
    assert_eq!(upper_names(&fx.upper.join("a")), sorted(&["x"]));
    assert_eq!(cat(fs, lookup(fs, a, "x").unwrap().ino), b"again");
}

#[test]
fn a_lower_directory_removed_and_made_again_is_opaque() {
    let fx = fixture(&[&[e("d/old", "old"), e("d/sub/deep", "deep"), e("keep", "k")]]);
    let fs = &fx.fs;
    let d = node(fs, "d");
    assert_eq!(fs.rmdir(ROOT, b"d"), Err(Errno::ENOTEMPTY));
    let sub = node(fs, "d/sub");
    fs.unlink(sub, b"deep").unwrap();
    fs.rmdir(d, b"sub").unwrap();
    fs.unlink(d, b"old").unwrap();
    fs.rmdir(ROOT, b"d").unwrap();
    assert!(is_marker(&fx.upper.join(".wh.d")));
    assert!(!fx.upper.join("d").exists());
    assert!(lookup(fs, ROOT, "d").is_none());
    assert_eq!(listing(fs, ROOT), sorted(&["keep"]));

    let made = fs.mkdir(me(), ROOT, b"d", 0o755).unwrap();
    assert!(!fx.upper.join(".wh.d").exists());
    assert!(fx.upper.join("d").is_dir());
    assert!(is_marker(&fx.upper.join("d/.wh..wh..opq")));
    assert_eq!(upper_names(&fx.upper.join("d")), sorted(&[".wh..wh..opq"]));
    assert_eq!(listing(fs, made.ino), Vec::<String>::new());
    assert!(lookup(fs, made.ino, "old").is_none());
    assert!(lookup(fs, made.ino, "sub").is_none());
    assert_eq!(made.perm, 0o755);
}

#[test]
fn renaming_a_lower_file_moves_a_copy_and_hides_the_old_name() {
    let fx = fixture(&[&[e("src.txt", "source"), e("dir/", "")]]);
    let fs = &fx.fs;
    let dir = node(fs, "dir");
    fs.rename(ROOT, b"src.txt", dir, b"dst.txt", RenameFlags::empty())
        .unwrap();
    assert_eq!(fs::read(fx.upper.join("dir/dst.txt")).unwrap(), b"source");
    assert!(is_marker(&fx.upper.join(".wh.src.txt")));
    assert_eq!(upper_names(&fx.upper), sorted(&[".wh.src.txt", "dir"]));
    assert!(lookup(fs, ROOT, "src.txt").is_none());
    assert_eq!(cat(fs, node(fs, "dir/dst.txt")), b"source");
    assert_eq!(listing(fs, ROOT), sorted(&["dir"]));
    // NOREPLACE over an existing name.
    let (_, o) = fs
        .create(me(), ROOT, b"other", 0o644, libc::O_WRONLY, no_backing)
        .unwrap();
    fs.release(o.fh);
    assert_eq!(
        fs.rename(
            ROOT,
            b"other",
            dir,
            b"dst.txt",
            RenameFlags::RENAME_NOREPLACE
        ),
        Err(Errno::EEXIST)
    );
}

#[test]
fn renaming_a_merged_directory_takes_all_of_it_along() {
    let fx = fixture(&[
        &[e("m/a", "A"), e("m/gone", "G"), e("m/sub/b", "B")],
        &[e("m/c", "C"), e("m/sub/d", "D")],
    ]);
    let fs = &fx.fs;
    let m = node(fs, "m");
    // Parts of it in the upper directory already: a new file, a deletion.
    let (_, o) = fs
        .create(me(), m, b"new", 0o644, libc::O_WRONLY, no_backing)
        .unwrap();
    fs.write(o.fh, 0, b"N").unwrap();
    fs.release(o.fh);
    fs.unlink(m, b"gone").unwrap();
    assert_eq!(listing(fs, m), sorted(&["a", "c", "new", "sub"]));

    fs.rename(ROOT, b"m", ROOT, b"n", RenameFlags::empty())
        .unwrap();
    let up = fx.upper.join("n");
    // Whole and opaque; the whiteout of `gone` may move along (redundant
    // under the opaque marker).
    let (marks, plain): (Vec<String>, Vec<String>) = upper_names(&up)
        .into_iter()
        .partition(|n| n.starts_with(".wh."));
    assert_eq!(plain, sorted(&["a", "c", "new", "sub"]));
    assert!(
        marks.iter().all(|n| n == ".wh..wh..opq" || n == ".wh.gone"),
        "{marks:?}"
    );
    assert!(is_marker(&up.join(".wh..wh..opq")));
    for (p, c) in [
        ("a", "A"),
        ("c", "C"),
        ("new", "N"),
        ("sub/b", "B"),
        ("sub/d", "D"),
    ] {
        assert_eq!(fs::read(up.join(p)).unwrap(), c.as_bytes(), "{p}");
    }
    assert!(is_marker(&fx.upper.join(".wh.m")));
    assert!(!fx.upper.join("m").exists());
    assert!(lookup(fs, ROOT, "m").is_none());
    let n = node(fs, "n");
    assert_eq!(n, m, "the kernel's node moves with the directory");
    assert_eq!(listing(fs, n), sorted(&["a", "c", "new", "sub"]));
    assert_eq!(listing(fs, node(fs, "n/sub")), sorted(&["b", "d"]));
    assert_eq!(cat(fs, node(fs, "n/sub/d")), b"D");
    assert!(lookup(fs, n, "gone").is_none());
    // The old name can be used again, without the lower contents.
    let again = fs.mkdir(me(), ROOT, b"m", 0o755).unwrap();
    assert_eq!(listing(fs, again.ino), Vec::<String>::new());
}

#[test]
fn a_hardlink_made_after_copy_up_shares_the_upper_file() {
    let fx = fixture(&[&[e("f", "first"), e("d/", "")]]);
    let fs = &fx.fs;
    let f = node(fs, "f");
    let d = node(fs, "d");
    let g = fs.link(f, d, b"g").unwrap();
    assert_eq!(g.ino, f, "one node for both names");
    assert_eq!(g.nlink, 2);
    let (mf, mg) = (
        fs::metadata(fx.upper.join("f")).unwrap(),
        fs::metadata(fx.upper.join("d/g")).unwrap(),
    );
    assert_eq!((mf.ino(), mf.nlink()), (mg.ino(), 2));
    assert_eq!(fs.getattr(f).unwrap().nlink, 2);

    // A write through one name shows through the other.
    let o = fs
        .open(g.ino, libc::O_WRONLY | libc::O_TRUNC, no_backing)
        .unwrap();
    fs.write(o.fh, 0, b"second").unwrap();
    fs.release(o.fh);
    assert_eq!(cat(fs, f), b"second");
    assert_eq!(fs::read(fx.upper.join("f")).unwrap(), b"second");

    // Its first name removed, the node lives on under the other.
    fs.unlink(ROOT, b"f").unwrap();
    assert!(is_marker(&fx.upper.join(".wh.f")));
    assert_eq!(fs.getattr(f).unwrap().nlink, 1);
    assert_eq!(cat(fs, node(fs, "d/g")), b"second");
}

#[test]
fn a_read_only_union_refuses_changes() {
    let tmp = tempfile::tempdir().unwrap();
    let base = layer(tmp.path(), "base", &[e("a", "base a"), e("b", "b")]);
    let top = layer(tmp.path(), "top", &[e("a", "top a"), e(".wh.b", "")]);
    let fs = UnionFs::new(
        [base, top]
            .iter()
            .map(|p| Arc::new(sheaf_read::open_path(p).unwrap()))
            .collect(),
        UnionConfig::default(),
    )
    .unwrap();
    let a = node(&fs, "a");
    assert!(lookup(&fs, ROOT, "b").is_none());
    assert_eq!(fs.mkdir(me(), ROOT, b"x", 0o755).err(), Some(Errno::EROFS));
    assert_eq!(fs.unlink(ROOT, b"a"), Err(Errno::EROFS));
    assert_eq!(fs.access(a, fuser::AccessFlags::W_OK), Err(Errno::EROFS));
    // Open and opendir are the kernel's to cache.
    assert_eq!(
        fs.open(a, libc::O_RDONLY, no_backing).err(),
        Some(Errno::ENOSYS)
    );
    assert_eq!(fs.opendir(ROOT).err(), Some(Errno::ENOSYS));
    // Listing with attributes counts a lookup for each entry taken.
    let mut seen = Vec::new();
    fs.readdirplus(ROOT, 0, |ino, _, name, attr| {
        seen.push((name.to_string_lossy().into_owned(), ino, attr.size));
        false
    })
    .unwrap();
    let names: Vec<_> = seen.iter().map(|s| s.0.as_str()).collect();
    assert_eq!(names, [".", "..", "a"]);
    assert_eq!(seen[2].1, a);
    assert_eq!(seen[2].2, "top a".len() as u64);
    let nodes = || fs.table.lock().unwrap().nodes.len();
    assert_eq!(nodes(), 2);
    fs.forget(a, 2);
    assert_eq!(nodes(), 1);
}

/// Several threads create, rename, look up and unlink in one directory
/// that the layers also have, with a lister meanwhile; then the upper
/// directory must hold exactly what the threads left, and the table only
/// the nodes still looked up.
#[test]
fn concurrent_changes_leave_a_consistent_upper_directory() {
    const THREADS: usize = 4;
    const MAX_ROUNDS: usize = 2000;
    let mut lower: Vec<_> = (0..THREADS)
        .map(|t| e(&format!("shared/l{t}"), format!("lower {t}")))
        .collect();
    lower.push(e("shared/keep", "keep"));
    let fx = fixture(&[&lower]);
    let image_bytes = fs::read(&fx.images[0]).unwrap();
    let fs = &fx.fs;
    let shared = node(fs, "shared");
    let deadline = Instant::now() + Duration::from_secs(3);
    let stop = AtomicBool::new(false);

    let rounds: Vec<usize> = std::thread::scope(|s| {
        let lister = s.spawn(|| {
            let mut lists = 0;
            while !stop.load(Ordering::Relaxed)
                && Instant::now() < deadline + Duration::from_secs(10)
            {
                for name in listing(fs, shared) {
                    // Listed, then perhaps renamed or removed since.
                    if let Some(a) = lookup(fs, shared, &name) {
                        // getattr takes no namespace lock (as before the
                        // split): a rename between its reading of the
                        // node's path and its open gives ENOENT.
                        match fs.getattr(a.ino) {
                            Ok(got) => assert_eq!(got.ino, a.ino),
                            Err(e) => assert_eq!(e, Errno::ENOENT),
                        }
                        fs.forget(a.ino, 1);
                    }
                }
                lists += 1;
            }
            lists
        });
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                s.spawn(move || {
                    let (l, m) = (format!("l{t}"), format!("m{t}"));
                    fs.rename(
                        shared,
                        l.as_bytes(),
                        shared,
                        m.as_bytes(),
                        RenameFlags::empty(),
                    )
                    .unwrap();
                    let mut i = 0;
                    while i < MAX_ROUNDS && Instant::now() < deadline {
                        let (c, r) = (format!("c-{t}-{i}"), format!("r-{t}-{i}"));
                        let data = format!("{t}:{i}");
                        let (a, o) = fs
                            .create(
                                me(),
                                shared,
                                c.as_bytes(),
                                0o644,
                                libc::O_WRONLY,
                                no_backing,
                            )
                            .unwrap();
                        assert_eq!(
                            fs.write(o.fh, 0, data.as_bytes()).unwrap() as usize,
                            data.len()
                        );
                        fs.release(o.fh);
                        fs.rename(
                            shared,
                            c.as_bytes(),
                            shared,
                            r.as_bytes(),
                            RenameFlags::empty(),
                        )
                        .unwrap();
                        let found = lookup(fs, shared, &r).expect("renamed file");
                        assert_eq!(found.ino, a.ino, "a node keeps its number across a rename");
                        assert!(lookup(fs, shared, &c).is_none());
                        assert_eq!(cat(fs, found.ino), data.as_bytes());
                        // The create's lookup and this one.
                        fs.forget(found.ino, 2);
                        if i % 2 == 0 {
                            fs.unlink(shared, r.as_bytes()).unwrap();
                        }
                        i += 1;
                    }
                    i
                })
            })
            .collect();
        // Every worker joined before any failure is raised: a failed one
        // must not leave the lister running (the scope would wait forever).
        let rounds: Vec<_> = workers.into_iter().map(|w| w.join()).collect();
        stop.store(true, Ordering::Relaxed);
        let lists = lister.join();
        let rounds: Vec<usize> = rounds
            .into_iter()
            .map(|r| r.unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect();
        assert!(lists.unwrap_or_else(|e| std::panic::resume_unwind(e)) > 0);
        rounds
    });

    let mut want = vec!["keep".to_string()];
    let mut want_upper = Vec::new();
    for (t, &n) in rounds.iter().enumerate() {
        assert!(n > 0, "thread {t} did nothing");
        want.push(format!("m{t}"));
        want_upper.push(format!("m{t}"));
        want_upper.push(format!(".wh.l{t}"));
        for i in (1..n).step_by(2) {
            want.push(format!("r-{t}-{i}"));
            want_upper.push(format!("r-{t}-{i}"));
        }
    }
    want.sort();
    want_upper.sort();
    let up = fx.upper.join("shared");
    // Exactly these: no created name left behind, no whiteout for a name
    // only the upper directory had, no copy-up temporary.
    assert_eq!(upper_names(&up), want_upper);
    for (t, &n) in rounds.iter().enumerate() {
        assert!(is_marker(&up.join(format!(".wh.l{t}"))));
        assert_eq!(
            fs::read(up.join(format!("m{t}"))).unwrap(),
            format!("lower {t}").as_bytes()
        );
        for i in (1..n).step_by(2) {
            assert_eq!(
                fs::read(up.join(format!("r-{t}-{i}"))).unwrap(),
                format!("{t}:{i}").as_bytes()
            );
        }
    }
    assert_eq!(listing(fs, shared), want);
    // Only the root and `shared` are still looked up.
    assert_eq!(fs.table.lock().unwrap().nodes.len(), 2);
    assert_eq!(fs::read(&fx.images[0]).unwrap(), image_bytes);
}
