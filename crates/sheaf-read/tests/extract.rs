//! `sheaf_read::extract` never reaches outside the target through a
//! symlink of the image: extended attributes a symlink carries are set on
//! the symlink itself (or counted as unrestored), never on what it names.

use sheaf_build::entries::{Entry, EntryKind, EntrySource};
use sheaf_build::{build, BuildError, BuildOptions, Input, Progress};
use sheaf_read::{extract, ExtractOptions};
use std::fs;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// A root holding symlinks `(name, target)`, each carrying `xattrs`.
#[derive(Debug)]
struct Links {
    links: Vec<(String, String)>,
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

impl EntrySource for Links {
    fn name(&self) -> String {
        "links".into()
    }
    fn entries(&self) -> Box<dyn Iterator<Item = Result<Entry<'_>, BuildError>> + '_> {
        let entry = |path: &str, mode, xattrs, kind| Entry {
            path: path.as_bytes().to_vec(),
            mode,
            uid: 0,
            gid: 0,
            mtime_sec: 1_000_000_000,
            mtime_nsec: 0,
            xattrs,
            link: None,
            kind,
        };
        let root = entry("", libc::S_IFDIR | 0o755, Vec::new(), EntryKind::Dir);
        let links = self.links.iter().map(move |(name, target)| {
            entry(
                name,
                libc::S_IFLNK | 0o777,
                self.xattrs.clone(),
                EntryKind::Symlink(target.as_bytes().to_vec()),
            )
        });
        Box::new(std::iter::once(root).chain(links).map(Ok))
    }
}

fn xattrs_of(p: &Path) -> Vec<(String, Option<Vec<u8>>)> {
    let mut v: Vec<_> = xattr::list(p)
        .unwrap()
        .map(|k| {
            let val = xattr::get(p, &k).unwrap();
            (k.to_string_lossy().into_owned(), val)
        })
        .collect();
    v.sort();
    v
}

/// Whether this filesystem takes `trusted.*` attributes on symlinks (root only).
fn trusted_on_symlinks(dir: &Path) -> bool {
    let probe = dir.join("probe");
    std::os::unix::fs::symlink("nowhere", &probe).unwrap();
    let ok = xattr::set(&probe, "trusted.probe", b"1").is_ok();
    fs::remove_file(&probe).unwrap();
    ok
}

#[test]
fn a_symlinks_xattrs_never_reach_its_target() {
    let t = tempfile::tempdir().unwrap();
    // The victim, outside the extraction directory, with an attribute of
    // its own that must stay as it is.
    let victim = t.path().join("victim.txt");
    fs::write(&victim, b"keep me\n").unwrap();
    let has_user_xattrs = xattr::set(&victim, "user.own", b"original").is_ok();
    let before = xattrs_of(&victim);
    let trusted = trusted_on_symlinks(t.path());
    let mut xattrs = vec![
        (b"user.evil".to_vec(), b"set through a symlink".to_vec()),
        (b"user.own".to_vec(), b"overwritten".to_vec()),
    ];
    if trusted {
        xattrs.push((b"trusted.evil".to_vec(), b"on the link".to_vec()));
    }
    let src = Links {
        links: vec![
            // Absolute, and relative from the extraction directory.
            ("abs".into(), victim.display().to_string()),
            ("rel".into(), "../victim.txt".into()),
        ],
        xattrs,
    };
    let img_path = t.path().join("links.sheaf");
    build(
        &Input::Entries(Arc::new(src)),
        &img_path,
        &BuildOptions::default(),
        Arc::new(Progress::default()),
        &AtomicBool::new(false),
    )
    .unwrap();
    let img = sheaf_read::open_path(&img_path).unwrap();
    // The image holds what the test means.
    let abs = img.resolve(b"abs").unwrap();
    assert_eq!(
        img.read_link(&abs).unwrap(),
        victim.as_os_str().as_encoded_bytes()
    );
    assert!(img.xattrs(&abs).unwrap().0.len() >= 2);

    let out = t.path().join("x");
    let r = extract(
        &img,
        &ExtractOptions {
            target: out.clone(),
            paths: Vec::new(),
            keep_going: false,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(r.entries, 2);
    for name in ["abs", "rel"] {
        let md = fs::symlink_metadata(out.join(name)).unwrap();
        assert!(md.file_type().is_symlink(), "{name}");
    }
    // The target is untouched: content and attributes.
    assert_eq!(fs::read(&victim).unwrap(), b"keep me\n");
    assert_eq!(
        xattrs_of(&victim),
        before,
        "extract changed the symlink's target"
    );
    if has_user_xattrs {
        assert_eq!(
            xattr::get(&victim, "user.own").unwrap().as_deref(),
            Some(&b"original"[..])
        );
    }
    // Linux refuses user.* attributes on symlinks: each is counted, named.
    assert!(r.unrestored >= 4, "{r:?}");
    let first = r.first_unrestored.unwrap();
    assert!(first.starts_with("abs: xattr user."), "{first}");
    // Where symlinks take attributes, they land on the link itself.
    if trusted {
        for name in ["abs", "rel"] {
            assert_eq!(
                xattr::get(out.join(name), "trusted.evil")
                    .unwrap()
                    .as_deref(),
                Some(&b"on the link"[..]),
                "{name}"
            );
        }
    }
}
