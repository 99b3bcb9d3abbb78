//! An image's bytes read through a Python callable `(offset, length) ->
//! bytes`: how a chained fsspec URL over a protocol sheaf has no reader of
//! its own for (s3, gcs, memory, ...) reaches the image. The bytes are
//! verified as any others: the callable can fail a read, never change one.

use pyo3::prelude::*;
use pyo3::types::PyBytes;
use sheaf_read::Source;
use std::io;

/// A [`Source`] over a Python callable.
pub struct PySource {
    name: String,
    len: u64,
    read: Py<PyAny>,
}

impl PySource {
    /// `read(offset, length)` returns up to `length` bytes from `offset`.
    pub fn new(name: String, len: u64, read: &Py<PyAny>) -> PySource {
        let read = Python::attach(|py| read.clone_ref(py));
        PySource { name, len, read }
    }
}

impl Source for PySource {
    fn len(&self) -> u64 {
        self.len
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        Python::attach(|py| -> io::Result<()> {
            let r = self
                .read
                .call1(py, (offset, buf.len()))
                .map_err(|e| io::Error::other(e.to_string()))?;
            let b = r
                .cast_bound::<PyBytes>(py)
                .map_err(|_| io::Error::other("the reader returned no bytes"))?
                .as_bytes();
            if b.len() < buf.len() {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("short read at {offset}"),
                ));
            }
            buf.copy_from_slice(&b[..buf.len()]);
            Ok(())
        })
    }

    fn name(&self) -> &str {
        &self.name
    }
}
