//! OpenSSH `allowed_signers` files (ssh-keygen(1), "ALLOWED SIGNERS"):
//! `principals [options] keytype base64-key [comment]` per line, with
//! options `namespaces="…"`, `valid-after="…"`, `valid-before="…"` and
//! `cert-authority` (certificates are not supported: such lines are kept
//! but never match a plain key).

use crate::TrustError;
use ssh_key::PublicKey;

/// One trusted key.
#[derive(Debug, Clone)]
pub struct Signer {
    /// Principal patterns (`*` and `?` wildcards).
    pub principals: Vec<String>,
    /// Allowed namespaces (patterns); `None` means any.
    pub namespaces: Option<Vec<String>>,
    /// Not valid before this time (seconds since the epoch).
    pub valid_after: Option<i64>,
    /// Not valid at or after this time (seconds since the epoch).
    pub valid_before: Option<i64>,
    /// A certificate-authority line (not used for plain keys).
    pub cert_authority: bool,
    /// The key.
    pub key: PublicKey,
    /// Line number in the file, for messages.
    pub line: usize,
}

/// A parsed allowed_signers file.
#[derive(Debug, Clone, Default)]
pub struct AllowedSigners {
    /// Entries in file order.
    pub signers: Vec<Signer>,
}

/// Split at top-level whitespace, keeping quoted parts together.
fn fields(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    for ch in line.chars() {
        match ch {
            '"' => {
                quoted = !quoted;
                cur.push(ch);
            }
            c if c.is_whitespace() && !quoted => {
                if !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
            }
            c => cur.push(c),
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// Split an option list at commas outside quotes.
fn options(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    for ch in s.chars() {
        match ch {
            '"' => quoted = !quoted,
            ',' if !quoted => out.push(std::mem::take(&mut cur)),
            c => cur.push(c),
        }
    }
    out.push(cur);
    out
}

/// Whether `name` matches an OpenSSH pattern with `*` and `?`.
pub fn pattern_match(pat: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pat.chars().collect(), name.chars().collect());
    let (mut pi, mut ni, mut star, mut mark) = (0, 0, None, 0);
    while ni < n.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == n[ni]) {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ni;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ni = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// Parse `YYYYMMDD[HHMM[SS]][Z]` (local time unless `Z`).
fn parse_time(s: &str) -> Option<i64> {
    let (digits, utc) = match s.strip_suffix('Z').or_else(|| s.strip_suffix('z')) {
        Some(d) => (d, true),
        None => (s, false),
    };
    if !digits.bytes().all(|b| b.is_ascii_digit()) || ![8, 12, 14].contains(&digits.len()) {
        return None;
    }
    let num = |a: usize, b: usize| digits.get(a..b).and_then(|x| x.parse::<i32>().ok());
    // SAFETY: a zeroed tm is a valid value to fill in.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    tm.tm_year = num(0, 4)? - 1900;
    tm.tm_mon = num(4, 6)? - 1;
    tm.tm_mday = num(6, 8)?;
    tm.tm_hour = num(8, 10).unwrap_or(0);
    tm.tm_min = num(10, 12).unwrap_or(0);
    tm.tm_sec = num(12, 14).unwrap_or(0);
    tm.tm_isdst = -1;
    // SAFETY: tm is initialised; timegm/mktime only read and normalise it.
    let t = unsafe {
        if utc {
            libc::timegm(&mut tm)
        } else {
            libc::mktime(&mut tm)
        }
    };
    (t != -1).then_some(t)
}

impl AllowedSigners {
    /// Parse the text of an allowed_signers file; `name` is used in errors.
    pub fn parse(text: &str, name: &str) -> Result<Self, TrustError> {
        let mut signers = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |why: String| TrustError::Signers {
                file: name.to_string(),
                line: i + 1,
                why,
            };
            let f = fields(line);
            if f.len() < 3 {
                return Err(bad("expected: principals [options] keytype key".into()));
            }
            let principals: Vec<String> = f[0]
                .trim_matches('"')
                .split(',')
                .map(str::to_string)
                .collect();
            // Options are present when the field after the principals is not a key type.
            let (opts, key_at) = if PublicKey::from_openssh(&format!("{} {}", f[1], f[2])).is_ok() {
                (None, 1)
            } else {
                (Some(&f[1]), 2)
            };
            let key_text = f[key_at..].join(" ");
            let key = PublicKey::from_openssh(&key_text)
                .map_err(|e| bad(format!("cannot read the public key: {e}")))?;
            let mut s = Signer {
                principals,
                namespaces: None,
                valid_after: None,
                valid_before: None,
                cert_authority: false,
                key,
                line: i + 1,
            };
            if let Some(o) = opts {
                for opt in options(o) {
                    let (k, v) = match opt.split_once('=') {
                        Some((k, v)) => (k.to_ascii_lowercase(), Some(v.to_string())),
                        None => (opt.to_ascii_lowercase(), None),
                    };
                    let time = |v: Option<String>| {
                        let v = v.unwrap_or_default();
                        parse_time(&v).ok_or_else(|| bad(format!("bad time '{v}' in {k}")))
                    };
                    match k.as_str() {
                        "cert-authority" => s.cert_authority = true,
                        "namespaces" => {
                            s.namespaces = Some(
                                v.unwrap_or_default()
                                    .split(',')
                                    .map(str::to_string)
                                    .collect(),
                            )
                        }
                        "valid-after" => s.valid_after = Some(time(v)?),
                        "valid-before" => s.valid_before = Some(time(v)?),
                        _ => return Err(bad(format!("unknown option '{opt}'"))),
                    }
                }
            }
            signers.push(s);
        }
        Ok(AllowedSigners { signers })
    }

    /// Read and parse a file.
    pub fn load(path: &std::path::Path) -> Result<Self, TrustError> {
        let text = std::fs::read_to_string(path).map_err(|e| TrustError::Io {
            what: path.display().to_string(),
            cause: e,
        })?;
        Self::parse(&text, &path.display().to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str =
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFnAGzd2B2rZmwcHzSZzkCkfz9/eeIeuIjmEA5JPFxuD";

    #[test]
    fn lines_with_and_without_options_parse() {
        let t = format!(
            "# comment\n\
             alice@example.org,bob {KEY} laptop\n\
             *@site.org namespaces=\"sheaf,git\",valid-after=\"20240101\",valid-before=\"20300101Z\" {KEY}\n"
        );
        let a = AllowedSigners::parse(&t, "f").unwrap();
        assert_eq!(a.signers.len(), 2);
        assert_eq!(a.signers[0].principals, ["alice@example.org", "bob"]);
        assert!(a.signers[0].namespaces.is_none());
        let s = &a.signers[1];
        assert_eq!(
            s.namespaces.as_deref(),
            Some(&["sheaf".to_string(), "git".into()][..])
        );
        assert_eq!(s.valid_before, Some(1893456000));
        assert!(s.valid_after.is_some());
        let e = AllowedSigners::parse(&format!("x bogus=1 {KEY}"), "f").unwrap_err();
        assert!(e.to_string().contains("f:1"), "{e}");
    }

    #[test]
    fn patterns_match_like_openssh() {
        assert!(pattern_match("*@site.org", "ann@site.org"));
        assert!(pattern_match("a?c", "abc"));
        assert!(!pattern_match("*@site.org", "ann@site.org.evil"));
        assert!(pattern_match("*", ""));
    }
}
