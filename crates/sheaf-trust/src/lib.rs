//! Trust: signing an image's root digest with OpenSSH keys and checking
//! signatures against an OpenSSH `allowed_signers` file.
//!
//! Owns the signature policy: the namespace (`sheaf`), the hash (SHA-512),
//! which keys and principals are trusted and when. Signatures are OpenSSH
//! `SSHSIG`s over the image's signed message (see
//! `sheaf_read::signed_message`), so `ssh-keygen -Y sign -n sheaf` and
//! `ssh-keygen -Y verify` interoperate both ways; [`policy`] is the site
//! rule every command applies before it uses an image. It knows nothing of
//! where signatures are stored in an image (that is `sheaf-format`) or of
//! mounts.

#![warn(missing_docs)]

pub mod allowed;
pub mod policy;

pub use allowed::{AllowedSigners, Signer};
pub use policy::{Checked, Policy, PolicyError};
use ssh_key::{HashAlg, LineEnding, PrivateKey, PublicKey, SshSig};
use std::path::Path;

/// The SSHSIG namespace of sheaf signatures.
pub const NAMESPACE: &str = "sheaf";

/// Errors of signing and of reading trust files.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    /// A bad line in an allowed_signers file.
    #[error("{file}:{line}: {why}")]
    Signers {
        /// The file.
        file: String,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        why: String,
    },
    /// A file could not be read or written.
    #[error("{what}: {cause}")]
    Io {
        /// The file.
        what: String,
        /// Why.
        #[source]
        cause: std::io::Error,
    },
    /// A key could not be used.
    #[error("{path}: {why}")]
    Key {
        /// The key file.
        path: String,
        /// Why.
        why: String,
    },
    /// The ssh-agent could not sign.
    #[error("ssh-agent: {0}")]
    Agent(String),
}

/// Sign `message` with the key at `path`, returning the `SSHSIG` PEM text.
///
/// An unencrypted OpenSSH private key signs here. A passphrase-protected
/// private key, or a public key (`.pub`), is handed to the running
/// `ssh-agent` (`SSH_AUTH_SOCK`), which must hold the matching private key:
/// the private key never leaves the agent.
pub fn sign(path: &Path, message: &[u8]) -> Result<String, TrustError> {
    let kerr = |why: String| TrustError::Key {
        path: path.display().to_string(),
        why,
    };
    let text = std::fs::read_to_string(path).map_err(|e| TrustError::Io {
        what: path.display().to_string(),
        cause: e,
    })?;
    let public = if let Ok(private) = PrivateKey::from_openssh(&text) {
        if !private.is_encrypted() {
            let sig = match private.key_data() {
                ssh_key::private::KeypairData::Rsa(r) => sign_rsa(r, private.public_key(), message),
                _ => private
                    .sign(NAMESPACE, HashAlg::Sha512, message)
                    .map_err(|e| e.to_string()),
            }
            .map_err(|e| kerr(format!("cannot sign: {e}")))?;
            return pem(&sig).map_err(kerr);
        }
        private.public_key().clone()
    } else if let Ok(p) = PublicKey::from_openssh(text.trim()) {
        p
    } else if text
        .trim_start()
        .starts_with("-----BEGIN OPENSSH PRIVATE KEY-----")
    {
        // A private key the ssh-key crate cannot read (0.6 refuses about one
        // ECDSA key in 300 that ssh-keygen makes: a private scalar with a
        // leading zero byte): OpenSSH's own ssh-keygen signs with it.
        return sign_with_ssh_keygen(path, message).map_err(kerr);
    } else {
        return Err(kerr(
            "not an OpenSSH private or public key (ssh-keygen -t ed25519 makes one)".into(),
        ));
    };
    sign_with_agent(&public, message)
}

/// `ssh-keygen -Y sign -n sheaf -O hashalg=sha512 -f KEY`, the message on
/// stdin, the armored SSHSIG on stdout (checked before it is returned).
fn sign_with_ssh_keygen(path: &Path, message: &[u8]) -> Result<String, String> {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new("ssh-keygen")
        .args([
            "-q",
            "-Y",
            "sign",
            "-n",
            NAMESPACE,
            "-O",
            "hashalg=sha512",
            "-f",
        ])
        .arg(path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("running ssh-keygen to sign: {e}"))?;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(message)
        .map_err(|e| format!("ssh-keygen: {e}"))?;
    let out = child
        .wait_with_output()
        .map_err(|e| format!("ssh-keygen: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!(
            "ssh-keygen could not sign: {}",
            err.lines().last().unwrap_or("").trim()
        ));
    }
    let text = String::from_utf8(out.stdout).map_err(|e| format!("ssh-keygen: {e}"))?;
    SshSig::from_pem(text.trim()).map_err(|e| format!("ssh-keygen's signature: {e}"))?;
    Ok(text)
}

