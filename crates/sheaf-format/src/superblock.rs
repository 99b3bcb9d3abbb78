//! The superblock section and the geometry of paged metadata streams.
//!
//! Metadata (inodes, chunks, dirents, the name heap, the block index) is kept
//! in *paged streams*: a byte stream cut into pages of `page_size` bytes, each
//! page compressed and hashed independently. The refs of a stream's pages
//! form a byte stream of their own (48 bytes a ref) which is paged the same
//! way, level upon level, until a level has at most [`MAX_ROOT_REFS`] pages;
//! those refs are stored in the superblock. The result is a Merkle tree whose
//! root hashes are covered by the superblock's section hash, and a reader can
//! reach any byte by fetching one page per level.

use crate::{BlockRef, Cursor, FormatError, BLOCK_REF_LEN};

/// Largest number of refs kept in the superblock for one stream.
pub const MAX_ROOT_REFS: usize = 64;
/// Most levels a stream may have (64 KiB pages reach beyond 2^60 bytes at 6).
pub const MAX_LEVELS: u32 = 8;
/// Smallest allowed page size.
pub const MIN_PAGE: u32 = 4096;
/// Largest allowed page size.
pub const MAX_PAGE: u32 = 1 << 20;
/// Smallest allowed data block size.
pub const MIN_BLOCK: u32 = 4096;
/// Largest allowed data block size.
pub const MAX_BLOCK: u32 = 64 << 20;

/// The metadata streams, in superblock order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StreamId {
    /// [`InodeRecord`](crate::InodeRecord)s.
    Inodes = 0,
    /// [`ChunkRecord`](crate::ChunkRecord)s.
    Chunks = 1,
    /// [`DirentRecord`](crate::DirentRecord)s.
    Dirents = 2,
    /// Names, symlink targets and xattr sets.
    Heap = 3,
    /// [`BlockRef`]s of data blocks.
    Blocks = 4,
}

impl StreamId {
    /// All streams, in order.
    pub const ALL: [StreamId; 5] = [
        StreamId::Inodes,
        StreamId::Chunks,
        StreamId::Dirents,
        StreamId::Heap,
        StreamId::Blocks,
    ];
    /// Name for messages.
    pub fn name(self) -> &'static str {
        match self {
            StreamId::Inodes => "inode table",
            StreamId::Chunks => "chunk table",
            StreamId::Dirents => "directory table",
            StreamId::Heap => "name heap",
            StreamId::Blocks => "block index",
        }
    }
}

/// Number of pages needed to hold `len` bytes.
pub fn page_count(len: u64, page_size: u32) -> u64 {
    len.div_ceil(page_size as u64)
}

/// Byte length of each level of a stream of `len` bytes: level 0 is the data,
/// level k+1 holds the refs of level k's pages. The last entry is the level
/// whose refs sit in the superblock.
pub fn level_lengths(len: u64, page_size: u32) -> Vec<u64> {
    let mut v = vec![len];
    while page_count(*v.last().expect("non-empty"), page_size) > MAX_ROOT_REFS as u64 {
        let pages = page_count(*v.last().expect("non-empty"), page_size);
        v.push(pages * BLOCK_REF_LEN as u64);
    }
    v
}

/// Descriptor of one paged stream.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StreamDesc {
    /// Uncompressed length of the stream.
    pub len: u64,
    /// Number of paged levels (0 for an empty stream).
    pub levels: u32,
    /// Refs of the pages of the top level.
    pub roots: Vec<BlockRef>,
}

/// Required feature: data blocks whose ref digest names their stored
/// bytes (codecs 4 and 5, format.md §7). A reader from before them would
/// fail at the first such block; with the bit it refuses the image at open,
/// naming the feature.
pub const REQ_STORED_DIGESTS: u64 = 1 << 0;

/// Required feature: reference blocks (codec 6, format.md §7.2), which
/// decode against another block of the image that the reference-base
/// section names.
pub const REQ_REF_BLOCKS: u64 = 1 << 1;

/// Required-feature bits known to this version (a reader refuses others).
pub const KNOWN_REQUIRED_FEATURES: u64 = REQ_STORED_DIGESTS | REQ_REF_BLOCKS;

