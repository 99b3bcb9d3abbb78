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
    /// A caller's tar stream, already decompressed, read as an image layer
    /// (see [`TarStream`]).
    Layer(TarStream),
}

/// A decompressed tar stream handed over by a caller that keeps a handle on
/// it: the build reads entries until the archive's end, and the caller then
/// reads what is left (e.g. to finish a digest over the whole stream).
///
/// It is read as an OCI image layer: an archive with no entries is a valid,
/// empty layer, and an absolute path is refused like one that climbs out
/// with `..` (layers hold relative paths; a tool that strips the `/`
/// silently would apply the layer somewhere its author did not mean).
#[derive(Clone)]
pub struct TarStream {
    /// How errors name the stream (e.g. `layer sha256:ab12…`).
    pub name: String,
    /// The stream; locked for each read.
    pub reader: std::sync::Arc<std::sync::Mutex<Box<dyn std::io::Read + Send>>>,
}

impl std::fmt::Debug for TarStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TarStream")
            .field("name", &self.name)
            .finish()
    }
}

impl std::io::Read for &TarStream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.reader
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .read(buf)
    }
}
