//! Reader tests against real images built in-process: bounded open, lookup,
//! reads, refusal of unknown features, and mutation (stable fuzz) runs.

use sheaf_build::{build, BuildOptions, Input, Progress};
use sheaf_format::{
    SectionEntry, SectionKind, Superblock, Trailer, SECTION_FLAG_REQUIRED, TRAILER_LEN,
};
use sheaf_read::{fuzzing, Image, MemSource, Order, Piece, ReadError, Source, Step};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

fn build_tree(dir: &Path, files: usize, opts: &BuildOptions) -> Vec<u8> {
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("sub/deeper")).unwrap();
    for i in 0..files {
        let sub = if i % 3 == 0 { "sub" } else { "sub/deeper" };
        std::fs::write(
            src.join(format!("{sub}/f{i:06}.txt")),
            format!("file {i}\n").repeat(i % 50),
        )
        .unwrap();
    }
    std::os::unix::fs::symlink("sub/f000000.txt", src.join("link")).unwrap();
    let out = dir.join(format!("img-{files}.sheaf"));
    build(
        &Input::Dir(src.clone()),
        &out,
        &BuildOptions {
            force: true,
            ..opts.clone()
        },
        Arc::new(Progress::default()),
        &AtomicBool::new(false),
    )
    .unwrap();
    std::fs::remove_dir_all(&src).unwrap();
    std::fs::read(out).unwrap()
}

fn small_opts() -> BuildOptions {
    BuildOptions {
        block_size: 4096,
        pack_size: 0,
        page_size: 4096,
        ..Default::default()
    }
}

/// Counts read calls, to prove open cost does not grow with the image.
struct Counting(MemSource, AtomicUsize);

impl Source for Counting {
    fn len(&self) -> u64 {
        self.0.len()
    }
    fn read_exact_at(&self, buf: &mut [u8], off: u64) -> std::io::Result<()> {
        self.1.fetch_add(1, Ordering::SeqCst);
        self.0.read_exact_at(buf, off)
    }
    fn name(&self) -> &str {
        self.0.name()
    }
}

#[test]
fn open_reads_a_bounded_number_of_ranges_whatever_the_size() {
    let d = tempfile::tempdir().unwrap();
    for files in [10, 20_000] {
        let bytes = build_tree(d.path(), files, &small_opts());
        let src = Arc::new(Counting(MemSource::new(bytes, "x"), AtomicUsize::new(0)));
        let img = Image::open(src.clone()).unwrap();
        assert!(
            src.1.load(Ordering::SeqCst) <= 3,
            "{files} files: {} reads",
            src.1.load(Ordering::SeqCst)
        );
        // One stat touches one page per level, not the whole table.
        let before = src.1.load(Ordering::SeqCst);
        img.inode(img.superblock().inode_count as u32 - 1).unwrap();
        let used = src.1.load(Ordering::SeqCst) - before;
        assert!(
            used <= img.stream_levels(sheaf_format::StreamId::Inodes),
            "stat used {used} reads"
        );
    }
}

/// Paths and depths in the order a walk visits them.
fn walked(img: &Image, order: Order) -> Vec<(String, usize)> {
    let mut v = Vec::new();
    img.walk_in(order, img.root().unwrap(), b"/".to_vec(), &mut |p, _, d| {
        v.push((String::from_utf8_lossy(p).into_owned(), d));
        Ok(Step::Continue)
    })
    .unwrap();
    v
}

#[test]
fn a_post_order_walk_visits_each_directory_after_its_entries() {
    let d = tempfile::tempdir().unwrap();
    let bytes = build_tree(d.path(), 20, &small_opts());
    let img = Image::open(Arc::new(MemSource::new(bytes, "x"))).unwrap();
    let pre = walked(&img, Order::Pre);
    let post = walked(&img, Order::Post(usize::MAX));
    // The tree as built: root, link, sub, 7 files in sub, sub/deeper and 13
    // files in it.
    assert_eq!(pre.len(), 1 + 1 + 1 + 7 + 1 + 13);
    assert_eq!(pre[0], ("/".to_string(), 0));
    let (mut a, mut b) = (pre.clone(), post.clone());
    a.sort();
    b.sort();
    assert_eq!(a, b, "the same entries");
    let at = |p: &str| post.iter().position(|(q, _)| q == p).unwrap();
    assert_eq!(at("/"), post.len() - 1);
    assert!(at("/sub/deeper") > at("/sub/deeper/f000001.txt"));
    assert!(at("/sub") > at("/sub/deeper"));
    assert!(at("/sub") > at("/sub/f000000.txt"));
    // Down to depth 1: the root's entries, then the root; `sub` is not
    // entered.
    let shallow = walked(&img, Order::Post(1));
    assert_eq!(
        shallow,
        vec![
            ("/link".to_string(), 1),
            ("/sub".to_string(), 1),
            ("/".to_string(), 0)
        ]
    );
    assert_eq!(walked(&img, Order::Post(0)), vec![("/".to_string(), 0)]);
}

