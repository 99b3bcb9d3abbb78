//! Harness bodies shared by the `cargo fuzz` targets (`fuzz/`) and the
//! stable mutation tests, so both exercise the same code paths. Each takes
//! arbitrary bytes and must never panic, hang or allocate without bound.

use crate::{Image, ImageOptions, MemSource};
use sheaf_format::remote::{self, ImageIndex};
use sheaf_format::signatures::{self, SigFooter, SIG_FOOTER_LEN};
use sheaf_format::{
    BlockRef, ChunkRecord, Codec, DirentRecord, Header, InodeRecord, SectionEntry, Superblock,
    Trailer, XattrSet,
};
use std::sync::Arc;

/// Decode every fixed structure from `data`.
pub fn records(data: &[u8]) {
    let _ = Header::decode(data);
    let _ = Trailer::decode(data, data.len() as u64 + 64);
    let _ = SectionEntry::decode_table(data, u64::MAX);
    let _ = BlockRef::decode(data);
    let _ = Superblock::decode(data);
    let _ = InodeRecord::decode(data);
    let _ = ChunkRecord::decode(data);
    let _ = DirentRecord::decode(data);
    let _ = XattrSet::decode(data);
    // Objects and image indexes, as a node cache or repository serves them;
    // also with the index magic prepended so mutations reach past it.
    let _ = remote::decode_object(data);
    if let Ok(i) = ImageIndex::decode(data) {
        let _ = i.read(&mut [0u8; 64], 0);
    }
    let mut with_magic = remote::INDEX_MAGIC.to_vec();
    with_magic.extend_from_slice(data);
    let _ = ImageIndex::decode(&with_magic);
    // The signature footer and entries, as a reader meets them at a file's end.
    if let Ok(f) = SigFooter::decode(data, data.len() as u64 + SIG_FOOTER_LEN as u64) {
        let _ = signatures::decode_entries(data, &f);
    }
    if data.len() >= SIG_FOOTER_LEN {
        let tail = &data[data.len() - SIG_FOOTER_LEN..];
        if let Ok(f) = SigFooter::decode(tail, data.len() as u64) {
            let start = (f.offset as usize).min(data.len());
            let end = (start + f.len as usize).min(data.len());
            let _ = signatures::decode_entries(&data[start..end], &f);
        }
    }
}

/// Decompress `data[2..]` with the codec named by `data[0]`, to a length
/// derived from `data[1]` (bounded, as real refs are by the block size).
pub fn codecs(data: &[u8]) {
    if data.len() < 2 {
        return;
    }
    if let Ok(c) = Codec::from_id(data[0] % Codec::ALL.len() as u8) {
        let ulen = (data[1] as usize) << 10;
        let mut out = Vec::new();
        // Codec 4 finds its dictionary when the input names this one's
        // digest (a seed does), so frames decoded with a real dictionary
        // are explored, not only the lookup failure.
        let dicts = FuzzLookup(fuzz_dicts());
        let _ = c.decompress_with(&data[2..], ulen, &mut out, &dicts);
        // The partial decode a read of part of a block does, to a length
        // the input picks: it must end with an error or a prefix of at
        // most `ulen` bytes.
        let end = (data[1] as usize * 37) % (ulen + 1);
        if c.decompress_prefix(&data[2..], ulen, end, &mut out, &dicts)
            .is_ok()
        {
            assert!(
                out.len() >= end && out.len() <= ulen,
                "{c:?}: {} of {end}..{ulen}",
                out.len()
            );
        }
    }
}

/// What [`codecs`] decodes with: [`fuzz_dicts`], and [`fuzz_base`] as the
/// base of codec-6 blocks that name its digest (a seed does) and of those
/// that name another (so the decoder's check of the base is reached too).
pub struct FuzzLookup(pub Vec<Arc<sheaf_format::Dictionary>>);

impl sheaf_format::DictLookup for FuzzLookup {
    fn dictionary(&self, d: &sheaf_format::Digest) -> Option<Arc<sheaf_format::Dictionary>> {
        self.0.as_slice().dictionary(d)
    }
    fn reference(
        &self,
        _: &sheaf_format::Digest,
    ) -> Result<Arc<Vec<u8>>, sheaf_format::FormatError> {
        Ok(fuzz_base())
    }
}

/// A fixed base for [`codecs`]' reference blocks: 64 KiB of text.
pub fn fuzz_base() -> Arc<Vec<u8>> {
    static B: std::sync::OnceLock<Arc<Vec<u8>>> = std::sync::OnceLock::new();
    B.get_or_init(|| {
        Arc::new(
            (0..65536u32)
                .flat_map(|i| format!("line {i} of the base\n").into_bytes())
                .take(65536)
                .collect(),
        )
    })
    .clone()
}

/// A fixed dictionary for [`codecs`]: raw content, which zstd accepts.
pub fn fuzz_dicts() -> Vec<Arc<sheaf_format::Dictionary>> {
    static D: std::sync::OnceLock<Vec<Arc<sheaf_format::Dictionary>>> = std::sync::OnceLock::new();
    D.get_or_init(|| {
        let bytes: Vec<u8> = (0..4096u32)
            .map(|i| b"sheaf dictionary "[(i % 17) as usize])
            .collect();
        vec![Arc::new(
            sheaf_format::Dictionary::new(bytes).expect("non-empty"),
        )]
    })
    .clone()
}

