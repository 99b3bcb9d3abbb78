//! The one way into a build tree: every source (a directory walk
//! [`crate::scan`], a tar archive or image layer [`crate::tar_input`], a
//! caller's entry list [`crate::entries`]) hands its entries to a
//! [`TreeBuilder`], which owns the rules (docs/design.md, "Into the tree"):
//!
//! - **Paths** are split on `/`; empty and `.` components are dropped, so
//!   `./a//b` is `a/b` and `""` or `.` is the root. A path with a `..`
//!   component anywhere is refused ([`Refused::ClimbsOut`]), never resolved
//!   or skipped silently. A leading `/` is dropped, except in an image layer
//!   ([`Absolute::Refuse`]), where it is refused like `..`.
//! - **Exclusions** (`--exclude`) match the path and each of its ancestors
//!   (relative to the top) and each one's last component, so an entry under
//!   an excluded directory is left out whether or not the directory itself
//!   came first.
//! - **Parents**: a directory the path names but no earlier entry gave is
//!   made *implicit*: mode 0755, owner 0:0, mtime 0 (after `--owner` and
//!   `--mtime`). A later entry for it sets its attributes and keeps its
//!   contents. A parent that exists as anything but a directory (a file, or
//!   a symlink: the "symlink parent" trick) is refused, so nothing is ever
//!   placed through a link.
//! - **Depth**: a path of more than [`MAX_DEPTH`] components is refused
//!   ([`Refused::TooDeep`]). Below it, memory is linear in the entries and
//!   their path bytes: a directory is found by its parent and its own
//!   name, never by its whole path.
//! - **The root** takes the attributes of an entry with an empty path, which
//!   must be a directory.
//! - **Duplicates**: a directory entry for a path that is a directory
//!   already only updates its attributes; any other repeated path is added
//!   again and the last one wins ([`Tree::finish`]), as with `tar -x`.
//! - **Hardlinks**: a later name of an earlier non-directory, known by a key
//!   the source gives ([`LinkKey`]: a path earlier in the same archive, a
//!   `(dev, ino)` pair, or a caller's number). A path key must name an
//!   earlier non-directory, or the entry is refused.
//!
//! Refusals that concern one entry go through [`crate::scan::Problems`]:
//! fatal, or listed and skipped under `--skip-errors`.

use crate::options::{BuildError, BuildOptions};
use crate::tree::{Kind, Meta, NodeId, Tree};
use std::collections::HashMap;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Turns attributes into [`Meta`] under the normalisation options.
pub struct Normalizer {
    owner: Option<(u32, u32)>,
    mtime: Option<i64>,
    clamp: Option<i64>,
}

impl Normalizer {
    /// From build options.
    pub fn new(o: &BuildOptions) -> Self {
        Normalizer {
            owner: o.owner,
            mtime: o.mtime,
            clamp: o.clamp_mtime,
        }
    }
    /// Apply owner and mtime rules.
    pub fn meta(&self, mode: u32, uid: u32, gid: u32, sec: i64, nsec: u32) -> Meta {
        let (uid, gid) = self.owner.unwrap_or((uid, gid));
        let (mut sec, mut nsec) = (sec, nsec);
        if let Some(t) = self.mtime {
            (sec, nsec) = (t, 0);
        } else if let Some(c) = self.clamp.filter(|&c| sec > c) {
            (sec, nsec) = (c, 0);
        }
        Meta {
            mode,
            uid,
            gid,
            mtime_sec: sec,
            mtime_nsec: nsec,
        }
    }
}

/// Compiled `--exclude` patterns.
pub struct Excluder(globset::GlobSet);

impl Excluder {
    /// Compile patterns; a bad pattern is an option error.
    pub fn new(patterns: &[String]) -> Result<Self, BuildError> {
        let mut b = globset::GlobSetBuilder::new();
        for p in patterns {
            let g = globset::GlobBuilder::new(p)
                .literal_separator(false)
                .build()
                .map_err(|e| BuildError::Option(format!("bad --exclude pattern '{p}': {e}")))?;
            b.add(g);
        }
        Ok(Excluder(
            b.build().map_err(|e| BuildError::Option(e.to_string()))?,
        ))
    }
    /// Whether a relative path (or its last component) is excluded.
    pub fn excluded(&self, rel: &Path) -> bool {
        !self.0.is_empty()
            && (self.0.is_match(rel) || rel.file_name().is_some_and(|n| self.0.is_match(n)))
    }
}

/// What a leading `/` means to a source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Absolute {
    /// Dropped: `/a` is `a` (tar archives, entry lists).
    Strip,
    /// Refused: an image layer holds relative paths only.
    Refuse,
}

