//! Container images as sheaf layers.
//!
//! Owns: image references, reading documents and blobs from registries,
//! OCI layouts and `docker save` archives ([`source`], [`registry`]), the
//! digests that make every byte checked ([`digest`]), the import pipeline
//! ([`import`]) and the repository names and image records it leaves
//! ([`record`]). Must not know: FUSE, namespaces, the CLI; the layer rules
//! (whiteouts) are sheaf-format's and apply unchanged, since sheaf layers
//! use OCI's names for them.
#![warn(missing_docs)]

pub mod digest;
pub mod error;
pub mod import;
pub mod record;
pub mod reference;
pub mod registry;
pub mod runtime;
pub mod source;

pub use digest::Digest;
pub use error::OciError;
pub use import::{
    host_platform, import, manifest_digest, ImportOptions, ImportReport, LayerReport,
};
pub use record::{BlobLink, ImageRecord, RecordLayer};
pub use reference::{Reference, Tagged};
pub use registry::{Registry, RegistryOptions};
pub use source::{DockerArchive, OciDir, Source};

/// The source a reference names.
pub fn open_source(r: &Reference, opts: &RegistryOptions) -> Result<Box<dyn Source>, OciError> {
    Ok(match r {
        Reference::Registry { host, repo, tagged } => {
            Box::new(Registry::new(host, repo, tagged.clone(), opts)?)
        }
        Reference::OciDir { dir, tag } => Box::new(OciDir::new(dir.clone(), tag.clone())),
        Reference::DockerArchive(p) => Box::new(DockerArchive::open(p)?),
    })
}
