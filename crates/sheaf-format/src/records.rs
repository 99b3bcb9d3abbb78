//! Fixed-size metadata records and the xattr-set encoding.
//!
//! Records live in paged streams (see [`crate::superblock`]); record `i` of a
//! stream is at byte `i * LEN`, so a reader fetches exactly the page it needs.

use crate::{Cursor, FormatError};

/// File type, as the `S_IFMT` bits of the mode shifted right by 12.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FileType {
    /// FIFO.
    Fifo,
    /// Character device.
    CharDevice,
    /// Directory.
    Directory,
    /// Block device.
    BlockDevice,
    /// Regular file.
    Regular,
    /// Symbolic link.
    Symlink,
    /// Unix socket.
    Socket,
}

impl FileType {
    /// From the full mode; `None` for a type the format does not know.
    pub fn from_mode(mode: u32) -> Option<Self> {
        Self::from_dtype(((mode >> 12) & 0xf) as u8)
    }
    /// From `S_IFMT >> 12`.
    pub fn from_dtype(t: u8) -> Option<Self> {
        Some(match t {
            0o01 => FileType::Fifo,
            0o02 => FileType::CharDevice,
            0o04 => FileType::Directory,
            0o06 => FileType::BlockDevice,
            0o10 => FileType::Regular,
            0o12 => FileType::Symlink,
            0o14 => FileType::Socket,
            _ => return None,
        })
    }
    /// `S_IFMT >> 12` (also the `d_type` value).
    pub fn dtype(self) -> u8 {
        match self {
            FileType::Fifo => 0o01,
            FileType::CharDevice => 0o02,
            FileType::Directory => 0o04,
            FileType::BlockDevice => 0o06,
            FileType::Regular => 0o10,
            FileType::Symlink => 0o12,
            FileType::Socket => 0o14,
        }
    }
    /// Short name for listings and `sheaf info`.
    pub fn name(self) -> &'static str {
        match self {
            FileType::Fifo => "fifo",
            FileType::CharDevice => "char-device",
            FileType::Directory => "directory",
            FileType::BlockDevice => "block-device",
            FileType::Regular => "file",
            FileType::Symlink => "symlink",
            FileType::Socket => "socket",
        }
    }
}

/// One inode: 64 bytes.
///
/// The meaning of `data`/`count` depends on the type: for a regular file they
/// are the first chunk index and chunk count; for a directory, the first
/// dirent index and entry count; for a symlink, the heap offset of the target
/// (length in `size`); for a device, `data` is `rdev`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct InodeRecord {
    /// Full mode including type bits.
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Link count (directories: 2 + subdirectories).
    pub nlink: u32,
    /// Modification time, seconds since the epoch.
    pub mtime_sec: i64,
    /// Modification time, nanoseconds.
    pub mtime_nsec: u32,
    /// File size in bytes (symlink: target length; directory: entry count).
    pub size: u64,
    /// Type-dependent, see the type doc.
    pub data: u64,
    /// Type-dependent, see the type doc.
    pub count: u32,
    /// Parent directory inode (directories only; the root is its own parent).
    pub parent: u32,
    /// Heap offset of the xattr set plus one; zero means none.
    pub xattr: u64,
}

impl InodeRecord {
    /// Encoded length.
    pub const LEN: usize = 64;

    /// Type from the mode.
    pub fn file_type(&self) -> Option<FileType> {
        FileType::from_mode(self.mode)
    }
    /// Encode.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.mode.to_le_bytes());
        out.extend_from_slice(&self.uid.to_le_bytes());
        out.extend_from_slice(&self.gid.to_le_bytes());
        out.extend_from_slice(&self.nlink.to_le_bytes());
        out.extend_from_slice(&self.mtime_sec.to_le_bytes());
        out.extend_from_slice(&self.mtime_nsec.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&self.size.to_le_bytes());
        out.extend_from_slice(&self.data.to_le_bytes());
        out.extend_from_slice(&self.count.to_le_bytes());
        out.extend_from_slice(&self.parent.to_le_bytes());
        out.extend_from_slice(&self.xattr.to_le_bytes());
    }
    /// Decode and check the type and nanoseconds are valid.
    pub fn decode(b: &[u8]) -> Result<Self, FormatError> {
        let mut c = Cursor::new(b, "inode");
        let r = InodeRecord {
            mode: c.u32()?,
            uid: c.u32()?,
            gid: c.u32()?,
            nlink: c.u32()?,
            mtime_sec: c.i64()?,
            mtime_nsec: {
                let n = c.u32()?;
                c.u32()?;
                n
            },
            size: c.u64()?,
            data: c.u64()?,
            count: c.u32()?,
            parent: c.u32()?,
            xattr: c.u64()?,
        };
        if r.file_type().is_none() {
            return Err(FormatError::invalid("inode", format!("mode {:o}", r.mode)));
        }
        if r.mtime_nsec >= 1_000_000_000 {
            return Err(FormatError::invalid("inode", "nanoseconds out of range"));
        }
        Ok(r)
    }
}

/// Block index value marking a hole (reads as zeros, nothing stored).
pub const HOLE: u32 = u32::MAX;

/// One piece of a regular file: 24 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ChunkRecord {
    /// Offset of this piece within the file.
    pub file_offset: u64,
    /// Data block holding it, or [`HOLE`].
    pub block: u32,
    /// Offset within the uncompressed block.
    pub block_offset: u32,
    /// Length of the piece.
    pub len: u32,
}

