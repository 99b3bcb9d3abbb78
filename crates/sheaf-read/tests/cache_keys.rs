//! Cache keys (issue: trust across paths, case 3): a block's digest names
//! its stored frame for some codecs and its content for others, so a file
//! whose content is another block's frame has that block's digest. Every
//! read must still return its own bytes, from the block cache and from a
//! shared node store, and no image's objects may be evicted because another
//! image's object of the same digest failed to decode.

use sheaf_build::{build, BuildOptions, Compression, Input, Progress};
use sheaf_format::{BlockRef, Digest};
use sheaf_read::{FileSource, Image, ImageOptions, ObjectStore, Source};
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

/// A node store in memory, counting removals.
#[derive(Default)]
struct MemStore {
    objects: Mutex<HashMap<Digest, Vec<u8>>>,
    removed: Mutex<u32>,
}

impl ObjectStore for MemStore {
    fn get(&self, hash: &Digest) -> Option<Vec<u8>> {
        self.objects.lock().unwrap().get(hash).cloned()
    }
    fn contains(&self, hash: &Digest) -> bool {
        self.objects.lock().unwrap().contains_key(hash)
    }
    fn put(&self, hash: &Digest, object: &[u8]) {
        self.objects.lock().unwrap().insert(*hash, object.to_vec());
    }
    fn remove(&self, hash: &Digest) {
        *self.removed.lock().unwrap() += 1;
        self.objects.lock().unwrap().remove(hash);
    }
    fn store_stats(&self) -> sheaf_read::StoreStats {
        sheaf_read::StoreStats::Repository {
            repository: "memory".into(),
        }
    }
}

/// xorshift, so each case is reproducible from its seed.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Compressible text of `n` bytes: words from a small vocabulary.
fn text(rng: &mut Rng, n: usize) -> Vec<u8> {
    const WORDS: [&str; 12] = [
        "sheaf ", "block ", "digest ", "frame ", "cache ", "node ", "\n", "key ", "zstd ", "lz4 ",
        "xz ", "store ",
    ];
    let mut v = Vec::with_capacity(n + 8);
    while v.len() < n {
        let r = rng.next();
        v.extend_from_slice(WORDS[(r % 12) as usize].as_bytes());
        // Numbers keep the frame dense, so no codec shrinks it again.
        v.extend_from_slice(format!("{} ", (r >> 8) % 100_000).as_bytes());
    }
    v.truncate(n);
    v
}

fn build_dir(dir: &Path, files: &[(String, Vec<u8>)], out: &Path, codec: &str) {
    let src = dir.join("src");
    let _ = std::fs::remove_dir_all(&src);
    std::fs::create_dir_all(&src).unwrap();
    for (name, data) in files {
        std::fs::write(src.join(name), data).unwrap();
    }
    build(
        &Input::Dir(src.clone()),
        out,
        &BuildOptions {
            force: true,
            block_size: 64 << 10,
            pack_size: 64 << 10,
            dictionary: false,
            compression: Compression::parse(codec).unwrap(),
            ..Default::default()
        },
        Arc::new(Progress::default()),
        &AtomicBool::new(false),
    )
    .unwrap();
}

fn open(p: &Path, store: Option<Arc<MemStore>>) -> Image {
    let src: Arc<dyn Source> = Arc::new(FileSource::open(p).unwrap());
    let img = Image::open_with(
        src,
        ImageOptions {
            block_cache_bytes: 64 << 20,
            ..Default::default()
        },
    )
    .unwrap();
    match store {
        Some(s) => img.with_store(s),
        None => img,
    }
}

fn read_all(img: &Image, name: &str) -> Vec<u8> {
    let ino = img.resolve(name.as_bytes()).unwrap();
    let mut out = vec![0u8; ino.rec.size as usize];
    let mut off = 0;
    while off < out.len() {
        let n = img.read(&ino, off as u64, &mut out[off..]).unwrap();
        assert!(n > 0, "{name}: short read at {off}");
        off += n;
    }
    out
}

/// The stored bytes of every data block whose digest names its frame.
fn frames(p: &Path) -> Vec<(BlockRef, Vec<u8>)> {
    let img = open(p, None);
    let f = FileSource::open(p).unwrap();
    img.object_refs()
        .unwrap()
        .into_iter()
        .filter(|(r, _)| r.codec.names_stored())
        .map(|(r, _)| {
            let mut b = vec![0u8; r.clen as usize];
            f.read_exact_at(&mut b, r.offset).unwrap();
            assert_eq!(
                sheaf_format::digest(&b),
                r.hash,
                "the frame is what the ref names"
            );
            (r, b)
        })
        .collect()
}

#[test]
fn a_file_whose_content_is_another_blocks_frame_reads_as_itself() {
    let t = tempfile::tempdir().unwrap();
    let mut collisions = 0;
    for seed in 1..=6u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        // Zstandard names its frames by digest; `auto` mixes in lz4, xz
        // and raw blocks. Both images compress alike, so the second holds
        // the first's frames again.
        let codec = ["zstd", "auto", "zstd:3", "zstd:19", "auto:19", "zstd:1"][(seed - 1) as usize];
        let n_files = 2 + (rng.next() % 3) as usize;
        let originals: Vec<(String, Vec<u8>)> = (0..n_files)
            .map(|i| {
                let n = (64 << 10) * (1 + (rng.next() % 2) as usize);
                (format!("a{i}"), text(&mut rng, n))
            })
            .collect();
        let first = t.path().join(format!("first-{seed}.sheaf"));
        build_dir(t.path(), &originals, &first, codec);
        // Second image: the originals, and a file that is one of their
        // frames (alone in its pack, so stored as it is: no codec shrinks it).
        let mut all = originals.clone();
        let fr = frames(&first);
        if !fr.is_empty() {
            let pick = (rng.next() as usize) % fr.len();
            all.push(("z-frame".to_string(), fr[pick].1.clone()));
        }
        let second = t.path().join(format!("second-{seed}.sheaf"));
        build_dir(t.path(), &all, &second, codec);
        // The collision really is there: a ref naming a frame and a ref
        // naming content share a digest.
        let refs: Vec<BlockRef> = open(&second, None)
            .object_refs()
            .unwrap()
            .into_iter()
            .map(|(r, _)| r)
            .collect();
        let stored: std::collections::HashSet<Digest> = refs
            .iter()
            .filter(|r| r.codec.names_stored())
            .map(|r| r.hash)
            .collect();
        collisions += refs
            .iter()
            .filter(|r| !r.codec.names_stored() && stored.contains(&r.hash))
            .count();
        // Reads in both orders, one image, one shared block cache.
        let img = open(&second, None);
        for (name, want) in all.iter().chain(all.iter().rev()) {
            assert!(
                read_all(&img, name) == *want,
                "seed {seed} ({codec}): {name} read back other bytes"
            );
        }
        // Through a node store shared with the first image: the store is
        // filled by one and read by the other, and nothing is evicted.
        let store = Arc::new(MemStore::default());
        for order in [[&second, &first], [&first, &second]] {
            for p in order {
                let img = open(p, Some(store.clone()));
                let names: Vec<&(String, Vec<u8>)> = if *p == second {
                    all.iter().collect()
                } else {
                    originals.iter().collect()
                };
                for (name, want) in names {
                    assert!(
                        read_all(&img, name) == *want,
                        "seed {seed} ({codec}): {name} through the node store"
                    );
                }
            }
        }
        assert_eq!(
            *store.removed.lock().unwrap(),
            0,
            "seed {seed} ({codec}): an object was evicted"
        );
    }
    assert!(collisions > 0, "no case made a digest collision");
}
