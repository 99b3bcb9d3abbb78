//! Building from a stream of entries ([`crate::Input::Entries`]): any tree a
//! caller can walk, such as the merged view of stacked images (`sheaf
//! merge`, [`crate::stack_input`]), without this module knowing where it
//! comes from.
//!
//! Entries feed a [`TreeBuilder`], which owns the rules for paths,
//! exclusions, implicit parents, duplicates and hardlinks
//! ([`crate::normalize`]). File data is read from each file's reader once,
//! in stream order, so memory stays per entry, never per byte.

use crate::normalize::{Absolute, LinkKey, TreeBuilder};
use crate::options::{BuildError, BuildOptions};
use crate::pack::{Dense, Packer};
use crate::scan::Problems;
use crate::tree::{Kind, NodeId, Tree};
use sheaf_format::{FileType, XattrSet};
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// A tree to pack, walked once per build.
pub trait EntrySource: std::fmt::Debug + Send + Sync {
    /// What to call the source in messages about its entries (empty: the
    /// entries' paths alone, when the source's errors name it already).
    fn name(&self) -> String;
    /// Every entry; an entry with an empty path gives the root's
    /// attributes, and a directory that comes after entries inside it (or
    /// never) is made implicit ([`crate::normalize`]). Each call walks anew.
    fn entries(&self) -> Box<dyn Iterator<Item = Result<Entry<'_>, BuildError>> + '_>;
}

/// One entry of an [`EntrySource`].
pub struct Entry<'a> {
    /// Path from the root, components separated by `/` (a `..` component
    /// is refused); empty for the root itself.
    pub path: Vec<u8>,
    /// Full mode: type bits (matching `kind`) and permission bits.
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Modification time, seconds.
    pub mtime_sec: i64,
    /// Modification time, nanoseconds.
    pub mtime_nsec: u32,
    /// Extended attributes (name, value).
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    /// Non-directories with the same key are one inode under several names
    /// (hardlinks): the first is stored, later ones only link to it and
    /// their data is not read.
    pub link: Option<u64>,
    /// What it is.
    pub kind: EntryKind<'a>,
}

/// What an [`Entry`] is, with its payload.
pub enum EntryKind<'a> {
    /// A directory.
    Dir,
    /// A regular file, read to its end.
    File(Box<dyn Read + 'a>),
    /// A symbolic link and its target.
    Symlink(Vec<u8>),
    /// A character or block device and its `rdev`.
    Device(u64),
    /// A fifo or socket.
    Special,
}

impl EntryKind<'_> {
    fn allows(&self, t: FileType) -> bool {
        matches!(
            (self, t),
            (EntryKind::Dir, FileType::Directory)
                | (EntryKind::File(_), FileType::Regular)
                | (EntryKind::Symlink(_), FileType::Symlink)
                | (
                    EntryKind::Device(_),
                    FileType::CharDevice | FileType::BlockDevice
                )
                | (EntryKind::Special, FileType::Fifo | FileType::Socket)
        )
    }
}

/// Read every entry of `src` into a tree, packing file data in stream order.
pub fn read_entries<W: Write + Send + 'static>(
    src: &dyn EntrySource,
    opts: &BuildOptions,
    packer: &mut Packer<W>,
    problems: &mut Problems,
    cancel: &std::sync::atomic::AtomicBool,
) -> Result<Tree, BuildError> {
    let mut b = TreeBuilder::new(opts, Absolute::Strip)?;
    let name = src.name();
    let shown = |p: &[u8]| match name.as_str() {
        "" => crate::normalize::shown(p),
        n => format!("{n}: {}", crate::normalize::shown(p)),
    };
    let bad = |p: &[u8], d: &str| BuildError::BadInput {
        path: shown(p),
        detail: d.to_string(),
    };
    let refuse = |problems: &mut Problems, p: &[u8], why: &dyn std::fmt::Display| {
        problems.handle(
            Path::new(std::ffi::OsStr::from_bytes(shown(p).as_bytes())),
            std::io::Error::other(why.to_string()),
        )
    };
    for entry in src.entries() {
        if cancel.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(BuildError::Interrupted);
        }
        let e = entry?;
        let ok_type = FileType::from_mode(e.mode).is_some_and(|t| e.kind.allows(t));
        if !ok_type {
            return Err(bad(&e.path, "mode does not match the entry's type"));
        }
        let p = match b.path(&e.path) {
            Ok(p) => p,
            Err(why) => {
                refuse(problems, &e.path, &why)?;
                continue;
            }
        };
        if b.excluded(&p) {
            continue;
        }
        let parent = b.parent(&p).map_err(|d| bad(&e.path, &d))?;
        let is_dir = matches!(e.kind, EntryKind::Dir);
        let link = e.link.filter(|_| !is_dir).map(LinkKey::Key);
        if let Some(target) = link.as_ref().and_then(|k| b.linked(k)) {
            if !p.is_root() {
                b.link(parent, &p, target);
                continue;
            }
        }
        let meta = b.meta(e.mode, e.uid, e.gid, e.mtime_sec, e.mtime_nsec);
        let xattrs = b.tree.intern_xattrs(XattrSet(e.xattrs));
        if p.is_root() && !is_dir {
            refuse(problems, &e.path, &"the root must be a directory")?;
            continue;
        }
        let kind = match e.kind {
            EntryKind::Dir => Kind::Dir(Box::default()),
            EntryKind::File(mut r) => {
                // The node this file becomes.
                let id = b.tree.nodes.len() as NodeId;
                let rel = p.joined();
                packer.set_group_of(&rel);
                match packer.add_file(&mut Dense(&mut r), &shown(&rel), id, cancel) {
                    Ok((size, range)) => b.tree.file_kind(size, range),
                    Err(BuildError::Input { path, cause }) if opts.skip_errors => {
                        problems.handle(Path::new(&path), cause)?;
                        continue;
                    }
                    Err(e) => return Err(e),
                }
            }
            EntryKind::Symlink(t) => Kind::Symlink(t.into()),
            EntryKind::Device(d) => Kind::Device(d),
            EntryKind::Special => Kind::Special,
        };
        if let Err(why) = b.put(parent, &p, meta, kind, xattrs, link) {
            refuse(problems, &e.path, &why)?;
        }
    }
    Ok(b.finish())
}
