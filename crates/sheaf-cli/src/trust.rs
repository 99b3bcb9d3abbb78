//! `sheaf sign`, `sheaf verify`, `sheaf root`, `sheaf keygen`, and the
//! signature policy applied before mounting.

use anyhow::{bail, Context, Result};
use clap::Args;
use sheaf_format::signatures::{encode_block, SIG_FOOTER_LEN};
use sheaf_read::Image;
use sheaf_trust::policy::detached_path;
use sheaf_trust::{Checked, Policy, Verified};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Arguments of `sheaf sign`.
#[derive(Args, Debug)]
#[command(after_long_help = "\
What can be signed: an image file (the signature is appended); a published
index in a local repository, such as a layer `sheaf import --publish` wrote
(the index gains the signature, so a mount of its URL sees it); and an image
record `REPO/image-sha256-MANIFEST.json` (always a detached .sig beside it,
over the record's BLAKE3 digest; the record names every layer's root, so its
signature covers the layers' bytes: `sheaf verify RECORD` checks both).")]
pub struct SignArgs {
    /// The image, published index or image record to sign.
    image: PathBuf,
    /// An OpenSSH private key (ed25519, ecdsa or rsa). A passphrase-protected
    /// key or a public key (`.pub`) signs through ssh-agent instead.
    #[arg(short, long, value_name = "KEY")]
    key: PathBuf,
    /// Who is signing (shown in the report; trust comes from the verifier's
    /// allowed_signers file, not from this name).
    #[arg(long, value_name = "NAME")]
    identity: Option<String>,
    /// Write the signature to IMAGE.sig instead of appending it to the image.
    #[arg(long)]
    detached: bool,
    /// Replace an existing IMAGE.sig.
    #[arg(short, long)]
    force: bool,
}

/// Arguments of `sheaf verify`.
#[derive(Args, Debug)]
#[command(after_long_help = "\
Exit status: 0 when at least one signature is trusted (and, with --full, every
page and block matches its hash); 1 when no signature is trusted (none at all,
or each one rejected, with the reason printed) or --full found damage; 2 for
bad arguments or unreadable files.

An image record (REPO/image-sha256-MANIFEST.json): its detached .sig is checked,
then every layer beside it must have the root the record names.

Signatures checked: those appended to the image by `sheaf sign`, plus IMAGE.sig
if it exists (a detached signature, e.g. from `sheaf root IMAGE | ssh-keygen -Y
sign -n sheaf -f KEY - > IMAGE.sig`).")]
pub struct VerifyArgs {
    /// The image (or image record).
    image: PathBuf,
    /// OpenSSH allowed_signers file of trusted keys (default: the site
    /// configuration's `signers`, as mount uses).
    #[arg(long, value_name = "FILE")]
    signers: Option<PathBuf>,
    /// Require the signing key to be trusted for this principal.
    #[arg(long, value_name = "NAME")]
    identity: Option<String>,
    /// Also check every page and block against the signed hashes.
    #[arg(long)]
    full: bool,
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
}

/// What `sheaf sign` and `sheaf verify` were given.
enum Signable {
    /// An image record of `sheaf import --publish` (its bytes).
    Record(Vec<u8>),
    /// A published index in a local repository.
    LocalIndex,
    /// An image file or URL.
    Image,
}

fn signable(p: &Path) -> Result<Signable> {
    if sheaf_net::is_url(&p.to_string_lossy()) || !p.is_file() {
        return Ok(Signable::Image);
    }
    let mut head = [0u8; 8];
    let n = std::io::Read::read(
        &mut std::fs::File::open(p).with_context(|| p.display().to_string())?,
        &mut head,
    )
    .with_context(|| p.display().to_string())?;
    if head[..n] == sheaf_format::remote::INDEX_MAGIC {
        return Ok(Signable::LocalIndex);
    }
    if head[..n].first() == Some(&b'{') {
        let bytes = std::fs::read(p).with_context(|| p.display().to_string())?;
        serde_json::from_slice::<sheaf_oci::ImageRecord>(&bytes)
            .with_context(|| format!("{}: not an image or an image record", p.display()))?;
        return Ok(Signable::Record(bytes));
    }
    Ok(Signable::Image)
}

/// Write `pem` to `IMAGE.sig` (create-new unless `force`).
fn write_detached(image: &Path, pem: &str, force: bool) -> Result<PathBuf> {
    let d = detached_path(image);
    let mut o = std::fs::OpenOptions::new();
    o.write(true);
    if force {
        o.create(true).truncate(true);
    } else {
        o.create_new(true);
    }
    let mut f = o
        .open(&d)
        .with_context(|| format!("{} (use --force to replace it)", d.display()))?;
    f.write_all(pem.as_bytes())
        .and_then(|()| f.sync_all())
        .with_context(|| d.display().to_string())?;
    Ok(d)
}

/// `sheaf sign`.
pub fn sign(a: SignArgs, remote: &crate::util::RemoteArgs, io: &mut crate::Io<'_>) -> Result<i32> {
    let who = a.identity.as_deref().unwrap_or("key");
    let kind = signable(&a.image)?;
    if let Signable::Record(bytes) = &kind {
        // A record is JSON: its signature can only be detached.
        let msg = sheaf_oci::record::signed_message(bytes);
        let pem = sheaf_trust::sign(&a.key, msg.as_bytes())?;
        let d = write_detached(&a.image, &pem, a.force)?;
        writeln!(
            io.stdout,
            "{}: {who} signed image record {}",
            d.display(),
            msg.trim_end()
        )?;
        return Ok(0);
    }
    if sheaf_net::is_url(&a.image.to_string_lossy()) {
        bail!(
            "{}: a URL cannot be changed from here; sign the image or index where it is published",
            a.image.display()
        );
    }
    let img = crate::util::open_image(&a.image, remote)?;
    let msg = img.signed_message();
    let pem = sheaf_trust::sign(&a.key, msg.as_bytes())?;
    let root = sheaf_format::hex(&img.root_digest());
    if a.detached {
        let d = write_detached(&a.image, &pem, a.force)?;
        writeln!(
            io.stdout,
            "{}: {who} signed root blake3:{root}",
            d.display()
        )?;
        return Ok(0);
    }
    let mut sigs = img.signatures().to_vec();
    if sigs.iter().any(|s| s == pem.as_bytes()) {
        writeln!(
            io.stdout,
            "{}: already carries this signature",
            a.image.display()
        )?;
        return Ok(0);
    }
    sigs.push(pem.into_bytes());
    if let Signable::LocalIndex = kind {
        // A published index stands for the image: the new block becomes a
        // range of it, and the index is replaced whole.
        sheaf_net::publish::append_to_local_index(&a.image, |offset| {
            encode_block(&sigs, img.image_len(), offset)
        })
        .with_context(|| format!("{}: adding the signature", a.image.display()))?;
    } else {
        // Append a complete new block: the image bytes and any old block
        // stay untouched, so an interrupted signing leaves the last good
        // state.
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&a.image)
            .with_context(|| a.image.display().to_string())?;
        let offset = f.metadata()?.len();
        let block = encode_block(&sigs, img.image_len(), offset);
        debug_assert!(block.len() >= SIG_FOOTER_LEN);
        f.write_all(&block)
            .and_then(|()| f.sync_all())
            .with_context(|| format!("{}: appending the signature", a.image.display()))?;
    }
    writeln!(
        io.stdout,
        "{}: {who} signed root blake3:{root} ({} signature{})",
        a.image.display(),
        sigs.len(),
        if sigs.len() == 1 { "" } else { "s" }
    )?;
    Ok(0)
}

