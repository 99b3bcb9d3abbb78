//! What a file that is not a sheaf image is, told from its first bytes, so
//! that a reader refusing it, or the builder given it, can say what the
//! user meant to do with it.

/// A kind of file that is given where a sheaf image (or a tar archive) is
/// expected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForeignKind {
    /// A SquashFS image (magic "hsqs" at offset 0).
    SquashFs,
    /// A tar archive (ustar magic at offset 257, or a header whose
    /// checksum holds).
    Tar,
    /// gzip-compressed data (1f 8b).
    Gzip,
    /// zstd-compressed data (28 b5 2f fd).
    Zstd,
    /// xz-compressed data (fd 37 7a 58 5a 00).
    Xz,
    /// bzip2-compressed data ("BZh").
    Bzip2,
}

/// How many leading bytes [`sniff`] needs to tell every kind (a tar
/// header is one 512-byte block).
pub const SNIFF_LEN: usize = 512;

impl ForeignKind {
    /// The kind in words: "a SquashFS image", "a gzip-compressed file".
    pub fn describe(self) -> &'static str {
        match self {
            ForeignKind::SquashFs => "a SquashFS image",
            ForeignKind::Tar => "a tar archive",
            ForeignKind::Gzip => "a gzip-compressed file",
            ForeignKind::Zstd => "a zstd-compressed file",
            ForeignKind::Xz => "an xz-compressed file",
            ForeignKind::Bzip2 => "a bzip2-compressed file",
        }
    }

    /// Whether this is a compression format (whose content may be a tar).
    pub fn is_compressed(self) -> bool {
        matches!(
            self,
            ForeignKind::Gzip | ForeignKind::Zstd | ForeignKind::Xz | ForeignKind::Bzip2
        )
    }
}

/// What `head`, a file's first bytes (up to [`SNIFF_LEN`]), says it is,
/// if one of the [`ForeignKind`]s.
pub fn sniff(head: &[u8]) -> Option<ForeignKind> {
    if head.starts_with(b"hsqs") {
        Some(ForeignKind::SquashFs)
    } else if head.starts_with(&[0x1f, 0x8b]) {
        Some(ForeignKind::Gzip)
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Some(ForeignKind::Zstd)
    } else if head.starts_with(&[0xfd, b'7', b'z', b'X', b'Z', 0]) {
        Some(ForeignKind::Xz)
    } else if head.starts_with(b"BZh") {
        Some(ForeignKind::Bzip2)
    } else if is_tar_header(head) {
        Some(ForeignKind::Tar)
    } else {
        None
    }
}

/// Whether `block` begins with a tar header: the ustar magic at offset
/// 257 (POSIX "ustar\0" or GNU "ustar  "), or, for old (v7) archives, a
/// checksum field that matches the header's bytes (POSIX: their sum with
/// the field itself counted as spaces).
pub fn is_tar_header(block: &[u8]) -> bool {
    if block.len() < 512 {
        return false;
    }
    if &block[257..262] == b"ustar" {
        return true;
    }
    let field = &block[148..156];
    let digits: Vec<u8> = field
        .iter()
        .copied()
        .skip_while(|&b| b == b' ')
        .take_while(|b| (b'0'..=b'7').contains(b))
        .collect();
    if digits.is_empty() {
        return false;
    }
    let Ok(want) = u32::from_str_radix(std::str::from_utf8(&digits).unwrap_or(""), 8) else {
        return false;
    };
    let sum: u32 = block[..512]
        .iter()
        .enumerate()
        .map(|(i, &b)| {
            if (148..156).contains(&i) {
                32
            } else {
                u32::from(b)
            }
        })
        .sum();
    sum == want
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_are_told_from_their_magic_numbers() {
        // Magic numbers from the formats' documents (SquashFS: 0x73717368
        // little-endian; tar: POSIX ustar at offset 257).
        assert_eq!(sniff(b"hsqs\0\0\0\0"), Some(ForeignKind::SquashFs));
        assert_eq!(sniff(&[0x1f, 0x8b, 8, 0]), Some(ForeignKind::Gzip));
        assert_eq!(sniff(&[0x28, 0xb5, 0x2f, 0xfd, 0]), Some(ForeignKind::Zstd));
        assert_eq!(sniff(b"\xfd7zXZ\0\0"), Some(ForeignKind::Xz));
        assert_eq!(sniff(b"BZh91AY"), Some(ForeignKind::Bzip2));
        let mut ustar = [0u8; 512];
        ustar[257..263].copy_from_slice(b"ustar\0");
        assert_eq!(sniff(&ustar), Some(ForeignKind::Tar));
        assert_eq!(sniff(b"hello, world\n"), None);
        assert_eq!(sniff(&[b'x'; 512]), None);
        assert_eq!(sniff(&[0u8; 512]), None);
        // A v7 header: name "a", checksum by hand: 'a' (97) + 8 spaces
        // (256) = 353 = 0o541.
        let mut v7 = [0u8; 512];
        v7[0] = b'a';
        v7[148..155].copy_from_slice(b"000541\0");
        assert!(is_tar_header(&v7));
        v7[0] = b'b';
        assert!(!is_tar_header(&v7));
    }
}