/// RSA through the `rsa` crate directly: ssh-key 0.6's own conversion of
/// OpenSSH RSA keys fails ("cryptographic error") on keys ssh-keygen makes.
fn sign_rsa(
    r: &ssh_key::private::RsaKeypair,
    public: &PublicKey,
    message: &[u8],
) -> Result<SshSig, String> {
    use rsa::signature::{SignatureEncoding, Signer as _};
    let big = |m: &ssh_key::Mpint| {
        m.as_positive_bytes()
            .map(rsa::BigUint::from_bytes_be)
            .ok_or_else(|| "malformed RSA key".to_string())
    };
    let key = rsa::RsaPrivateKey::from_components(
        big(&r.public.n)?,
        big(&r.public.e)?,
        big(&r.private.d)?,
        vec![big(&r.private.p)?, big(&r.private.q)?],
    )
    .map_err(|e| e.to_string())?;
    let data =
        SshSig::signed_data(NAMESPACE, HashAlg::Sha512, message).map_err(|e| e.to_string())?;
    let raw = rsa::pkcs1v15::SigningKey::<sha2::Sha512>::new(key)
        .try_sign(&data)
        .map_err(|e| e.to_string())?
        .to_vec();
    let signature = ssh_key::Signature::new(
        ssh_key::Algorithm::Rsa {
            hash: Some(HashAlg::Sha512),
        },
        raw,
    )
    .map_err(|e| e.to_string())?;
    SshSig::new(
        public.key_data().clone(),
        NAMESPACE,
        HashAlg::Sha512,
        signature,
    )
    .map_err(|e| e.to_string())
}

fn pem(sig: &SshSig) -> Result<String, String> {
    sig.to_pem(LineEnding::LF)
        .map_err(|e| format!("cannot encode the signature: {e}"))
}

/// Sign `message` through the ssh-agent with the private key of `public`.
pub fn sign_with_agent(public: &PublicKey, message: &[u8]) -> Result<String, TrustError> {
    let sock = std::env::var_os("SSH_AUTH_SOCK").ok_or_else(|| {
        TrustError::Agent(
            "the key is passphrase-protected or public, and SSH_AUTH_SOCK is not set \
             (start ssh-agent and ssh-add the key)"
                .into(),
        )
    })?;
    let mut client = ssh_agent_client_rs::Client::connect(Path::new(&sock))
        .map_err(|e| TrustError::Agent(format!("cannot connect to {:?}: {e}", sock)))?;
    let held = client
        .list_all_identities()
        .map_err(|e| TrustError::Agent(e.to_string()))?;
    if !held
        .iter()
        .any(|k| <&ssh_key::public::KeyData>::from(k) == public.key_data())
    {
        return Err(TrustError::Agent(format!(
            "does not hold the key {} (ssh-add it)",
            public.fingerprint(HashAlg::Sha256)
        )));
    }
    let data = SshSig::signed_data(NAMESPACE, HashAlg::Sha512, message)
        .map_err(|e| TrustError::Agent(e.to_string()))?;
    let signature = client
        .sign(public.clone(), &data)
        .map_err(|e| TrustError::Agent(format!("refused to sign: {e}")))?;
    let sig = SshSig::new(
        public.key_data().clone(),
        NAMESPACE,
        HashAlg::Sha512,
        signature,
    )
    .map_err(|e| TrustError::Agent(e.to_string()))?;
    pem(&sig).map_err(TrustError::Agent)
}

/// A signature that checked out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// Principals of the allowed_signers lines that accept it.
    pub principals: Vec<String>,
    /// SHA-256 fingerprint of the key.
    pub fingerprint: String,
    /// Key algorithm.
    pub algorithm: String,
}

/// Why a signature was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    /// Not an SSHSIG at all.
    #[error("unreadable signature: {0}")]
    Unreadable(String),
    /// Made for another purpose.
    #[error("wrong namespace '{0}' (sheaf signatures use '{NAMESPACE}')")]
    WrongNamespace(String),
    /// The key is in no allowed_signers line.
    #[error("unknown key {0}")]
    UnknownKey(String),
    /// The signature does not match the image's root digest.
    #[error("bad signature by {0}: it does not sign this image's root digest")]
    BadSignature(String),
    /// The key's line does not allow the sheaf namespace.
    #[error("key {0} is not allowed to sign in namespace '{NAMESPACE}'")]
    NamespaceNotAllowed(String),
    /// The key is not trusted for the identity asked for.
    #[error("key {fingerprint} is not trusted for identity '{identity}'")]
    NotForIdentity {
        /// Key fingerprint.
        fingerprint: String,
        /// The identity asked for.
        identity: String,
    },
    /// Not valid yet.
    #[error("key {0} is not valid yet (valid-after)")]
    NotYetValid(String),
    /// Expired.
    #[error("key {0} has expired (valid-before)")]
    Expired(String),
}

