//! Reference blocks (format.md §7.2): a block compressed against a
//! resembling earlier block, so a new version of a large file costs about
//! what changed.
//!
//! The data is incompressible (BLAKE3 output): what a version costs alone
//! is its byte count, known without the code under test. Each version
//! changes one byte in every block of the first, so no block is identical
//! to another (block dedup finds nothing) and each resembles one block of
//! the first version closely.

use sheaf_build::{build, BuildError, BuildOptions, BuildReport, Input, Progress};
use sheaf_format::{Codec, SectionEntry, SectionKind, Trailer, TRAILER_LEN};
use sheaf_read::{Image, MemSource};
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

const BLOCK: usize = 64 << 10;
/// Ten blocks and a tail.
const LEN: usize = 10 * BLOCK + 1000;

fn noise(seed: &str, len: usize) -> Vec<u8> {
    let mut b = vec![0; len];
    blake3::Hasher::new()
        .update(seed.as_bytes())
        .finalize_xof()
        .fill(&mut b);
    b
}

/// Version `v` of the library: the first with one byte of every block
/// changed (v = 0: the first itself).
fn version(v: usize) -> Vec<u8> {
    let mut b = noise("lib", LEN);
    if v > 0 {
        for at in (0..LEN).step_by(BLOCK) {
            b[at + v * 7] ^= 0xff;
        }
    }
    b
}

const VERSIONS: [&str; 3] = ["1.0.1", "1.1.0", "1.2.3"];

fn lib_path(ver: &str) -> String {
    format!("lib/{ver}/libx.so")
}

fn make_tree(root: &Path, versions: std::ops::Range<usize>) {
    for v in versions {
        let d = root.join(format!("lib/{}", VERSIONS[v]));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("libx.so"), version(v)).unwrap();
    }
}

fn opts() -> BuildOptions {
    BuildOptions {
        block_size: BLOCK as u32,
        pack_size: 16 << 10,
        force: true,
        ..Default::default()
    }
}

/// Build `src` into `out` with `opts`.
fn try_build(src: &Path, out: &Path, opts: BuildOptions) -> Result<BuildReport, BuildError> {
    build(
        &Input::Dir(src.to_path_buf()),
        out,
        &opts,
        Arc::new(Progress::default()),
        &AtomicBool::new(false),
    )
}

fn build_image(src: &Path, out: &Path, opts: BuildOptions) -> Image {
    try_build(src, out, opts).unwrap();
    sheaf_read::open_path(out).unwrap()
}

/// Build `src` into `out` on the base image `prev`: the image, and the
/// bytes it stores that were not copied from `prev`.
fn build_on(src: &Path, prev: &Path, out: &Path) -> Result<(Image, u64), BuildError> {
    let opts = BuildOptions {
        base: Some(prev.to_path_buf()),
        ..opts()
    };
    let copied = try_build(src, out, opts)?.base.unwrap().copied_stored_bytes;
    let img = sheaf_read::open_path(out).unwrap();
    let new = img.superblock().stored_data_bytes - copied;
    Ok((img, new))
}

fn read_all(img: &Image, path: &str) -> Result<Vec<u8>, sheaf_read::ReadError> {
    let ino = img.resolve(path.as_bytes())?;
    let mut b = vec![0; ino.rec.size as usize];
    let mut at = 0;
    while at < b.len() {
        let n = img.read(&ino, at as u64, &mut b[at..])?;
        assert!(n > 0);
        at += n;
    }
    Ok(b)
}

fn ref_blocks(img: &Image) -> usize {
    (0..img.superblock().block_count as u32)
        .filter(|&id| img.block_ref(id).unwrap().codec == Codec::ZstdRef)
        .count()
}

