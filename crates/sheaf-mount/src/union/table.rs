//! The node table: what each FUSE inode number the kernel holds stands for,
//! its stable number, its lookup count, and forgetting it.

use super::sys::{open_path_at, stat_at, stat_fd};
use super::view::{stat_attr, Child};
use super::UnionFs;
use fuser::{Errno, FileAttr, INodeNo};
use sheaf_format::records::FileType as Ft;
use sheaf_read::Found;
use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

/// The root's node number (FUSE's).
pub(super) const ROOT: u64 = 1;

/// What a node stands for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) enum Key {
    /// An object of the upper directory (device, inode).
    Upper(u64, u64),
    /// An entry of a layer (layer, image inode); a directory is keyed by its
    /// top part.
    Lower(usize, u32),
    /// A hardlinked lower file in a writable mount, per path (copy-up of one
    /// name must not change the others).
    Path(u64, Vec<u8>),
}

/// A FUSE inode.
#[derive(Debug, Clone)]
pub(super) struct Node {
    /// The directory it was last seen in, and its name there.
    pub(super) parent: u64,
    pub(super) name: Vec<u8>,
    /// What the layers show: for a directory, the lower directory merged
    /// under it (none if opaque or absent); otherwise the lower object, as
    /// long as it has not been copied up.
    pub(super) lower: Option<Arc<Found>>,
    /// Whether it exists in the upper directory.
    pub(super) in_upper: bool,
    /// An `O_PATH` descriptor of its upper object. In the table only for
    /// the root and hardlinked files (whose path may go while the object
    /// stays); [`UnionFs::node`] opens the others by path for each request,
    /// so a tree of millions of upper files never holds millions of
    /// descriptors.
    pub(super) upper: Option<Arc<OwnedFd>>,
    pub(super) is_dir: bool,
    pub(super) nlookup: u64,
    pub(super) keys: Vec<Key>,
    /// A read-only mount's listing, built once.
    pub(super) listing: Option<Arc<Vec<super::view::Entry>>>,
}

/// The inode table.
pub(super) struct Table {
    pub(super) nodes: HashMap<u64, Node>,
    pub(super) by_key: HashMap<Key, u64>,
    next: u64,
}

/// The preferred node number of `key` (stable across forget and lookup).
pub(super) fn preferred_ino(key: &Key) -> Option<u64> {
    const MASK: u64 = (1 << 40) - 1;
    match key {
        Key::Lower(l, ino) => Some(((*l as u64 + 1) << 40) | *ino as u64),
        Key::Upper(_, ino) if *ino <= MASK => Some((1 << 62) | ino),
        _ => None,
    }
}

impl Table {
    /// A table holding only `root`.
    pub(super) fn new(root: Node) -> Table {
        Table {
            nodes: HashMap::from([(ROOT, root)]),
            by_key: HashMap::new(),
            next: 1,
        }
    }

    /// A free number for a new node of `key`: its preferred one, or (taken,
    /// or none) one from a counter, in a range no preferred number uses.
    pub(super) fn new_id(&mut self, key: &Key) -> u64 {
        match preferred_ino(key).filter(|i| !self.nodes.contains_key(i)) {
            Some(i) => i,
            None => {
                self.next += 1;
                (1 << 63) | self.next
            }
        }
    }

    /// The path of node `id` relative to the upper directory (`.` for the
    /// root), from the names the table holds.
    pub(super) fn path_in(&self, id: u64) -> Option<Vec<u8>> {
        let mut names = Vec::new();
        let mut cur = id;
        while cur != ROOT {
            let n = self.nodes.get(&cur)?;
            names.push(n.name.as_slice());
            cur = n.parent;
            if names.len() > 4096 {
                return None;
            }
        }
        if names.is_empty() {
            return Some(b".".to_vec());
        }
        names.reverse();
        Some(names.join(&b'/'))
    }

