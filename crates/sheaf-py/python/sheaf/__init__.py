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

from __future__ import annotations

import io
import json
import os
import posixpath
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, TypedDict, Union

from . import _sheaf
from ._sheaf import IntegrityError

__all__ = ["open", "open_reader", "Image", "RawFile", "Stat", "Info", "IntegrityError", "OfflineWarning", "__version__"]
__version__ = _sheaf.__version__

PathLike = Union[str, bytes, "os.PathLike[str]"]


class Stat(TypedDict):
    """An entry's attributes (``Image.stat``, ``Image.scandir``)."""

    type: str  # file, directory, symlink, char-device, block-device, fifo, socket
    mode: int  # st_mode: type and permission bits
    ino: int  # inode number in its image
    nlink: int
    uid: int
    gid: int
    size: int
    mtime: float
    mtime_ns: int
    target: Optional[str]  # a symlink's target, else None
    layer: int  # the layer of a stack it is shown from (0 for one image)


class Info(TypedDict):
    """What ``sheaf info --json`` prints (``Image.info``)."""

    image: str
    image_bytes: int
    root_digest: str
    inodes: int
    entries_by_type: Optional[Dict[str, int]]
    hardlinked_inodes: Optional[int]
    logical_bytes: int
    stored_data_bytes: int
    compression_ratio: float
    dedup_bytes: Optional[int]
    hole_bytes: Optional[int]
    blocks: int
    blocks_by_codec: Optional[Dict[str, int]]
    stored_by_codec: Optional[Dict[str, int]]
    block_size: int
    page_size: int
    metadata_bytes_uncompressed: int
    build: Dict[str, Any]
    signatures: List[Dict[str, str]]
    prefetch_blocks: int
    whiteouts: Optional[List[str]]
    opaque_dirs: Optional[List[str]]
    sections: List[Dict[str, Any]]


def _norm(path: PathLike) -> str:
    p = os.fsdecode(os.fspath(path))
    return p.strip("/")


