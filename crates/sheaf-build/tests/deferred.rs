//! Deferred entries (`EntryKind::Deferred`, what `sheaf merge`'s walk
//! gives): packed after the walk by the directory build's plan, not in the
//! order they come, so a caller's entries of a directory give the image a
//! build of that directory gives, trained dictionary included; a file whose
//! reader fails is reported by name, or left out under `skip_errors`, also
//! when it was read as a dictionary sample.

use sheaf_build::entries::{Entry, EntryKind, EntrySource};
use sheaf_build::{build, BuildError, BuildOptions, Input, Progress};
use std::fs;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// A small deterministic generator (xorshift).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
    /// Text-like bytes from a vocabulary every file shares.
    fn text(&mut self, n: usize) -> Vec<u8> {
        const W: &[&str] = &[
            "import ", "numpy ", "return ", "self.", "axis", "(dtype", ", ", ")\n", "def ",
        ];
        let mut v = Vec::with_capacity(n + 8);
        while v.len() < n {
            v.extend_from_slice(W[self.below(W.len() as u64) as usize].as_bytes());
            v.extend_from_slice(self.below(1000).to_string().as_bytes());
        }
        v.truncate(n);
        v
    }
}

/// One flat directory (one directory: its packing order depends on names
/// alone): versions of a module, files of a pack or more, and `small`
/// bytes of small files in all.
fn tree(root: &Path, small: usize) {
    fs::create_dir_all(root).unwrap();
    let mut r = Rng(0x9E37_79B9_7F4A_7C15);
    let module = r.text(20_000);
    for v in ["1.2.0", "1.10.3", "2.0.1"] {
        let mut m = module.clone();
        m[5000..5040].copy_from_slice(&r.text(40));
        fs::write(root.join(format!("mod-{v}.py")), m).unwrap();
    }
    fs::write(root.join("big-1.0.bin"), r.text(300_000)).unwrap();
    fs::write(root.join("big-1.1.bin"), r.text(300_000)).unwrap();
    let mut total = 0;
    let mut i = 0;
    while total < small {
        let n = 1000 + r.below(7000) as usize;
        fs::write(root.join(format!("f{i:05}.txt")), r.text(n)).unwrap();
        total += n;
        i += 1;
    }
}

/// The directory's entries, files last first (as far from the packing
/// order as a stream gets), each file `Deferred` (or, with `streamed`, a
/// plain `File`); the file named `fail` reads as an I/O error.
#[derive(Debug)]
struct Entries {
    root: PathBuf,
    streamed: bool,
    fail: Option<&'static str>,
}

/// A reader that gives 100 bytes, then fails once (as a damaged layer's
/// block does), then would go on after those 100 bytes: a file whose
/// reader failed must never be stored from what is left of it.
struct Failing {
    file: fs::File,
    given: usize,
    failed: bool,
}

impl Read for Failing {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.given >= 100 && !self.failed {
            self.failed = true;
            return Err(std::io::Error::other("block 7 does not match its digest"));
        }
        let room = if self.failed {
            buf.len()
        } else {
            buf.len().min(100 - self.given)
        };
        let n = self.file.read(&mut buf[..room])?;
        self.given += n;
        Ok(n)
    }
}

impl EntrySource for Entries {
    fn name(&self) -> String {
        String::new()
    }
    fn entries(&self) -> Box<dyn Iterator<Item = Result<Entry<'_>, BuildError>> + '_> {
        let mut names: Vec<Vec<u8>> = fs::read_dir(&self.root)
            .unwrap()
            .map(|e| e.unwrap().file_name().as_bytes().to_vec())
            .collect();
        names.sort();
        names.reverse();
        names.insert(0, Vec::new());
        Box::new(names.into_iter().map(move |n| {
            let p = self.root.join(std::ffi::OsStr::from_bytes(&n));
            let md = fs::symlink_metadata(&p).unwrap();
            let kind = if n.is_empty() {
                EntryKind::Dir
            } else {
                let data: Box<dyn Read> = if self.fail.is_some_and(|f| f.as_bytes() == n) {
                    Box::new(Failing {
                        file: fs::File::open(&p).unwrap(),
                        given: 0,
                        failed: false,
                    })
                } else {
                    Box::new(fs::File::open(&p).unwrap())
                };
                if self.streamed {
                    EntryKind::File(data)
                } else {
                    EntryKind::Deferred {
                        size: md.len(),
                        data,
                    }
                }
            };
            Ok(Entry {
                path: n,
                mode: md.mode(),
                uid: md.uid(),
                gid: md.gid(),
                mtime_sec: md.mtime(),
                mtime_nsec: md.mtime_nsec() as u32,
                xattrs: Vec::new(),
                link: None,
                kind,
            })
        }))
    }
}

