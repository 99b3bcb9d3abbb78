//! A registry (the OCI distribution API, `/v2/`), read with anonymous,
//! bearer-token or basic authentication. Credentials come from the files
//! the container tools share: `$REGISTRY_AUTH_FILE`, then
//! `$XDG_RUNTIME_DIR/containers/auth.json`, then `~/.docker/config.json`.
//!
//! Written here rather than with an async registry client: the importer is
//! a synchronous pipeline that streams each blob through two digests and a
//! decompressor into the packer, and the protocol it needs is three GETs.

use crate::digest::Digest;
use crate::error::{OciError, Result};
use crate::reference::Tagged;
use crate::source::{check_digest, read_bounded, Fetched, Source};
use std::io::Read;
use std::sync::Mutex;
use std::time::Duration;

/// The manifest kinds asked for, most wanted first.
const ACCEPT: &str = "application/vnd.oci.image.index.v1+json, \
application/vnd.docker.distribution.manifest.list.v2+json, \
application/vnd.oci.image.manifest.v1+json, \
application/vnd.docker.distribution.manifest.v2+json";

/// How a registry is reached.
#[derive(Debug, Clone, Default)]
pub struct RegistryOptions {
    /// Hosts (`HOST[:PORT]`) to reach over plain HTTP, as with
    /// `--insecure-registry`. Every other host is HTTPS.
    pub insecure: Vec<String>,
    /// A credentials file to use instead of the usual ones.
    pub auth_file: Option<std::path::PathBuf>,
}

/// One repository on one registry.
pub struct Registry {
    host: String,
    repo: String,
    tagged: Tagged,
    base: String,
    client: reqwest::blocking::Client,
    basic: Option<String>,
    token: Mutex<Option<String>>,
    /// Documents already fetched (the top one under ""), so a caller that
    /// resolves the reference and then imports it asks the registry once.
    docs: Mutex<std::collections::HashMap<String, Fetched>>,
}

/// The credentials (`user:password`, base64) the shared files hold for `host`.
fn credentials(host: &str, opts: &RegistryOptions) -> Option<String> {
    let mut files = Vec::new();
    if let Some(f) = &opts.auth_file {
        files.push(f.clone());
    } else {
        if let Some(f) = std::env::var_os("REGISTRY_AUTH_FILE") {
            files.push(f.into());
        }
        if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR") {
            files.push(std::path::Path::new(&d).join("containers/auth.json"));
        }
        if let Some(h) = std::env::var_os("HOME") {
            files.push(std::path::Path::new(&h).join(".docker/config.json"));
        }
    }
    let wanted = |key: &str| {
        let k = key
            .trim_start_matches("https://")
            .trim_start_matches("http://");
        let k = k.split('/').next().unwrap_or(k);
        k == host
            || (host == "docker.io" && (k == "index.docker.io" || k == "registry-1.docker.io"))
    };
    for f in files {
        let Ok(bytes) = std::fs::read(&f) else {
            continue;
        };
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
            log::warn!("{}: not JSON; ignored", f.display());
            continue;
        };
        // Docker's order: a helper for this registry, else the file's
        // store for all registries, else the inline `auths` entry.
        let v: DockerConfig = serde_json::from_value(v).unwrap_or_default();
        let helper = (v.cred_helpers.as_object())
            .and_then(|h| h.iter().find(|(k, _)| wanted(k)).map(|(_, n)| n))
            .or(v.creds_store.as_ref())
            .and_then(|n| n.as_str())
            .filter(|n| !n.is_empty());
        if let Some(name) = helper {
            if let Some(a) = from_helper(name, host) {
                return Some(a);
            }
        }
        if let Some(auths) = v.auths.as_object() {
            for (k, e) in auths {
                if wanted(k) {
                    let e = serde_json::from_value::<AuthEntry>(e.clone()).unwrap_or_default();
                    if let Some(a) = e.auth.as_ref().and_then(|a| a.as_str()) {
                        return Some(a.to_string());
                    }
                }
            }
        }
    }
    None
}

/// What sheaf reads of a Docker `config.json` (every field as found: a
/// field of an unexpected type is passed over, not an error).
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
struct DockerConfig {
    /// Registry → helper name.
    #[serde(rename = "credHelpers")]
    cred_helpers: serde_json::Value,
    /// The helper for all registries.
    #[serde(rename = "credsStore")]
    creds_store: Option<serde_json::Value>,
    /// Registry → inline credentials.
    auths: serde_json::Value,
}

/// An `auths` entry.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
struct AuthEntry {
    /// `user:password`, base64.
    auth: Option<serde_json::Value>,
}

/// A credential helper's answer.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
struct HelperAnswer {
    #[serde(rename = "Username")]
    username: Option<serde_json::Value>,
    #[serde(rename = "Secret")]
    secret: Option<serde_json::Value>,
}