impl ChunkRecord {
    /// Encoded length.
    pub const LEN: usize = 24;
    /// Encode.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.file_offset.to_le_bytes());
        out.extend_from_slice(&self.block.to_le_bytes());
        out.extend_from_slice(&self.block_offset.to_le_bytes());
        out.extend_from_slice(&self.len.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
    }
    /// Decode.
    pub fn decode(b: &[u8]) -> Result<Self, FormatError> {
        let mut c = Cursor::new(b, "chunk");
        Ok(ChunkRecord {
            file_offset: c.u64()?,
            block: c.u32()?,
            block_offset: c.u32()?,
            len: c.u32()?,
        })
    }
    /// Whether this piece is a hole.
    pub fn is_hole(&self) -> bool {
        self.block == HOLE
    }
}

/// One directory entry: 16 bytes. Entries of a directory are sorted by name bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DirentRecord {
    /// Heap offset of the name.
    pub name_offset: u64,
    /// Name length (1..=65535).
    pub name_len: u16,
    /// `S_IFMT >> 12` of the target, so listings need not read inodes.
    pub dtype: u8,
    /// Target inode.
    pub inode: u32,
}

impl DirentRecord {
    /// Encoded length.
    pub const LEN: usize = 16;

    /// Whether `name` is a plain entry name (format.md §8.3): not empty,
    /// not `.` or `..`, no `/` and no NUL. A reader must check it before a
    /// name from an image becomes part of a path.
    pub fn is_plain_name(name: &[u8]) -> bool {
        !name.is_empty()
            && name != b"."
            && name != b".."
            && !name.iter().any(|&b| b == b'/' || b == 0)
    }
    /// Encode.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.name_offset.to_le_bytes());
        out.extend_from_slice(&self.name_len.to_le_bytes());
        out.push(self.dtype);
        out.push(0);
        out.extend_from_slice(&self.inode.to_le_bytes());
    }
    /// Decode.
    pub fn decode(b: &[u8]) -> Result<Self, FormatError> {
        let mut c = Cursor::new(b, "dirent");
        let r = DirentRecord {
            name_offset: c.u64()?,
            name_len: c.u16()?,
            dtype: c.u8()?,
            inode: {
                c.u8()?;
                c.u32()?
            },
        };
        if r.name_len == 0 || FileType::from_dtype(r.dtype).is_none() {
            return Err(FormatError::invalid("dirent", "empty name or bad type"));
        }
        Ok(r)
    }
}

/// A set of extended attributes, sorted by name. Stored once in the heap and
/// shared by every inode with the same set.
///
/// Encoding: `u32 total_len, u32 count, count × (u16 name_len, u32 value_len, name, value)`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct XattrSet(pub Vec<(Vec<u8>, Vec<u8>)>);

impl XattrSet {
    /// Byte length of the prefix that holds `total_len`.
    pub const PREFIX: usize = 4;
    /// Encode (entries must already be sorted and unique).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![0u8; 4];
        out.extend_from_slice(&(self.0.len() as u32).to_le_bytes());
        for (k, v) in &self.0 {
            out.extend_from_slice(&(k.len() as u16).to_le_bytes());
            out.extend_from_slice(&(v.len() as u32).to_le_bytes());
            out.extend_from_slice(k);
            out.extend_from_slice(v);
        }
        let n = out.len() as u32;
        out[0..4].copy_from_slice(&n.to_le_bytes());
        out
    }
    /// Decode a whole encoded set (including its length prefix).
    pub fn decode(b: &[u8]) -> Result<Self, FormatError> {
        let mut c = Cursor::new(b, "xattr set");
        let total = c.u32()? as usize;
        if total != b.len() {
            return Err(FormatError::invalid("xattr set", "length mismatch"));
        }
        let n = c.u32()?;
        let mut v = Vec::with_capacity((n as usize).min(c.remaining() / 6));
        for _ in 0..n {
            let kl = c.u16()? as usize;
            let vl = c.u32()? as usize;
            let k = c.take(kl)?.to_vec();
            let val = c.take(vl)?.to_vec();
            if k.is_empty() {
                return Err(FormatError::invalid("xattr set", "empty name"));
            }
            v.push((k, val));
        }
        Ok(XattrSet(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip() {
        let i = InodeRecord {
            mode: 0o104755,
            uid: 1,
            gid: 2,
            nlink: 3,
            mtime_sec: -5,
            mtime_nsec: 999_999_999,
            size: 5 << 32,
            data: 7,
            count: 8,
            parent: 9,
            xattr: 10,
        };
        let mut b = vec![];
        i.encode(&mut b);
        assert_eq!(b.len(), InodeRecord::LEN);
        assert_eq!(InodeRecord::decode(&b).unwrap(), i);

        let c = ChunkRecord {
            file_offset: 1 << 40,
            block: HOLE,
            block_offset: 3,
            len: 4,
        };
        let mut b = vec![];
        c.encode(&mut b);
        assert_eq!(b.len(), ChunkRecord::LEN);
        assert_eq!(ChunkRecord::decode(&b).unwrap(), c);

        let d = DirentRecord {
            name_offset: 11,
            name_len: 255,
            dtype: 0o10,
            inode: 12,
        };
        let mut b = vec![];
        d.encode(&mut b);
        assert_eq!(b.len(), DirentRecord::LEN);
        assert_eq!(DirentRecord::decode(&b).unwrap(), d);
    }

    #[test]
    fn xattr_set_round_trip_and_truncation() {
        let s = XattrSet(vec![
            (b"security.capability".to_vec(), vec![1, 2, 3]),
            (b"user.x".to_vec(), vec![]),
        ]);
        let b = s.encode();
        assert_eq!(XattrSet::decode(&b).unwrap(), s);
        assert!(XattrSet::decode(&b[..b.len() - 1]).is_err());
    }

    #[test]
    fn bad_mode_is_rejected() {
        let mut b = vec![];
        InodeRecord::default().encode(&mut b);
        assert!(InodeRecord::decode(&b).is_err());
    }
}
