//! The `sheaf` command line: argument parsing, help, terminals, exit codes.
//!
//! Two executables: `sheaf` (src/bin/sheaf.rs) is small on purpose and
//! links only `sheaf-front` (why: that crate's documentation): it mounts
//! local images itself and hands every other command to `sheaf-full`
//! (src/main.rs), the whole tool, with the same arguments. This library is
//! the whole tool as a function, [`run`], which `sheaf-full` calls with the
//! process's arguments and streams and tests call in-process with buffers
//! ([`Io`]).

/// `sheaf-front`'s modules, where the tool's commands have always found them.
pub use sheaf_front::{front, options, paths, serve};

mod app;
mod bcast;
mod build;
mod docs;
mod du;
mod extract;
mod find;
mod ident;
mod import;
mod inspect;
mod layers;
mod mount;
mod pool;
mod remote;
mod run;
mod snapshotter;
mod trust;
mod util;

pub use app::{run, Io, IO_COMMANDS};