/// The required features an image whose data blocks are `refs` has.
pub fn required_features_for(refs: &[crate::BlockRef]) -> u64 {
    let mut f = 0;
    if refs.iter().any(|r| r.codec.names_stored()) {
        f |= REQ_STORED_DIGESTS;
    }
    if refs.iter().any(|r| r.codec == crate::Codec::ZstdRef) {
        f |= REQ_REF_BLOCKS;
    }
    f
}

/// Optional feature: no inode of the image carries an xattr set. A reader
/// may answer "no xattrs" without looking (a mount then lets the kernel
/// stop asking); an image that sets it falsely only hides its xattrs.
pub const OPT_NO_XATTRS: u64 = 1 << 0;

/// Names of required features, for messages. Index = bit.
fn feature_name(bit: u32) -> String {
    match bit {
        0 => "stored-digests (data blocks named by their stored bytes)".into(),
        1 => "reference blocks (data blocks compressed against another block)".into(),
        _ => format!("feature bit {bit}"),
    }
}

/// The superblock: image geometry, counts and stream roots.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Superblock {
    /// Features a reader must know.
    pub required_features: u64,
    /// Features a reader may ignore.
    pub optional_features: u64,
    /// Uncompressed size of full data blocks.
    pub block_size: u32,
    /// Uncompressed size of full metadata pages.
    pub page_size: u32,
    /// Number of inodes.
    pub inode_count: u64,
    /// Number of distinct stored data blocks.
    pub block_count: u64,
    /// Number of chunk records.
    pub chunk_count: u64,
    /// Number of dirent records.
    pub dirent_count: u64,
    /// Sum of sizes of regular files (each inode once).
    pub logical_bytes: u64,
    /// Sum of the stored lengths of data blocks.
    pub stored_data_bytes: u64,
    /// Root directory inode.
    pub root_inode: u32,
    /// The five streams, in [`StreamId`] order.
    pub streams: [StreamDesc; 5],
}

impl Superblock {
    /// The descriptor of one stream.
    pub fn stream(&self, id: StreamId) -> &StreamDesc {
        &self.streams[id as usize]
    }

    /// Encode.
    pub fn encode(&self) -> Vec<u8> {
        let mut o = Vec::new();
        for v in [self.required_features, self.optional_features] {
            o.extend_from_slice(&v.to_le_bytes());
        }
        o.extend_from_slice(&self.block_size.to_le_bytes());
        o.extend_from_slice(&self.page_size.to_le_bytes());
        for v in [
            self.inode_count,
            self.block_count,
            self.chunk_count,
            self.dirent_count,
            self.logical_bytes,
            self.stored_data_bytes,
        ] {
            o.extend_from_slice(&v.to_le_bytes());
        }
        o.extend_from_slice(&self.root_inode.to_le_bytes());
        o.extend_from_slice(&(self.streams.len() as u32).to_le_bytes());
        for s in &self.streams {
            o.extend_from_slice(&s.len.to_le_bytes());
            o.extend_from_slice(&s.levels.to_le_bytes());
            o.extend_from_slice(&(s.roots.len() as u32).to_le_bytes());
            for r in &s.roots {
                o.extend_from_slice(&r.encode());
            }
        }
        o
    }

