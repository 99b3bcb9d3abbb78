//! A stack of images seen as one tree: layers, later ones win.
//!
//! OCI whiteouts are honoured and never shown ([`sheaf_format::layers`] has
//! the naming rules): `.wh.NAME` in a layer hides NAME in the layers below
//! it, and a directory holding `.wh..wh..opq` hides everything below it at
//! that path (it is *opaque*). A file over a directory hides the directory;
//! a directory over a file hides the file. Directories present in several
//! layers merge.
//!
//! A lookup visits the layers that hold the parent directory, top first, and
//! stops at the first that answers, so its cost is the number of layers
//! that have that directory, not the number of layers in the stack.

use crate::error::ReadError;
use crate::image::{Image, Inode};
use sheaf_format::layers::{self, Name, OPAQUE_MARKER};
use sheaf_format::FileType;
use std::collections::HashSet;
use std::sync::Arc;

/// A directory of the merged view: the same directory in each layer that
/// contributes to it, top first.
#[derive(Debug, Clone)]
pub struct MergedDir {
    /// (layer index, directory inode), top layer first.
    pub parts: Vec<(usize, Inode)>,
}

/// What a name resolves to in the merged view.
#[derive(Debug, Clone)]
pub enum Found {
    /// A directory, merged across layers.
    Dir(MergedDir),
    /// Anything else, from one layer.
    Node(usize, Inode),
}

impl Found {
    /// The layer and inode shown for this entry (a directory shows its top
    /// layer's attributes).
    pub fn shown(&self) -> (usize, Inode) {
        match self {
            Found::Dir(d) => d.parts[0],
            Found::Node(l, i) => (*l, *i),
        }
    }
}

/// One entry of a merged directory listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StackEntry {
    /// Name.
    pub name: Vec<u8>,
    /// The layer it is shown from.
    pub layer: usize,
    /// Its inode number in that layer's image.
    pub ino: u32,
    /// Type.
    pub file_type: FileType,
}

/// The names of a merged directory, read once from every part: for each
/// name, the parts (top first) that hold it, down to the first that hides
/// the rest. Makes a lookup in a directory many layers share cost the same
/// as in one layer ([`Stack::lookup_in`]).
#[derive(Debug, Clone, Default)]
pub struct DirIndex {
    names: std::collections::HashMap<Vec<u8>, Vec<(usize, u32, FileType)>>,
}

impl DirIndex {
    /// Number of names shown.
    pub fn len(&self) -> usize {
        self.names.values().filter(|v| !v.is_empty()).count()
    }

    /// Whether no name is shown.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Images stacked bottom (index 0) to top.
#[derive(Debug, Clone)]
pub struct Stack {
    layers: Vec<Arc<Image>>,
}

impl Stack {
    /// A stack of `layers`, bottom first.
    pub fn new(layers: Vec<Arc<Image>>) -> Stack {
        Stack { layers }
    }

    /// The layers, bottom first.
    pub fn layers(&self) -> &[Arc<Image>] {
        &self.layers
    }

    /// Whether directory `d` of `layer` holds an entry `name`.
    fn has(&self, layer: usize, d: &Inode, name: &[u8]) -> Result<bool, ReadError> {
        Ok(self.layers[layer].lookup(d, name)?.is_some())
    }

    /// Add `layer`'s directory `d` and the same directory in the layers
    /// below, until one is opaque, hides it, or holds a non-directory there.
    fn merge_down(
        &self,
        mut parts: Vec<(usize, Inode)>,
        lower: &[(usize, Inode)],
        name: &[u8],
    ) -> Result<MergedDir, ReadError> {
        let wh = layers::whiteout(name);
        let mut blocked = {
            let (l, d) = parts[0];
            self.has(l, &d, OPAQUE_MARKER)?
        };
        for &(l, parent) in lower {
            if blocked {
                break;
            }
            let img = &self.layers[l];
            match img.lookup_child(&parent, name)? {
                Some(i) => {
                    if i.file_type() != FileType::Directory {
                        break;
                    }
                    blocked = self.has(l, &i, OPAQUE_MARKER)?;
                    parts.push((l, i));
                }
                None if img.lookup(&parent, &wh)?.is_some() => break,
                None => {}
            }
        }
        Ok(MergedDir { parts })
    }

