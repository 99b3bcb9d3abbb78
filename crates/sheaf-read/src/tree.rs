//! The tree rules (format.md §8.5), checked as a reader goes.
//!
//! Every record of an image may be well formed and hashed and the tree
//! still be hostile: a dirent naming an ancestor, a directory listed twice,
//! a parent field that disagrees, a dirent type that disagrees with its
//! inode. A signed image is no exception. This module is the one place
//! those rules are enforced:
//!
//! - [`Image::child`] checks every step down the tree for free (the inode is
//!   read anyway): the type agrees with the dirent's, and a directory names
//!   the directory it is listed in as its parent and is neither that
//!   directory nor the root. With these, a descent from the root can never
//!   come back to a directory it passed through, so paths and lookups end.
//! - Every listing checks its names (`check_listed_name`): plain, and
//!   strictly sorted.
//! - [`Seen`] bounds whole-tree walks: a directory listed under two names of
//!   its one parent passes the step check, so a walk remembers which
//!   directories it has entered (one bit per inode) and refuses a second
//!   visit, which keeps every walk linear in the image's entries.

use crate::error::ReadError;
use crate::image::{Image, Inode};
use sheaf_format::{DirentRecord, FileType, FormatError};

impl Image {
    /// The inode a directory entry names, checked against the tree rules:
    /// `file_type` is what the entry in `dir` says.
    pub fn child(&self, dir: &Inode, ino: u32, file_type: FileType) -> Result<Inode, ReadError> {
        let i = self.inode(ino)?;
        self.check_child(dir, &i, file_type)?;
        Ok(i)
    }

