//! `sheaf import`: container images into sheaf layers (parsing and
//! printing; `sheaf_oci` decides).

use crate::build::ImageArgs;
use anyhow::{bail, Result};
use sheaf_oci::{ImportOptions, Reference, RegistryOptions};
use std::path::PathBuf;

const IMPORT_HELP: &str = "\
Sources:
  docker://HOST[:PORT]/REPO[:TAG]        a registry (HTTPS; plain HTTP only for
  docker://HOST[:PORT]/REPO@sha256:HEX   hosts named by --insecure-registry)
  oci:DIR[:TAG]                          an OCI image layout directory
  docker-archive:FILE                    what `docker save` writes

Credentials are read as podman, skopeo and docker read them: --authfile, else
$REGISTRY_AUTH_FILE, $XDG_RUNTIME_DIR/containers/auth.json, ~/.docker/config.json;
in each, a credential helper (credHelpers, credsStore: docker-credential-NAME)
comes before the inline auths entry.
A multi-platform image gives this machine's platform unless --platform says.

Every blob is checked against its digest and every layer's uncompressed tar
against its diffID while it streams; a mismatch stops the import with one
line and nothing half-written is left.

--publish REPO writes each layer as a sheaf layer named layer-sha256-DIFFID
(so the gzip and zstd encodings of a layer are one layer), a link from each
blob digest to its layer, and the image record image-sha256-MANIFEST.json
(docs/containers.md). Layers already in REPO are not fetched again. Serve
REPO with any web server, as `sheaf publish` output. REPO may be
s3://BUCKET/PREFIX (layers first, links and the record last).

Layers are packed with 256K packs unless --pack-size says otherwise: a lazy
first read of a small file then fetches 256 KiB, not 4 MiB.

--flatten -o FILE writes one image with the layers merged (whiteouts
applied) and the image's config in /.sheaf.d/config.json, for `sheaf run
--image FILE` or `sheaf mount`.

Examples:
  sheaf import docker://registry.example/team/analysis:2.1 --publish /srv/sheaf
  sheaf import oci:./build/image:latest --flatten -o analysis.sheaf
  sheaf import --insecure-registry 127.0.0.1:5000 docker://127.0.0.1:5000/app:1 --flatten -o app.sheaf";

/// Pack size of imported layers unless `--pack-size` says otherwise.
const IMPORT_PACK_SIZE: u32 = 256 << 10;

/// Arguments of `sheaf import`.
#[derive(clap::Args, Debug)]
#[command(after_long_help = IMPORT_HELP)]
pub struct ImportArgs {
    /// The image: docker://…, oci:DIR[:TAG] or docker-archive:FILE.
    #[arg(value_name = "SOURCE")]
    source: String,
    /// Write the layers and the image record into this sheaf repository
    /// (a directory or s3://BUCKET/PREFIX).
    #[arg(long, value_name = "REPO")]
    publish: Option<PathBuf>,
    /// Write one merged image (to -o FILE; -o alone implies it).
    #[arg(long, requires = "output")]
    flatten: bool,
    /// Write the merged image (the layers flattened) to FILE.
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// OS/ARCH[/VARIANT] to take from a multi-platform image (default: this machine's).
    #[arg(long, value_name = "OS/ARCH[/VARIANT]")]
    platform: Option<String>,
    /// Reach this registry (HOST[:PORT]) over plain HTTP. Repeatable.
    #[arg(long = "insecure-registry", value_name = "HOST[:PORT]")]
    insecure: Vec<String>,
    /// Read registry credentials from this file only.
    #[arg(long, value_name = "FILE")]
    authfile: Option<PathBuf>,
    #[command(flatten)]
    image: ImageArgs,
}

/// Run `sheaf import`.
pub fn run(a: ImportArgs) -> Result<i32> {
    let reference = Reference::parse(&a.source)?;
    if a.publish.is_none() && a.output.is_none() {
        bail!("nothing to do: give --publish REPO, -o FILE (one merged image), or both");
    }
    let mut build = a.image.options()?;
    if !a.image.pack_size_given() {
        // Layers are read lazily (snapshotter, run --image over URLs): small
        // packs fetch less per first read (bench/containers.sh: 7.9% instead
        // of 15.6% of the scientific-Python image at start).
        build.pack_size = IMPORT_PACK_SIZE;
    }
    if !build.exclude.is_empty() || build.owner.is_some() || build.mtime.is_some() {
        bail!("--exclude, --owner and --mtime would make a layer differ from its diffID; they are not accepted by import");
    }
    // A layer is what its diffID says, mtimes included.
    build.clamp_mtime = None;
    let ropts = RegistryOptions {
        insecure: a.insecure.clone(),
        auth_file: a.authfile.clone(),
    };
    let src = sheaf_oci::open_source(&reference, &ropts)?;
    let opts = ImportOptions {
        platform: a.platform.clone(),
        build,
        publish: a.publish.clone(),
        flatten: a.output.clone(),
    };
    let show = !a.image.quiet && !a.image.json;
    let start = std::time::Instant::now();
    let rep = sheaf_oci::import(&*src, &opts, crate::util::cancel_flag(), &|i, n, l| {
        if show {
            eprintln!(
                "layer {}/{} {} -> {}: {}",
                i + 1,
                n,
                l.layer.blob.short(),
                l.layer.layer,
                if l.reused {
                    "already in the repository".to_string()
                } else {
                    format!(
                        "{} entries, {} -> {}",
                        l.entries,
                        crate::util::human(l.layer.size),
                        crate::util::human(l.image_bytes)
                    )
                }
            );
        }
    })?;
    if a.image.json {
        let secs = start.elapsed().as_secs_f64();
        let v = crate::util::timed_json(&rep, secs, serde_json::json!({}))?;
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else if show {
        let new = rep.layers.iter().filter(|l| !l.reused).count();
        eprintln!(
            "{}: {} layers ({} new), {} fetched, {} in {:.1} s",
            rep.source,
            rep.layers.len(),
            new,
            crate::util::human(rep.fetched_bytes),
            rep.manifest,
            start.elapsed().as_secs_f64()
        );
        if let Some(r) = &rep.record {
            eprintln!("record: {}", r.display());
        }
        if let Some(f) = &rep.flattened {
            eprintln!("image: {}", f.display());
        }
    }
    Ok(0)
}
