"""VLMDataset through real DataLoader workers: exactly-once, budgets, contents, resume, modes."""
import numpy as np
import pytest

from tests.helpers.dataset import TOK, expected_sample, make_samples, write_dataset
from vlmdata.decode import DynamicPolicy, FixedPolicy
from vlmdata.formats import SampleIndex
from vlmdata.loading import DatasetOptions, VLMDataset, make_loader

MAX_TOKENS, MAX_IMAGES = 512, 6


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("ds"))
    samples = make_samples(120, seed=0, long_text=150)
    write_dataset(root, samples, shard_size=16)
    return root, {s.key: s for s in samples}


def dataset(root, rank=0, world=1, **kw):
    opts = kw.pop("options", DatasetOptions(window_shards=3))
    return VLMDataset(root, seed=kw.pop("seed", 0), max_tokens=kw.pop("max_tokens", MAX_TOKENS),
                      max_images=MAX_IMAGES, image_size=kw.pop("image_size", 56), rank=rank,
                      world_size=world, options=opts, **kw)


def run(ds, workers=0, state=None, **kw):
    if state is not None:
        ds.load_state_dict(state)
    return list(make_loader(ds, num_workers=workers, **kw))


def keys_of(batches):
    return [k for b in batches for k in b["sample_keys"]]


def test_two_ranks_three_workers_exactly_once_over_two_epochs(corpus):
    root, samples = corpus
    orders = []
    for epoch in (0, 1):
        per_rank = []
        for rank in (0, 1):
            ds = dataset(root, rank, 2)
            ds.set_epoch(epoch)
            per_rank.append(run(ds, workers=3))
        assert len(per_rank[0]) == len(per_rank[1])             # same number of steps on every rank
        keys = keys_of(per_rank[0]) + keys_of(per_rank[1])
        assert sorted(keys) == sorted(samples)
        orders.append(keys)
    assert orders[0] != orders[1]


def test_packs_within_budgets_and_contents_match_source(corpus):
    root, samples = corpus
    batches = run(dataset(root), workers=2)
    per_image = FixedPolicy(56, 14).tokens_per_image
    truncated = 0
    for b in batches:
        ids, labels, pos = b["input_ids"].tolist(), b["labels"].tolist(), b["position_ids"].tolist()
        cu = b["cu_seqlens"].tolist()
        assert len(ids) <= MAX_TOKENS and b["pixel_values"].shape[0] <= MAX_IMAGES
        assert cu[0] == 0 and cu[-1] == len(ids) and len(cu) == len(b["sample_keys"]) + 1
        assert b["max_seqlen"] == max(np.diff(cu))
        n_images = 0
        for j, key in enumerate(b["sample_keys"]):
            s = samples[key]
            exp_ids, exp_labels = expected_sample(s, [per_image] * len(s.images))
            got = ids[cu[j]:cu[j + 1]]
            if len(exp_ids) > MAX_TOKENS:
                truncated += 1
                exp_ids, exp_labels = exp_ids[:MAX_TOKENS], exp_labels[:MAX_TOKENS]
            assert got == exp_ids
            assert labels[cu[j]:cu[j + 1]] == exp_labels
            assert pos[cu[j]:cu[j + 1]] == list(range(len(got)))
            n_images += got.count(TOK.special.image) // per_image
        assert b["pixel_values"].shape[0] == n_images
    assert truncated > 0
    assert sum(b["stats"]["truncated"] for b in batches) == truncated
    assert sum(b["stats"]["samples"] for b in batches) == len(samples)


def test_mid_epoch_resume_through_workers_is_identical(corpus):
    root, _ = corpus
    full = run(dataset(root), workers=2)
    assert len(full) > 12
    for at in (0, 6, len(full) - 2):
        resumed = run(dataset(root), workers=3, state=full[at]["state"])
        assert [b["sample_keys"] for b in resumed] == [b["sample_keys"] for b in full[at + 1:]]
        assert all(np.array_equal(a["input_ids"], b["input_ids"]) for a, b in zip(resumed, full[at + 1:]))
    done = run(dataset(root), workers=2, state=full[-1]["state"])
    assert done == []


def test_world_size_two_to_one_resume_loses_and_repeats_nothing(corpus):
    root, samples = corpus
    r0, r1 = run(dataset(root, 0, 2), workers=2), run(dataset(root, 1, 2), workers=2)
    step = 4
    assert r0[step]["state"] == r1[step]["state"]
    consumed = keys_of(r0[:step + 1]) + keys_of(r1[:step + 1])
    rest = run(dataset(root, 0, 1), workers=2, state=r0[step]["state"])
    assert sorted(consumed + keys_of(rest)) == sorted(samples)