/// A token service's answer (either name, as the distribution spec allows).
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
struct TokenAnswer {
    token: Option<serde_json::Value>,
    access_token: Option<serde_json::Value>,
}

/// A registry's refusal: `{"errors":[{"code","message"}]}`.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
struct Refusal {
    errors: Vec<serde_json::Value>,
}

/// One error of a [`Refusal`].
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
struct RefusalError {
    code: Option<serde_json::Value>,
    message: Option<serde_json::Value>,
}

/// Ask the credential helper `docker-credential-NAME` (Docker's protocol:
/// `get`, the server on stdin, `{"Username","Secret"}` JSON on stdout) for
/// `host`'s credentials, as `user:password` base64. None when it has none
/// (it exits non-zero) or cannot run; the reason is logged.
fn from_helper(name: &str, host: &str) -> Option<String> {
    use base64::Engine;
    use std::io::Write;
    let prog = format!("docker-credential-{name}");
    let server = if host == "docker.io" {
        "https://index.docker.io/v1/".to_string()
    } else {
        host.to_string()
    };
    let run = || -> std::io::Result<std::process::Output> {
        let mut c = std::process::Command::new(&prog)
            .arg("get")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()?;
        c.stdin
            .take()
            .expect("piped")
            .write_all(server.as_bytes())?;
        c.wait_with_output()
    };
    let out = match run() {
        Ok(o) => o,
        Err(e) => {
            log::warn!("{prog}: {e}");
            return None;
        }
    };
    if !out.status.success() {
        log::info!(
            "{prog}: no credentials for {server}: {}",
            String::from_utf8_lossy(&out.stdout).trim()
        );
        return None;
    }
    let v: serde_json::Value = match serde_json::from_slice(&out.stdout) {
        Ok(v) => v,
        Err(e) => {
            log::warn!("{prog}: answer is not JSON: {e}");
            return None;
        }
    };
    let v: HelperAnswer = serde_json::from_value(v).unwrap_or_default();
    let user = v.username.as_ref().and_then(|u| u.as_str())?;
    let secret = v.secret.as_ref().and_then(|u| u.as_str())?;
    if user == "<token>" {
        log::warn!("{prog}: an identity token for {server} (not supported; use a password)");
        return None;
    }
    Some(base64::engine::general_purpose::STANDARD.encode(format!("{user}:{secret}")))
}

/// Whether a token realm may receive the user's registry credentials: only
/// over TLS and only at the registry itself (its scheme, host and port), or
/// Docker Hub's own token service for `docker.io`; a plain-http realm only
/// at the registry itself when the registry is plain http (--insecure). A
/// registry must not be able to send the user's password elsewhere by
/// naming a realm; the token is then asked for without it.
fn realm_gets_credentials(registry_base: &str, registry_host: &str, realm: &reqwest::Url) -> bool {
    let Ok(base) = reqwest::Url::parse(registry_base) else {
        return false;
    };
    let same_origin = realm.scheme() == base.scheme()
        && realm.host_str() == base.host_str()
        && realm.port_or_known_default() == base.port_or_known_default();
    if same_origin {
        return true;
    }
    realm.scheme() == "https"
        && registry_host == "docker.io"
        && realm.host_str() == Some("auth.docker.io")
        && realm.port_or_known_default() == Some(443)
}

/// The `key="value"` parameters of a `WWW-Authenticate` challenge.
fn challenge_params(h: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = h;
    while let Some(eq) = rest.find('=') {
        let key = rest[..eq].trim().trim_start_matches(',').trim().to_string();
        let after = &rest[eq + 1..];
        let (val, next) = if let Some(q) = after.strip_prefix('"') {
            match q.find('"') {
                Some(end) => (q[..end].to_string(), &q[end + 1..]),
                None => (q.to_string(), ""),
            }
        } else {
            let end = after.find(',').unwrap_or(after.len());
            (after[..end].trim().to_string(), &after[end..])
        };
        out.push((key, val));
        rest = next;
    }
    out
}

