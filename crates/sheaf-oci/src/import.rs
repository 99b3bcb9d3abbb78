//! `sheaf import`: a container image's layers, each streamed once through
//! its blob digest, a decompressor and its diffID into the packer, checked
//! before anything is kept; then published into a repository and/or merged
//! into one flattened image.

use crate::digest::{Digest, Hashing};
use crate::error::{OciError, Result};
use crate::record::{self, BlobLink, ImageRecord, RecordLayer, RECORD_SCHEMA};
use crate::source::{Fetched, Source};
use base64::Engine as _;
use oci_spec::image::{ImageConfiguration, ImageIndex, ImageManifest};
use sheaf_build::{BuildOptions, Input, Progress, TarStream};
use sheaf_read::{Image, Stack};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

/// What to import and where to.
#[derive(Debug, Clone, Default)]
pub struct ImportOptions {
    /// `os/arch[/variant]` to pick from a multi-platform index (default:
    /// this machine's).
    pub platform: Option<String>,
    /// How layers are packed.
    pub build: BuildOptions,
    /// Write layers and the image record into this repository.
    pub publish: Option<PathBuf>,
    /// Write one merged image here.
    pub flatten: Option<PathBuf>,
}

/// One layer's outcome.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LayerReport {
    /// The layer as the record lists it.
    #[serde(flatten)]
    pub layer: RecordLayer,
    /// Already in the repository: not fetched.
    pub reused: bool,
    /// Entries in the layer (0 when reused).
    pub entries: u64,
    /// Bytes of the sheaf layer image (0 when reused).
    pub image_bytes: u64,
    /// Objects written into the repository.
    pub objects_written: u64,
}

/// What an import did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ImportReport {
    /// The reference imported.
    pub source: String,
    /// The manifest's digest.
    pub manifest: Digest,
    /// The platform chosen.
    pub platform: String,
    /// The config's digest.
    pub config: Digest,
    /// Each layer, bottom first.
    pub layers: Vec<LayerReport>,
    /// The image record written, with `publish`.
    pub record: Option<PathBuf>,
    /// The merged image written, with `flatten`.
    pub flattened: Option<PathBuf>,
    /// Bytes of layer blobs fetched.
    pub fetched_bytes: u64,
}

/// How a layer blob is compressed, from its media type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Codec {
    Plain,
    Gzip,
    Zstd,
}

fn codec_of(media_type: &str) -> Option<Codec> {
    let mt = media_type;
    if mt.contains("foreign") || mt.contains("nondistributable") {
        return None;
    }
    if mt.ends_with("tar+gzip") || mt.ends_with("tar.gzip") {
        Some(Codec::Gzip)
    } else if mt.ends_with("tar+zstd") {
        Some(Codec::Zstd)
    } else if mt.ends_with(".tar") || mt.ends_with("layer.v1.tar") {
        Some(Codec::Plain)
    } else {
        None
    }
}

/// This machine's platform, in OCI's words.
pub fn host_platform() -> String {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        "arm" => "arm/v7",
        a => a,
    };
    format!("linux/{arch}")
}

fn platform_string(p: &oci_spec::image::Platform) -> String {
    let mut s = format!("{}/{}", p.os(), p.architecture());
    if let Some(v) = p.variant() {
        s = format!("{s}/{v}");
    }
    s
}

/// Whether an offered platform matches the wanted one: an unspecified
/// variant matches any (as `docker pull` does for arm64).
fn platform_matches(offered: &str, wanted: &str) -> bool {
    offered == wanted
        || offered.starts_with(&format!("{wanted}/"))
        || wanted.starts_with(&format!("{offered}/"))
}

