//! Errors as Python exceptions: each failure becomes the exception Python
//! code expects for it (`FileNotFoundError`, `IsADirectoryError`,
//! `PermissionError` for policy refusals, `sheaf.IntegrityError` for bytes
//! that fail verification), with `errno` set and the CLI's one-line message.

use pyo3::exceptions::{
    PyFileNotFoundError, PyIsADirectoryError, PyNotADirectoryError, PyOSError, PyPermissionError,
    PyValueError,
};
use pyo3::prelude::*;
use sheaf_net::OpenError;
use sheaf_read::ReadError;
use sheaf_trust::PolicyError;

pyo3::create_exception!(
    sheaf,
    IntegrityError,
    PyOSError,
    "The image's bytes failed verification (corrupt, truncated, hostile or changed): nothing unverified is ever returned."
);

pyo3::create_exception!(
    sheaf,
    NotAnImageError,
    PyOSError,
    "The file is not a sheaf image (a text file, a tar, a SquashFS image...): its first bytes are not a sheaf image's or an image index's. errno EINVAL."
);

/// Why an operation failed.
#[derive(Debug)]
pub enum Error {
    /// From the reader.
    Read(ReadError),
    /// From opening (file, URL, node cache).
    Open(OpenError),
    /// The signature policy refused the image or could not be read.
    Policy(PolicyError),
    /// A file operation on a directory.
    IsDir(String),
    /// A directory operation on something else.
    NotDir(String),
    /// A file operation on something that is neither a file nor a directory.
    NotAFile(String),
    /// A bad argument.
    Value(String),
    /// A bug: Rust code panicked (caught, never unwound into Python).
    Panic(String),
}

impl From<ReadError> for Error {
    fn from(e: ReadError) -> Self {
        Error::Read(e)
    }
}

impl From<OpenError> for Error {
    fn from(e: OpenError) -> Self {
        match e {
            OpenError::Read(r) => Error::Read(r),
            e => Error::Open(e),
        }
    }
}

impl From<sheaf_read::find::FindError> for Error {
    fn from(e: sheaf_read::find::FindError) -> Self {
        use sheaf_read::find::FindError as F;
        match e {
            F::Expr(m) => Error::Value(m),
            F::Walk(r) | F::Read(r) => Error::Read(r),
            F::Io(e) => Error::Value(e.to_string()),
        }
    }
}

impl From<PolicyError> for Error {
    fn from(e: PolicyError) -> Self {
        Error::Policy(e)
    }
}

/// What kind of Python exception.
enum Kind {
    NotFound,
    IsDir,
    NotDir,
    Permission,
    Integrity,
    NotAnImage,
    Os,
    Value,
}

