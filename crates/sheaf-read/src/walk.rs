//! A depth-first walk of an image's tree straight from its metadata (no
//! mount): what `sheaf find` and `sheaf du` run on.

use crate::error::ReadError;
use crate::image::{Image, Inode};
use crate::tree::Seen;
use sheaf_format::FileType;

/// What a walk's visitor wants next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Go on (into this entry, if it is a directory).
    Continue,
    /// Do not enter this directory.
    Prune,
}

/// A walk's visitor: called with each entry's path, inode and depth (0 for
/// the start).
pub type Visitor<'a> = dyn FnMut(&[u8], &Inode, usize) -> Result<Step, ReadError> + 'a;

/// One directory being listed by the walk.
struct Frame {
    /// Length of its path in the walk's path buffer.
    len: usize,
    kids: std::vec::IntoIter<(Vec<u8>, Inode)>,
    depth: usize,
}

impl Image {
    /// The entries of `dir`, in name order, with their inodes (checked
    /// against the tree rules; a directory's children are stat'ed in runs).
    fn children(&self, dir: &Inode) -> Result<Vec<(Vec<u8>, Inode)>, ReadError> {
        let n = self.dir_len(dir)? as usize;
        let entries = self.read_dir(dir, 0, n)?;
        let inos: Vec<u32> = entries.iter().map(|e| e.ino).collect();
        let inodes = self.inodes(&inos)?;
        entries
            .into_iter()
            .zip(inodes)
            .map(|(e, i)| {
                self.check_child(dir, &i, e.file_type)?;
                Ok((e.name, i))
            })
            .collect()
    }

    /// Visit `start` (called `path`, depth 0) and everything under it:
    /// parents before children, siblings in name order, each directory
    /// listed once (a tree that lists one twice is refused, so a crafted
    /// image cannot make the walk loop). Paths join names with `/`.
    pub fn walk(
        &self,
        start: Inode,
        path: Vec<u8>,
        visit: &mut Visitor<'_>,
    ) -> Result<(), ReadError> {
        let mut seen = Seen::new(self);
        if visit(&path, &start, 0)? == Step::Prune || start.file_type() != FileType::Directory {
            return Ok(());
        }
        seen.enter(self, &start)?;
        let kids = self.children(&start)?.into_iter();
        // One path buffer for the whole walk: each entry's path is its
        // directory's (a prefix kept by length) plus its name, so listing
        // allocates nothing per entry (a clone per entry was a tenth of
        // `sheaf find`'s time).
        let mut p = path;
        let mut stack = vec![Frame {
            len: p.len(),
            kids,
            depth: 0,
        }];
        while let Some(top) = stack.last_mut() {
            let Some((name, ino)) = top.kids.next() else {
                stack.pop();
                continue;
            };
            p.truncate(top.len);
            if !p.ends_with(b"/") {
                p.push(b'/');
            }
            p.extend_from_slice(&name);
            let depth = top.depth + 1;
            if visit(&p, &ino, depth)? == Step::Continue && ino.file_type() == FileType::Directory {
                seen.enter(self, &ino)?;
                let kids = self.children(&ino)?.into_iter();
                stack.push(Frame {
                    len: p.len(),
                    kids,
                    depth,
                });
            }
        }
        Ok(())
    }
}
