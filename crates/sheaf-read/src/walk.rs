//! A depth-first walk of an image's tree straight from its metadata (no
//! mount): what `sheaf find` and `sheaf du` run on.

use crate::error::ReadError;
use crate::image::{Image, Inode};
use crate::stack::{Found, Stack};
use crate::tree::{Seen, SeenMerged};
use sheaf_format::FileType;

/// What a walk's visitor wants next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Go on (into this entry, if it is a directory).
    Continue,
    /// Do not enter this directory.
    Prune,
    /// End the walk here (nothing more is visited or listed).
    Stop,
}

/// In which order a walk visits a directory and its entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// A directory before its entries (find's default).
    Pre,
    /// A directory after its entries (find's `-depth`), entering
    /// directories down to this depth; [`Step::Prune`] is then the same as
    /// [`Step::Continue`].
    Post(usize),
}

/// A walk's visitor: called with each entry's path, inode and depth (0 for
/// the start).
pub type Visitor<'a> = dyn FnMut(&[u8], &Inode, usize) -> Result<Step, ReadError> + 'a;

/// One directory being listed by the walk.
struct Frame {
    /// Length of its path in the walk's path buffer.
    len: usize,
    kids: Kids,
    depth: usize,
    /// The directory, while its visit waits for its entries' ([`Order::Post`]).
    after: Option<Inode>,
}

/// A directory's entries: their names in one buffer, and per entry where
/// its name lies there and its inode.
struct Kids {
    names: Vec<u8>,
    list: std::vec::IntoIter<(usize, usize, Inode)>,
}

impl Image {
    /// The entries of `dir`, in name order, with their inodes (checked
    /// against the tree rules; a directory's children are stat'ed in runs).
    fn children(&self, dir: &Inode) -> Result<Kids, ReadError> {
        let n = self.dir_len(dir)? as usize;
        // No room reserved for `n` entries: it is the image's word until
        // the listing has read them.
        // Per entry: where its name lies in `names`, and its type.
        let (mut names, mut spans, mut inos) = (Vec::new(), Vec::new(), Vec::new());
        self.read_dir_each(dir, 0, n, &mut |name, ino, t| {
            spans.push((names.len(), name.len(), t));
            names.extend_from_slice(name);
            inos.push(ino);
        })?;
        let inodes = self.inodes(&inos)?;
        let list = spans
            .into_iter()
            .zip(inodes)
            .map(|((at, len, t), i)| {
                self.check_child(dir, &i, t)?;
                Ok((at, len, i))
            })
            .collect::<Result<Vec<_>, ReadError>>()?;
        Ok(Kids {
            names,
            list: list.into_iter(),
        })
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
        self.walk_in(Order::Pre, start, path, visit)
    }

    /// [`Image::walk`] in the given order.
    pub fn walk_in(
        &self,
        order: Order,
        start: Inode,
        path: Vec<u8>,
        visit: &mut Visitor<'_>,
    ) -> Result<(), ReadError> {
        // Whether a directory at `depth` is entered before it is visited.
        let enter_first = |depth: usize| matches!(order, Order::Post(max) if depth < max);
        let mut seen = Seen::new(self);
        // The start is visited first unless it is a directory entered first
        // (then last); a walk goes on only into a directory visited before.
        let first = start.file_type() != FileType::Directory || !enter_first(0);
        if first
            && (visit(&path, &start, 0)? != Step::Continue
                || start.file_type() != FileType::Directory
                || order != Order::Pre)
        {
            return Ok(());
        }
        seen.enter(self, &start)?;
        let kids = self.children(&start)?;
        // One path buffer for the whole walk: each entry's path is its
        // directory's (a prefix kept by length) plus its name, so listing
        // allocates nothing per entry (a clone per entry was a tenth of
        // `sheaf find`'s time).
        let mut p = path;
        let mut stack = vec![Frame {
            len: p.len(),
            kids,
            depth: 0,
            after: (order != Order::Pre).then_some(start),
        }];
        while let Some(top) = stack.last_mut() {
            let Some((at, len, ino)) = top.kids.list.next() else {
                let done = stack.pop().expect("a frame was on top");
                if let Some(dir) = done.after {
                    p.truncate(done.len);
                    if visit(&p, &dir, done.depth)? == Step::Stop {
                        break;
                    }
                }
                continue;
            };
            p.truncate(top.len);
            if !p.ends_with(b"/") {
                p.push(b'/');
            }
            p.extend_from_slice(&top.kids.names[at..at + len]);
            let depth = top.depth + 1;
            let is_dir = ino.file_type() == FileType::Directory;
            let (enter, after) = if is_dir && enter_first(depth) {
                (true, Some(ino))
            } else {
                let step = visit(&p, &ino, depth)?;
                if step == Step::Stop {
                    break;
                }
                (
                    step == Step::Continue && is_dir && order == Order::Pre,
                    None,
                )
            };
            if enter {
                let dir = after.as_ref().unwrap_or(&ino);
                seen.enter(self, dir)?;
                let kids = self.children(dir)?;
                stack.push(Frame {
                    len: p.len(),
                    kids,
                    depth,
                    after,
                });
            }
        }
        Ok(())
    }
}

