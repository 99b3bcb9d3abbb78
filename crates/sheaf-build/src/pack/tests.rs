//! Unit tests of the packer.

use super::*;
use std::sync::atomic::AtomicBool;

#[test]
fn a_pack_holds_its_pieces_shortest_first() {
    let out = Out::new(Vec::new(), 0, "test".into());
    let mut p = Packer::new(out, 1 << 20, Compression::default(), 1, Arc::default());
    p.set_pack_size(64 << 10);
    // Appended long, short, middle, short, then a file that fills the
    // pack and goes on into the next (its head is a piece of this one).
    let files: Vec<Vec<u8>> = [9000usize, 10, 3000, 7, 60000]
        .iter()
        .enumerate()
        .map(|(i, &n)| (0..n).map(|j| (i * 31 + j % 251) as u8).collect())
        .collect();
    let mut ranges = Vec::new();
    for (i, f) in files.iter().enumerate() {
        let r = p
            .add_file(&mut Dense(&f[..]), "f", i as u32, &AtomicBool::new(false))
            .unwrap();
        ranges.push(r);
    }
    let (out, refs, chunks, _, _) = p.finish().unwrap();
    let image = out.into_inner();
    let first_pack = |c: &Chunk| c.block == chunks[0].block;
    let mut in_pack: Vec<&Chunk> = chunks.iter().filter(|c| first_pack(c)).collect();
    in_pack.sort_by_key(|c| c.block_offset);
    // Contiguous from 0, and each piece no longer than the next.
    let mut at = 0;
    for w in in_pack.windows(2) {
        assert!(w[0].len <= w[1].len, "{:?}", in_pack);
    }
    for c in &in_pack {
        assert_eq!(c.block_offset, at);
        at += c.len;
    }
    assert_eq!(in_pack.len(), 5);
    // Every file reads back whole through its chunks.
    for (f, range) in files.iter().zip(&ranges) {
        let (first, n) = match range.1 {
            FileRange::Chunks(a, n) => (a as usize, n as usize),
            FileRange::SameAs(_) => unreachable!("contents differ"),
        };
        let mut got = Vec::new();
        for c in &chunks[first..first + n] {
            let b = refs[c.block as usize];
            let s = &image[b.offset as usize..b.offset as usize + b.clen as usize];
            let block = b.codec.decompress(s, b.ulen as usize).unwrap();
            let o = c.block_offset as usize;
            got.extend_from_slice(&block[o..o + c.len as usize]);
        }
        assert_eq!(&got, f);
    }
}

/// Packs of `files` files of 8 KiB, each added under the path `path(i)`,
/// with 64 KiB packs and grouping on: how many pack blocks they fill.
fn packs_of(files: usize, path: impl Fn(usize) -> String) -> usize {
    let out = Out::new(Vec::new(), 0, "test".into());
    let mut p = Packer::new(out, 1 << 20, Compression::default(), 1, Arc::default());
    p.set_pack_size(64 << 10);
    p.set_grouping(true);
    let (mut n, mut seed) = (0, 0u64);
    while n < files {
        let mut f = vec![0; 8192];
        seed += 1;
        let mut h = blake3::Hasher::new();
        h.update(&seed.to_le_bytes()).finalize_xof().fill(&mut f);
        // Leave out contents whose digest ends a pack early (the
        // content-defined cut), so only the pack size decides.
        let h = sheaf_format::digest(&f);
        if u32::from_le_bytes([h[0], h[1], h[2], h[3]])
            .is_multiple_of(Packer::<Vec<u8>>::PACK_CUT_ONE_IN)
        {
            continue;
        }
        p.set_group_of(path(n).as_bytes());
        p.add_file(&mut Dense(&f[..]), "f", n as u32, &AtomicBool::new(false))
            .unwrap();
        n += 1;
    }
    let (_, _, chunks, _, _) = p.finish().unwrap();
    let blocks: std::collections::BTreeSet<u32> = chunks.iter().map(|c| c.block).collect();
    blocks.len()
}

#[test]
fn a_pack_of_versions_grows_to_four_packs() {
    // 40 files of 8 KiB: 320 KiB, five packs of 64 KiB.
    assert_eq!(packs_of(40, |i| format!("src/f{i}.c")), 5);
    // The same as two versions of 20 files, each file's versions next
    // to each other: packs of up to 256 KiB, so two.
    assert_eq!(packs_of(40, |i| format!("pkg/1.{}/f{}.c", i % 2, i / 2)), 2);
}
