"""What a data row may read at shard time, and reading it with bounds.

A row names its images (and an image folder its sidecar captions) by
reference. By default a reference may only lead to a regular file under the
image root: the input's own directory, or `--image-root` (relative references
then resolve against it). Nothing else is read:

- `../x`, an absolute path or `file://` URL outside the root, and a symlink
  whose target lies outside the root are skipped as `outside_root` (the check
  is made on the real path, so symlinks inside the root that stay inside are
  fine). The real path of each directory is resolved once per process (the
  dataset tree is taken not to change while it is sharded), and the file
  itself is opened with O_NOFOLLOW: a symlink there is resolved and checked
  before it is read;
- remote URLs (`http(s)://`, `s3://`, ...) are read only with `--allow-remote`,
  and then only from the hosts (or buckets) of `--allow-host` when that is
  given; anything else is `remote_not_allowed`, as is every chained fsspec URL
  (`simplecache::file://...`) and every other scheme. A remote input's own
  location (e.g. `s3://bucket/data/` for `s3://bucket/data/rows.jsonl`) is its
  root, readable without `--allow-remote`;
- devices, FIFOs and sockets are `not_a_regular_file` (opened non-blocking, so
  a FIFO never hangs the run); files over `max_bytes` (`--max-image-bytes`,
  default 64 MiB) are `file_too_large` and are never read past the limit;
  remote reads stop at the limit too, and at `timeout` seconds (`read_timeout`).

A `data:` URL is not a place but the bytes themselves: decoded within `max_bytes` (ingest.data_url).

A rejected file's bytes never reach any output: skip details name the reference
and the rule, never the content.
"""
from __future__ import annotations

import errno
import functools
import os
import posixpath
import re
import stat
import threading
from dataclasses import dataclass
from urllib.parse import urlsplit

from vlmdata import fsutil
from vlmdata.errors import ConfigError, RowProblem, Skip
from vlmdata.ingest.data_url import decode_data_url, is_data_url

__all__ = ["DEFAULT_MAX_IMAGE_BYTES", "DEFAULT_REMOTE_TIMEOUT", "AccessPolicy", "call_with_deadline", "read_ref",
           "resolve_ref"]

DEFAULT_MAX_IMAGE_BYTES = 64 << 20       # larger than any real photo; bounds what one row can make us read
DEFAULT_REMOTE_TIMEOUT = 60.0            # seconds for one remote image read
REMOTE_SCHEMES = ("http", "https", "s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "hf")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")
_READ_CHUNK = 1 << 20


@dataclass(frozen=True)
class AccessPolicy:
    """What image references may name (see the module docstring); picklable, shared by all jobs."""

    image_root: str | None = None          # None: each input's own directory
    allow_remote: bool = False
    allow_hosts: tuple[str, ...] = ()      # with allow_remote: only these hosts / buckets (empty: any)
    max_bytes: int = DEFAULT_MAX_IMAGE_BYTES
    timeout: float = DEFAULT_REMOTE_TIMEOUT

    def check(self) -> None:
        """ConfigError for settings that cannot work."""
        if self.max_bytes < 1:
            raise ConfigError("--max-image-bytes must be >= 1")
        if self.timeout <= 0:
            raise ConfigError("--remote-timeout must be > 0 seconds")
        if self.allow_hosts and not self.allow_remote:
            raise ConfigError("--allow-host only applies with --allow-remote; pass both")
        if self.image_root is not None and fsutil.is_local(self.image_root):
            if not os.path.isdir(fsutil.local_path(self.image_root)):
                raise ConfigError(f"--image-root {self.image_root} is not a directory")

    def root_for(self, base: str, folder: bool) -> str:
        """The root references of an input resolve against (an image folder's own directory for folders)."""
        if self.image_root is None or folder:
            return base
        return self.image_root


def _scheme(ref: str) -> str | None:
    m = _SCHEME.match(ref)
    return m.group(1).lower() if m else None


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


@functools.lru_cache(maxsize=64)
def _real_root(root: str) -> str:
    return os.path.realpath(root)


@functools.lru_cache(maxsize=4096)
def _real_dir(directory: str) -> str:
    return os.path.realpath(directory)