/// The manifest the reference names, through an index if it is one.
fn resolve(src: &dyn Source, platform: &str) -> Result<(Fetched, Digest, ImageManifest)> {
    let name = src.name();
    let top = src.top()?;
    let mut doc = top;
    for _ in 0..2 {
        let v: serde_json::Value = serde_json::from_slice(&doc.bytes)
            .map_err(|e| OciError::bad(format!("{name}: manifest"), e.to_string()))?;
        /// What tells the kinds of manifest apart.
        #[derive(Default, serde::Deserialize)]
        #[serde(default)]
        struct Kind {
            #[serde(rename = "schemaVersion")]
            schema_version: Option<serde_json::Value>,
            manifests: Option<serde_json::Value>,
        }
        let kind: Kind = serde_json::from_value(v.clone()).unwrap_or_default();
        if kind.schema_version.and_then(|s| s.as_u64()) == Some(1) {
            return Err(OciError::bad(
                name,
                "Docker schema 1 manifests are not supported (re-push the image with a current tool)",
            ));
        }
        if kind.manifests.is_some() {
            let index: ImageIndex = serde_json::from_value(v)
                .map_err(|e| OciError::bad(format!("{name}: index"), e.to_string()))?;
            let offered: Vec<(String, &oci_spec::image::Descriptor)> = index
                .manifests()
                .iter()
                .filter_map(|m| m.platform().as_ref().map(|p| (platform_string(p), m)))
                .collect();
            let chosen = offered
                .iter()
                .find(|(p, _)| p == platform)
                .or_else(|| offered.iter().find(|(p, _)| platform_matches(p, platform)));
            let Some((_, desc)) = chosen else {
                return Err(OciError::Platform {
                    what: name,
                    want: platform.to_string(),
                    have: offered
                        .iter()
                        .map(|(p, _)| p.as_str())
                        .filter(|p| !p.starts_with("unknown"))
                        .collect::<Vec<_>>()
                        .join(", "),
                });
            };
            let d = Digest::parse(desc.digest().as_ref()).ok_or_else(|| {
                OciError::bad(&name, format!("unsupported digest {}", desc.digest()))
            })?;
            doc = Fetched {
                bytes: src.manifest(&d)?,
                media_type: Some(desc.media_type().to_string()),
            };
            continue;
        }
        let m: ImageManifest = serde_json::from_value(v)
            .map_err(|e| OciError::bad(format!("{name}: manifest"), e.to_string()))?;
        let d = Digest::of(&doc.bytes);
        return Ok((doc, d, m));
    }
    Err(OciError::bad(name, "an index of indexes is not supported"))
}

/// The digest of the manifest `src` names for `platform` (default: this
/// machine's), fetching only the manifest (and index).
pub fn manifest_digest(src: &dyn Source, platform: Option<&str>) -> Result<Digest> {
    let platform = platform.map(str::to_string).unwrap_or_else(host_platform);
    Ok(resolve(src, &platform)?.1)
}

/// Stream one layer blob into a sheaf layer image at `out`, checking the
/// blob's size and digest and the diffID. On any failure `out` is removed.
fn build_layer(
    src: &dyn Source,
    layer: &RecordLayer,
    out: &Path,
    opts: &BuildOptions,
    cancel: &AtomicBool,
) -> Result<sheaf_build::BuildReport> {
    let what = format!("{}: layer {}", src.name(), layer.blob);
    let codec = codec_of(&layer.media_type).ok_or_else(|| {
        OciError::bad(
            &what,
            format!("unsupported layer media type {}", layer.media_type),
        )
    })?;
    // One byte more than promised, so a longer blob is caught, not cut.
    let raw = src.blob(&layer.blob)?.take(layer.size + 1);
    let mut outer = Hashing::new(raw);
    let decoded: Box<dyn Read + Send> = match codec {
        Codec::Plain => Box::new(outer.clone()),
        Codec::Gzip => Box::new(flate2::read::MultiGzDecoder::new(outer.clone())),
        Codec::Zstd => Box::new(
            zstd::stream::read::Decoder::new(outer.clone()).map_err(|e| OciError::io(&what, e))?,
        ),
    };
    let mut inner = Hashing::new(decoded);
    let built = pack_layer(&what, Box::new(inner.clone()), out, opts, cancel);
    // Drain the decoded stream first (its hash needs every byte after the
    // tar's end too), then whatever the decoder left of the blob. The blob
    // must be whole and right, whatever the packer thought of it: a
    // tampered blob is reported as such, not as a bad tar.
    let decoded_rest = inner.finish();
    let check = (|| -> Result<()> {
        let (blob, n) = outer.finish().map_err(|e| OciError::io(&what, e))?;
        if blob != layer.blob || n != layer.size {
            return Err(OciError::Digest {
                what: what.clone(),
                expected: format!("{} ({} bytes)", layer.blob, layer.size),
                got: format!("{blob} ({n} bytes)"),
            });
        }
        Ok(())
    })();
    let result = check.and_then(|()| {
        let rep = built?;
        let (diff, _) =
            decoded_rest.map_err(|e| OciError::io(format!("{what}: decompressing"), e))?;
        if diff != layer.diff_id {
            return Err(OciError::Digest {
                what: format!("{what}: uncompressed tar (diffID)"),
                expected: layer.diff_id.to_string(),
                got: diff.to_string(),
            });
        }
        Ok(rep)
    });
    if result.is_err() {
        let _ = std::fs::remove_file(out);
    }
    result
}

