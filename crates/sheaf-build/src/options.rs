//! Build options and the errors a build can raise.

use sheaf_format::Codec;
use thiserror::Error;

/// Default data block size: 4 MiB (chosen by measurement, see docs/design.md).
pub const DEFAULT_BLOCK_SIZE: u32 = 4 << 20;
/// Default pack-block size: 256 KiB (see [`BuildOptions::pack_size`]).
/// Chosen by measurement (bench/default-image.sh, docs/design.md): small
/// enough for random small-file reads at half the kernel's squashfs time
/// and lazy fetches of ≤ 15%, and, with a trained dictionary and files of a
/// pack or more in blocks of their own, still ≤ 0.95× mksquashfs-zstd.
pub const DEFAULT_PACK_SIZE: u32 = 256 << 10;
/// Default metadata page size.
pub const DEFAULT_PAGE_SIZE: u32 = 1 << 16;
/// Block and pack size of [`BuildOptions::archive`]: 64 MiB, the format's
/// largest block.
pub const ARCHIVE_BLOCK_SIZE: u32 = 64 << 20;

/// How many zstd levels higher a block is compressed once a later block
/// is compressed against it (a base of reference blocks, format.md §7.2:
/// in a pool, the first version of each large file, which does not shrink
/// through references and which every read of the later versions decodes).
/// Tree V at the default level 12, with [`VERSIONS_PACK_LEVEL_STEP`]:
/// 122.80 → 119.46 MB, build 20 → 40 s, where mksquashfs takes 45 s; the
/// same level for every block stored alone would cost K 62% and P 270%
/// more build time (docs/design.md, "Bases and packs of versions
/// compressed harder").
pub const BASE_LEVEL_STEP: i32 = 6;
/// How many zstd levels higher a pack that holds versions of a file side
/// by side is compressed ([`BASE_LEVEL_STEP`]'s measurement).
pub const VERSIONS_PACK_LEVEL_STEP: i32 = 4;
/// The highest level those steps raise to: zstd's highest without its
/// large-window "ultra" levels.
pub const RAISED_LEVEL_MAX: i32 = 19;

/// How blocks are compressed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compression {
    /// Candidate codecs with levels. One entry: that codec. Several (`auto`):
    /// each block keeps the smallest. A block no codec shrinks is stored raw.
    pub candidates: Vec<(Codec, i32)>,
}

impl Compression {
    /// Parse `CODEC[:LEVEL]`, where CODEC is zstd, lz4, xz, none or auto.
    pub fn parse(s: &str) -> Result<Self, String> {
        let (name, level) = match s.split_once(':') {
            Some((n, l)) => (
                n,
                Some(
                    l.parse::<i32>()
                        .map_err(|_| format!("bad compression level '{l}'"))?,
                ),
            ),
            None => (s, None),
        };
        if name == "auto" {
            let z = level.unwrap_or(Codec::Zstd.default_level());
            if !Codec::Zstd.level_range().contains(&z) {
                return Err(format!("auto level must be a zstd level 1..=22, not {z}"));
            }
            // The xz level follows the zstd level's intent: fast → 6, max → 9.
            let x = if z >= 19 { 9 } else { 6 };
            return Ok(Compression {
                candidates: vec![(Codec::Zstd, z), (Codec::Lz4, 0), (Codec::Xz, x)],
            });
        }
        let codec = Codec::from_name(name).ok_or_else(|| {
            format!("unknown codec '{name}' (choose zstd, lz4, xz, none or auto)")
        })?;
        let level = level.unwrap_or(codec.default_level());
        if !codec.level_range().contains(&level) {
            let r = codec.level_range();
            return Err(format!(
                "{name} level must be in {}..={}, not {level}",
                r.start(),
                r.end()
            ));
        }
        Ok(Compression {
            candidates: vec![(codec, level)],
        })
    }

    /// Zstd `step` levels higher, at most [`RAISED_LEVEL_MAX`] (a level
    /// above it is kept); other codecs as they are.
    pub fn raised(&self, step: i32) -> Compression {
        let up = |(c, l): (Codec, i32)| match c {
            Codec::Zstd if l < RAISED_LEVEL_MAX => (c, (l + step).min(RAISED_LEVEL_MAX)),
            _ => (c, l),
        };
        Compression {
            candidates: self.candidates.iter().copied().map(up).collect(),
        }
    }

    /// Text form, as accepted by [`Compression::parse`].
    pub fn describe(&self) -> String {
        if self.candidates.len() > 1 {
            return format!("auto:{}", self.candidates[0].1);
        }
        let (c, l) = self.candidates[0];
        match c {
            Codec::None | Codec::Lz4 => c.name().to_string(),
            _ => format!("{}:{l}", c.name()),
        }
    }
}

