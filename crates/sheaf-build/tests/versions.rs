//! Many versions of one tree in one image (issue 42): the versions of a
//! file are packed side by side, and those of a pack or more share blocks.
//!
//! The data is incompressible (BLAKE3 output), so what one version costs is
//! known without the code under test: its byte count. Each later version
//! differs from the first by one byte, so an image that finds the versions
//! together costs about one version; one that does not, about all of them.

use sheaf_build::{build, order::PackOrder, BuildOptions, Input, Progress};
use sheaf_read::Image;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// `len` pseudo-random bytes named by `seed`.
fn noise(seed: &str, len: usize) -> Vec<u8> {
    let mut b = vec![0; len];
    blake3::Hasher::new()
        .update(seed.as_bytes())
        .finalize_xof()
        .fill(&mut b);
    b
}

/// Version `v` (0-based) of the content `seed`: the first version with
/// byte `v` changed (nothing for v = 0).
fn version(seed: &str, len: usize, v: usize) -> Vec<u8> {
    let mut b = noise(seed, len);
    if v > 0 {
        b[v * 7 % len] ^= 0xff;
    }
    b
}

const VERSIONS: [&str; 3] = ["1.24.4", "1.26.4", "2.0.2"];

/// `install/pkg/VERSION/pkg/sub/fNNN.py` for each version: `files` files of
/// `len` bytes, and the content of version `v` from [`version`].
fn make_tree(root: &Path, versions: usize, files: usize, len: usize) {
    for (v, ver) in VERSIONS[..versions].iter().enumerate() {
        let d = root.join(format!("install/pkg/{ver}/pkg/sub"));
        std::fs::create_dir_all(&d).unwrap();
        for i in 0..files {
            std::fs::write(
                d.join(format!("f{i:03}.py")),
                version(&format!("f{i}"), len, v),
            )
            .unwrap();
        }
    }
}

fn build_image(src: &Path, out: &Path, opts: BuildOptions) -> Image {
    build(
        &Input::Dir(src.to_path_buf()),
        out,
        &BuildOptions {
            force: true,
            ..opts
        },
        Arc::new(Progress::default()),
        &AtomicBool::new(false),
    )
    .unwrap();
    sheaf_read::open_path(out).unwrap()
}

/// The packing before issue 42: no versions order, group blocks or
/// reference blocks.
fn directory_order() -> BuildOptions {
    BuildOptions {
        order: PackOrder::Directory,
        group_blocks: false,
        ref_window: 0,
        ..Default::default()
    }
}

/// The block ids a file's data lies in.
fn blocks_of(img: &Image, path: &str) -> Vec<u32> {
    let ino = img.resolve(path.as_bytes()).unwrap();
    (0..ino.rec.count as u64)
        .map(|k| img.chunk(ino.rec.data + k).unwrap().block)
        .collect()
}

fn read_all(img: &Image, path: &str) -> Vec<u8> {
    let ino = img.resolve(path.as_bytes()).unwrap();
    let mut b = vec![0; ino.rec.size as usize];
    let mut at = 0;
    while at < b.len() {
        let n = img.read(&ino, at as u64, &mut b[at..]).unwrap();
        assert!(n > 0);
        at += n;
    }
    b
}

fn path(ver: &str, i: usize) -> String {
    format!("install/pkg/{ver}/pkg/sub/f{i:03}.py")
}

/// Every file of every version reads back as written.
fn check_contents(img: &Image, versions: usize, files: usize, len: usize) {
    for (v, ver) in VERSIONS[..versions].iter().enumerate() {
        for i in 0..files {
            assert_eq!(
                read_all(img, &path(ver, i)),
                version(&format!("f{i}"), len, v),
                "{}",
                path(ver, i)
            );
        }
    }
}

#[test]
fn versions_of_small_files_share_a_pack_and_cost_one_version() {
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    // 400 files of 3 KiB: 1.2 MB a version, several 256 KiB packs.
    let (files, len) = (400, 3 << 10);
    make_tree(&src, 2, files, len);
    let one_version = (files * len) as u64;

    let new = build_image(&src, &d.path().join("v.sheaf"), BuildOptions::default());
    let old = build_image(&src, &d.path().join("d.sheaf"), directory_order());
    let together = |img: &Image| {
        (0..files)
            .filter(|&i| {
                blocks_of(img, &path(VERSIONS[0], i)) == blocks_of(img, &path(VERSIONS[1], i))
            })
            .count()
    };
    // A pack cut can fall between two versions, rarely.
    assert!(
        together(&new) * 10 >= files * 9,
        "{} of {files}",
        together(&new)
    );
    assert!(
        together(&old) * 10 <= files,
        "{} of {files}",
        together(&old)
    );
    let stored = |img: &Image| img.superblock().stored_data_bytes;
    assert!(
        stored(&new) * 100 <= one_version * 115,
        "{} stored for {one_version} bytes a version",
        stored(&new)
    );
    assert!(stored(&old) * 100 >= one_version * 190, "{}", stored(&old));
    check_contents(&new, 2, files, len);
}

