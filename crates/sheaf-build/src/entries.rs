//! Building from a stream of entries ([`crate::Input::Entries`]): any tree a
//! caller can walk, such as the merged view of stacked images (`sheaf
//! merge`, [`crate::stack_input`]), without this module knowing where it
//! comes from.
//!
//! Entries feed a [`TreeBuilder`], which owns the rules for paths,
//! exclusions, implicit parents, duplicates and hardlinks
//! ([`crate::normalize`]). File data is read from each file's reader once,
//! so memory stays per entry, never per byte: a [`EntryKind::File`] in
//! stream order, as it comes; a [`EntryKind::Deferred`] (a source that can
//! be read in any order, such as images) after the walk, in the packing
//! order a directory's files get, with the same dictionary, pack boundaries
//! and groups (`plan.rs`).

use crate::normalize::{Absolute, LinkKey, TreeBuilder};
use crate::options::{BuildError, BuildOptions};
use crate::pack::{Dense, Packer, Progress};
use crate::plan::Plan;
use crate::scan::Problems;
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
    /// A regular file, read to its end before the next entry is taken.
    File(Box<dyn Read + 'a>),
    /// A regular file of `size` bytes (as far as the source knows) whose
    /// reader stays valid for the whole walk: it is read to its end after
    /// the walk, in packing order, as a directory's files are
    /// (`plan.rs`). A source gives either these or
    /// [`EntryKind::File`]s; those it gives as `File` are packed first, as
    /// they come, before the dictionary is trained.
    Deferred {
        /// The size, for the plan (the data read is what is stored).
        size: u64,
        /// The data.
        data: Box<dyn Read + 'a>,
    },
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
                | (
                    EntryKind::File(_) | EntryKind::Deferred { .. },
                    FileType::Regular
                )
                | (EntryKind::Symlink(_), FileType::Symlink)
                | (
                    EntryKind::Device(_),
                    FileType::CharDevice | FileType::BlockDevice
                )
                | (EntryKind::Special, FileType::Fifo | FileType::Socket)
        )
    }
}

/// Read every entry of `src` into a tree, packing the data of
/// [`EntryKind::File`]s in stream order, then that of
/// [`EntryKind::Deferred`] ones in packing order (`prefetch`: the
/// workload's files by path, first in its order).
pub fn read_entries<W: Write + Send + 'static>(
    src: &dyn EntrySource,
    opts: &BuildOptions,
    prefetch: &HashMap<&[u8], usize>,
    packer: &mut Packer<W>,
    problems: &mut Problems,
    progress: &Progress,
    cancel: &std::sync::atomic::AtomicBool,
) -> Result<Tree, BuildError> {
    // The readers of deferred files, by node.
    let mut deferred: HashMap<NodeId, Box<dyn Read + '_>> = HashMap::new();
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
        let mut later = None;
        let kind = match e.kind {
            EntryKind::Dir => Kind::Dir(Box::default()),
            EntryKind::Deferred { size, data } => {
                later = Some(data);
                Kind::File {
                    size,
                    first: 0,
                    count: 0,
                }
            }
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
        match b.put(parent, &p, meta, kind, xattrs, link) {
            Ok(id) => {
                if let Some(data) = later {
                    deferred.insert(id, data);
                }
            }
            Err(why) => refuse(problems, &e.path, &why)?,
        }
    }
    let mut tree = b.finish();
    if !deferred.is_empty() {
        pack_deferred(
            &mut tree, deferred, &shown, opts, prefetch, packer, problems, progress, cancel,
        )?;
    }
    Ok(tree)
}

/// Pack the deferred files of `tree` (readers by node) as a directory's
/// files are packed ([`Plan`]): in packing order, with a dictionary trained
/// on samples spread over it. Each file is read once: the samples are
/// packed from the bytes read to train on.
#[allow(clippy::too_many_arguments)]
fn pack_deferred<W: Write + Send + 'static>(
    tree: &mut Tree,
    mut deferred: HashMap<NodeId, Box<dyn Read + '_>>,
    shown: &dyn Fn(&[u8]) -> String,
    opts: &BuildOptions,
    prefetch: &HashMap<&[u8], usize>,
    packer: &mut Packer<W>,
    problems: &mut Problems,
    progress: &Progress,
    cancel: &std::sync::atomic::AtomicBool,
) -> Result<(), BuildError> {
    let mut plan = Plan::new(tree, prefetch, opts);
    // Files given as `File` were packed during the walk.
    plan.order.retain(|id| deferred.contains_key(id));
    // What reading a sample found: its bytes, or the error the packing pass
    // reports (the reader stopped part way, and cannot be read again).
    let mut failed: HashMap<NodeId, std::io::Error> = HashMap::new();
    let samples = plan.samples(tree, opts, |id, size| {
        let r = deferred.get_mut(&id)?;
        let mut b = Vec::with_capacity(size as usize);
        match r.read_to_end(&mut b) {
            Ok(_) => Some(b),
            Err(e) => {
                failed.insert(id, e);
                None
            }
        }
    });
    if opts.trains_dictionary() {
        packer.set_dictionary(Plan::train(&samples));
    }
    let mut held: HashMap<NodeId, Vec<u8>> = samples.into_iter().collect();
    let total = plan
        .order
        .iter()
        .map(|&id| crate::plan::size_of(tree, id))
        .sum();
    plan.announce(packer, progress, total);
    let mut unreadable = Vec::new();
    for &id in &plan.order {
        if cancel.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(BuildError::Interrupted);
        }
        let rel = plan.path(tree, id);
        let rel = rel.as_os_str().as_bytes();
        plan.start_file(packer, rel)?;
        let name = shown(rel);
        let got = if let Some(bytes) = held.remove(&id) {
            packer.add_file(&mut Dense(bytes.as_slice()), &name, id, cancel)
        } else if let Some(cause) = failed.remove(&id) {
            Err(BuildError::Input { path: name, cause })
        } else {
            let mut r = deferred
                .remove(&id)
                .expect("every planned file has a reader");
            packer.add_file(&mut Dense(&mut r), &name, id, cancel)
        };
        match got {
            Ok((size, range)) => tree.nodes[id as usize].kind = tree.file_kind(size, range),
            Err(BuildError::Input { path, cause }) if opts.skip_errors => {
                problems.handle(Path::new(&path), cause)?;
                unreadable.push(id);
            }
            Err(e) => return Err(e),
        }
    }
    crate::drop_nodes(tree, &unreadable);
    Ok(())
}
