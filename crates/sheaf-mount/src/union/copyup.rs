//! Changing the upper directory: copy-up of lower entries (and of whole
//! merged directories, before a rename), whiteouts, opaque directories, and
//! owners of new entries.

use super::sys::{
    chmod_at, chown_at, errno_of, exists_at, mkdir_at, mknod_at, open_at, open_path_at, read_dir,
    rename_at, stat_at, stat_fd, symlink_at, touch_at, unlink_at, utimens_at, xattr_set_at,
};
use super::table::{Key, ROOT};
use super::{Caller, UnionFs, Upper};
use crate::fs::MAX_READ;
use crate::stats::Op;
use fuser::{Errno, INodeNo};
use sheaf_format::layers::{self, OPAQUE_MARKER};
use sheaf_format::records::FileType as Ft;
use sheaf_read::Found;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

impl UnionFs {
    pub(super) fn upper(&self) -> Result<&Upper, Errno> {
        self.upper.as_ref().ok_or(Errno::EROFS)
    }

    /// Give a new upper entry the caller's owner (as root; the group of a
    /// setgid directory is kept, as the kernel chose it).
    pub(super) fn own(
        &self,
        caller: Caller,
        dir: BorrowedFd<'_>,
        name: &[u8],
        mode: Option<u32>,
    ) -> Result<(), Errno> {
        if !self.upper()?.root_user {
            return Ok(());
        }
        let st = stat_fd(dir)?;
        let gid = (st.st_mode & libc::S_ISGID == 0).then_some(caller.gid);
        if let Err(e) = chown_at(dir, name, Some(caller.uid), gid) {
            // The caller's id may not exist in this process's user namespace
            // (a mount moved into one): keep the server's own.
            if e != Errno::EINVAL && e != Errno::EPERM {
                return Err(e);
            }
            return Ok(());
        }
        // chown clears set-id bits of files; put back what was asked for.
        if let Some(m) = mode.filter(|m| m & (libc::S_ISUID | libc::S_ISGID) != 0) {
            chmod_at(dir, name, m & 0o7777)?;
        }
        Ok(())
    }

    /// Make sure node `id` exists in the upper directory (copying it and its
    /// missing parents up) and return its descriptor.
    pub(super) fn copy_up(&self, id: u64) -> Result<Arc<OwnedFd>, Errno> {
        let n = self.node(INodeNo(id))?;
        if let Some(fd) = &n.upper {
            return Ok(fd.clone());
        }
        if id == ROOT {
            return Err(Errno::EROFS);
        }
        let pfd = self.copy_up(n.parent)?;
        let p = pfd.as_fd();
        // Adopt an existing copy (a directory renamed whole was copied up
        // beneath nodes that still point at the lower tree).
        let fd = if exists_at(p, &n.name) {
            open_path_at(p, &n.name)?
        } else {
            let found = n.lower.as_deref().ok_or(Errno::ENOENT)?;
            self.copy_entry(p, &n.name, found)?;
            open_path_at(p, &n.name)?
        };
        let st = stat_fd(fd.as_fd())?;
        let fd = Arc::new(fd);
        let mut t = self.table.lock().expect("table");
        t.by_key.insert(Key::Upper(st.st_dev, st.st_ino), id);
        if let Some(node) = t.nodes.get_mut(&id) {
            node.in_upper = true;
            node.keys.push(Key::Upper(st.st_dev, st.st_ino));
            if !node.is_dir {
                node.lower = None;
            }
        }
        Ok(fd)
    }

    /// Copy one lower entry into upper directory `dir` as `name` (a
    /// directory without its contents).
    pub(super) fn copy_entry(
        &self,
        dir: BorrowedFd<'_>,
        name: &[u8],
        found: &Found,
    ) -> Result<(), Errno> {
        let (l, i) = found.shown();
        let img = &self.stack.layers()[l];
        let r = &i.rec;
        let perm = r.mode & 0o7777;
        self.copyups.fetch_add(1, Relaxed);
        match i.file_type() {
            Ft::Directory => mkdir_at(dir, name, perm)?,
            Ft::Regular => {
                // Written under a hidden temporary name, then renamed: an
                // interrupted copy-up leaves nothing a reader or commit sees.
                let tmp = layers::temp_name(&format!("copyup.{}", self.copyups.load(Relaxed)));
                let f = open_at(
                    dir,
                    &tmp,
                    libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC,
                    0o600,
                )?;
                let copied = (|| -> Result<(), Errno> {
                    let mut buf = vec![0u8; MAX_READ as usize];
                    let mut off = 0u64;
                    loop {
                        let k = img
                            .read(&i, off, &mut buf)
                            .map_err(|e| self.read_err(Op::Read, &e))?;
                        if k == 0 {
                            break;
                        }
                        f.write_all_at(&buf[..k], off).map_err(|e| errno_of(&e))?;
                        off += k as u64;
                    }
                    Ok(())
                })();
                if let Err(e) = copied {
                    let _ = unlink_at(dir, &tmp, false);
                    return Err(e);
                }
                drop(f);
                if let Err(e) = rename_at(dir, &tmp, dir, name, false) {
                    let _ = unlink_at(dir, &tmp, false);
                    return Err(e);
                }
            }
            Ft::Symlink => {
                let target = img
                    .read_link(&i)
                    .map_err(|e| self.read_err(Op::Readlink, &e))?;
                symlink_at(&target, dir, name)?;
            }
            Ft::CharDevice | Ft::BlockDevice | Ft::Fifo | Ft::Socket => {
                mknod_at(dir, name, r.mode, r.data as libc::dev_t)?;
            }
        }
        // Attributes: owner (when allowed), mode, xattrs, then times last.
        let _ = chown_at(dir, name, Some(r.uid), Some(r.gid));
        if i.file_type() != Ft::Symlink {
            chmod_at(dir, name, perm)?;
            if let Ok(set) = img.xattrs(&i) {
                for (k, v) in set.0 {
                    if let Err(e) = xattr_set_at(dir, name, &k, &v) {
                        log::warn!(
                            "copy-up of {}: xattr {} not kept: {e:?}",
                            String::from_utf8_lossy(name),
                            String::from_utf8_lossy(&k)
                        );
                    }
                }
            }
        }
        let t = libc::timespec {
            tv_sec: r.mtime_sec as _,
            tv_nsec: r.mtime_nsec as libc::c_long,
        };
        let _ = utimens_at(dir, name, [t, t]);
        Ok(())
    }

