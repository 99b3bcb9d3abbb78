//! Errors raised while decoding image bytes.

use thiserror::Error;

/// Something in the bytes of an image is not what the format allows.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum FormatError {
    /// Fewer bytes than the structure needs.
    #[error("truncated {0}")]
    Truncated(&'static str),
    /// A magic number did not match.
    #[error("not a sheaf image (bad {0} magic)")]
    BadMagic(&'static str),
    /// The major version is newer than this reader understands.
    #[error("format version {0}.{1} is not supported (this sheaf reads 1.x)")]
    UnsupportedVersion(u16, u16),
    /// The image needs a feature this reader lacks.
    #[error("image requires unknown feature '{0}'; upgrade sheaf to read it")]
    UnknownFeature(String),
    /// A value is out of the range the format allows.
    #[error("invalid {what}: {detail}")]
    Invalid {
        /// Which structure or field.
        what: &'static str,
        /// What is wrong with it.
        detail: String,
    },
    /// A hash over some bytes did not match the recorded digest. The
    /// string is a detail the reader adds (e.g. "at offset 4096"); which
    /// part failed is said by the error that wraps this one.
    #[error("checksum mismatch{}", if .0.is_empty() { String::new() } else { format!(" {}", .0) })]
    HashMismatch(String),
    /// A block names a dictionary the reader was not given (format.md §7).
    #[error(
        "block compressed with dictionary {0}, which neither the image nor its object store holds"
    )]
    MissingDictionary(String),
    /// A reference block names a base the image does not list (format.md
    /// §7.2), or the base could not be read (the detail says why).
    #[error("reference block's base {0} is not available")]
    MissingReference(String),
    /// A compressed payload failed to decode.
    #[error("cannot decompress {codec} data: {detail}")]
    Decompress {
        /// Codec name.
        codec: &'static str,
        /// Decoder message.
        detail: String,
    },
}

impl FormatError {
    /// Shorthand for [`FormatError::Invalid`].
    pub fn invalid(what: &'static str, detail: impl Into<String>) -> Self {
        FormatError::Invalid {
            what,
            detail: detail.into(),
        }
    }
}

/// An error and its chain of causes (`source()`) on one line, each cause
/// after a colon unless the text before already says it; newlines become
/// spaces, and Rust's " (os error N)" after an I/O error's text goes
/// ([`without_os_error`]). The one rule for every message sheaf prints or
/// passes between processes.
pub fn one_line(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = String::new();
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cur {
        let t = without_os_error(&c.to_string());
        if !t.is_empty() && !s.contains(&t) {
            if !s.is_empty() {
                s.push_str(": ");
            }
            s.push_str(&t);
        }
        cur = c.source();
    }
    s.replace('\n', " ")
}

/// `text` without the " (os error N)" that Rust's `io::Error` adds to the
/// system's message ("No such file or directory (os error 2)"), wherever
/// it was quoted: users read the message, as other tools print it.
pub fn without_os_error(text: &str) -> String {
    const MARK: &str = " (os error ";
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find(MARK) {
        let after = &rest[i + MARK.len()..];
        let digits = after
            .bytes()
            .take_while(|b| b.is_ascii_digit() || *b == b'-')
            .count();
        if digits > 0 && after[digits..].starts_with(')') {
            out.push_str(&rest[..i]);
            rest = &after[digits + 1..];
        } else {
            out.push_str(&rest[..i + MARK.len()]);
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn os_error_numbers_are_left_out() {
        // ENOENT is 2 on Linux.
        let e = std::io::Error::from_raw_os_error(2);
        let wrapped = std::io::Error::other(format!("/x: {e}"));
        assert_eq!(super::one_line(&wrapped), "/x: No such file or directory");
        assert_eq!(
            super::without_os_error("a (os error 13): b (os error x) (os error 2)"),
            "a: b (os error x)"
        );
    }
}