/// Open `data` as an image and walk it: list every directory reachable,
/// stat, read links and xattrs, read files, verify. The walk follows the
/// reader's tree rules and has no budget: it must end by itself, and one
/// that takes more steps than the image has entries panics, so the fuzzer
/// reports it as a crash instead of stopping silently.
pub fn image(data: &[u8]) {
    let src = Arc::new(MemSource::new(data.to_vec(), "fuzz.sheaf"));
    let opts = ImageOptions {
        block_cache_bytes: 8 << 20,
        page_cache_bytes: 8 << 20,
    };
    let Ok(img) = Image::open_with(src, opts) else {
        return;
    };
    let _ = img.build_info();
    let mut stack = match img.root() {
        Ok(r) => vec![r],
        Err(_) => return,
    };
    let mut seen = crate::Seen::new(&img);
    let limit = img.superblock().dirent_count;
    let mut steps = 0u64;
    let mut buf = vec![0u8; 1 << 16];
    while let Some(dir) = stack.pop() {
        if seen.enter(&img, &dir).is_err() {
            continue;
        }
        let Ok(entries) = img.read_dir(&dir, 0, 256) else {
            continue;
        };
        for e in entries {
            steps += 1;
            assert!(
                steps <= limit,
                "the walk took more steps than the image has entries ({limit})"
            );
            let _ = img.lookup(&dir, &e.name);
            let Ok(ino) = img.child(&dir, e.ino, e.file_type) else {
                continue;
            };
            let _ = img.xattrs(&ino);
            match ino.file_type() {
                sheaf_format::FileType::Directory => stack.push(ino),
                sheaf_format::FileType::Symlink => {
                    let _ = img.read_link(&ino);
                }
                sheaf_format::FileType::Regular => {
                    let _ = img.read(&ino, 0, &mut buf);
                    let _ = img.read(&ino, ino.rec.size.saturating_sub(10), &mut buf);
                }
                _ => {}
            }
        }
    }
    let _ = img.resolve(b"a/b/../c");
    // The walk `sheaf find` and `sheaf du` run: it must end, and visit no
    // more entries than the image declares (plus the start).
    if let Ok(root) = img.root() {
        for order in [crate::Order::Pre, crate::Order::Post(usize::MAX)] {
            let mut visits = 0u64;
            let _ = img.walk_in(order, root, b"/".to_vec(), &mut |_, _, _| {
                visits += 1;
                assert!(
                    visits <= limit + 1,
                    "the walk ({order:?}) visited more than {limit} entries"
                );
                Ok(crate::Step::Continue)
            });
        }
    }
    let progress = std::sync::atomic::AtomicU64::new(0);
    let _ = crate::verify::verify(&img, &progress);
}

#[cfg(test)]
mod tests {
    /// The kept `codecs` seed for codec 4 names [`super::fuzz_dicts`]'s
    /// dictionary, so the fuzzer starts from a frame that decodes.
    #[test]
    fn the_dictionary_seed_decodes_with_the_fuzz_dictionary() {
        let seed = include_bytes!("../../../fuzz/seeds/codecs/zstd-dict-frame");
        assert_eq!(seed[0], sheaf_format::Codec::ZstdDict as u8);
        let mut out = Vec::new();
        sheaf_format::Codec::ZstdDict
            .decompress_with(
                &seed[2..],
                (seed[1] as usize) << 10,
                &mut out,
                &super::fuzz_dicts().as_slice(),
            )
            .unwrap();
        assert_eq!(out.len(), 4096);
    }

    /// The kept seed for codec 6 names [`super::fuzz_base`] and decodes
    /// against it, whole and in part.
    #[test]
    fn the_reference_seed_decodes_against_the_fuzz_base() {
        let seed = include_bytes!("../../../fuzz/seeds/codecs/zstd-ref-frame");
        assert_eq!(seed[0], sheaf_format::Codec::ZstdRef as u8);
        let ulen = (seed[1] as usize) << 10;
        let lookup = super::FuzzLookup(super::fuzz_dicts());
        let mut out = Vec::new();
        sheaf_format::Codec::ZstdRef
            .decompress_with(&seed[2..], ulen, &mut out, &lookup)
            .unwrap();
        let mut want = super::fuzz_base().to_vec();
        want[100..110].copy_from_slice(b"0123456789");
        assert_eq!(out, want);
        super::codecs(seed);
    }

    /// The kept seed for codec 5 is a whole frame: the fuzzer starts from
    /// partial decodes that succeed.
    #[test]
    fn the_stored_digest_seed_decodes_whole_and_in_part() {
        let seed = include_bytes!("../../../fuzz/seeds/codecs/zstd-stored-frame");
        let c = sheaf_format::Codec::from_id(seed[0]).unwrap();
        assert_eq!(c, sheaf_format::Codec::ZstdStored);
        let ulen = (seed[1] as usize) << 10;
        let mut whole = Vec::new();
        c.decompress_into(&seed[2..], ulen, &mut whole).unwrap();
        let mut part = Vec::new();
        c.decompress_prefix(
            &seed[2..],
            ulen,
            100,
            &mut part,
            &sheaf_format::dict::NoDicts,
        )
        .unwrap();
        assert!(part.len() >= 100 && whole.starts_with(&part));
        super::codecs(seed);
    }
}
