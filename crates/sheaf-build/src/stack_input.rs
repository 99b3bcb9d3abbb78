//! Building from the merged view of stacked images (`sheaf merge`): a
//! [`StackSource`] walks a [`sheaf_read::Stack`] as the builder's entries
//! ([`crate::entries`]), so the result is what the stack shows: later layers
//! win, whiteouts and opaque directories applied and none left in the image,
//! directories with the attributes of the topmost layer holding them.
//!
//! The walk visits directories as a directory scan does (each directory's
//! entries together, then its subdirectories, from a stack), so the tree's
//! nodes come in the order `sheaf build` of the same tree on disk gives
//! them; memory is one directory's listing and the directories waiting to
//! be listed. Regular files are
//! [`EntryKind::Deferred`]: the builder reads each once, after the walk, in
//! the packing order a directory build gives the same tree
//! (`plan.rs`), with its dictionary and defaults. A layer built by
//! sheaf was packed in that order, so the reads follow its blocks and a few
//! blocks of cache per layer are enough ([`layer_options`]).
//!
//! The one place this crate reads images; everything else here works from
//! directories, tar streams and caller entries.

use crate::entries::{Entry, EntryKind, EntrySource};
use crate::BuildError;
use sheaf_format::FileType;
use sheaf_read::{Found, Image, ImageOptions, Inode, MergedDir, Stack, StackEntry};

/// Decoded data blocks kept per layer while merging.
pub const LAYER_BLOCK_CACHE: usize = 32 << 20;

/// The options to open each layer of a merge with: a small block cache
/// ([`LAYER_BLOCK_CACHE`]), since each file is read once, in packing order.
pub fn layer_options() -> ImageOptions {
    ImageOptions {
        block_cache_bytes: LAYER_BLOCK_CACHE,
        ..Default::default()
    }
}

/// The merged view of a stack, walked as entries for the builder: pass it
/// as [`crate::Input::Entries`].
#[derive(Debug)]
pub struct StackSource {
    stack: Stack,
}

impl StackSource {
    /// Walk `stack`'s merged view.
    pub fn new(stack: Stack) -> StackSource {
        StackSource { stack }
    }

    /// The stack walked.
    pub fn stack(&self) -> &Stack {
        &self.stack
    }
}

impl EntrySource for StackSource {
    fn name(&self) -> String {
        String::new()
    }

    fn entries(&self) -> Box<dyn Iterator<Item = Result<Entry<'_>, BuildError>> + '_> {
        Box::new(Walk {
            stack: &self.stack,
            started: false,
            current: None,
            todo: Vec::new(),
            failed: false,
            seen: sheaf_read::SeenMerged::new(&self.stack),
        })
    }
}

/// One directory being listed: its merged parts, its path, what is left,
/// and the directories among what was given.
struct Frame {
    dir: MergedDir,
    path: Vec<u8>,
    rest: std::vec::IntoIter<StackEntry>,
    subdirs: Vec<(MergedDir, Vec<u8>)>,
}

/// A walk of the merged view in the order a directory scan visits a tree
/// (`crate::scan::scan_dir`): a directory's entries all together, in name
/// order, then its subdirectories, the last one first (a stack). Entries
/// thus become the builder's nodes in the order a scan of the same tree
/// on disk gives them, and the packing plan, which numbers directory
/// classes in node order, packs them alike. Memory is the listing of one
/// directory and the directories waiting to be listed.
struct Walk<'a> {
    stack: &'a Stack,
    started: bool,
    /// The directory being listed.
    current: Option<Frame>,
    /// Directories to list, the last first.
    todo: Vec<(MergedDir, Vec<u8>)>,
    failed: bool,
    /// Directories entered (a hostile layer cannot make the walk loop).
    seen: sheaf_read::SeenMerged,
}

fn read_err(path: &[u8], e: sheaf_read::ReadError) -> BuildError {
    BuildError::BadInput {
        path: if path.is_empty() {
            "/".into()
        } else {
            crate::normalize::shown(path)
        },
        detail: e.to_string(),
    }
}

impl<'a> Walk<'a> {
    fn frame(&mut self, dir: MergedDir, path: Vec<u8>) -> Result<Frame, BuildError> {
        self.seen
            .enter(self.stack, &dir)
            .map_err(|e| read_err(&path, e))?;
        let list = self.stack.read_dir(&dir).map_err(|e| read_err(&path, e))?;
        Ok(Frame {
            dir,
            path,
            rest: list.into_iter(),
            subdirs: Vec::new(),
        })
    }

