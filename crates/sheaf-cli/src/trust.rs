//! `sheaf sign`, `sheaf verify`, `sheaf root`, `sheaf keygen`, and the
//! signature policy applied before mounting.

use anyhow::{Context, Result};
use clap::Args;
use sheaf_format::signatures::{encode_block, SIG_FOOTER_LEN};
use sheaf_read::Image;
use sheaf_trust::policy::detached_path;
use sheaf_trust::{Checked, Policy, Verified};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Arguments of `sheaf sign`.
#[derive(Args, Debug)]
pub struct SignArgs {
    /// The image to sign.
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

Signatures checked: those appended to the image by `sheaf sign`, plus IMAGE.sig
if it exists (a detached signature, e.g. from `sheaf root IMAGE | ssh-keygen -Y
sign -n sheaf -f KEY - > IMAGE.sig`).")]
pub struct VerifyArgs {
    /// The image.
    image: PathBuf,
    /// OpenSSH allowed_signers file of trusted keys.
    #[arg(long, value_name = "FILE")]
    signers: PathBuf,
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

/// `sheaf sign`.
pub fn sign(a: SignArgs, remote: &crate::util::RemoteArgs) -> Result<i32> {
    let img = crate::util::open_image(&a.image, remote)?;
    let msg = img.signed_message();
    let pem = sheaf_trust::sign(&a.key, msg.as_bytes())?;
    let who = a.identity.as_deref().unwrap_or("key");
    if a.detached {
        let d = detached_path(&a.image);
        let mut o = std::fs::OpenOptions::new();
        o.write(true);
        if a.force {
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
        println!(
            "{}: {who} signed root blake3:{}",
            d.display(),
            sheaf_format::hex(&img.root_digest())
        );
        return Ok(0);
    }
    let mut sigs = img.signatures().to_vec();
    if sigs.iter().any(|s| s == pem.as_bytes()) {
        println!("{}: already carries this signature", a.image.display());
        return Ok(0);
    }
    sigs.push(pem.into_bytes());
    // Append a complete new block: the image bytes and any old block stay
    // untouched, so an interrupted signing leaves the last good state.
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
    println!(
        "{}: {who} signed root blake3:{} ({} signature{})",
        a.image.display(),
        sheaf_format::hex(&img.root_digest()),
        sigs.len(),
        if sigs.len() == 1 { "" } else { "s" }
    );
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

/// `sheaf verify`.
pub fn verify(a: VerifyArgs, remote: &crate::util::RemoteArgs) -> Result<i32> {
    let img = crate::util::open_image(&a.image, remote)?;
    let c = check_image(&img, &a.image, &a.signers, a.identity.as_deref())?;
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
        let sigs: Vec<serde_json::Value> = c
            .results
            .iter()
            .map(|(w, r)| match r {
                Ok(v) => serde_json::json!({"signature": w, "trusted": true,
                    "principals": v.principals, "key": v.fingerprint, "algorithm": v.algorithm}),
                Err(e) => {
                    serde_json::json!({"signature": w, "trusted": false, "reason": e.to_string()})
                }
            })
            .collect();
        println!(
            "{}",
            serde_json::json!({"image": a.image.display().to_string(), "root": format!("blake3:{root}"),
                "trusted": c.trusted().is_some(), "signatures": sigs,
                "full": a.full, "damage": damaged})
        );
    } else {
        println!("{}: root blake3:{root}", a.image.display());
        if c.results.is_empty() {
            println!("  no signature");
        }
        for (w, r) in &c.results {
            match r {
                Ok(v) => println!(
                    "  {w}: good, signed by {} ({} {})",
                    v.principals.join(", "),
                    v.algorithm,
                    v.fingerprint
                ),
                Err(e) => println!("  {w}: rejected: {e}"),
            }
        }
        if let Some(p) = &damaged {
            for l in p.iter().take(20) {
                println!("  damage: {l}");
            }
        } else if a.full && c.trusted().is_some() {
            println!("  every page and block matches the signed root");
        }
    }
    Ok(if c.trusted().is_some() && damaged.is_none() {
        0
    } else {
        1
    })
}

/// `sheaf root`: the exact message a signature signs.
pub fn root(image: &Path, remote: &crate::util::RemoteArgs) -> Result<i32> {
    let img = crate::util::open_image(image, remote)?;
    print!("{}", img.signed_message());
    Ok(0)
}

/// `sheaf keygen`.
pub fn keygen(path: &Path, identity: &str) -> Result<i32> {
    let line = sheaf_trust::keygen(path, identity)?;
    eprintln!(
        "wrote {} and {}.pub; the allowed_signers line:",
        path.display(),
        path.display()
    );
    println!("{line}");
    Ok(0)
}
