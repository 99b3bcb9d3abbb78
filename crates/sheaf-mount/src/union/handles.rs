//! Open files and directories, and how each node's opens do their I/O
//! (served here, or kernel passthrough to the upper file).

use super::view::Entry;
use super::UnionFs;
use fuser::FileHandle;
use sheaf_read::Inode;
use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

/// An open file or directory.
pub(super) enum Handle {
    /// An upper file.
    File(Arc<File>),
    /// A lower file opened for reading (no copy-up): its layer and inode,
    /// kept even if another open copies it up meanwhile.
    Lower(usize, Inode),
    /// A directory listing, taken at opendir.
    Dir(Arc<Vec<Entry>>),
}

/// How the open files of one node do their I/O: the kernel refuses
/// passthrough and cached opens of one inode at the same time, and wants
/// every passthrough open of it on the same backing file.
#[derive(Default)]
struct IoState {
    cached: u32,
    passthrough: u32,
    backing: Option<Arc<fuser::BackingId>>,
}

/// Open files by node, and each handle's node and mode.
#[derive(Default)]
pub(super) struct IoModes {
    nodes: HashMap<u64, IoState>,
    handles: HashMap<u64, (u64, bool)>,
}

impl UnionFs {
    pub(super) fn add_handle(&self, h: Handle) -> FileHandle {
        let fh = self.next_fh.fetch_add(1, Relaxed);
        self.handles.lock().expect("handles").insert(fh, h);
        FileHandle(fh)
    }

    /// The upper file open as `fh`, if it is one.
    pub(super) fn file_of(&self, fh: FileHandle) -> Option<Arc<File>> {
        match self.handles.lock().expect("handles").get(&fh.0) {
            Some(Handle::File(f)) => Some(f.clone()),
            _ => None,
        }
    }

    /// Decide how a new open of `node` does its I/O and count it: in
    /// passthrough (returning the backing file to reply with) when enabled,
    /// `file` is an upper file and no cached open of the node exists.
    pub(super) fn io_open(
        &self,
        node: u64,
        file: Option<&File>,
        register: impl FnOnce(&File) -> io::Result<fuser::BackingId>,
    ) -> Option<Arc<fuser::BackingId>> {
        let mut io = self.io.lock().expect("io");
        let st = io.nodes.entry(node).or_default();
        let want = file.filter(|_| self.passthrough.load(Relaxed) && st.cached == 0);
        let backing = match (want, &st.backing) {
            (None, _) => None,
            (Some(_), Some(b)) => Some(b.clone()),
            (Some(f), None) => match register(f) {
                Ok(b) => {
                    let b = Arc::new(b);
                    st.backing = Some(b.clone());
                    Some(b)
                }
                Err(e) => {
                    log::warn!("kernel passthrough refused ({e}); serving reads and writes");
                    self.passthrough.store(false, Relaxed);
                    None
                }
            },
        };
        if backing.is_some() {
            st.passthrough += 1;
        } else {
            st.cached += 1;
        }
        backing
    }

    /// Remember that handle `fh` of `node` was opened (after [`Self::io_open`]).
    pub(super) fn io_handle(&self, fh: FileHandle, node: u64, passthrough: bool) {
        self.io
            .lock()
            .expect("io")
            .handles
            .insert(fh.0, (node, passthrough));
    }

    /// Forget handle `fh`.
    pub(super) fn io_release(&self, fh: FileHandle) {
        let mut io = self.io.lock().expect("io");
        let Some((node, pt)) = io.handles.remove(&fh.0) else {
            return;
        };
        if let Some(st) = io.nodes.get_mut(&node) {
            if pt {
                st.passthrough = st.passthrough.saturating_sub(1);
                if st.passthrough == 0 {
                    st.backing = None;
                }
            } else {
                st.cached = st.cached.saturating_sub(1);
            }
            if st.passthrough == 0 && st.cached == 0 {
                io.nodes.remove(&node);
            }
        }
    }
}
