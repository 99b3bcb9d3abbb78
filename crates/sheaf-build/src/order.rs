//! The packing order of a directory's files, and which files are versions
//! of one another.
//!
//! Software pools and dataset snapshots hold many versions of one tree side
//! by side (`install/numpy/1.24.4/…`, `install/numpy/1.26.4/…`). Compression
//! only sees what sits close together in the input, so the order puts the
//! versions of one file next to each other: a *version name* (one with a
//! run of digits and dots holding `digit.digit`, as in `1.24.4`,
//! `numpy-1.26.4.dist-info` or `python3.11`) is compared with that run
//! replaced by `#`, and two directories whose paths are equal so compared
//! are one *class*. Files are ordered by class, then by their normalised
//! name, and only then by their real directory, so
//! `numpy/1.24.4/numpy/core/_methods.py` is followed by the same file of
//! 1.26.4, 2.0.2 and so on. A tree without version names keeps the order it
//! had (by directory, then stem, then name): its classes are its
//! directories, in the same order.
//!
//! Memory is per directory (a class id each, and one map entry per
//! distinct class), never per path.

use crate::tree::{Kind, NodeId, Tree};
use std::borrow::Cow;
use std::cmp::Ordering;
use std::collections::HashMap;
use std::os::unix::ffi::OsStrExt;

/// How a directory's files are ordered for packing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PackOrder {
    /// Versions of one file together (the module's rule), else by directory.
    #[default]
    Versions,
    /// By directory, then stem, then name: the order before version
    /// classes, kept to measure them against.
    Directory,
}

impl PackOrder {
    /// Parse `versions` or `directory`.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "versions" => Ok(PackOrder::Versions),
            "directory" => Ok(PackOrder::Directory),
            _ => Err(format!(
                "unknown packing order '{s}' (choose versions or directory)"
            )),
        }
    }

    /// Text form, as accepted by [`PackOrder::parse`].
    pub fn name(self) -> &'static str {
        match self {
            PackOrder::Versions => "versions",
            PackOrder::Directory => "directory",
        }
    }
}

/// `name` with every version run (a maximal run of ASCII digits and dots
/// that holds a digit, a dot and a digit in a row) replaced by `#`;
/// borrowed when it has none, which is the common case.
pub fn normalize(name: &[u8]) -> Cow<'_, [u8]> {
    let is_run = |b: u8| b.is_ascii_digit() || b == b'.';
    let has_version = name
        .windows(3)
        .any(|w| w[0].is_ascii_digit() && w[1] == b'.' && w[2].is_ascii_digit());
    if !has_version {
        return Cow::Borrowed(name);
    }
    let mut out = Vec::with_capacity(name.len());
    let mut i = 0;
    while i < name.len() {
        if !is_run(name[i]) {
            out.push(name[i]);
            i += 1;
            continue;
        }
        let end = name[i..]
            .iter()
            .position(|&b| !is_run(b))
            .map_or(name.len(), |k| i + k);
        let run = &name[i..end];
        if run
            .windows(3)
            .any(|w| w[0].is_ascii_digit() && w[1] == b'.' && w[2].is_ascii_digit())
        {
            out.push(b'#');
        } else {
            out.extend_from_slice(run);
        }
        i = end;
    }
    Cow::Owned(out)
}

/// The part of a name before its first dot.
fn stem(n: &[u8]) -> &[u8] {
    &n[..n.iter().position(|&b| b == b'.').unwrap_or(n.len())]
}

