"""Small fsspec helpers: URL joining, whole-object reads (retried by a RetryPolicy when given) and crash-safe writes.

Private folders and files (`private_dir`, `private_parent`, `open_private`, `check_private_file`):

A plan share (`plan_dir`), a cache directory, the cache daemon's socket and token, their locks and
journals are trusted by every process that uses them: a window file decides which samples a training
run reads, a journal is appended to. When one of them sits in a folder other users can write
(`/dev/shm`, `/tmp`), another local user could plant it first, or a symlink in its place. So:

- `private_dir(path)` creates the folder (and any missing parents) with mode 0700, then checks it:
  a real folder (not a symlink), owned by this user, not writable by group or others; and each
  folder above it owned by this user or root and not writable by others unless sticky (`/tmp`,
  `/dev/shm`), so nobody else can swap it. Anything else is `UnsafePathError`, saying why.
- `open_private(folder, name, flags)` opens a file inside such a folder with O_NOFOLLOW (a
  symlink planted in its place is refused, never followed) and checks what it opened: a regular
  file, owned by this user, not writable by group or others.
- `check_private_file(path)` checks an existing file the same way without opening it (a socket).
- `private_parent(path)` makes sure a file may be created at `path`: its folder is created 0700 when
  missing, else it and every folder above it must be ours or root's and writable by others only when
  sticky (a socket directly in `/tmp` is fine; the socket itself is then checked).

Every sharer goes through these; nothing else in vlmdata decides what "private" means.
"""
from __future__ import annotations

import os
import posixpath
import stat
import tempfile
import uuid
from typing import TYPE_CHECKING

import fsspec
from fsspec.core import url_to_fs

from vlmdata.errors import FetchError, UnsafePathError

if TYPE_CHECKING:
    from vlmdata.retry import RetryPolicy

__all__ = ["atomic_write_bytes", "AtomicLocalFile", "check_private_file", "check_regular_file", "exists", "is_local",
           "join", "local_path", "makedirs", "open_private", "open_url", "private_dir", "private_parent", "read_bytes",
           "read_range", "size"]


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


# -- private folders and files (see the module docstring) ---------------------------------------------
_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH


def _who(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def _refuse(path: str, why: str, what: str) -> UnsafePathError:
    return UnsafePathError(f"refusing {what} {path}: {why}; vlmdata shares it between processes, so it must "
                           "belong to you and be writable by you only (remove it, or choose a folder of your own)")


def _check_owned(path: str, st: os.stat_result, what: str) -> None:
    if st.st_uid != os.geteuid():
        raise _refuse(path, f"it is owned by {_who(st.st_uid)}, not by you ({_who(os.geteuid())})", what)
    if st.st_mode & _OTHERS_WRITE:
        raise _refuse(path, f"its mode {stat.filemode(st.st_mode)} lets group or others write it", what)


def _check_ancestors(path: str) -> None:
    """Every folder above `path` (resolved) is ours or root's, and not writable by others unless sticky."""
    parent = os.path.dirname(path)
    while True:
        st = os.stat(parent)
        if st.st_uid not in (0, os.geteuid()):
            raise _refuse(path, f"the folder {parent} above it is owned by {_who(st.st_uid)}", "the folder")
        if st.st_mode & _OTHERS_WRITE and not st.st_mode & stat.S_ISVTX:
            raise _refuse(path, f"the folder {parent} above it is writable by others (mode "
                          f"{stat.filemode(st.st_mode)}, not sticky), so they could replace it", "the folder")
        up = os.path.dirname(parent)
        if up == parent:
            return
        parent = up


def private_dir(path: str) -> str:
    """Create `path` (mode 0700, parents too) or check the existing one; returns its absolute path."""
    path = os.path.abspath(path)
    parent = os.path.realpath(os.path.dirname(path))
    missing = []
    up = parent
    while not os.path.lexists(up):
        missing.append(up)
        up = os.path.dirname(up)
    for d in reversed(missing):                    # the chain this call creates: 0700 from the start
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass
        _check_owned(d, os.lstat(d), "the folder")
    path = os.path.join(parent, os.path.basename(path))
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise _refuse(path, "it is a symbolic link", "the folder")
    if not stat.S_ISDIR(st.st_mode):
        raise _refuse(path, "it is not a folder", "the folder")
    _check_owned(path, st, "the folder")
    _check_ancestors(path)
    return path


def private_parent(path: str) -> str:
    """Create the folder of `path` privately, or check the existing chain above `path`; returns `path` absolute."""
    path = os.path.abspath(path)
    if os.path.isdir(os.path.dirname(path)):
        _check_ancestors(os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path)))
    else:
        private_dir(os.path.dirname(path))
    return path


def open_private(folder: str, name: str, flags: int, mode: int = 0o600) -> int:
    """os.open of `folder/name` without following a symlink; the file must be a regular one of ours that
    only we can write. Returns the descriptor (the caller closes it)."""
    path = os.path.join(folder, name)
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as exc:
        if os.path.islink(path):
            raise _refuse(path, "it is a symbolic link", "the file") from None
        raise exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _refuse(path, "it is not a regular file", "the file")
        _check_owned(path, st, "the file")
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_private_file(path: str) -> None:
    """An existing file (a socket, a token) in a private folder: not a symlink, ours, writable by us only."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise _refuse(path, "it is a symbolic link", "the file")
    _check_owned(path, st, "the file")
