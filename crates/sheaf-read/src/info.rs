//! What an image says about itself: the fields of `sheaf info --json`, in
//! one place for the CLI and the Python package.

use crate::error::ReadError;
use crate::image::Image;
use serde::Serialize;
use sheaf_format::layers::{parse, Name};
use sheaf_format::{hex, FileType, StreamId};
use std::collections::BTreeMap;

/// Paths hidden by whiteouts in `img`, and its opaque directories, sorted.
pub fn whiteouts(img: &Image) -> Result<(Vec<String>, Vec<String>), ReadError> {
    let (mut wh, mut opaque) = (Vec::new(), Vec::new());
    let mut todo = vec![(img.root()?, Vec::<u8>::new())];
    let mut seen = crate::Seen::new(img);
    while let Some((dir, prefix)) = todo.pop() {
        seen.enter(img, &dir)?;
        let n = img.dir_len(&dir)?;
        for e in img.read_dir(&dir, 0, n as usize)? {
            let full = join_name(&prefix, &e.name);
            match parse(&e.name) {
                Name::Opaque => opaque.push(
                    String::from_utf8_lossy(if prefix.is_empty() { b"/" } else { &prefix })
                        .into_owned(),
                ),
                Name::Whiteout(t) => {
                    wh.push(String::from_utf8_lossy(&join_name(&prefix, t)).into_owned())
                }
                Name::Plain(_) if e.file_type == FileType::Directory => {
                    todo.push((img.child(&dir, e.ino, e.file_type)?, full));
                }
                Name::Plain(_) => {}
            }
        }
    }
    wh.sort();
    opaque.sort();
    Ok((wh, opaque))
}

/// `prefix/name`, or `name` when `prefix` is empty: a path below a start.
pub fn join_name(prefix: &[u8], name: &[u8]) -> Vec<u8> {
    let mut full = prefix.to_vec();
    if !full.is_empty() {
        full.push(b'/');
    }
    full.extend_from_slice(name);
    full
}

/// What `sheaf info --json` prints about one image (docs/json.md). Fields
/// are declared in sorted order, as the command has always printed them;
/// those from the build information are null for images that do not
/// record them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ImageInfo {
    /// Data block size.
    pub block_size: u32,
    /// Data blocks.
    pub blocks: u64,
    /// Blocks per codec name.
    pub blocks_by_codec: Option<BTreeMap<String, u64>>,
    /// Part of the build information.
    pub build: BuildSummary,
    /// Logical bytes / image bytes.
    pub compression_ratio: f64,
    /// File data not stored twice.
    pub dedup_bytes: Option<u64>,
    /// Entries per type name.
    pub entries_by_type: Option<BTreeMap<String, u64>>,
    /// Inodes with more than one name.
    pub hardlinked_inodes: Option<u64>,
    /// File data that is holes.
    pub hole_bytes: Option<u64>,
    /// The image as the user named it.
    pub image: String,
    /// Its length.
    pub image_bytes: u64,
    /// Inodes.
    pub inodes: u64,
    /// File data.
    pub logical_bytes: u64,
    /// The metadata streams' uncompressed bytes.
    pub metadata_bytes_uncompressed: u64,
    /// Opaque directories, when asked for.
    pub opaque_dirs: Option<Vec<String>>,
    /// Metadata page size.
    pub page_size: u32,
    /// Blocks listed for prefetch.
    pub prefetch_blocks: u64,
    /// The root digest (hex).
    pub root_digest: String,
    /// The section table.
    pub sections: Vec<SectionInfo>,
    /// Stored signatures, described (not verified).
    pub signatures: Vec<SignatureInfo>,
    /// Stored bytes of data blocks per codec name (none for images built
    /// before it was recorded).
    pub stored_by_codec: Option<BTreeMap<String, u64>>,
    /// Compressed file data.
    pub stored_data_bytes: u64,
    /// Paths hidden by whiteouts, when asked for.
    pub whiteouts: Option<Vec<String>>,
}