/// The most components a path may have (docs/build.md, "Limits on
/// input"): twice the deepest tree a `PATH_MAX` (4096-byte) path can name
/// with one-byte names. A deeper entry is refused in one line; everything a
/// build does per level (implicit parents, `--exclude` of each ancestor, a
/// walk's stack) stays bounded by it.
pub const MAX_DEPTH: usize = 4096;

/// Why an entry's path is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// A `..` component.
    ClimbsOut,
    /// A leading `/` under [`Absolute::Refuse`].
    Absolute,
    /// More than [`MAX_DEPTH`] components.
    TooDeep,
    /// A NUL byte in a name (the format allows none, format.md §8.5).
    Nul,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Refused::ClimbsOut => "path climbs out with '..'",
            Refused::Absolute => "absolute path in an image layer",
            Refused::TooDeep => "path deeper than 4096 levels (sheaf's limit)",
            Refused::Nul => "a name holds a NUL byte",
        })
    }
}

/// A path split and checked by [`TreeBuilder::path`]: its components, none
/// empty, `.` or `..`; none for the root.
pub struct EntryPath<'a>(Vec<&'a [u8]>);

impl<'a> EntryPath<'a> {
    /// Whether this is the root.
    pub fn is_root(&self) -> bool {
        self.0.is_empty()
    }
    /// The last component (`None` for the root).
    pub fn leaf(&self) -> Option<&'a [u8]> {
        self.0.last().copied()
    }
    /// The components joined by `/` (empty for the root).
    pub fn joined(&self) -> Vec<u8> {
        self.0.join(&b'/')
    }
}

/// A path as messages show it: lossy UTF-8, cut after 256 bytes (a
/// hostile path may be megabytes long; a message stays one short line).
pub fn shown(raw: &[u8]) -> String {
    const MAX: usize = 256;
    if raw.len() <= MAX {
        return String::from_utf8_lossy(raw).into_owned();
    }
    format!(
        "{}... ({} bytes)",
        String::from_utf8_lossy(&raw[..MAX]),
        raw.len()
    )
}

/// Split on `/`, dropping empty and `.` components; refuse `..` and more
/// than [`MAX_DEPTH`] components.
fn split(raw: &[u8]) -> Result<EntryPath<'_>, Refused> {
    let mut v = Vec::new();
    let mut deep = false;
    for c in raw.split(|&b| b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => return Err(Refused::ClimbsOut),
            c if c.contains(&0) => return Err(Refused::Nul),
            _ if v.len() == MAX_DEPTH => deep = true,
            c => v.push(c),
        }
    }
    if deep {
        return Err(Refused::TooDeep);
    }
    Ok(EntryPath(v))
}

/// How a source names the inode a hardlink shares.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum LinkKey {
    /// A file system's `(dev, ino)` (a directory walk).
    Inode(u64, u64),
    /// A caller's number ([`crate::entries::Entry::link`]).
    Key(u64),
}

/// A tree under construction, with the maps the rules need.
pub struct TreeBuilder {
    /// The tree.
    pub tree: Tree,
    norm: Normalizer,
    excl: Excluder,
    absolute: Absolute,
    implicit: Meta,
    /// Directories by parent and name (the root is in none): each level
    /// holds its own name only, so a deep path costs its length, not the
    /// square of it.
    dirs: HashMap<(NodeId, Box<[u8]>), NodeId>,
    /// The first node of each hardlinked inode.
    links: HashMap<LinkKey, NodeId>,
}

impl TreeBuilder {
    /// An empty tree (an implicit root) under `opts`.
    pub fn new(opts: &BuildOptions, absolute: Absolute) -> Result<Self, BuildError> {
        let norm = Normalizer::new(opts);
        let implicit = norm.meta(libc::S_IFDIR | 0o755, 0, 0, 0, 0);
        Ok(TreeBuilder {
            tree: Tree::new(implicit),
            norm,
            excl: Excluder::new(&opts.exclude)?,
            absolute,
            implicit,
            dirs: HashMap::new(),
            links: HashMap::new(),
        })
    }

    /// Attributes under the owner and mtime options.
    pub fn meta(&self, mode: u32, uid: u32, gid: u32, sec: i64, nsec: u32) -> Meta {
        self.norm.meta(mode, uid, gid, sec, nsec)
    }

