"""The links of a chained ``sheaf://`` URL that sheaf reads itself.

fsspec resolves every link of ``sheaf://PATH::https://host/img.sheaf``
(``fsspec.core._un_chain``) before the ``sheaf`` filesystem is asked: it
imports the class of ``https`` to strip the link's protocol, which without
aiohttp and requests fails (``ImportError: HTTPFileSystem requires ...``),
though sheaf reads ``https``, ``ssh`` and ``s3`` URLs itself, in Rust, and
never makes that filesystem.

So the package names, in fsspec's ``fsspec.specs`` entry points, a class of
this module for ``http``, ``https``, ``ssh``, ``sftp``, ``s3`` and ``s3a``.
Each is fsspec's own class (the very same object) whenever that imports;
only when its dependencies are missing is it a stand-in that strips and
parses URLs as fsspec's class does, which is all a chain's link needs, and
raises fsspec's ``ImportError`` when a program asks for the filesystem
itself. Nothing changes for a program that has aiohttp, paramiko or s3fs.
"""

from __future__ import annotations

from fsspec.spec import AbstractFileSystem
from fsspec.utils import infer_storage_options


class _Link(AbstractFileSystem):
    # What fsspec's class needs (its registry's message), for the error.
    _needs = ""

    def __init__(self, *args, **kwargs):
        raise ImportError(
            f"{self._needs} (sheaf reads these URLs itself only as the image of a chained sheaf:// URL, "
            "e.g. sheaf://PATH::https://host/image.sheaf)"
        ) from getattr(type(self), "_cause", None)


def _http():
    try:
        from fsspec.implementations.http import HTTPFileSystem

        return HTTPFileSystem
    except ImportError as e:
        cause = e

    class HTTPFileSystem(_Link):
        protocol = ("http", "https")
        _needs = 'HTTPFileSystem requires "requests" and "aiohttp" to be installed'
        _cause = cause

        @classmethod
        def _strip_protocol(cls, path):
            return path  # as fsspec's: the whole URL

        @staticmethod
        def _get_kwargs_from_urls(path):
            return {}

    return HTTPFileSystem


def _sftp():
    try:
        from fsspec.implementations.sftp import SFTPFileSystem

        return SFTPFileSystem
    except ImportError as e:
        cause = e

    class SFTPFileSystem(_Link):
        protocol = ("sftp", "ssh")
        _needs = 'SFTPFileSystem requires "paramiko" to be installed'
        _cause = cause

        @classmethod
        def _strip_protocol(cls, path):
            return infer_storage_options(path)["path"]

        @staticmethod
        def _get_kwargs_from_urls(urlpath):
            out = infer_storage_options(urlpath)
            out.pop("path", None)
            out.pop("protocol", None)
            return out

    return SFTPFileSystem


def _s3():
    try:
        from s3fs import S3FileSystem

        return S3FileSystem
    except ImportError as e:
        cause = e

    class S3FileSystem(_Link):
        protocol = ("s3", "s3a")
        _needs = "Install s3fs to access S3"
        _cause = cause

        @classmethod
        def _strip_protocol(cls, path):
            for p in ("s3://", "s3a://"):
                if path.startswith(p):
                    path = path[len(p) :]
            return path.rstrip("/")

        @staticmethod
        def _get_kwargs_from_urls(urlpath):
            return {}

    return S3FileSystem


HTTPFileSystem = _http()
SFTPFileSystem = _sftp()
S3FileSystem = _s3()