    /// Drop `n` lookups of node `id`; at none, the node and the keys that
    /// still map to it go. The root is never forgotten.
    pub(super) fn forget(&mut self, id: u64, n: u64) {
        if id == ROOT {
            return;
        }
        let gone = match self.nodes.get_mut(&id) {
            Some(node) => {
                node.nlookup = node.nlookup.saturating_sub(n);
                node.nlookup == 0
            }
            None => false,
        };
        if gone {
            if let Some(node) = self.nodes.remove(&id) {
                for k in node.keys {
                    if self.by_key.get(&k) == Some(&id) {
                        self.by_key.remove(&k);
                    }
                }
            }
        }
    }
}

impl UnionFs {
    /// A copy of node `ino`, with its upper object opened.
    pub(super) fn node(&self, ino: INodeNo) -> Result<Node, Errno> {
        let (mut n, path) = {
            let t = self.table.lock().expect("table");
            let n = t.nodes.get(&ino.0).cloned().ok_or(Errno::ENOENT)?;
            let path = if n.in_upper && n.upper.is_none() {
                Some(t.path_in(ino.0).ok_or(Errno::EIO)?)
            } else {
                None
            };
            (n, path)
        };
        if let (Some(p), Some(u)) = (path, &self.upper) {
            n.upper = Some(Arc::new(open_path_at(u.root.as_fd(), &p)?));
        }
        Ok(n)
    }

    /// What identifies `child`, named `name` in `parent`.
    pub(super) fn key_of(&self, parent: u64, name: &[u8], child: &Child) -> Result<Key, Errno> {
        Ok(match (&child.upper, child.lower.as_deref()) {
            (Some((_, st)), _) => Key::Upper(st.st_dev, st.st_ino),
            (None, Some(f)) => {
                let (l, i) = f.shown();
                if self.writable() && i.file_type() != Ft::Directory && i.rec.nlink > 1 {
                    Key::Path(parent, name.to_vec())
                } else {
                    Key::Lower(l, i.ino)
                }
            }
            (None, None) => return Err(Errno::ENOENT),
        })
    }

    /// Make `child` (named `name` in `parent`) a node, counting one lookup.
    pub(super) fn remember(
        &self,
        parent: u64,
        name: &[u8],
        child: Child,
    ) -> Result<FileAttr, Errno> {
        let key = self.key_of(parent, name, &child)?;
        let is_dir = child.is_dir();
        let attr = match (&child.upper, child.lower.as_deref()) {
            (Some((_, st)), _) => Some(*st),
            _ => None,
        };
        // Hardlinked upper files keep their descriptor (see Node::upper).
        let pin = |c: &mut Child| match c.upper.take() {
            Some((fd, st)) if st.st_nlink > 1 && st.st_mode & libc::S_IFMT != libc::S_IFDIR => {
                Some(Arc::new(fd))
            }
            _ => None,
        };
        let mut child = child;
        let in_upper = child.upper.is_some();
        let pinned = pin(&mut child);
        let mut t = self.table.lock().expect("table");
        let existing = t.by_key.get(&key).copied().filter(|id| {
            // An upper inode number may be reused after a delete while the
            // kernel still holds the old node.
            !matches!(key, Key::Upper(..)) || self.upper_alive(&t, *id)
        });
        let id = match existing {
            Some(id) => {
                let n = t.nodes.get_mut(&id).expect("mapped node");
                n.nlookup += 1;
                n.in_upper |= in_upper;
                if n.upper.is_none() {
                    n.upper = pinned;
                }
                if n.is_dir {
                    n.lower = child.lower.clone();
                }
                if !n.keys.contains(&key) {
                    n.keys.push(key);
                }
                id
            }
            None => {
                let id = t.new_id(&key);
                t.by_key.insert(key.clone(), id);
                t.nodes.insert(
                    id,
                    Node {
                        parent,
                        name: name.to_vec(),
                        lower: child.lower.clone(),
                        in_upper,
                        upper: pinned,
                        is_dir,
                        nlookup: 1,
                        keys: vec![key],
                        listing: None,
                    },
                );
                id
            }
        };
        let n = t.nodes.get(&id).expect("node").clone();
        drop(t);
        match attr {
            Some(st) => Ok(stat_attr(id, &st)),
            None => self.attr(id, &n),
        }
    }