    /// Copy everything below merged directory `dir` (upper `dfd`, lower
    /// `lower`) into the upper directory, so it no longer needs the layers
    /// (a merged directory is renamed whole in the upper directory).
    pub(super) fn copy_up_tree(
        &self,
        dfd: BorrowedFd<'_>,
        lower: Option<&Found>,
    ) -> Result<(), Errno> {
        let Some(Found::Dir(md)) = lower else {
            return Ok(());
        };
        if exists_at(dfd, OPAQUE_MARKER) {
            return Ok(());
        }
        let entries = self
            .stack
            .read_dir(md)
            .map_err(|e| self.read_err(Op::Readdir, &e))?;
        for e in entries {
            if exists_at(dfd, &layers::whiteout(&e.name)) {
                continue;
            }
            let found = self
                .stack
                .lookup(md, &e.name)
                .map_err(|e| self.read_err(Op::Lookup, &e))?
                .ok_or(Errno::EIO)?;
            match stat_at(dfd, &e.name) {
                Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFDIR => {
                    if matches!(found, Found::Dir(_)) {
                        let sub = open_path_at(dfd, &e.name)?;
                        self.copy_up_tree(sub.as_fd(), Some(&found))?;
                    }
                }
                Ok(_) => {}
                Err(_) => {
                    self.copy_entry(dfd, &e.name, &found)?;
                    if matches!(found, Found::Dir(_)) {
                        let sub = open_path_at(dfd, &e.name)?;
                        self.copy_up_tree(sub.as_fd(), Some(&found))?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Make a fresh upper directory hide what the layers have at its path.
    pub(super) fn make_opaque(&self, dfd: BorrowedFd<'_>) -> Result<(), Errno> {
        touch_at(dfd, OPAQUE_MARKER)
    }

    /// Record that lower entry `name` of `dir` is gone.
    pub(super) fn add_whiteout(&self, dfd: BorrowedFd<'_>, name: &[u8]) -> Result<(), Errno> {
        touch_at(dfd, &layers::whiteout(name))
    }

    /// Get directory node `parent` ready for a new entry `name`: in the
    /// upper directory, with no whiteout of that name. Returns its
    /// descriptor, whether the layers hold a directory there (a new
    /// directory must then be opaque) and whether a whiteout was removed.
    pub(super) fn prepare_create(
        &self,
        parent: INodeNo,
        name: &[u8],
    ) -> Result<(Arc<OwnedFd>, bool, bool), Errno> {
        if layers::is_hidden(name) {
            // Not representable in a layer (OCI has no escape for it).
            return Err(Errno::EINVAL);
        }
        let pfd = self.copy_up(parent.0)?;
        let p = pfd.as_fd();
        let wh = layers::whiteout(name);
        let had_whiteout = exists_at(p, &wh);
        if had_whiteout {
            unlink_at(p, &wh, false)?;
        }
        let dir = self.node(parent)?;
        let lower_dir = matches!(self.lower_child_of(&dir, name)?, Some(Found::Dir(_)));
        Ok((pfd, lower_dir, had_whiteout))
    }

    /// Remove the upper bookkeeping (whiteouts, opaque marker) of a
    /// directory that is empty in the merged view, so it can be removed or
    /// replaced.
    pub(super) fn clear_dir(&self, dfd: BorrowedFd<'_>) -> Result<(), Errno> {
        for e in read_dir(dfd)? {
            let e = e.map_err(|e| errno_of(&e))?;
            let name = e.file_name().as_bytes().to_vec();
            if layers::is_hidden(&name) {
                unlink_at(dfd, &name, false)?;
            } else {
                return Err(Errno::ENOTEMPTY);
            }
        }
        Ok(())
    }
}
