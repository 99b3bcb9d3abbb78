//! The in-memory tree a build collects before writing metadata.
//!
//! Memory is per entry, never per data byte: a node holds its attributes, a
//! link to its parent and, for files, a range in the shared chunk list. Data
//! itself streams through [`crate::pack`] and is never kept.

use crate::pack::FileRange;
use sheaf_format::{FileType, XattrSet};
use std::collections::HashMap;

/// Index of a node in [`Tree::nodes`].
pub type NodeId = u32;

/// Attributes shared by every kind of node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Meta {
    /// Full mode, type bits included.
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Seconds.
    pub mtime_sec: i64,
    /// Nanoseconds.
    pub mtime_nsec: u32,
}

/// A name in [`Tree::names`]: offset (40 bits) and length (24 bits), so
/// that a directory entry takes 12 bytes and no allocation of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C, packed(4))]
pub struct Name(u64);

impl Name {
    const LEN_BITS: u32 = 24;
    const MAX_LEN: usize = (1 << Self::LEN_BITS) - 1;

    /// Length in bytes.
    pub fn len(self) -> usize {
        (self.0 & Self::MAX_LEN as u64) as usize
    }

    /// Whether the name is empty (never, for a directory entry).
    pub fn is_empty(self) -> bool {
        self.len() == 0
    }

    fn offset(self) -> usize {
        (self.0 >> Self::LEN_BITS) as usize
    }
}

/// One entry of a directory: a name for a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C, packed(4))]
pub struct Dirent {
    /// The entry's name.
    pub name: Name,
    /// The node it names.
    pub node: NodeId,
}

/// What a node is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// Directory with its entries (unsorted until [`Tree::finish`]); boxed
    /// so that a `Kind` takes 24 bytes, not 32, in every node.
    Dir(Box<Vec<Dirent>>),
    /// Regular file: size and its pieces in [`Tree::chunks`].
    File {
        /// Logical size.
        size: u64,
        /// First chunk.
        first: u64,
        /// Number of chunks.
        count: u32,
    },
    /// Symbolic link and its target.
    Symlink(Box<[u8]>),
    /// Character or block device (type is in the mode).
    Device(u64),
    /// FIFO or socket (type is in the mode).
    Special,
}

/// Mode, owner, group and xattr set of nodes, which a tree has few
/// distinct combinations of, stored once ([`Node::attrs`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Attrs {
    mode: u32,
    uid: u32,
    gid: u32,
    xattrs: u32,
}

/// One inode of the tree: its attributes are a [`Meta`] and an xattr set
/// ([`Tree::meta`], [`Tree::xattrs`]), all but the mtime interned, so that
/// a node takes 48 bytes.
#[derive(Debug, Clone)]
pub struct Node {
    /// Index into [`Tree::attrs`].
    attrs: u32,
    mtime_nsec: u32,
    mtime_sec: i64,
    /// Kind and payload.
    pub kind: Kind,
    /// Directory of this node's first name (the root: itself); used for
    /// `..` and to rebuild a source path for reading and for messages.
    pub parent: NodeId,
    /// Number of directory entries naming this node.
    pub links: u32,
}

/// A chunk during the build: `block` is a provisional block sequence number.
pub use sheaf_format::ChunkRecord as Chunk;

/// The tree under construction.
#[derive(Debug, Default)]
pub struct Tree {
    /// All nodes; node 0 is the root directory.
    pub nodes: Vec<Node>,
    /// Chunks of all files, each file a contiguous range.
    pub chunks: Vec<Chunk>,
    /// Distinct xattr sets.
    pub xattr_sets: Vec<XattrSet>,
    xattr_index: HashMap<XattrSet, u32>,
    /// The bytes of every entry's name, one after another.
    names: Vec<u8>,
    /// Distinct [`Attrs`] of nodes.
    attrs: Vec<Attrs>,
    attrs_index: HashMap<Attrs, u32>,
    last_attrs: u32,
}

impl Tree {
    /// A tree holding only a root directory with `meta`.
    pub fn new(root: Meta) -> Self {
        let mut t = Tree::default();
        let mut node = t.node(root, Kind::Dir(Box::default()), 0);
        node.links = 1;
        t.nodes.push(node);
        t
    }

    /// A node to [`Tree::add`] with attributes `meta` and the xattr set
    /// `xattrs` (from [`Tree::intern_xattrs`]), no parent or links yet.
    pub fn node(&mut self, meta: Meta, kind: Kind, xattrs: u32) -> Node {
        Node {
            attrs: self.intern_attrs(meta, xattrs),
            mtime_nsec: meta.mtime_nsec,
            mtime_sec: meta.mtime_sec,
            kind,
            parent: 0,
            links: 0,
        }
    }