    /// The entry for `ino` of layer `layer`, at `path`.
    fn entry(&self, layer: usize, ino: Inode, path: Vec<u8>) -> Result<Entry<'a>, BuildError> {
        let img: &'a Image = &self.stack.layers()[layer];
        let err = |e| read_err(&path, e);
        let r = ino.rec;
        let t = ino.file_type();
        let kind = match t {
            FileType::Directory => EntryKind::Dir,
            FileType::Regular => EntryKind::Deferred {
                size: r.size,
                data: Box::new(FileReader { img, ino, off: 0 }),
            },
            FileType::Symlink => EntryKind::Symlink(img.read_link(&ino).map_err(err)?),
            FileType::CharDevice | FileType::BlockDevice => EntryKind::Device(r.data),
            FileType::Fifo | FileType::Socket => EntryKind::Special,
        };
        let link = (t != FileType::Directory && r.nlink > 1)
            .then_some(((layer as u64) << 32) | ino.ino as u64);
        Ok(Entry {
            xattrs: img.xattrs(&ino).map_err(err)?.0,
            path,
            mode: r.mode,
            uid: r.uid,
            gid: r.gid,
            mtime_sec: r.mtime_sec,
            mtime_nsec: r.mtime_nsec,
            link,
            kind,
        })
    }

    fn step(&mut self) -> Result<Option<Entry<'a>>, BuildError> {
        if !self.started {
            self.started = true;
            let root = self.stack.root().map_err(|e| read_err(b"", e))?;
            let (l, ino) = root.parts[0];
            self.todo.push((root, Vec::new()));
            return self.entry(l, ino, Vec::new()).map(Some);
        }
        loop {
            let Some(cur) = self.current.as_mut() else {
                let Some((dir, path)) = self.todo.pop() else {
                    return Ok(None);
                };
                self.current = Some(self.frame(dir, path)?);
                continue;
            };
            let Some(e) = cur.rest.next() else {
                let done = self.current.take().expect("a directory is being listed");
                self.todo.extend(done.subdirs);
                continue;
            };
            let mut path = cur.path.clone();
            if !path.is_empty() {
                path.push(b'/');
            }
            path.extend_from_slice(&e.name);
            if e.file_type == FileType::Directory {
                let found = self
                    .stack
                    .lookup(&cur.dir, &e.name)
                    .map_err(|err| read_err(&path, err))?;
                let Some(Found::Dir(d)) = found else {
                    return Err(BuildError::BadInput {
                        path: String::from_utf8_lossy(&path).into_owned(),
                        detail: "listed as a directory but not found as one".into(),
                    });
                };
                let (l, ino) = d.parts[0];
                cur.subdirs.push((d, path.clone()));
                return self.entry(l, ino, path).map(Some);
            }
            let ino = self
                .stack
                .entry_inode(&cur.dir, &e)
                .map_err(|err| read_err(&path, err))?;
            return self.entry(e.layer, ino, path).map(Some);
        }
    }
}

impl<'a> Iterator for Walk<'a> {
    type Item = Result<Entry<'a>, BuildError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        let r = self.step().transpose();
        self.failed = matches!(r, Some(Err(_)));
        r
    }
}

/// A regular file of one layer, read in order.
struct FileReader<'a> {
    img: &'a Image,
    ino: Inode,
    off: u64,
}

impl std::io::Read for FileReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self
            .img
            .read(&self.ino, self.off, buf)
            .map_err(std::io::Error::other)?;
        self.off += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{build, BuildOptions, Input, Progress};
    use std::fs;
    use std::path::Path;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    fn pack(input: Input, out: &Path) -> Image {
        build(
            &input,
            out,
            &BuildOptions::default(),
            Arc::new(Progress::default()),
            &AtomicBool::new(false),
        )
        .unwrap();
        sheaf_read::open_path(out).unwrap()
    }

    fn layer(dir: &Path, name: &str, files: &[(&str, &str)]) -> Arc<Image> {
        let src = dir.join(name);
        for (p, c) in files {
            fs::create_dir_all(src.join(p).parent().unwrap()).unwrap();
            fs::write(src.join(p), c).unwrap();
        }
        Arc::new(pack(Input::Dir(src), &dir.join(format!("{name}.sheaf"))))
    }

    fn names(img: &Image, path: &str) -> Vec<String> {
        let d = img.resolve(path.as_bytes()).unwrap();
        img.read_dir(&d, 0, 100)
            .unwrap()
            .into_iter()
            .map(|e| String::from_utf8(e.name).unwrap())
            .collect()
    }

    #[test]
    fn a_merged_stack_packs_as_it_shows_without_whiteouts() {
        let t = tempfile::tempdir().unwrap();
        let base = layer(
            t.path(),
            "base",
            &[
                ("a/x", "base x"),
                ("a/y", "base y"),
                ("b/old", "old"),
                ("keep", "k"),
            ],
        );
        let top = layer(
            t.path(),
            "top",
            &[
                ("a/.wh.x", ""),
                ("a/y", "top y"),
                ("b/.wh..wh..opq", ""),
                ("b/new", "new"),
            ],
        );
        let src = StackSource::new(Stack::new(vec![base, top]));
        let flat = pack(Input::Entries(Arc::new(src)), &t.path().join("flat.sheaf"));
        assert_eq!(names(&flat, ""), ["a", "b", "keep"]);
        assert_eq!(names(&flat, "a"), ["y"]);
        assert_eq!(names(&flat, "b"), ["new"]);
        let y = flat.resolve(b"a/y").unwrap();
        let mut buf = [0u8; 16];
        let n = flat.read(&y, 0, &mut buf).unwrap();
        assert_eq!(&buf[..n], b"top y");
    }
}