/// Check every signature of `img` (named `path`) against `signers`.
pub fn check_image(
    img: &Image,
    path: &Path,
    signers: &Path,
    identity: Option<&str>,
) -> Result<Checked> {
    Ok(sheaf_trust::policy::check_signatures(
        &img.signed_message(),
        img.signatures(),
        path,
        signers,
        identity,
    )?)
}

/// Refuse `img` (named `path`) unless `policy` is met.
pub fn enforce(policy: &Policy, img: &Image, path: &Path) -> Result<Option<Verified>> {
    Ok(policy.enforce(&img.signed_message(), img.signatures(), path)?)
}

/// [`Image::expect_root`] when the image is pinned (the one rule).
pub fn check_pin(img: &Image, pin: Option<&sheaf_format::Digest>) -> Result<()> {
    match pin {
        Some(want) => Ok(img.expect_root(want)?),
        None => Ok(()),
    }
}

/// Parse a root digest given as 64 hex digits (`sheaf root` prints one).
pub fn parse_root(s: &str) -> Result<sheaf_format::Digest> {
    let s = s.trim();
    // As `sheaf root` prints it ("sheaf-root-v1 blake3:HEX"), or the hex.
    let s = s.strip_prefix("sheaf-root-v1").map_or(s, str::trim_start);
    let s = s.strip_prefix("blake3:").unwrap_or(s);
    sheaf_format::unhex(s).ok_or_else(|| {
        anyhow::anyhow!("{s}: not a root digest (64 hex digits, as `sheaf root IMAGE` prints)")
    })
}

