//! Building from a stream of entries ([`crate::Input::Entries`]): any tree a
//! caller can walk, such as the merged view of stacked images (`sheaf
//! merge`, [`crate::stack_input`]), without this module knowing where it
//! comes from.
//!
//! Entries come parents first; file data is read from each file's reader
//! once, in stream order, so memory stays per entry, never per byte.

use crate::options::{BuildError, BuildOptions};
use crate::pack::Packer;
use crate::scan::{Excluder, Normalizer, Problems};
use crate::tree::{Kind, NodeId, Tree};
use sheaf_format::{FileType, XattrSet};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// A tree to pack, walked once per build.
pub trait EntrySource: std::fmt::Debug + Send + Sync {
    /// What to call the source in messages about its entries (empty: the
    /// entries' paths alone, when the source's errors name it already).
    fn name(&self) -> String;
    /// Every entry, each directory before the entries inside it; an entry
    /// with an empty path gives the root's attributes. Each call walks anew.
    fn entries(&self) -> Box<dyn Iterator<Item = Result<Entry<'_>, BuildError>> + '_>;
}

/// One entry of an [`EntrySource`].
pub struct Entry<'a> {
    /// Path from the root, components separated by `/` (no `..`); empty
    /// for the root itself.
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
    let norm = Normalizer::new(opts);
    let excl = Excluder::new(&opts.exclude)?;
    let name = src.name();
    let shown = |p: &[u8]| match name.as_str() {
        "" => String::from_utf8_lossy(p).into_owned(),
        n => format!("{n}: {}", String::from_utf8_lossy(p)),
    };
    let bad = |p: &[u8], d: &str| BuildError::BadInput {
        path: shown(p),
        detail: d.to_string(),
    };
    let mut tree = Tree::new(norm.meta(libc::S_IFDIR | 0o755, 0, 0, 0, 0));
    // Directories by normalised path ("" is the root), and inodes by link key.
    let mut dirs: HashMap<Vec<u8>, NodeId> = HashMap::from([(Vec::new(), 0)]);
    let mut links: HashMap<u64, NodeId> = HashMap::new();
    for entry in src.entries() {
        if cancel.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(BuildError::Interrupted);
        }
        let e = entry?;
        let mut comps = Vec::new();
        for c in e.path.split(|&b| b == b'/') {
            match c {
                b"" | b"." => {}
                b".." => return Err(bad(&e.path, "path climbs out with '..'")),
                c => comps.push(c),
            }
        }
        let key = comps.join(&b'/');
        let ok_type = FileType::from_mode(e.mode).is_some_and(|t| e.kind.allows(t));
        if !ok_type {
            return Err(bad(&e.path, "mode does not match the entry's type"));
        }
        let meta = norm.meta(e.mode, e.uid, e.gid, e.mtime_sec, e.mtime_nsec);
        let xattrs = tree.intern_xattrs(XattrSet(e.xattrs));
        let Some((leaf, parents)) = comps.split_last() else {
            if !matches!(e.kind, EntryKind::Dir) {
                return Err(bad(&e.path, "the root must be a directory"));
            }
            tree.set_meta(0, meta, xattrs);
            continue;
        };
        // The path and each ancestor, as a directory walk would match them.
        let excluded = (1..=comps.len()).any(|n| {
            let p = comps[..n].join(&b'/');
            excl.excluded(Path::new(std::ffi::OsStr::from_bytes(&p)))
        });
        if excluded {
            continue;
        }
        let Some(&parent) = dirs.get(&parents.join(&b'/')) else {
            return Err(bad(&e.path, "comes before its directory"));
        };
        if let (Some(k), false) = (e.link, matches!(e.kind, EntryKind::Dir)) {
            if let Some(&target) = links.get(&k) {
                tree.link(parent, leaf, target);
                continue;
            }
        }
        let kind = match e.kind {
            EntryKind::Dir => {
                if let Some(&d) = dirs.get(&key) {
                    tree.set_meta(d, meta, xattrs);
                    continue;
                }
                Kind::Dir(Box::default())
            }
            EntryKind::File(mut r) => {
                // The node this file becomes.
                let id = tree.nodes.len() as NodeId;
                match packer.add_file(&mut r, None, &shown(&key), id) {
                    Ok((size, range)) => tree.file_kind(size, range),
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
        let is_dir = matches!(kind, Kind::Dir(_));
        let node = tree.node(meta, kind, xattrs);
        let id = tree.add(parent, leaf, node);
        if is_dir {
            dirs.insert(key, id);
        } else if let Some(k) = e.link {
            links.insert(k, id);
        }
    }
    tree.finish();
    Ok(tree)
}
