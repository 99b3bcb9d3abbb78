//! What the small `sheaf` executable links, and nothing more.
//!
//! `sheaf` (sheaf-cli's src/bin/sheaf.rs) is small on purpose: after
//! `drop_caches`, loading the whole tool (15 MB, read ahead 8 MiB at a time
//! on common disks) was most of a cold mount's time. It mounts local images
//! itself ([`front`]) and hands every other command to `sheaf-full`, the
//! whole tool ([`sheaf_cli::run`](../sheaf_cli/fn.run.html)), with the same
//! arguments. This crate is what both need, once: the mount option language
//! ([`options`]), serving a mount from a background process ([`serve`]),
//! path lists ([`paths`]). It is a crate of its own so that `sheaf` links
//! none of the whole tool: an executable that links a library crate loads
//! every object of it that a symbol it uses lives in, and keeps their
//! exception tables whole (the tool in `sheaf-cli`'s library made `sheaf`
//! 354 KB larger).

pub mod front;
pub mod kernel;
pub mod options;
pub mod paths;
pub mod serve;