/// An error and its causes on one line, credentials redacted (as the CLI
/// prints it after "sheaf: error: ").
fn one_line(e: &(dyn std::error::Error + 'static)) -> String {
    sheaf_net::redact_text(&sheaf_format::one_line(e))
}

fn io_kind(e: &std::io::Error) -> (Kind, i32) {
    use std::io::ErrorKind as K;
    match e.kind() {
        K::NotFound => (Kind::NotFound, libc::ENOENT),
        K::PermissionDenied => (Kind::Permission, libc::EACCES),
        K::IsADirectory => (Kind::IsDir, libc::EISDIR),
        K::NotADirectory => (Kind::NotDir, libc::ENOTDIR),
        _ => (Kind::Os, e.raw_os_error().unwrap_or(libc::EIO)),
    }
}

fn read_kind(e: &ReadError) -> (Kind, i32) {
    match e {
        ReadError::NotFound(_) => (Kind::NotFound, libc::ENOENT),
        ReadError::NotADirectory(_) => (Kind::NotDir, libc::ENOTDIR),
        ReadError::NotAFile(_) => (Kind::Os, libc::EINVAL),
        ReadError::NotASymlink(_) => (Kind::Os, libc::EINVAL),
        ReadError::TooManyLinks(_) => (Kind::Os, libc::ELOOP),
        ReadError::Io { cause, .. } => match io_kind(cause) {
            // A source that vanished mid-read is an I/O error, not a
            // missing entry.
            (Kind::NotFound, _) => (Kind::Os, libc::EIO),
            k => k,
        },
        // Bytes that do not begin as an image does: another kind of file
        // (the reader's message says which, and the command meant), not a
        // damaged image. A bad magic elsewhere (an image index's) is too.
        ReadError::NotAnImage { .. } => (Kind::NotAnImage, libc::EINVAL),
        ReadError::Format {
            err: sheaf_format::FormatError::BadMagic(_),
            ..
        } => (Kind::NotAnImage, libc::EINVAL),
        // An inode number beyond the table comes only from a damaged or
        // hostile image.
        ReadError::Format { .. } | ReadError::NoInode(_) => (Kind::Integrity, libc::EIO),
        ReadError::RootChanged { .. } => (Kind::Permission, libc::EACCES),
    }
}

impl Error {
    fn kind_and_message(&self) -> (Kind, i32, String) {
        match self {
            Error::Read(e) => {
                let (k, n) = read_kind(e);
                (k, n, one_line(e))
            }
            Error::Open(e) => {
                let (k, n) = match e {
                    // The reader refuses a directory as InvalidInput ("is a
                    // directory"); Python code expects IsADirectoryError.
                    OpenError::Local { source, path }
                        if source.kind() == std::io::ErrorKind::InvalidInput
                            && std::path::Path::new(path).is_dir() =>
                    {
                        (Kind::IsDir, libc::EISDIR)
                    }
                    OpenError::Local { source, .. } | OpenError::Remote { source, .. } => {
                        io_kind(source)
                    }
                    OpenError::Cache(source) => {
                        (Kind::Os, source.raw_os_error().unwrap_or(libc::EIO))
                    }
                    OpenError::Read(r) => read_kind(r),
                };
                (k, n, one_line(e))
            }
            Error::Policy(e) => {
                let (k, n) = match e {
                    PolicyError::Refused { .. } | PolicyError::NoSigners => {
                        (Kind::Permission, libc::EACCES)
                    }
                    PolicyError::ConfigMissing { .. } => (Kind::NotFound, libc::ENOENT),
                    _ => (Kind::Os, libc::EINVAL),
                };
                (k, n, one_line(e))
            }
            Error::IsDir(p) => (Kind::IsDir, libc::EISDIR, format!("{p}: is a directory")),
            Error::NotDir(p) => (Kind::NotDir, libc::ENOTDIR, format!("{p}: not a directory")),
            Error::NotAFile(p) => (Kind::Os, libc::EINVAL, p.clone()),
            Error::Value(m) => (Kind::Value, 0, m.clone()),
            Error::Panic(m) => (
                Kind::Integrity,
                libc::EIO,
                format!("internal error (please report): {m}"),
            ),
        }
    }

    /// The Python exception.
    pub fn into_py(self, py: Python<'_>) -> PyErr {
        let (kind, errno, msg) = self.kind_and_message();
        let e = match kind {
            Kind::NotFound => PyFileNotFoundError::new_err(msg),
            Kind::IsDir => PyIsADirectoryError::new_err(msg),
            Kind::NotDir => PyNotADirectoryError::new_err(msg),
            Kind::Permission => PyPermissionError::new_err(msg),
            Kind::Integrity => IntegrityError::new_err(msg),
            Kind::NotAnImage => NotAnImageError::new_err(msg),
            Kind::Os => PyOSError::new_err(msg),
            Kind::Value => return PyValueError::new_err(msg),
        };
        // str(e) stays the one line; errno is there for code that checks it.
        let _ = e.value(py).setattr("errno", errno);
        e
    }
}

/// Run `f`, turning a panic into an error: nothing unwinds into Python.
pub fn guard<T>(f: impl FnOnce() -> Result<T, Error>) -> Result<T, Error> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => Err(Error::Panic(
            p.downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into()),
        )),
    }
}
