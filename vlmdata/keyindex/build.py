"""Building a dataset's keys.lmdb from its shard indices, and opening it for a dataset.

`KeyIndexBuilder` takes each shard's SampleIndex as shards are finished
(`vlmdata shard` and `vlmdata index` feed it in the same pass that writes
planning.npz), external-sorts the keys and bulk-loads the LMDB file next to
the manifest: written under a temporary name and renamed (local) or uploaded
whole (object stores). `rebuild_keys` does the same from an existing
dataset (`vlmdata index --rebuild-keys`). The index records the manifest's
shard signature, so `open_dataset_keys` refuses one left from another
version of the dataset instead of answering with wrong locations.

LMDB needs a local file: for a dataset on an object store, `open_dataset_keys`
downloads keys.lmdb once into a local cache directory (~37 bytes per key).
"""
from __future__ import annotations

import hashlib
import os
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from fsspec.core import url_to_fs

from vlmdata import fsutil
from vlmdata.formats.manifest import Manifest, ShardInfo
from vlmdata.formats.sample_index import SampleIndex
from vlmdata.keyindex.codec import encode_keys, encode_locations
from vlmdata.keyindex.sorter import KeySorter
from vlmdata.keyindex.store import KEYS_NAME, KeyIndex, KeyIndexStats, write_key_index

__all__ = ["KeyIndexBuilder", "iter_indices", "open_dataset_keys", "rebuild_keys", "shard_signature"]

INDEX_THREADS = 16        # shard index files read ahead, in order
CACHE_ENV = "VLMDATA_KEYS_CACHE"


def shard_signature(shards: list[ShardInfo]) -> str:
    """What identifies a dataset's shards (names, checksums, sample counts), wherever it is stored."""
    h = hashlib.sha1()
    for s in shards:
        h.update(f"{s.name}:{s.crc32}:{s.samples};".encode())
    return h.hexdigest()


def iter_indices(root: str, shards: list[ShardInfo], storage_options: dict | None = None,
                 threads: int = INDEX_THREADS) -> Iterator[tuple[int, SampleIndex]]:
    """(shard number, SampleIndex) of every shard in order, loaded `threads` at a time (one window in memory)."""
    so = storage_options or {}

    def load(i: int) -> SampleIndex:
        ix = SampleIndex.load(fsutil.join(root, shards[i].index), so)
        if len(ix) != shards[i].samples:
            raise ValueError(f"{shards[i].index}: {len(ix)} samples, the manifest says {shards[i].samples}")
        return ix

    with ThreadPoolExecutor(max(1, threads), thread_name_prefix="vlmdata-index-read") as pool:
        pending = [pool.submit(load, i) for i in range(min(threads, len(shards)))]
        for i in range(len(shards)):
            ix = pending[i].result()
            pending[i] = None
            nxt = i + threads
            if nxt < len(shards):
                pending.append(pool.submit(load, nxt))
            yield i, ix


class KeyIndexBuilder:
    """keys.lmdb of the dataset at `root`, from its shards' indices added in shard order."""

    def __init__(self, root: str, storage_options: dict | None = None, tmp_dir: str | None = None):
        self.root = root
        self.storage_options = storage_options or {}
        self.tmp_dir = tmp_dir
        self.sorter = KeySorter(tmp_dir)

    def add_index(self, shard: int, index: SampleIndex) -> None:
        """The keys of shard number `shard` (its row numbers are their positions)."""
        self.sorter.add(encode_keys(index.key), encode_locations(shard, np.arange(len(index), dtype=np.int64)))

    def commit(self, shards: list[ShardInfo]) -> KeyIndexStats:
        """Write and publish keys.lmdb for a manifest holding `shards` (in the order they were added)."""
        meta = {"shards": len(shards), "samples": int(sum(s.samples for s in shards)),
                "signature": shard_signature(shards), "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        url = fsutil.join(self.root, KEYS_NAME)
        if fsutil.is_local(url):
            final = fsutil.local_path(url)
            tmp = os.path.join(os.path.dirname(os.path.abspath(final)), f".tmp-{uuid.uuid4().hex}.lmdb")
        else:
            final, tmp = None, os.path.join(self.tmp_dir or tempfile.gettempdir(), f".tmp-{uuid.uuid4().hex}.lmdb")
        try:
            stats = write_key_index(tmp, self.sorter.sorted_blocks(), meta)
            if final is not None:
                os.replace(tmp, final)
            else:
                fs, path = url_to_fs(url, **self.storage_options)
                fs.put_file(tmp, path)
        finally:
            self.sorter.close()
            for p in (tmp, tmp + "-lock"):
                if os.path.exists(p):
                    os.unlink(p)
        return stats

    def abort(self) -> None:
        self.sorter.close()


def rebuild_keys(root: str, storage_options: dict | None = None,
                 progress: Callable[[int, int], None] | None = None) -> KeyIndexStats:
    """(Re)build keys.lmdb of an existing dataset from its shard indices; `progress(samples, samples)`."""
    manifest = Manifest.load(root, storage_options)
    builder = KeyIndexBuilder(root, storage_options)
    try:
        for i, ix in iter_indices(root, manifest.shards, storage_options):
            builder.add_index(i, ix)
            if progress is not None:
                progress(len(ix), len(ix))
    except BaseException:
        builder.abort()
        raise
    return builder.commit(manifest.shards)


def _cache_dir() -> str:
    base = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "vlmdata", "keys")
    return fsutil.private_dir(base)          # a key index planted here would be trusted by every lookup


def _check(index: KeyIndex, manifest: Manifest, where: str) -> KeyIndex:
    if index.meta.get("signature") != shard_signature(manifest.shards):
        raise ValueError(f"{where} was built for another version of this dataset (its shards differ from "
                         f"manifest.json); rebuild it with `vlmdata index --rebuild-keys DATASET`")
    return index


def open_dataset_keys(root: str, manifest: Manifest | None = None, storage_options: dict | None = None) -> KeyIndex:
    """The dataset's key index, read-only and lock-free (downloaded once to a local cache if remote).

    FileNotFoundError (with what to run) if the dataset has none; ValueError if it is stale.
    """
    so = storage_options or {}
    manifest = manifest or Manifest.load(root, so)
    url = fsutil.join(root, KEYS_NAME)
    missing = f"no {KEYS_NAME} in {root}: build it with `vlmdata index --rebuild-keys {root}`"
    if fsutil.is_local(url):
        path = fsutil.local_path(url)
        if not os.path.isfile(path):
            raise FileNotFoundError(missing)
        return _check(KeyIndex(path), manifest, path)
    fs, rpath = url_to_fs(url, **so)
    try:
        info = fs.info(rpath)
    except FileNotFoundError:
        raise FileNotFoundError(missing) from None
    tag = f"{url}|{info.get('size')}|{info.get('ETag') or info.get('etag') or info.get('mtime') or ''}"
    local = os.path.join(_cache_dir(), hashlib.sha1(tag.encode()).hexdigest()[:20] + ".lmdb")
    if not os.path.isfile(local):
        tmp = f"{local}.{uuid.uuid4().hex}.part"
        try:
            fs.get_file(rpath, tmp)
            os.replace(tmp, local)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    fsutil.check_private_file(local)
    return _check(KeyIndex(local), manifest, url)
