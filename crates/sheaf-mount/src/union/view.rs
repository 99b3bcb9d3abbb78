//! The merged view: what a name resolves to (the upper directory first,
//! then the layers), attributes, and merged directory listings.

use super::sys::{errno_of, exists_at, open_path_at, read_dir, stat_at, stat_fd};
use super::table::{preferred_ino, Key, Node};
use super::UnionFs;
use crate::fs::{encode_dev, image_attr, kind_of};
use crate::stats::Op;
use fuser::{Errno, FileAttr, FileType, INodeNo};
use sheaf_format::layers::{self, Name, OPAQUE_MARKER};
use sheaf_read::{Found, ReadError};
use std::collections::HashSet;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::DirEntryExt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A merged directory of at least this many layers is looked up through an
/// index of its names instead of layer by layer (building it costs one
/// listing; a listing with attributes then costs one hash lookup a name).
const INDEX_PARTS: usize = 2;

/// One listed name.
#[derive(Debug, Clone)]
pub(super) struct Entry {
    pub(super) name: Vec<u8>,
    pub(super) kind: FileType,
    pub(super) ino: u64,
}

/// What a name resolves to, before it becomes a node.
pub(super) struct Child {
    pub(super) lower: Option<Arc<Found>>,
    pub(super) upper: Option<(OwnedFd, libc::stat)>,
}

impl Child {
    /// Whether it is a directory (the upper object, if any, decides).
    pub(super) fn is_dir(&self) -> bool {
        match (&self.upper, self.lower.as_deref()) {
            (Some((_, st)), _) => st.st_mode & libc::S_IFMT == libc::S_IFDIR,
            (None, Some(f)) => matches!(f, Found::Dir(_)),
            _ => false,
        }
    }
}

pub(super) fn kind_of_mode(mode: u32) -> FileType {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFSOCK => FileType::Socket,
        _ => FileType::RegularFile,
    }
}

fn time(sec: i64, nsec: i64) -> SystemTime {
    if sec >= 0 {
        UNIX_EPOCH + Duration::new(sec as u64, nsec as u32)
    } else {
        UNIX_EPOCH - Duration::from_secs(sec.unsigned_abs()) + Duration::from_nanos(nsec as u64)
    }
}

/// The attributes of an upper object, as node `ino`.
pub(super) fn stat_attr(ino: u64, st: &libc::stat) -> FileAttr {
    let kind = kind_of_mode(st.st_mode);
    FileAttr {
        ino: INodeNo(ino),
        size: st.st_size as u64,
        blocks: st.st_blocks as u64,
        atime: time(st.st_atime, st.st_atime_nsec),
        mtime: time(st.st_mtime, st.st_mtime_nsec),
        ctime: time(st.st_ctime, st.st_ctime_nsec),
        crtime: time(st.st_mtime, st.st_mtime_nsec),
        kind,
        perm: (st.st_mode & 0o7777) as u16,
        nlink: st.st_nlink as u32,
        uid: st.st_uid,
        gid: st.st_gid,
        rdev: match kind {
            FileType::CharDevice | FileType::BlockDevice => encode_dev(st.st_rdev),
            _ => 0,
        },
        blksize: st.st_blksize as u32,
        flags: 0,
    }
}

impl UnionFs {
    /// The lower entry `name` of directory `dir`, ignoring the upper layer.
    pub(super) fn lower_child(&self, dir: &Node, name: &[u8]) -> Result<Option<Found>, ReadError> {
        match dir.lower.as_deref() {
            // Many layers share this directory: look names up in an index
            // of it, so the cost does not grow with the number of layers.
            Some(Found::Dir(md)) if md.parts.len() >= INDEX_PARTS => {
                let key = (md.parts[0].0, md.parts[0].1.ino);
                let cached = self.indexes.lock().expect("indexes").get(&key).cloned();
                let idx = match cached {
                    Some(i) => i,
                    None => {
                        let i = Arc::new(self.stack.index(md)?);
                        self.indexes.lock().expect("indexes").insert(key, i.clone());
                        i
                    }
                };
                self.stack.lookup_in(md, &idx, name)
            }
            Some(Found::Dir(md)) => self.stack.lookup(md, name),
            _ => Ok(None),
        }
    }

    /// [`Self::lower_child`], its error counted as a lookup's.
    pub(super) fn lower_child_of(&self, dir: &Node, name: &[u8]) -> Result<Option<Found>, Errno> {
        self.lower_child(dir, name)
            .map_err(|e| self.read_err(Op::Lookup, &e))
    }

