//! Scanning a directory into a [`Tree`] (attributes only; data is read later
//! by [`crate::pack`] in packing order): a walk that feeds a
//! [`TreeBuilder`], which owns the rules (exclusions, attributes,
//! hardlinks by `(dev, ino)`). A walk knows each entry's parent and never
//! enters an excluded directory, so it adds entries by parent and name.

use crate::normalize::{Absolute, LinkKey, Refused, TreeBuilder, MAX_DEPTH};
use crate::options::{BuildError, BuildOptions};
use crate::tree::{Kind, Meta, NodeId, Tree};
use sheaf_format::XattrSet;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Read the extended attributes of `path` without following symlinks.
pub fn read_xattrs(path: &Path) -> std::io::Result<XattrSet> {
    let mut set = Vec::new();
    let names = match xattr::list(path) {
        Ok(n) => n,
        // Filesystems without xattr support simply have none.
        Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => return Ok(XattrSet::default()),
        Err(e) => return Err(e),
    };
    for name in names {
        if let Some(v) = xattr::get(path, &name)? {
            set.push((name.as_bytes().to_vec(), v));
        }
    }
    Ok(XattrSet(set))
}

/// Longest path handed to a system call; deeper directories are opened step
/// by step and named through `/proc/self/fd`, so trees deeper than
/// `PATH_MAX` (4096 bytes) can be packed.
const SHORT_PATH: usize = 3072;

/// A short path naming the directory `root/rel` for system calls, and the
/// open directory that keeps it valid when the real path is too long.
pub fn dir_handle(root: &Path, rel: &Path) -> std::io::Result<(PathBuf, Option<fs::File>)> {
    use std::os::unix::fs::OpenOptionsExt;
    use std::os::unix::io::AsRawFd;
    let full = root.join(rel);
    if full.as_os_str().len() < SHORT_PATH {
        return Ok((full, None));
    }
    let open = |p: &Path| {
        fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
            .open(p)
    };
    let mut held: Option<fs::File> = None;
    let mut base = root.to_path_buf();
    let mut pending = PathBuf::new();
    for comp in rel.components() {
        let len = base.as_os_str().len() + pending.as_os_str().len() + comp.as_os_str().len() + 2;
        if len >= SHORT_PATH && !pending.as_os_str().is_empty() {
            let f = open(&base.join(&pending))?;
            base = PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd()));
            held = Some(f); // the previous directory may close now
            pending = PathBuf::new();
        }
        pending.push(comp);
    }
    let f = open(&base.join(&pending))?;
    drop(held);
    Ok((
        PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd())),
        Some(f),
    ))
}

/// Collects problems when `--skip-errors` is on; otherwise fails fast.
pub struct Problems {
    skip: bool,
    /// Entries left out and why.
    pub skipped: Vec<String>,
}

impl Problems {
    /// New collector.
    pub fn new(skip: bool) -> Self {
        Problems {
            skip,
            skipped: Vec::new(),
        }
    }
    /// Record or raise an error about `path`.
    pub fn handle(&mut self, path: &Path, e: std::io::Error) -> Result<(), BuildError> {
        // Cut as every input's messages are: a path 4096 levels deep is
        // one short line, not kilobytes of it.
        let path = crate::normalize::shown(path.as_os_str().as_bytes());
        if self.skip {
            self.skipped.push(format!("{path}: {e}"));
            Ok(())
        } else {
            Err(BuildError::Input { path, cause: e })
        }
    }
}