#[test]
fn lookup_and_read_match_what_was_built() {
    let d = tempfile::tempdir().unwrap();
    let bytes = build_tree(d.path(), 3000, &small_opts());
    let img = Image::open(Arc::new(MemSource::new(bytes, "x"))).unwrap();
    for i in [0usize, 1, 2, 1499, 2999] {
        let sub = if i % 3 == 0 { "sub" } else { "sub/deeper" };
        let ino = img
            .resolve(format!("{sub}/f{i:06}.txt").as_bytes())
            .unwrap();
        let want = format!("file {i}\n").repeat(i % 50);
        let mut buf = vec![0u8; want.len() + 10];
        let n = img.read(&ino, 0, &mut buf).unwrap();
        assert_eq!(&buf[..n], want.as_bytes());
        // Reads at an offset, across a packed block boundary.
        if want.len() > 5 {
            let n = img.read(&ino, 5, &mut buf).unwrap();
            assert_eq!(&buf[..n], &want.as_bytes()[5..]);
        }
    }
    assert!(matches!(
        img.resolve(b"sub/nope"),
        Err(ReadError::NotFound(_))
    ));
    assert!(matches!(
        img.resolve(b"link/x"),
        Err(ReadError::NotFound(_))
    ));
    assert_eq!(
        img.read_link(&img.resolve(b"link").unwrap()).unwrap(),
        b"sub/f000000.txt"
    );
    let root = img.root().unwrap();
    let names: Vec<_> = img
        .read_dir(&root, 0, 10)
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, vec![b"link".to_vec(), b"sub".to_vec()]);
}

/// Reads handed out as pieces cover exactly the bytes asked for, in order:
/// slices of blocks, and zeros for the holes of a sparse file; a read inside
/// one block is one piece (the mount replies with it without a copy).
#[test]
fn read_pieces_cover_a_sparse_file_exactly() {
    use std::os::unix::fs::FileExt;
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    std::fs::create_dir(&src).unwrap();
    // Data, a hole of whole 4 KiB blocks, data across a block boundary,
    // another hole, and a hole at the end.
    let size = 12 * 4096 + 7;
    let mut want = vec![0u8; size];
    let f = std::fs::File::create(src.join("sparse")).unwrap();
    f.set_len(size as u64).unwrap();
    for (at, n, seed) in [
        (0usize, 3000usize, 1u8),
        (5 * 4096 + 4000, 5000, 2),
        (9 * 4096 + 100, 10, 3),
    ] {
        let bytes: Vec<u8> = (0..n).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect();
        f.write_all_at(&bytes, at as u64).unwrap();
        want[at..at + n].copy_from_slice(&bytes);
    }
    drop(f);
    let out = d.path().join("i.sheaf");
    build(
        &Input::Dir(src),
        &out,
        &small_opts(),
        Arc::new(Progress::default()),
        &AtomicBool::new(false),
    )
    .unwrap();
    let img = Image::open(Arc::new(MemSource::new(std::fs::read(out).unwrap(), "x"))).unwrap();
    let ino = img.resolve(b"sparse").unwrap();
    let mut zeros_seen = false;
    for offset in [
        0usize,
        1,
        2999,
        4095,
        4096,
        5 * 4096 + 3999,
        6 * 4096,
        9 * 4096 + 105,
        size - 3,
    ] {
        for len in [1usize, 100, 4096, 3 * 4096 + 1, 1 << 20] {
            let mut got = Vec::new();
            let mut kinds = Vec::new();
            let n = img
                .read_pieces(&ino, offset as u64, len, &mut |_, _| {}, &mut |p| {
                    assert!(!p.is_empty(), "an empty piece at {offset}+{len}");
                    match &p {
                        Piece::Bytes(b, r) => got.extend_from_slice(&b[r.clone()]),
                        Piece::Zeros(z) => got.resize(got.len() + z, 0),
                    }
                    kinds.push(matches!(p, Piece::Zeros(_)));
                })
                .unwrap();
            let end = (offset + len).min(size);
            assert_eq!(n, end - offset, "length of {offset}+{len}");
            assert_eq!(got, want[offset..end], "bytes of {offset}+{len}");
            zeros_seen |= kinds.contains(&true);
            if offset / 4096 == (end - 1) / 4096 && want[offset..end].iter().any(|&b| b != 0) {
                assert_eq!(kinds, [false], "one block, one piece: {offset}+{len}");
            }
            // The copying form agrees.
            let mut buf = vec![0xAAu8; len.min(size + 10)];
            let m = img.read(&ino, offset as u64, &mut buf).unwrap();
            assert_eq!(&buf[..m], &want[offset..end]);
        }
    }
    assert!(zeros_seen, "the holes came back as zero pieces");
}

