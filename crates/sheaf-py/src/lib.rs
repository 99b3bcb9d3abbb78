//! The sheaf Python package's native module, `sheaf._sheaf`: images read
//! from Python without FUSE, through the same library crates as the CLI.
//!
//! Owns the mapping between Python and the readers: opening an image the
//! way every command does ([`sheaf_net::open_image`] under the same node
//! cache and URL forms, then the site signature policy of
//! [`sheaf_trust::Policy`]), stacks `A,B` ([`sheaf_read::Stack`]), and the
//! conversion of every error into a Python exception whose message is the
//! CLI's one line ([`error`]). The Python layer (python/sheaf) adds file
//! objects, `walk` and the fsspec filesystem on top of [`Image`].
//!
//! Nothing here may unwind into Python: every entry point runs its Rust
//! work under `catch_unwind` ([`error::guard`]), so a bug reached by hostile
//! input is an exception, never an abort. Reads release the GIL.

mod error;
mod pysource;
mod view;

use error::{guard, Error};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};
use sheaf_read::Inode;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use view::View;

/// An open image (or a stack of images, `A,B`): `sheaf.open` returns one.
#[pyclass(frozen, module = "sheaf._sheaf")]
struct Image {
    view: Arc<View>,
}

/// A regular file of an image: reads at an offset, the GIL released. The
/// Python layer wraps it in an `io.RawIOBase`.
#[pyclass(frozen, module = "sheaf._sheaf")]
struct Handle {
    view: Arc<View>,
    layer: usize,
    ino: Inode,
    #[pyo3(get)]
    name: String,
}

/// Where and how to open: the arguments of `sheaf.open`.
struct OpenArgs {
    source: String,
    require_signature: bool,
    signers: Option<PathBuf>,
    identity: Option<String>,
    cache: Option<view::CacheArg>,
    reader: Option<Py<PyAny>>,
}

/// Open an image: a path, an `http(s)://` or `ssh://` URL, a published
/// repository's index, or a stack `A,B` (later layers win). The site's
/// signature policy applies (`SHEAF_CONFIG`, else /etc/sheaf/config.toml);
/// `require_signature` and `signers` add to it, never relax it. `cache`:
/// None for the node cache the CLI uses, a directory, or False for none.
/// `reader`: a callable `(offset, length) -> bytes` to read the image's
/// bytes from instead (any file fsspec can open); `source` then only names
/// it in messages.
#[pyfunction]
#[pyo3(signature = (source, *, require_signature=None, signers=None, identity=None, cache=None, reader=None, size=None))]
#[allow(clippy::too_many_arguments)]
fn open(
    py: Python<'_>,
    source: PathBuf,
    require_signature: Option<bool>,
    signers: Option<PathBuf>,
    identity: Option<String>,
    cache: Option<Bound<'_, PyAny>>,
    reader: Option<Py<PyAny>>,
    size: Option<u64>,
) -> PyResult<Image> {
    let cache = match cache {
        None => None,
        Some(c) if c.is_instance_of::<pyo3::types::PyBool>() => {
            if c.extract::<bool>()? {
                None
            } else {
                Some(view::CacheArg::Off)
            }
        }
        Some(c) => Some(view::CacheArg::Dir(c.extract::<PathBuf>()?)),
    };
    if reader.is_some() && size.is_none() {
        return Err(pyo3::exceptions::PyValueError::new_err(
            "reader= needs size= (the image's length in bytes)",
        ));
    }
    let a = OpenArgs {
        source: source.to_string_lossy().into_owned(),
        require_signature: require_signature.unwrap_or(false),
        signers,
        identity,
        cache,
        reader,
    };
    let view = py
        .detach(|| guard(|| View::open(&a, size)))
        .map_err(|e| e.into_py(py))?;
    Ok(Image {
        view: Arc::new(view),
    })
}

fn path_bytes(p: &std::path::Path) -> Vec<u8> {
    use std::os::unix::ffi::OsStrExt;
    p.as_os_str().as_bytes().to_vec()
}

/// A name from an image as Python shows names (undecodable bytes as
/// surrogates, as `os.listdir` does).
fn os_name(name: &[u8]) -> std::ffi::OsString {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::OsStr::from_bytes(name).to_os_string()
}

