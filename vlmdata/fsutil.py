"""Small fsspec helpers: URL joining, whole-object reads (retried by a RetryPolicy when given) and crash-safe writes."""
from __future__ import annotations

import os
import posixpath
import stat
import tempfile
import uuid
from typing import TYPE_CHECKING

import fsspec
from fsspec.core import url_to_fs

from vlmdata.errors import FetchError

if TYPE_CHECKING:
    from vlmdata.retry import RetryPolicy

__all__ = ["atomic_write_bytes", "AtomicLocalFile", "check_regular_file", "exists", "is_local", "join", "local_path",
           "makedirs", "open_url", "read_bytes", "read_range", "size"]


def is_local(url: str) -> bool:
    """True for plain paths and file:// URLs."""
    return "://" not in url or url.startswith("file://")


def local_path(url: str) -> str:
    """Strip a file:// prefix; other URLs are returned unchanged."""
    return url[len("file://"):] if url.startswith("file://") else url


def join(base: str, *parts: str) -> str:
    """Join URL or path components with '/'."""
    if is_local(base):
        return os.path.join(local_path(base), *parts)
    return posixpath.join(base, *parts)


def read_bytes(url: str, storage_options: dict | None = None, retry: RetryPolicy | None = None) -> bytes:
    """Read a whole object; with `retry`, transient failures are retried as that policy says (vlmdata.retry)."""
    def once() -> bytes:
        fs, path = url_to_fs(url, **(storage_options or {}))
        return fs.cat_file(path)

    return once() if retry is None else retry.call(once, url)


def check_regular_file(url: str) -> None:
    """For a local path: raise FetchError unless it is a regular file (a device, FIFO or socket could be
    endless or block forever; FetchError is not retried). Remote URLs are not checked."""
    if is_local(url) and not stat.S_ISREG(os.stat(local_path(url)).st_mode):
        raise FetchError(f"{url} is not a regular file (a directory, device, FIFO or socket)")


def read_range(url: str, start: int, end: int, storage_options: dict | None = None) -> bytes:
    """Read bytes [start, end) of an object."""
    fs, path = url_to_fs(url, **(storage_options or {}))
    return fs.cat_file(path, start=start, end=end)


def size(url: str, storage_options: dict | None = None) -> int:
    """The size of an object in bytes."""
    fs, path = url_to_fs(url, **(storage_options or {}))
    return int(fs.size(path))


def exists(url: str, storage_options: dict | None = None) -> bool:
    fs, path = url_to_fs(url, **(storage_options or {}))
    return fs.exists(path)


def makedirs(url: str, storage_options: dict | None = None) -> None:
    """Create a directory (a no-op on object stores without directories)."""
    fs, path = url_to_fs(url, **(storage_options or {}))
    fs.makedirs(path, exist_ok=True)


def atomic_write_bytes(url: str, data: bytes, storage_options: dict | None = None, fsync: bool = True) -> None:
    """Write `data` so that readers never see a partial object.

    Local files go to a temporary name in the same directory and are renamed
    into place (after fsync, unless `fsync=False`: then a killed process still
    never leaves a torn file, but a power loss may). Object stores publish an
    object only when its single PUT completes, which is already atomic.
    """
    if is_local(url):
        path = local_path(url)
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix="." + os.path.basename(path))
        try:
            os.fchmod(fd, 0o644)  # mkstemp creates 0600; published files are as readable as normal ones
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                if fsync:
                    os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        return
    fs, path = url_to_fs(url, **(storage_options or {}))
    fs.pipe_file(path, data)


class AtomicLocalFile:
    """A local file written under a temporary name and renamed on success.

    Use for large outputs streamed to disk; remote outputs are staged locally
    and uploaded in one PUT by `publish`.
    """

    def __init__(self, url: str, storage_options: dict | None = None, fsync: bool = True):
        self.url = url
        self.storage_options = storage_options or {}
        self.fsync = fsync
        if is_local(url):
            directory = os.path.dirname(os.path.abspath(local_path(url)))
            os.makedirs(directory, exist_ok=True)
        else:
            directory = None
        self.tmp_path = os.path.join(directory or tempfile.gettempdir(), f".tmp-{uuid.uuid4().hex}")
        self.file = open(self.tmp_path, "wb")

    def commit(self) -> None:
        """Flush, then rename (local) or upload (remote) under the final name."""
        self.file.flush()
        if self.fsync:
            os.fsync(self.file.fileno())
        self.file.close()
        try:
            if is_local(self.url):
                os.replace(self.tmp_path, local_path(self.url))
            else:
                fs, path = url_to_fs(self.url, **self.storage_options)
                fs.put_file(self.tmp_path, path)
        finally:
            if os.path.exists(self.tmp_path):
                os.unlink(self.tmp_path)

    def abort(self) -> None:
        """Drop the temporary file."""
        if not self.file.closed:
            self.file.close()
        if os.path.exists(self.tmp_path):
            os.unlink(self.tmp_path)

    def __enter__(self) -> AtomicLocalFile:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()


def open_url(url: str, mode: str = "rb", storage_options: dict | None = None):
    """fsspec.open with our storage options; a context manager."""
    return fsspec.open(url, mode, **(storage_options or {}))