    /// Check an inode already read against the entry of `dir` that names it.
    pub fn check_child(
        &self,
        dir: &Inode,
        child: &Inode,
        file_type: FileType,
    ) -> Result<(), ReadError> {
        let t = child.file_type();
        if t != file_type {
            return Err(self.tree_error(
                dir.ino,
                format!(
                    "an entry says inode {} is a {} but it is a {}",
                    child.ino,
                    file_type.name(),
                    t.name()
                ),
            ));
        }
        if t == FileType::Directory {
            if child.ino == self.superblock().root_inode || child.ino == dir.ino {
                return Err(self.tree_error(
                    dir.ino,
                    format!(
                        "an entry names directory inode {} (itself or the root)",
                        child.ino
                    ),
                ));
            }
            if child.rec.parent != dir.ino {
                return Err(self.tree_error(
                    dir.ino,
                    format!(
                        "an entry names directory inode {} whose parent is inode {}",
                        child.ino, child.rec.parent
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Check an entry name of a listing of `dir`, after `prev` (the entry
    /// before it): plain (a `..` or a `/` would let a walker step outside
    /// the tree) and strictly after `prev` (a duplicate would let it loop).
    pub(crate) fn check_listed_name(
        &self,
        dir: &Inode,
        prev: Option<&[u8]>,
        name: &[u8],
    ) -> Result<(), ReadError> {
        if !DirentRecord::is_plain_name(name) {
            return Err(self.tree_error(
                dir.ino,
                format!("bad entry name {:?}", String::from_utf8_lossy(name)),
            ));
        }
        if prev.is_some_and(|p| p >= name) {
            return Err(self.tree_error(
                dir.ino,
                format!(
                    "entry {:?} is out of order or listed twice",
                    String::from_utf8_lossy(name)
                ),
            ));
        }
        Ok(())
    }

    /// Look `name` up in `dir` and read the inode it names, checked.
    pub fn lookup_child(&self, dir: &Inode, name: &[u8]) -> Result<Option<Inode>, ReadError> {
        match self.lookup_entry(dir, name)? {
            Some((ino, t)) => Ok(Some(self.child(dir, ino, t)?)),
            None => Ok(None),
        }
    }

    /// A broken tree rule, naming the directory where it was found.
    pub(crate) fn tree_error(&self, dir: u32, detail: String) -> ReadError {
        ReadError::format(
            self.name(),
            &format!("directory inode {dir}"),
            FormatError::invalid("tree", detail),
        )
    }
}

/// The directories a walk has entered, one bit per inode of one image.
#[derive(Debug, Clone)]
pub struct Seen {
    bits: Vec<u64>,
}

impl Seen {
    /// An empty set for `img`'s inodes.
    pub fn new(img: &Image) -> Seen {
        let n = img.superblock().inode_count.div_ceil(64) as usize;
        Seen { bits: vec![0; n] }
    }

    /// Record that the walk enters directory `dir`; an error if it did
    /// before (the directory is listed twice).
    pub fn enter(&mut self, img: &Image, dir: &Inode) -> Result<(), ReadError> {
        let (w, b) = ((dir.ino / 64) as usize, dir.ino % 64);
        // inode() refused numbers beyond the table, so `w` is in range.
        let word = &mut self.bits[w];
        if *word & (1 << b) != 0 {
            return Err(img.tree_error(
                dir.rec.parent,
                format!("directory inode {} is listed twice", dir.ino),
            ));
        }
        *word |= 1 << b;
        Ok(())
    }
}

/// The directories a walk of a [`Stack`](crate::Stack) has entered: one
/// [`Seen`] per layer, so a directory listed twice in any layer is refused.
#[derive(Debug, Clone)]
pub struct SeenMerged {
    layers: Vec<Seen>,
}

impl SeenMerged {
    /// An empty set for `stack`'s layers.
    pub fn new(stack: &crate::Stack) -> SeenMerged {
        SeenMerged {
            layers: stack.layers().iter().map(|i| Seen::new(i)).collect(),
        }
    }

    /// Record that the walk enters the merged directory `dir`.
    pub fn enter(&mut self, stack: &crate::Stack, dir: &crate::MergedDir) -> Result<(), ReadError> {
        for &(l, d) in &dir.parts {
            self.layers[l].enter(&stack.layers()[l], &d)?;
        }
        Ok(())
    }
}

/// A name from an image as GNU `ls` shows it on a terminal (its
/// `shell-escape` quoting): unchanged when every byte is plain; else in
/// single quotes, with control bytes, bytes that are not UTF-8 and DEL as
/// `$'\NNN'` (octal). An image's names never reach the terminal raw, so
/// none can send it escape sequences. The one quoting for every name from
/// an image printed to a terminal (`ls`, `find`, `du`, `info`) and for
/// every error line that names an entry (always: errors go to stderr).
pub fn terminal_name(name: &[u8]) -> String {
    let plain = |c: char| c.is_alphanumeric() || "-_./+,:@%=^".contains(c);
    let text = std::str::from_utf8(name).ok();
    if let Some(t) = text {
        if !t.is_empty() && t.chars().all(plain) {
            return t.to_string();
        }
        // A quote but nothing a double-quoted word would expand: "it's".
        if t.contains('\'') && !t.chars().any(|c| c.is_control() || "$`\\\"!".contains(c)) {
            return format!("\"{t}\"");
        }
    }
    // `open`: inside '...'; `esc`: the last thing written was $'...', which
    // the next escape joins ($'\a\033', as ls writes it).
    fn escape(out: &mut String, open: &mut bool, esc: &mut bool, byte: u8) {
        if *open {
            out.push('\'');
            *open = false;
        }
        if out.is_empty() {
            out.push_str("''");
        }
        let e = match byte {
            7 => "\\a".to_string(),
            8 => "\\b".to_string(),
            9 => "\\t".to_string(),
            10 => "\\n".to_string(),
            11 => "\\v".to_string(),
            12 => "\\f".to_string(),
            13 => "\\r".to_string(),
            b => format!("\\{b:03o}"),
        };
        if *esc {
            out.pop();
            out.push_str(&format!("{e}'"));
        } else {
            out.push_str(&format!("$'{e}'"));
        }
        *esc = true;
    }
    let mut out = String::new();
    let (mut open, mut esc) = (false, false);
    let mut rest = name;
    while !rest.is_empty() {
        let (valid, bad) = match std::str::from_utf8(rest) {
            Ok(s) => (s, &rest[rest.len()..]),
            Err(e) => (
                std::str::from_utf8(&rest[..e.valid_up_to()]).expect("valid prefix"),
                &rest[e.valid_up_to()..],
            ),
        };
        for c in valid.chars() {
            if c.is_control() {
                let mut b = [0u8; 4];
                for byte in c.encode_utf8(&mut b).bytes() {
                    escape(&mut out, &mut open, &mut esc, byte);
                }
            } else if c == '\'' {
                if open {
                    out.push('\'');
                    open = false;
                }
                out.push_str("\\'");
                esc = false;
            } else {
                esc = false;
                if !open {
                    out.push('\'');
                    open = true;
                }
                out.push(c);
            }
        }
        let Some((&first, more)) = bad.split_first() else {
            break;
        };
        escape(&mut out, &mut open, &mut esc, first);
        rest = more;
    }
    if open {
        out.push('\'');
    }
    if out.is_empty() {
        out.push_str("''");
    }
    out
}
