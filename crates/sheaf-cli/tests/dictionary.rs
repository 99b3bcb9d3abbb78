//! Pack dictionaries (format.md §4 kind 4, §7 codec 4): a directory build
//! trains one on the source's small files; every byte still reads back, the
//! image is smaller than without, files of a pack or more get blocks of
//! their own, `sheaf optimize` carries the dictionary, a damaged dictionary
//! section is refused, and images whose repository objects were written by
//! another image (with another dictionary) still read back over HTTP.

mod common;

use common::servers::Nginx;
use common::*;
use sheaf_format::{Codec, SectionKind};
use std::fs;
use std::path::Path;
use std::sync::Arc;

const PACK: usize = 256 << 10;
const MEDIUM: usize = 300_000;

fn open(img: &Path) -> sheaf_read::Image {
    let src = sheaf_read::FileSource::open(img).unwrap();
    sheaf_read::Image::open(Arc::new(src)).unwrap()
}

/// Source-like small files: lines of identifiers drawn from a vocabulary
/// the whole tree shares, with numbers that differ, as in a code base. What
/// files share is what a dictionary learns.
fn code_file(r: &mut Rng, n: usize) -> Vec<u8> {
    const HEAD: &[&str] = &[
        "static int",
        "struct",
        "return",
        "unsigned long",
        "#define",
        "if (!",
        "case",
        "spin_lock_irqsave(&",
        "dev_err(&pdev->dev, \"",
        "EXPORT_SYMBOL_GPL(",
    ];
    let mut v = Vec::with_capacity(n + 120);
    while v.len() < n {
        let h = HEAD[r.below(HEAD.len() as u64) as usize];
        // Identifiers from a vocabulary of 3000 shared by all files.
        let (a, b) = (r.below(3000), r.below(3000));
        let line = format!(
            "\t{h} {}_{}({}, {});\n",
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

/// A made-up identifier, the same for the same number.
fn word(i: u64) -> String {
    const SYL: &[&str] = &[
        "dev", "irq", "reg", "buf", "ctl", "dma", "clk", "pm", "phy", "io", "map", "tx", "rx",
    ];
    let mut x = i * 2654435761 % 1_000_003;
    let mut w = String::new();
    for _ in 0..3 {
        w.push_str(SYL[(x % SYL.len() as u64) as usize]);
        x /= SYL.len() as u64;
    }
    w
}

/// `count` small files under `dir/sub`, a 300 KB file (more than a pack)
/// and a 4.5 MiB one (a full block and a tail of more than a pack).
fn tree(dir: &Path, sub: &str, count: usize, seed: u64) {
    let mut r = Rng::new(seed);
    for i in 0..count {
        let n = 800 + r.below(5400) as usize;
        put(
            &dir.join(format!("{sub}/d{:02}/f{i:04}.c", i / 50)),
            &code_file(&mut r, n),
        );
    }
    write(&dir.join("medium.bin"), &code_file(&mut r, MEDIUM));
    let mut big = r.bytes(4 << 20);
    big.extend(code_file(&mut r, PACK + 4096));
    write(&dir.join("large.bin"), &big);
}

fn write_dirs(root: &Path) {
    fs::create_dir_all(root).unwrap();
}

/// [`write`], making the parent directories first.
fn put(p: &Path, data: &[u8]) {
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    write(p, data);
}

fn blocks(img: &sheaf_read::Image) -> Vec<sheaf_format::BlockRef> {
    (0..img.superblock().block_count as u32)
        .map(|i| img.block_ref(i).unwrap())
        .collect()
}

#[test]
fn packs_use_the_trained_dictionary_and_every_byte_reads_back() {
    let t = tmpdir();
    let src = t.path().join("src");
    write_dirs(&src);
    // Over 16 MiB of small files: less trains no dictionary.
    tree(&src, "src", 6000, 3);
    let with = t.path().join("dict.sheaf");
    let without = t.path().join("plain.sheaf");
    build(&src, &with, &[]).ok();
    build(&src, &without, &["--no-dict"]).ok();

    let d = open(&with);
    assert_eq!(d.dictionaries().len(), 1, "one trained dictionary");
    let n = open(&without);
    assert!(n.dictionaries().is_empty());
    // Blocks named by their stored bytes make old readers refuse at open.
    use sheaf_format::superblock::REQ_STORED_DIGESTS;
    for img in [&d, &n] {
        assert_eq!(img.superblock().required_features, REQ_STORED_DIGESTS);
    }
    let lz4 = t.path().join("lz4.sheaf");
    build(&src, &lz4, &["-c", "lz4"]).ok();
    assert_eq!(open(&lz4).superblock().required_features, 0);
    let refs = blocks(&d);
    let dict_blocks = refs.iter().filter(|r| r.codec == Codec::ZstdDict).count();
    assert!(
        dict_blocks >= 10,
        "packs use it: {dict_blocks} of {}",
        refs.len()
    );
    // Blocks of large data never do; the 300 KB file and the 256 KiB tail
    // are blocks of their own, of exactly their length.
    for len in [MEDIUM as u32, (PACK + 4096) as u32] {
        let own: Vec<_> = refs.iter().filter(|r| r.ulen == len).collect();
        assert_eq!(own.len(), 1, "a block of {len} bytes");
        assert_ne!(own[0].codec, Codec::ZstdDict);
    }
    assert!(
        refs.iter()
            .all(|r| r.ulen as usize <= PACK || r.codec != Codec::ZstdDict),
        "only packs use the dictionary"
    );
    sheaf(["check".as_ref(), with.as_os_str()]).ok();
    for img in [&with, &without] {
        let out = t
            .path()
            .join(format!("x-{}", img.file_stem().unwrap().to_string_lossy()));
        extract(img, &out).ok();
        assert_same_tree(&src, &out, Cmp::all());
    }

    // The same source and options give the same bytes (the dictionary is
    // trained deterministically), whatever the thread count.
    let again = t.path().join("again.sheaf");
    build(&src, &again, &["-j", "1"]).ok();
    assert_eq!(fs::read(&again).unwrap(), fs::read(&with).unwrap());
}

/// A tar stream cannot be sampled ahead: its first 32 MiB of small files are
/// held back, a dictionary is trained on them, then they and the rest are
/// packed. Every byte, hardlink and attribute reads back; the image is the
/// same whether the archive is a file or standard input.
#[test]
fn a_tar_stream_gets_a_dictionary_from_its_first_small_files() {
    let t = tmpdir();
    let src = t.path().join("src");
    write_dirs(&src);
    // About 35 MiB of small files: more than are held back, so the hold
    // ends in the middle of the stream.
    tree(&src, "src", 10_000, 11);
    fs::hard_link(src.join("src/d00/f0007.c"), src.join("hard.c")).unwrap();
    let tar = t.path().join("src.tar");
    // PAX keeps nanosecond times.
    let st = std::process::Command::new("tar")
        .arg("--format=pax")
        .arg("-cf")
        .arg(&tar)
        .arg("-C")
        .arg(&src)
        .arg(".")
        .status()
        .expect("tar runs");
    assert!(st.success());
    let with = t.path().join("tar.sheaf");
    let without = t.path().join("tar-plain.sheaf");
    build(&tar, &with, &[]).ok();
    build(&tar, &without, &["--no-dict"]).ok();
    let d = open(&with);
    assert_eq!(d.dictionaries().len(), 1, "one trained dictionary");
    assert!(open(&without).dictionaries().is_empty());
    let refs = blocks(&d);
    let dict_blocks = refs.iter().filter(|r| r.codec == Codec::ZstdDict).count();
    assert!(dict_blocks >= 100, "packs use it: {dict_blocks}");
    // No two of these files are versions of one another, so no pack grows
    // past the pack size: held files keep their own similarity group.
    let largest = refs
        .iter()
        .filter(|r| r.codec == Codec::ZstdDict)
        .map(|r| r.ulen)
        .max();
    assert_eq!(largest, Some(256 << 10), "packs of the default size");
    sheaf(["check".as_ref(), with.as_os_str()]).ok();
    let out = t.path().join("x");
    extract(&with, &out).ok();
    assert_same_tree(&src, &out, Cmp::all());
    let ino = |p: &Path| std::os::unix::fs::MetadataExt::ino(&fs::metadata(p).unwrap());
    assert_eq!(ino(&out.join("hard.c")), ino(&out.join("src/d00/f0007.c")));

    let piped = t.path().join("stdin.sheaf");
    let mut c = cmd();
    c.arg("build").arg("-").arg("-o").arg(&piped);
    c.stdin(fs::File::open(&tar).unwrap());
    run_cmd(&mut c).ok();
    assert_eq!(fs::read(&piped).unwrap(), fs::read(&with).unwrap());
}

/// What a dictionary is for: on real source code (tree K's `fs/`, 46 MB of
/// mostly small C files) the image with one is smaller than without, the
/// dictionary's own bytes included. (Synthetic files are too alike within
/// one pack for a dictionary to add anything; `bench/default-image.sh`
/// measures whole trees.)
#[test]
fn on_real_source_code_the_dictionary_pays_for_itself() {
    let Some(k) = real_tree("K") else {
        return; // the check tier; elsewhere real_tree fails the test
    };
    let t = tmpdir();
    let src = k.join("fs");
    let (with, without) = (t.path().join("d.sheaf"), t.path().join("n.sheaf"));
    build(&src, &with, &[]).ok();
    build(&src, &without, &["--no-dict"]).ok();
    assert_eq!(open(&with).dictionaries().len(), 1);
    let (sd, sn) = (
        fs::metadata(&with).unwrap().len(),
        fs::metadata(&without).unwrap().len(),
    );
    assert!(
        (sd as f64) < 0.99 * sn as f64,
        "with a dictionary {sd} bytes, without {sn}: less than 1% saved"
    );
    let out = t.path().join("x");
    extract(&with, &out).ok();
    assert_same_tree(&src, &out, Cmp::all());
}

#[test]
fn optimize_and_base_carry_the_dictionary_and_a_damaged_one_is_refused() {
    let t = tmpdir();
    let src = t.path().join("src");
    write_dirs(&src);
    tree(&src, "src", 6000, 5);
    let img = t.path().join("a.sheaf");
    build(&src, &img, &[]).ok();
    assert_eq!(open(&img).dictionaries().len(), 1);

    let list = t.path().join("list");
    fs::write(&list, "src/d03/f0170.c\nmedium.bin\n").unwrap();
    let opt = t.path().join("opt.sheaf");
    sheaf_in([
        "optimize".as_ref(),
        img.as_os_str(),
        "--prefetch".as_ref(),
        list.as_os_str(),
        "-o".as_ref(),
        opt.as_os_str(),
    ])
    .ok();
    let o = open(&opt);
    assert_eq!(o.dictionaries().len(), 1);
    assert_eq!(
        o.dictionaries()[0].digest(),
        open(&img).dictionaries()[0].digest()
    );
    let out = t.path().join("x");
    extract(&opt, &out).ok();
    assert_same_tree(&src, &out, Cmp::all());

    // An incremental build keeps PREV's dictionary: its copied packs name
    // it, and the packs it makes anew use it too.
    let mut r = Rng::new(77);
    let n = 3000;
    put(&src.join("src/d07/f0360.c"), &code_file(&mut r, n));
    put(&src.join("src/new/added.c"), &code_file(&mut r, n));
    let next = t.path().join("next.sheaf");
    build(&src, &next, &["--base", img.to_str().unwrap()]).ok();
    let nx = open(&next);
    assert_eq!(nx.dictionaries().len(), 1);
    assert_eq!(
        nx.dictionaries()[0].digest(),
        open(&img).dictionaries()[0].digest()
    );
    let out = t.path().join("x2");
    extract(&next, &out).ok();
    assert_same_tree(&src, &out, Cmp::all());

    // One byte of the dictionary section changed: the image is refused
    // at open, naming the section, before any block is decoded.
    let s = open(&img)
        .sections()
        .iter()
        .find(|s| s.kind == SectionKind::Dictionaries)
        .copied()
        .expect("a dictionary section");
    assert_ne!(
        s.flags & sheaf_format::SECTION_FLAG_REQUIRED,
        0,
        "written required"
    );
    let mut bytes = fs::read(&img).unwrap();
    bytes[(s.offset + s.length / 2) as usize] ^= 0x40;
    let bad = t.path().join("bad.sheaf");
    fs::write(&bad, &bytes).unwrap();
    let o = sheaf(["check".as_ref(), bad.as_os_str()]).fails_with(1);
    let line = o.one_err_line().to_string();
    assert!(line.contains("dictionary section"), "{line}");
    let o = sheaf([
        "extract".as_ref(),
        bad.as_os_str(),
        t.path().join("y").as_os_str(),
    ]);
    o.no_panic();
    assert!(!t.path().join("y/medium.bin").exists());
}

/// Two images of one repository with different dictionaries: B holds A's
/// small files too, but a dictionary block's digest names its stored bytes
/// (the dictionary's digest among them), so B's packs never resolve to
/// objects A wrote with A's dictionary; every object B needs decodes with
/// the dictionary B carries, over HTTP with an empty node cache and again
/// from the cache that read filled.
#[test]
fn images_with_different_dictionaries_share_a_repository() {
    if !prerequisite(!check_tier(), "nginx") {
        return;
    }
    let t = tmpdir();
    let ng = Nginx::start(t.path());
    let a_src = t.path().join("a");
    let b_src = t.path().join("b");
    write_dirs(&a_src);
    tree(&a_src, "src", 6000, 8);
    // B: A plus files that sort after it, so A's packs recur in B, and
    // B's dictionary (trained on its own small files) is another one.
    copy_tree(&a_src, &b_src);
    let mut r = Rng::new(99);
    for i in 0..2000 {
        let n = 500 + r.below(3000) as usize;
        put(&b_src.join(format!("zz/g{i:03}.txt")), &r.text(n));
    }
    let repo = ng.www.join("repo");
    let mut digests = Vec::new();
    for (name, src) in [("a", &a_src), ("b", &b_src)] {
        let img = t.path().join(format!("{name}.sheaf"));
        build(src, &img, &[]).ok();
        digests.push(*open(&img).dictionaries()[0].digest());
        sheaf_in([
            "publish".as_ref(),
            img.as_os_str(),
            repo.as_os_str(),
            "--name".as_ref(),
            name.as_ref(),
        ])
        .ok();
    }
    assert_ne!(digests[0], digests[1], "two dictionaries");
    let b = open(&t.path().join("b.sheaf"));
    let dict_blocks: Vec<_> = blocks(&b)
        .into_iter()
        .filter(|r| r.codec == Codec::ZstdDict)
        .collect();
    assert!(!dict_blocks.is_empty());
    for r in &dict_blocks {
        let obj = fs::read(repo.join(sheaf_format::remote::object_path(&r.hash))).unwrap();
        assert_eq!(obj[0], Codec::ZstdDict as u8);
        assert_eq!(obj[1..33], digests[1], "a B object names B's dictionary");
        assert_eq!(
            sheaf_format::digest(&obj[1..]),
            r.hash,
            "named by its stored bytes"
        );
    }

    for cache in ["c1", "c1"] {
        // The second pass reads B's objects from the node cache the first
        // filled, A's dictionary included.
        let out = t.path().join(format!("out-{}", rand_suffix()));
        sheaf([
            format!("--cache-dir={}", t.path().join(cache).display()),
            "extract".into(),
            ng.url("repo/b"),
            "-C".into(),
            out.display().to_string(),
        ])
        .ok();
        assert_same_tree(&b_src, &out, Cmp::all());
    }
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

fn copy_tree(from: &Path, to: &Path) {
    let st = std::process::Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(st.success());
}