/// The fields of the build information `sheaf info` shows.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BuildSummary {
    /// The builder and its version.
    pub builder: Option<String>,
    /// `--clamp-mtime`.
    pub clamp_mtime: Option<i64>,
    /// The compression.
    pub compression: Option<String>,
    /// `--exclude` patterns.
    pub exclude: Option<Vec<String>>,
    /// `--mtime`.
    pub mtime: Option<i64>,
    /// `--owner`.
    pub owner: Option<String>,
}

/// One entry of the section table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SectionInfo {
    /// Section kind id.
    pub kind: u32,
    /// Its length.
    pub length: u64,
    /// Its offset.
    pub offset: u64,
    /// Whether a reader must understand it.
    pub required: bool,
}

/// A stored signature as described by its parser (`sheaf_trust::describe`;
/// this crate does not parse signatures), or why it could not be.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum SignatureInfo {
    /// Algorithm, key fingerprint and namespace.
    Described {
        /// Key algorithm.
        algorithm: String,
        /// Key fingerprint.
        key: String,
        /// Signature namespace.
        namespace: String,
    },
    /// Not parsed.
    Unreadable {
        /// Why.
        error: String,
    },
}

impl SignatureInfo {
    /// From what a signature parser says.
    pub fn of<E: std::fmt::Display>(d: Result<(String, String, String), E>) -> SignatureInfo {
        match d {
            Ok((algorithm, key, namespace)) => SignatureInfo::Described {
                algorithm,
                key,
                namespace,
            },
            Err(e) => SignatureInfo::Unreadable {
                error: e.to_string(),
            },
        }
    }
}

/// What `sheaf info --json` says about `img`, named `name` (as the user
/// gave it). `whiteouts`: the result of [`whiteouts`] when the caller wants
/// them listed (else those fields are null). `signature` describes one
/// stored signature.
pub fn info(
    img: &Image,
    name: &str,
    whiteouts: Option<&(Vec<String>, Vec<String>)>,
    signature: &dyn Fn(&[u8]) -> SignatureInfo,
) -> Result<ImageInfo, ReadError> {
    let sb = img.superblock();
    let build = img.build_info()?;
    let stats = build.stats.unwrap_or_default();
    Ok(ImageInfo {
        image: name.to_string(),
        image_bytes: img.len(),
        root_digest: hex(&img.root_digest()),
        inodes: sb.inode_count,
        entries_by_type: stats.entries_by_type,
        hardlinked_inodes: stats.hardlinked_inodes,
        logical_bytes: sb.logical_bytes,
        stored_data_bytes: sb.stored_data_bytes,
        compression_ratio: sb.logical_bytes as f64 / img.len().max(1) as f64,
        dedup_bytes: stats.dedup_bytes,
        hole_bytes: stats.hole_bytes,
        blocks: sb.block_count,
        blocks_by_codec: stats.blocks_by_codec,
        stored_by_codec: stats.stored_by_codec,
        block_size: sb.block_size,
        page_size: sb.page_size,
        metadata_bytes_uncompressed: StreamId::ALL.iter().map(|&id| sb.stream(id).len).sum(),
        build: BuildSummary {
            builder: build.builder,
            compression: build.compression,
            owner: build.owner,
            mtime: build.mtime,
            clamp_mtime: build.clamp_mtime,
            exclude: build.exclude,
        },
        signatures: img.signatures().iter().map(|s| signature(s)).collect(),
        prefetch_blocks: img.prefetch_list()?.len() as u64,
        whiteouts: whiteouts.map(|w| w.0.clone()),
        opaque_dirs: whiteouts.map(|w| w.1.clone()),
        sections: img
            .sections()
            .iter()
            .map(|s| SectionInfo {
                kind: s.kind.id(),
                required: s.required(),
                offset: s.offset,
                length: s.length,
            })
            .collect(),
    })
}

/// What `sheaf info --json BASE,LAYER,...` prints (docs/json.md): the
/// merged tree's figures and each layer's [`ImageInfo`], bottom first.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StackInfo {
    /// The stack as the user named it.
    pub stack: String,
    /// Each layer, bottom first, as `sheaf info --json` describes it alone.
    pub layers: Vec<ImageInfo>,
    /// The tree the stack shows.
    pub merged: MergedInfo,
}