fn pack(input: &Input, out: &Path, opts: &BuildOptions) -> Result<Vec<u8>, BuildError> {
    build(
        input,
        out,
        opts,
        Arc::new(Progress::default()),
        &AtomicBool::new(false),
    )?;
    Ok(fs::read(out).unwrap())
}

fn entries(root: &Path, streamed: bool, fail: Option<&'static str>) -> Input {
    Input::Entries(Arc::new(Entries {
        root: root.to_path_buf(),
        streamed,
        fail,
    }))
}

#[test]
fn deferred_entries_pack_as_the_directory_does() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("tree");
    tree(&root, 1 << 20);
    let opts = BuildOptions {
        threads: 2,
        ..BuildOptions::default()
    };
    let dir = pack(
        &Input::Dir(root.clone()),
        &t.path().join("dir.sheaf"),
        &opts,
    )
    .unwrap();
    let deferred = pack(
        &entries(&root, false, None),
        &t.path().join("d.sheaf"),
        &opts,
    )
    .unwrap();
    assert!(dir == deferred, "deferred entries and the directory differ");
    // The same entries streamed are packed as they come: other bytes.
    let streamed = pack(
        &entries(&root, true, None),
        &t.path().join("s.sheaf"),
        &opts,
    )
    .unwrap();
    assert!(dir != streamed, "a stream in reverse order packs alike");
}

#[test]
fn a_trained_dictionary_and_a_failing_sample() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("tree");
    // Over 16 MiB of small files: a dictionary is trained.
    tree(&root, 17 << 20);
    let opts = BuildOptions::default();
    let dir = pack(
        &Input::Dir(root.clone()),
        &t.path().join("dir.sheaf"),
        &opts,
    )
    .unwrap();
    let deferred = pack(
        &entries(&root, false, None),
        &t.path().join("d.sheaf"),
        &opts,
    )
    .unwrap();
    assert!(dir == deferred, "deferred entries and the directory differ");
    let img = sheaf_read::open_path(&t.path().join("d.sheaf")).unwrap();
    assert_eq!(img.dictionaries().len(), 1, "a dictionary was trained");

    // f00000 is the first small file of the packing order, so the first
    // sample: its reader fails while the dictionary is trained.
    let err = pack(
        &entries(&root, false, Some("f00000.txt")),
        &t.path().join("bad.sheaf"),
        &opts,
    )
    .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("f00000.txt") && msg.contains("block 7 does not match"),
        "{msg}"
    );
    assert!(!t.path().join("bad.sheaf").exists());
    let skip = BuildOptions {
        skip_errors: true,
        ..BuildOptions::default()
    };
    let out = t.path().join("skip.sheaf");
    let rep = build(
        &entries(&root, false, Some("f00000.txt")),
        &out,
        &skip,
        Arc::new(Progress::default()),
        &AtomicBool::new(false),
    )
    .unwrap();
    assert_eq!(rep.skipped.len(), 1, "{:?}", rep.skipped);
    assert!(rep.skipped[0].contains("f00000.txt"), "{:?}", rep.skipped);
    let img = sheaf_read::open_path(&out).unwrap();
    assert!(
        img.resolve(b"f00000.txt").is_err(),
        "the failed file is left out"
    );
    let f = img.resolve(b"f00001.txt").unwrap();
    let want = fs::read(root.join("f00001.txt")).unwrap();
    let mut got = vec![0; want.len() + 1];
    let n = img.read(&f, 0, &mut got).unwrap();
    assert_eq!(&got[..n], &want[..]);
}
