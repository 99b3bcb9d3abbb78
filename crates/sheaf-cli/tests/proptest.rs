//! Random small trees survive build → extract with every attribute intact.

mod common;

use common::Rng;
use common::*;
use proptest::prelude::*;
use std::collections::{HashMap, HashSet};
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone)]
enum Kind {
    Dir,
    /// Size, content style, seed.
    File(usize, u8, u64),
    Symlink(Vec<u8>),
    /// Another name for an earlier file (index modulo the files made so far).
    Hardlink(usize),
    Fifo,
}

#[derive(Debug, Clone)]
struct Spec {
    /// Parent: an earlier directory (index modulo the directories made so far).
    parent: usize,
    name: Vec<u8>,
    kind: Kind,
    mode: u32,
    mtime: (i64, u32),
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

fn name() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(1u8..=255, 1..=24).prop_map(|mut v| {
        for b in &mut v {
            if *b == b'/' {
                *b = b'_';
            }
        }
        if v == b"." || v == b".." {
            v = b"dot".to_vec();
        }
        v
    })
}

fn kind() -> impl Strategy<Value = Kind> {
    let size = prop_oneof![3 => 0usize..100, 3 => 0usize..70_000, 3 => 60_000usize..300_000];
    prop_oneof![
        3 => Just(Kind::Dir),
        6 => (size, 0u8..5, any::<u64>()).prop_map(|(s, st, seed)| Kind::File(s, st, seed)),
        2 => prop::collection::vec(1u8..=255, 1..80).prop_map(Kind::Symlink),
        2 => any::<usize>().prop_map(Kind::Hardlink),
        1 => Just(Kind::Fifo),
    ]
}

fn spec() -> impl Strategy<Value = Spec> {
    (
        any::<usize>(),
        name(),
        kind(),
        0u32..0o10000,
        (-2_000_000_000i64..4_000_000_000, 0u32..1_000_000_000),
        prop::collection::vec(
            (
                prop::collection::vec(b'a'..=b'z', 1..8),
                prop::collection::vec(any::<u8>(), 0..40),
            ),
            0..3,
        ),
    )
        .prop_map(|(parent, name, kind, mode, mtime, xattrs)| Spec {
            parent,
            name,
            kind,
            mode,
            mtime,
            xattrs,
        })
}

/// File content of a style: random, text, zeros with data at the ends (holes
/// at 64 KiB), a repeated 64 KiB block (block dedup), or one of three fixed
/// contents (whole-file dedup).
fn content(size: usize, style: u8, seed: u64) -> Vec<u8> {
    let mut r = Rng::new(seed);
    match style {
        0 => r.bytes(size),
        1 => r.text(size),
        2 => {
            let mut v = vec![0u8; size];
            let n = size.min(1000);
            r.fill(&mut v[..n]);
            r.fill(&mut v[size - n..]);
            v
        }
        3 => {
            let block = Rng::new(seed % 4).bytes(64 << 10);
            block.iter().copied().cycle().take(size).collect()
        }
        _ => Rng::new(seed % 3).text(size),
    }
}

/// Make the tree under `root`; returns nothing but the tree on disk.
fn materialize(root: &Path, specs: &[Spec]) {
    let root_ok = is_root();
    let mut dirs: Vec<PathBuf> = vec![root.to_path_buf()];
    let mut files: Vec<PathBuf> = Vec::new();
    let mut taken: HashMap<usize, HashSet<Vec<u8>>> = HashMap::new();
    let mut made: Vec<(PathBuf, &Spec)> = Vec::new();
    for s in specs {
        let d = s.parent % dirs.len();
        if !taken.entry(d).or_default().insert(s.name.clone()) {
            continue;
        }
        let p = join(&dirs[d], &s.name);
        match &s.kind {
            Kind::Dir => {
                fs::create_dir(&p).unwrap();
                dirs.push(p.clone());
            }
            Kind::File(size, style, seed) => {
                write(&p, &content(*size, *style, *seed));
                files.push(p.clone());
            }
            Kind::Symlink(t) => symlink(t, &p),
            Kind::Hardlink(i) => {
                if files.is_empty() {
                    taken.get_mut(&d).unwrap().remove(&s.name);
                    continue;
                }
                fs::hard_link(&files[i % files.len()], &p).unwrap();
            }
            Kind::Fifo => {
                let c = cstr(&p);
                assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
            }
        }
        if matches!(s.kind, Kind::Dir | Kind::File(..)) {
            for (k, v) in &s.xattrs {
                let mut n = b"user.".to_vec();
                n.extend_from_slice(k);
                xattr::set(&p, std::ffi::OsStr::from_bytes(&n), v).unwrap();
            }
        }
        made.push((p, s));
    }
    // Modes, then mtimes, once nothing more is created.
    for (p, s) in &made {
        let mode = match s.kind {
            Kind::Symlink(_) | Kind::Hardlink(_) => continue,
            Kind::Dir if !root_ok => s.mode | 0o700,
            Kind::File(..) if !root_ok => (s.mode | 0o400) & 0o1777,
            _ => s.mode,
        };
        chmod(p, mode);
    }
    for (p, s) in &made {
        set_mtime(p, s.mtime.0, s.mtime.1);
    }
    set_mtime(root, 1_234_567_890, 123);
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 24,
        // A failing case is written to tests/proptest-regressions/ and
        // replayed first on every later run: commit that file with the fix.
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::SourceParallel("proptest-regressions"),
        )),
        max_shrink_iters: 200,
        .. ProptestConfig::default()
    })]

    #[test]
    fn random_trees_round_trip(
        specs in prop::collection::vec(spec(), 0..30),
        codec in prop_oneof![Just("zstd:3"), Just("lz4"), Just("none"), Just("xz:1"), Just("auto:3")],
    ) {
        let t = tmpdir();
        let src = t.path().join("src");
        fs::create_dir(&src).unwrap();
        chmod(&src, 0o755);
        materialize(&src, &specs);
        let img = t.path().join("x.sheaf");
        let b = run_cmd(cmd().arg("build").arg(&src).arg("-o").arg(&img).args(["--block-size", "64K", "-c", codec]));
        prop_assert_eq!(b.code, 0, "build failed:\n{}", b.describe());
        let out = t.path().join("out");
        // -p: every attribute back (setuid and setgid bits too).
        let x = run_cmd(cmd().arg("extract").arg("-p").arg(&img).arg("-C").arg(&out));
        prop_assert_eq!(x.code, 0, "extract failed:\n{}", x.describe());
        let errs = compare_trees(&src, &out, Cmp { owner: true, ..Cmp::all() });
        prop_assert!(errs.is_empty(), "{} differences:\n  {}", errs.len(), errs.join("\n  "));
        let c = sheaf(["check".as_ref(), img.as_os_str()]);
        prop_assert_eq!(c.code, 0, "check failed:\n{}", c.describe());
    }
}
