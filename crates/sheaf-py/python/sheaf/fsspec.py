"""The ``sheaf://`` protocol for fsspec (registered through fsspec's entry
point, so ``import sheaf`` is not needed first):

    fsspec.filesystem("sheaf", fo="hcp.sheaf").glob("sub-*/anat/*.nii.gz")
    fsspec.open("sheaf://sub-01/T1w.nii.gz::https://host/hcp.sheaf")
    pandas.read_csv("sheaf://tables/a.csv", storage_options={"fo": "data.sheaf"})

``fo`` is the image: a path or URL sheaf opens itself, a ``sheaf.Image``,
or, in a chained URL, whatever the outer protocol names. When that protocol
is one sheaf reads itself (file, http, https, ssh/sftp, s3) the URL goes to
sheaf's own reader (node cache, mirrors, range reads of only what is
needed), and fsspec's filesystem for it (aiohttp, paramiko, s3fs) is not
needed (sheaf._links); any other (gcs, memory, ..., or s3 with s3fs's
options such as ``s3={"key": ...}``) is read through fsspec, range by
range, and verified all the same.
"""

from __future__ import annotations

import datetime
import threading

import fsspec
from fsspec.spec import AbstractFileSystem
from fsspec.utils import infer_storage_options

import sheaf

_OWN = {"file", "local", "http", "https", "ssh", "sftp", "s3", "s3a"}  # read by sheaf itself
_TYPES = {"file": "file", "directory": "directory", "symlink": "link"}


def _ssh_url(path: str, opts: dict) -> str:
    host = opts.get("host")
    if not host:
        raise ValueError(f"{path}: an ssh/sftp image needs a host")
    user = opts.get("username")
    port = opts.get("port")
    auth = f"{user}@" if user else ""
    where = f"{host}:{port}" if port else host
    return f"ssh://{auth}{where}/{path.lstrip('/')}"


def _open_image(fo, target_protocol, target_options, policy) -> "sheaf.Image":
    if isinstance(fo, sheaf.Image):
        return fo
    opts = dict(target_options or {})
    if isinstance(fo, str):
        proto = target_protocol or (fo.split("://", 1)[0] if "://" in fo else "file")
        if isinstance(proto, (list, tuple)):
            proto = proto[0]
        if proto in ("file", "local"):
            path = infer_storage_options(fo)["path"] if fo.startswith(("file://", "local://")) else fo
            return sheaf.open(path, **policy)
        if proto in ("http", "https"):
            url = fo if "://" in fo else f"{proto}://{fo}"
            return sheaf.open(url, **policy)
        if proto in ("ssh", "sftp"):
            if fo.startswith("ssh://"):
                return sheaf.open(fo, **policy)
            if fo.startswith("sftp://"):
                so = infer_storage_options(fo)
                opts.setdefault("host", so.get("host"))
                if so.get("username"):
                    opts.setdefault("username", so["username"])
                if so.get("port"):
                    opts.setdefault("port", so["port"])
                fo = so["path"]
            return sheaf.open(_ssh_url(fo, opts), **policy)
        if proto in ("s3", "s3a") and not opts:
            # Credentials, region and endpoint as the CLI finds them
            # (AWS_* variables, ~/.aws); s3fs's own options go to s3fs.
            key = fo.split("://", 1)[1] if "://" in fo else fo
            return sheaf.open(f"s3://{key}", **policy)
        # Any other protocol: fsspec reads the ranges sheaf asks for.
        fs = fsspec.filesystem(proto, **opts)
        path = fs._strip_protocol(fo)
        size = fs.size(path)

        def read(offset, length, fs=fs, path=path):
            return bytes(fs.cat_file(path, start=offset, end=offset + length))

        return sheaf.open_reader(f"{proto}://{path}", read, size, **_reader_policy(policy))
    # A file object: read under a lock (it has one position).
    f = fo
    lock = threading.Lock()
    with lock:
        size = f.seek(0, 2)

    def read_file(offset, length):
        with lock:
            f.seek(offset)
            return bytes(f.read(length))

    name = getattr(f, "path", None) or getattr(f, "name", None) or repr(f)
    return sheaf.open_reader(str(name), read_file, size, **_reader_policy(policy))


def _reader_policy(policy: dict) -> dict:
    return {k: v for k, v in policy.items() if k != "cache"}