/// FNV-1a, for map keys of normalised names (no string is kept).
fn fnv(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325, |h, &x| {
        (h ^ x as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The class of every directory node (`u32::MAX` for other nodes): equal
/// for directories whose paths are equal once normalised, numbered in the
/// order their first directory appears in node order (parents come before
/// their children there). With [`PackOrder::Directory`] every directory
/// is its own class.
pub fn classes(tree: &Tree, index: &[u32], order: PackOrder) -> Vec<u32> {
    let mut class = vec![u32::MAX; tree.nodes.len()];
    let mut seen: HashMap<(u32, u64), u32> = HashMap::new();
    let mut next = 0u32;
    for (i, n) in tree.nodes.iter().enumerate() {
        if !matches!(n.kind, Kind::Dir(_)) {
            continue;
        }
        let c = if i == 0 || order == PackOrder::Directory {
            None
        } else {
            let key = (
                class[n.parent as usize],
                fnv(&normalize(tree.name_of(index, i as NodeId))),
            );
            Some(*seen.entry(key).or_insert(next))
        };
        class[i] = c.unwrap_or(next);
        if class[i] == next {
            next += 1;
        }
    }
    class
}

/// A file's similarity group, from its path relative to the top: every
/// component normalised, so the versions of one file (paths equal but for
/// version runs) have one group. Files of one group are adjacent in the
/// versions order, and the packer may store them in one block. Computed
/// from the path alone, so a stream (tar, entry list) and a directory
/// scan that give the same files in the same order group them alike.
pub fn group_key(rel: &[u8]) -> u64 {
    rel.split(|&b| b == b'/')
        .filter(|c| !c.is_empty())
        .fold(0xcbf2_9ce4_8422_2325, |h: u64, c| {
            (h ^ fnv(&normalize(c))).wrapping_mul(0x0100_0000_01b3)
        })
}

/// Order files so related content sits together: by class (see the
/// module), then normalised stem and name, then directory, then name.
/// Returns the file nodes in packing order and the entry index that
/// [`Tree::path`] needs (paths are rebuilt one at a time so that memory
/// stays per-entry, not per-path).
///
/// Files named in `prefetch` come first, in its order, so a workload's
/// blocks are contiguous and fetched with few large requests; files under
/// one of `boundaries` come together, a boundary at a time.
pub fn packing_order(
    tree: &Tree,
    prefetch: &HashMap<&[u8], usize>,
    boundaries: &[Vec<u8>],
    order: PackOrder,
) -> (Vec<NodeId>, Vec<u32>) {
    let index = tree.entry_index();
    let name_of = |id: NodeId| tree.name_of(&index, id);
    let class = classes(tree, &index, order);
    // Python keeps compiled files in `__pycache__` beside their sources;
    // counting them as part of the parent puts `x.pyc` next to `x.py`, whose
    // strings it repeats.
    let group = |parent: NodeId| -> NodeId {
        if parent != 0 && name_of(parent) == b"__pycache__" {
            tree.nodes[parent as usize].parent
        } else {
            parent
        }
    };
    let mut files: Vec<(NodeId, NodeId)> = tree
        .nodes
        .iter()
        .enumerate()
        // A node no name leads to (a duplicate name replaced by a later
        // entry of a stream) is not packed.
        .filter(|(_, n)| n.links > 0 && matches!(n.kind, Kind::File { .. }))
        .map(|(i, n)| (i as NodeId, group(n.parent)))
        .collect();
    let ranks = prefetch_ranks(tree, &index, prefetch);
    let rank = |id: NodeId| ranks.get(&id).copied().unwrap_or(usize::MAX);
    // Files under one pack boundary are packed together (see
    // BuildOptions::pack_boundaries), so each one's blocks depend on it alone.
    let mut bound: HashMap<NodeId, usize> = HashMap::new();
    if !boundaries.is_empty() {
        for &(id, _) in &files {
            let p = tree.path(&index, id);
            if let Some(g) = boundary_of(p.as_os_str().as_bytes(), boundaries) {
                bound.insert(id, g);
            }
        }
    }
    let bound_of = |id: NodeId| bound.get(&id).copied().unwrap_or(usize::MAX);
    let norm_cmp = |a: &[u8], b: &[u8]| -> Ordering {
        match order {
            PackOrder::Versions => normalize(a).cmp(&normalize(b)),
            PackOrder::Directory => Ordering::Equal,
        }
    };
    files.sort_by(|a, b| {
        let (na, nb) = (name_of(a.0), name_of(b.0));
        rank(a.0)
            .cmp(&rank(b.0))
            .then_with(|| bound_of(a.0).cmp(&bound_of(b.0)))
            .then_with(|| class[a.1 as usize].cmp(&class[b.1 as usize]))
            .then_with(|| norm_cmp(stem(na), stem(nb)))
            .then_with(|| norm_cmp(na, nb))
            .then_with(|| a.1.cmp(&b.1))
            .then_with(|| stem(na).cmp(stem(nb)))
            .then_with(|| na.cmp(nb))
            .then_with(|| a.0.cmp(&b.0))
    });
    (files.into_iter().map(|(id, _)| id).collect(), index)
}

/// Which of `boundaries` (directories) the relative path `p` lies under.
pub fn boundary_of(p: &[u8], boundaries: &[Vec<u8>]) -> Option<usize> {
    boundaries
        .iter()
        .position(|d| p.len() > d.len() && p.starts_with(d) && p[d.len()] == b'/')
}

/// Position in the prefetch list of each listed file node.
pub fn prefetch_ranks(
    tree: &Tree,
    index: &[u32],
    prefetch: &HashMap<&[u8], usize>,
) -> HashMap<NodeId, usize> {
    if prefetch.is_empty() {
        return HashMap::new();
    }
    tree.nodes
        .iter()
        .enumerate()
        .filter(|(_, n)| n.links > 0 && matches!(n.kind, Kind::File { .. }))
        .filter_map(|(i, _)| {
            let p = tree.path(index, i as NodeId);
            prefetch
                .get(p.as_os_str().as_bytes())
                .map(|&r| (i as NodeId, r))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_runs_become_one_mark() {
        let n = |s: &str| String::from_utf8(normalize(s.as_bytes()).into_owned()).unwrap();
        assert_eq!(n("1.24.4"), "#");
        assert_eq!(n("2.0.2"), "#");
        assert_eq!(n("numpy-1.26.4.dist-info"), "numpy-#dist-info");
        assert_eq!(n("python3.11"), "python#");
        assert_eq!(n("libfoo.so.1.2.3"), "libfoo.so#");
        // No digit-dot-digit: unchanged, and borrowed.
        for s in [
            "d000",
            "x86_64",
            "ath10k",
            "lib.so.1",
            "_methods.py",
            "a.1b.2",
        ] {
            assert!(matches!(normalize(s.as_bytes()), Cow::Borrowed(_)), "{s}");
        }
    }
}