impl Registry {
    /// The repository `repo` on `host`, at `tagged`.
    pub fn new(host: &str, repo: &str, tagged: Tagged, opts: &RegistryOptions) -> Result<Registry> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let api = if host == "docker.io" {
            "registry-1.docker.io"
        } else {
            host
        };
        let scheme = if opts.insecure.iter().any(|h| h == host) {
            "http"
        } else {
            "https"
        };
        let client = reqwest::blocking::Client::builder()
            .connect_timeout(Duration::from_secs(30))
            .timeout(Duration::from_secs(300))
            .user_agent(concat!("sheaf/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| OciError::Registry {
                url: host.to_string(),
                detail: format!("HTTP client: {}", sheaf_format::one_line(&e)),
            })?;
        Ok(Registry {
            host: host.to_string(),
            repo: repo.to_string(),
            tagged,
            base: format!("{scheme}://{api}/v2/{repo}"),
            client,
            basic: credentials(host, opts),
            token: Mutex::new(None),
            docs: Mutex::new(Default::default()),
        })
    }

    fn authenticate(&self, challenge: &str, url: &str) -> Result<()> {
        let rerr = |detail: String| OciError::Registry {
            url: url.to_string(),
            detail,
        };
        let (scheme, params) = challenge.split_once(' ').unwrap_or((challenge, ""));
        if scheme.eq_ignore_ascii_case("basic") {
            let Some(b) = &self.basic else {
                return Err(rerr(format!(
                    "the registry wants a user name and password, and no credentials file has any for {}",
                    self.host
                )));
            };
            *self.token.lock().unwrap_or_else(|e| e.into_inner()) = Some(format!("Basic {b}"));
            return Ok(());
        }
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(rerr(format!("unsupported authentication scheme {scheme}")));
        }
        let params = challenge_params(params);
        let get = |k: &str| params.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        let realm = get("realm").ok_or_else(|| rerr("token challenge without a realm".into()))?;
        let mut q = Vec::new();
        if let Some(s) = get("service") {
            q.push(("service", s));
        }
        q.push((
            "scope",
            get("scope").unwrap_or_else(|| format!("repository:{}:pull", self.repo)),
        ));
        let token_url = reqwest::Url::parse_with_params(&realm, &q)
            .map_err(|e| rerr(format!("token realm {realm}: {e}")))?;
        let mut req = self.client.get(token_url.clone());
        if let Some(b) = &self.basic {
            if realm_gets_credentials(&self.base, &self.host, &token_url) {
                req = req.header("Authorization", format!("Basic {b}"));
            } else {
                log::warn!(
                    "{}: the token realm {} is not this registry: asking it without your credentials",
                    self.host,
                    sheaf_net::redact(&realm)
                );
            }
        }
        let resp = req
            .send()
            .map_err(|e| rerr(format!("token: {}", sheaf_format::one_line(&e))))?;
        if !resp.status().is_success() {
            return Err(rerr(format!("token request refused: {}", resp.status())));
        }
        let v: serde_json::Value =
            serde_json::from_reader(resp.take(1 << 20)).map_err(|e| rerr(format!("token: {e}")))?;
        let v: TokenAnswer = serde_json::from_value(v).unwrap_or_default();
        let tok = (v.token.as_ref())
            .or(v.access_token.as_ref())
            .and_then(|t| t.as_str())
            .ok_or_else(|| rerr("token answer has no token".into()))?;
        *self.token.lock().unwrap_or_else(|e| e.into_inner()) = Some(format!("Bearer {tok}"));
        Ok(())
    }

    fn get(&self, path: &str, accept: Option<&str>) -> Result<reqwest::blocking::Response> {
        let url = format!("{}/{path}", self.base);
        let rerr = |detail: String| OciError::Registry {
            url: url.clone(),
            detail,
        };
        for attempt in 0..2 {
            let mut req = self.client.get(&url);
            if let Some(a) = accept {
                req = req.header("Accept", a);
            }
            if let Some(t) = self.token.lock().unwrap_or_else(|e| e.into_inner()).clone() {
                req = req.header("Authorization", t);
            }
            let resp = req.send().map_err(|e| rerr(sheaf_format::one_line(&e)))?;
            let status = resp.status();
            if status == reqwest::StatusCode::UNAUTHORIZED && attempt == 0 {
                let ch = resp
                    .headers()
                    .get("www-authenticate") // not JSON: an HTTP header
                    .and_then(|h| h.to_str().ok())
                    .unwrap_or("")
                    .to_string();
                self.authenticate(&ch, &url)?;
                continue;
            }
            if status.is_success() {
                return Ok(resp);
            }
            // The distribution API explains refusals as {"errors":[{code,message}]}.
            let mut body = String::new();
            let _ = resp.take(64 << 10).read_to_string(&mut body);
            let why = serde_json::from_str::<Refusal>(&body)
                .ok()
                .and_then(|v| {
                    let e: RefusalError =
                        serde_json::from_value(v.errors.into_iter().next()?).ok()?;
                    Some(format!(
                        "{} {}",
                        e.code.as_ref()?.as_str()?,
                        e.message.as_ref().and_then(|m| m.as_str()).unwrap_or("")
                    ))
                })
                .unwrap_or_default();
            return Err(rerr(format!("{status} {why}").trim().to_string()));
        }
        Err(rerr("authentication was not accepted".into()))
    }
}