    /// Split and check a source's path.
    pub fn path<'a>(&self, raw: &'a [u8]) -> Result<EntryPath<'a>, Refused> {
        if self.absolute == Absolute::Refuse && raw.starts_with(b"/") {
            return Err(Refused::Absolute);
        }
        split(raw)
    }

    /// Whether the path or one of its ancestors is excluded. Ancestors
    /// that are directories of the tree already were checked when the
    /// entry that made them came (an excluded entry makes none), so only
    /// the rest are matched.
    pub fn excluded(&self, p: &EntryPath) -> bool {
        if self.excl.0.is_empty() {
            return false;
        }
        let mut prefix = Vec::new();
        let mut cur = Some(0);
        for (i, c) in p.0.iter().enumerate() {
            if i > 0 {
                prefix.push(b'/');
            }
            prefix.extend_from_slice(c);
            let last = i + 1 == p.0.len();
            cur = cur.and_then(|d| self.dirs.get(&(d, Box::from(*c))).copied());
            if (cur.is_none() || last) && self.excluded_rel(&prefix) {
                return true;
            }
        }
        false
    }

    /// Whether one relative path (not its ancestors) is excluded: for a walk,
    /// which never enters an excluded directory.
    pub fn excluded_rel(&self, rel: &[u8]) -> bool {
        self.excl
            .excluded(Path::new(std::ffi::OsStr::from_bytes(rel)))
    }

    /// The directory an entry at `p` goes into, making implicit ones; an
    /// error names an ancestor that is not a directory. The root's parent
    /// is the root.
    pub fn parent(&mut self, p: &EntryPath) -> Result<NodeId, String> {
        let n = p.0.len().saturating_sub(1);
        self.dir(&p.0[..n])
    }

    fn dir(&mut self, comps: &[&[u8]]) -> Result<NodeId, String> {
        let mut cur = 0;
        for (i, c) in comps.iter().enumerate() {
            let key = (cur, Box::<[u8]>::from(*c));
            cur = match self.dirs.get(&key) {
                Some(&d) => d,
                None => {
                    if self.tree.child(cur, c).is_some() {
                        return Err(format!(
                            "{} is not a directory",
                            String::from_utf8_lossy(&comps[..=i].join(&b'/'))
                        ));
                    }
                    let node = self.tree.node(self.implicit, Kind::Dir(Box::default()), 0);
                    let d = self.tree.add(cur, c, node);
                    self.dirs.insert(key, d);
                    d
                }
            };
        }
        Ok(cur)
    }

    /// The directory at `comps`, if the tree has it; makes none.
    fn find_dir(&self, comps: &[&[u8]]) -> Option<NodeId> {
        comps.iter().try_fold(0, |cur, c| {
            self.dirs.get(&(cur, Box::<[u8]>::from(*c))).copied()
        })
    }

    /// The earlier node a hardlink names, if any.
    pub fn linked(&self, key: &LinkKey) -> Option<NodeId> {
        self.links.get(key).copied()
    }

    /// The earlier non-directory at `target` (a tar hardlink's path, a
    /// leading `/` dropped even in a layer: it only names an entry), if
    /// any; never makes directories.
    pub fn linked_path(&self, target: &[u8]) -> Option<NodeId> {
        let p = split(target).ok()?;
        let (leaf, parents) = p.0.split_last()?;
        let d = self.find_dir(parents)?;
        self.tree
            .child(d, leaf)
            .filter(|&t| !matches!(self.tree.nodes[t as usize].kind, Kind::Dir(_)))
    }

    /// Another name at `p` (not the root) in `parent` for `target`.
    pub fn link(&mut self, parent: NodeId, p: &EntryPath, target: NodeId) {
        if let Some(leaf) = p.leaf() {
            self.tree.link(parent, leaf, target);
        }
    }

    /// Put an entry of `kind` at `p` in `parent` (from
    /// [`TreeBuilder::parent`]): a directory at the root or at an existing
    /// directory only sets its attributes; anything else is a new entry,
    /// and `link` records its inode for later names. Returns the node's id,
    /// or `Err` for a non-directory root.
    pub fn put(
        &mut self,
        parent: NodeId,
        p: &EntryPath,
        meta: Meta,
        kind: Kind,
        xattrs: u32,
        link: Option<LinkKey>,
    ) -> Result<NodeId, &'static str> {
        let is_dir = matches!(kind, Kind::Dir(_));
        let Some(leaf) = p.leaf() else {
            if !is_dir {
                return Err("the root must be a directory");
            }
            self.tree.set_meta(0, meta, xattrs);
            return Ok(0);
        };
        if !is_dir {
            return Ok(self.add(parent, leaf, meta, kind, xattrs, link));
        }
        let key = (parent, Box::<[u8]>::from(leaf));
        if let Some(&d) = self.dirs.get(&key) {
            self.tree.set_meta(d, meta, xattrs);
            return Ok(d);
        }
        let node = self.tree.node(meta, kind, xattrs);
        let d = self.tree.add(parent, leaf, node);
        self.dirs.insert(key, d);
        Ok(d)
    }

    /// Add an entry named `name` in `parent`, for a walk that knows its
    /// parent already (no directory map); `link` records the inode.
    pub fn add(
        &mut self,
        parent: NodeId,
        name: &[u8],
        meta: Meta,
        kind: Kind,
        xattrs: u32,
        link: Option<LinkKey>,
    ) -> NodeId {
        let node = self.tree.node(meta, kind, xattrs);
        let id = self.tree.add(parent, name, node);
        if let Some(k) = link {
            self.links.entry(k).or_insert(id);
        }
        id
    }

    /// The finished tree (directories sorted, duplicates settled).
    pub fn finish(mut self) -> Tree {
        self.tree.finish();
        self.tree
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn builder(absolute: Absolute, exclude: &[&str]) -> TreeBuilder {
        let opts = BuildOptions {
            exclude: exclude.iter().map(|s| s.to_string()).collect(),
            ..BuildOptions::default()
        };
        TreeBuilder::new(&opts, absolute).unwrap()
    }

    fn dir_meta(b: &TreeBuilder, mode: u32) -> Meta {
        b.meta(libc::S_IFDIR | mode, 5, 6, 7, 0)
    }

    #[test]
    fn paths_split_and_refuse_climbing_and_layer_absolute() {
        let b = builder(Absolute::Strip, &[]);
        assert_eq!(b.path(b"./a//b/.").ok().unwrap().joined(), b"a/b");
        assert!(b.path(b"/a").ok().unwrap().joined() == b"a");
        assert!(b.path(b".").ok().unwrap().is_root());
        assert_eq!(b.path(b"a/../b").err(), Some(Refused::ClimbsOut));
        assert_eq!(b.path(b"..").err(), Some(Refused::ClimbsOut));
        // Found by the tar fuzz target: a NUL made an image no reader opens.
        assert_eq!(b.path(b"a/b\0c").err(), Some(Refused::Nul));
        let l = builder(Absolute::Refuse, &[]);
        assert_eq!(l.path(b"/a").err(), Some(Refused::Absolute));
        assert_eq!(l.path(b"a/..").err(), Some(Refused::ClimbsOut));
    }

    #[test]
    fn exclusions_cover_ancestors() {
        let b = builder(Absolute::Strip, &["skip", "x/*.o"]);
        let ex = |p: &[u8]| b.excluded(&b.path(p).ok().unwrap());
        assert!(ex(b"skip"));
        assert!(ex(b"a/skip/deep/file"));
        assert!(ex(b"x/y.o/z"));
        assert!(!ex(b"a/keep"));
    }

    #[test]
    fn implicit_parents_take_a_later_entrys_attributes_and_keep_contents() {
        let mut b = builder(Absolute::Strip, &[]);
        let p = b.path(b"a/b/f").ok().unwrap();
        let parent = b.parent(&p).unwrap();
        let m = b.meta(libc::S_IFREG | 0o644, 0, 0, 0, 0);
        b.put(parent, &p, m, Kind::Special, 0, None).unwrap();
        let a = b.tree.child(0, b"a").unwrap();
        assert_eq!(b.tree.mode(a), libc::S_IFDIR | 0o755);
        let p = b.path(b"a").ok().unwrap();
        let parent = b.parent(&p).unwrap();
        let m = dir_meta(&b, 0o700);
        let id = b.put(parent, &p, m, Kind::Dir(Box::default()), 0, None);
        assert_eq!(id, Ok(a));
        assert_eq!(b.tree.meta(a), m);
        assert!(b.tree.child(a, b"b").is_some());
    }

    #[test]
    fn a_non_directory_parent_or_root_is_refused() {
        let mut b = builder(Absolute::Strip, &[]);
        let p = b.path(b"link").ok().unwrap();
        let m = b.meta(libc::S_IFLNK | 0o777, 0, 0, 0, 0);
        b.put(0, &p, m, Kind::Symlink((*b"/etc").into()), 0, None)
            .unwrap();
        let p = b.path(b"link/passwd").ok().unwrap();
        assert_eq!(b.parent(&p), Err("link is not a directory".to_string()));
        let root = b.path(b"").ok().unwrap();
        let m = b.meta(libc::S_IFREG | 0o644, 0, 0, 0, 0);
        assert!(b.put(0, &root, m, Kind::Special, 0, None).is_err());
    }

    #[test]
    fn hardlinks_name_earlier_non_directories() {
        let mut b = builder(Absolute::Strip, &[]);
        let p = b.path(b"d/f").ok().unwrap();
        let parent = b.parent(&p).unwrap();
        let m = b.meta(libc::S_IFREG | 0o644, 0, 0, 0, 0);
        let f = b
            .put(parent, &p, m, Kind::Special, 0, Some(LinkKey::Key(9)))
            .unwrap();
        assert_eq!(b.linked(&LinkKey::Key(9)), Some(f));
        assert_eq!(b.linked_path(b"/d/f"), Some(f));
        assert_eq!(b.linked_path(b"d"), None, "a directory");
        assert_eq!(b.linked_path(b"d/../d/f"), None);
        assert_eq!(b.linked_path(b"e/f"), None);
        assert!(b.tree.child(0, b"e").is_none(), "no directory made");
    }
}