/// An entry's attributes, as `os.stat_result` names them (`st_mode`,
/// `st_size`, `st_mtime`, `st_mtime_ns`, ...), plus `type`, `target` (a
/// symlink's) and `layer` (of a stack). An image keeps one time: atime
/// and ctime are the mtime, as a mount shows them.
#[pyclass(frozen, eq, module = "sheaf", name = "Stat")]
#[derive(PartialEq)]
struct Stat {
    /// Type and permission bits (`stat.S_ISDIR(st.st_mode)` works).
    #[pyo3(get)]
    st_mode: u32,
    /// The inode number in its image.
    #[pyo3(get)]
    st_ino: u32,
    /// Always 0: an image is no device.
    #[pyo3(get)]
    st_dev: u64,
    #[pyo3(get)]
    st_nlink: u32,
    #[pyo3(get)]
    st_uid: u32,
    #[pyo3(get)]
    st_gid: u32,
    /// stat(2)'s size: 0 for devices, fifos and sockets.
    #[pyo3(get)]
    st_size: u64,
    /// 512-byte blocks: the size rounded up, as a mount shows.
    #[pyo3(get)]
    st_blocks: u64,
    /// 4096, as a mount shows.
    #[pyo3(get)]
    st_blksize: u32,
    /// A device's number (`os.major`, `os.minor`), else 0.
    #[pyo3(get)]
    st_rdev: u64,
    mtime_sec: i64,
    mtime_nsec: u32,
    /// file, directory, symlink, char-device, block-device, fifo, socket.
    #[pyo3(get, name = "type")]
    kind: &'static str,
    /// The layer of a stack it is shown from (0 for one image).
    #[pyo3(get)]
    layer: usize,
    target: Option<std::ffi::OsString>,
}

impl Stat {
    fn new(s: &view::Stat) -> Stat {
        use sheaf_format::FileType as Ft;
        let r = &s.ino.rec;
        let kind = s.ino.file_type();
        Stat {
            st_mode: r.mode,
            st_ino: s.ino.ino,
            st_dev: 0,
            st_nlink: r.nlink,
            st_uid: r.uid,
            st_gid: r.gid,
            st_size: s.ino.stat_size(),
            st_blocks: s.ino.stat_blocks(),
            st_blksize: 4096,
            st_rdev: match kind {
                Ft::CharDevice | Ft::BlockDevice => r.data,
                _ => 0,
            },
            mtime_sec: r.mtime_sec,
            mtime_nsec: r.mtime_nsec,
            kind: kind.name(),
            layer: s.layer,
            target: s.target.as_deref().map(os_name),
        }
    }

    fn ns(&self) -> i128 {
        i128::from(self.mtime_sec) * 1_000_000_000 + i128::from(self.mtime_nsec)
    }

    fn secs(&self) -> f64 {
        self.mtime_sec as f64 + f64::from(self.mtime_nsec) / 1e9
    }
}