/// Re-seal an image with a modified superblock and/or an extra section.
fn reseal(bytes: &[u8], edit: impl Fn(&mut Superblock), extra: Option<SectionEntry>) -> Vec<u8> {
    let t = Trailer::decode(&bytes[bytes.len() - TRAILER_LEN..], bytes.len() as u64).unwrap();
    let table = &bytes[t.table_offset as usize..bytes.len() - TRAILER_LEN];
    let mut secs = SectionEntry::decode_table(table, t.table_offset).unwrap();
    let mut out = bytes[..t.table_offset as usize].to_vec();
    for s in &mut secs {
        if s.kind == SectionKind::Superblock {
            let mut sb =
                Superblock::decode(&bytes[s.offset as usize..(s.offset + s.length) as usize])
                    .unwrap();
            edit(&mut sb);
            let enc = sb.encode();
            s.offset = out.len() as u64;
            s.length = enc.len() as u64;
            s.hash = sheaf_format::digest(&enc);
            out.extend_from_slice(&enc);
        }
    }
    secs.extend(extra);
    let table: Vec<u8> = secs.iter().flat_map(|s| s.encode()).collect();
    let table_offset = out.len() as u64;
    out.extend_from_slice(&table);
    let tr = Trailer {
        table_offset,
        section_count: secs.len() as u32,
        root_digest: sheaf_format::digest(&table),
    };
    out.extend_from_slice(&tr.encode());
    out
}

#[test]
fn unknown_required_things_are_refused_by_name_and_optional_ones_skipped() {
    let d = tempfile::tempdir().unwrap();
    let bytes = build_tree(d.path(), 5, &small_opts());
    let open = |b: Vec<u8>| Image::open(Arc::new(MemSource::new(b, "img.sheaf")));
    let e = open(reseal(&bytes, |sb| sb.required_features |= 1 << 3, None))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("img.sheaf") && e.contains("feature bit 3"),
        "{e}"
    );
    let sec = |flags| SectionEntry {
        kind: SectionKind::Other(77),
        flags,
        offset: 64,
        length: 1,
        hash: [0; 32],
    };
    let e = open(reseal(&bytes, |_| {}, Some(sec(SECTION_FLAG_REQUIRED))))
        .unwrap_err()
        .to_string();
    assert!(e.contains("required section kind 77"), "{e}");
    let img = open(reseal(&bytes, |_| {}, Some(sec(0)))).unwrap();
    img.resolve(b"link").unwrap();
}

/// Deterministic xorshift, so failures reproduce.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