#[test]
fn versions_of_large_files_share_a_block_and_cost_one_version() {
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    // Three files of 600 KiB (over the 256 KiB pack, under the 4 MiB
    // block) in three versions: the three versions fit one block.
    let (files, len) = (3, 600 << 10);
    make_tree(&src, 3, files, len);
    let one_version = (files * len) as u64;

    let new = build_image(&src, &d.path().join("v.sheaf"), BuildOptions::default());
    for i in 0..files {
        let b = blocks_of(&new, &path(VERSIONS[0], i));
        assert_eq!(b.len(), 1);
        for ver in &VERSIONS[1..] {
            assert_eq!(blocks_of(&new, &path(ver, i)), b, "{ver} f{i}");
        }
    }
    let stored = |img: &Image| img.superblock().stored_data_bytes;
    assert!(
        stored(&new) * 100 <= one_version * 110,
        "{} stored for {one_version} bytes a version",
        stored(&new)
    );
    check_contents(&new, 3, files, len);

    // Each lever alone: ordering without group blocks stores every version
    // (each its own block), and group blocks without the ordering never
    // see two versions in a row (reference blocks, which would find them
    // anyway, are off here: tests/references.rs measures them).
    for opts in [
        directory_order(),
        BuildOptions {
            group_blocks: false,
            ref_window: 0,
            ..Default::default()
        },
        BuildOptions {
            order: PackOrder::Directory,
            ref_window: 0,
            ..Default::default()
        },
    ] {
        let img = build_image(&src, &d.path().join("o.sheaf"), opts.clone());
        assert!(
            stored(&img) >= one_version * 3 - one_version / 100,
            "{:?}/{}: {}",
            opts.order,
            opts.group_blocks,
            stored(&img)
        );
        check_contents(&img, 3, files, len);
    }
}

#[test]
fn a_group_block_holds_no_more_than_a_block() {
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    // Two versions of 2.5 MiB: together over the 4 MiB block, so each has
    // a block of its own.
    make_tree(&src, 2, 1, 5 << 19);
    let img = build_image(&src, &d.path().join("v.sheaf"), BuildOptions::default());
    assert_ne!(
        blocks_of(&img, &path(VERSIONS[0], 0)),
        blocks_of(&img, &path(VERSIONS[1], 0))
    );
    check_contents(&img, 2, 1, 5 << 19);
}

#[test]
fn a_repeated_large_file_leaves_no_tail_in_a_group_block() {
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    // 1 MiB blocks, 64 KiB packs: a file of 1.5 MiB is one full block and
    // a tail of 512 KiB, which goes to a group block. The same file in a
    // second version is found to repeat the first only after its tail was
    // added; the tail must come out again.
    let len = 3 << 19;
    for ver in &VERSIONS[..2] {
        let dir = src.join(format!("install/pkg/{ver}/pkg/sub"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("f000.py"), noise("same", len)).unwrap();
    }
    let opts = BuildOptions {
        block_size: 1 << 20,
        pack_size: 64 << 10,
        ..Default::default()
    };
    let img = build_image(&src, &d.path().join("v.sheaf"), opts);
    let b = blocks_of(&img, &path(VERSIONS[0], 0));
    assert_eq!(b, blocks_of(&img, &path(VERSIONS[1], 0)));
    assert_eq!(b.len(), 2);
    assert_eq!(img.block_ref(b[1]).unwrap().ulen, (len - (1 << 20)) as u32);
    assert_eq!(img.superblock().block_count, 2);
    for ver in &VERSIONS[..2] {
        assert_eq!(read_all(&img, &path(ver, 0)), noise("same", len));
    }
}

#[test]
fn versions_order_is_reproducible_whatever_the_threads() {
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    make_tree(&src, 3, 40, 100 << 10);
    let image = |threads: usize, name: &str| {
        let out = d.path().join(name);
        build_image(
            &src,
            &out,
            BuildOptions {
                threads,
                ..Default::default()
            },
        );
        std::fs::read(out).unwrap()
    };
    assert_eq!(image(1, "a.sheaf"), image(3, "b.sheaf"));
}

#[test]
fn a_tree_without_versions_keeps_its_order() {
    // No name has a version number: the classes are the directories, so
    // both orders give the same image but for the build information.
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    for dir in ["a", "a/b", "c", "d000", "d001"] {
        std::fs::create_dir_all(src.join(dir)).unwrap();
        for i in 0..30 {
            std::fs::write(
                src.join(format!("{dir}/x{i}.c")),
                noise(&format!("{dir}{i}"), 5000 + i * 300),
            )
            .unwrap();
        }
    }
    let a = build_image(&src, &d.path().join("a.sheaf"), BuildOptions::default());
    let b = build_image(&src, &d.path().join("b.sheaf"), directory_order());
    let n = a.superblock().block_count;
    assert_eq!(n, b.superblock().block_count);
    for id in 0..n as u32 {
        assert_eq!(a.block_ref(id).unwrap().hash, b.block_ref(id).unwrap().hash);
    }
}