/// Print one signature check, as text or JSON.
fn print_checked(c: &Checked, io: &mut crate::Io<'_>) -> std::io::Result<()> {
    if c.results.is_empty() {
        writeln!(io.stdout, "  no signature")?;
    }
    for (w, r) in &c.results {
        match r {
            Ok(v) => writeln!(
                io.stdout,
                "  {w}: good, signed by {} ({} {})",
                v.principals.join(", "),
                v.algorithm,
                v.fingerprint
            )?,
            Err(e) => writeln!(io.stdout, "  {w}: rejected: {e}")?,
        }
    }
    Ok(())
}

fn signatures_json(c: &Checked) -> Vec<serde_json::Value> {
    c.results
        .iter()
        .map(|(w, r)| match r {
            Ok(v) => serde_json::json!({"signature": w, "trusted": true,
                "principals": v.principals, "key": v.fingerprint, "algorithm": v.algorithm}),
            Err(e) => {
                serde_json::json!({"signature": w, "trusted": false, "reason": e.to_string()})
            }
        })
        .collect()
}

/// `sheaf verify` of an image record: its detached signature, then each
/// layer found beside it must have the root the record names (a layer
/// replaced in the repository fails here, as it would fail to mount).
fn verify_record(
    a: &VerifyArgs,
    bytes: &[u8],
    remote: &crate::util::RemoteArgs,
    io: &mut crate::Io<'_>,
) -> Result<i32> {
    let rec: sheaf_oci::ImageRecord = serde_json::from_slice(bytes)?;
    let msg = sheaf_oci::record::signed_message(bytes);
    let c = sheaf_trust::policy::check_signatures(
        &msg,
        &[],
        &a.image,
        a.signers.as_deref().expect("set above"),
        a.identity.as_deref(),
    )?;
    let repo = a.image.parent().unwrap_or(Path::new("."));
    let mut layers = Vec::new();
    let mut bad = 0;
    for l in &rec.layers {
        let path = repo.join(&l.layer);
        let found = if path.exists() {
            let img = crate::util::open_image(&path, remote)?;
            Some(format!("blake3:{}", sheaf_format::hex(&img.root_digest())))
        } else {
            None
        };
        let ok = match (&l.root, &found) {
            (Some(want), Some(got)) => want == got,
            // A record from before roots were recorded vouches for no bytes.
            (None, _) => false,
            (Some(_), None) => true,
        };
        if !ok {
            bad += 1;
        }
        layers.push((l, found, ok));
    }
    let trusted = c.trusted().is_some();
    if a.json {
        let lj: Vec<_> = layers
            .iter()
            .map(|(l, found, ok)| serde_json::json!({"layer": l.layer, "root": l.root, "found": found, "matches": ok}))
            .collect();
        writeln!(
            io.stdout,
            "{}",
            serde_json::json!({"record": a.image.display().to_string(), "manifest": rec.manifest.to_string(),
                "trusted": trusted, "signatures": signatures_json(&c), "layers": lj})
        )?;
    } else {
        writeln!(
            io.stdout,
            "{}: image record of manifest {}",
            a.image.display(),
            rec.manifest
        )?;
        print_checked(&c, io)?;
        for (l, found, ok) in &layers {
            match (found, ok, &l.root) {
                (_, false, None) => writeln!(
                    io.stdout,
                    "  {}: the record names no root (re-import to add it)",
                    l.layer
                )?,
                (Some(f), false, Some(r)) => writeln!(
                    io.stdout,
                    "  {}: root {f}, but the record says {r}",
                    l.layer
                )?,
                (None, _, _) => writeln!(io.stdout, "  {}: not in this repository", l.layer)?,
                (Some(_), true, _) => writeln!(io.stdout, "  {}: root matches", l.layer)?,
            }
        }
    }
    Ok(if trusted && bad == 0 { 0 } else { 1 })
}

