"""What the cache daemon may read: the datasets it serves, and the token its TCP listener requires.

The daemon reads objects with its own user's rights, so it must not read whatever a client names.
`DatasetAccess` holds the dataset prefixes it serves: given with `--allow PREFIX...`, or, without
them, registered by its clients over the Unix socket (mode 0600: only the daemon's own user can
connect, and that user could read the data anyway). A TCP client (loopback, token required) can
never register. Every `get` and `plan` is checked before anything is touched, and a refusal reads
the same whether the object exists or not.

Prefixes match on whole path segments (`s3://b/ds` serves `s3://b/ds/x.tar`, not `s3://b/ds2/x.tar`).
Local paths are compared after resolving symlinks and `..`, so a link inside a served folder cannot
reach out of it; chained URLs (`simplecache::s3://...`) are never served.

`TokenFile` creates the TCP listener's token: 32 random bytes (hex) in a 0600 file (beside the Unix
socket by default); clients give it as `CacheConfig(daemon_token_file=...)`.
"""
from __future__ import annotations

import hmac
import os
import secrets
import threading

from vlmdata import fsutil
from vlmdata.errors import ConfigError, NotServedError
from vlmdata.fsutil import open_private, private_parent

__all__ = ["DatasetAccess", "TokenFile", "dataset_prefix", "normalize_prefix", "read_token"]

REFUSED = ("not a dataset this cache daemon serves: start it with --allow PREFIX, or let a reader on its "
           "Unix socket register the dataset")


def normalize_prefix(url: str) -> str:
    """The canonical form a URL or prefix is compared in (local: absolute, symlinks resolved)."""
    if not isinstance(url, str) or not url or "\x00" in url:
        raise NotServedError(REFUSED)
    if "::" in url:
        raise NotServedError(REFUSED)                 # chained filesystems (caches, archives) are never served
    if fsutil.is_local(url):
        return os.path.realpath(fsutil.local_path(url))
    scheme, rest = url.split("://", 1)
    parts = [p for p in rest.split("/") if p not in ("", ".")]
    if ".." in parts or not parts:
        raise NotServedError(REFUSED)
    return f"{scheme.lower()}://" + "/".join(parts)


def dataset_prefix(url: str) -> str:
    """The folder of a shard URL: what a reader registers for it."""
    if fsutil.is_local(url):
        return os.path.dirname(os.path.abspath(fsutil.local_path(url)))
    return url.rstrip("/").rsplit("/", 1)[0]


class DatasetAccess:
    """The dataset prefixes a daemon serves; `check(url)` raises NotServedError for anything else."""

    def __init__(self, allow: list[str] | tuple[str, ...] = ()):
        self.fixed = bool(allow)                      # --allow given: clients cannot add datasets
        self._prefixes: set[str] = set()
        for p in allow:
            try:
                self._prefixes.add(normalize_prefix(p))
            except NotServedError:
                raise ConfigError(f"--allow {p!r} is not a dataset folder or URL prefix (no '..', no '::' chains)") \
                    from None
        self._lock = threading.Lock()

    @property
    def prefixes(self) -> list[str]:
        with self._lock:
            return sorted(self._prefixes)

    def register(self, prefixes: list[str]) -> list[str]:
        """Serve these dataset prefixes too (a Unix-socket client); returns what was added."""
        if not isinstance(prefixes, list) or not all(isinstance(p, str) for p in prefixes):
            raise ValueError("register.prefixes must be a list of strings")
        if self.fixed:
            missing = [p for p in prefixes if not self.allows(p)]
            if missing:
                raise NotServedError(f"this cache daemon serves only its --allow prefixes; {REFUSED}")
            return []
        added = []
        with self._lock:
            for p in prefixes:
                norm = normalize_prefix(p)
                if norm not in self._prefixes:
                    self._prefixes.add(norm)
                    added.append(norm)
        return added

    def allows(self, url: str) -> bool:
        try:
            target = normalize_prefix(url)
        except NotServedError:
            return False
        with self._lock:
            prefixes = list(self._prefixes)
        return any(target == p or target.startswith(p.rstrip("/") + "/") for p in prefixes)

    def check(self, url: str) -> None:
        """Raise NotServedError (the same message whether or not the object exists) unless `url` is served."""
        if not self.allows(url):
            raise NotServedError(REFUSED)


class TokenFile:
    """The TCP listener's secret: created 0600 (never readable by others, not even for a moment)."""

    def __init__(self, path: str):
        self.path = private_parent(path)
        self.token = secrets.token_hex(32)
        tmp = f"{self.path}.tmp-{os.getpid()}"
        if os.path.lexists(tmp):
            os.unlink(tmp)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, self.token.encode() + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)

    def matches(self, token) -> bool:
        return isinstance(token, str) and hmac.compare_digest(token.encode(), self.token.encode())

    def remove(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def read_token(path: str) -> str:
    """A daemon's TCP token from its token file: one of ours that only we can write, not a symlink (a token
    path pointing elsewhere would send that file's text to whatever listens on the port)."""
    path = os.path.abspath(path)
    with os.fdopen(open_private(os.path.dirname(path), os.path.basename(path), os.O_RDONLY),
                   encoding="utf-8") as f:
        return f.read(4096).strip()
