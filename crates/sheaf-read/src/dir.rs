//! The directory side of an image: listings (and the batched stat of a
//! listing's inodes), lookups by name, path resolution and the walk that
//! names inodes. Names and steps are checked
//! against the tree rules (`tree`) as they are read.

use crate::error::ReadError;
use crate::image::{DirEntry, Image, Inode};
use sheaf_format::{DirentRecord, FileType, InodeRecord, StreamId};

impl Image {
    fn dir_range(&self, dir: &Inode) -> Result<(u64, u64), ReadError> {
        if dir.file_type() != FileType::Directory {
            return Err(ReadError::NotADirectory(dir.ino));
        }
        let (start, n) = (dir.rec.data, dir.rec.count as u64);
        if start
            .checked_add(n)
            .is_none_or(|e| e > self.superblock().dirent_count)
        {
            return Err(self.corrupt_inode(dir.ino, "directory entries out of range"));
        }
        Ok((start, n))
    }

    /// Directory entry `idx` of the whole dirent table.
    pub fn dirent(&self, idx: u64) -> Result<DirentRecord, ReadError> {
        self.record(
            StreamId::Dirents,
            idx,
            DirentRecord::LEN,
            DirentRecord::decode,
        )
    }

    /// Name of a dirent.
    pub fn dirent_name(&self, d: &DirentRecord) -> Result<Vec<u8>, ReadError> {
        self.heap(d.name_offset, d.name_len as usize)
    }

    /// Number of entries of a directory.
    pub fn dir_len(&self, dir: &Inode) -> Result<u64, ReadError> {
        Ok(self.dir_range(dir)?.1)
    }

    /// Entries `[from, from+max)` of a directory, in name order.
    ///
    /// Reads the dirent records in one range and, when the names lie close
    /// together in the heap (the builder writes a directory's names in
    /// order), the names in one range too: a listing costs a few page-cache
    /// lookups, not several per entry.
    pub fn read_dir(&self, dir: &Inode, from: u64, max: usize) -> Result<Vec<DirEntry>, ReadError> {
        let mut v = Vec::new();
        self.read_dir_each(dir, from, max, &mut |name, ino, file_type| {
            v.push(DirEntry {
                name: name.to_vec(),
                ino,
                file_type,
            })
        })?;
        Ok(v)
    }

    /// [`Image::read_dir`] without a `Vec` per name: `each` gets every
    /// entry's name (borrowed), inode number and type, in name order, each
    /// checked before it is given. A walk of 16M entries allocated and
    /// freed a name per entry, a tenth of `sheaf find`'s time.
    pub fn read_dir_each(
        &self,
        dir: &Inode,
        from: u64,
        max: usize,
        each: &mut dyn FnMut(&[u8], u32, FileType),
    ) -> Result<(), ReadError> {
        let (start, n) = self.dir_range(dir)?;
        let end = n.min(from.saturating_add(max as u64));
        if from >= end {
            return Ok(());
        }
        let count = (end - from) as usize;
        let recs = self.records(
            StreamId::Dirents,
            start + from,
            count,
            DirentRecord::LEN,
            DirentRecord::decode,
        )?;
        let lo = recs.iter().map(|d| d.name_offset).min().unwrap_or(0);
        let hi = recs
            .iter()
            .map(|d| d.name_offset.saturating_add(d.name_len as u64))
            .max()
            .unwrap_or(0);
        let wanted: u64 = recs.iter().map(|d| d.name_len as u64).sum();
        // One range if it is not mostly bytes we do not need.
        let names = if hi - lo <= wanted * 2 + 4096 {
            Some(self.heap(lo, (hi - lo) as usize)?)
        } else {
            None
        };
        // The previous name, for the order check, in one reused buffer.
        let mut prev: Option<Vec<u8>> = None;
        for d in recs {
            let read;
            let name = match &names {
                Some(h) => {
                    let s = (d.name_offset - lo) as usize;
                    &h[s..s + d.name_len as usize]
                }
                None => {
                    read = self.dirent_name(&d)?;
                    &read[..]
                }
            };
            self.check_listed_name(dir, prev.as_deref(), name)?;
            each(
                name,
                d.inode,
                FileType::from_dtype(d.dtype).expect("validated"),
            );
            let p = prev.get_or_insert_with(Vec::new);
            p.clear();
            p.extend_from_slice(name);
        }
        Ok(())
    }

    /// Find `name` in a directory by binary search: the inode number it
    /// names (unchecked; [`Image::lookup_child`] reads and checks it).
    pub fn lookup(&self, dir: &Inode, name: &[u8]) -> Result<Option<u32>, ReadError> {
        Ok(self.lookup_entry(dir, name)?.map(|e| e.0))
    }

