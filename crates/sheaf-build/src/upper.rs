//! The upper directory of a writable overlay, as `sheaf commit` packs it
//! into a layer ([`crate::Input::Upper`]) and a writable mount writes it.
//!
//! The names and the lock are [`sheaf_format::layers`]' (docs/layers.md):
//! new and changed entries are ordinary files, directories, symlinks and so
//! on; a deleted lower entry NAME is an empty regular file `.wh.NAME` beside
//! it; a directory whose lower contents are hidden holds an empty regular
//! file `.wh..wh..opq`; names starting with `.wh..sheaf-` are the overlay's
//! temporary files (an interrupted copy-up) and never go into a layer. This
//! module holds what only packing needs: the check that every whiteout is
//! one a layer can store.

use crate::options::BuildError;
use crate::tree::{Kind, NodeId, Tree};
use sheaf_format::layers::{self, Name};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Refuse a scanned upper directory whose whiteouts are not empty regular
/// files: a layer cannot tell such a file from a whiteout (nor can OCI), so
/// packing it would silently turn user data into a deletion.
pub(crate) fn check_whiteouts(tree: &Tree, root: &Path) -> Result<(), BuildError> {
    let mut index = None;
    for (d, n) in tree.nodes.iter().enumerate() {
        let Kind::Dir(entries) = &n.kind else {
            continue;
        };
        for e in entries.iter() {
            let name = tree.name(e.name);
            if !layers::is_hidden(name) {
                continue;
            }
            let node = &tree.nodes[e.node as usize];
            let mode = tree.mode(e.node);
            let problem = if layers::parse(name) == Name::Whiteout(b"") {
                Some("a whiteout must name the entry it hides")
            } else if mode & libc::S_IFMT != libc::S_IFREG {
                Some("a whiteout must be an empty regular file, not a directory, link or special file")
            } else if !matches!(node.kind, Kind::File { size: 0, .. }) {
                Some("a whiteout must be an empty regular file (a file of this name cannot be stored in a layer)")
            } else {
                None
            };
            if let Some(p) = problem {
                let index = index.get_or_insert_with(|| tree.entry_index());
                let dir = tree.path(index, d as NodeId);
                let shown = root
                    .join(dir)
                    .join(std::ffi::OsStr::from_bytes(name))
                    .display()
                    .to_string();
                return Err(BuildError::BadInput {
                    path: shown,
                    detail: p.to_string(),
                });
            }
        }
    }
    Ok(())
}
