//! `sheaf sign`, `sheaf verify`, `sheaf root`, `sheaf keygen`, and the
//! signature policy applied before mounting.

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use sheaf_format::signatures::{encode_block, SIG_FOOTER_LEN};
use sheaf_read::Image;
use sheaf_trust::{AllowedSigners, Rejection, Verified};
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

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

fn detached_path(image: &Path) -> PathBuf {
    let mut s = image.as_os_str().to_owned();
    s.push(".sig");
    PathBuf::from(s)
}

/// Every signature of an image: appended ones, then IMAGE.sig if present.
fn all_signatures(img: &Image, path: &Path) -> Result<Vec<(String, Vec<u8>)>> {
    let mut v: Vec<(String, Vec<u8>)> = img
        .signatures()
        .iter()
        .enumerate()
        .map(|(i, s)| (format!("signature {}", i + 1), s.clone()))
        .collect();
    let d = detached_path(path);
    match std::fs::read(&d) {
        Ok(b) => v.push((d.display().to_string(), b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => bail!("{}: {e}", d.display()),
    }
    Ok(v)
}

/// `sheaf sign`.
pub fn sign(a: SignArgs) -> Result<i32> {
    let img = crate::util::open_image(&a.image)?;
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

/// Outcome of checking an image's signatures.
pub struct Checked {
    /// Per signature: where it came from, and the result.
    pub results: Vec<(String, Result<Verified, Rejection>)>,
}

impl Checked {
    /// The first accepted signature.
    pub fn trusted(&self) -> Option<&Verified> {
        self.results.iter().find_map(|(_, r)| r.as_ref().ok())
    }

    /// One line saying why nothing was trusted.
    pub fn why_not(&self) -> String {
        if self.results.is_empty() {
            return "no signature".into();
        }
        self.results
            .iter()
            .map(|(w, r)| match r {
                Err(e) => format!("{w}: {e}"),
                Ok(_) => format!("{w}: ok"),
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// Check every signature of `img` against `signers`.
pub fn check_image(
    img: &Image,
    path: &Path,
    signers: &Path,
    identity: Option<&str>,
) -> Result<Checked> {
    let allowed = AllowedSigners::load(signers)?;
    let msg = img.signed_message();
    let results = all_signatures(img, path)?
        .into_iter()
        .map(|(w, s)| {
            let r = sheaf_trust::check(&s, msg.as_bytes(), &allowed, identity, now());
            (w, r)
        })
        .collect();
    Ok(Checked { results })
}

/// `sheaf verify`.
pub fn verify(a: VerifyArgs) -> Result<i32> {
    let img = crate::util::open_image(&a.image)?;
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
pub fn root(image: &Path) -> Result<i32> {
    let img = crate::util::open_image(image)?;
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

/// Signature policy for mounting: from flags, else the site config.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    /// Refuse images without a trusted signature.
    pub require: bool,
    /// Trusted keys.
    pub signers: Option<PathBuf>,
    /// Required principal.
    pub identity: Option<String>,
}

impl Policy {
    /// Combine command-line flags with the config file (`SHEAF_CONFIG`, else
    /// `/etc/sheaf/config.toml`): flags add to, never relax, the site policy.
    pub fn load(require: bool, signers: Option<PathBuf>, identity: Option<String>) -> Result<Self> {
        let path = std::env::var_os("SHEAF_CONFIG")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/etc/sheaf/config.toml"));
        let mut p = Policy {
            require,
            signers,
            identity,
        };
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                let v: toml::Table = text.parse().map_err(|e: toml::de::Error| {
                    anyhow!("{}: {}", path.display(), one_line(&e.to_string()))
                })?;
                let sig = v.get("signatures").and_then(|s| s.as_table());
                if let Some(t) = sig {
                    if t.get("require").and_then(|x| x.as_bool()) == Some(true) {
                        p.require = true;
                    }
                    if p.signers.is_none() {
                        p.signers = t.get("signers").and_then(|x| x.as_str()).map(PathBuf::from);
                    }
                    if p.identity.is_none() {
                        p.identity = t.get("identity").and_then(|x| x.as_str()).map(String::from);
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => bail!("{}: {e}", path.display()),
        }
        if p.require && p.signers.is_none() {
            bail!("signatures are required but no signers file is set (--signers FILE, or signers in the config)");
        }
        Ok(p)
    }

    /// Refuse `img` unless it carries a trusted signature (when required).
    pub fn enforce(&self, img: &Image, path: &Path) -> Result<Option<Verified>> {
        if !self.require {
            return Ok(None);
        }
        let signers = self.signers.as_ref().expect("checked in load");
        let c = check_image(img, path, signers, self.identity.as_deref())?;
        match c.trusted() {
            Some(v) => Ok(Some(v.clone())),
            None => bail!(
                "{}: refused: no trusted signature ({})",
                path.display(),
                c.why_not()
            ),
        }
    }
}

fn one_line(s: &str) -> String {
    s.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}
