//! What of a URL may be shown: the one rule for every place a URL reaches
//! a person or another process (`/proc/mounts`, errors, logs, `sheaf
//! stats`). Credentials in the authority (`user:password@`, a token as
//! `TOKEN@`) and the values of query parameters (signed URLs carry their
//! signature and credential there) are replaced by `***`; scheme, host,
//! port, path and parameter names stay, so the message still says where.

/// `url` with its secrets replaced by `***` (see the module text). Text
/// that is not a URL is returned as it is.
pub fn redact(url: &str) -> String {
    let Some(i) = url.find("://") else {
        return url.to_string();
    };
    let (scheme, rest) = url.split_at(i + 3);
    let auth_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (auth, tail) = rest.split_at(auth_end);
    let mut out = String::with_capacity(url.len());
    out.push_str(scheme);
    match auth.rfind('@') {
        Some(at) => {
            let user = &auth[..at];
            match user.split_once(':') {
                Some((name, _)) if !name.is_empty() => {
                    out.push_str(name);
                    out.push_str(":***@");
                }
                _ => out.push_str("***@"),
            }
            out.push_str(&auth[at + 1..]);
        }
        None => out.push_str(auth),
    }
    let (path, frag) = match tail.find('#') {
        Some(h) => tail.split_at(h),
        None => (tail, ""),
    };
    match path.split_once('?') {
        Some((p, q)) => {
            out.push_str(p);
            out.push('?');
            let params: Vec<String> = q
                .split('&')
                .map(|kv| match kv.split_once('=') {
                    Some((k, _)) => format!("{k}=***"),
                    None if kv.is_empty() => String::new(),
                    None => "***".to_string(),
                })
                .collect();
            out.push_str(&params.join("&"));
        }
        None => out.push_str(path),
    }
    if !frag.is_empty() {
        out.push_str("#***");
    }
    out
}

/// `text` with every URL in it (from a scheme's `://` to the next space or
/// quote) passed through [`redact`]: for messages built elsewhere, such as
/// an error chain whose causes quote a URL.
pub fn redact_text(text: &str) -> String {
    if !text.contains("://") {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        // The scheme: the letters before "://".
        // (Past the character that ends it, which may be several bytes.)
        let start = rest[..i]
            .char_indices()
            .rev()
            .find(|&(_, c)| !(c.is_ascii_alphanumeric() || c == '+' || c == '-' || c == '.'))
            .map_or(0, |(s, c)| s + c.len_utf8());
        let end = rest[i..]
            .find(|c: char| c.is_whitespace() || matches!(c, '\'' | '"' | '`' | '<' | '>' | ')'))
            .map_or(rest.len(), |e| i + e);
        // Punctuation that ends the sentence ("URL: why") is not the URL's.
        let url = rest[start..end].trim_end_matches([':', ',', ';', '.']);
        out.push_str(&rest[..start]);
        out.push_str(&redact(url));
        out.push_str(&rest[start + url.len()..end]);
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// A URL that may carry secrets (`user:password@`, a presigned query):
/// everything that shows it ([`Display`](std::fmt::Display), `Debug`,
/// serde's `Serialize`) shows the [`redact`]ed form, so it cannot be
/// printed, logged or stored by accident. The string itself comes only
/// from [`SecretUrl::expose`], which the code that sends the request
/// calls. Text that is not a URL (a local path) is shown as it is.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct SecretUrl(String);

impl SecretUrl {
    /// Wrap `url` (a URL or a path, as the user named it).
    pub fn new(url: impl Into<String>) -> SecretUrl {
        SecretUrl(url.into())
    }

    /// The URL with its secrets: for the request that is sent, and for
    /// the typed request handed to a child sheaf on a pipe. Nothing else.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// What may be shown: [`redact`]ed.
    pub fn redacted(&self) -> String {
        redact(&self.0)
    }

    /// Whether showing it hides anything (it carries a secret).
    pub fn has_secret(&self) -> bool {
        self.redacted() != self.0
    }
}

impl std::fmt::Display for SecretUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl std::fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SecretUrl({:?})", self.redacted())
    }
}

impl serde::Serialize for SecretUrl {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.redacted())
    }
}

impl From<&str> for SecretUrl {
    fn from(s: &str) -> SecretUrl {
        SecretUrl::new(s)
    }
}

impl From<String> for SecretUrl {
    fn from(s: String) -> SecretUrl {
        SecretUrl(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_and_signed_parameters_are_hidden() {
        assert_eq!(
            redact("https://ann:s3cret@host:8080/a/b.sheaf?X-Amz-Signature=abc&X-Amz-Credential=AK%2F1#frag"),
            "https://ann:***@host:8080/a/b.sheaf?X-Amz-Signature=***&X-Amz-Credential=***#***"
        );
        assert_eq!(
            redact("http://tok3n@h/x"),
            "***@h/x".replace("***@", "http://***@")
        );
        assert_eq!(redact("http://h/x.sheaf"), "http://h/x.sheaf");
        assert_eq!(redact("ssh://me@h/x.sheaf"), "ssh://***@h/x.sheaf");
        assert_eq!(redact("/local/path:with@at"), "/local/path:with@at");
        // '@' in the path is not a credential.
        assert_eq!(redact("http://h/a@b"), "http://h/a@b");
        let t = "fetching 'http://u:pw@h/i?sig=zz' via proxy http://p:pp@proxy:3128 failed";
        let r = redact_text(t);
        assert!(
            !r.contains("pw") && !r.contains("zz") && !r.contains(":pp@"),
            "{r}"
        );
        assert_eq!(
            r,
            "fetching 'http://u:***@h/i?sig=***' via proxy http://p:***@proxy:3128 failed"
        );
        // The colon after a URL stays (a presigned query's last value ends
        // before it).
        assert_eq!(
            redact_text("https://h/x?X-Amz-Signature=abc: error sending request"),
            "https://h/x?X-Amz-Signature=***: error sending request"
        );
        assert_eq!(redact_text("see http://u:pw@h/a."), "see http://u:***@h/a.");
        // A scheme after a character of several bytes (found by fuzzing).
        assert_eq!(redact_text("é€http://u:pw@h/"), "é€http://u:***@h/");
        assert_eq!(redact_text("\u{fffd}://x"), "\u{fffd}://x");
    }

    #[test]
    fn a_secret_url_shows_only_its_redacted_form() {
        let raw = "http://alice:s3cr3t@h/i.sheaf?X-Amz-Signature=deadbeef";
        let u = SecretUrl::new(raw);
        let shown = "http://alice:***@h/i.sheaf?X-Amz-Signature=***";
        assert_eq!(u.to_string(), shown);
        assert_eq!(format!("{u:?}"), format!("SecretUrl({shown:?})"));
        assert_eq!(serde_json::to_string(&u).unwrap(), format!("\"{shown}\""));
        assert_eq!(u.expose(), raw);
        assert!(u.has_secret());
        assert!(!SecretUrl::new("/a/b.sheaf").has_secret());
    }
}
