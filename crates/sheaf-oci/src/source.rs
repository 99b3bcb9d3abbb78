//! Where image documents and blobs come from: an OCI layout directory, a
//! `docker save` archive, or a registry ([`crate::registry`]). A source only
//! finds bytes; every digest is checked by the caller ([`crate::import`]),
//! so no source is trusted.

use crate::digest::Digest;
use crate::error::{OciError, Result};
use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// Largest manifest, index or config accepted: documents are small, and a
/// hostile source must not make the importer hold gigabytes.
pub const MAX_DOCUMENT: u64 = 16 << 20;

/// A document as fetched, with the media type the source gave it.
#[derive(Debug, Clone)]
pub struct Fetched {
    /// The bytes, exactly as stored (their digest is the document's).
    pub bytes: Vec<u8>,
    /// The media type the source reported, if it did.
    pub media_type: Option<String>,
}

/// A place holding one image's documents and blobs.
pub trait Source: Send + Sync {
    /// The reference, for messages.
    fn name(&self) -> String;
    /// The manifest or index the reference names. A source whose reference
    /// names a digest has checked the bytes against it.
    fn top(&self) -> Result<Fetched>;
    /// A blob (layer or config), streamed.
    fn blob(&self, d: &Digest) -> Result<Box<dyn Read + Send>>;
    /// A manifest an index lists, checked against its digest.
    fn manifest(&self, d: &Digest) -> Result<Vec<u8>> {
        read_document(self, d, "manifest")
    }
}

/// Read a whole document (manifest, index, config) from `r`, refusing
/// more than [`MAX_DOCUMENT`] bytes; `what` names it in errors.
pub(crate) fn read_bounded(r: impl Read, what: &str) -> Result<Vec<u8>> {
    let mut v = Vec::new();
    r.take(MAX_DOCUMENT + 1)
        .read_to_end(&mut v)
        .map_err(|e| OciError::io(what, e))?;
    if v.len() as u64 > MAX_DOCUMENT {
        return Err(OciError::bad(
            what,
            format!("larger than {} MiB", MAX_DOCUMENT >> 20),
        ));
    }
    Ok(v)
}

/// Check `bytes` against the digest `d` that names them.
pub(crate) fn check_digest(bytes: &[u8], d: &Digest, what: &str) -> Result<()> {
    let got = Digest::of(bytes);
    if &got != d {
        return Err(OciError::Digest {
            what: what.to_string(),
            expected: d.to_string(),
            got: got.to_string(),
        });
    }
    Ok(())
}

/// Read a whole document blob, bounded by [`MAX_DOCUMENT`], and check it
/// against its digest.
pub fn read_document<S: Source + ?Sized>(src: &S, d: &Digest, what: &str) -> Result<Vec<u8>> {
    let v = read_bounded(src.blob(d)?, &format!("{}: {what} {d}", src.name()))?;
    check_digest(&v, d, &format!("{}: {what}", src.name()))?;
    Ok(v)
}

fn read_small(path: &Path, what: &str) -> Result<Vec<u8>> {
    let f = File::open(path).map_err(|e| OciError::io(format!("{what} {}", path.display()), e))?;
    read_bounded(f, &format!("{what} {}", path.display()))
}

/// An OCI image layout directory (`oci-layout`, `index.json`, `blobs/`).
pub struct OciDir {
    dir: PathBuf,
    tag: Option<String>,
}

impl OciDir {
    /// The layout at `dir`, picking `tag` (an `org.opencontainers.image.ref.name`).
    pub fn new(dir: PathBuf, tag: Option<String>) -> OciDir {
        OciDir { dir, tag }
    }
}

const REF_NAME: &str = "org.opencontainers.image.ref.name";