    /// The merged root directory.
    pub fn root(&self) -> Result<MergedDir, ReadError> {
        let mut parts = Vec::new();
        for l in (0..self.layers.len()).rev() {
            let r = self.layers[l].root()?;
            let opaque = self.has(l, &r, OPAQUE_MARKER)?;
            parts.push((l, r));
            if opaque {
                break;
            }
        }
        Ok(MergedDir { parts })
    }

    /// Look `name` up in a merged directory.
    pub fn lookup(&self, dir: &MergedDir, name: &[u8]) -> Result<Option<Found>, ReadError> {
        if layers::is_hidden(name) {
            return Ok(None);
        }
        let wh = layers::whiteout(name);
        for (k, &(l, d)) in dir.parts.iter().enumerate() {
            let img = &self.layers[l];
            if let Some(i) = img.lookup_child(&d, name)? {
                if i.file_type() == FileType::Directory {
                    let below = &dir.parts[k + 1..];
                    // A whiteout beside the directory in the same layer
                    // (an opaque replacement in some writers) hides lower ones.
                    let below = if img.lookup(&d, &wh)?.is_some() {
                        &[][..]
                    } else {
                        below
                    };
                    return Ok(Some(Found::Dir(self.merge_down(
                        vec![(l, i)],
                        below,
                        name,
                    )?)));
                }
                return Ok(Some(Found::Node(l, i)));
            }
            if img.lookup(&d, &wh)?.is_some() {
                return Ok(None);
            }
        }
        Ok(None)
    }

    /// Index a merged directory (see [`DirIndex`]): reads every part's
    /// entries once.
    pub fn index(&self, dir: &MergedDir) -> Result<DirIndex, ReadError> {
        let mut names: std::collections::HashMap<Vec<u8>, Vec<(usize, u32, FileType)>> =
            Default::default();
        // Names decided for good: hidden by a whiteout, or ended by a
        // non-directory (nothing below it shows).
        let mut closed: HashSet<Vec<u8>> = HashSet::new();
        for (k, &(l, d)) in dir.parts.iter().enumerate() {
            let img = &self.layers[l];
            let n = img.dir_len(&d)?;
            let mut whiteouts = Vec::new();
            for e in img.read_dir(&d, 0, n as usize)? {
                match layers::parse(&e.name) {
                    Name::Opaque => continue,
                    Name::Whiteout(t) => {
                        whiteouts.push(t.to_vec());
                        continue;
                    }
                    Name::Plain(_) => {}
                }
                if closed.contains(&e.name) {
                    continue;
                }
                let v = names.entry(e.name.clone()).or_default();
                let is_dir = e.file_type == FileType::Directory;
                // A directory merges only with directories below it.
                if !v.is_empty() && !is_dir {
                    closed.insert(e.name);
                    continue;
                }
                v.push((k, e.ino, e.file_type));
                if !is_dir {
                    closed.insert(e.name);
                }
            }
            // A whiteout hides the name in the parts below this one; beside
            // a directory of the same layer it ends the merge there.
            for w in whiteouts {
                names.entry(w.clone()).or_default();
                closed.insert(w);
            }
        }
        Ok(DirIndex { names })
    }

    /// [`Stack::lookup`] through an index of `dir`: one hash lookup, plus
    /// one opaque-marker check per layer that holds a directory of that name.
    pub fn lookup_in(
        &self,
        dir: &MergedDir,
        idx: &DirIndex,
        name: &[u8],
    ) -> Result<Option<Found>, ReadError> {
        if layers::is_hidden(name) {
            return Ok(None);
        }
        let Some(v) = idx.names.get(name).filter(|v| !v.is_empty()) else {
            return Ok(None);
        };
        let (k, ino, ft) = v[0];
        let (l, d) = dir.parts[k];
        let top = self.layers[l].child(&d, ino, ft)?;
        if ft != FileType::Directory {
            return Ok(Some(Found::Node(l, top)));
        }
        let mut parts = vec![(l, top)];
        let mut blocked = self.has(l, &top, OPAQUE_MARKER)?;
        for &(k, ino, ft) in &v[1..] {
            if blocked || ft != FileType::Directory {
                break;
            }
            let (l, d) = dir.parts[k];
            let i = self.layers[l].child(&d, ino, ft)?;
            blocked = self.has(l, &i, OPAQUE_MARKER)?;
            parts.push((l, i));
        }
        Ok(Some(Found::Dir(MergedDir { parts })))
    }