    /// Decode and validate everything that does not need other sections.
    pub fn decode(b: &[u8]) -> Result<Self, FormatError> {
        let mut c = Cursor::new(b, "superblock");
        let mut sb = Superblock {
            required_features: c.u64()?,
            optional_features: c.u64()?,
            block_size: c.u32()?,
            page_size: c.u32()?,
            inode_count: c.u64()?,
            block_count: c.u64()?,
            chunk_count: c.u64()?,
            dirent_count: c.u64()?,
            logical_bytes: c.u64()?,
            stored_data_bytes: c.u64()?,
            root_inode: c.u32()?,
            streams: Default::default(),
        };
        let unknown = sb.required_features & !KNOWN_REQUIRED_FEATURES;
        if unknown != 0 {
            return Err(FormatError::UnknownFeature(feature_name(
                unknown.trailing_zeros(),
            )));
        }
        let pow2_in = |v: u32, lo: u32, hi: u32| v.is_power_of_two() && (lo..=hi).contains(&v);
        if !pow2_in(sb.page_size, MIN_PAGE, MAX_PAGE) {
            return Err(FormatError::invalid("superblock", "page size"));
        }
        if !pow2_in(sb.block_size, MIN_BLOCK, MAX_BLOCK) {
            return Err(FormatError::invalid("superblock", "block size"));
        }
        if c.u32()? as usize != sb.streams.len() {
            return Err(FormatError::invalid("superblock", "stream count"));
        }
        for id in StreamId::ALL {
            let len = c.u64()?;
            let levels = c.u32()?;
            let n = c.u32()? as usize;
            let expect = level_lengths(len, sb.page_size);
            let want_levels = if len == 0 { 0 } else { expect.len() as u32 };
            let want_roots = page_count(*expect.last().expect("non-empty"), sb.page_size);
            if levels != want_levels || n as u64 != want_roots || levels > MAX_LEVELS {
                return Err(FormatError::invalid(
                    "superblock",
                    format!("geometry of the {}", id.name()),
                ));
            }
            let mut roots = Vec::with_capacity(n);
            for _ in 0..n {
                roots.push(BlockRef::decode(c.take(BLOCK_REF_LEN)?)?);
            }
            sb.streams[id as usize] = StreamDesc { len, levels, roots };
        }
        let expect_len = [
            (StreamId::Inodes, sb.inode_count, crate::InodeRecord::LEN),
            (StreamId::Chunks, sb.chunk_count, crate::ChunkRecord::LEN),
            (StreamId::Dirents, sb.dirent_count, crate::DirentRecord::LEN),
            (StreamId::Blocks, sb.block_count, BLOCK_REF_LEN),
        ];
        for (id, count, len) in expect_len {
            if count.checked_mul(len as u64) != Some(sb.stream(id).len) {
                return Err(FormatError::invalid(
                    "superblock",
                    format!("{} length does not match its count", id.name()),
                ));
            }
        }
        if sb.inode_count == 0
            || sb.inode_count > u32::MAX as u64
            || sb.block_count >= u32::MAX as u64
            || sb.root_inode as u64 >= sb.inode_count
        {
            return Err(FormatError::invalid("superblock", "counts"));
        }
        Ok(sb)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_grow_logarithmically() {
        assert_eq!(level_lengths(0, 65536), vec![0]);
        assert_eq!(level_lengths(64 * 65536, 65536).len(), 1);
        assert_eq!(level_lengths(65 * 65536, 65536), vec![65 * 65536, 65 * 48]);
        // 10^8 inodes of 64 bytes: 3 levels.
        assert_eq!(level_lengths(64 * 100_000_000, 65536).len(), 3);
    }

    #[test]
    fn superblock_round_trip() {
        let mut sb = Superblock {
            block_size: 1 << 20,
            page_size: 1 << 16,
            inode_count: 1,
            ..Default::default()
        };
        sb.streams[0] = StreamDesc {
            len: 64,
            levels: 1,
            roots: vec![BlockRef {
                hash: [3; 32],
                offset: 64,
                codec: crate::Codec::Zstd,
                clen: 5,
                ulen: 64,
            }],
        };
        let b = sb.encode();
        assert_eq!(Superblock::decode(&b).unwrap(), sb);
        for cut in 0..b.len() {
            assert!(Superblock::decode(&b[..cut]).is_err());
        }
        let mut unk = sb.clone();
        unk.required_features = 1 << 5;
        assert!(matches!(
            Superblock::decode(&unk.encode()),
            Err(FormatError::UnknownFeature(_))
        ));
        let mut known = sb.clone();
        known.required_features = REQ_STORED_DIGESTS;
        assert_eq!(Superblock::decode(&known.encode()).unwrap(), known);
    }

    #[test]
    fn stored_digest_blocks_require_the_feature() {
        use crate::{BlockRef, Codec};
        let r = |codec| BlockRef {
            hash: [0; 32],
            offset: 4096,
            codec,
            clen: 1,
            ulen: 1,
        };
        assert_eq!(required_features_for(&[]), 0);
        assert_eq!(required_features_for(&[r(Codec::Zstd), r(Codec::Lz4)]), 0);
        for c in [Codec::ZstdStored, Codec::ZstdDict] {
            assert_eq!(
                required_features_for(&[r(Codec::None), r(c)]),
                REQ_STORED_DIGESTS
            );
        }
    }
}