/// A walk of a [`Stack`]'s merged tree: called with each entry's path, what
/// it resolves to (a merged directory, or a node of one layer:
/// [`Found::shown`] gives its layer and inode) and its depth.
pub type StackVisitor<'a> = dyn FnMut(&[u8], &Found, usize) -> Result<Step, ReadError> + 'a;

/// One merged directory being listed by a stack walk.
struct StackFrame {
    len: usize,
    kids: std::vec::IntoIter<(Vec<u8>, Found)>,
    depth: usize,
    after: Option<Found>,
}

impl Stack {
    /// [`Image::walk_in`] over the merged tree: the same orders and steps,
    /// whiteouts applied and never visited, each directory visited once
    /// however many layers hold it (a layer that lists one twice is
    /// refused, as in a one-image walk).
    pub fn walk_in(
        &self,
        order: Order,
        start: Found,
        path: Vec<u8>,
        visit: &mut StackVisitor<'_>,
    ) -> Result<(), ReadError> {
        let enter_first = |depth: usize| matches!(order, Order::Post(max) if depth < max);
        let is_dir = |f: &Found| matches!(f, Found::Dir(_));
        let mut seen = SeenMerged::new(self);
        let first = !is_dir(&start) || !enter_first(0);
        if first
            && (visit(&path, &start, 0)? != Step::Continue
                || !is_dir(&start)
                || order != Order::Pre)
        {
            return Ok(());
        }
        let Found::Dir(d) = &start else {
            return Ok(());
        };
        seen.enter(self, d)?;
        let kids = self.children(d)?.into_iter();
        let mut p = path;
        let mut stack = vec![StackFrame {
            len: p.len(),
            kids,
            depth: 0,
            after: (order != Order::Pre).then(|| start.clone()),
        }];
        while let Some(top) = stack.last_mut() {
            let Some((name, f)) = top.kids.next() else {
                let done = stack.pop().expect("a frame was on top");
                if let Some(dir) = done.after {
                    p.truncate(done.len);
                    if visit(&p, &dir, done.depth)? == Step::Stop {
                        break;
                    }
                }
                continue;
            };
            p.truncate(top.len);
            if !p.ends_with(b"/") {
                p.push(b'/');
            }
            p.extend_from_slice(&name);
            let depth = top.depth + 1;
            let dir = is_dir(&f);
            let (enter, after) = if dir && enter_first(depth) {
                (true, Some(f.clone()))
            } else {
                let step = visit(&p, &f, depth)?;
                if step == Step::Stop {
                    break;
                }
                (step == Step::Continue && dir && order == Order::Pre, None)
            };
            if enter {
                let Found::Dir(d) = after.as_ref().unwrap_or(&f) else {
                    unreachable!("only directories are entered")
                };
                seen.enter(self, d)?;
                let kids = self.children(d)?.into_iter();
                stack.push(StackFrame {
                    len: p.len(),
                    kids,
                    depth,
                    after,
                });
            }
        }
        Ok(())
    }
}