impl Source for OciDir {
    fn name(&self) -> String {
        match &self.tag {
            Some(t) => format!("oci:{}:{t}", self.dir.display()),
            None => format!("oci:{}", self.dir.display()),
        }
    }
    fn top(&self) -> Result<Fetched> {
        let name = self.name();
        let layout = self.dir.join("oci-layout");
        if !layout.exists() {
            return Err(OciError::bad(
                name,
                "not an OCI image layout (no oci-layout file)",
            ));
        }
        let bytes = read_small(&self.dir.join("index.json"), "index")?;
        let index: oci_spec::image::ImageIndex = serde_json::from_slice(&bytes)
            .map_err(|e| OciError::bad(format!("{name}: index.json"), e.to_string()))?;
        let tag_of = |m: &oci_spec::image::Descriptor| {
            m.annotations()
                .as_ref()
                .and_then(|a| a.get(REF_NAME).cloned())
        };
        let chosen = match &self.tag {
            Some(t) => index
                .manifests()
                .iter()
                .find(|m| tag_of(m).as_deref() == Some(t.as_str())),
            None if index.manifests().len() == 1 => index.manifests().first(),
            None => {
                let tags: Vec<String> = index.manifests().iter().filter_map(tag_of).collect();
                return Err(OciError::bad(
                    name,
                    format!(
                        "holds {} images; name one as oci:DIR:TAG (tags: {})",
                        index.manifests().len(),
                        tags.join(", ")
                    ),
                ));
            }
        };
        let Some(desc) = chosen else {
            let tags: Vec<String> = index.manifests().iter().filter_map(tag_of).collect();
            return Err(OciError::bad(
                name,
                format!("no such tag (tags: {})", tags.join(", ")),
            ));
        };
        let d = Digest::parse(desc.digest().as_ref())
            .ok_or_else(|| OciError::bad(&name, format!("unsupported digest {}", desc.digest())))?;
        let bytes = read_document(self, &d, "manifest")?;
        if bytes.len() as u64 != desc.size() {
            return Err(OciError::bad(
                format!("{name}: manifest {d}"),
                format!("{} bytes, descriptor says {}", bytes.len(), desc.size()),
            ));
        }
        Ok(Fetched {
            bytes,
            media_type: Some(desc.media_type().to_string()),
        })
    }
    fn blob(&self, d: &Digest) -> Result<Box<dyn Read + Send>> {
        let p = self.dir.join("blobs/sha256").join(d.hex());
        let f = File::open(&p)
            .map_err(|e| OciError::io(format!("{}: blob {d} ({})", self.name(), p.display()), e))?;
        Ok(Box::new(std::io::BufReader::with_capacity(1 << 20, f)))
    }
}

/// A `docker save` archive: a tar holding `manifest.json`, the image
/// config and one uncompressed tar per layer. It has no registry manifest,
/// so one is made up from `manifest.json` and the config: the config's
/// digest is computed, and each layer's blob digest is its diffID (the
/// layers are uncompressed), which reading the layer then checks.
pub struct DockerArchive {
    path: PathBuf,
    /// Member name -> (offset of data, size).
    members: HashMap<String, (u64, u64)>,
    /// Blob digest -> member name, filled by [`Source::top`].
    blobs: std::sync::Mutex<HashMap<Digest, String>>,
}

fn clean_member(p: &str) -> String {
    p.trim_start_matches("./").to_string()
}

impl DockerArchive {
    /// Index the members of the archive at `path`.
    pub fn open(path: &Path) -> Result<DockerArchive> {
        let what = format!("docker-archive:{}", path.display());
        let f = File::open(path).map_err(|e| OciError::io(&what, e))?;
        let mut ar = tar::Archive::new(std::io::BufReader::new(f));
        let mut members = HashMap::new();
        let mut links = Vec::new();
        for e in ar.entries_with_seek().map_err(|e| OciError::io(&what, e))? {
            let e = e.map_err(|e| OciError::bad(&what, format!("bad tar archive: {e}")))?;
            let name = clean_member(&String::from_utf8_lossy(&e.path_bytes()));
            match e.header().entry_type() {
                tar::EntryType::Regular | tar::EntryType::Continuous => {
                    members.insert(name, (e.raw_file_position(), e.size()));
                }
                // Older dockers store a layer shared by two images once and
                // link the second name to it.
                tar::EntryType::Symlink | tar::EntryType::Link => {
                    if let Some(t) = e.link_name_bytes() {
                        let t = String::from_utf8_lossy(&t).into_owned();
                        links.push((name, t, e.header().entry_type()));
                    }
                }
                _ => {}
            }
        }
        for (name, target, kind) in links {
            let resolved = if kind == tar::EntryType::Symlink {
                let base = Path::new(&name).parent().unwrap_or(Path::new(""));
                normalize(&base.join(&target))
            } else {
                Some(clean_member(&target))
            };
            if let Some(m) = resolved.and_then(|t| members.get(&t).copied()) {
                members.insert(name, m);
            }
        }
        if !members.contains_key("manifest.json") {
            return Err(OciError::bad(
                what,
                "not a docker save archive (no manifest.json)",
            ));
        }
        Ok(DockerArchive {
            path: path.to_path_buf(),
            members,
            blobs: Default::default(),
        })
    }

