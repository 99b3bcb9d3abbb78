//! User and group names of this machine: `sheaf_read::ident`, where the
//! find engine that needs them lives.

pub use sheaf_read::ident::Names;