impl Default for Compression {
    fn default() -> Self {
        Compression {
            candidates: vec![(Codec::Zstd, Codec::Zstd.default_level())],
        }
    }
}

/// Everything that shapes an image. Two builds with equal options and input
/// produce identical bytes; `threads` does not change the output.
#[derive(Debug, Clone)]
pub struct BuildOptions {
    /// Data compression.
    pub compression: Compression,
    /// Data block size (power of two, 4 KiB..=64 MiB).
    pub block_size: u32,
    /// Size of the blocks that small files and tails are packed into
    /// (power of two, 4 KiB..=`block_size`; 0 = the block size): smaller
    /// makes a cold read of one small file cheaper, larger compresses better.
    pub pack_size: u32,
    /// Metadata page size (power of two, 4 KiB..=1 MiB).
    pub page_size: u32,
    /// Worker threads for compression (0 = all cores).
    pub threads: usize,
    /// Glob patterns of relative paths to leave out.
    pub exclude: Vec<String>,
    /// Force every owner to this uid:gid.
    pub owner: Option<(u32, u32)>,
    /// Force every mtime to this value.
    pub mtime: Option<i64>,
    /// Clamp mtimes later than this (SOURCE_DATE_EPOCH).
    pub clamp_mtime: Option<i64>,
    /// Continue past unreadable entries, reporting them at the end.
    pub skip_errors: bool,
    /// Replace an existing output file.
    pub force: bool,
    /// Files (paths relative to the source root) a workload reads first, in
    /// order: their data is placed first and contiguously, and their blocks
    /// are listed in the image's prefetch section for mounts to fetch ahead.
    pub prefetch: Vec<Vec<u8>>,
    /// Directories (relative paths) that start a new pack block: small files
    /// of one such directory never share a block with files outside it, so
    /// an unchanged directory keeps identical blocks when another changes
    /// (software pools: one per package version). Directory input only.
    pub pack_boundaries: Vec<Vec<u8>>,
    /// An earlier image of the same directory (`--base`): files unchanged
    /// since (same path, size, mtime, mode and owner) keep its stored
    /// blocks, copied without being read or recompressed (see
    /// [`crate::base`]). Directory input only.
    pub base: Option<std::path::PathBuf>,
    /// With `base`: the largest share (percent) of a copied block that may
    /// hold bytes no reused file uses (data of files changed or removed
    /// since); a block with more is not copied and its files are packed
    /// anew. 0 copies only blocks every file of which is unchanged.
    pub base_max_stale_pct: u8,
    /// Compress pack blocks with a zstd dictionary trained on the source's
    /// small files (zstd among the codecs; a tar stream is sampled from its
    /// start, see [`crate::dict::STREAM_HOLD_BYTES`]); with `base`, that
    /// image's dictionary is used instead of training one.
    pub dictionary: bool,
    /// Labels the tool that builds the image records in its build
    /// information (format.md §4, `labels`), e.g. `pool` = NAME/VERSION.
    /// They do not change how anything is read.
    pub labels: std::collections::BTreeMap<String, String>,
    /// How a directory's files are ordered for packing (by default the
    /// versions of one file together, [`crate::order`]).
    pub order: crate::order::PackOrder,
    /// Files of a pack or more that are versions of one another (one
    /// similarity group, [`crate::order::group_key`]) share blocks, up to
    /// the block size, instead of getting one each ([`crate::pack::Packer::set_group_of`]),
    /// and a pack that holds versions grows to four packs.
    /// Every input alike: the group comes from the path.
    pub group_blocks: bool,
    /// Bytes of recent blocks the builder holds as possible bases of
    /// reference blocks (format.md §7.2, [`crate::similar`]); 0 makes none.
    /// Files of more than a block and up to half of it are read whole and
    /// cut where they line up with those blocks. zstd only.
    pub ref_window: u64,
}

/// Default [`BuildOptions::ref_window`]: 128 MiB, the versions of a large
/// library (tree V's OpenBLAS builds are 22-36 MiB each) with room to spare.
pub const DEFAULT_REF_WINDOW: u64 = 128 << 20;

/// Default [`BuildOptions::base_max_stale_pct`]: a fifth (docs/build.md).
pub const DEFAULT_BASE_MAX_STALE_PCT: u8 = 20;

impl BuildOptions {
    /// The size pack blocks are cut at (`pack_size`, 0 meaning the block size).
    pub fn pack_block_size(&self) -> u32 {
        if self.pack_size == 0 {
            self.block_size
        } else {
            self.pack_size
        }
    }

    /// Whether pack blocks get a trained dictionary: asked for, and zstd
    /// among the codecs (the dictionary is zstd's).
    pub fn trains_dictionary(&self) -> bool {
        self.dictionary
            && self
                .compression
                .candidates
                .iter()
                .any(|(c, _)| *c == sheaf_format::Codec::Zstd)
    }