#[test]
fn mutated_images_never_panic() {
    let d = tempfile::tempdir().unwrap();
    let mut seeds = Vec::new();
    for codec in ["zstd", "lz4", "xz", "none"] {
        let o = BuildOptions {
            compression: sheaf_build::Compression::parse(codec).unwrap(),
            ..small_opts()
        };
        seeds.push(build_tree(d.path(), 40, &o));
    }
    // Reference blocks and their base list: two versions of a file of
    // three blocks, one byte apart in each block.
    let src = d.path().join("versions");
    let mut lib: Vec<u8> = (0..3 * 4096u32)
        .map(|i: u32| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    for ver in ["1.0", "1.1"] {
        std::fs::create_dir_all(src.join(ver)).unwrap();
        std::fs::write(src.join(ver).join("lib.so"), &lib).unwrap();
        for at in [10, 4106, 8202] {
            lib[at] ^= 1;
        }
    }
    let out = d.path().join("versions.sheaf");
    build(
        &Input::Dir(src),
        &out,
        &BuildOptions {
            force: true,
            ..small_opts()
        },
        Arc::new(Progress::default()),
        &AtomicBool::new(false),
    )
    .unwrap();
    let refs = Image::open(Arc::new(MemSource::new(std::fs::read(&out).unwrap(), "r")))
        .unwrap()
        .ref_bases()
        .len();
    assert!(refs > 0, "the seed has reference blocks");
    seeds.push(std::fs::read(&out).unwrap());
    // A signed image: mutations near its end hit the signature footer.
    let mut signed = seeds[0].clone();
    let own = signed.len() as u64;
    let sigs = vec![b"-----BEGIN SSH SIGNATURE-----\nnot checked here\n".to_vec(); 2];
    signed.extend(sheaf_format::signatures::encode_block(&sigs, own, own));
    let img = Image::open(Arc::new(MemSource::new(signed.clone(), "signed"))).unwrap();
    assert_eq!(img.signatures(), &sigs[..]);
    assert_eq!(img.image_len(), own);
    seeds.push(signed);
    let mut rng = Rng(0x5eed);
    for round in 0..3000 {
        let mut b = seeds[round % seeds.len()].clone();
        match rng.below(4) {
            0 => {
                for _ in 0..1 + rng.below(4) {
                    let i = rng.below(b.len());
                    b[i] ^= 1 << rng.below(8);
                }
            }
            1 => {
                // Mutations near the end hit the trailer, table and superblock.
                let i = b.len() - 1 - rng.below(600.min(b.len() - 1));
                b[i] = rng.next() as u8;
            }
            2 => b.truncate(rng.below(b.len())),
            _ => {
                let i = rng.below(b.len());
                let j = rng.below(b.len());
                let n = rng.below(64).min(b.len() - i.max(j));
                b.copy_within(i..i + n, j);
            }
        }
        fuzzing::image(&b);
        fuzzing::records(&b[b.len().saturating_sub(200)..]);
        fuzzing::codecs(&b[rng.below(b.len())..]);
    }
}

#[test]
fn a_flipped_byte_anywhere_is_never_read_back_as_wrong_data() {
    let d = tempfile::tempdir().unwrap();
    let good = build_tree(d.path(), 200, &small_opts());
    let want: Vec<(String, Vec<u8>)> = (0..200)
        .map(|i| {
            let sub = if i % 3 == 0 { "sub" } else { "sub/deeper" };
            (
                format!("{sub}/f{i:06}.txt"),
                format!("file {i}\n").repeat(i % 50).into_bytes(),
            )
        })
        .collect();
    let mut rng = Rng(42);
    for _ in 0..300 {
        let mut b = good.clone();
        let i = rng.below(b.len());
        b[i] ^= 0x40;
        let Ok(img) = Image::open(Arc::new(MemSource::new(b, "x"))) else {
            continue;
        };
        for (p, content) in &want {
            let Ok(ino) = img.resolve(p.as_bytes()) else {
                continue;
            };
            let mut buf = vec![0u8; content.len()];
            if let Ok(n) = img.read(&ino, 0, &mut buf) {
                assert_eq!(
                    &buf[..n],
                    &content[..n],
                    "wrong bytes for {p} after flipping byte {i}"
                );
            }
        }
    }
}

#[test]
fn images_can_share_one_block_cache_and_its_blocks() {
    let d = tempfile::tempdir().unwrap();
    let a = build_tree(&d.path().join("a"), 50, &small_opts());
    let b = build_tree(&d.path().join("b"), 50, &small_opts());
    let shared = Arc::new(sheaf_read::Cache::new(1 << 20));
    let ia = Image::open(Arc::new(MemSource::new(a, "a")))
        .unwrap()
        .with_block_cache(shared.clone());
    let ib = Image::open(Arc::new(MemSource::new(b, "b")))
        .unwrap()
        .with_block_cache(shared.clone());
    let mut buf = vec![0u8; 4096];
    let f = ia.resolve(b"sub/f000003.txt").unwrap();
    ia.read(&f, 0, &mut buf).unwrap();
    let misses = shared.stats.misses.load(Ordering::SeqCst);
    // The same content in the other image is served from the shared cache.
    let g = ib.resolve(b"sub/f000003.txt").unwrap();
    ib.read(&g, 0, &mut buf).unwrap();
    assert_eq!(shared.stats.misses.load(Ordering::SeqCst), misses);
    assert!(shared.stats.hits.load(Ordering::SeqCst) >= 1);
}

#[test]
fn reads_through_a_scratch_block_equal_the_files_in_any_order() {
    let d = tempfile::tempdir().unwrap();
    // Packs of many small files (the default pack size), so consecutive
    // reads share a block and later ones extend a decoded prefix.
    let opts = BuildOptions {
        page_size: 4096,
        ..Default::default()
    };
    let bytes = build_tree(d.path(), 3000, &opts);
    let img = Image::open(Arc::new(MemSource::new(bytes, "x"))).unwrap();
    let want = |i: usize| format!("file {i}\n").repeat(i % 50).into_bytes();
    let path = |i: usize| {
        let sub = if i.is_multiple_of(3) {
            "sub"
        } else {
            "sub/deeper"
        };
        format!("{sub}/f{i:06}.txt")
    };
    let read = |i: usize, s: &mut sheaf_read::BlockScratch, from: u64| {
        let ino = img.resolve(path(i).as_bytes()).unwrap();
        let mut got = Vec::new();
        let n = img
            .read_pieces_scratch(&ino, from, usize::MAX, s, &mut |p| match p {
                Piece::Bytes(b, r) => got.extend_from_slice(&b[r]),
                Piece::Zeros(n) => got.resize(got.len() + n, 0),
            })
            .unwrap();
        assert_eq!(n, got.len());
        got
    };
    // Backwards, forwards and strided, each with one scratch; at offsets.
    let orders: [Vec<usize>; 3] = [
        (0..3000).rev().collect(),
        (0..3000).collect(),
        (0..3000).map(|i| (i * 7) % 3000).collect(),
    ];
    for order in orders {
        let mut s = sheaf_read::BlockScratch::default();
        for i in order {
            assert_eq!(read(i, &mut s, 0), want(i), "{}", path(i));
            let w = want(i);
            if w.len() > 3 {
                assert_eq!(read(i, &mut s, 3), w[3..].to_vec(), "{} at 3", path(i));
            }
        }
    }
}

/// A read of 128 KiB or more from the start of a file's piece of a block is
/// a stream through the file: its first decode goes to the piece's end, so
/// the next read of the file finds it decoded. A shorter read, or one from
/// inside the piece (a random access), decodes only what it asks for.
#[test]
fn a_stream_from_a_pieces_start_decodes_to_its_end_and_other_reads_a_prefix() {
    let d = tempfile::tempdir().unwrap();
    // 3 MiB: one block, the whole file.
    let data = sheaf_testkit::patterned(3 << 20);
    let out = sheaf_testkit::image(d.path(), "i", &[("big", &data)]);
    for (off, len, whole) in [
        (0, 4096, false),
        (0, 128 << 10, true),
        (4096, 128 << 10, false),
        (0, (128 << 10) - 1, false),
    ] {
        let img = sheaf_read::open_path(&out).unwrap();
        let ino = img.resolve(b"/big").unwrap();
        let mut used = vec![];
        let mut buf = vec![0u8; len];
        img.read_with(&ino, off as u64, &mut buf, &mut |b, _| used.push(b))
            .unwrap();
        assert_eq!(buf, data[off..off + len], "read at {off}");
        assert_eq!(used.len(), 1, "one block");
        assert_eq!(
            img.block_is_prefix(used[0]),
            !whole,
            "{len} bytes at {off}: decoded {}",
            if whole { "in part" } else { "whole" }
        );
    }
}
