//! The snapshotter's persistent state: every snapshot containerd knows of,
//! kept in `ROOT/state.json` (written by atomic rename after each change),
//! so a restart of the snapshotter forgets nothing.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A snapshot's kind, as containerd's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Kind {
    /// Read-only view of a parent.
    View,
    /// Writable, on a parent.
    Active,
    /// Read-only, a parent for others.
    Committed,
}

/// Where a committed snapshot's files are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Layer {
    /// A sheaf layer in a repository (URL or path), mounted lazily.
    Lazy(String),
    /// A layer containerd applied, packed here into a sheaf image.
    Packed(PathBuf),
}

/// One snapshot.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Snap {
    /// Number naming its directory `ROOT/snapshots/ID`.
    pub id: u64,
    /// Kind.
    pub kind: Kind,
    /// Parent's key (`""`: none).
    pub parent: String,
    /// Labels containerd gave it.
    pub labels: BTreeMap<String, String>,
    /// Seconds since the epoch.
    pub created: u64,
    /// Seconds since the epoch.
    pub updated: u64,
    /// For a committed snapshot: its layer.
    pub layer: Option<Layer>,
    /// An active snapshot served as kernel overlayfs (upper directory here)
    /// over a read-only sheaf union of its layers, rather than by a
    /// writable sheaf union: a container's root (see `crate` docs).
    #[serde(default)]
    pub overlay: bool,
}

/// Everything, as stored.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct State {
    /// The next snapshot id.
    pub next_id: u64,
    /// Snapshots by key.
    pub snaps: BTreeMap<String, Snap>,
    /// Layers mounted lazily (counted when committed).
    pub lazy_layers: u64,
    /// Layers containerd fetched and applied (counted when committed).
    pub applied_layers: u64,
    /// Repository layers the signature policy refused (containerd then
    /// fetched them instead).
    #[serde(default)]
    pub refused_layers: u64,
    /// Lazy layers whose files an image's recorded prefetch list named,
    /// fetched into the node cache in the background at pull.
    #[serde(default)]
    pub prefetched_layers: u64,
}

impl State {
    /// Load `ROOT/state.json` (empty if none).
    pub fn load(root: &Path) -> std::io::Result<State> {
        match std::fs::read(root.join("state.json")) {
            Ok(b) => serde_json::from_slice(&b).map_err(|e| {
                std::io::Error::other(format!("{}: {e}", root.join("state.json").display()))
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(State::default()),
            Err(e) => Err(e),
        }
    }
    /// Write it (atomically).
    pub fn save(&self, root: &Path) -> std::io::Result<()> {
        let bytes = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        sheaf_net::publish::write_file_atomic(root, &root.join("state.json"), &bytes)
    }
    /// The chain of committed layers under `key`'s parent, bottom first.
    pub fn layers_under(&self, parent: &str) -> Vec<Layer> {
        let mut out = Vec::new();
        let mut k = parent.to_string();
        let mut guard = 0;
        while !k.is_empty() && guard < 10_000 {
            guard += 1;
            let Some(s) = self.snaps.get(&k) else { break };
            if let Some(l) = &s.layer {
                out.push(l.clone());
            }
            k = s.parent.clone();
        }
        out.reverse();
        out
    }
}