#[pymethods]
impl Stat {
    /// The attributes an image keeps; the rest follow from them as a
    /// mount shows them. What pickling calls (`__reduce__`), so stat
    /// results reach a data loader's worker processes as
    /// `os.stat_result`'s do.
    #[new]
    #[pyo3(signature = (st_mode, st_ino, st_nlink, st_uid, st_gid, st_size, st_rdev, st_mtime_ns, r#type, layer=0, target=None))]
    #[allow(clippy::too_many_arguments)]
    fn py_new(
        st_mode: u32,
        st_ino: u32,
        st_nlink: u32,
        st_uid: u32,
        st_gid: u32,
        st_size: u64,
        st_rdev: u64,
        st_mtime_ns: i128,
        r#type: &str,
        layer: usize,
        target: Option<std::ffi::OsString>,
    ) -> PyResult<Stat> {
        use sheaf_format::FileType as Ft;
        let kind = [
            Ft::Regular,
            Ft::Directory,
            Ft::Symlink,
            Ft::CharDevice,
            Ft::BlockDevice,
            Ft::Fifo,
            Ft::Socket,
        ]
        .into_iter()
        .map(Ft::name)
        .find(|n| *n == r#type)
        .ok_or_else(|| {
            pyo3::exceptions::PyValueError::new_err(
                format!("type {type:?}: not a file type", type = r#type),
            )
        })?;
        let sec = i64::try_from(st_mtime_ns.div_euclid(1_000_000_000))
            .map_err(|_| pyo3::exceptions::PyValueError::new_err("st_mtime_ns out of range"))?;
        Ok(Stat {
            st_mode,
            st_ino,
            st_dev: 0,
            st_nlink,
            st_uid,
            st_gid,
            st_size,
            st_blocks: st_size.div_ceil(512),
            st_blksize: 4096,
            st_rdev,
            mtime_sec: sec,
            mtime_nsec: st_mtime_ns.rem_euclid(1_000_000_000) as u32,
            kind,
            layer,
            target,
        })
    }

    #[allow(clippy::type_complexity)]
    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> (
        Bound<'py, pyo3::types::PyType>,
        (
            u32,
            u32,
            u32,
            u32,
            u32,
            u64,
            u64,
            i128,
            &'static str,
            usize,
            Option<std::ffi::OsString>,
        ),
    ) {
        let s = slf.get();
        (
            slf.get_type(),
            (
                s.st_mode,
                s.st_ino,
                s.st_nlink,
                s.st_uid,
                s.st_gid,
                s.st_size,
                s.st_rdev,
                s.ns(),
                s.kind,
                s.layer,
                s.target.clone(),
            ),
        )
    }

    /// Modification time in seconds (a float), as `os.stat_result`'s.
    #[getter]
    fn st_mtime(&self) -> f64 {
        self.secs()
    }
    /// The mtime: an image keeps no access time.
    #[getter]
    fn st_atime(&self) -> f64 {
        self.secs()
    }
    /// The mtime: an image keeps no change time.
    #[getter]
    fn st_ctime(&self) -> f64 {
        self.secs()
    }
    /// Modification time in nanoseconds (an int).
    #[getter]
    fn st_mtime_ns(&self) -> i128 {
        self.ns()
    }
    #[getter]
    fn st_atime_ns(&self) -> i128 {
        self.ns()
    }
    #[getter]
    fn st_ctime_ns(&self) -> i128 {
        self.ns()
    }
    /// A symlink's target, else None.
    #[getter]
    fn target(&self) -> Option<std::ffi::OsString> {
        self.target.clone()
    }

    fn __repr__(&self) -> String {
        format!(
            "sheaf.Stat(type={:?}, st_mode=0o{:o}, st_ino={}, st_nlink={}, st_uid={}, st_gid={}, st_size={}, st_mtime_ns={}{})",
            self.kind,
            self.st_mode,
            self.st_ino,
            self.st_nlink,
            self.st_uid,
            self.st_gid,
            self.st_size,
            self.ns(),
            match &self.target {
                Some(t) => format!(", target={:?}", t.to_string_lossy()),
                None => String::new(),
            }
        )
    }
}

fn stat_obj<'py>(py: Python<'py>, s: &view::Stat) -> PyResult<Bound<'py, Stat>> {
    Bound::new(py, Stat::new(s))
}

/// The thread pool of `read_many(threads=N)`: one, kept for the N last
/// asked. Another N replaces it (the old pool's threads end once the
/// calls using it return), so however many different N a program passes,
/// at most one pool stands (issue 53: one pool per N, kept forever, left
/// 2,081 threads after N = 1..64).
fn pool(threads: usize) -> Result<Arc<rayon::ThreadPool>, Error> {
    static POOL: Mutex<Option<(usize, Arc<rayon::ThreadPool>)>> = Mutex::new(None);
    let mut m = POOL.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((n, p)) = m.as_ref() {
        if *n == threads {
            return Ok(p.clone());
        }
    }
    // Drop the old pool first: its idle threads end before new ones start.
    *m = None;
    let p = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("sheaf-read-{i}"))
        .build()
        .map_err(|e| Error::Value(format!("threads={threads}: {e}")))?;
    let p = Arc::new(p);
    *m = Some((threads, p.clone()));
    Ok(p)
}

