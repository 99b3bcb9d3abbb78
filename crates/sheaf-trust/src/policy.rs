//! The site signature policy: whether an image must carry a trusted
//! signature before it is used, and who is trusted.
//!
//! The policy comes from the command line and the site configuration
//! (`SHEAF_CONFIG`, else `/etc/sheaf/config.toml`, section `[signatures]`);
//! flags add to the site policy, never relax it. Every command that uses an
//! image (mount, run, and later bcast, pool, the snapshotter) applies the
//! same [`Policy::enforce`], so there is one rule for the whole tool.

use crate::{check, AllowedSigners, Rejection, TrustError, Verified};
use std::path::{Path, PathBuf};

/// Where the site configuration is read from when `SHEAF_CONFIG` is unset.
pub const SITE_CONFIG: &str = "/etc/sheaf/config.toml";

/// Why the policy could not be read or refused an image.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The configuration file could not be read.
    #[error("{path}")]
    ConfigRead {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// `SHEAF_CONFIG` names a file that does not exist.
    #[error("SHEAF_CONFIG={path}: no such file (fix the path, or unset SHEAF_CONFIG to use /etc/sheaf/config.toml)")]
    ConfigMissing {
        /// The file.
        path: String,
    },
    /// The configuration file is not valid TOML.
    #[error("{path}: {detail}")]
    ConfigSyntax {
        /// The file.
        path: String,
        /// The parser's message, on one line.
        detail: String,
    },
    /// Signatures are required but nobody is trusted.
    #[error("signatures are required but no signers file is set (--signers FILE, or signers in the config)")]
    NoSigners,
    /// The allowed_signers file or a detached signature could not be read.
    #[error(transparent)]
    Trust(#[from] TrustError),
    /// No signature of the image is trusted.
    #[error("{image}: refused: no trusted signature ({why})")]
    Refused {
        /// The image as the user named it.
        image: String,
        /// One line per signature, joined: why each was rejected.
        why: String,
    },
}

/// Signature policy: from flags, else the site config.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    /// Refuse images without a trusted signature.
    pub require: bool,
    /// Trusted keys (an OpenSSH allowed_signers file).
    pub signers: Option<PathBuf>,
    /// Required principal.
    pub identity: Option<String>,
}

/// The site configuration file in force.
pub fn config_path() -> PathBuf {
    std::env::var_os("SHEAF_CONFIG")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(SITE_CONFIG))
}

/// The site configuration file in force ([`config_path`]), checked: a file
/// that `SHEAF_CONFIG` names must exist, since a mistyped path would
/// otherwise drop the site's policy without a word (only the default
/// `/etc/sheaf/config.toml` may be absent: no site policy). The one rule
/// every reader of the configuration (signatures, pools) goes through.
pub fn site_config() -> Result<PathBuf, PolicyError> {
    let path = config_path();
    if std::env::var_os("SHEAF_CONFIG").is_some() && std::fs::symlink_metadata(&path).is_err() {
        return Err(PolicyError::ConfigMissing {
            path: path.display().to_string(),
        });
    }
    Ok(path)
}

impl Policy {
    /// Combine command-line flags with the site configuration
    /// ([`config_path`]).
    pub fn load(
        require: bool,
        signers: Option<PathBuf>,
        identity: Option<String>,
    ) -> Result<Self, PolicyError> {
        Self::load_from(&site_config()?, require, signers, identity)
    }