def test_stateful_dataloader_resume(corpus):
    root, _ = corpus
    full = [b["sample_keys"] for b in run(dataset(root), workers=2)]
    loader = make_loader(dataset(root), num_workers=2, stateful=True)
    it = iter(loader)
    head = [next(it)["sample_keys"] for _ in range(5)]
    sd = loader.state_dict()
    del it
    loader2 = make_loader(dataset(root), num_workers=2, stateful=True)
    loader2.load_state_dict(sd)
    tail = [b["sample_keys"] for b in loader2]
    assert head + tail == full


def test_state_from_other_dataset_is_rejected(corpus):
    root, _ = corpus
    state = next(iter(dataset(root)))["state"]
    with pytest.raises(ValueError, match="same settings"):
        dataset(root, seed=1).load_state_dict(state)


def test_bucket_mode(corpus):
    root, samples = corpus
    ds = dataset(root, options=DatasetOptions(window_shards=3, mode="bucket"))
    batches = run(ds, workers=2)
    assert sorted(keys_of(batches)) == sorted(samples)
    for b in batches:
        bsz, length = b["input_ids"].shape
        assert bsz == len(b["sample_keys"]) and bsz * length <= MAX_TOKENS
        assert b["attention_mask"].sum(1).tolist() == b["lengths"].tolist()
        assert b["max_seqlen"] == length