#[test]
fn versions_of_a_large_file_cost_about_one_version() {
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    make_tree(&src, 0..3);
    let img = build_image(&src, &d.path().join("r.sheaf"), opts());
    let stored = img.superblock().stored_data_bytes;
    assert!(
        stored <= LEN as u64 * 115 / 100,
        "{stored} stored for {LEN} bytes a version"
    );
    // Both later versions' ten full blocks are reference blocks (the tail
    // is packed); each names a block of the first version.
    assert_eq!(ref_blocks(&img), 20);
    assert_eq!(img.ref_bases().len(), 10);
    for (v, ver) in VERSIONS.iter().enumerate() {
        assert_eq!(read_all(&img, &lib_path(ver)).unwrap(), version(v), "{ver}");
    }
    // Part of a reference block, read first, decodes from its base too.
    let fresh = sheaf_read::open_path(&d.path().join("r.sheaf")).unwrap();
    let ino = fresh.resolve(lib_path(VERSIONS[2]).as_bytes()).unwrap();
    let mut b = vec![0; 100];
    fresh.read(&ino, 5 * BLOCK as u64 + 3, &mut b).unwrap();
    assert_eq!(b, version(2)[5 * BLOCK + 3..5 * BLOCK + 103]);

    // Turned off, every version costs its bytes.
    let off = build_image(
        &src,
        &d.path().join("o.sheaf"),
        BuildOptions {
            ref_window: 0,
            ..opts()
        },
    );
    assert!(off.superblock().stored_data_bytes >= 3 * LEN as u64 - 3000);
    assert_eq!(ref_blocks(&off), 0);
    assert!(off.ref_bases().is_empty());
}

