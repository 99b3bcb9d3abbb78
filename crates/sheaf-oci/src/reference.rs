//! Image references: where an image comes from.

use crate::digest::Digest;
use crate::error::{OciError, Result};
use std::path::PathBuf;

/// What a registry reference names: a tag or a manifest digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tagged {
    /// `:TAG` (default `latest`).
    Tag(String),
    /// `@sha256:…`: the manifest (or index) must hash to this.
    Digest(Digest),
}

/// A parsed image reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reference {
    /// `docker://HOST[:PORT]/REPO[:TAG|@DIGEST]`.
    Registry {
        /// `HOST[:PORT]` (`docker.io` when the reference names none).
        host: String,
        /// The repository path (`library/NAME` for a bare Docker Hub name).
        repo: String,
        /// Tag or digest.
        tagged: Tagged,
    },
    /// `oci:DIR[:TAG]`: an OCI image layout directory.
    OciDir {
        /// The layout directory.
        dir: PathBuf,
        /// The `org.opencontainers.image.ref.name` to pick, if several.
        tag: Option<String>,
    },
    /// `docker-archive:FILE`: what `docker save` writes.
    DockerArchive(PathBuf),
}

fn valid_tag(t: &str) -> bool {
    !t.is_empty()
        && t.len() <= 128
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
        && !t.starts_with(['.', '-'])
}

fn valid_repo(r: &str) -> bool {
    !r.is_empty()
        && r.split('/').all(|c| {
            !c.is_empty()
                && c.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
                && c.starts_with(|ch: char| ch.is_ascii_alphanumeric())
        })
}

impl Reference {
    /// Parse one of the accepted forms.
    pub fn parse(s: &str) -> Result<Reference> {
        let bad = || OciError::BadRef(s.to_string());
        if let Some(rest) = s.strip_prefix("docker://") {
            let (name, tagged) = if let Some((n, d)) = rest.split_once('@') {
                (n, Tagged::Digest(Digest::parse(d).ok_or_else(bad)?))
            } else {
                // A ':' after the last '/' is a tag; before it, a port.
                match rest.rfind(':') {
                    Some(i) if !rest[i..].contains('/') => {
                        (&rest[..i], Tagged::Tag(rest[i + 1..].to_string()))
                    }
                    _ => (rest, Tagged::Tag("latest".into())),
                }
            };
            if let Tagged::Tag(t) = &tagged {
                if !valid_tag(t) {
                    return Err(bad());
                }
            }
            let (first, after) = name.split_once('/').unwrap_or(("", name));
            let is_host = first.contains(['.', ':']) || first == "localhost";
            let (host, repo) = if is_host {
                (first.to_string(), after.to_string())
            } else if name.contains('/') {
                ("docker.io".to_string(), name.to_string())
            } else {
                ("docker.io".to_string(), format!("library/{name}"))
            };
            if !valid_repo(&repo) || host.is_empty() {
                return Err(bad());
            }
            return Ok(Reference::Registry { host, repo, tagged });
        }
        if let Some(rest) = s.strip_prefix("oci:") {
            // oci:DIR:TAG — the tag is after the last ':' if that is not
            // part of the path (a tag has no '/').
            let (dir, tag) = match rest.rfind(':') {
                Some(i) if !rest[i..].contains('/') && valid_tag(&rest[i + 1..]) => {
                    (&rest[..i], Some(rest[i + 1..].to_string()))
                }
                _ => (rest, None),
            };
            if dir.is_empty() {
                return Err(bad());
            }
            return Ok(Reference::OciDir {
                dir: dir.into(),
                tag,
            });
        }
        if let Some(f) = s.strip_prefix("docker-archive:") {
            if f.is_empty() {
                return Err(bad());
            }
            return Ok(Reference::DockerArchive(f.into()));
        }
        Err(bad())
    }
}

impl std::fmt::Display for Reference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reference::Registry { host, repo, tagged } => match tagged {
                Tagged::Tag(t) => write!(f, "docker://{host}/{repo}:{t}"),
                Tagged::Digest(d) => write!(f, "docker://{host}/{repo}@{d}"),
            },
            Reference::OciDir { dir, tag: Some(t) } => write!(f, "oci:{}:{t}", dir.display()),
            Reference::OciDir { dir, tag: None } => write!(f, "oci:{}", dir.display()),
            Reference::DockerArchive(p) => write!(f, "docker-archive:{}", p.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg(s: &str) -> (String, String, Tagged) {
        match Reference::parse(s).unwrap() {
            Reference::Registry { host, repo, tagged } => (host, repo, tagged),
            r => panic!("{r:?}"),
        }
    }

    #[test]
    fn registry_references_split_host_port_repo_and_tag() {
        let t = |s: &str| Tagged::Tag(s.into());
        assert_eq!(
            reg("docker://127.0.0.1:5000/a/b:1.0"),
            ("127.0.0.1:5000".into(), "a/b".into(), t("1.0"))
        );
        assert_eq!(
            reg("docker://localhost/x"),
            ("localhost".into(), "x".into(), t("latest"))
        );
        assert_eq!(
            reg("docker://debian:12"),
            ("docker.io".into(), "library/debian".into(), t("12"))
        );
        assert_eq!(
            reg("docker://org/app"),
            ("docker.io".into(), "org/app".into(), t("latest"))
        );
        let d = format!("sha256:{}", "0".repeat(64));
        assert_eq!(
            reg(&format!("docker://h.example:1/r@{d}")).2,
            Tagged::Digest(Digest::parse(&d).unwrap())
        );
        for bad in [
            "docker://",
            "docker://h.x/R",
            "docker://h.x/a:b/c",
            "docker://h.x/a@sha256:12",
            "docker://h.x/a:-x",
            "nope",
            "docker://h.x/../a",
        ] {
            assert!(Reference::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn layout_and_archive_references() {
        assert_eq!(
            Reference::parse("oci:/tmp/img:v1").unwrap(),
            Reference::OciDir {
                dir: "/tmp/img".into(),
                tag: Some("v1".into())
            }
        );
        assert_eq!(
            Reference::parse("oci:./a:b/img").unwrap(),
            Reference::OciDir {
                dir: "./a:b/img".into(),
                tag: None
            }
        );
        assert_eq!(
            Reference::parse("docker-archive:x.tar").unwrap(),
            Reference::DockerArchive("x.tar".into())
        );
    }
}