    /// The archive preset (`sheaf build --archive`): the smallest images,
    /// for images read whole or seldom. Blocks and packs of
    /// [`ARCHIVE_BLOCK_SIZE`] compressed with xz at level 9, so each pack is
    /// a 64 MiB stretch of the packing order in one xz window (every file
    /// under 64 MiB is packed): versions of a file side by side compress
    /// against each other. Tree V 99.7 MB, K 136.4 MB, against mkdwarfs -l9's
    /// 101.3 and 142.7 (docs/design.md, "Archives"); a read decodes its
    /// block up to 64 MiB, and the build holds about 0.7 GiB per thread
    /// (xz's level 9).
    pub fn archive() -> Self {
        BuildOptions {
            compression: Compression {
                candidates: vec![(Codec::Xz, 9)],
            },
            block_size: ARCHIVE_BLOCK_SIZE,
            pack_size: ARCHIVE_BLOCK_SIZE,
            ..Default::default()
        }
    }
}

impl Default for BuildOptions {
    fn default() -> Self {
        BuildOptions {
            compression: Compression::default(),
            block_size: DEFAULT_BLOCK_SIZE,
            pack_size: DEFAULT_PACK_SIZE,
            page_size: DEFAULT_PAGE_SIZE,
            threads: 0,
            exclude: Vec::new(),
            owner: None,
            mtime: None,
            clamp_mtime: None,
            skip_errors: false,
            force: false,
            prefetch: Vec::new(),
            pack_boundaries: Vec::new(),
            base: None,
            base_max_stale_pct: DEFAULT_BASE_MAX_STALE_PCT,
            dictionary: true,
            labels: Default::default(),
            order: Default::default(),
            group_blocks: true,
            ref_window: DEFAULT_REF_WINDOW,
        }
    }
}

/// Why a build failed.
#[derive(Debug, Error)]
pub enum BuildError {
    /// An input entry could not be read.
    #[error("{path}: {cause}")]
    Input {
        /// The entry.
        path: String,
        /// The cause.
        #[source]
        cause: std::io::Error,
    },
    /// The input is not something sheaf can pack.
    #[error("{path}: {detail}")]
    BadInput {
        /// The entry or archive.
        path: String,
        /// What is wrong.
        detail: String,
    },
    /// The input is neither a directory nor a tar archive (`kind`: what
    /// it is, when its first bytes say).
    #[error("{}", not_a_tar(path, *kind))]
    NotATar {
        /// The file given.
        path: String,
        /// What it is, if known.
        kind: Option<sheaf_format::ForeignKind>,
    },
    /// Writing the image failed.
    #[error("{path}: {cause}")]
    Output {
        /// The image being written.
        path: String,
        /// The cause.
        #[source]
        cause: std::io::Error,
    },
    /// The `--base` image could not be read, or a block of it failed its
    /// digest (the message names the image).
    #[error("base image {cause}")]
    Base {
        /// What went wrong, naming the image.
        #[source]
        cause: sheaf_read::ReadError,
    },
    /// The output exists and `force` was not given.
    #[error("{0}: already exists (use --force to replace it)")]
    Exists(String),
    /// An option is invalid.
    #[error("{0}")]
    Option(String),
    /// The build was interrupted by a signal.
    #[error("interrupted")]
    Interrupted,
}

/// The message of [`BuildError::NotATar`].
fn not_a_tar(path: &str, kind: Option<sheaf_format::ForeignKind>) -> String {
    use sheaf_format::ForeignKind as K;
    const TAKES: &str = "sheaf build takes a directory, a tar archive (plain or .gz, .zst, .xz, .bz2) or - for a tar on standard input";
    match kind {
        Some(K::SquashFs) => format!(
            "{path} is a SquashFS image, not a directory or a tar archive; convert it: \
             sqfs2tar {path} | sheaf build - -o IMAGE (sqfs2tar: Debian's squashfs-tools-ng)"
        ),
        Some(k) if k.is_compressed() => {
            format!(
                "{path} is {} that does not hold a tar archive; {TAKES}",
                k.describe()
            )
        }
        _ => format!("{path} is neither a directory nor a tar archive; {TAKES}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_codecs() {
        assert_eq!(
            Compression::parse("xz:9").unwrap().candidates,
            vec![(Codec::Xz, 9)]
        );
        assert_eq!(Compression::parse("lz4").unwrap().describe(), "lz4");
        assert_eq!(Compression::parse("auto").unwrap().candidates.len(), 3);
        assert!(Compression::parse("zstd:30").is_err());
        assert!(Compression::parse("gzip").is_err());
        assert!(Compression::parse("zstd:x").is_err());
    }
}
