"""VLMDataset wiring: shard indices loaded a window ahead, cache counts in packs, deferred-decode image
counts, make_loader's tuned settings with a user worker_init_fn, TurboJPEG on truncated images."""
from __future__ import annotations

import functools
import os
import pickle
import threading

import numpy as np
import pytest

import vlmdata.loading.shard_source as source_mod
from tests.helpers.cache import FAST_RETRY
from tests.helpers.dataset import make_samples, write_dataset
from vlmdata.cache import CacheConfig
from vlmdata.cache.daemon import DaemonClient
from vlmdata.decode.dali import image_owners
from vlmdata.loading import DatasetOptions, VLMDataset, make_loader
from vlmdata.metrics import MetricSet
from vlmdata.tune import LoaderSettings, WorkerThreads


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("ds"))
    samples = make_samples(96, seed=5)
    write_dataset(root, samples, shard_size=8)                  # 12 shards
    return root, samples


def dataset(root, **kw):
    opts = kw.pop("options", DatasetOptions(window_shards=2))
    return VLMDataset(root, seed=0, max_tokens=512, max_images=6, image_size=56, rank=0, world_size=1,
                      options=opts, **kw)


def test_shard_indices_load_in_background_once_and_stay_bounded(corpus, monkeypatch):
    root, samples = corpus
    loads, real = [], source_mod.fsutil.read_bytes

    def recording_read(url, storage_options=None, retry=None):
        if url.endswith(".index.npz"):
            loads.append((os.path.basename(url), threading.current_thread().name))
        return real(url, storage_options, retry)

    monkeypatch.setattr(source_mod.fsutil, "read_bytes", recording_read)
    ds = dataset(root)
    src = ds.sources[0]
    held = []
    keys = []
    for batch in make_loader(ds, num_workers=0):
        keys += batch["sample_keys"]
        held.append(len(src._indices) + len(src._pending))
    assert sorted(keys) == sorted(s.key for s in samples)
    names = [n for n, _ in loads]
    assert sorted(names) == sorted(set(names)) and len(names) == 12    # every index read once per epoch
    assert all(t.startswith("vlmdata-index") for _, t in loads)        # never in the reading thread
    assert max(held) <= 2 * 2                                           # two windows of 2 shards at most
    state = pickle.loads(pickle.dumps(src))                             # what a spawned worker gets
    assert state._indices == {} and state._pool is None and state._pending == {}


def test_cache_counts_reach_packs_exactly_once(corpus):
    root, _ = corpus
    cache = CacheConfig(memory_bytes=1 << 24, prefetch_bytes=0, retry=FAST_RETRY)
    ds = dataset(root, cache=cache)
    metrics = MetricSet()
    hits, misses, nbytes = {}, {}, 0
    for batch in make_loader(ds, num_workers=0):
        st = batch["stats"]
        metrics.absorb(st)
        for tier, n in st["cache_hits"].items():
            hits[tier] = hits.get(tier, 0) + n
        for tier, n in st["cache_misses"].items():
            misses[tier] = misses.get(tier, 0) + n
        nbytes += sum(st["fetch_bytes"].values())
    own = ds._fetcher.stats()                                    # the fetcher's cumulative counts
    assert hits == own["hits"] and misses == own["misses"] and own["remote_fetches"] >= 12
    assert nbytes == sum(own["bytes_served"].values())
    assert ds._fetcher.take_stats().is_empty()                   # nothing left to report twice
    got = metrics.registry.get_sample_value("vlmdata_cache_misses_total", {"tier": "memory"})
    assert got == own["misses"]["memory"]


def test_daemon_client_reports_its_fallback_cache(corpus, tmp_path):
    root, _ = corpus
    ds = dataset(root)
    client = DaemonClient(CacheConfig(memory_bytes=1 << 24, prefetch_bytes=0, daemon=str(tmp_path / "none.sock"),
                                      retry=FAST_RETRY))
    try:
        assert client.take_stats() is None                       # nothing fetched yet
        ref = ds.sources[0].ref(0)
        client.get(ref)
        client.get(ref)
        delta = client.take_stats()
        assert dict(delta.cache_hits) == {"memory": 1, "remote": 1} and delta.cache_misses["memory"] == 1
        assert delta.fetch_bytes["remote"] == ref.size
        assert client.take_stats().is_empty()
    finally:
        client.close()


def test_deferred_decode_packs_carry_image_counts(corpus):
    root, samples = corpus
    by_key = {s.key: s for s in samples}
    ds = dataset(root, options=DatasetOptions(window_shards=2, defer_decode=True))
    for batch in make_loader(ds, num_workers=0):
        counts = batch["image_counts"]
        assert counts.dtype.is_floating_point is False and str(counts.dtype) == "torch.int32"
        assert len(counts) == len(batch["cu_seqlens"]) - 1
        assert counts.tolist() == [len(by_key[k].images) for k in batch["sample_keys"]] or not batch["sample_keys"]
        assert int(counts.sum()) == len(batch["image_bytes"]) == batch["image_sizes"].shape[0]
        owners = image_owners(batch, ds.policy, np.asarray(batch["image_sizes"]), None)
        assert owners.tolist() == np.repeat(np.arange(len(counts)), counts.numpy()).tolist()


def _user_init(path, worker_id):
    import torch

    info = torch.utils.data.get_worker_info()
    with open(os.path.join(path, f"w{worker_id}"), "w") as f:
        f.write(str(info.dataset._decode_threads))               # the tuner's init ran first


def test_make_loader_auto_chains_user_worker_init_and_applies_threads(corpus, tmp_path, monkeypatch):
    import vlmdata.loading.loader as loader_module  # where make_loader looks the tuner up

    root, samples = corpus
    monkeypatch.setattr(loader_module, "auto_loader_settings", lambda ds: LoaderSettings(num_workers=2, decode_threads=3))
    ds = dataset(root)
    user = functools.partial(_user_init, str(tmp_path))
    loader = make_loader(ds, num_workers="auto", worker_init_fn=user)
    assert isinstance(loader.worker_init_fn, WorkerThreads) and loader.worker_init_fn.chain is user
    keys = [k for b in loader for k in b["sample_keys"]]
    assert sorted(keys) == sorted(s.key for s in samples)
    assert sorted(os.listdir(tmp_path)) == ["w0", "w1"]
    assert all((tmp_path / n).read_text() == "3" for n in ("w0", "w1"))

    monkeypatch.setattr(loader_module, "auto_loader_settings", lambda ds: LoaderSettings(num_workers=0, decode_threads=2))
    ds0 = dataset(root)
    loader = make_loader(ds0, num_workers="auto")
    assert loader.num_workers == 0 and ds0._decode_threads == 2
    assert sorted(k for b in loader for k in b["sample_keys"]) == sorted(s.key for s in samples)


def test_truncated_jpeg_costs_exactly_one_sample_with_turbo(tmp_path):
    samples = make_samples(32, seed=9)
    bad = next(s.key for s in samples if len(s.images) == 1)
    root = str(tmp_path / "ds")
    write_dataset(root, samples, shard_size=8, corrupt_keys=frozenset([bad]), truncate=True)
    ds = dataset(root, decoder="turbo")
    batches = list(make_loader(ds, num_workers=0))
    keys = [k for b in batches for k in b["sample_keys"]]
    skipped = {}
    for b in batches:
        for reason, n in b["stats"]["skipped"].items():
            skipped[reason] = skipped.get(reason, 0) + n
    assert sorted(keys) == sorted(s.key for s in samples if s.key != bad)
    assert skipped == {"corrupt_image": 1}