    fn intern_attrs(&mut self, meta: Meta, xattrs: u32) -> u32 {
        let a = Attrs {
            mode: meta.mode,
            uid: meta.uid,
            gid: meta.gid,
            xattrs,
        };
        // Entries mostly come in runs of one kind: skip the lookup then.
        let last = self.last_attrs;
        if self.attrs.get(last as usize) == Some(&a) {
            return last;
        }
        let i = match self.attrs_index.get(&a) {
            Some(&i) => i,
            None => {
                let i = self.attrs.len() as u32;
                self.attrs.push(a);
                self.attrs_index.insert(a, i);
                i
            }
        };
        self.last_attrs = i;
        i
    }

    /// Attributes of a node.
    pub fn meta(&self, id: NodeId) -> Meta {
        let n = &self.nodes[id as usize];
        let a = self.attrs[n.attrs as usize];
        Meta {
            mode: a.mode,
            uid: a.uid,
            gid: a.gid,
            mtime_sec: n.mtime_sec,
            mtime_nsec: n.mtime_nsec,
        }
    }

    /// Full mode of a node, type bits included.
    pub fn mode(&self, id: NodeId) -> u32 {
        self.attrs[self.nodes[id as usize].attrs as usize].mode
    }

    /// Xattr set of a node: index into [`Tree::xattr_sets`] plus one, or zero.
    pub fn xattrs(&self, id: NodeId) -> u32 {
        self.attrs[self.nodes[id as usize].attrs as usize].xattrs
    }

    /// Replace the attributes and xattr set of a node (not its type).
    pub fn set_meta(&mut self, id: NodeId, meta: Meta, xattrs: u32) {
        let attrs = self.intern_attrs(meta, xattrs);
        let n = &mut self.nodes[id as usize];
        n.attrs = attrs;
        n.mtime_sec = meta.mtime_sec;
        n.mtime_nsec = meta.mtime_nsec;
    }

    /// Intern an xattr set and return the value for [`Node::xattrs`].
    pub fn intern_xattrs(&mut self, mut set: XattrSet) -> u32 {
        if set.0.is_empty() {
            return 0;
        }
        set.0.sort();
        set.0.dedup_by(|a, b| a.0 == b.0);
        if let Some(&i) = self.xattr_index.get(&set) {
            return i;
        }
        self.xattr_sets.push(set.clone());
        let i = self.xattr_sets.len() as u32;
        self.xattr_index.insert(set, i);
        i
    }

    /// Add a node under `parent` with `name`; returns its id.
    pub fn add(&mut self, parent: NodeId, name: &[u8], node: Node) -> NodeId {
        let id = self.nodes.len() as NodeId;
        self.nodes.push(Node { parent, ..node });
        self.link(parent, name, id);
        id
    }

    /// Add another name for an existing node (a hardlink).
    pub fn link(&mut self, parent: NodeId, name: &[u8], target: NodeId) {
        // Longer names are cut: the format holds at most 64 KiB, so encoding
        // refuses them anyway (meta::Layout::new).
        let bytes = &name[..name.len().min(Name::MAX_LEN)];
        let name = Name(((self.names.len() as u64) << Name::LEN_BITS) | bytes.len() as u64);
        self.names.extend_from_slice(bytes);
        self.nodes[target as usize].links += 1;
        match &mut self.nodes[parent as usize].kind {
            Kind::Dir(entries) => entries.push(Dirent { name, node: target }),
            _ => unreachable!("parent is always a directory"),
        }
    }

    /// The bytes of `name`.
    pub fn name(&self, name: Name) -> &[u8] {
        &self.names[name.offset()..name.offset() + name.len()]
    }

    /// Find `name` in directory `dir` (linear; used by tar input for parents only).
    pub fn child(&self, dir: NodeId, name: &[u8]) -> Option<NodeId> {
        match &self.nodes[dir as usize].kind {
            Kind::Dir(e) => e
                .iter()
                .rev()
                .find(|e| self.name(e.name) == name)
                .map(|e| e.node),
            _ => None,
        }
    }

