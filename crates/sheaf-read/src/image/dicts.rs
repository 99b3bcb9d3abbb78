//! Where a reader finds the dictionaries its blocks name: the image's own
//! dictionary section, then the node's object store or, for a repository,
//! the object of the dictionary's digest (checked against it).

use super::Image;
use sheaf_format::dict::{DictLookup, Dictionary};
use sheaf_format::remote;
use sheaf_format::{hex, BlockRef, Digest, FormatError};
use std::sync::Arc;

/// Blocks of an image find their dictionaries through [`Image::dictionary`].
impl DictLookup for Image {
    fn dictionary(&self, d: &Digest) -> Option<Arc<Dictionary>> {
        Image::dictionary(self, d)
    }

    /// The base the reference-base section lists for content `d`, decoded
    /// whole through the block cache. A base that is itself a reference
    /// block is refused (one level deep: a read costs at most one more
    /// block, and no chain or cycle is ever followed).
    fn reference(&self, d: &Digest) -> Result<Arc<Vec<u8>>, FormatError> {
        let missing = |why: String| FormatError::MissingReference(format!("{}: {why}", hex(d)));
        let id = self
            .ref_base(d)
            .ok_or_else(|| missing("the image lists no block with it".into()))?;
        let r = self.block_ref(id).map_err(|e| missing(e.to_string()))?;
        if r.codec == sheaf_format::Codec::ZstdRef {
            return Err(FormatError::invalid(
                "reference block",
                format!("its base, data block {id}, is a reference block itself"),
            ));
        }
        self.block(id).map_err(|e| missing(e.to_string()))
    }

    /// The base for `d` is one block, whose stored bytes are checked
    /// against its ref whenever it is decoded: once its content was found
    /// to have digest `d`, it always has.
    fn reference_known(&self, d: &Digest) -> bool {
        self.bases_checked.lock().expect("lock").contains(d)
    }

    fn reference_checked(&self, d: &Digest) {
        self.bases_checked.lock().expect("lock").insert(*d);
    }
}

impl Image {
    /// The reference-base section: the blocks reference blocks are
    /// compressed against, with their content digests.
    pub fn ref_bases(&self) -> &[sheaf_format::reference::Base] {
        &self.bases
    }

    /// The block the reference-base section lists for content digest `d`.
    pub fn ref_base(&self, d: &Digest) -> Option<u32> {
        self.bases_by_digest.get(d).copied()
    }

    /// The dictionaries this image carries (its dictionary section).
    pub fn dictionaries(&self) -> &[Arc<Dictionary>] {
        &self.dicts
    }

    /// Dictionaries not in the image that its blocks' objects named (from a
    /// shared store or repository), found so far.
    pub fn foreign_dictionaries(&self) -> Vec<Arc<Dictionary>> {
        self.foreign.lock().expect("lock").clone()
    }

    /// The dictionary with digest `d`: the image's own, or one a shared
    /// object named, found in the object store or, from a repository, as
    /// the object of that digest (checked against it). `None` if nowhere.
    pub fn dictionary(&self, d: &Digest) -> Option<Arc<Dictionary>> {
        if let Some(x) = self.dicts.as_slice().dictionary(d) {
            return Some(x);
        }
        if let Some(x) = self.foreign.lock().expect("lock").as_slice().dictionary(d) {
            return Some(x);
        }
        // A dictionary travels as the object of its digest, stored as is
        // (codec 0: format.md §13), and is checked against that digest.
        let decode = |codec: sheaf_format::Codec, b: &[u8]| -> Option<Dictionary> {
            let x = (codec == sheaf_format::Codec::None)
                .then(|| Dictionary::new(b.to_vec()).ok())??;
            (x.digest() == d).then_some(x)
        };
        let found = self
            .store
            .as_ref()
            .and_then(|s| s.get(&sheaf_format::content_key(d)))
            .and_then(|obj| {
                let (codec, b) = remote::decode_object(&obj).ok()?;
                decode(codec, b)
            })
            .or_else(|| {
                if self.src.ranged() {
                    return None; // an image file holds no objects by digest
                }
                let r = BlockRef {
                    hash: *d,
                    offset: 0,
                    codec: sheaf_format::Codec::None,
                    clen: 0,
                    ulen: 0,
                };
                let (codec, b) = self.src.read_object(&r).ok()?;
                let x = decode(codec, &b)?;
                if let Some(s) = &self.store {
                    s.put(
                        &sheaf_format::content_key(d),
                        &remote::encode_object(sheaf_format::Codec::None, x.bytes()),
                    );
                }
                Some(x)
            })?;
        let found = Arc::new(found);
        self.foreign.lock().expect("lock").push(found.clone());
        Some(found)
    }
}