/// Check one signature (PEM text) over `message` against `signers`, for
/// `identity` if given, at time `now` (seconds since the epoch).
pub fn check(
    sig_pem: &[u8],
    message: &[u8],
    signers: &AllowedSigners,
    identity: Option<&str>,
    now: i64,
) -> Result<Verified, Rejection> {
    let sig = SshSig::from_pem(sig_pem).map_err(|e| Rejection::Unreadable(e.to_string()))?;
    let public = PublicKey::from(sig.public_key().clone());
    let fp = public.fingerprint(HashAlg::Sha256).to_string();
    if sig.namespace() != NAMESPACE {
        return Err(Rejection::WrongNamespace(sig.namespace().to_string()));
    }
    let lines: Vec<&Signer> = signers
        .signers
        .iter()
        .filter(|s| !s.cert_authority && s.key.key_data() == public.key_data())
        .collect();
    if lines.is_empty() {
        return Err(Rejection::UnknownKey(fp));
    }
    public
        .verify(NAMESPACE, message, &sig)
        .map_err(|_| Rejection::BadSignature(fp.clone()))?;
    let mut principals = Vec::new();
    let mut why = None;
    for s in lines {
        let reason = if let Some(id) =
            identity.filter(|id| !s.principals.iter().any(|p| allowed::pattern_match(p, id)))
        {
            Some(Rejection::NotForIdentity {
                fingerprint: fp.clone(),
                identity: id.to_string(),
            })
        } else if s
            .namespaces
            .as_ref()
            .is_some_and(|ns| !ns.iter().any(|n| allowed::pattern_match(n, NAMESPACE)))
        {
            Some(Rejection::NamespaceNotAllowed(fp.clone()))
        } else if s.valid_after.is_some_and(|t| now < t) {
            Some(Rejection::NotYetValid(fp.clone()))
        } else if s.valid_before.is_some_and(|t| now >= t) {
            Some(Rejection::Expired(fp.clone()))
        } else {
            None
        };
        match reason {
            None => principals.extend(s.principals.iter().cloned()),
            Some(r) => {
                why.get_or_insert(r);
            }
        }
    }
    if principals.is_empty() {
        return Err(why.expect("some line was rejected"));
    }
    Ok(Verified {
        principals,
        fingerprint: fp,
        algorithm: public.algorithm().to_string(),
    })
}

/// Write a new ed25519 key pair (`path` and `path.pub`, OpenSSH format,
/// private file mode 0600) and return the allowed_signers line for it.
pub fn keygen(path: &Path, identity: &str) -> Result<String, TrustError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let io = |what: &Path, e: std::io::Error| TrustError::Io {
        what: what.display().to_string(),
        cause: e,
    };
    let mut seed = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut seed))
        .map_err(|e| io(Path::new("/dev/urandom"), e))?;
    let kp = ssh_key::private::Ed25519Keypair::from_seed(&seed);
    let mut key = PrivateKey::from(kp);
    key.set_comment(identity);
    let text = key
        .to_openssh(LineEnding::LF)
        .map_err(|e| TrustError::Key {
            path: path.display().to_string(),
            why: e.to_string(),
        })?;
    let public = key.public_key().to_openssh().map_err(|e| TrustError::Key {
        path: path.display().to_string(),
        why: e.to_string(),
    })?;
    let pub_path = path.with_extension(match path.extension() {
        Some(e) => format!("{}.pub", e.to_string_lossy()),
        None => "pub".into(),
    });
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| io(path, e))?;
    f.write_all(text.as_bytes()).map_err(|e| io(path, e))?;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(&pub_path)
        .and_then(|mut f| writeln!(f, "{public}"))
        .map_err(|e| io(&pub_path, e))?;
    let body = public
        .split_whitespace()
        .take(2)
        .collect::<Vec<_>>()
        .join(" ");
    Ok(format!("{identity} namespaces=\"{NAMESPACE}\" {body}"))
}

/// What a signature claims, without checking it: `(algorithm, key
/// fingerprint, namespace)`, for listings.
pub fn describe(sig_pem: &[u8]) -> Result<(String, String, String), Rejection> {
    let sig = SshSig::from_pem(sig_pem).map_err(|e| Rejection::Unreadable(e.to_string()))?;
    let public = PublicKey::from(sig.public_key().clone());
    Ok((
        public.algorithm().to_string(),
        public.fingerprint(HashAlg::Sha256).to_string(),
        sig.namespace().to_string(),
    ))
}