#[test]
fn a_version_whose_content_moved_is_cut_where_it_lines_up() {
    // The second version has 5,000 new bytes 3.5 blocks in: every block
    // after them holds the end of one block of the first and the start of
    // the next. Cut at fixed offsets, each of those six blocks would find
    // only one of the two in its base and store the other's 5,000 bytes
    // again (about 30 KB); cut where the content lines up, the version
    // costs about what it adds.
    const NEW: usize = 5000;
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    let v1 = version(0);
    let at = 3 * BLOCK + BLOCK / 2;
    let mut v2 = v1[..at].to_vec();
    v2.extend_from_slice(&noise("inserted", NEW));
    v2.extend_from_slice(&v1[at..]);
    for (ver, data) in [("1.0.1", &v1), ("1.1.0", &v2)] {
        let dir = src.join(format!("lib/{ver}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("libx.so"), data).unwrap();
    }
    let img = build_image(&src, &d.path().join("m.sheaf"), opts());
    let stored = img.superblock().stored_data_bytes as usize;
    let extra = stored.saturating_sub(LEN);
    assert!(
        extra <= NEW + 8000,
        "{extra} bytes stored for a version that adds {NEW}"
    );
    assert_eq!(read_all(&img, &lib_path("1.1.0")).unwrap(), v2);
    assert_eq!(read_all(&img, &lib_path("1.0.1")).unwrap(), v1);
}

#[test]
fn reference_blocks_are_reproducible_whatever_the_threads() {
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    make_tree(&src, 0..3);
    let image = |threads: usize, name: &str| {
        let out = d.path().join(name);
        build_image(&src, &out, BuildOptions { threads, ..opts() });
        std::fs::read(out).unwrap()
    };
    assert_eq!(image(1, "a.sheaf"), image(3, "b.sheaf"));
}

#[test]
fn a_build_on_a_base_copies_reference_blocks_with_their_bases() {
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    make_tree(&src, 0..2);
    let prev = d.path().join("prev.sheaf");
    build_image(&src, &prev, opts());
    // The first version leaves: its blocks are the second's bases, so
    // copying the second's reference blocks must bring them along.
    std::fs::remove_dir_all(src.join("lib").join(VERSIONS[0])).unwrap();
    make_tree(&src, 2..3);
    let (img, _) = build_on(&src, &prev, &d.path().join("next.sheaf")).unwrap();
    assert!(ref_blocks(&img) >= 10, "{}", ref_blocks(&img));
    for (v, ver) in VERSIONS.iter().enumerate().skip(1) {
        assert_eq!(read_all(&img, &lib_path(ver)).unwrap(), version(v), "{ver}");
    }
    assert!(img.resolve(lib_path(VERSIONS[0]).as_bytes()).is_err());
    let progress = std::sync::atomic::AtomicU64::new(0);
    let rep = sheaf_read::verify::verify(&img, &progress);
    assert!(rep.errors.is_empty(), "{:?}", rep.errors);
    assert_eq!(rep.blocks, img.superblock().block_count);
}

/// `bytes` with the section of `kind` replaced by `new` (or dropped), the
/// table and trailer sealed again: what a hostile author can make.
fn replace_section(bytes: &[u8], kind: SectionKind, new: Option<Vec<u8>>) -> Vec<u8> {
    let t = Trailer::decode(&bytes[bytes.len() - TRAILER_LEN..], bytes.len() as u64).unwrap();
    let table = &bytes[t.table_offset as usize..bytes.len() - TRAILER_LEN];
    let secs = SectionEntry::decode_table(table, t.table_offset).unwrap();
    let mut out = bytes[..t.table_offset as usize].to_vec();
    let mut kept = Vec::new();
    for mut s in secs {
        if s.kind == kind {
            let Some(b) = &new else { continue };
            s.offset = out.len() as u64;
            s.length = b.len() as u64;
            s.hash = sheaf_format::digest(b);
            out.extend_from_slice(b);
        }
        kept.push(s);
    }
    let table: Vec<u8> = kept.iter().flat_map(|s| s.encode()).collect();
    let table_offset = out.len() as u64;
    out.extend_from_slice(&table);
    let tr = Trailer {
        table_offset,
        section_count: kept.len() as u32,
        root_digest: sheaf_format::digest(&table),
    };
    out.extend_from_slice(&tr.encode());
    out
}

#[test]
fn a_hostile_base_list_gives_an_error_never_wrong_bytes() {
    use sheaf_format::reference::{encode_section, Base};
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    make_tree(&src, 0..2);
    let path = d.path().join("r.sheaf");
    let img = build_image(&src, &path, opts());
    let bytes = std::fs::read(&path).unwrap();
    let bases = img.ref_bases().to_vec();
    assert_eq!(bases.len(), 10);
    let a_ref = (0..img.superblock().block_count as u32)
        .find(|&id| img.block_ref(id).unwrap().codec == Codec::ZstdRef)
        .unwrap();
    let open = |b: Vec<u8>| Image::open(Arc::new(MemSource::new(b, "hostile.sheaf")));
    let later = lib_path(VERSIONS[1]);
    // Each base's digest moved to the next base's block: every reference
    // block finds a real block of the image, with other content.
    let mut shifted: Vec<Base> = bases.clone();
    for i in 0..shifted.len() {
        shifted[i].digest = bases[(i + 1) % bases.len()].digest;
    }
    // A base that is a reference block itself; no base list at all.
    let mut chained = bases.clone();
    chained[0].id = a_ref;
    chained.sort_by_key(|b| b.id);
    for (what, section) in [
        ("shifted", Some(encode_section(&shifted))),
        ("chained", Some(encode_section(&chained))),
        ("dropped", None),
    ] {
        let hostile = open(replace_section(&bytes, SectionKind::RefBases, section)).unwrap();
        let e = read_all(&hostile, &later).expect_err(what).to_string();
        assert!(
            e.contains("hostile.sheaf") && e.contains("base"),
            "{what}: {e}"
        );
        // The first version, which names no base, still reads.
        assert_eq!(
            read_all(&hostile, &lib_path(VERSIONS[0])).unwrap(),
            version(0)
        );
    }
    // A list that names a block past the end is refused at open.
    let mut past = bases.clone();
    past.last_mut().unwrap().id = img.superblock().block_count as u32;
    let e = open(replace_section(
        &bytes,
        SectionKind::RefBases,
        Some(encode_section(&past)),
    ))
    .unwrap_err()
    .to_string();
    assert!(e.contains("reference-base section"), "{e}");
}

#[test]
fn a_new_version_on_a_base_is_compressed_against_the_copied_one() {
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    make_tree(&src, 0..1);
    let prev = d.path().join("prev.sheaf");
    build_image(&src, &prev, opts());
    make_tree(&src, 1..2);
    let (img, new) = build_on(&src, &prev, &d.path().join("next.sheaf")).unwrap();
    // The new version's ten blocks name the copied ones: a few hundred
    // bytes each, where alone each would cost its 64 KiB.
    assert_eq!(ref_blocks(&img), 10);
    assert!(new <= LEN as u64 / 20, "{new} new bytes for {LEN}");
    for (v, ver) in VERSIONS.iter().enumerate().take(2) {
        assert_eq!(read_all(&img, &lib_path(ver)).unwrap(), version(v), "{ver}");
    }
}

/// Small file `i` of version `v` (0 or 1): 2,000 incompressible bytes,
/// version 1 with one byte changed.
fn small(i: usize, v: usize) -> Vec<u8> {
    let mut b = noise(&format!("small{i}"), 2000);
    b[i % 2000] ^= v as u8;
    b
}

/// Version `v` of 200 small files under `src/pkg/1.v`.
fn write_small(src: &Path, v: usize) {
    let dir = src.join(format!("pkg/{}", ["1.0", "1.1"][v]));
    std::fs::create_dir_all(&dir).unwrap();
    for i in 0..200 {
        std::fs::write(dir.join(format!("f{i:03}.txt")), small(i, v)).unwrap();
    }
}

#[test]
fn new_versions_of_small_files_on_a_base_are_compressed_against_their_pack() {
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    write_small(&src, 0);
    let prev = d.path().join("prev.sheaf");
    build_image(&src, &prev, opts());
    write_small(&src, 1);
    let (img, new) = build_on(&src, &prev, &d.path().join("next.sheaf")).unwrap();
    // 400,000 new bytes that do not compress alone; each new pack names the
    // copied pack holding the first versions of its files, and costs what
    // changed: a byte per file and the frames.
    assert!(
        ref_blocks(&img) >= 20,
        "{} reference blocks",
        ref_blocks(&img)
    );
    assert!(new <= 400_000 / 10, "{new} new bytes for 400,000");
    for i in 0..200 {
        for (v, ver) in ["1.0", "1.1"].iter().enumerate() {
            let got = read_all(&img, &format!("pkg/{ver}/f{i:03}.txt")).unwrap();
            assert_eq!(got, small(i, v), "{ver} {i}");
        }
    }
}

/// A pack of the base image that a new pack would be compressed against
/// is damaged: the build refuses the base image, naming it, and writes no
/// image; it never compresses against or copies bytes that fail their ref.
#[test]
fn a_damaged_pack_of_a_base_image_is_refused_by_the_build() {
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    write_small(&src, 0);
    let prev = d.path().join("prev.sheaf");
    let img = build_image(&src, &prev, opts());
    let r = img.block_ref(0).unwrap();
    drop(img);
    let mut bytes = std::fs::read(&prev).unwrap();
    bytes[r.offset as usize + r.clen as usize / 2] ^= 0x20;
    std::fs::write(&prev, &bytes).unwrap();
    write_small(&src, 1);
    let out = d.path().join("next.sheaf");
    let Err(e) = build_on(&src, &prev, &out) else {
        panic!("built on a damaged base image");
    };
    let e = e.to_string();
    assert!(
        e.contains("prev.sheaf") && e.contains("data block 0"),
        "{e}"
    );
    assert!(!out.exists(), "no image is left");
}

#[test]
fn a_base_image_with_a_hostile_base_list_is_refused_by_the_build() {
    use sheaf_format::reference::encode_section;
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    make_tree(&src, 0..2);
    let path = d.path().join("prev.sheaf");
    let img = build_image(&src, &path, opts());
    let bytes = std::fs::read(&path).unwrap();
    let a_ref = (0..img.superblock().block_count as u32)
        .find(|&id| img.block_ref(id).unwrap().codec == Codec::ZstdRef)
        .unwrap();
    // A base that is a reference block itself; no base list at all.
    let mut chained = img.ref_bases().to_vec();
    chained[0].id = a_ref;
    chained.sort_by_key(|b| b.id);
    for (what, section) in [
        ("chained", Some(encode_section(&chained))),
        ("dropped", None),
    ] {
        let prev = d.path().join(format!("{what}.sheaf"));
        std::fs::write(
            &prev,
            replace_section(&bytes, SectionKind::RefBases, section),
        )
        .unwrap();
        let out = d.path().join("next.sheaf");
        let e = try_build(
            &src,
            &out,
            BuildOptions {
                base: Some(prev),
                ..opts()
            },
        )
        .expect_err(what)
        .to_string();
        let why = match what {
            "chained" => "is a reference block itself",
            _ => "not in the image's base list",
        };
        assert!(e.contains("base image") && e.contains(why), "{what}: {e}");
        assert!(!out.exists(), "{what}: no image is left");
    }
}

/// Text that compresses, and compresses better at higher zstd levels.
fn prose(seed: &str, len: usize) -> Vec<u8> {
    const WORDS: [&str; 8] = [
        "alpha ", "beta ", "gamma ", "delta ", "epsilon ", "zeta ", "eta ", "theta\n",
    ];
    noise(seed, len)
        .iter()
        .flat_map(|b| WORDS[(b & 7) as usize].bytes())
        .take(len)
        .collect()
}

/// The ref of the one data block holding `path`'s bytes.
fn block_of(img: &Image, path: &str) -> (u32, sheaf_format::BlockRef) {
    let ino = img.resolve(path.as_bytes()).unwrap();
    let mut used = Vec::new();
    let mut b = vec![0; ino.rec.size as usize];
    img.read_with(&ino, 0, &mut b, &mut |id, _| used.push(id))
        .unwrap();
    used.dedup();
    assert_eq!(used.len(), 1, "{path} is in one block");
    (used[0], img.block_ref(used[0]).unwrap())
}

/// A block that a later block is compressed against (a base: the first
/// version of a file) is compressed BASE_LEVEL_STEP levels higher, and a
/// pack holding versions of a file VERSIONS_PACK_LEVEL_STEP higher; a block
/// no later block names, and a pack of unrelated files, at the level asked
/// for. The expected stored lengths come from zstd at those levels over
/// the blocks' own bytes.
#[test]
fn bases_and_packs_of_versions_are_compressed_harder() {
    use sheaf_build::options::{BASE_LEVEL_STEP, VERSIONS_PACK_LEVEL_STEP};
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    let first = prose("lib", BLOCK);
    let mut second = first.clone();
    second[100..108].copy_from_slice(b"CHANGED!");
    let lone = prose("lone", BLOCK);
    let small = |v: &str| [prose("py", 5000), format!("version = '{v}'\n").into_bytes()].concat();
    for (ver, lib) in [("1.0.1", &first), ("1.1.0", &second)] {
        let dir = src.join(format!("lib/{ver}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("libx.so"), lib).unwrap();
        std::fs::write(dir.join("version.py"), small(ver)).unwrap();
    }
    std::fs::create_dir_all(src.join("other")).unwrap();
    std::fs::write(src.join("other/lone.dat"), &lone).unwrap();
    let img = build_image(&src, &d.path().join("h.sheaf"), opts());
    let level = Codec::Zstd.default_level();
    let len_at = |l: i32, b: &[u8]| Codec::Zstd.compress(l, b).len();

    let (_, base) = block_of(&img, "lib/1.0.1/libx.so");
    assert_eq!(base.codec, Codec::ZstdStored);
    assert_ne!(
        len_at(level, &first),
        len_at(level + BASE_LEVEL_STEP, &first)
    );
    assert_eq!(
        base.clen as usize,
        len_at(level + BASE_LEVEL_STEP, &first),
        "the base"
    );
    assert_eq!(
        block_of(&img, "lib/1.1.0/libx.so").1.codec,
        Codec::ZstdRef,
        "the second version names the first"
    );
    let (_, alone) = block_of(&img, "other/lone.dat");
    assert_eq!(alone.codec, Codec::ZstdStored);
    assert_eq!(alone.clen as usize, len_at(level, &lone), "a lone block");

    let (id, pack) = block_of(&img, "lib/1.0.1/version.py");
    assert_eq!(block_of(&img, "lib/1.1.0/version.py").0, id, "one pack");
    let bytes = img.block(id).unwrap();
    let raised = level + VERSIONS_PACK_LEVEL_STEP;
    assert_ne!(len_at(level, &bytes), len_at(raised, &bytes));
    assert_eq!(
        pack.clen as usize,
        len_at(raised, &bytes),
        "a pack of versions"
    );
    // Unrelated small files alone: their pack as asked.
    let plain = d.path().join("plain");
    std::fs::create_dir_all(&plain).unwrap();
    std::fs::write(plain.join("a.txt"), prose("a", 3000)).unwrap();
    std::fs::write(plain.join("b.txt"), prose("b", 3000)).unwrap();
    let other = build_image(&plain, &d.path().join("p.sheaf"), opts());
    let (id, pack) = block_of(&other, "a.txt");
    assert_eq!(block_of(&other, "b.txt").0, id, "one pack");
    let bytes = other.block(id).unwrap();
    assert_eq!(
        pack.clen as usize,
        len_at(level, &bytes),
        "a pack without versions"
    );
    for (p, want) in [
        ("lib/1.0.1/libx.so", first.clone()),
        ("lib/1.1.0/libx.so", second.clone()),
        ("other/lone.dat", lone.clone()),
    ] {
        assert_eq!(read_all(&img, p).unwrap(), want, "{p}");
    }
}
