//! A mount one process asks another to make, as one typed value: what to
//! open, each image pinned to the root digest the asker checked under the
//! policy, where to mount it, and how. `pool load` and the containerd
//! snapshotter build one and hand it to a child `sheaf mount --request -`
//! on its standard input, which parses it back; nobody rebuilds a command
//! line, and the child opens nothing but the roots it was given (a server
//! that changes the image between the check and the child's open gets a
//! refusal).
//!
//! The encoding is JSON with a version field; unknown fields are refused,
//! so a newer asker and an older child disagree loudly, not silently.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Version of the request document.
pub const REQUEST_VERSION: u32 = 1;

/// Largest request document read (a request names at most a few hundred
/// layers).
pub const MAX_REQUEST_LEN: usize = 1 << 20;

/// One image of a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestImage {
    /// What to open: a path or a URL, as the user named it.
    pub source: String,
    /// The root digest it must have, decided where it was opened first
    /// (`None`: not pinned, e.g. a layer the asker packed itself).
    #[serde(default, with = "hex_digest")]
    pub root: Option<[u8; 32]>,
}

/// A mount request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MountRequest {
    /// [`REQUEST_VERSION`].
    pub version: u32,
    /// The images, bottom first.
    pub images: Vec<RequestImage>,
    /// Where to mount (an existing directory).
    pub mountpoint: PathBuf,
    /// Make the mount writable through this directory.
    #[serde(default)]
    pub upper: Option<PathBuf>,
    /// Let other users in (`allow_other`).
    #[serde(default)]
    pub allow_other: bool,
    /// Honour setuid bits (root only).
    #[serde(default)]
    pub suid: bool,
    /// Honour device files (root only).
    #[serde(default)]
    pub dev: bool,
    /// Mirror base URLs for the images' URLs, as the user gave them. They
    /// may hold credentials, which is why they travel in the request and
    /// never on the child's command line; sheaf-mount does not read them
    /// (the opener does).
    #[serde(default)]
    pub mirrors: Vec<String>,
    /// The proxy list, as the user gave it (credentials and all); as
    /// `mirrors`.
    #[serde(default)]
    pub proxy: Option<String>,
    /// The first open of a URL image waits, with the usual backoff, up to
    /// the mount's timeout for a server that refuses connections or does
    /// not answer, as for one lost after it was reached, instead of
    /// failing at once (`sheaf mount --wait-for-server`; e.g. a job that
    /// starts while the site's web server restarts). Refusals waiting
    /// cannot change (404, 403, a bad certificate, …) still fail at once.
    #[serde(default)]
    pub wait_for_server: bool,
}

/// Why a request could not be read.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// Not a request document.
    #[error("mount request: {0}")]
    Bad(String),
}

impl MountRequest {
    /// A request for `images` at `mountpoint`, read-only, private.
    pub fn new(images: Vec<RequestImage>, mountpoint: PathBuf) -> MountRequest {
        MountRequest {
            version: REQUEST_VERSION,
            images,
            mountpoint,
            upper: None,
            allow_other: false,
            suid: false,
            dev: false,
            mirrors: Vec::new(),
            proxy: None,
            wait_for_server: false,
        }
    }

    /// The document a child reads.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a request serializes")
    }

    /// Parse a request (untrusted bytes: it may come from a file the user
    /// names).
    pub fn decode(bytes: &[u8]) -> Result<MountRequest, RequestError> {
        if bytes.len() > MAX_REQUEST_LEN {
            return Err(RequestError::Bad(format!(
                "{} bytes (at most {MAX_REQUEST_LEN})",
                bytes.len()
            )));
        }
        let r: MountRequest =
            serde_json::from_slice(bytes).map_err(|e| RequestError::Bad(e.to_string()))?;
        if r.version != REQUEST_VERSION {
            return Err(RequestError::Bad(format!(
                "version {} (this sheaf reads {REQUEST_VERSION})",
                r.version
            )));
        }
        if r.images.is_empty() {
            return Err(RequestError::Bad("no images".into()));
        }
        Ok(r)
    }

    /// The pins, by image position.
    pub fn pins(&self) -> Vec<Option<[u8; 32]>> {
        self.images.iter().map(|i| i.root).collect()
    }
}

/// A root digest as 64 lowercase hex digits, or null.
mod hex_digest {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Option<[u8; 32]>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_str(&sheaf_format::hex(d)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<[u8; 32]>, D::Error> {
        let Some(s) = Option::<String>::deserialize(d)? else {
            return Ok(None);
        };
        sheaf_format::unhex(&s)
            .map(Some)
            .ok_or_else(|| serde::de::Error::custom(format!("root {s:?}: not 64 hex digits")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_round_trips_and_hostile_ones_are_refused() {
        let mut r = MountRequest::new(
            vec![
                RequestImage {
                    source: "https://u:p@host/repo/layer-sha256-ab".into(),
                    root: Some([0xab; 32]),
                },
                RequestImage {
                    source: "/var/lib/sheaf/packed,with,commas.sheaf".into(),
                    root: None,
                },
            ],
            PathBuf::from("/run/sheaf/snapshots/7/fs"),
        );
        r.upper = Some(PathBuf::from("/run/sheaf/snapshots/7/upper"));
        r.allow_other = true;
        r.suid = true;
        let bytes = r.encode();
        assert_eq!(MountRequest::decode(&bytes).unwrap(), r);
        assert_eq!(r.pins(), vec![Some([0xab; 32]), None]);
        // The root is spelled as `sheaf root` spells its hex.
        let text = String::from_utf8(bytes).unwrap();
        assert!(text.contains(&"ab".repeat(32)), "{text}");
        for bad in [
            text.replace(&"ab".repeat(32), &"ab".repeat(31)),
            text.replace(&"ab".repeat(32), &"zz".repeat(32)),
            text.replace("\"version\":1", "\"version\":2"),
            text.replace("\"suid\":true", "\"suid\":true,\"exec_as\":\"root\""),
            r#"{"version":1,"images":[],"mountpoint":"/x"}"#.to_string(),
            "not json".to_string(),
        ] {
            let e = MountRequest::decode(bad.as_bytes())
                .unwrap_err()
                .to_string();
            assert!(e.starts_with("mount request: ") && !e.contains('\n'), "{e}");
        }
        assert!(MountRequest::decode(&vec![b' '; MAX_REQUEST_LEN + 1]).is_err());
    }

    #[test]
    fn a_request_without_wait_for_server_still_parses_and_the_switch_round_trips() {
        // A request from an older asker (no `wait_for_server`) is read as
        // it always was: fail at once for a server never reached.
        let old = r#"{"version":1,"images":[{"source":"http://h/img.sheaf"}],"mountpoint":"/mnt","mirrors":[],"proxy":null}"#;
        let r = MountRequest::decode(old.as_bytes()).unwrap();
        assert!(!r.wait_for_server);
        assert_eq!(r.images[0].root, None);
        let on = old.replace("\"proxy\":null", "\"proxy\":null,\"wait_for_server\":true");
        let mut r = MountRequest::decode(on.as_bytes()).unwrap();
        assert!(r.wait_for_server);
        r.wait_for_server = true;
        assert_eq!(MountRequest::decode(&r.encode()).unwrap(), r);
        // Not a boolean: refused, in one line.
        let bad = old.replace(
            "\"proxy\":null",
            "\"proxy\":null,\"wait_for_server\":\"yes\"",
        );
        let e = MountRequest::decode(bad.as_bytes())
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("mount request: ") && !e.contains('\n'), "{e}");
    }
}
