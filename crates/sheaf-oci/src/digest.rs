//! Content digests (`sha256:HEX`, the only algorithm OCI requires) and a
//! reader that hashes what passes through it.

use sha2::{Digest as _, Sha256};
use std::io::{self, Read};
use std::sync::{Arc, Mutex};

/// A `sha256:` content digest, validated (64 lowercase hex digits).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(String);

impl Digest {
    /// Parse `sha256:HEX`; `None` for any other algorithm or form.
    pub fn parse(s: &str) -> Option<Digest> {
        let hex = s.strip_prefix("sha256:")?;
        (hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
        .then(|| Digest(s.to_string()))
    }
    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        Digest(format!("sha256:{}", hex::encode(Sha256::digest(bytes))))
    }
    /// The hex part.
    pub fn hex(&self) -> &str {
        &self.0[7..]
    }
    /// `sha256-HEX`: the form used in file names.
    pub fn file_form(&self) -> String {
        format!("sha256-{}", self.hex())
    }
    /// The first 12 hex digits, for messages.
    pub fn short(&self) -> &str {
        &self.0[7..19]
    }
}

impl std::fmt::Display for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What has passed through a [`Hashing`] reader.
#[derive(Default)]
struct Tally {
    hash: Sha256,
    bytes: u64,
}

/// A reader that hashes and counts everything read through it. Clones share
/// the tally and the inner reader, so a caller can hand one clone to a
/// decoder and read the rest (after the decoder stopped) through another.
pub struct Hashing<R> {
    shared: Arc<Mutex<(R, Tally)>>,
}

impl<R> Clone for Hashing<R> {
    fn clone(&self) -> Self {
        Hashing {
            shared: self.shared.clone(),
        }
    }
}

impl<R: Read> Hashing<R> {
    /// Hash what is read from `inner`.
    pub fn new(inner: R) -> Self {
        Hashing {
            shared: Arc::new(Mutex::new((inner, Tally::default()))),
        }
    }
    /// Read the rest to its end; the digest and byte count of everything.
    pub fn finish(&mut self) -> io::Result<(Digest, u64)> {
        io::copy(self, &mut io::sink())?;
        let g = self.shared.lock().unwrap_or_else(|e| e.into_inner());
        let hex = hex::encode(g.1.hash.clone().finalize());
        Ok((Digest(format!("sha256:{hex}")), g.1.bytes))
    }
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut g = self.shared.lock().unwrap_or_else(|e| e.into_inner());
        let (inner, tally) = &mut *g;
        let n = inner.read(buf)?;
        tally.hash.update(&buf[..n]);
        tally.bytes += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_parse_strictly() {
        let ok = format!("sha256:{}", "a".repeat(64));
        assert!(Digest::parse(&ok).is_some());
        assert!(Digest::parse(&format!("sha256:{}", "A".repeat(64))).is_none());
        assert!(Digest::parse(&format!("sha512:{}", "a".repeat(64))).is_none());
        assert!(Digest::parse("sha256:abc").is_none());
        assert!(Digest::parse(&format!("sha256:{}/../x", "a".repeat(58))).is_none());
    }

    #[test]
    fn a_clone_reads_the_rest_into_the_same_tally() {
        let data = b"hello world".to_vec();
        let mut a = Hashing::new(&data[..]);
        let mut b = a.clone();
        let mut first = [0u8; 5];
        b.read_exact(&mut first).unwrap();
        let (d, n) = a.finish().unwrap();
        assert_eq!(n, 11);
        assert_eq!(d, Digest::of(b"hello world"));
    }
}