    /// Whether node `id`'s upper object still exists under the name the
    /// table gives it (or, for a pinned one, anywhere).
    pub(super) fn upper_alive(&self, t: &Table, id: u64) -> bool {
        let Some(n) = t.nodes.get(&id) else {
            return false;
        };
        if let Some(fd) = &n.upper {
            return stat_fd(fd.as_fd())
                .is_ok_and(|s| s.st_nlink > 0 || s.st_mode & libc::S_IFMT == libc::S_IFDIR);
        }
        let (Some(u), Some(path)) = (&self.upper, t.path_in(id)) else {
            return false;
        };
        let Ok(st) = stat_at(u.root.as_fd(), &path) else {
            return false;
        };
        n.keys.contains(&Key::Upper(st.st_dev, st.st_ino))
    }

    /// Stop mapping `key` to a node whose upper object is gone (its inode
    /// number may be reused by a new file).
    pub(super) fn unmap_if_gone(&self, key: &Key) {
        let mut t = self.table.lock().expect("table");
        let Some(&id) = t.by_key.get(key) else {
            return;
        };
        if !self.upper_alive(&t, id) {
            t.by_key.remove(key);
        }
    }

    pub(super) fn forget_one(&self, id: u64) {
        self.forget_n(id, 1);
    }

    pub(super) fn forget_n(&self, id: u64, n: u64) {
        self.table.lock().expect("table").forget(id, n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(parent: u64, name: &str, keys: Vec<Key>) -> Node {
        Node {
            parent,
            name: name.as_bytes().to_vec(),
            lower: None,
            in_upper: false,
            upper: None,
            is_dir: false,
            nlookup: 1,
            keys,
            listing: None,
        }
    }

    #[test]
    fn numbers_come_from_what_a_node_is() {
        assert_eq!(preferred_ino(&Key::Lower(0, 7)), Some((1 << 40) | 7));
        assert_eq!(preferred_ino(&Key::Lower(2, 7)), Some((3 << 40) | 7));
        assert_eq!(preferred_ino(&Key::Upper(9, 5)), Some((1 << 62) | 5));
        // Too large to embed, or per path: a counter decides.
        assert_eq!(preferred_ino(&Key::Upper(9, 1 << 41)), None);
        assert_eq!(preferred_ino(&Key::Path(1, b"x".to_vec())), None);

        let mut t = Table::new(node(ROOT, "", Vec::new()));
        let k = Key::Lower(0, 7);
        let a = t.new_id(&k);
        assert_eq!(a, (1 << 40) | 7);
        t.nodes.insert(a, node(ROOT, "a", vec![k.clone()]));
        // Taken: the counter's range, never a preferred number.
        let b = t.new_id(&k);
        assert_ne!(b, a);
        assert!(b & (1 << 63) != 0, "{b:x}");
        assert_ne!(t.new_id(&Key::Path(1, b"p".to_vec())), b);
    }

    #[test]
    fn paths_follow_parents_and_forget_drops_only_its_own_keys() {
        let mut t = Table::new(node(ROOT, "", Vec::new()));
        let (d, f) = (10, 11);
        t.nodes
            .insert(d, node(ROOT, "dir", vec![Key::Upper(1, 10)]));
        t.nodes.insert(f, node(d, "file", vec![Key::Upper(1, 11)]));
        t.by_key.insert(Key::Upper(1, 10), d);
        t.by_key.insert(Key::Upper(1, 11), f);
        assert_eq!(t.path_in(ROOT), Some(b".".to_vec()));
        assert_eq!(t.path_in(f), Some(b"dir/file".to_vec()));
        assert_eq!(t.path_in(99), None);

        // A key since taken over by another node stays with that node.
        t.nodes.get_mut(&f).unwrap().keys.push(Key::Upper(1, 10));
        t.nodes.get_mut(&f).unwrap().nlookup = 2;
        t.forget(f, 1);
        assert!(t.nodes.contains_key(&f));
        t.forget(f, 5);
        assert!(!t.nodes.contains_key(&f));
        assert_eq!(t.by_key.get(&Key::Upper(1, 11)), None);
        assert_eq!(t.by_key.get(&Key::Upper(1, 10)), Some(&d));
        // The root stays whatever the kernel says.
        t.forget(ROOT, 100);
        assert!(t.nodes.contains_key(&ROOT));
    }
}
