//! The build-information section (format.md §4, section kind 2): what the
//! builder records about how an image was made. Informative only: a reader
//! never needs it to read the image, so a missing or unreadable section is
//! [`BuildInfo::default`], and every field is optional for images written
//! before it existed.
//!
//! The builder writes it, and `sheaf info`, `sheaf check`, `--base`,
//! `sheaf optimize`, `sheaf pool load` and the Python package read it, all
//! through this type. Fields are declared in sorted order: the section's
//! bytes are a JSON object with sorted keys (as earlier builders wrote it).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The build information of an image.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct BuildInfo {
    /// The image `--base` took unchanged files' blocks from (provenance).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base: Option<BaseInfo>,
    /// Uncompressed data block size.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub block_size: Option<u32>,
    /// The builder and its version, e.g. `sheaf 0.1.0`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub builder: Option<String>,
    /// `--clamp-mtime`, if given.
    pub clamp_mtime: Option<i64>,
    /// The compression as `--compression` spells it, e.g. `zstd:12`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compression: Option<String>,
    /// The dictionaries stored in the image.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub dictionaries: Vec<DictionaryInfo>,
    /// `--exclude` patterns.
    pub exclude: Option<Vec<String>>,
    /// Whether files of a pack or more that are versions of one file
    /// share blocks (`--no-group-blocks` turns it off).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group_blocks: Option<bool>,
    /// Labels the building tool records (`pool`: a software pool's
    /// NAME/VERSION, [`LABEL_POOL`]).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// `--mtime`, if given.
    pub mtime: Option<i64>,
    /// Set by `sheaf optimize` when it rewrote the image.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub optimized: Option<Optimized>,
    /// The packing order (`versions`, or `directory` as before it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub order: Option<String>,
    /// `--owner UID:GID`, if given.
    pub owner: Option<String>,
    /// Bytes packed into one block from small files.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pack_size: Option<u32>,
    /// Metadata page size.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub page_size: Option<u32>,
    /// How many data blocks are reference blocks (format.md §7.2).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ref_blocks: Option<u64>,
    /// `--ref-window`: bytes of recent blocks held as possible bases of
    /// reference blocks (0: none made).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ref_window: Option<u64>,
    /// What the build counted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stats: Option<BuildStats>,
    /// Fields this version does not know (a newer builder's), kept when
    /// the section is rewritten.
    #[serde(flatten)]
    pub other: BTreeMap<String, serde_json::Value>,
}

/// The label that holds a pool's NAME/VERSION.
pub const LABEL_POOL: &str = "pool";

/// What a build counted.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct BuildStats {
    /// Blocks per codec name (`none`: stored raw).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blocks_by_codec: Option<BTreeMap<String, u64>>,
    /// File data not stored again because identical data was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dedup_bytes: Option<u64>,
    /// Entries per type name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entries_by_type: Option<BTreeMap<String, u64>>,
    /// Inodes with more than one name (not directories).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hardlinked_inodes: Option<u64>,
    /// File data that is holes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hole_bytes: Option<u64>,
    /// Stored bytes of data blocks per codec name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stored_by_codec: Option<BTreeMap<String, u64>>,
    /// Distinct extended-attribute sets.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub xattr_sets: Option<u64>,
}

/// Provenance of a `--base` build.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct BaseInfo {
    /// `--base-max-stale`, percent.
    pub max_stale_pct: u8,
    /// The base image's root digest (hex).
    pub root: String,
}

/// A dictionary stored in the image.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DictionaryInfo {
    /// Its length.
    pub bytes: u64,
    /// Its digest (hex).
    pub digest: String,
}

/// What `sheaf optimize` did.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Optimized {
    /// The tool that rewrote it.
    pub by: String,
    /// The root digest of the image it was made from (hex).
    pub from_root: String,
    /// Blocks placed first and listed for prefetch.
    pub prefetch_blocks: u64,
}

impl BuildInfo {
    /// The section's bytes.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("plain data serializes")
    }

    /// The section read back; anything unreadable is the default (the
    /// section is informative only).
    pub fn decode(bytes: &[u8]) -> BuildInfo {
        serde_json::from_slice(bytes).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full() -> BuildInfo {
        BuildInfo {
            base: Some(BaseInfo {
                max_stale_pct: 20,
                root: "ab".into(),
            }),
            block_size: Some(1 << 20),
            builder: Some("sheaf 0".into()),
            clamp_mtime: None,
            compression: Some("zstd:12".into()),
            dictionaries: vec![DictionaryInfo {
                bytes: 3,
                digest: "cd".into(),
            }],
            exclude: Some(vec!["*.o".into()]),
            group_blocks: Some(true),
            labels: [("pool".to_string(), "a/1".to_string())].into(),
            mtime: Some(7),
            optimized: Some(Optimized::default()),
            order: Some("versions".into()),
            owner: None,
            pack_size: Some(4096),
            page_size: Some(65536),
            ref_blocks: Some(2),
            ref_window: Some(1 << 27),
            stats: Some(BuildStats {
                blocks_by_codec: Some([("zstd".to_string(), 2)].into()),
                dedup_bytes: Some(1),
                entries_by_type: Some([("file".to_string(), 2)].into()),
                hardlinked_inodes: Some(0),
                hole_bytes: Some(0),
                stored_by_codec: Some([("zstd".to_string(), 9)].into()),
                xattr_sets: Some(0),
            }),
            other: BTreeMap::new(),
        }
    }

    #[test]
    fn keys_are_written_sorted_as_before() {
        // A struct serializes in declaration order, a serde_json::Value
        // sorted: equal text means the fields are declared sorted.
        let b = full();
        let v = serde_json::to_value(&b).unwrap();
        assert_eq!(String::from_utf8(b.encode()).unwrap(), v.to_string());
    }

    #[test]
    fn round_trips_and_keeps_unknown_fields() {
        let mut b = full();
        b.other
            .insert("zzz_newer".into(), serde_json::json!({"x": 1}));
        assert_eq!(BuildInfo::decode(&b.encode()), b);
    }

    #[test]
    fn older_and_damaged_sections_read_as_defaults() {
        let old = br#"{"builder":"sheaf 0.0.1","compression":"zstd:3"}"#;
        let b = BuildInfo::decode(old);
        assert_eq!(b.compression.as_deref(), Some("zstd:3"));
        assert_eq!(b.pack_size, None);
        assert!(b.stats.is_none() && b.labels.is_empty());
        assert_eq!(BuildInfo::decode(b"\xff not json"), BuildInfo::default());
    }
}