class SheafFileSystem(AbstractFileSystem):
    """A sheaf image as a read-only fsspec filesystem. Paths are relative
    to the image's root ('' or '/' is the root)."""

    protocol = "sheaf"
    root_marker = ""

    def __init__(
        self,
        fo=None,
        target_protocol=None,
        target_options=None,
        require_signature=None,
        signers=None,
        identity=None,
        cache=None,
        **storage_options,
    ):
        super().__init__(**storage_options)
        if fo is None:
            raise ValueError("sheaf:// needs the image: fo=PATH_OR_URL, or a chained URL (sheaf://PATH::https://HOST/IMAGE)")
        policy = {"require_signature": require_signature, "signers": signers, "identity": identity, "cache": cache}
        self.image = _open_image(fo, target_protocol, target_options, policy)

    @classmethod
    def _strip_protocol(cls, path):
        if isinstance(path, (list, tuple)):
            return [cls._strip_protocol(p) for p in path]
        path = str(path)
        if path.startswith("sheaf://"):
            path = path[len("sheaf://") :]
        path = path.split("::", 1)[0]
        return path.strip("/")

    @staticmethod
    def _get_kwargs_from_urls(path):
        return {}

    def _entry(self, path: str, st: "sheaf.Stat") -> dict:
        kind = _TYPES.get(st.type, "other")
        d = {
            "name": path,
            "size": st.st_size,
            "type": kind,
            "mode": st.st_mode,
            "ino": st.st_ino,
            "nlink": st.st_nlink,
            "uid": st.st_uid,
            "gid": st.st_gid,
            "mtime": st.st_mtime,
            "islink": st.type == "symlink",
        }
        if st.type == "symlink":
            d["destination"] = st.target
            try:
                t = self.image.stat(path, True)
                d["type"] = _TYPES.get(t.type, "other")
                d["size"] = t.st_size
            except (FileNotFoundError, NotADirectoryError, OSError):
                pass
        return d

    def ls(self, path, detail=True, **kwargs):
        path = self._strip_protocol(path)
        st = self.image.stat(path, True)
        if st.type != "directory":
            out = [self._entry(path, self.image.stat(path, False))]
        else:
            out = [
                self._entry(f"{path}/{name}" if path else name, s)
                for name, s in self.image.scandir(path)
            ]
        return out if detail else [e["name"] for e in out]

    def info(self, path, **kwargs):
        path = self._strip_protocol(path)
        return self._entry(path, self.image.stat(path, False))

    def exists(self, path, **kwargs):
        return self.image.exists(self._strip_protocol(path))

    def isdir(self, path):
        return self.image.isdir(self._strip_protocol(path))

    def isfile(self, path):
        return self.image.isfile(self._strip_protocol(path))

    def _open(self, path, mode="rb", block_size=None, autocommit=True, cache_options=None, **kwargs):
        if mode != "rb":
            raise ValueError(f"mode {mode!r}: sheaf images are read-only")
        return self.image.open(self._strip_protocol(path), "rb", buffering=block_size or -1)

    def cat_file(self, path, start=None, end=None, **kwargs):
        path = self._strip_protocol(path)
        if start is None and end is None:
            return self.image.read_bytes(path)
        with self.image.open(path, "rb", buffering=0) as f:
            size = f.size
            start = 0 if start is None else (start if start >= 0 else max(size + start, 0))
            end = size if end is None else (end if end >= 0 else max(size + end, 0))
            if end <= start:
                return b""
            return f.pread(start, end - start)

    def cat_ranges(self, paths, starts, ends, max_gap=None, on_error="return", **kwargs):
        out = []
        for p, s, e in zip(paths, starts, ends):
            try:
                out.append(self.cat_file(p, s, e))
            except Exception as ex:  # noqa: BLE001 - fsspec's contract
                if on_error == "raise":
                    raise
                out.append(ex)
        return out

    def cat(self, path, recursive=False, on_error="raise", **kwargs):
        paths = self.expand_path(path, recursive=recursive)
        if isinstance(path, str) and len(paths) == 1 and not self._contains_glob(path) and not recursive:
            return self.cat_file(paths[0])
        files = [p for p in paths if self.isfile(p)]
        if on_error == "raise":
            return dict(zip(files, self.image.read_many(files)))
        out = {}
        for p in files:
            try:
                out[p] = self.cat_file(p)
            except Exception as ex:  # noqa: BLE001 - fsspec's contract
                if on_error == "return":
                    out[p] = ex
        return out

    @staticmethod
    def _contains_glob(path: str) -> bool:
        return any(c in path for c in "*?[")

    def modified(self, path):
        st = self.image.stat(self._strip_protocol(path), True)
        return datetime.datetime.fromtimestamp(st.st_mtime, tz=datetime.timezone.utc)

    def ukey(self, path):
        return f"{self.image.root}:{self._strip_protocol(path)}"

    def _rm(self, path):
        raise PermissionError("sheaf images are read-only")

    def mkdir(self, path, create_parents=True, **kwargs):
        raise PermissionError("sheaf images are read-only")

    def rmdir(self, path):
        raise PermissionError("sheaf images are read-only")
