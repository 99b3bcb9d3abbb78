//! Container image input: hostile manifests/indexes, configs and layer tars.
//! The first byte picks what the rest is:
//! 0 — the document a registry answers (manifest or index), resolved;
//! 1 — an image config, read as `sheaf run --image` reads it (with the rest
//!     also standing in for /etc/passwd and /etc/group);
//! else — an uncompressed layer, with a manifest and config made here whose
//!     digests match, imported and flattened (so the tar reader in layer
//!     mode, the digest pipeline and the merge all see it).
//! Nothing may panic, hang or write outside the temporary directory.
#![no_main]
use libfuzzer_sys::fuzz_target;
use sheaf_oci::source::Fetched;
use sheaf_oci::{Digest, ImportOptions, OciError, Source};
use std::collections::HashMap;
use std::io::Read;

struct Mem {
    top: Vec<u8>,
    blobs: HashMap<Digest, Vec<u8>>,
}

impl Source for Mem {
    fn name(&self) -> String {
        "fuzz".into()
    }
    fn top(&self) -> Result<Fetched, OciError> {
        Ok(Fetched {
            bytes: self.top.clone(),
            media_type: None,
        })
    }
    fn blob(&self, d: &Digest) -> Result<Box<dyn Read + Send>, OciError> {
        match self.blobs.get(d) {
            Some(b) => Ok(Box::new(std::io::Cursor::new(b.clone()))),
            None => Err(OciError::Bad {
                what: d.to_string(),
                detail: "no such blob".into(),
            }),
        }
    }
}

fn run(data: &[u8]) {
    let Some((&kind, rest)) = data.split_first() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    // One packer thread: the same code paths without a thread start per
    // input (this target is the slowest; every execution counts).
    let opts = ImportOptions {
        flatten: Some(dir.path().join("flat.sheaf")),
        publish: Some(dir.path().join("repo")),
        build: sheaf_build::BuildOptions {
            threads: 1,
            ..Default::default()
        },
        ..Default::default()
    };
    let cancel = std::sync::atomic::AtomicBool::new(false);
    match kind {
        0 => {
            let src = Mem {
                top: rest.to_vec(),
                blobs: HashMap::new(),
            };
            let _ = sheaf_oci::import(&src, &opts, &cancel, &|_, _, _| {});
        }
        1 => {
            if let Ok(p) = sheaf_oci::runtime::Process::from_config(rest) {
                let text = String::from_utf8_lossy(rest);
                let _ = sheaf_oci::runtime::resolve_user(&p.user, &text, &text);
            }
        }
        _ => {
            let layer = Digest::of(rest);
            let config = format!(
                r#"{{"architecture":"amd64","os":"linux","rootfs":{{"type":"layers","diff_ids":["{layer}"]}}}}"#
            )
            .into_bytes();
            let cd = Digest::of(&config);
            let manifest = format!(
                r#"{{"schemaVersion":2,"config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{cd}","size":{}}},"layers":[{{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"{layer}","size":{}}}]}}"#,
                config.len(),
                rest.len()
            );
            let mut blobs = HashMap::new();
            blobs.insert(cd, config);
            blobs.insert(layer, rest.to_vec());
            let src = Mem {
                top: manifest.into_bytes(),
                blobs,
            };
            let _ = sheaf_oci::import(&src, &opts, &cancel, &|_, _, _| {});
        }
    }
}

fuzz_target!(|data: &[u8]| run(data));
