//! Where image bytes come from.
//!
//! A [`Source`] reads byte ranges at offsets; nothing else. The local file
//! implementation uses `pread` (never mmap, so a file truncated under a
//! reader yields an error, not SIGBUS). Remote sources (HTTP, a cache) will
//! implement the same trait.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Random-access bytes of one image.
pub trait Source: Send + Sync {
    /// Total length in bytes.
    fn len(&self) -> u64;
    /// Whether the source is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Fill `buf` from `offset`; a short source is an `UnexpectedEof` error.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Name used in messages (a path or URL).
    fn name(&self) -> &str;
}

/// A local image file read with `pread`.
#[derive(Debug)]
pub struct FileSource {
    file: File,
    len: u64,
    name: String,
}

impl FileSource {
    /// Open `path` for reading.
    pub fn open(path: &Path) -> io::Result<Self> {
        let file = File::open(path)?;
        let md = file.metadata()?;
        if md.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "is a directory",
            ));
        }
        Ok(FileSource {
            len: md.len(),
            file,
            name: path.display().to_string(),
        })
    }
}

impl Source for FileSource {
    fn len(&self) -> u64 {
        self.len
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }
    fn name(&self) -> &str {
        &self.name
    }
}

/// An image held in memory (tests, fuzzing, embedding).
#[derive(Debug, Clone)]
pub struct MemSource {
    bytes: Vec<u8>,
    name: String,
}

impl MemSource {
    /// Wrap bytes under a display name.
    pub fn new(bytes: Vec<u8>, name: impl Into<String>) -> Self {
        MemSource {
            bytes,
            name: name.into(),
        }
    }
}

impl Source for MemSource {
    fn len(&self) -> u64 {
        self.bytes.len() as u64
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        let end = start.checked_add(buf.len());
        match end.filter(|&e| e <= self.bytes.len()) {
            Some(e) => {
                buf.copy_from_slice(&self.bytes[start..e]);
                Ok(())
            }
            None => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "read past end",
            )),
        }
    }
    fn name(&self) -> &str {
        &self.name
    }
}

/// Wraps a source and counts the requests and bytes read through it
/// (for `sheaf stats`: how much of the image a workload touched).
pub struct CountingSource {
    inner: std::sync::Arc<dyn Source>,
    /// Read requests made.
    pub reads: std::sync::atomic::AtomicU64,
    /// Bytes read.
    pub bytes: std::sync::atomic::AtomicU64,
}

impl CountingSource {
    /// Count reads of `inner`.
    pub fn new(inner: std::sync::Arc<dyn Source>) -> Self {
        CountingSource {
            inner,
            reads: Default::default(),
            bytes: Default::default(),
        }
    }
}

impl Source for CountingSource {
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        use std::sync::atomic::Ordering::Relaxed;
        self.reads.fetch_add(1, Relaxed);
        self.bytes.fetch_add(buf.len() as u64, Relaxed);
        self.inner.read_exact_at(buf, offset)
    }
    fn name(&self) -> &str {
        self.inner.name()
    }
}
