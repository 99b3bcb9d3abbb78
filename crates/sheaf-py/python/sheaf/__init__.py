"""Read sheaf images from Python, without FUSE.

    import sheaf
    img = sheaf.open("dataset.sheaf")          # or https://..., ssh://..., A,B
    img.listdir("sub-01")
    with img.open("sub-01/T1w.nii.gz") as f:   # a seekable binary file
        head = f.read(352)
    blobs = img.read_many(paths, threads=8)    # parallel, GIL released

Every byte returned has been verified against the image's digests; a
damaged image raises ``sheaf.IntegrityError``, never returns wrong bytes.
The site's signature policy applies as it does to the ``sheaf`` command
(``SHEAF_CONFIG``, else /etc/sheaf/config.toml): a refused image raises
``PermissionError``. See docs/python.md.
"""

import io as _io
import json as _json
import os as _os
import posixpath as _posixpath
import typing as _t

from . import _sheaf
from ._sheaf import IntegrityError, NotAnImageError, Stat

__all__ = [
    "open",
    "open_reader",
    "Image",
    "RawFile",
    "Stat",
    "Info",
    "IntegrityError",
    "NotAnImageError",
    "OfflineWarning",
    "__version__",
]
__version__ = _sheaf.__version__

_PathLike = _t.Union[str, bytes, "_os.PathLike[str]"]


class Info(_t.TypedDict):
    """What ``sheaf info --json`` prints (``Image.info``)."""

    image: str
    image_bytes: int
    root_digest: str
    inodes: int
    entries_by_type: _t.Optional[_t.Dict[str, int]]
    hardlinked_inodes: _t.Optional[int]
    logical_bytes: int
    stored_data_bytes: int
    compression_ratio: float
    dedup_bytes: _t.Optional[int]
    hole_bytes: _t.Optional[int]
    blocks: int
    blocks_by_codec: _t.Optional[_t.Dict[str, int]]
    stored_by_codec: _t.Optional[_t.Dict[str, int]]
    block_size: int
    page_size: int
    metadata_bytes_uncompressed: int
    build: _t.Dict[str, _t.Any]
    signatures: _t.List[_t.Dict[str, str]]
    prefetch_blocks: int
    whiteouts: _t.Optional[_t.List[str]]
    opaque_dirs: _t.Optional[_t.List[str]]
    sections: _t.List[_t.Dict[str, _t.Any]]


def _norm(path: _PathLike) -> str:
    # The one path convention: relative to the image's root, no leading or
    # trailing '/'; '' (or '/') is the root.
    p = _os.fsdecode(_os.fspath(path))
    return p.strip("/")


class RawFile(_io.RawIOBase):
    """A regular file of an image as a raw binary file: ``readinto``,
    ``seek`` and ``tell``; ``_io.BufferedReader`` takes it as it is. Reads
    release the GIL."""

    def __init__(self, handle: "_sheaf.Handle", name: str):
        super().__init__()
        self._h = handle
        self._pos = 0
        self._size = handle.size
        self.name = name
        self.mode = "rb"

    @property
    def size(self) -> int:
        return self._size

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def readinto(self, b) -> int:
        self._checkClosed()
        m = memoryview(b).cast("B")
        data = self._h.pread(self._pos, len(m))
        n = len(data)
        m[:n] = data
        self._pos += n
        return n

    def read(self, size: int = -1) -> bytes:
        self._checkClosed()
        if size is None or size < 0:
            size = max(self._size - self._pos, 0)
        data = self._h.pread(self._pos, size)
        self._pos += len(data)
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def pread(self, offset: int, size: int) -> bytes:
        """``size`` bytes from ``offset`` (fewer at the end), position unchanged."""
        self._checkClosed()
        return self._h.pread(offset, size)

    def seek(self, offset: int, whence: int = _io.SEEK_SET) -> int:
        self._checkClosed()
        if whence == _io.SEEK_SET:
            pos = offset
        elif whence == _io.SEEK_CUR:
            pos = self._pos + offset
        elif whence == _io.SEEK_END:
            pos = self._size + offset
        else:
            raise ValueError(f"invalid whence ({whence})")
        if pos < 0:
            raise OSError(22, f"negative seek position {pos}")
        self._pos = pos
        return pos

    def tell(self) -> int:
        self._checkClosed()
        return self._pos

    def fileno(self) -> int:
        raise _io.UnsupportedOperation("a file inside a sheaf image has no file descriptor")

    def __repr__(self) -> str:
        return f"<sheaf.RawFile name={self.name!r} size={self._size}>"


