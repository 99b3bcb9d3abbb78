//! Damaged images: every command fails cleanly (exit 1, one line naming the
//! image, never a panic), `check` names what is damaged, and `cat` never
//! writes bytes that are not the file's.

mod common;

use common::*;
use sheaf_format::{SectionKind, StreamId, Trailer, TRAILER_LEN};
use std::fs;
use std::path::{Path, PathBuf};

/// The file whose first data block is block 0, and one stored elsewhere.
const VICTIM: &str = "a.bin";
const INTACT: &str = "dir/b.txt";

struct Base {
    _t: tempfile::TempDir,
    dir: PathBuf,
    src: PathBuf,
    img: PathBuf,
    bytes: Vec<u8>,
}

fn base() -> Base {
    let t = tmpdir();
    let dir = t.path().to_path_buf();
    let src = dir.join("src");
    let mut r = Rng::new(3);
    fs::create_dir_all(src.join("dir")).unwrap();
    // Packing order is by extension: a.bin's two full blocks come first.
    write(&src.join(VICTIM), &r.bytes(2 * (1 << 20) + 5000));
    write(&src.join(INTACT), &r.text(50_000));
    write(&src.join("dir/c.txt"), b"small\n");
    symlink(b"a.bin", &src.join("link"));
    let img = dir.join("good.sheaf");
    build(&src, &img, &["--block-size", "1M"]); // victim and intact files in different blocks
    let bytes = fs::read(&img).unwrap();
    // Make sure the fixture is what the cases assume.
    let im = sheaf_read::open_path(&img).unwrap();
    let chunk_block = |path: &str| {
        let ino = im.resolve(path.as_bytes()).unwrap();
        (0..ino.rec.count as u64)
            .map(|i| im.chunk(ino.rec.data + i).unwrap().block)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        chunk_block(VICTIM)[0],
        0,
        "{VICTIM} does not start in block 0"
    );
    assert!(!chunk_block(INTACT).contains(&0), "{INTACT} uses block 0");
    Base {
        _t: t,
        dir,
        src,
        img,
        bytes,
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Damage {
    FlipDataBlock0,
    FlipInodePage,
    FlipSectionTable,
    FlipSuperblock,
    TruncateBy1,
    TruncateToHalf,
    TruncateTo100,
    Empty,
    Random1M,
    Directory,
}

impl Damage {
    const ALL: [Damage; 10] = [
        Damage::FlipDataBlock0,
        Damage::FlipInodePage,
        Damage::FlipSectionTable,
        Damage::FlipSuperblock,
        Damage::TruncateBy1,
        Damage::TruncateToHalf,
        Damage::TruncateTo100,
        Damage::Empty,
        Damage::Random1M,
        Damage::Directory,
    ];
    /// Whether opening the image fails (so every command fails at once).
    fn unopenable(self) -> bool {
        !matches!(self, Damage::FlipDataBlock0 | Damage::FlipInodePage)
    }
}

fn flip(bytes: &mut [u8], at: u64) {
    bytes[at as usize] ^= 0x5a;
}

/// Write the damaged image for `d`; returns its path.
fn damage(b: &Base, d: Damage) -> PathBuf {
    let path = b.dir.join(format!("{d:?}.sheaf"));
    let im = sheaf_read::open_path(&b.img).unwrap();
    let mut bytes = b.bytes.clone();
    let len = bytes.len() as u64;
    match d {
        Damage::FlipDataBlock0 => {
            let r = im.block_ref(0).unwrap();
            flip(&mut bytes, r.offset + r.clen as u64 / 2);
        }
        Damage::FlipInodePage => {
            let r = im.page_ref(StreamId::Inodes, 0, 0).unwrap();
            flip(&mut bytes, r.offset + r.clen as u64 / 2);
        }
        Damage::FlipSectionTable => {
            let t = Trailer::decode(&bytes[bytes.len() - TRAILER_LEN..], len).unwrap();
            flip(&mut bytes, t.table_offset + 9);
        }
        Damage::FlipSuperblock => {
            let s = im
                .sections()
                .iter()
                .find(|s| s.kind == SectionKind::Superblock)
                .unwrap();
            flip(&mut bytes, s.offset + s.length / 2);
        }
        Damage::TruncateBy1 => bytes.truncate(bytes.len() - 1),
        Damage::TruncateToHalf => bytes.truncate(bytes.len() / 2),
        Damage::TruncateTo100 => bytes.truncate(100),
        Damage::Empty => bytes.clear(),
        Damage::Random1M => bytes = Rng::new(11).bytes(1 << 20),
        Damage::Directory => {
            fs::create_dir(&path).unwrap();
            return path;
        }
    }
    fs::write(&path, &bytes).unwrap();
    path
}

/// A failure must be exit 1 with one `sheaf: error:` line naming the image.
#[track_caller]
fn assert_clean_failure(o: &Out, img: &Path, ctx: &str) {
    o.no_panic();
    assert_eq!(o.code, 1, "{ctx}: expected exit 1:\n{}", o.describe());
    let l = o.err_lines();
    assert_eq!(
        l.len(),
        1,
        "{ctx}: expected one stderr line:\n{}",
        o.describe()
    );
    assert!(l[0].starts_with("sheaf: error: "), "{ctx}: {}", l[0]);
    assert!(
        l[0].contains(&img.display().to_string()),
        "{ctx}: the error does not name the image: {}",
        l[0]
    );
}

#[test]
fn every_command_fails_cleanly_on_every_kind_of_damage() {
    let b = base();
    let victim = fs::read(b.src.join(VICTIM)).unwrap();
    let intact = fs::read(b.src.join(INTACT)).unwrap();
    let mut failures = Vec::new();
    for d in Damage::ALL {
        let img = damage(&b, d);
        let shown = img.display().to_string();
        let r = std::panic::catch_unwind(|| {
            // check
            let o = sheaf(["check".as_ref(), img.as_os_str()]);
            o.no_panic();
            assert_eq!(o.code, 1, "{d:?}: check:\n{}", o.describe());
            let lines = o.err_lines();
            if d.unopenable() {
                assert_clean_failure(&o, &img, &format!("{d:?}: check"));
            } else {
                let (last, rest) = lines.split_last().expect("check printed nothing");
                assert!(
                    last.starts_with("sheaf: error: ")
                        && last.contains(&shown)
                        && (last.contains("problems found") || last.contains("problem found")),
                    "{d:?}: check summary line: {last}"
                );
                assert!(
                    !rest.is_empty(),
                    "{d:?}: check names no problem:\n{}",
                    o.describe()
                );
                for l in rest {
                    assert!(
                        l.contains(&shown)
                            && (l.contains("block") || l.contains("page") || l.contains("inode")),
                        "{d:?}: check line names neither the image nor a block/page: {l}"
                    );
                }
                if d == Damage::FlipDataBlock0 {
                    assert!(
                        o.stderr.contains("data block 0"),
                        "{d:?}: check does not report data block 0:\n{}",
                        o.describe()
                    );
                    // And what it costs: the files in that block, by path
                    // (the base checks which files use block 0).
                    assert!(
                        o.stderr
                            .contains(&format!("/{VICTIM}: damaged (its data is in a bad block)")),
                        "{d:?}: check does not name {VICTIM}:\n{}",
                        o.describe()
                    );
                    assert!(
                        !o.stderr.contains(INTACT),
                        "{d:?}: {INTACT} named:\n{}",
                        o.describe()
                    );
                }
                if d == Damage::FlipInodePage {
                    assert!(
                        o.stderr.contains("inode table page 0"),
                        "{d:?}: check does not report the inode page:\n{}",
                        o.describe()
                    );
                }
            }
            assert!(
                o.stdout.is_empty() || !String::from_utf8_lossy(&o.stdout).contains("OK"),
                "{d:?}: check said OK"
            );

            // info: needs only the tail, so it works when only a block or page is damaged.
            let o = sheaf(["info".as_ref(), img.as_os_str()]);
            if d.unopenable() {
                assert_clean_failure(&o, &img, &format!("{d:?}: info"));
                if matches!(d, Damage::TruncateBy1 | Damage::TruncateToHalf) {
                    // Said in those words, not as a bad magic number.
                    assert!(
                        o.stderr.contains("truncated or not completely written"),
                        "{d:?}: info:\n{}",
                        o.describe()
                    );
                }
            } else {
                o.no_panic();
                assert_eq!(o.code, 0, "{d:?}: info:\n{}", o.describe());
            }

            // ls -R: works unless metadata is damaged.
            let o = sheaf(["ls".as_ref(), img.as_os_str(), "-R".as_ref()]);
            if d == Damage::FlipDataBlock0 {
                assert_eq!(o.code, 0, "{d:?}: ls -R:\n{}", o.describe());
            } else {
                assert_clean_failure(&o, &img, &format!("{d:?}: ls -R"));
            }

            // find and du walk the same metadata, without a mount.
            for args in [&["find", "-depth", "-ls"][..], &["du", "-a", "--inodes"]] {
                let o = run_cmd(cmd().arg(args[0]).arg(&img).args(&args[1..]));
                if d == Damage::FlipDataBlock0 {
                    assert_eq!(o.code, 0, "{d:?}: {args:?}:\n{}", o.describe());
                } else {
                    assert_clean_failure(&o, &img, &format!("{d:?}: {args:?}"));
                }
            }

            // cat of the file in block 0: nothing, or exactly its content.
            let o = sheaf(["cat".as_ref(), img.as_os_str(), VICTIM.as_ref()]);
            assert_clean_failure(&o, &img, &format!("{d:?}: cat {VICTIM}"));
            assert!(
                o.stdout.is_empty(),
                "{d:?}: cat wrote {} bytes before failing",
                o.stdout.len()
            );
            // cat of a file elsewhere: exact when the image opens and the metadata is intact.
            let o = sheaf(["cat".as_ref(), img.as_os_str(), INTACT.as_ref()]);
            if d == Damage::FlipDataBlock0 {
                assert_eq!(o.code, 0, "{d:?}: cat {INTACT}:\n{}", o.describe());
                assert!(o.stdout == intact, "{d:?}: cat {INTACT} is wrong");
            } else {
                assert_clean_failure(&o, &img, &format!("{d:?}: cat {INTACT}"));
                assert!(
                    o.stdout.is_empty() || o.stdout == intact,
                    "{d:?}: cat {INTACT} wrote wrong bytes"
                );
            }

            // extract
            let out = b.dir.join(format!("{d:?}.out"));
            let o = run_cmd(cmd().arg("extract").arg(&img).arg("-C").arg(&out));
            assert_clean_failure(&o, &img, &format!("{d:?}: extract"));
            // Whatever was written must not be a wrong version of the damaged file.
            if let Ok(got) = fs::read(out.join(VICTIM)) {
                assert!(
                    got.len() < victim.len() || got == victim,
                    "{d:?}: extract wrote a wrong {VICTIM}"
                );
                assert!(
                    got.iter().zip(&victim).all(|(a, b)| a == b),
                    "{d:?}: extract wrote wrong bytes into {VICTIM}"
                );
            }
        });
        if let Err(e) = r {
            let msg = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()));
            failures.push(msg.unwrap_or_else(|| format!("{d:?}: panic")));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} damage kinds mishandled:\n\n{}",
        failures.len(),
        Damage::ALL.len(),
        failures.join("\n\n")
    );
}