#[pymethods]
impl Image {
    /// The root digest, hex (a stack: each layer's, bottom first, joined
    /// with ',').
    #[getter]
    fn root(&self) -> String {
        self.view
            .layers()
            .iter()
            .map(|i| sheaf_format::hex(&i.root_digest()))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The image as named to `open`.
    #[getter]
    fn source(&self) -> String {
        self.view.name().to_string()
    }

    /// Images whose server was unreachable when opened, so the index the
    /// node cache kept stood in: (name, when it was cached, in seconds
    /// since the epoch). Reads of what is cached work; others fail.
    #[getter]
    fn offline(&self) -> Vec<(String, u64)> {
        self.view.offline().to_vec()
    }

    /// How many images: 1, or the layers of a stack.
    #[getter]
    fn layers(&self) -> usize {
        self.view.layers().len()
    }

    /// `sheaf info --json`'s fields as JSON text (per layer of a stack: a
    /// JSON array). `whiteouts`: list paths the image hides (slower: reads
    /// every directory).
    #[pyo3(signature = (whiteouts=false))]
    fn info_json(&self, py: Python<'_>, whiteouts: bool) -> PyResult<String> {
        let v = self.view.clone();
        py.detach(|| guard(|| v.info_json(whiteouts)))
            .map_err(|e| e.into_py(py))
    }

    /// Stat `path` (symlinks followed when `follow_symlinks`).
    #[pyo3(signature = (path, follow_symlinks=true))]
    fn stat<'py>(
        &self,
        py: Python<'py>,
        path: PathBuf,
        follow_symlinks: bool,
    ) -> PyResult<Bound<'py, Stat>> {
        let v = self.view.clone();
        let p = path_bytes(&path);
        let s = py
            .detach(|| guard(|| v.stat(&p, follow_symlinks)))
            .map_err(|e| e.into_py(py))?;
        stat_obj(py, &s)
    }

    /// The names in directory `path`, sorted (with `detail`: (name, stat)
    /// pairs, symlinks not followed).
    #[pyo3(signature = (path=PathBuf::new(), detail=false))]
    fn listdir<'py>(
        &self,
        py: Python<'py>,
        path: PathBuf,
        detail: bool,
    ) -> PyResult<Bound<'py, PyList>> {
        let v = self.view.clone();
        let p = path_bytes(&path);
        let entries = py
            .detach(|| guard(|| v.listdir(&p, detail)))
            .map_err(|e| e.into_py(py))?;
        let out = PyList::empty(py);
        for (name, st) in entries {
            match st {
                Some(s) if detail => out.append((os_name(&name), stat_obj(py, &s)?))?,
                _ => out.append(os_name(&name))?,
            }
        }
        Ok(out)
    }

    /// The directory `path` names (symlinks followed), as a handle
    /// `list_dir` takes.
    fn opendir(&self, py: Python<'_>, path: PathBuf) -> PyResult<Dir> {
        let v = self.view.clone();
        let p = path_bytes(&path);
        let dir = py
            .detach(|| guard(|| v.opendir(&p)))
            .map_err(|e| e.into_py(py))?;
        Ok(Dir { dir })
    }

    /// The entries of the directory `dir` (a handle from `opendir` or an
    /// earlier `list_dir`): (name, stat, the subdirectory's handle or
    /// None), sorted by name. What `walk` descends with: each directory is
    /// listed from its handle, not looked up from the root by its path.
    fn list_dir<'py>(&self, py: Python<'py>, dir: &Dir) -> PyResult<Bound<'py, PyList>> {
        let v = self.view.clone();
        let d = dir.dir.clone();
        let entries = py
            .detach(|| guard(|| v.list(&d, true, true)))
            .map_err(|e| e.into_py(py))?;
        let out = PyList::empty(py);
        for (name, st, sub) in entries {
            let st = match st {
                Some(s) => stat_obj(py, &s)?.into_any(),
                None => py.None().into_bound(py),
            };
            let sub = match sub {
                Some(dir) => Bound::new(py, Dir { dir })?.into_any(),
                None => py.None().into_bound(py),
            };
            out.append((os_name(&name), st, sub))?;
        }
        Ok(out)
    }

    /// The target of symlink `path`.
    fn readlink(&self, py: Python<'_>, path: PathBuf) -> PyResult<std::ffi::OsString> {
        let v = self.view.clone();
        let p = path_bytes(&path);
        let t = py
            .detach(|| guard(|| v.readlink(&p)))
            .map_err(|e| e.into_py(py))?;
        Ok(os_name(&t))
    }

    /// A handle to regular file `path` (symlinks followed), for reads at
    /// offsets; `sheaf.Image.open` wraps it in a Python file object.
    fn handle(&self, py: Python<'_>, path: PathBuf) -> PyResult<Handle> {
        let v = self.view.clone();
        let p = path_bytes(&path);
        let (layer, ino) = py
            .detach(|| guard(|| v.file(&p)))
            .map_err(|e| e.into_py(py))?;
        Ok(Handle {
            view: self.view.clone(),
            layer,
            ino,
            name: path.to_string_lossy().into_owned(),
        })
    }

    /// The whole contents of each file of `paths` (symlinks followed), read
    /// in parallel by `threads` threads (default: one per core) with the
    /// GIL released. The first failure, in the order of `paths`, raises.
    #[pyo3(signature = (paths, threads=None))]
    fn read_many<'py>(
        &self,
        py: Python<'py>,
        paths: Vec<PathBuf>,
        threads: Option<usize>,
    ) -> PyResult<Vec<Bound<'py, PyBytes>>> {
        let v = self.view.clone();
        let paths: Vec<Vec<u8>> = paths.iter().map(|p| path_bytes(p)).collect();
        let got: Result<Vec<Vec<u8>>, Error> = py.detach(|| {
            guard(|| {
                let run = || v.read_many(&paths);
                let results = match threads {
                    None => run(),
                    Some(0) => return Err(Error::Value("threads=0: use at least 1".into())),
                    Some(n) => pool(n)?.install(run),
                };
                // The first failure in the caller's order is the one raised.
                results.into_iter().collect()
            })
        });
        let got = got.map_err(|e| e.into_py(py))?;
        Ok(got.iter().map(|b| PyBytes::new(py, b)).collect())
    }

    /// What find(1)'s expression `words` prints, walking from `start`: the
    /// engine of `sheaf find` (tests, actions, operators, -printf).
    fn find_output<'py>(
        &self,
        py: Python<'py>,
        start: PathBuf,
        words: Vec<std::ffi::OsString>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let v = self.view.clone();
        let p = path_bytes(&start);
        let out = py
            .detach(|| guard(|| v.find(&p, &words)))
            .map_err(|e| e.into_py(py))?;
        Ok(PyBytes::new(py, &out))
    }

    /// The data blocks holding regular file `path`: per stored piece,
    /// (file offset, length, block id, block offset in the image, stored
    /// length of the block); holes are not listed.
    fn blocks(&self, py: Python<'_>, path: PathBuf) -> PyResult<Vec<view::Piece>> {
        let v = self.view.clone();
        let p = path_bytes(&path);
        py.detach(|| guard(|| v.blocks(&p)))
            .map_err(|e| e.into_py(py))
    }

    fn __repr__(&self) -> String {
        format!("<sheaf.Image {:?} root {}>", self.view.name(), self.root())
    }
}

