//! Why an import failed.

use std::io;

/// Why reading or importing a container image failed. Each names the thing
/// (a reference, a blob, a file) and the problem.
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    /// The reference is not one of the accepted forms.
    #[error("'{0}' is not an image reference (docker://HOST[:PORT]/REPO[:TAG|@sha256:HEX], oci:DIR[:TAG] or docker-archive:FILE)")]
    BadRef(String),
    /// Reading a file or stream failed.
    #[error("{what}")]
    Io {
        /// What was being read or written.
        what: String,
        /// Why.
        #[source]
        cause: io::Error,
    },
    /// A document (manifest, index, config) is malformed or unsupported.
    #[error("{what}: {detail}")]
    Bad {
        /// The document.
        what: String,
        /// What is wrong.
        detail: String,
    },
    /// Content does not match the digest that names it.
    #[error("{what}: content does not match its digest (expected {expected}, got {got}); nothing was kept")]
    Digest {
        /// The blob or layer.
        what: String,
        /// The digest it should have.
        expected: String,
        /// The digest it has.
        got: String,
    },
    /// The registry refused or failed a request.
    #[error("{url}: {detail}")]
    Registry {
        /// The request.
        url: String,
        /// The status or problem, readable.
        detail: String,
    },
    /// The index offers no image for the wanted platform.
    #[error("{what}: no image for platform {want} (it has: {have})")]
    Platform {
        /// The index.
        what: String,
        /// The platform asked for.
        want: String,
        /// The platforms offered.
        have: String,
    },
    /// Packing a layer failed.
    #[error(transparent)]
    Build(#[from] sheaf_build::BuildError),
    /// Reading a built layer failed.
    #[error(transparent)]
    Read(#[from] sheaf_read::ReadError),
    /// Writing into the repository failed.
    #[error(transparent)]
    Publish(#[from] sheaf_net::PublishError),
}

impl OciError {
    pub(crate) fn io(what: impl Into<String>, cause: io::Error) -> OciError {
        OciError::Io {
            what: what.into(),
            cause,
        }
    }
    pub(crate) fn bad(what: impl Into<String>, detail: impl Into<String>) -> OciError {
        OciError::Bad {
            what: what.into(),
            detail: detail.into(),
        }
    }
}

/// Results of this crate.
pub type Result<T, E = OciError> = std::result::Result<T, E>;