#[test]
fn intact_image_checks_ok() {
    let b = base();
    let o = sheaf(["check".as_ref(), b.img.as_os_str()]).ok();
    assert!(o.text().contains("OK"), "{}", o.describe());
    assert!(o.stderr.is_empty(), "{}", o.describe());
}

/// Byte ranges no hash covers by design: the header after the major version
/// (minor version, header length, reserved) and the trailer's reserved word.
fn unhashed(len: usize) -> Vec<std::ops::Range<usize>> {
    vec![10..64, len - TRAILER_LEN + 20..len - TRAILER_LEN + 24]
}

#[test]
fn check_detects_a_flip_in_the_build_info_section() {
    // `info` refuses an image whose build-info section fails its hash, so
    // `check` must not call that image intact.
    let b = base();
    let im = sheaf_read::open_path(&b.img).unwrap();
    let s = im
        .sections()
        .iter()
        .find(|s| s.kind == SectionKind::BuildInfo)
        .expect("build info section");
    let mut bytes = b.bytes.clone();
    flip(&mut bytes, s.offset + s.length / 2);
    let img = b.dir.join("buildinfo.sheaf");
    fs::write(&img, &bytes).unwrap();
    let info = sheaf(["info".as_ref(), img.as_os_str()]);
    info.no_panic();
    let check = sheaf(["check".as_ref(), img.as_os_str()]);
    check.no_panic();
    assert!(
        !(info.code != 0 && check.code == 0),
        "info fails on the image but check says it is intact:\n info: {}\n check: {}",
        info.stderr.trim(),
        check.text().trim()
    );
    assert_eq!(check.code, 1, "check:\n{}", check.describe());
}