/// A directory of an image, held for listing without a lookup by path.
#[pyclass(frozen, module = "sheaf._sheaf")]
struct Dir {
    dir: sheaf_read::MergedDir,
}

#[pymethods]
impl Handle {
    /// The file's size in bytes.
    #[getter]
    fn size(&self) -> u64 {
        self.ino.rec.size
    }

    /// Up to `length` bytes from `offset` (fewer only at the end), read
    /// straight into the bytes object returned: one buffer, never a copy
    /// (a 12 GB sparse file costs 12 GB, not 24). A length that cannot be
    /// allocated is a ValueError.
    fn pread<'py>(
        &self,
        py: Python<'py>,
        offset: u64,
        length: usize,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let want = View::read_len(&self.ino, offset, length);
        let mut read = Ok(());
        let bytes = PyBytes::new_with(py, want, |buf| {
            read = py.detach(|| {
                guard(|| {
                    self.view
                        .read_into(self.layer, &self.ino, offset, buf, &self.name)
                })
            });
            Ok(())
        })
        .map_err(|e| {
            if e.is_instance_of::<pyo3::exceptions::PyMemoryError>(py) {
                pyo3::exceptions::PyValueError::new_err(format!(
                    "{}: a read of {want} bytes does not fit in memory",
                    self.name
                ))
            } else {
                e
            }
        })?;
        read.map_err(|e| e.into_py(py))?;
        Ok(bytes)
    }
}

/// The module `sheaf._sheaf`.
#[pymodule]
fn _sheaf(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(open, m)?)?;
    m.add_class::<Image>()?;
    m.add_class::<Handle>()?;
    m.add_class::<Dir>()?;
    m.add_class::<Stat>()?;
    m.add("IntegrityError", m.py().get_type::<error::IntegrityError>())?;
    m.add(
        "NotAnImageError",
        m.py().get_type::<error::NotAnImageError>(),
    )?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