impl Source for Registry {
    fn name(&self) -> String {
        match &self.tagged {
            Tagged::Tag(t) => format!("docker://{}/{}:{t}", self.host, self.repo),
            Tagged::Digest(d) => format!("docker://{}/{}@{d}", self.host, self.repo),
        }
    }
    fn top(&self) -> Result<Fetched> {
        self.remembered("", || self.fetch_top())
    }
    fn manifest(&self, d: &Digest) -> Result<Vec<u8>> {
        let f = self.remembered(&d.to_string(), || {
            let resp = self.get(&format!("manifests/{d}"), Some(ACCEPT))?;
            let bytes = read_bounded(resp, &format!("{}: manifest {d}", self.name()))?;
            check_digest(&bytes, d, &format!("{}: manifest", self.name()))?;
            Ok(Fetched {
                bytes,
                media_type: None,
            })
        })?;
        Ok(f.bytes)
    }
    fn blob(&self, d: &Digest) -> Result<Box<dyn Read + Send>> {
        let resp = self.get(&format!("blobs/{d}"), None)?;
        Ok(Box::new(std::io::BufReader::with_capacity(1 << 20, resp)))
    }
}

impl Registry {
    fn remembered(&self, key: &str, fetch: impl FnOnce() -> Result<Fetched>) -> Result<Fetched> {
        if let Some(f) = self.docs.lock().unwrap_or_else(|e| e.into_inner()).get(key) {
            return Ok(f.clone());
        }
        let f = fetch()?;
        self.docs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.to_string(), f.clone());
        Ok(f)
    }

    fn fetch_top(&self) -> Result<Fetched> {
        let r = match &self.tagged {
            Tagged::Tag(t) => t.clone(),
            Tagged::Digest(d) => d.to_string(),
        };
        let resp = self.get(&format!("manifests/{r}"), Some(ACCEPT))?;
        let media_type = resp
            .headers()
            .get("content-type") // not JSON: an HTTP header
            .and_then(|h| h.to_str().ok())
            .map(|s| s.split(';').next().unwrap_or(s).trim().to_string());
        let bytes = read_bounded(resp, &format!("{}: manifest", self.name()))?;
        if let Tagged::Digest(d) = &self.tagged {
            check_digest(&bytes, d, &format!("{}: manifest", self.name()))?;
        }
        Ok(Fetched { bytes, media_type })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_go_only_to_the_registry_or_docker_hubs_token_service() {
        let u = |s: &str| reqwest::Url::parse(s).unwrap();
        let reg = "https://reg.example:5000/v2/app";
        assert!(realm_gets_credentials(
            reg,
            "reg.example:5000",
            &u("https://reg.example:5000/token")
        ));
        for other in [
            "https://evil.example/token",
            "http://reg.example:5000/token",
            "https://reg.example/token",
            "https://reg.example:5001/token",
            "https://auth.docker.io/token",
        ] {
            assert!(
                !realm_gets_credentials(reg, "reg.example:5000", &u(other)),
                "{other}"
            );
        }
        let hub = "https://registry-1.docker.io/v2/library/debian";
        assert!(realm_gets_credentials(
            hub,
            "docker.io",
            &u("https://auth.docker.io/token")
        ));
        assert!(!realm_gets_credentials(
            hub,
            "docker.io",
            &u("http://auth.docker.io/token")
        ));
        // A plain-http (--insecure) registry: only itself.
        let plain = "http://127.0.0.1:5000/v2/app";
        assert!(realm_gets_credentials(
            plain,
            "127.0.0.1:5000",
            &u("http://127.0.0.1:5000/t")
        ));
        assert!(!realm_gets_credentials(
            plain,
            "127.0.0.1:5000",
            &u("http://127.0.0.1:5001/t")
        ));
    }

    #[test]
    fn challenges_parse_quoted_and_bare_values() {
        let p = challenge_params(
            r#"realm="https://a/token",service="reg, one",scope=repository:x:pull"#,
        );
        assert_eq!(
            p,
            vec![
                ("realm".into(), "https://a/token".into()),
                ("service".into(), "reg, one".into()),
                ("scope".into(), "repository:x:pull".into()),
            ]
        );
    }

    #[test]
    fn credentials_come_from_the_named_file_by_host() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("auth.json");
        std::fs::write(
            &f,
            r#"{"auths":{"https://reg.example:5000/v1/":{"auth":"dTpw"},"other":{"auth":"x"}}}"#,
        )
        .unwrap();
        let o = RegistryOptions {
            insecure: vec![],
            auth_file: Some(f),
        };
        assert_eq!(credentials("reg.example:5000", &o).as_deref(), Some("dTpw"));
        assert_eq!(credentials("reg.example", &o), None);
    }
}