class RawFile(io.RawIOBase):
    """A regular file of an image as a raw binary file: ``readinto``,
    ``seek`` and ``tell``; ``io.BufferedReader`` takes it as it is. Reads
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

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._checkClosed()
        if whence == io.SEEK_SET:
            pos = offset
        elif whence == io.SEEK_CUR:
            pos = self._pos + offset
        elif whence == io.SEEK_END:
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
        raise io.UnsupportedOperation("a file inside a sheaf image has no file descriptor")

    def __repr__(self) -> str:
        return f"<sheaf.RawFile name={self.name!r} size={self._size}>"


class Image:
    """An open image (or a stack of layers ``A,B``). Thread-safe: share one
    between threads (and open it again in each worker process)."""

    def __init__(self, native: "_sheaf.Image"):
        self._img = native

    @property
    def root(self) -> str:
        """The root digest (hex); a stack: each layer's, bottom first, joined by ','."""
        return self._img.root

    @property
    def source(self) -> str:
        return self._img.source

    def info(self, whiteouts: bool = False) -> Union[Info, List[Info]]:
        """The fields of ``sheaf info --json`` as a dict (a list of dicts for a stack)."""
        return json.loads(self._img.info_json(whiteouts))

    def stat(self, path: PathLike = "", follow_symlinks: bool = True) -> Stat:
        """Attributes of ``path``: type, mode, ino, nlink, uid, gid, size,
        mtime, mtime_ns, target (symlinks), layer."""
        return self._img.stat(_norm(path), follow_symlinks)

    def lstat(self, path: PathLike) -> Stat:
        return self._img.stat(_norm(path), False)

    def exists(self, path: PathLike) -> bool:
        try:
            self._img.stat(_norm(path), False)
            return True
        except (FileNotFoundError, NotADirectoryError):
            return False

    def isdir(self, path: PathLike) -> bool:
        try:
            return self._img.stat(_norm(path), True)["type"] == "directory"
        except (FileNotFoundError, NotADirectoryError):
            return False

    def isfile(self, path: PathLike) -> bool:
        try:
            return self._img.stat(_norm(path), True)["type"] == "file"
        except (FileNotFoundError, NotADirectoryError):
            return False

    def listdir(self, path: PathLike = "") -> List[str]:
        """The names in directory ``path``, sorted by their bytes."""
        return self._img.listdir(_norm(path), False)

    def scandir(self, path: PathLike = "") -> List[Tuple[str, Stat]]:
        """(name, stat) of each entry of ``path`` (symlinks not followed)."""
        return self._img.listdir(_norm(path), True)

    def readlink(self, path: PathLike) -> str:
        return self._img.readlink(_norm(path))

    def _walk(self, top: PathLike = ""):
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
                if st["type"] == "directory":
                    key = (st["layer"], st["ino"])
                    if key in seen:
                        raise IntegrityError(f"{self.source}: directory inode {st['ino']} is listed twice")
                    seen.add(key)
                    dirs.append(name)
            yield d, entries, dirs
            for x in reversed(dirs):
                p = posixpath.join(d, x)
                sub = handles.get(x)
                # A name the caller added: looked up by its path.
                todo.append((p, sub if sub is not None else self._img.opendir(p)))

    def walk(self, top: PathLike = "") -> Iterator[Tuple[str, List[str], List[str]]]:
        """As ``os.walk`` (top-down; prune by editing ``dirnames`` in place);
        paths are relative to the image's root, '' for the root. Symlinks
        to directories are listed in ``filenames`` and not followed."""
        for d, entries, dirs in self._walk(top):
            files = [n for n, st in entries if st["type"] != "directory"]
            yield d, dirs, files

    def files(self, top: PathLike = "") -> List[str]:
        """Every regular file below ``top`` (paths from the root)."""
        return self.find(top, type="f")

    def find(self, top: PathLike = "", *expr: str, name: Optional[str] = None, type: Optional[str] = None) -> List[str]:
        """The paths below ``top`` (relative to the image's root) that
        find(1)'s expression ``expr`` selects, evaluated by the engine of
        ``sheaf find``: ``img.find("sub", "-name", "*.nii.gz", "-size",
        "+10M")``; ``name``/``type`` add ``-name``/``-type``. ``-prune``,
        ``-o``, parentheses and ``-print`` work as in find(1); for ``-printf``
        or ``-ls`` output use ``find_text``. A stack is walked in Python
        (``name`` and ``type`` only)."""
        words = [os.fsdecode(w) for w in expr]
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
        return [os.fsdecode(p)[1:] for p in out.split(b"\0")[:-1]]

    def find_text(self, top: PathLike = "/", *expr: str) -> str:
        """What ``sheaf find IMAGE TOP EXPR...`` prints (``-printf``, ``-ls``,
        ``-print``), as text; names as they are, not quoted."""
        t = os.fsdecode(os.fspath(top)) or "/"
        return os.fsdecode(self._img.find_output(t, [os.fsdecode(w) for w in expr]))

    def _find_walk(self, top, name, type):
        import fnmatch

        kinds = {"f": "file", "d": "directory", "l": "symlink"}
        want = kinds.get(type, type) if type else None
        out = []
        for d, entries, _ in self._walk(top):
            for n, st in entries:
                if name is not None and not fnmatch.fnmatchcase(n, name):
                    continue
                if want is not None and st["type"] != want:
                    continue
                out.append(posixpath.join(d, n))
        return out

    def open(self, path: PathLike, mode: str = "rb", buffering: int = -1, encoding=None, errors=None, newline=None):
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
            return io.BufferedReader(raw, buffer_size=buffering if buffering > 1 else io.DEFAULT_BUFFER_SIZE)
        if buffering == 0:
            raise ValueError("text mode needs buffering")
        return io.TextIOWrapper(io.BufferedReader(raw), encoding=encoding, errors=errors, newline=newline)

    def read_bytes(self, path: PathLike) -> bytes:
        """The whole contents of one file, read straight into the bytes
        returned (one buffer of the file's size, no copy)."""
        h = self._img.handle(_norm(path))
        return h.pread(0, h.size)

    def read_many(self, paths: Sequence[PathLike], threads: Optional[int] = None) -> List[bytes]:
        """The contents of each file of ``paths``, read in parallel by
        ``threads`` threads (default: one per core) with the GIL released."""
        return self._img.read_many([_norm(p) for p in paths], threads)

    def blocks(self, path: PathLike) -> List[Tuple[int, int, int, int, int]]:
        """Where file ``path``'s bytes are stored: per piece, (file offset,
        length, block id, block offset in the image, stored block length)."""
        return self._img.blocks(_norm(path))

    def __repr__(self) -> str:
        return f"<sheaf.Image {self.source!r} root={self.root}>"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def open(
    source: PathLike,
    *,
    require_signature: Optional[bool] = None,
    signers: Optional[PathLike] = None,
    identity: Optional[str] = None,
    cache: Union[None, bool, PathLike] = None,
) -> Image:
    """Open an image: a path, an ``https://``/``http://``/``ssh://`` URL, a
    published repository, or a stack ``A,B`` (later layers win).

    ``require_signature``/``signers``/``identity`` add to the site policy
    (never relax it). ``cache``: None for the node cache the CLI uses
    (``SHEAF_CACHE_DIR``, else /var/cache/sheaf for root, ~/.cache/sheaf),
    a directory, or False for none (remote images only).
    """
    src = os.fsdecode(os.fspath(source))
    native = _sheaf.open(
        src,
        require_signature=require_signature,
        signers=os.fspath(signers) if signers is not None else None,
        identity=identity,
        cache=os.fspath(cache) if cache not in (None, True, False) else cache,
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
    require_signature: Optional[bool] = None,
    signers: Optional[PathLike] = None,
    identity: Optional[str] = None,
) -> Image:
    """Open an image whose bytes come from ``reader(offset, length) ->
    bytes`` (e.g. a file fsspec opened); ``name`` names it in messages and
    for a detached signature. The bytes are verified as always."""
    return Image(
        _sheaf.open(
            name,
            require_signature=require_signature,
            signers=os.fspath(signers) if signers is not None else None,
            identity=identity,
            reader=reader,
            size=size,
        )
    )
