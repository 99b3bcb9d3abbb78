//! What the two executables of the sheaf command share.
//!
//! `sheaf` (src/bin/sheaf.rs) is small on purpose: after `drop_caches`, loading
//! the whole tool (15 MB, read ahead 8 MiB at a time on common disks) was
//! most of a cold mount's time. It mounts local images itself and hands
//! every other command to `sheaf-full` (src/main.rs), the whole tool, with
//! the same arguments. Everything both need lives here, once: the mount
//! option language, serving a mount from a background process, path lists.

pub mod front;
pub mod options;
pub mod paths;
pub mod serve;