class Image:
    """An open image (or a stack of layers ``A,B``). Thread-safe: share one
    between threads (and open it again in each worker process). ``close()``
    or a ``with`` block lets its files and connections go; after it, every
    operation raises ``ValueError`` as a closed file's do."""

    def __init__(self, native: "_sheaf.Image"):
        self._native: _t.Optional[_sheaf.Image] = native
        self._source = native.source
        self._root = native.root

    @property
    def _img(self) -> "_sheaf.Image":
        img = self._native
        if img is None:
            raise ValueError(f"I/O operation on a closed image ({self._source})")
        return img

    @property
    def closed(self) -> bool:
        return self._native is None

    def close(self) -> None:
        """Let the image go: its file descriptor, connections and caches
        are released once the files opened from it are closed too (they
        keep reading until then, as a ZipFile's members do). Closing twice
        is allowed."""
        self._native = None

    @property
    def root(self) -> str:
        """The root digest (hex); a stack: each layer's, bottom first, joined by ','."""
        return self._root

    @property
    def source(self) -> str:
        """The image as named to ``open`` (credentials redacted)."""
        return self._source

    def info(self, whiteouts: bool = False) -> _t.Union[Info, _t.List[Info]]:
        """The fields of ``sheaf info --json`` as a dict (a list of dicts for a stack)."""
        return _json.loads(self._img.info_json(whiteouts))

    def stat(self, path: _PathLike = "", follow_symlinks: bool = True) -> "Stat":
        """Attributes of ``path`` as ``os.stat`` gives them (``st_mode``,
        ``st_size``, ``st_mtime``, ``st_mtime_ns``, ``st_ino``, ...), plus
        ``type``, ``target`` (a symlink's) and ``layer`` (of a stack)."""
        return self._img.stat(_norm(path), follow_symlinks)

    def lstat(self, path: _PathLike) -> "Stat":
        return self._img.stat(_norm(path), False)

    def exists(self, path: _PathLike) -> bool:
        try:
            self._img.stat(_norm(path), False)
            return True
        except (FileNotFoundError, NotADirectoryError):
            return False

    def isdir(self, path: _PathLike) -> bool:
        try:
            return self._img.stat(_norm(path), True).type == "directory"
        except (FileNotFoundError, NotADirectoryError):
            return False

    def isfile(self, path: _PathLike) -> bool:
        try:
            return self._img.stat(_norm(path), True).type == "file"
        except (FileNotFoundError, NotADirectoryError):
            return False

    def listdir(self, path: _PathLike = "") -> _t.List[str]:
        """The names in directory ``path``, sorted by their bytes."""
        return self._img.listdir(_norm(path), False)

    def scandir(self, path: _PathLike = "") -> _t.List[_t.Tuple[str, Stat]]:
        """(name, stat) of each entry of ``path`` (symlinks not followed)."""
        return self._img.listdir(_norm(path), True)

    def readlink(self, path: _PathLike) -> str:
        return self._img.readlink(_norm(path))

    def _walk(self, top: _PathLike = ""):
        # (directory, [(name, stat)], subdirectories to descend into, which
        # the caller may prune in place), top-down. Each directory is listed
        # from the handle its parent's listing gave (linear in the tree,
        # however deep), never looked up from the root by its path.
        top = _norm(top)
        todo = [(top, self._img.opendir(top))]
        seen = set()
        while todo:
            d, h = todo.pop()
            listed = self._img.list_dir(h)
            entries = [(name, st) for name, st, _ in listed]
            handles = {name: sub for name, _, sub in listed if sub is not None}
            dirs = []
            for name, st in entries:
                if st.type == "directory":
                    key = (st.layer, st.st_ino)
                    if key in seen:
                        raise IntegrityError(f"{self.source}: directory inode {st.st_ino} is listed twice")
                    seen.add(key)
                    dirs.append(name)
            yield d, entries, dirs
            for x in reversed(dirs):
                p = _posixpath.join(d, x)
                sub = handles.get(x)
                # A name the caller added: looked up by its path.
                todo.append((p, sub if sub is not None else self._img.opendir(p)))

    def walk(self, top: _PathLike = "") -> _t.Iterator[_t.Tuple[str, _t.List[str], _t.List[str]]]:
        """As ``os.walk`` (top-down; prune by editing ``dirnames`` in place);
        paths are relative to the image's root, '' for the root. Symlinks
        to directories are listed in ``filenames`` and not followed."""
        for d, entries, dirs in self._walk(top):
            files = [n for n, st in entries if st.type != "directory"]
            yield d, dirs, files

    def files(self, top: _PathLike = "") -> _t.List[str]:
        """Every regular file below ``top`` (paths from the root)."""
        return self.find(top, type="f")

    def find(self, top: _PathLike = "", *expr: str, name: _t.Optional[str] = None, type: _t.Optional[str] = None) -> _t.List[str]:
        """The paths below ``top`` (relative to the image's root) that
        find(1)'s expression ``expr`` selects, evaluated by the engine of
        ``sheaf find``: ``img.find("sub", "-name", "*.nii.gz", "-size",
        "+10M")``; ``name``/``type`` add ``-name``/``-type``. ``-prune``,
        ``-o``, parentheses and ``-print`` work as in find(1); for ``-printf``
        or ``-ls`` output use ``find_text``. A stack is walked in Python
        (``name`` and ``type`` only)."""
        words = [_os.fsdecode(w) for w in expr]
        if name is not None:
            words += ["-name", name]
        if type is not None:
            words += ["-type", type]
        if self._img.layers > 1:
            if expr:
                raise ValueError("find with an expression reads one image; merge a stack first (sheaf merge)")
            return self._find_walk(top, name, type)
        if any(w in ("-printf", "-ls", "-print0", "-fprint", "-fprintf", "-fls") for w in words):
            raise ValueError("find returns paths: for -printf or -ls output use find_text")
        if any(w == "-print" for w in words):
            words = ["-print0" if w == "-print" else w for w in words]
        else:
            words = (["("] + words + [")"] if words else []) + ["-print0"]
        out = self._img.find_output("/" + _norm(top), words)
        return [_os.fsdecode(p)[1:] for p in out.split(b"\0")[:-1]]

    def find_text(self, top: _PathLike = "", *expr: str) -> str:
        """What find(1)'s expression prints (``-printf``, ``-ls``,
        ``-print``), as text, by the engine of ``sheaf find``; names as they
        are, not quoted. Paths are printed as ``find`` run at the image's
        root prints them: relative to the root as ``find()`` returns them
        (``find_text("sub-01")``: ``sub-01/...``), the root itself as
        ``.`` (``find_text()``: ``.``, ``./sub-01``, ...)."""
        t = _norm(top) or "."
        return _os.fsdecode(self._img.find_output(t, [_os.fsdecode(w) for w in expr]))

    def _find_walk(self, top, name, type):
        import fnmatch

        kinds = {"f": "file", "d": "directory", "l": "symlink"}
        want = kinds.get(type, type) if type else None
        out = []
        for d, entries, _ in self._walk(top):
            for n, st in entries:
                if name is not None and not fnmatch.fnmatchcase(n, name):
                    continue
                if want is not None and st.type != want:
                    continue
                out.append(_posixpath.join(d, n))
        return out

    def open(self, path: _PathLike, mode: str = "rb", buffering: int = -1, encoding=None, errors=None, newline=None):
        """A regular file as a binary file object (``io.BufferedReader`` over
        a ``RawFile``; ``buffering=0`` gives the ``RawFile``), or text with
        ``mode='r'``. Symlinks are followed."""
        if mode not in ("r", "rb", "rt"):
            raise ValueError(f"mode {mode!r}: images are read-only ('rb' or 'r')")
        p = _norm(path)
        raw = RawFile(self._img.handle(p), p)
        if "b" in mode:
            if encoding is not None:
                raise ValueError("binary mode takes no encoding")
            if buffering == 0:
                return raw
            return _io.BufferedReader(raw, buffer_size=buffering if buffering > 1 else _io.DEFAULT_BUFFER_SIZE)
        if buffering == 0:
            raise ValueError("text mode needs buffering")
        return _io.TextIOWrapper(_io.BufferedReader(raw), encoding=encoding, errors=errors, newline=newline)

    def read_bytes(self, path: _PathLike) -> bytes:
        """The whole contents of one file, read straight into the bytes
        returned (one buffer of the file's size, no copy)."""
        h = self._img.handle(_norm(path))
        return h.pread(0, h.size)

    def read_many(self, paths: _t.Sequence[_PathLike], threads: _t.Optional[int] = None) -> _t.List[bytes]:
        """The contents of each file of ``paths``, read in parallel by
        ``threads`` threads (default: one per core) with the GIL released."""
        return self._img.read_many([_norm(p) for p in paths], threads)

    def blocks(self, path: _PathLike) -> _t.List[_t.Tuple[int, int, int, int, int]]:
        """Where file ``path``'s bytes are stored: per piece, (file offset,
        length, block id, block offset in the image, stored block length)."""
        return self._img.blocks(_norm(path))

    def __repr__(self) -> str:
        closed = " closed" if self.closed else ""
        return f"<sheaf.Image {self.source!r} root={self.root}{closed}>"

    def __enter__(self) -> "Image":
        self._img  # noqa: B018 - raises ValueError for a closed image
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False