def resolve_ref(ref: str, root: str, policy: AccessPolicy) -> str:
    """The local real path or URL `ref` names, or RowProblem if the policy does not allow reading it."""
    if "::" in ref:
        raise RowProblem(Skip.REMOTE_NOT_ALLOWED, f"{ref[:200]}: chained fsspec URLs are not read from data rows")
    scheme = _scheme(ref)
    if scheme is not None and scheme != "file":
        return _resolve_remote(ref, scheme, root, policy)
    if not fsutil.is_local(root):
        if scheme == "file" or os.path.isabs(ref):
            raise RowProblem(Skip.OUTSIDE_ROOT, f"{ref[:200]}: a local path in a row of a remote input ({root})")
        rparts = urlsplit(root)
        path = posixpath.normpath(posixpath.join(rparts.path or "/", ref))
        if not _under(path, posixpath.normpath(rparts.path or "/")):
            raise RowProblem(Skip.OUTSIDE_ROOT, f"{ref[:200]} resolves outside the image root {root}")
        return f"{rparts.scheme}://{rparts.netloc}{path}"
    path = fsutil.local_path(ref) if scheme == "file" else ref
    root_real = _real_root(fsutil.local_path(root))
    norm = os.path.normpath(os.path.join(root_real, path))
    directory, name = os.path.split(norm)
    real = os.path.join(_real_dir(directory), name)       # the last component is checked when it is opened
    if not _under(real, root_real):
        what = "links" if _under(norm, root_real) else "resolves"
        raise RowProblem(Skip.OUTSIDE_ROOT, f"{ref[:200]} {what} outside the image root {root_real}; "
                                            "pass --image-root DIR to read images under DIR")
    return real


def _local_bytes(path: str, root: str, policy: AccessPolicy) -> bytes:
    """read_local, following a symlink in the last component only when its target is under the root too."""
    try:
        return read_local(path, policy.max_bytes)
    except _SymlinkError:
        target = os.path.realpath(path)
        root_real = _real_root(fsutil.local_path(root))
        if not _under(target, root_real):
            raise RowProblem(Skip.OUTSIDE_ROOT, f"{path} links outside the image root {root_real}") from None
        try:
            return read_local(target, policy.max_bytes)
        except _SymlinkError:
            raise RowProblem(Skip.OUTSIDE_ROOT, f"{path}: a symlink changed while being read") from None


class _SymlinkError(OSError):
    """The last component of a path opened with O_NOFOLLOW is a symlink."""


def _resolve_remote(url: str, scheme: str, root: str, policy: AccessPolicy) -> str:
    parts = urlsplit(url)
    norm = posixpath.normpath(parts.path) if parts.path else ""
    if parts.path.endswith("/") and norm != "/":
        norm += "/"
    clean = f"{scheme}://{parts.netloc}{norm}" + (f"?{parts.query}" if parts.query else "")
    if not fsutil.is_local(root):
        rparts = urlsplit(root)
        rnorm = posixpath.normpath(rparts.path) if rparts.path else ""
        same_store = _scheme(root) == scheme and rparts.netloc == parts.netloc
        if same_store and _under(norm, rnorm or "/") and not parts.query:
            return clean
    if scheme not in REMOTE_SCHEMES:
        raise RowProblem(Skip.REMOTE_NOT_ALLOWED, f"{url[:200]}: scheme {scheme!r} is not read from data rows")
    if not policy.allow_remote:
        raise RowProblem(Skip.REMOTE_NOT_ALLOWED, f"{url[:200]}: remote image URLs are read only with "
                                                  "--allow-remote (and --allow-host HOST to limit the hosts)")
    host = (parts.hostname or parts.netloc).lower()
    if policy.allow_hosts and host not in {h.lower() for h in policy.allow_hosts}:
        raise RowProblem(Skip.REMOTE_NOT_ALLOWED, f"{url[:200]}: host {host!r} is not in --allow-host")
    return clean


def read_ref(ref, root: str, policy: AccessPolicy, storage_options: dict | None = None) -> bytes:
    """The bytes an image reference names (embedded bytes as they are, a `data:` URL decoded), read within the
    policy's bounds."""
    if isinstance(ref, (bytes, bytearray, memoryview)):
        if len(ref) > policy.max_bytes:
            raise RowProblem(Skip.FILE_TOO_LARGE, f"embedded image of {len(ref)} bytes > --max-image-bytes "
                                                  f"{policy.max_bytes}")
        return bytes(ref)
    if is_data_url(ref):
        return decode_data_url(ref, policy.max_bytes)
    target = resolve_ref(ref, root, policy)
    if fsutil.is_local(target):
        return _local_bytes(target, root, policy)
    return read_remote(target, policy, storage_options or {})