    /// Sort every directory by name bytes. When a name occurs twice (a tar
    /// archive that repeats a path), the last one wins, as with `tar -x`.
    pub fn finish(&mut self) {
        let names = &self.names;
        let name = |n: Name| &names[n.offset()..n.offset() + n.len()];
        let mut dropped = Vec::new();
        for node in &mut self.nodes {
            let Kind::Dir(entries) = &mut node.kind else {
                continue;
            };
            // Stable sort keeps archive order among equal names; keep the last.
            entries.sort_by(|a, b| name(a.name).cmp(name(b.name)));
            let mut kept = 0;
            for i in 0..entries.len() {
                if kept > 0 && name(entries[kept - 1].name) == name(entries[i].name) {
                    dropped.push(entries[kept - 1].node);
                    entries[kept - 1] = entries[i];
                } else {
                    entries[kept] = entries[i];
                    kept += 1;
                }
            }
            entries.truncate(kept);
        }
        for d in dropped {
            self.nodes[d as usize].links -= 1;
        }
    }

    /// For every node, its index in its parent's (sorted) entry list; call
    /// after [`Tree::finish`]. Lets [`Tree::path`] rebuild names without
    /// storing them twice.
    pub fn entry_index(&self) -> Vec<u32> {
        let mut idx = vec![u32::MAX; self.nodes.len()];
        for (d, n) in self.nodes.iter().enumerate() {
            if let Kind::Dir(entries) = &n.kind {
                for (i, e) in entries.iter().enumerate() {
                    let c = e.node as usize;
                    if idx[c] == u32::MAX && self.nodes[c].parent as usize == d {
                        idx[c] = i as u32;
                    }
                }
            }
        }
        idx
    }

    /// Name of a node under its parent (the first name of a hardlinked
    /// one), from [`Tree::entry_index`].
    pub fn name_of(&self, index: &[u32], id: NodeId) -> &[u8] {
        let parent = self.nodes[id as usize].parent;
        let Kind::Dir(entries) = &self.nodes[parent as usize].kind else {
            unreachable!("parent is a directory")
        };
        self.name(entries[index[id as usize] as usize].name)
    }

    /// Relative path of a node, from [`Tree::entry_index`].
    pub fn path(&self, index: &[u32], mut id: NodeId) -> std::path::PathBuf {
        use std::os::unix::ffi::OsStrExt;
        let mut parts: Vec<&[u8]> = Vec::new();
        while id != 0 {
            parts.push(self.name_of(index, id));
            id = self.nodes[id as usize].parent;
        }
        let mut p = std::path::PathBuf::new();
        for part in parts.iter().rev() {
            p.push(std::ffi::OsStr::from_bytes(part));
        }
        p
    }

    /// The kind of a file of `size` bytes stored at `range`.
    pub fn file_kind(&self, size: u64, range: FileRange) -> Kind {
        let (first, count) = match range {
            FileRange::Chunks(first, count) => (first, count),
            FileRange::SameAs(f) => match self.nodes[f as usize].kind {
                Kind::File { first, count, .. } => (first, count),
                _ => unreachable!("the packer names only files it stored"),
            },
        };
        Kind::File { size, first, count }
    }

    /// File type of a node.
    pub fn file_type(&self, id: NodeId) -> FileType {
        FileType::from_mode(self.mode(id)).expect("validated on insert")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builder memory is mostly these, once per entry (bench/scale.sh).
    #[test]
    fn per_entry_sizes() {
        assert_eq!(std::mem::size_of::<Node>(), 48);
        assert_eq!(std::mem::size_of::<Dirent>(), 12);
    }

    #[test]
    fn names_sort_and_the_last_of_a_repeated_name_wins() {
        let meta = Meta {
            mode: libc::S_IFREG | 0o644,
            ..Meta::default()
        };
        let mut t = Tree::new(Meta {
            mode: libc::S_IFDIR | 0o755,
            ..Meta::default()
        });
        let kind = || Kind::File {
            size: 0,
            first: 0,
            count: 0,
        };
        let n = t.node(meta, kind(), 0);
        let b1 = t.add(0, b"b", n);
        let n = t.node(meta, kind(), 0);
        let a = t.add(0, b"a", n);
        let n = t.node(Meta { uid: 7, ..meta }, kind(), 0);
        let b2 = t.add(0, b"b", n);
        t.finish();
        let Kind::Dir(e) = &t.nodes[0].kind else {
            unreachable!()
        };
        let got: Vec<(&[u8], NodeId)> = e.iter().map(|e| (t.name(e.name), e.node)).collect();
        assert_eq!(got, [(&b"a"[..], a), (&b"b"[..], b2)]);
        assert_eq!(t.nodes[b1 as usize].links, 0);
        assert_eq!(t.meta(b2).uid, 7);
        assert_eq!(t.meta(a).uid, 0);
        assert_eq!(t.child(0, b"b"), Some(b2));
    }
}