#[test]
fn random_flips_are_always_detected_and_never_leak_wrong_bytes() {
    let b = base();
    let im = sheaf_read::open_path(&b.img).unwrap();
    let info = im
        .sections()
        .iter()
        .find(|s| s.kind == SectionKind::BuildInfo)
        .map(|s| s.offset as usize..(s.offset + s.length) as usize);
    drop(im);
    let mut skip = unhashed(b.bytes.len());
    skip.extend(info); // covered by check_detects_a_flip_in_the_build_info_section
    let files: Vec<(&str, Vec<u8>)> = [VICTIM, INTACT, "dir/c.txt"]
        .iter()
        .map(|f| (*f, fs::read(b.src.join(f)).unwrap()))
        .collect();
    let mut r = Rng::new(1234);
    let mut problems = Vec::new();
    let img = b.dir.join("flipped.sheaf");
    let mut tried = 0;
    while tried < 60 {
        // Bias towards the metadata at the end, which is small.
        let len = b.bytes.len();
        let at = if r.below(2) == 0 {
            r.below(len as u64) as usize
        } else {
            len - 1 - r.below(64 << 10).min(len as u64 - 1) as usize
        };
        if skip.iter().any(|s| s.contains(&at)) {
            continue;
        }
        tried += 1;
        let mut bytes = b.bytes.clone();
        bytes[at] ^= 1 << r.below(8);
        fs::write(&img, &bytes).unwrap();
        let o = sheaf(["check".as_ref(), img.as_os_str()]);
        if o.code != 1 || o.stderr.contains("panicked") {
            problems.push(format!(
                "flip at {at}/{len}: check exit {}: {}{}",
                o.code,
                o.stderr.trim(),
                o.text().trim()
            ));
        }
        for (f, want) in &files {
            let o = sheaf(["cat".as_ref(), img.as_os_str(), f.as_ref()]);
            let ok = match o.code {
                0 => o.stdout == *want,
                1 => {
                    o.stdout.len() <= want.len()
                        && o.stdout[..] == want[..o.stdout.len()]
                        && o.err_lines().len() == 1
                }
                _ => false,
            };
            if !ok {
                problems.push(format!(
                    "flip at {at}/{len}: cat {f}: exit {}, {} bytes out: {}",
                    o.code,
                    o.stdout.len(),
                    o.stderr.trim()
                ));
            }
        }
        for args in [
            &["ls", "-lR"][..],
            &["info", "--json"],
            &["find", "-depth", "-ls"],
            &["du", "-a", "--inodes"],
        ] {
            let o = run_cmd(cmd().arg(args[0]).arg(&img).args(&args[1..]));
            if !matches!(o.code, 0 | 1)
                || o.stderr.contains("panicked")
                || (o.code == 1 && o.err_lines().len() != 1)
            {
                problems.push(format!(
                    "flip at {at}/{len}: {args:?}: exit {}: {}",
                    o.code,
                    o.stderr.trim()
                ));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "{} problems:\n  {}",
        problems.len(),
        problems.join("\n  ")
    );
}

/// `extract --keep-going` of an image with a bad data block writes every
/// other file byte for byte, lists the lost one (its whole file, not a
/// half-written one), and exits 1; without it the extraction stops and
/// says how to salvage.
#[test]
fn extract_keep_going_salvages_every_file_that_verifies() {
    let b = base();
    let bad = damage(&b, Damage::FlipDataBlock0);
    let out = b.dir.join("salvage");
    let o = sheaf([
        "extract".as_ref(),
        "--keep-going".as_ref(),
        bad.as_os_str(),
        "-C".as_ref(),
        out.as_os_str(),
    ]);
    o.no_panic();
    assert_eq!(o.code, 1, "{}", o.describe());
    let lines = o.err_lines();
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with(&format!("sheaf: {VICTIM}: lost: "))),
        "{}",
        o.describe()
    );
    assert!(
        lines
            .last()
            .unwrap()
            .starts_with("sheaf: error: 1 entry could not be read"),
        "{}",
        o.describe()
    );
    assert!(!out.join(VICTIM).exists(), "a half-written {VICTIM} stayed");
    for f in [INTACT, "dir/c.txt"] {
        assert_eq!(
            fs::read(out.join(f)).unwrap(),
            fs::read(b.src.join(f)).unwrap(),
            "{f}"
        );
    }
    assert_eq!(fs::read_link(out.join("link")).unwrap(), Path::new("a.bin"));
    // The JSON report lists the same loss.
    let out2 = b.dir.join("salvage2");
    let o = sheaf([
        "extract".as_ref(),
        "-k".as_ref(),
        "--json".as_ref(),
        bad.as_os_str(),
        "-C".as_ref(),
        out2.as_os_str(),
    ]);
    assert_eq!(o.code, 1, "{}", o.describe());
    let j = json(&o);
    let lost = j["lost"].as_array().unwrap();
    assert_eq!(lost.len(), 1, "{j}");
    assert_eq!(lost[0]["path"], VICTIM);
    assert!(lost[0]["error"].as_str().unwrap().contains("data block 0"));
    // Without --keep-going: one line that says how to salvage.
    let o = sheaf([
        "extract".as_ref(),
        bad.as_os_str(),
        "-C".as_ref(),
        b.dir.join("stopped").as_os_str(),
    ]);
    assert_clean_failure(&o, &bad, "extract without -k");
    assert!(o.stderr.contains("--keep-going"), "{}", o.describe());
}