/// A small layer holding the image's documents under [`record::FLAT_DIR`].
fn documents_layer(
    config: &[u8],
    rec: &ImageRecord,
    out: &Path,
    opts: &BuildOptions,
    cancel: &AtomicBool,
) -> Result<()> {
    let mut b = tar::Builder::new(Vec::new());
    let mut dir = tar::Header::new_ustar();
    dir.set_entry_type(tar::EntryType::Directory);
    dir.set_mode(0o755);
    dir.set_size(0);
    b.append_data(&mut dir, record::FLAT_DIR, std::io::empty())
        .expect("in memory");
    let rec_json = serde_json::to_vec_pretty(rec).expect("json");
    for (n, bytes) in [("config.json", config), ("image.json", &rec_json[..])] {
        let mut h = tar::Header::new_ustar();
        h.set_mode(0o644);
        h.set_size(bytes.len() as u64);
        b.append_data(&mut h, format!("{}/{n}", record::FLAT_DIR), bytes)
            .expect("in memory");
    }
    let tar = b.into_inner().expect("in memory");
    let cursor = Box::new(std::io::Cursor::new(tar));
    pack_layer("image documents", cursor, out, opts, cancel)?;
    Ok(())
}

/// Pack a decompressed layer tar into a sheaf layer image at `out` (a
/// temporary of the import, so replaced if present).
fn pack_layer(
    name: &str,
    tar: Box<dyn Read + Send>,
    out: &Path,
    opts: &BuildOptions,
    cancel: &AtomicBool,
) -> Result<sheaf_build::BuildReport, sheaf_build::BuildError> {
    let stream = TarStream {
        name: name.to_string(),
        reader: Arc::new(Mutex::new(tar)),
    };
    let opts = BuildOptions {
        force: true,
        ..opts.clone()
    };
    sheaf_build::build(
        &Input::Layer(stream),
        out,
        &opts,
        Arc::new(Progress::default()),
        cancel,
    )
}

/// A layer image by path: a file built here, or a layer index in a local
/// repository (read in place), opened as `sheaf_net` opens any path.
fn open_layer(path: &Path) -> Result<Arc<Image>> {
    let opened = sheaf_net::open_image(
        path,
        &sheaf_net::RemoteConfig::default(),
        sheaf_build::stack_input::layer_options(),
        |s| s,
    )
    .map_err(|e| match e {
        sheaf_net::OpenError::Read(e) => OciError::Read(e),
        sheaf_net::OpenError::Local { path, source } => OciError::io(path, source),
        sheaf_net::OpenError::Remote { url, source } => OciError::io(url, source),
        sheaf_net::OpenError::Cache(e) => OciError::io("node cache", e),
    })?;
    Ok(Arc::new(opened.image))
}

