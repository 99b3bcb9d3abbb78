//! What an import leaves in a sheaf repository besides the layers: the
//! names of everything, and the image record. docs/containers.md is the
//! specification; this module is its one home in code.
//!
//! ```text
//! REPO/layer-sha256-DIFFID        a layer's image index (sheaf publish form)
//! REPO/blob-sha256-BLOB.json      which layer a compressed blob unpacks to
//! REPO/image-sha256-MANIFEST.json the image record
//! REPO/objects/…                  shared by all of them
//! ```
//!
//! A layer is named by its diffID (the digest of the uncompressed tar), so
//! the gzip and zstd encodings of one layer are one sheaf layer. Files are
//! written in that order — layers, then blob links, then the record — each
//! by atomic rename, so a reader that finds a record finds its layers.

use crate::digest::Digest;
use serde::{Deserialize, Serialize};

/// Version of the record and blob-link documents.
pub const RECORD_SCHEMA: u32 = 1;

/// The repository name of the layer with this diffID.
pub fn layer_name(diff_id: &Digest) -> String {
    format!("layer-{}", diff_id.file_form())
}

/// The file saying which layer a compressed blob unpacks to.
pub fn blob_link_name(blob: &Digest) -> String {
    format!("blob-{}.json", blob.file_form())
}

/// The image record of a manifest.
pub fn record_name(manifest: &Digest) -> String {
    format!("image-{}.json", manifest.file_form())
}

/// The recorded prefetch list of a manifest: the files its containers read
/// first, one path per line (as `sheaf mount -o record=` writes), which
/// the snapshotter fetches into the node cache while the image is pulled.
pub fn prefetch_name(manifest: &Digest) -> String {
    format!("prefetch-{}.txt", manifest.file_form())
}

/// Where in a flattened image the image's own documents are kept, after
/// Apptainer's `/.singularity.d`: `config.json` (the config, byte for byte)
/// and `image.json` (the [`ImageRecord`]).
pub const FLAT_DIR: &str = ".sheaf.d";

impl Serialize for Digest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Digest::parse(&s)
            .ok_or_else(|| serde::de::Error::custom(format!("not a sha256 digest: {s}")))
    }
}

/// One layer of an image, as the record lists it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct RecordLayer {
    /// The blob's digest (of the bytes a registry serves).
    pub blob: Digest,
    /// The blob's media type.
    pub media_type: String,
    /// The blob's size in bytes.
    pub size: u64,
    /// The digest of the uncompressed tar.
    pub diff_id: Digest,
    /// The sheaf layer's repository name ([`layer_name`]).
    pub layer: String,
    /// The sheaf layer's root digest (`blake3:HEX`), so a signed record
    /// vouches for every byte of its layers (absent in records written
    /// before it existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root: Option<String>,
}

/// The message a signature of an image record signs: the BLAKE3 digest of
/// the record file's bytes, in a form no image root message can take.
pub fn signed_message(record_bytes: &[u8]) -> String {
    format!(
        "sheaf-oci-record-v1 blake3:{}\n",
        sheaf_format::hex(&sheaf_format::digest(record_bytes))
    )
}

/// Everything needed to run an image from its sheaf layers.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ImageRecord {
    /// [`RECORD_SCHEMA`].
    pub schema: u32,
    /// The reference it was imported from.
    pub source: String,
    /// The manifest's digest.
    pub manifest: Digest,
    /// The manifest's media type.
    pub manifest_media_type: String,
    /// `os/arch[/variant]`.
    pub platform: String,
    /// The config's digest.
    pub config_digest: Digest,
    /// The config (its bytes hash to `config_digest`).
    pub config_bytes_b64: String,
    /// The layers, bottom first.
    pub layers: Vec<RecordLayer>,
}

/// The link from a compressed blob to its layer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct BlobLink {
    /// [`RECORD_SCHEMA`].
    pub schema: u32,
    /// The digest of the uncompressed tar.
    pub diff_id: Digest,
    /// The sheaf layer's repository name.
    pub layer: String,
}

impl BlobLink {
    /// Read a blob link from a repository (untrusted bytes): the schema is
    /// known and `layer` is exactly the name [`layer_name`] gives its
    /// `diff_id`, so a link can name nothing but a layer file beside it
    /// (not `../elsewhere`, not another layer).
    pub fn parse(bytes: &[u8]) -> Result<BlobLink, crate::OciError> {
        let l: BlobLink = serde_json::from_slice(bytes)
            .map_err(|e| crate::OciError::bad("blob link", e.to_string()))?;
        if l.schema != RECORD_SCHEMA {
            return Err(crate::OciError::bad(
                "blob link",
                format!("schema {} (this sheaf reads {RECORD_SCHEMA})", l.schema),
            ));
        }
        let want = layer_name(&l.diff_id);
        if l.layer != want {
            return Err(crate::OciError::bad(
                "blob link",
                format!("names layer '{}', not {want}", l.layer.escape_debug()),
            ));
        }
        Ok(l)
    }
}

#[cfg(test)]
mod blob_link_tests {
    use super::*;

    #[test]
    fn a_blob_link_names_only_its_own_layer() {
        let d = "sha256:".to_string() + &"ab".repeat(32);
        let good = format!(
            r#"{{"schema":1,"diff_id":"{d}","layer":"layer-sha256-{}"}}"#,
            "ab".repeat(32)
        );
        let l = BlobLink::parse(good.as_bytes()).unwrap();
        assert_eq!(l.layer, format!("layer-sha256-{}", "ab".repeat(32)));
        for layer in [
            "../../etc/passwd".to_string(),
            format!("layer-sha256-{}/../x", "ab".repeat(32)),
            format!("layer-sha256-{}", "cd".repeat(32)),
            "https://elsewhere/layer".to_string(),
            String::new(),
        ] {
            let bad = serde_json::json!({"schema": 1, "diff_id": d, "layer": layer}).to_string();
            let e = BlobLink::parse(bad.as_bytes()).unwrap_err().to_string();
            assert!(e.contains("blob link") && !e.contains('\n'), "{layer}: {e}");
        }
        let v2 = good.replace(r#""schema":1"#, r#""schema":2"#);
        assert!(BlobLink::parse(v2.as_bytes()).is_err());
    }
}
