//! The in-memory tree a build collects before writing metadata.
//!
//! Memory is per entry, never per data byte: a node holds its attributes, a
//! link to its parent and, for files, a range in the shared chunk list. Data
//! itself streams through [`crate::pack`] and is never kept.

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

/// What a node is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// Directory with its entries (unsorted until [`Tree::finish`]).
    Dir(Vec<(Box<[u8]>, NodeId)>),
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

/// One inode of the tree.
#[derive(Debug, Clone)]
pub struct Node {
    /// Attributes.
    pub meta: Meta,
    /// Kind and payload.
    pub kind: Kind,
    /// Index into [`Tree::xattr_sets`] plus one, or zero.
    pub xattrs: u32,
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
}

impl Tree {
    /// A tree holding only a root directory with `meta`.
    pub fn new(root: Meta) -> Self {
        let mut t = Tree::default();
        t.nodes.push(Node {
            meta: root,
            kind: Kind::Dir(Vec::new()),
            xattrs: 0,
            parent: 0,
            links: 1,
        });
        t
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
    pub fn add(&mut self, parent: NodeId, name: Box<[u8]>, node: Node) -> NodeId {
        let id = self.nodes.len() as NodeId;
        self.nodes.push(Node { parent, ..node });
        self.link(parent, name, id);
        id
    }

    /// Add another name for an existing node (a hardlink).
    pub fn link(&mut self, parent: NodeId, name: Box<[u8]>, target: NodeId) {
        self.nodes[target as usize].links += 1;
        match &mut self.nodes[parent as usize].kind {
            Kind::Dir(entries) => entries.push((name, target)),
            _ => unreachable!("parent is always a directory"),
        }
    }

    /// Find `name` in directory `dir` (linear; used by tar input for parents only).
    pub fn child(&self, dir: NodeId, name: &[u8]) -> Option<NodeId> {
        match &self.nodes[dir as usize].kind {
            Kind::Dir(e) => e.iter().rev().find(|(n, _)| &**n == name).map(|e| e.1),
            _ => None,
        }
    }

    /// Sort every directory by name bytes. When a name occurs twice (a tar
    /// archive that repeats a path), the last one wins, as with `tar -x`.
    pub fn finish(&mut self) {
        for i in 0..self.nodes.len() {
            let Kind::Dir(entries) = &mut self.nodes[i].kind else {
                continue;
            };
            // Stable sort keeps archive order among equal names; keep the last.
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            let mut dropped = Vec::new();
            let mut out: Vec<(Box<[u8]>, NodeId)> = Vec::with_capacity(entries.len());
            for e in entries.drain(..) {
                if let Some(last) = out.last_mut() {
                    if last.0 == e.0 {
                        dropped.push(last.1);
                        *last = e;
                        continue;
                    }
                }
                out.push(e);
            }
            *entries = out;
            for d in dropped {
                self.nodes[d as usize].links -= 1;
            }
        }
    }

    /// For every node, its index in its parent's (sorted) entry list; call
    /// after [`Tree::finish`]. Lets [`Tree::path`] rebuild names without
    /// storing them twice.
    pub fn entry_index(&self) -> Vec<u32> {
        let mut idx = vec![u32::MAX; self.nodes.len()];
        for (d, n) in self.nodes.iter().enumerate() {
            if let Kind::Dir(entries) = &n.kind {
                for (i, (_, c)) in entries.iter().enumerate() {
                    let c = *c as usize;
                    if idx[c] == u32::MAX && self.nodes[c].parent as usize == d {
                        idx[c] = i as u32;
                    }
                }
            }
        }
        idx
    }

    /// Relative path of a node, from [`Tree::entry_index`].
    pub fn path(&self, index: &[u32], mut id: NodeId) -> std::path::PathBuf {
        use std::os::unix::ffi::OsStrExt;
        let mut parts: Vec<&[u8]> = Vec::new();
        while id != 0 {
            let parent = self.nodes[id as usize].parent;
            let Kind::Dir(entries) = &self.nodes[parent as usize].kind else {
                unreachable!("parent is a directory")
            };
            parts.push(&entries[index[id as usize] as usize].0);
            id = parent;
        }
        let mut p = std::path::PathBuf::new();
        for part in parts.iter().rev() {
            p.push(std::ffi::OsStr::from_bytes(part));
        }
        p
    }

    /// File type of a node.
    pub fn file_type(&self, id: NodeId) -> FileType {
        FileType::from_mode(self.nodes[id as usize].meta.mode).expect("validated on insert")
    }
}