def test_dynamic_policy_shapes_and_grids(corpus):
    root, samples = corpus
    pol = DynamicPolicy(patch=14, merge=2, min_pixels=28 * 28, max_pixels=112 * 112)
    batches = run(dataset(root, image_size=pol, max_tokens=1024), workers=2)
    assert sorted(keys_of(batches)) == sorted(samples)
    for b in batches:
        sizes = [(im.width, im.height) for k in b["sample_keys"] for im in samples[k].images]
        assert b["image_grid"].tolist() == [[1, *pol.grid(w, h)] for w, h in sizes]
        counts = [gh * gw for gh, gw in (pol.grid(w, h) for w, h in sizes)]
        assert b["vision_cu_seqlens"].tolist() == np.concatenate([[0], np.cumsum(counts)]).tolist()
        assert tuple(b["pixel_values"].shape) == (sum(counts), 3 * 14 * 14)
        assert int((b["input_ids"] == TOK.special.image).sum()) == sum(c // 4 for c in counts)


def test_defer_decode_carries_encoded_images(corpus):
    root, samples = corpus
    b = next(iter(dataset(root, options=DatasetOptions(window_shards=3, defer_decode=True))))
    expect = [im for k in b["sample_keys"] for im in samples[k].images]
    assert "pixel_values" not in b
    assert [bytes(x) for x in b["image_bytes"]] == [im.data for im in expect]
    assert b["image_sizes"].tolist() == [[im.width, im.height] for im in expect]


def test_mixing_weights(tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    write_dataset(a, make_samples(40, seed=1, prefix="a"), shard_size=8)
    write_dataset(b, make_samples(40, seed=2, prefix="b"), shard_size=8)
    ds = VLMDataset([(a, 3.0), (b, 1.0)], max_tokens=MAX_TOKENS, max_images=MAX_IMAGES, image_size=56,
                    rank=0, world_size=1, options=DatasetOptions(window_shards=2))
    keys = keys_of(run(ds, workers=2))
    assert sum(k.startswith("a") for k in keys) == 60 and sum(k.startswith("b") for k in keys) == 20
    again = keys_of(run(VLMDataset([(a, 3.0), (b, 1.0)], max_tokens=MAX_TOKENS, max_images=MAX_IMAGES,
                                   image_size=56, rank=0, world_size=1,
                                   options=DatasetOptions(window_shards=2))))
    assert again == keys


def test_memmap_dataset_needs_no_decode(tmp_path):
    root = str(tmp_path / "mm")
    samples = make_samples(30, seed=4)
    write_dataset(root, samples, shard_size=8, kind="memmap", image_size=56)
    batches = run(VLMDataset(root, max_tokens=MAX_TOKENS, max_images=MAX_IMAGES, image_size=56, rank=0,
                             world_size=1, decoder="no-such-decoder", options=DatasetOptions(window_shards=2)))
    assert sorted(keys_of(batches)) == sorted(s.key for s in samples)
    assert sum(b["pixel_values"].shape[0] for b in batches) == sum(len(s.images) for s in samples)
    with pytest.raises(ValueError, match="image_size=56"):
        VLMDataset(root, image_size=112, rank=0, world_size=1)


class RecordingFetcher:
    def __init__(self):
        from vlmdata.cache import DirectFetcher

        self.inner = DirectFetcher()
        self.plans, self.gets, self.at = [], [], []

    def plan_ahead(self, refs):
        self.plans.append([r.url for r in refs])
        self.at.append(len(self.gets))            # reads done when the plan came

    def get(self, ref):
        self.gets.append(ref.url)
        return self.inner.get(ref)


class RecordingCache:
    def __init__(self):
        self.opened = []

    def open(self):
        self.opened.append(RecordingFetcher())
        return self.opened[-1]


def test_fetcher_is_told_the_future_in_order(corpus):
    root, _ = corpus
    cache = RecordingCache()
    ds = dataset(root, cache=cache)
    list(ds)
    assert len(cache.opened) == 1
    f = cache.opened[0]
    assert f.plans and len(f.gets) == len(set(f.gets)) == 8          # each shard fetched once per epoch
    # window_shards=3: windows of 3, 3 and 2 shards. Each window is announced twice: when it starts (its
    # reads in read order, later windows by their shards) and after its first pack (also the next window's
    # reads in read order, planned then). Every plan names every shard still to be read, the next ones
    # first, in the order they are read.
    assert len(f.plans) == 6 and f.at[0] == 0
    for plan, at in zip(f.plans, f.at):
        future, held = f.gets[at:], set(f.gets[:at])
        ahead = [u for u in dict.fromkeys(plan) if u not in held]
        assert set(future) <= set(ahead)
        n = min(3, len(future))
        assert ahead[:n] == future[:n]
    assert sorted(f.plans[0]) == sorted(f.gets)


def test_announced_reads_match_each_workers_packs(corpus):
    from vlmdata.plan import rank_packs

    root, _ = corpus
    for rank in (0, 1):
        ds = dataset(root, rank, 2)
        p = ds.planner()
        shard = ds.corpus.shard_of
        for wid in range(3):
            items = list(rank_packs(p, 0, 2, rank, wid, 3))
            for k in range(p.num_windows):
                reads = [int(x) for a in items if a.window == k for x in shard(a.samples)]
                first = next((a.step for a in items if a.window is not None and a.window >= k), wid)
                assert ds._worker_reads(p, k, 0, first, 3) == list(dict.fromkeys(reads))


def test_num_steps_and_decode_threads(corpus):
    root, _ = corpus
    for rank in (0, 1):
        ds = dataset(root, rank, 2)
        plain = run(ds)
        assert ds.num_steps() == len(plain)
        threaded = dataset(root, rank, 2)
        threaded.set_decode_threads(3)
        again = run(threaded)
        assert all(np.array_equal(a["pixel_values"], b["pixel_values"]) for a, b in zip(plain, again))
        # the thread pool made in this process must not be inherited by forked workers (it would hang)
        forked = run(threaded, workers=2, timeout=120)
        assert [b["sample_keys"] for b in forked] == [b["sample_keys"] for b in plain]
    with pytest.raises(ValueError):
        ds.set_decode_threads(0)


def test_gzip_shards_indexed_in_place(tmp_path):
    import gzip
    import json
    import os
    import zlib

    root = str(tmp_path / "gz")
    samples = make_samples(20, seed=5)
    write_dataset(root, samples, shard_size=8)
    with open(os.path.join(root, "manifest.json")) as f:
        manifest = json.load(f)
    for shard in manifest["shards"]:
        raw = open(os.path.join(root, shard["name"]), "rb").read()
        packed = gzip.compress(raw)
        os.remove(os.path.join(root, shard["name"]))
        shard["name"] += ".gz"
        with open(os.path.join(root, shard["name"]), "wb") as f:
            f.write(packed)
        shard["bytes"], shard["crc32"] = len(packed), zlib.crc32(packed) & 0xFFFFFFFF
        index = os.path.join(root, shard["index"])       # as `vlmdata index` writes it: names the .gz it describes
        SampleIndex.load(index).describes(shard["bytes"], shard["crc32"]).save(index)
    manifest["layout"]["compression"] = "gzip"
    with open(os.path.join(root, "manifest.json"), "w") as f:
        json.dump(manifest, f)
    keys = keys_of(run(VLMDataset(root, max_tokens=MAX_TOKENS, max_images=MAX_IMAGES, image_size=56, rank=0,
                                  world_size=1, options=DatasetOptions(window_shards=2)), workers=2))
    assert sorted(keys) == sorted(s.key for s in samples)
