//! The blob: one virtual file in which each file with data has a range
//! ([`BlobMap`]); a read of it is a read of those files, through the image
//! reader (lazy, every block verified before its bytes are given), with
//! zeros where a range's last block passes its file's end.

use fuser::Errno;
use sheaf_erofs::{BlobMap, BLOCK};
use sheaf_read::Image;
use std::sync::Arc;

/// The blob of one image or of a stack's layers.
pub struct BlobFs {
    pub(super) layers: Vec<Arc<Image>>,
    pub(super) map: BlobMap,
}

impl BlobFs {
    /// The blob of `layers` (one image, or a stack bottom first) laid out
    /// by `map` (what `sheaf_erofs::write` or `write_stack` gave for them).
    pub fn new(layers: Vec<Arc<Image>>, map: BlobMap) -> BlobFs {
        BlobFs { layers, map }
    }

    /// The blob's length in bytes.
    pub fn len(&self) -> u64 {
        self.map.len()
    }

    /// Whether the blob is empty (no file has data).
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Blob bytes `[offset, offset + size)`, cut at the blob's end. A
    /// refusal of the reader (a block that fails verification, a source
    /// that stays down) is EIO: the kernel gets no byte it should not.
    pub fn read(&self, offset: u64, size: u32) -> Result<Vec<u8>, Errno> {
        let end = offset.saturating_add(u64::from(size)).min(self.len());
        if offset >= end {
            return Ok(Vec::new());
        }
        let mut out = vec![0u8; (end - offset) as usize];
        let mut at = offset;
        while at < end {
            let Some(e) = self.map.find(at) else {
                // Ranges are adjacent from block 0 to the end: not reached.
                return Err(Errno::EIO);
            };
            let start = u64::from(e.start) * BLOCK;
            let range_end = (start + e.blocks() * BLOCK).min(end);
            let data_end = (start + e.size).min(range_end);
            if at < data_end {
                let img = self.layers.get(e.layer as usize).ok_or(Errno::EIO)?;
                let ino = img.inode(e.ino).map_err(|err| self.refused(err))?;
                let mut from = at - start;
                let buf = &mut out[(at - offset) as usize..(data_end - offset) as usize];
                let mut got = 0;
                while got < buf.len() {
                    let n = img
                        .read(&ino, from, &mut buf[got..])
                        .map_err(|err| self.refused(err))?;
                    if n == 0 {
                        // Shorter than its record says: zeros, as a hole.
                        break;
                    }
                    got += n;
                    from += n as u64;
                }
            }
            at = range_end;
        }
        Ok(out)
    }

    fn refused(&self, err: sheaf_read::ReadError) -> Errno {
        log::error!("blob read: {}", sheaf_format::one_line(&err));
        Errno::EIO
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sheaf_read::{FileSource, Image};

    #[test]
    fn blob_reads_are_the_files_bytes_with_zeros_to_each_block_end() {
        let dir = tempfile::tempdir().unwrap();
        let a = sheaf_testkit::patterned(5000);
        let b = sheaf_testkit::patterned(4096);
        let path = sheaf_testkit::image(
            dir.path(),
            "t.sheaf",
            &[("a", &a[..]), ("b", &b[..]), ("c", b"x" as &[u8])],
        );
        let img = Arc::new(Image::open(Arc::new(FileSource::open(&path).unwrap())).unwrap());
        let mut meta = Vec::new();
        let map = sheaf_erofs::write(&img, &mut meta).unwrap().map;
        let fs = BlobFs::new(vec![img.clone()], map.clone());
        // The expected blob, from the files' contents by name.
        let mut want = Vec::new();
        let files: Vec<(u32, &[u8])> = [("a", &a[..]), ("b", &b[..]), ("c", &b"x"[..])]
            .into_iter()
            .map(|(n, c)| (img.resolve(n.as_bytes()).unwrap().ino, c))
            .collect();
        for e in map.extents() {
            let content = files.iter().find(|(i, _)| *i == e.ino).unwrap().1;
            let mut block = content.to_vec();
            block.resize(e.blocks() as usize * BLOCK as usize, 0);
            want.extend_from_slice(&block);
        }
        assert_eq!(want.len() as u64, fs.len());
        assert_eq!(fs.read(0, u32::MAX).unwrap(), want);
        for (off, len) in [(0, 1), (4095, 2), (4999, 4200), (5000, 100), (8192, 5000)] {
            let got = fs.read(off, len).unwrap();
            let end = (off as usize + len as usize).min(want.len());
            assert_eq!(got, want[off as usize..end], "at {off}+{len}");
        }
        assert!(fs.read(fs.len(), 10).unwrap().is_empty());
        assert!(fs.read(u64::MAX - 1, 10).unwrap().is_empty());
    }
}
