"""Folders and files vlmdata shares between the processes of one user: created private, checked before use.

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

Every sharer goes through these three; nothing else in vlmdata decides what "private" means.
"""
from __future__ import annotations

import os
import stat

from vlmdata.errors import UnsafePathError

__all__ = ["check_private_file", "open_private", "private_dir", "private_parent"]

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