def open(
    source: _PathLike,
    *,
    require_signature: _t.Optional[bool] = None,
    signers: _t.Optional[_PathLike] = None,
    identity: _t.Optional[str] = None,
    cache: _t.Union[None, bool, _PathLike] = None,
) -> Image:
    """Open an image: a path, an ``https://``/``http://``/``ssh://`` URL, a
    published repository, or a stack ``A,B`` (later layers win).

    ``require_signature``/``signers``/``identity`` add to the site policy
    (never relax it). ``cache``: None for the node cache the CLI uses
    (``SHEAF_CACHE_DIR``, else /var/cache/sheaf for root, ~/.cache/sheaf),
    a directory, or False for none (remote images only).
    """
    src = _os.fsdecode(_os.fspath(source))
    native = _sheaf.open(
        src,
        require_signature=require_signature,
        signers=_os.fspath(signers) if signers is not None else None,
        identity=identity,
        cache=_os.fspath(cache) if cache not in (None, True, False) else cache,
    )
    for name, since in native.offline:
        import time
        import warnings

        age = max(0, int(time.time()) - since)
        warnings.warn(f"{name} is unreachable; using the index cached {age} s ago", OfflineWarning, stacklevel=2)
    return Image(native)


class OfflineWarning(UserWarning):
    """An image's server was unreachable: the index the node cache kept
    stands in (as the CLI warns); what is cached reads, the rest fails."""


def open_reader(
    name: str,
    reader,
    size: int,
    *,
    require_signature: _t.Optional[bool] = None,
    signers: _t.Optional[_PathLike] = None,
    identity: _t.Optional[str] = None,
) -> Image:
    """Open an image whose bytes come from ``reader(offset, length) ->
    bytes`` (e.g. a file fsspec opened); ``name`` names it in messages and
    for a detached signature. The bytes are verified as always."""
    return Image(
        _sheaf.open(
            name,
            require_signature=require_signature,
            signers=_os.fspath(signers) if signers is not None else None,
            identity=identity,
            reader=reader,
            size=size,
        )
    )