    /// The inode an entry of `dir`'s listing shows, checked against the
    /// tree rules in its layer.
    pub fn entry_inode(&self, dir: &MergedDir, e: &StackEntry) -> Result<Inode, ReadError> {
        let img = &self.layers[e.layer];
        match dir.parts.iter().find(|p| p.0 == e.layer) {
            Some((_, d)) => img.child(d, e.ino, e.file_type),
            None => img.inode(e.ino),
        }
    }

    /// Resolve a `/`-separated path from the merged root.
    pub fn resolve(&self, path: &[u8]) -> Result<Found, ReadError> {
        let mut cur = Found::Dir(self.root()?);
        for comp in path
            .split(|&b| b == b'/')
            .filter(|c| !c.is_empty() && *c != b".")
        {
            let Found::Dir(d) = &cur else {
                return Err(ReadError::NotFound(String::from_utf8_lossy(path).into()));
            };
            cur = self
                .lookup(d, comp)?
                .ok_or_else(|| ReadError::NotFound(String::from_utf8_lossy(path).into()))?;
        }
        Ok(cur)
    }

    /// Resolve a path as a program inside the merged tree would (as
    /// [`Image::resolve_follow`]): symlinks followed in every component,
    /// relative ones from their directory, absolute ones from the merged
    /// root (never above it); more than 40 links is a loop.
    pub fn resolve_follow(&self, path: &[u8]) -> Result<Found, ReadError> {
        const MAX_LINKS: usize = 40;
        let whole = || String::from_utf8_lossy(path).into_owned();
        let mut todo: std::collections::VecDeque<Vec<u8>> =
            path.split(|&b| b == b'/').map(<[u8]>::to_vec).collect();
        // The directories from the root to the current one.
        let mut dirs = vec![self.root()?];
        // What the path names, once it names something not a directory.
        let mut last: Option<Found> = None;
        let mut links = 0;
        while let Some(comp) = todo.pop_front() {
            if matches!(comp.as_slice(), b"" | b".") {
                continue;
            }
            if last.is_some() {
                return Err(ReadError::NotFound(whole()));
            }
            if comp == b".." {
                if dirs.len() > 1 {
                    dirs.pop();
                }
                continue;
            }
            let here = dirs.last().expect("the root stays");
            match self
                .lookup(here, &comp)?
                .ok_or_else(|| ReadError::NotFound(whole()))?
            {
                Found::Dir(d) => dirs.push(d),
                Found::Node(l, ino) if ino.file_type() == FileType::Symlink => {
                    links += 1;
                    if links > MAX_LINKS {
                        return Err(ReadError::TooManyLinks(whole()));
                    }
                    let target = self.layers[l].read_link(&ino)?;
                    if target.first() == Some(&b'/') {
                        dirs.truncate(1);
                    }
                    for t in target.split(|&b| b == b'/').rev() {
                        todo.push_front(t.to_vec());
                    }
                }
                node => last = Some(node),
            }
        }
        Ok(match last {
            Some(n) => n,
            None => Found::Dir(dirs.pop().expect("the root stays")),
        })
    }

    /// The entries of a merged directory with what each resolves to (a
    /// directory merged across the layers that hold it), sorted by name,
    /// whiteouts applied and never listed: what a walk of the merged tree
    /// goes down ([`Stack::walk_in`]). Reads each part's listing once.
    pub fn children(&self, dir: &MergedDir) -> Result<Vec<(Vec<u8>, Found)>, ReadError> {
        let idx = self.index(dir)?;
        let mut names: Vec<&Vec<u8>> = idx
            .names
            .iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(n, _)| n)
            .collect();
        names.sort();
        names
            .into_iter()
            .filter_map(|n| match self.lookup_in(dir, &idx, n) {
                Ok(Some(f)) => Some(Ok((n.clone(), f))),
                Ok(None) => None,
                Err(e) => Some(Err(e)),
            })
            .collect()
    }

    /// The entries of a merged directory, sorted by name, whiteouts applied
    /// and never listed.
    pub fn read_dir(&self, dir: &MergedDir) -> Result<Vec<StackEntry>, ReadError> {
        let idx = self.index(dir)?;
        let mut out: Vec<StackEntry> = idx
            .names
            .into_iter()
            .filter_map(|(name, v)| {
                // A directory is shown from its top layer.
                let &(k, ino, file_type) = v.first()?;
                Some(StackEntry {
                    name,
                    layer: dir.parts[k].0,
                    ino,
                    file_type,
                })
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }
}