/// The merged tree of a stack: what a mount of it shows.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MergedInfo {
    /// Inodes shown (a hardlinked file once, the root included).
    pub inodes: u64,
    /// Inodes shown per type name (as [`ImageInfo::entries_by_type`]).
    pub entries_by_type: BTreeMap<String, u64>,
    /// File data shown (a hardlinked file once).
    pub logical_bytes: u64,
    /// The layers' inodes that do not show: hidden by whiteouts, replaced
    /// by a higher layer's entry, merged into a higher layer's directory,
    /// or whiteouts themselves (the layers' `inodes` added up, less
    /// `inodes`).
    pub hidden_inodes: u64,
    /// The layers' image bytes added up.
    pub image_bytes: u64,
}

/// [`StackInfo`] of `stack`, named `name`, from its layers' [`ImageInfo`]
/// (bottom first): walks the merged tree once.
pub fn stack_info(
    stack: &crate::Stack,
    name: &str,
    layers: Vec<ImageInfo>,
) -> Result<StackInfo, ReadError> {
    let mut seen = std::collections::HashSet::new();
    let mut by_type = BTreeMap::<String, u64>::new();
    let mut logical = 0u64;
    stack.walk_in(
        crate::Order::Pre,
        crate::Found::Dir(stack.root()?),
        b"/".to_vec(),
        &mut |_, f, _| {
            let (l, ino) = f.shown();
            // A directory counts once, from its top layer, however many
            // layers it merges; a file once however many names it has.
            if seen.insert((l, ino.ino)) {
                *by_type
                    .entry(ino.file_type().name().to_string())
                    .or_default() += 1;
                if ino.file_type() == sheaf_format::FileType::Regular {
                    logical += ino.rec.size;
                }
            }
            Ok(crate::Step::Continue)
        },
    )?;
    let inodes = seen.len() as u64;
    Ok(StackInfo {
        stack: name.to_string(),
        merged: MergedInfo {
            inodes,
            entries_by_type: by_type,
            logical_bytes: logical,
            hidden_inodes: layers
                .iter()
                .map(|l| l.inodes)
                .sum::<u64>()
                .saturating_sub(inodes),
            image_bytes: layers.iter().map(|l| l.image_bytes).sum(),
        },
        layers,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_print_sorted_as_before() {
        // A struct serializes in declaration order, a serde_json::Value
        // sorted: equal text means `sheaf info --json` is unchanged.
        let i = ImageInfo {
            block_size: 1,
            blocks: 2,
            blocks_by_codec: Some([("zstd".to_string(), 2)].into()),
            stored_by_codec: None,
            build: BuildSummary {
                builder: Some("sheaf".into()),
                clamp_mtime: None,
                compression: Some("zstd:3".into()),
                exclude: Some(vec![]),
                mtime: Some(1),
                owner: None,
            },
            compression_ratio: 1.5,
            dedup_bytes: Some(3),
            entries_by_type: None,
            hardlinked_inodes: Some(0),
            hole_bytes: None,
            image: "i".into(),
            image_bytes: 9,
            inodes: 4,
            logical_bytes: 5,
            metadata_bytes_uncompressed: 6,
            opaque_dirs: Some(vec!["/a".into()]),
            page_size: 7,
            prefetch_blocks: 0,
            root_digest: "00".into(),
            sections: vec![SectionInfo {
                kind: 2,
                length: 3,
                offset: 4,
                required: false,
            }],
            signatures: vec![
                SignatureInfo::of(Ok::<_, String>(("a".into(), "k".into(), "n".into()))),
                SignatureInfo::of(Err::<(String, String, String), _>("bad")),
            ],
            stored_data_bytes: 8,
            whiteouts: None,
        };
        let v = serde_json::to_value(&i).unwrap();
        assert_eq!(serde_json::to_string(&i).unwrap(), v.to_string());
        assert_eq!(v["signatures"][1]["error"], "bad");
    }
}
