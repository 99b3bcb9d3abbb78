//! What a build reads: the kinds of input. Its own module so that the
//! options (which every input reader uses) do not depend on the readers.

use std::path::PathBuf;

/// Where the tree comes from.
#[derive(Debug, Clone)]
pub enum Input {
    /// A directory on a local filesystem.
    Dir(PathBuf),
    /// A tar archive file (compression detected from its first bytes).
    TarFile(PathBuf),
    /// A tar stream on standard input.
    TarStdin,
    /// The upper directory of a writable overlay, packed as a layer (see
    /// [`crate::upper`]): like [`Input::Dir`], but the overlay's temporary
    /// files are left out and every whiteout must be an empty regular file.
    /// The caller holds [`sheaf_format::layers::lock`] (shared) meanwhile.
    Upper(PathBuf),
    /// Entries from a caller's walk (e.g. the merged view of stacked
    /// images, [`crate::stack_input::StackSource`]), packed in the order
    /// given (see [`crate::entries`]).
    Entries(std::sync::Arc<dyn crate::entries::EntrySource>),
}