    /// Find `name` in a directory: the inode number and the entry's type.
    pub fn lookup_entry(
        &self,
        dir: &Inode,
        name: &[u8],
    ) -> Result<Option<(u32, FileType)>, ReadError> {
        let (start, n) = self.dir_range(dir)?;
        let (mut lo, mut hi) = (0u64, n);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let d = self.dirent(start + mid)?;
            let order = self.with_stream(
                StreamId::Heap,
                d.name_offset,
                d.name_len as usize,
                &mut |n| Ok(n.cmp(name)),
            )?;
            match order {
                std::cmp::Ordering::Equal => {
                    let t = FileType::from_dtype(d.dtype).expect("validated");
                    return Ok(Some((d.inode, t)));
                }
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
            }
        }
        Ok(None)
    }

    /// A path (relative to the root, no leading `/`) for each of `inos`, by
    /// one walk of the tree that stops once all are found; `None` for an
    /// inode no directory names. A hardlinked file gets one of its names.
    pub fn paths_of(&self, inos: &[u32]) -> Result<Vec<Option<Vec<u8>>>, ReadError> {
        let mut want: std::collections::HashMap<u32, Option<Vec<u8>>> =
            inos.iter().map(|&i| (i, None)).collect();
        let mut left = want.len();
        let mut seen = crate::tree::Seen::new(self);
        let mut queue = std::collections::VecDeque::from([(self.root()?, Vec::new())]);
        while let Some((dir, path)) = queue.pop_front() {
            if left == 0 {
                break;
            }
            seen.enter(self, &dir)?;
            let n = self.dir_len(&dir)?;
            let mut from = 0;
            while from < n {
                let batch = self.read_dir(&dir, from, 4096)?;
                from += batch.len() as u64;
                for e in batch {
                    let mut p = path.clone();
                    if !p.is_empty() {
                        p.push(b'/');
                    }
                    p.extend_from_slice(&e.name);
                    if let Some(slot @ None) = want.get_mut(&e.ino) {
                        *slot = Some(p.clone());
                        left -= 1;
                    }
                    if e.file_type == FileType::Directory {
                        queue.push_back((self.child(&dir, e.ino, e.file_type)?, p));
                    }
                }
            }
        }
        Ok(inos.iter().map(|i| want[i].clone()).collect())
    }

    /// Resolve a `/`-separated path from the root, without following symlinks.
    pub fn resolve(&self, path: &[u8]) -> Result<Inode, ReadError> {
        let mut cur = self.root()?;
        for comp in path.split(|&b| b == b'/') {
            match comp {
                b"" | b"." => {}
                b".." => {
                    cur = self.inode(if cur.file_type() == FileType::Directory {
                        cur.rec.parent
                    } else {
                        cur.ino
                    })?
                }
                c => {
                    cur = self
                        .lookup_child(&cur, c)
                        .map_err(|e| match e {
                            ReadError::NotADirectory(_) => {
                                ReadError::NotFound(String::from_utf8_lossy(path).into())
                            }
                            e => e,
                        })?
                        .ok_or_else(|| ReadError::NotFound(String::from_utf8_lossy(path).into()))?;
                }
            }
        }
        Ok(cur)
    }

    /// Resolve a path as a program inside the image would (`cat`, `open`):
    /// symlinks are followed in every component, the last one too,
    /// relative ones from their directory and absolute ones from the image's
    /// root (never outside it: `..` at the root stays there); more than 40
    /// links in one resolution is a loop.
    pub fn resolve_follow(&self, path: &[u8]) -> Result<Inode, ReadError> {
        const MAX_LINKS: usize = 40;
        let whole = || String::from_utf8_lossy(path).into_owned();
        let mut todo: std::collections::VecDeque<Vec<u8>> =
            path.split(|&b| b == b'/').map(<[u8]>::to_vec).collect();
        let root = self.root()?;
        let mut cur = root;
        let mut links = 0;
        while let Some(comp) = todo.pop_front() {
            match comp.as_slice() {
                b"" | b"." => {}
                b".." => cur = self.inode(cur.rec.parent)?,
                c => {
                    if cur.file_type() != FileType::Directory {
                        return Err(ReadError::NotFound(whole()));
                    }
                    let child = self
                        .lookup_child(&cur, c)?
                        .ok_or_else(|| ReadError::NotFound(whole()))?;
                    if child.file_type() != FileType::Symlink {
                        cur = child;
                        continue;
                    }
                    links += 1;
                    if links > MAX_LINKS {
                        return Err(ReadError::TooManyLinks(whole()));
                    }
                    let target = self.read_link(&child)?;
                    if target.first() == Some(&b'/') {
                        cur = root;
                    }
                    for t in target.split(|&b| b == b'/').rev() {
                        todo.push_front(t.to_vec());
                    }
                }
            }
        }
        Ok(cur)
    }

    /// Stat several inodes; consecutive numbers (a directory's children, by
    /// the builder's breadth-first numbering) are read as one range.
    pub fn inodes(&self, inos: &[u32]) -> Result<Vec<Inode>, ReadError> {
        let mut out = Vec::with_capacity(inos.len());
        let mut i = 0;
        while i < inos.len() {
            let mut j = i + 1;
            while j < inos.len() && inos[j] as u64 == inos[j - 1] as u64 + 1 {
                j += 1;
            }
            let first = inos[i];
            let n = j - i;
            if first as u64 + n as u64 > self.superblock().inode_count {
                // Let the single-inode path produce the precise error.
                for &ino in &inos[i..j] {
                    out.push(self.inode(ino)?);
                }
            } else {
                let recs = self.records(
                    StreamId::Inodes,
                    first as u64,
                    n,
                    InodeRecord::LEN,
                    InodeRecord::decode,
                )?;
                out.extend((first..).zip(recs).map(|(ino, rec)| Inode { ino, rec }));
            }
            i = j;
        }
        Ok(out)
    }
}
