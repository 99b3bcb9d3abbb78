//! The packing plan of a tree whose files can be read in any order: a
//! directory (`sheaf build DIR`, `sheaf commit`) and the merged view of
//! stacked images (`sheaf merge`, whose walk gives
//! [`crate::entries::EntryKind::Deferred`] files). The one place where such
//! an input's files get their order ([`crate::order::packing_order`]: the
//! versions of a file side by side, sources beside their `__pycache__`),
//! the samples the pack dictionary is trained on ([`crate::dict`]), their
//! pack boundaries and their similarity groups, so that every such input
//! packs alike: what differs is only where the bytes are read from.
//!
//! Streams (a tar archive, a caller's entries read as they come) cannot be
//! reordered and are packed in the order they come.

use crate::order::{boundary_of, packing_order};
use crate::pack::Packer;
use crate::tree::{Kind, NodeId, Tree};
use crate::{dict, BuildError, BuildOptions, Progress};
use sheaf_format::Dictionary;
use std::cell::Cell;
use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The files of a tree in packing order, and the state of the pass that
/// packs them.
pub(crate) struct Plan<'o> {
    /// File nodes in packing order.
    pub order: Vec<NodeId>,
    /// The entry index [`Tree::path`] needs.
    pub index: Vec<u32>,
    boundaries: &'o [Vec<u8>],
    /// The pack boundary of the file packed last.
    boundary: Cell<Option<usize>>,
}

/// A file node's size (0 for other nodes).
pub(crate) fn size_of(tree: &Tree, id: NodeId) -> u64 {
    match tree.nodes[id as usize].kind {
        Kind::File { size, .. } => size,
        _ => 0,
    }
}

impl<'o> Plan<'o> {
    /// The packing order of `tree`'s files under `opts` (and the workload's
    /// `prefetch` list, files first in its order).
    pub fn new(tree: &Tree, prefetch: &HashMap<&[u8], usize>, opts: &'o BuildOptions) -> Self {
        let (order, index) = packing_order(tree, prefetch, &opts.pack_boundaries, opts.order);
        Plan {
            order,
            index,
            boundaries: &opts.pack_boundaries,
            boundary: Cell::new(None),
        }
    }

    /// A node's path from the root.
    pub fn path(&self, tree: &Tree, id: NodeId) -> PathBuf {
        tree.path(&self.index, id)
    }

    /// Tell `progress` what the pass will read: the files of the order,
    /// `bytes` of them.
    pub fn announce<W: Write + Send + 'static>(
        &self,
        packer: &mut Packer<W>,
        progress: &Progress,
        bytes: u64,
    ) {
        progress
            .total_files
            .store(self.order.len() as u64, Ordering::Relaxed);
        progress.total_bytes.store(bytes, Ordering::Relaxed);
        packer.reserve(self.order.len());
    }

    /// The samples to train the pack dictionary on: small files spread over
    /// the order ([`dict::pick_samples`]), each read with `read(id, size)`;
    /// one it cannot read (`None`) is left out. Empty unless `opts` trains
    /// a dictionary.
    pub fn samples(
        &self,
        tree: &Tree,
        opts: &BuildOptions,
        mut read: impl FnMut(NodeId, u64) -> Option<Vec<u8>>,
    ) -> Vec<(NodeId, Vec<u8>)> {
        if !opts.trains_dictionary() {
            return Vec::new();
        }
        let sizes: Vec<u64> = self.order.iter().map(|&id| size_of(tree, id)).collect();
        dict::pick_samples(&sizes, opts.pack_block_size() as u64)
            .into_iter()
            .filter_map(|i| {
                let id = self.order[i];
                read(id, sizes[i]).map(|b| (id, b))
            })
            .collect()
    }

    /// The dictionary trained on `samples` (see [`Plan::samples`]).
    pub fn train(samples: &[(NodeId, Vec<u8>)]) -> Option<Arc<Dictionary>> {
        let refs: Vec<&[u8]> = samples.iter().map(|(_, b)| b.as_slice()).collect();
        dict::train(&refs)
    }

    /// Before packing the file at `rel` (relative path): a new pack where
    /// it crosses a pack boundary ([`BuildOptions::pack_boundaries`]), and
    /// its similarity group.
    pub fn start_file<W: Write + Send + 'static>(
        &self,
        packer: &mut Packer<W>,
        rel: &[u8],
    ) -> Result<(), BuildError> {
        if !self.boundaries.is_empty() {
            let g = boundary_of(rel, self.boundaries);
            if g != self.boundary.get() {
                packer.cut_pack()?;
                self.boundary.set(g);
            }
        }
        packer.set_group_of(rel);
        Ok(())
    }
}