/// Import the image `src` names. `on_layer` hears of each layer as it is
/// done (for progress).
pub fn import(
    src: &dyn Source,
    opts: &ImportOptions,
    cancel: &AtomicBool,
    on_layer: &dyn Fn(usize, usize, &LayerReport),
) -> Result<ImportReport> {
    let name = src.name();
    if opts.publish.is_none() && opts.flatten.is_none() {
        return Err(OciError::bad(
            name,
            "nothing to do: give --publish REPO or --flatten -o FILE",
        ));
    }
    if let Some(f) = &opts.flatten {
        if !opts.build.force && f.symlink_metadata().is_ok() {
            return Err(OciError::bad(
                f.display().to_string(),
                "exists (--force replaces it)",
            ));
        }
    }
    let platform = opts.platform.clone().unwrap_or_else(host_platform);
    let (doc, manifest_digest, manifest) = resolve(src, &platform)?;
    let config_digest = Digest::parse(manifest.config().digest().as_ref()).ok_or_else(|| {
        OciError::bad(
            &name,
            format!("unsupported config digest {}", manifest.config().digest()),
        )
    })?;
    let config_bytes = crate::source::read_document(src, &config_digest, "config")?;
    let config: ImageConfiguration = serde_json::from_slice(&config_bytes)
        .map_err(|e| OciError::bad(format!("{name}: config"), e.to_string()))?;
    let diff_ids = config.rootfs().diff_ids();
    if diff_ids.len() != manifest.layers().len() {
        return Err(OciError::bad(
            &name,
            format!(
                "the manifest has {} layers, the config's rootfs {}",
                manifest.layers().len(),
                diff_ids.len()
            ),
        ));
    }
    let mut layers = Vec::new();
    for (desc, diff) in manifest.layers().iter().zip(diff_ids) {
        let blob = Digest::parse(desc.digest().as_ref()).ok_or_else(|| {
            OciError::bad(&name, format!("unsupported layer digest {}", desc.digest()))
        })?;
        let diff_id = Digest::parse(diff)
            .ok_or_else(|| OciError::bad(&name, format!("unsupported diffID {diff}")))?;
        layers.push(RecordLayer {
            layer: record::layer_name(&diff_id),
            blob,
            media_type: desc.media_type().to_string(),
            size: desc.size(),
            diff_id,
            root: None,
        });
    }
    let actual_platform = format!(
        "{}/{}{}",
        config.os(),
        config.architecture(),
        config
            .variant()
            .as_ref()
            .map(|v| format!("/{v}"))
            .unwrap_or_default()
    );
    let mut rec = ImageRecord {
        schema: RECORD_SCHEMA,
        source: name.clone(),
        manifest: manifest_digest.clone(),
        manifest_media_type: doc
            .media_type
            .clone()
            .or_else(|| manifest.media_type().as_ref().map(|m| m.to_string()))
            .unwrap_or_else(|| "application/vnd.oci.image.manifest.v1+json".into()),
        platform: actual_platform.clone(),
        config_digest: config_digest.clone(),
        config_bytes_b64: base64::engine::general_purpose::STANDARD.encode(&config_bytes),
        layers: layers.clone(),
    };

    // Layers are built where they will be kept, so nothing crosses devices;
    // the directory goes away with whatever a failure left in it.
    // A repository may be a directory or s3://BUCKET/PREFIX.
    let repo = match &opts.publish {
        Some(r) => Some(
            sheaf_net::publish::Repository::open(r, sheaf_net::HttpOptions::default()).map_err(
                |e| {
                    OciError::io(
                        format!("repository {}", sheaf_net::redact(&r.to_string_lossy())),
                        e,
                    )
                },
            )?,
        ),
        None => None,
    };
    let work_parent = match (repo.as_ref().and_then(|r| r.dir()), &opts.flatten) {
        (Some(dir), _) => dir.to_path_buf(),
        (None, Some(f)) => match f.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        },
        // Layers published to object storage are built in the system's
        // temporary directory.
        (None, None) => std::env::temp_dir(),
    };
    let work = tempfile::Builder::new()
        .prefix(".sheaf-import-")
        .tempdir_in(&work_parent)
        .map_err(|e| {
            OciError::io(
                format!("temporary directory in {}", work_parent.display()),
                e,
            )
        })?;

    let mut reports = Vec::new();
    let mut built = Vec::new();
    let mut roots = Vec::with_capacity(layers.len());
    let mut fetched = 0u64;
    let total = layers.len();
    for (i, l) in layers.iter().enumerate() {
        let in_repo = match &repo {
            Some(r) => r
                .exists(&l.layer)
                .map_err(|e| OciError::io(r.location(&l.layer), e))?,
            None => false,
        };
        let mut rep = LayerReport {
            layer: l.clone(),
            reused: in_repo,
            entries: 0,
            image_bytes: 0,
            objects_written: 0,
        };
        // Each layer is opened once, for publishing, for its root in the
        // record and for flattening. One already in the repository is read
        // there, in place.
        let img = if in_repo {
            let repo = repo.as_ref().expect("in_repo implies publish");
            open_layer(Path::new(&repo.location(&l.layer)))?
        } else {
            let out = work.path().join(format!("{i}.sheaf"));
            let b = build_layer(src, l, &out, &opts.build, cancel)?;
            fetched += l.size;
            rep.entries = b.inodes;
            rep.image_bytes = b.image_bytes;
            let img = open_layer(&out)?;
            if let Some(repo) = &repo {
                let p = repo.publish(&img, &l.layer, &|_, _| {})?;
                rep.objects_written = p.written;
            }
            img
        };
        roots.push(img.root_digest());
        if opts.flatten.is_some() {
            built.push(img);
        }
        on_layer(i, total, &rep);
        reports.push(rep);
    }

    let mut record_path = None;
    if let Some(repo) = &repo {
        let put = |name: String, bytes: Vec<u8>| {
            repo.put(&name, &bytes)
                .map_err(|e| OciError::io(format!("writing {}", repo.location(&name)), e))
        };
        for l in &layers {
            let link = BlobLink {
                schema: RECORD_SCHEMA,
                diff_id: l.diff_id.clone(),
                layer: l.layer.clone(),
            };
            put(
                record::blob_link_name(&l.blob),
                serde_json::to_vec_pretty(&link).expect("json"),
            )?;
        }
        // The record names each layer's root (a published index has the
        // root of the image it stands for), so signing the record covers
        // the layers' bytes.
        for (l, root) in rec.layers.iter_mut().zip(&roots) {
            l.root = Some(format!("blake3:{}", sheaf_format::hex(root)));
        }
        let name = record::record_name(&manifest_digest);
        put(name.clone(), serde_json::to_vec_pretty(&rec).expect("json"))?;
        record_path = Some(PathBuf::from(repo.location(&name)));
    }

    if let Some(out) = &opts.flatten {
        let docs = work.path().join("documents.sheaf");
        documents_layer(&config_bytes, &rec, &docs, &opts.build, cancel)?;
        let mut stack = built;
        stack.push(open_layer(&docs)?);
        let src = sheaf_build::stack_input::StackSource::new(Stack::new(stack));
        sheaf_build::build(
            &Input::Entries(Arc::new(src)),
            out,
            &opts.build,
            Arc::new(Progress::default()),
            cancel,
        )?;
    }
    Ok(ImportReport {
        source: name,
        manifest: manifest_digest,
        platform: actual_platform,
        config: config_digest,
        layers: reports,
        record: record_path,
        flattened: opts.flatten.clone(),
        fetched_bytes: fetched,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn media_types_name_their_codec() {
        assert_eq!(
            codec_of("application/vnd.oci.image.layer.v1.tar+gzip"),
            Some(Codec::Gzip)
        );
        assert_eq!(
            codec_of("application/vnd.oci.image.layer.v1.tar+zstd"),
            Some(Codec::Zstd)
        );
        assert_eq!(
            codec_of("application/vnd.oci.image.layer.v1.tar"),
            Some(Codec::Plain)
        );
        assert_eq!(
            codec_of("application/vnd.docker.image.rootfs.diff.tar.gzip"),
            Some(Codec::Gzip)
        );
        assert_eq!(
            codec_of("application/vnd.docker.image.rootfs.foreign.diff.tar.gzip"),
            None
        );
        assert_eq!(codec_of("application/octet-stream"), None);
    }

    #[test]
    fn platforms_match_with_or_without_variant() {
        assert!(platform_matches("linux/arm64/v8", "linux/arm64"));
        assert!(platform_matches("linux/amd64", "linux/amd64"));
        assert!(!platform_matches("linux/arm", "linux/arm64"));
        assert!(!platform_matches("linux/amd64", "linux/arm64"));
    }
}