    /// What `name` in `dir` is, in the merged view.
    pub(super) fn resolve(&self, dir: &Node, name: &[u8]) -> Result<Option<Child>, Errno> {
        if name.len() > 255 {
            return Err(Errno::from_i32(libc::ENAMETOOLONG));
        }
        if layers::is_hidden(name) {
            return Ok(None);
        }
        if let Some(pfd) = &dir.upper {
            let p = pfd.as_fd();
            match stat_at(p, name) {
                Ok(st) => {
                    let fd = open_path_at(p, name)?;
                    let is_dir = st.st_mode & libc::S_IFMT == libc::S_IFDIR;
                    let lower = if is_dir && !exists_at(fd.as_fd(), OPAQUE_MARKER) {
                        match self.lower_child_of(dir, name)? {
                            Some(f @ Found::Dir(_)) => Some(Arc::new(f)),
                            _ => None,
                        }
                    } else {
                        None
                    };
                    return Ok(Some(Child {
                        lower,
                        upper: Some((fd, st)),
                    }));
                }
                Err(e) if e == Errno::ENOENT => {
                    if exists_at(p, &layers::whiteout(name)) {
                        return Ok(None);
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(self.lower_child_of(dir, name)?.map(|f| Child {
            lower: Some(Arc::new(f)),
            upper: None,
        }))
    }

    /// The attributes of node `id`.
    pub(super) fn attr(&self, id: u64, n: &Node) -> Result<FileAttr, Errno> {
        if let Some(fd) = &n.upper {
            return Ok(stat_attr(id, &stat_fd(fd.as_fd())?));
        }
        match n.lower.as_deref() {
            Some(f) => Ok(image_attr(id, &f.shown().1)),
            None => Err(Errno::ENOENT),
        }
    }

    /// The merged listing of a directory node.
    pub(super) fn listing(&self, n: &Node) -> Result<Vec<Entry>, Errno> {
        self.merged_listing(n.upper.as_deref(), n.lower.as_deref())
    }

    /// The merged listing of a directory: its upper part, then what the
    /// layers add that the upper part neither has nor hides.
    pub(super) fn merged_listing(
        &self,
        upper: Option<&OwnedFd>,
        lower: Option<&Found>,
    ) -> Result<Vec<Entry>, Errno> {
        let mut out = Vec::new();
        let mut seen: HashSet<Vec<u8>> = HashSet::new();
        let mut hidden: HashSet<Vec<u8>> = HashSet::new();
        if let Some(fd) = upper {
            let rd = read_dir(fd.as_fd())?;
            let st = stat_fd(fd.as_fd())?;
            for e in rd {
                let e = e.map_err(|e| errno_of(&e))?;
                let name = e.file_name().as_bytes().to_vec();
                match layers::parse(&name) {
                    Name::Whiteout(t) => {
                        hidden.insert(t.to_vec());
                        continue;
                    }
                    Name::Opaque => continue,
                    Name::Plain(_) => {}
                }
                let kind = match e.file_type() {
                    Ok(t) if t.is_dir() => FileType::Directory,
                    Ok(t) if t.is_symlink() => FileType::Symlink,
                    Ok(t) if t.is_file() => FileType::RegularFile,
                    Ok(_) | Err(_) => match stat_at(fd.as_fd(), &name) {
                        Ok(s) => kind_of_mode(s.st_mode),
                        Err(_) => continue,
                    },
                };
                let ino = preferred_ino(&Key::Upper(st.st_dev, e.ino())).unwrap_or(u64::MAX);
                seen.insert(name.clone());
                out.push(Entry { name, kind, ino });
            }
        }
        if let Some(Found::Dir(md)) = lower {
            let lower = self
                .stack
                .read_dir(md)
                .map_err(|e| self.read_err(Op::Readdir, &e))?;
            for e in lower {
                if seen.contains(&e.name) || hidden.contains(&e.name) {
                    continue;
                }
                out.push(Entry {
                    ino: preferred_ino(&Key::Lower(e.layer, e.ino)).unwrap_or(u64::MAX),
                    kind: kind_of(e.file_type),
                    name: e.name,
                });
            }
        }
        Ok(out)
    }

    /// The cached listing of a read-only mount's directory.
    pub(super) fn cached_listing(&self, ino: INodeNo) -> Result<Arc<Vec<Entry>>, Errno> {
        let n = self.node(ino)?;
        if let Some(l) = &n.listing {
            return Ok(l.clone());
        }
        let l = Arc::new(self.listing(&n)?);
        if let Some(n) = self.table.lock().expect("table").nodes.get_mut(&ino.0) {
            n.listing = Some(l.clone());
        }
        Ok(l)
    }

    /// Whether a directory is empty in the merged view.
    pub(super) fn is_empty_dir(&self, child: &Child) -> Result<bool, Errno> {
        Ok(self
            .merged_listing(
                child.upper.as_ref().map(|(fd, _)| fd),
                child.lower.as_deref(),
            )?
            .is_empty())
    }
}