/// `sheaf verify`.
pub fn verify(
    mut a: VerifyArgs,
    remote: &crate::util::RemoteArgs,
    io: &mut crate::Io<'_>,
) -> Result<i32> {
    if a.signers.is_none() {
        // The same trusted keys as every other command: the site's.
        let site = Policy::load(false, None, None)?;
        a.signers = Some(site.signers.ok_or_else(|| {
            anyhow::anyhow!(
                "no trusted keys: give --signers FILE (an OpenSSH allowed_signers file), or set signers in [signatures] of {}",
                sheaf_trust::policy::config_path().display()
            )
        })?);
    }
    if let Signable::Record(bytes) = signable(&a.image)? {
        return verify_record(&a, &bytes, remote, io);
    }
    let img = crate::util::open_image(&a.image, remote)?;
    let c = check_image(
        &img,
        &a.image,
        a.signers.as_deref().expect("set above"),
        a.identity.as_deref(),
    )?;
    let root = sheaf_format::hex(&img.root_digest());
    let mut damaged = None;
    if a.full && c.trusted().is_some() {
        let progress = std::sync::atomic::AtomicU64::new(0);
        let report = sheaf_read::verify::verify(&img, &progress);
        if !report.errors.is_empty() {
            damaged = Some(report.errors);
        }
    }
    if a.json {
        let sigs = signatures_json(&c);
        writeln!(
            io.stdout,
            "{}",
            serde_json::json!({"image": a.image.display().to_string(), "root": format!("blake3:{root}"),
                "trusted": c.trusted().is_some(), "signatures": sigs,
                "full": a.full, "damage": damaged})
        )?;
    } else {
        writeln!(io.stdout, "{}: root blake3:{root}", a.image.display())?;
        print_checked(&c, io)?;
        if let Some(p) = &damaged {
            for l in p.iter().take(20) {
                writeln!(io.stdout, "  damage: {l}")?;
            }
        } else if a.full && c.trusted().is_some() {
            writeln!(io.stdout, "  every page and block matches the signed root")?;
        }
    }
    Ok(if c.trusted().is_some() && damaged.is_none() {
        0
    } else {
        1
    })
}

/// `sheaf root`: the exact message a signature signs.
pub fn root(image: &Path, remote: &crate::util::RemoteArgs, io: &mut crate::Io<'_>) -> Result<i32> {
    let img = crate::util::open_image(image, remote)?;
    write!(io.stdout, "{}", img.signed_message())?;
    Ok(0)
}

/// `sheaf keygen`.
pub fn keygen(path: &Path, identity: &str, io: &mut crate::Io<'_>) -> Result<i32> {
    let line = sheaf_trust::keygen(path, identity)?;
    writeln!(
        io.stderr,
        "wrote {} and {}.pub; the allowed_signers line:",
        path.display(),
        path.display()
    )?;
    writeln!(io.stdout, "{line}")?;
    Ok(0)
}