    /// As [`Policy::load`], with the configuration at `path` (a missing
    /// file is an empty configuration).
    pub fn load_from(
        path: &Path,
        require: bool,
        signers: Option<PathBuf>,
        identity: Option<String>,
    ) -> Result<Self, PolicyError> {
        let mut p = Policy {
            require,
            signers,
            identity,
        };
        match std::fs::read_to_string(path) {
            Ok(text) => {
                let v: toml::Table =
                    text.parse()
                        .map_err(|e: toml::de::Error| PolicyError::ConfigSyntax {
                            path: path.display().to_string(),
                            detail: one_line(&e.to_string()),
                        })?;
                if let Some(t) = v.get("signatures").and_then(|s| s.as_table()) {
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
            Err(e) => {
                return Err(PolicyError::ConfigRead {
                    path: path.display().to_string(),
                    source: e,
                })
            }
        }
        if p.require && p.signers.is_none() {
            return Err(PolicyError::NoSigners);
        }
        Ok(p)
    }

    /// Refuse an image unless it carries a trusted signature (when
    /// required). `message` is the image's signed message, `appended` the
    /// signatures stored in it, `image` where the user named it (a
    /// detached `IMAGE.sig` beside it counts too).
    pub fn enforce(
        &self,
        message: &str,
        appended: &[Vec<u8>],
        image: &Path,
    ) -> Result<Option<Verified>, PolicyError> {
        if !self.require {
            return Ok(None);
        }
        let signers = self.signers.as_ref().ok_or(PolicyError::NoSigners)?;
        let c = check_signatures(message, appended, image, signers, self.identity.as_deref())?;
        match c.trusted() {
            Some(v) => Ok(Some(v.clone())),
            None => Err(PolicyError::Refused {
                image: image.display().to_string(),
                why: c.why_not(),
            }),
        }
    }
}

/// Outcome of checking an image's signatures.
#[derive(Debug)]
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

/// Where a detached signature of `image` is looked for: `IMAGE.sig`.
pub fn detached_path(image: &Path) -> PathBuf {
    let mut s = image.as_os_str().to_owned();
    s.push(".sig");
    PathBuf::from(s)
}

/// Every signature of an image: the `appended` ones, then `IMAGE.sig` if it
/// exists, each with where it came from.
pub fn signatures_of(
    appended: &[Vec<u8>],
    image: &Path,
) -> Result<Vec<(String, Vec<u8>)>, TrustError> {
    let mut v: Vec<(String, Vec<u8>)> = appended
        .iter()
        .enumerate()
        .map(|(i, s)| (format!("signature {}", i + 1), s.clone()))
        .collect();
    let d = detached_path(image);
    match std::fs::read(&d) {
        Ok(b) => v.push((d.display().to_string(), b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(TrustError::Io {
                what: d.display().to_string(),
                cause: e,
            })
        }
    }
    Ok(v)
}

/// Check every signature of an image against the allowed_signers file
/// `signers`, for `identity` if given.
pub fn check_signatures(
    message: &str,
    appended: &[Vec<u8>],
    image: &Path,
    signers: &Path,
    identity: Option<&str>,
) -> Result<Checked, TrustError> {
    let allowed = AllowedSigners::load(signers)?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let results = signatures_of(appended, image)?
        .into_iter()
        .map(|(w, s)| (w, check(&s, message.as_bytes(), &allowed, identity, now)))
        .collect();
    Ok(Checked { results })
}

fn one_line(s: &str) -> String {
    s.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_add_to_the_site_policy_and_never_relax_it() {
        let t = tempfile::tempdir().unwrap();
        let conf = t.path().join("config.toml");
        std::fs::write(
            &conf,
            "[signatures]\nrequire = true\nsigners = \"/etc/site_signers\"\nidentity = \"ops\"\n",
        )
        .unwrap();
        // The site requires signatures even when the flag does not.
        let p = Policy::load_from(&conf, false, None, None).unwrap();
        assert!(p.require);
        assert_eq!(p.signers.as_deref(), Some(Path::new("/etc/site_signers")));
        assert_eq!(p.identity.as_deref(), Some("ops"));
        // Flags name their own signers and identity.
        let p = Policy::load_from(&conf, false, Some("mine".into()), Some("me".into())).unwrap();
        assert!(p.require);
        assert_eq!(p.signers.as_deref(), Some(Path::new("mine")));
        assert_eq!(p.identity.as_deref(), Some("me"));
        // No file: only the flags; requiring without signers is refused.
        let none = t.path().join("absent.toml");
        assert_eq!(
            Policy::load_from(&none, false, None, None).unwrap(),
            Policy::default()
        );
        assert!(matches!(
            Policy::load_from(&none, true, None, None),
            Err(PolicyError::NoSigners)
        ));
        // A broken file is named, on one line.
        std::fs::write(&conf, "[signatures\nrequire = yes\n").unwrap();
        let e = Policy::load_from(&conf, false, None, None).unwrap_err();
        let msg = e.to_string();
        assert!(msg.starts_with(&conf.display().to_string()) && !msg.contains('\n'));
    }

    #[test]
    fn an_unsigned_image_is_refused_only_when_signatures_are_required() {
        let t = tempfile::tempdir().unwrap();
        let signers = t.path().join("allowed_signers");
        std::fs::write(&signers, "").unwrap();
        let img = t.path().join("x.sheaf");
        let open = Policy::default();
        assert_eq!(open.enforce("msg", &[], &img).unwrap(), None);
        let strict = Policy {
            require: true,
            signers: Some(signers),
            identity: None,
        };
        let e = strict.enforce("msg", &[], &img).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "{}: refused: no trusted signature (no signature)",
                img.display()
            )
        );
    }
}