    fn member(&self, name: &str) -> Result<Box<dyn Read + Send>> {
        let &(off, size) = self
            .members
            .get(&clean_member(name))
            .ok_or_else(|| OciError::bad(self.name(), format!("{name}: no such member")))?;
        let mut f = File::open(&self.path).map_err(|e| OciError::io(self.name(), e))?;
        f.seek(SeekFrom::Start(off))
            .map_err(|e| OciError::io(self.name(), e))?;
        Ok(Box::new(
            std::io::BufReader::with_capacity(1 << 20, f).take(size),
        ))
    }
}

fn normalize(p: &Path) -> Option<String> {
    let mut out: Vec<&str> = Vec::new();
    for c in p.to_str()?.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                out.pop()?;
            }
            c => out.push(c),
        }
    }
    Some(out.join("/"))
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ArchiveEntry {
    config: String,
    #[serde(default)]
    repo_tags: Option<Vec<String>>,
    layers: Vec<String>,
}

impl Source for DockerArchive {
    fn name(&self) -> String {
        format!("docker-archive:{}", self.path.display())
    }
    fn top(&self) -> Result<Fetched> {
        let name = self.name();
        let bytes = read_bounded(
            self.member("manifest.json")?,
            &format!("{name}: manifest.json"),
        )?;
        let list: Vec<ArchiveEntry> = serde_json::from_slice(&bytes)
            .map_err(|e| OciError::bad(format!("{name}: manifest.json"), e.to_string()))?;
        let entry = match list.as_slice() {
            [one] => one,
            [] => return Err(OciError::bad(name, "manifest.json lists no image")),
            many => {
                let tags: Vec<String> = many
                    .iter()
                    .flat_map(|e| e.repo_tags.clone().unwrap_or_default())
                    .collect();
                return Err(OciError::bad(
                    name,
                    format!(
                        "holds {} images; save one image per archive (tags: {})",
                        many.len(),
                        tags.join(", ")
                    ),
                ));
            }
        };
        let config = read_bounded(
            self.member(&entry.config)?,
            &format!("{name}: {}", entry.config),
        )?;
        let cfg: oci_spec::image::ImageConfiguration = serde_json::from_slice(&config)
            .map_err(|e| OciError::bad(format!("{name}: {}", entry.config), e.to_string()))?;
        let diff_ids = cfg.rootfs().diff_ids();
        if diff_ids.len() != entry.layers.len() {
            return Err(OciError::bad(
                name,
                format!(
                    "config lists {} layers, manifest.json {}",
                    diff_ids.len(),
                    entry.layers.len()
                ),
            ));
        }
        let config_digest = Digest::of(&config);
        let mut blobs = self.blobs.lock().unwrap_or_else(|e| e.into_inner());
        blobs.insert(config_digest.clone(), entry.config.clone());
        let mut layers = Vec::new();
        for (member, diff) in entry.layers.iter().zip(diff_ids) {
            let d = Digest::parse(diff)
                .ok_or_else(|| OciError::bad(&name, format!("unsupported diffID {diff}")))?;
            let size = self
                .members
                .get(&clean_member(member))
                .ok_or_else(|| OciError::bad(&name, format!("{member}: no such member")))?
                .1;
            blobs.insert(d.clone(), member.clone());
            layers.push(serde_json::json!({
                "mediaType": "application/vnd.docker.image.rootfs.diff.tar",
                "digest": d.to_string(),
                "size": size,
            }));
        }
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
            "config": {
                "mediaType": "application/vnd.docker.container.image.v1+json",
                "digest": config_digest.to_string(),
                "size": config.len(),
            },
            "layers": layers,
        });
        Ok(Fetched {
            bytes: serde_json::to_vec(&manifest).expect("json"),
            media_type: Some("application/vnd.docker.distribution.manifest.v2+json".into()),
        })
    }
    fn blob(&self, d: &Digest) -> Result<Box<dyn Read + Send>> {
        let member = self
            .blobs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(d)
            .cloned()
            .ok_or_else(|| OciError::bad(self.name(), format!("no blob {d}")))?;
        self.member(&member)
    }
}