/// Scan `root` into a tree. Regular files get `Kind::File` with no chunks yet.
/// Files whose `(dev, ino)` is in `skip` (the image being written, when it
/// lies inside the source) are left out.
pub fn scan_dir(
    root: &Path,
    opts: &BuildOptions,
    problems: &mut Problems,
    skip: &[(u64, u64)],
) -> Result<Tree, BuildError> {
    let mut b = TreeBuilder::new(opts, Absolute::Strip)?;
    let md = fs::symlink_metadata(root).map_err(|e| BuildError::Input {
        path: root.display().to_string(),
        cause: e,
    })?;
    if !md.is_dir() {
        return Err(BuildError::BadInput {
            path: root.display().to_string(),
            detail: "not a directory or tar archive".into(),
        });
    }
    let root_meta = meta_of(&b, &md);
    let xattrs = match read_xattrs(root) {
        Ok(x) => b.tree.intern_xattrs(x),
        Err(e) => {
            problems.handle(root, e)?;
            0
        }
    };
    b.tree.set_meta(0, root_meta, xattrs);
    // Each directory to list, its path and its depth (the root's is 0).
    let mut stack: Vec<(NodeId, PathBuf, usize)> = vec![(0, PathBuf::new(), 0)];
    while let Some((dir, rel, depth)) = stack.pop() {
        let full = root.join(&rel);
        let (base, _held) = match dir_handle(root, &rel) {
            Ok(h) => h,
            Err(e) => {
                problems.handle(&full, e)?;
                continue;
            }
        };
        let rd = match fs::read_dir(&base) {
            Ok(rd) => rd,
            Err(e) => {
                problems.handle(&full, e)?;
                continue;
            }
        };
        let mut names = Vec::new();
        for ent in rd {
            match ent {
                Ok(ent) => names.push(ent.file_name()),
                Err(e) => problems.handle(&full, e)?,
            }
        }
        // Sorted so node ids (and the image) never depend on readdir order.
        names.sort();
        for name in names {
            let rel_child = rel.join(&name);
            if b.excluded_rel(rel_child.as_os_str().as_bytes()) {
                continue;
            }
            // `path` is for system calls, `shown` for messages.
            let path = base.join(&name);
            let shown = root.join(&rel_child);
            if depth >= MAX_DEPTH {
                problems.handle(&shown, std::io::Error::other(Refused::TooDeep.to_string()))?;
                continue;
            }
            let md = match fs::symlink_metadata(&path) {
                Ok(m) => m,
                Err(e) => {
                    problems.handle(&shown, e)?;
                    continue;
                }
            };
            if skip.contains(&(md.dev(), md.ino())) {
                continue;
            }
            let bname = name.as_bytes();
            // Files seen with nlink > 1 are hardlinks by (dev, ino).
            let link = (md.nlink() > 1 && !md.is_dir()).then(|| LinkKey::Inode(md.dev(), md.ino()));
            if let Some(target) = link.as_ref().and_then(|k| b.linked(k)) {
                b.tree.link(dir, bname, target);
                continue;
            }
            let kind = match md.mode() & libc::S_IFMT {
                libc::S_IFDIR => Kind::Dir(Box::default()),
                libc::S_IFREG => Kind::File {
                    size: md.size(),
                    first: 0,
                    count: 0,
                },
                libc::S_IFLNK => match fs::read_link(&path) {
                    Ok(t) => Kind::Symlink(t.as_os_str().as_bytes().into()),
                    Err(e) => {
                        problems.handle(&shown, e)?;
                        continue;
                    }
                },
                libc::S_IFCHR | libc::S_IFBLK => Kind::Device(md.rdev()),
                _ => Kind::Special,
            };
            let xattrs = match read_xattrs(&path) {
                Ok(x) => b.tree.intern_xattrs(x),
                Err(e) => {
                    problems.handle(&shown, e)?;
                    continue;
                }
            };
            let is_dir = matches!(kind, Kind::Dir(_));
            let id = b.add(dir, bname, meta_of(&b, &md), kind, xattrs, link);
            if is_dir {
                stack.push((id, rel_child, depth + 1));
            }
        }
    }
    Ok(b.finish())
}

fn meta_of(b: &TreeBuilder, md: &fs::Metadata) -> Meta {
    b.meta(
        md.mode(),
        md.uid(),
        md.gid(),
        md.mtime(),
        md.mtime_nsec().clamp(0, 999_999_999) as u32,
    )
}
