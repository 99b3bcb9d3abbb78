//! Serving sheaf images as FUSE filesystems: one image read-only, or a stack
//! of them, optionally writable through an upper directory.
//!
//! Owns the kernel-facing side of a mount: [`fs`] (answers FUSE requests from
//! an [`sheaf_read::Image`] and tells the kernel to cache everything forever,
//! since an image never changes), `listing` (which listings carry files'
//! attributes), [`readahead`] (detects sequential access and
//! decompresses the next block in the background), [`stats`] (per-op counters
//! and latencies, exposed through a hidden xattr on the root), [`kernel`]
//! (mounting through `fusermount3` or directly, unmounting, reading
//! `/proc/self/mountinfo`), [`serve`] (run a session until it is unmounted or
//! signalled), [`union`] (a stack of images, optionally writable through an
//! upper directory), [`namespace`] (private mount namespaces for
//! `sheaf run`), [`request`] (the typed mount request one process hands
//! a child `sheaf mount`, its images pinned to checked roots) and
//! [`control`] (the client of the control protocol the filesystems answer
//! on their root: statistics, the serving pid, waiting for it to exit).
//!
//! It must not know how images are built, where their bytes come from (that is
//! the [`sheaf_read::Source`] behind the image) or how options are spelled on a
//! command line: the CLI parses user input into a [`serve::MountConfig`].

#![warn(missing_docs)]

pub mod container;
pub mod control;
pub mod erofs;
pub mod fs;
pub mod kernel;
mod listing;
pub mod logging;
pub mod namespace;
pub mod readahead;
pub mod request;
pub mod serve;
pub mod stats;
pub mod union;

pub use control::is_dead;
pub use fs::{FsConfig, Readdirplus, SheafFs};
/// What a mounted filesystem implements (re-exported for callers of [`serve::mount`]).
pub use fuser::Filesystem;
pub use request::{MountRequest, RequestImage};
pub use serve::{MountConfig, MountError, Mounted};
pub use union::{UnionConfig, UnionError, UnionFs};

/// Name of the hidden xattr on the mount's root that returns live statistics
/// as JSON (read by `sheaf stats`); it is never listed by `listxattr`.
pub const STATS_XATTR: &str = "user.sheaf.stats";
/// Hidden xattr on the root that returns the serving process id.
pub const PID_XATTR: &str = "user.sheaf.pid";

/// Largest answer of the control ioctls (the 14-bit size field of an ioctl
/// number bounds it).
pub const CONTROL_LEN: usize = (16 << 10) - 1;
/// Linux `_IOR(type, nr, [u8; CONTROL_LEN])`.
const fn ior(nr: u32) -> u32 {
    (2 << 30) | ((CONTROL_LEN as u32) << 16) | ((b'S' as u32) << 8) | nr
}
/// ioctl on the mount's root directory answering what [`STATS_XATTR`]
/// does, NUL-terminated: a mount whose image has no xattrs answers getxattr
/// with ENOSYS (the kernel then stops asking, which makes `ls -l` as fast as
/// on a kernel filesystem), so the hidden xattrs are not reachable there.
pub const STATS_IOCTL: u32 = ior(1);
/// ioctl on the root answering what [`PID_XATTR`] does.
pub const PID_IOCTL: u32 = ior(2);

/// Answer a control ioctl from the hidden xattr it stands for (`hidden`
/// gives the value of a hidden name, None off the root): NUL-terminated,
/// E2BIG if it does not fit `out_size`, ENOTTY for any other ioctl.
pub(crate) fn reply_control(
    cmd: u32,
    out_size: u32,
    hidden: impl FnOnce(&[u8]) -> Option<Vec<u8>>,
    reply: fuser::ReplyIoctl,
) {
    let name = match cmd {
        STATS_IOCTL => STATS_XATTR,
        PID_IOCTL => PID_XATTR,
        _ => return reply.error(fuser::Errno::ENOTTY),
    };
    match hidden(name.as_bytes()) {
        Some(mut v) if v.len() < out_size as usize => {
            v.push(0);
            reply.ioctl(0, &v)
        }
        Some(_) => reply.error(fuser::Errno::E2BIG),
        None => reply.error(fuser::Errno::ENOTTY),
    }
}