def read_local(path: str, limit: int) -> bytes:
    """A regular file's bytes, at most `limit` of them (RowProblem otherwise); never blocks on a FIFO.

    A symlink as the last component raises `_SymlinkError` (O_NOFOLLOW): the caller decides.
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            raise RowProblem(Skip.MISSING_FILE, f"{path}: no such file") from None
        if exc.errno == errno.ELOOP:
            raise _SymlinkError(exc.errno, exc.strerror, path) from None
        raise RowProblem(Skip.READ_ERROR, f"{path}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise RowProblem(Skip.MISSING_FILE, f"{path}: a directory, not a file")
        if not stat.S_ISREG(st.st_mode):
            raise RowProblem(Skip.NOT_A_REGULAR_FILE, f"{path}: not a regular file (device, FIFO or socket)")
        if st.st_size > limit:
            raise RowProblem(Skip.FILE_TOO_LARGE, f"{path}: {st.st_size} bytes > --max-image-bytes {limit}")
        parts, got, want = [], 0, st.st_size + 1   # one read of the whole file (plus one byte: EOF seen)
        while True:   # to EOF, but never past the limit (the file may grow while it is read)
            ask = min(want, limit + 1 - got)
            chunk = os.read(fd, ask)
            if not chunk:
                break
            parts.append(chunk)
            got += len(chunk)
            if got > limit:
                raise RowProblem(Skip.FILE_TOO_LARGE, f"{path}: more than --max-image-bytes {limit} bytes")
            if len(chunk) < ask and got >= st.st_size:
                break   # a short read of a regular file is its end
            want = _READ_CHUNK
        return parts[0] if len(parts) == 1 else b"".join(parts)
    except OSError as exc:
        raise RowProblem(Skip.READ_ERROR, f"{path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def read_remote(url: str, policy: AccessPolicy, storage_options: dict) -> bytes:
    """At most `policy.max_bytes` of a remote object, within `policy.timeout` seconds (RowProblem otherwise)."""
    from fsspec.asyn import AsyncFileSystem, sync
    from fsspec.core import url_to_fs

    limit = policy.max_bytes
    try:
        fs, path = url_to_fs(url, **storage_options)
        if isinstance(fs, AsyncFileSystem):
            if hasattr(fs, "set_session") and hasattr(fs, "encode_url"):   # HTTP: stream, servers may ignore Range
                data = sync(fs.loop, _http_read, fs, path, limit, timeout=policy.timeout)
            else:
                data = sync(fs.loop, fs._cat_file, path, start=0, end=limit + 1, timeout=policy.timeout)
        else:
            data = call_with_deadline(lambda: _read_open(fs, path, limit), policy.timeout)
    except FileNotFoundError:
        raise RowProblem(Skip.MISSING_FILE, f"{url}: not found") from None
    except TimeoutError:
        raise RowProblem(Skip.READ_TIMEOUT, f"{url}: no complete answer within {policy.timeout:g} s") from None
    except (OSError, ValueError) as exc:
        raise RowProblem(Skip.READ_ERROR, f"{url}: {type(exc).__name__}: {str(exc)[:200]}") from None
    except Exception as exc:   # client libraries raise their own types (aiohttp, botocore)
        raise RowProblem(Skip.READ_ERROR, f"{url}: {type(exc).__name__}: {str(exc)[:200]}") from None
    if len(data) > limit:
        raise RowProblem(Skip.FILE_TOO_LARGE, f"{url}: more than --max-image-bytes {limit} bytes")
    return data


async def _http_read(fs, url: str, limit: int) -> bytes:
    session = await fs.set_session()
    kw = {k: v for k, v in fs.kwargs.items() if k != "headers"}
    headers = {**fs.kwargs.get("headers", {}), "Range": f"bytes=0-{limit}"}
    async with session.get(fs.encode_url(url), headers=headers, **kw) as r:
        if r.status == 404:
            raise FileNotFoundError(url)
        r.raise_for_status()
        parts, got = [], 0
        while got <= limit:
            chunk = await r.content.read(min(_READ_CHUNK, limit + 1 - got))
            if not chunk:
                break
            parts.append(chunk)
            got += len(chunk)
        return b"".join(parts)


def _read_open(fs, path: str, limit: int) -> bytes:
    with fs.open(path, "rb") as f:
        return f.read(limit + 1)


def call_with_deadline(fn, timeout: float):
    """fn() in a daemon thread; TimeoutError if it has not returned after `timeout` seconds."""
    box: dict = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:   # handed to the caller below
            box["error"] = exc

    t = threading.Thread(target=run, name="vlmdata-remote-read", daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise TimeoutError(f"read did not finish within {timeout} s")
    if "error" in box:
        raise box["error"]
    return box["value"]
