"""The dataset-wide tables written after the shards: planning.npz and keys.lmdb, in one pass.

Both come from the shard indices, read in shard order a few at a time
(`keyindex.build.iter_indices`): each index's planning columns are streamed
into planning.npz (`formats.planning.PlanningWriter`) and its keys into the
key index's external sort. Memory stays at a few indices plus one sort run,
whatever the number of samples; the manifest, written after this, is what
makes the dataset visible.
"""
from __future__ import annotations

from collections.abc import Callable

from vlmdata import fsutil
from vlmdata.formats.manifest import PLANNING_NAME, ShardInfo
from vlmdata.formats.planning import PlanningWriter
from vlmdata.formats.sample_index import SampleIndex
from vlmdata.keyindex.build import KeyIndexBuilder, iter_indices
from vlmdata.keyindex.store import KeyIndexStats

__all__ = ["write_dataset_tables"]


def write_dataset_tables(root: str, shards: list[ShardInfo], storage_options: dict | None = None,
                         fsync: bool = True, progress: Callable[[int], None] | None = None,
                         on_index: Callable[[SampleIndex], None] | None = None,
                         video_policy=None) -> KeyIndexStats:
    """Write planning.npz and keys.lmdb for these shards (manifest order); returns the key index's stats.
    `progress(samples)` is called after each shard, `on_index(index)` with each shard's index in order
    (e.g. `ingest.lengths.LengthCounter.add_index`); a `video_policy` adds planning.npz's video_tokens."""
    so = storage_options or {}
    planning = PlanningWriter(fsutil.join(root, PLANNING_NAME), so, fsync, video_policy=video_policy)
    keys = KeyIndexBuilder(root, so)
    try:
        for i, ix in iter_indices(root, shards, so):
            planning.add_index(ix)
            keys.add_index(i, ix)
            if on_index is not None:
                on_index(ix)
            if progress is not None:
                progress(len(ix))
        planning.commit()
    except BaseException:
        planning.abort()
        keys.abort()
        raise
    return keys.commit(shards)
