"""VLMDataset: the planned, packed, resumable IterableDataset.

Wiring only; each job lives in its own module:
    source.py   open datasets (manifest + planning columns; shard indices on demand)
    plan/       the global pack sequence of an epoch (shuffle, pack, bucket, assign)
    cache/      the ShardFetcher (DirectFetcher when no cache is given)
    decode/     image decoding (TurboJPEG/Pillow on CPU; DALI in the main process with defer_decode)
    collate.py  the PackedBatch

Per DataLoader worker: it walks the rank's steps w, w + nw, ... of the global
pack sequence, tells the fetcher which shards it will read (`plan_ahead`),
holds the shards of the current window while reading them, reads and
decodes each pack's samples, and yields the collated pack with `state` (the
resume point right after it) and `stats` (counts for metrics). Bad data never
stops the epoch: the samples concerned are skipped and counted by reason.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from functools import partial

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from vlmdata.cache.fetch import DirectFetcher, ShardRef
from vlmdata.decode.policy import FixedPolicy, ImagePolicy, make_policy
from vlmdata.decode.tiled import is_tiled
from vlmdata.errors import (
    BadIndexError,
    CorruptShardError,
    FetchError,
    IndexMismatchError,
    ShardChangedError,
    ShardReadError,
    Skip,
)
from vlmdata.keyindex.lookup import FoundSample, find_samples
from vlmdata.loading.batching import refuse_batching  # noqa: F401  (registers it with default_collate)
from vlmdata.loading.collate import CollateConfig
from vlmdata.loading.memmap_pack import read_memmap_pack
from vlmdata.loading.overlong import LengthTally
from vlmdata.loading.pack_build import build_pack
from vlmdata.loading.shard_source import Source, open_source
from vlmdata.loading.shared_position import SharedPosition
from vlmdata.loading.text_views import (
    check_text_views,
    check_tiled_decode,
    choose_pack_limits,
    choose_pixels,
    choose_policy,
)
from vlmdata.loading.video_decode import decode_videos, defer_videos
from vlmdata.loading.warm_start import warm
from vlmdata.metrics.counts import StatsDelta, take_fetch_stats
from vlmdata.plan.assign import rank_packs, rank_step_samples
from vlmdata.plan.balance import Balance
from vlmdata.plan.epoch import Corpus, EpochPlanner, PlanOptions
from vlmdata.plan.shared import PlanShare
from vlmdata.retry import RetryPolicy
from vlmdata.text.families.base import FamilySpec

log = logging.getLogger(__name__)
STATE_VERSION = 1


@dataclass
class DatasetOptions:
    """Less common VLMDataset settings.

    mode: "pack" (sequence packing) or "bucket" (similar lengths padded to the batch's longest).
    window_shards: shards shuffled and packed together (the cache should hold about this many).
    overlong: samples longer than max_tokens are "truncate"d at the text tail or "drop"ped.
    storage_options: fsspec options for the dataset URLs (also used by the direct fetcher).
    defer_decode: put encoded `image_bytes` + `image_sizes` in the pack instead of pixels, and each
        clip's bytes with the frames its policy sampled (`video_bytes`, `video_frames`, ...:
        loading.video_pack) instead of `pixel_values_videos` (the main process decodes, e.g. with DALI
        on the GPU: decode.dali.gpu.DaliGpuStage, decode.dali.video.DaliVideoStage).
    mix_samples: samples per epoch when mixing several datasets (default: their sizes summed).
    retry: the retry policy (vlmdata.retry.RetryPolicy) of the dataset's own reads: manifest, planning
        columns, shard indices, and shards when `cache` is None (a cache has its own `retry`). None: the
        default, which waits out a store outage of up to 5 minutes.
    verify_index: check every shard index against its shard (the shard's checksum, each sample's tar
        member names and sizes; vlmdata.formats.index_checks). Off only to measure the checks' cost or for
        tars whose member names another tool wrote in a way the check does not understand.
    length: what `len(ds)` returns: "exact" (plans every window of the epoch once, cached) or "estimate"
        (`estimated_len()`: a few windows planned, scaled to the epoch; for progress bars on huge datasets).
    pixels: "exact" (the model family's image processor's pixel_values, bit for bit: full decode, the
        folder's resample filter, orientation first) or "fast" (JPEG draft decode and a bilinear resize:
        faster, close but not equal). None: "exact" for a dataset sharded with a model folder and decoded
        by Pillow in the workers, else "fast" (loading.text_views.choose_pixels).
    warm_start: plan the epoch's first window in a background thread of the process that builds the
        dataset (while the model loads), so the first pack does not wait for it (`loading.warm_start`).
    plan_dir: a directory shared by all ranks of a node (e.g. /dev/shm/vlmdata-plans): each window of
        the epoch is then planned once per node. Default: a private directory per rank (made when the
        dataset is created, before its DataLoader workers start), so each window is planned once per rank.
    balance: "compute", "tokens" or "none", or a vlmdata.plan.Balance (cost model, tolerance, block):
        packs of similar cost side by side in the plan and each step's samples re-dealt among its ranks so
        that no rank waits for a costlier one (docs/compute-balance.md). Part of the resume fingerprint.
    """

    mode: str = "pack"
    window_shards: int = 8
    overlong: str = "truncate"
    storage_options: dict = field(default_factory=dict)
    defer_decode: bool = False
    mix_samples: int | None = None
    retry: RetryPolicy | None = None
    verify_index: bool = True
    plan_dir: str | None = None
    balance: Balance | str = "none"
    length: str = "exact"
    pixels: str | None = None
    warm_start: bool = True

    def __post_init__(self) -> None:
        if self.length not in ("exact", "estimate"):
            raise ValueError(f"length must be 'exact' or 'estimate', got {self.length!r}")


def _resolve_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    if rank is not None and world_size is not None:
        r, w = int(rank), int(world_size)
    elif torch.distributed.is_available() and torch.distributed.is_initialized():
        r, w = torch.distributed.get_rank(), torch.distributed.get_world_size()
    else:
        r, w = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if rank is not None:
        r = int(rank)
    if world_size is not None:
        w = int(world_size)
    if w < 1 or not 0 <= r < w:
        raise ValueError(f"rank {r} is not in [0, world_size={w})")
    return r, w


def _sources_arg(source) -> list[tuple[str, float]]:
    if isinstance(source, (str, os.PathLike)):
        return [(os.fspath(source), 1.0)]
    out = []
    for item in source:
        if isinstance(item, (str, os.PathLike)):
            out.append((os.fspath(item), 1.0))
        else:
            src, weight = item
            out.append((os.fspath(src), float(weight)))
    if not out:
        raise ValueError("VLMDataset needs at least one dataset")
    return out


class _Window:
    """The shards a worker holds while it reads one window: readers, or why a shard is unreadable."""

    def __init__(self) -> None:
        self.key: object = None
        self.readers: dict[int, object] = {}


class VLMDataset(IterableDataset):
    """Packed (or bucketed) VLM batches from one or more vlmdata datasets; see the module docstring.

    `source`: a dataset path/URL, or a list of (path/URL, weight) to mix.
    `image_size`: an int (fixed square size) or a FixedPolicy / DynamicPolicy.
    `rank` / `world_size`: default from torch.distributed, else RANK / WORLD_SIZE, else 0 / 1.
    `decoder`: "turbo" | "pillow" | "dali" | "auto" (vlmdata.decode.choose.make_decoder; "auto" is
        TurboJPEG when simplejpeg is installed, else Pillow, unless a measurement recorded otherwise).
    `cache`: None (direct reads) or a picklable object whose `.open()` gives a ShardFetcher,
        called once in each worker process.
    `image_size`: None (default) takes the image policy of the dataset's model family (a dataset
        sharded with `--tokenizer MODEL_DIR`), else 336 px fixed.
    `text_view`: the text view to read (`vlmdata retokenize` adds views); None: each dataset's default.
        Mixed datasets must share the view's tokenizer identity.
    `max_images` / `max_patches`: the image budget of a pack, as images or as vision patches (one of them).
        None for both: the image policy's default (loading.text_views.choose_pack_limits): no image count
        limit and max_tokens x merge^2 patches for a dynamic-resolution family (Qwen2-VL, Qwen2.5-VL, whose
        vision tower runs varlen), 16 images for a fixed-size one (LLaVA) and vlmdata's own layouts.
    `len(ds)`: the packs this rank yields in a whole pass of the selected epoch (PyTorch's convention:
        the epoch's total, whatever the resume point; `num_steps()` counts those left). Exact: it plans
        every window of the epoch once (0.05-0.12 CPU-s per 40,000 samples; docs/dataloader.md), cached
        per epoch and shared with the workers through the plan share. `estimated_len()` plans only a few.
    `log_lengths`: log, once per epoch and worker, the samples truncated or dropped for their length
        (`loading.overlong`); the tuner turns it off for its measurement passes.
    """

    log_lengths = True
    memmap_pack_reads = True     # memmap packs read whole (loading.memmap_pack); False: sample by sample

    def __init__(self, source, seed: int = 0, max_tokens: int = 8192, max_images: int | None = None,
                 image_size: int | ImagePolicy | None = None, rank: int | None = None, world_size: int | None = None,
                 decoder: str = "auto", cache=None, options: DatasetOptions | None = None,
                 text_view: str | None = None, max_patches: int | None = None):
        super().__init__()
        self.options = options or DatasetOptions()
        self.seed = int(seed)
        self.decoder_name = decoder
        self.cache = cache
        self.rank, self.world_size = _resolve_world(rank, world_size)
        so = self.options.storage_options
        specs = _sources_arg(source)
        retry = self.options.retry or RetryPolicy()
        self.sources: list[Source] = [open_source(root, so, text_view, retry, self.options.verify_index)
                                      for root, _ in specs]
        self.text_view = text_view
        self.model_family: FamilySpec | None = check_text_views(self.sources)
        self.policy = choose_policy(image_size, self.model_family)
        check_tiled_decode(self.policy, decoder, self.options.defer_decode)
        self._check_sources()
        self._memmap_only = all(s.kind == "memmap" for s in self.sources)
        self.pixels = choose_pixels(self.options.pixels, self.model_family, decoder,
                                    any(s.kind == "memmap" for s in self.sources), self.options.defer_decode)
        max_images, max_patches = choose_pack_limits(self.policy, max_tokens, max_images, max_patches)
        self.plan_options = PlanOptions(max_tokens=int(max_tokens), max_images=max_images, max_patches=max_patches,
                                        window_shards=self.options.window_shards, mode=self.options.mode,
                                        overlong=self.options.overlong, mix_samples=self.options.mix_samples,
                                        balance=self._balance())
        self.corpus = Corpus.build([s.planning for s in self.sources], [s.shard_sizes() for s in self.sources],
                                   [w for _, w in specs])
        special = self.sources[0].tokenizer.get("special", {})
        self.collate_config = CollateConfig(policy=self.policy, image_token_id=int(special.get("image", 258)),
                                            pad_token_id=int(special.get("pad", 259)), max_tokens=int(max_tokens),
                                            defer_decode=self.options.defer_decode,
                                            video_token_id=special.get("video"), video_policy=self._video_policy())
        self.fingerprint = self._fingerprint([w for _, w in specs])
        self._epoch = 0
        self._cursor = 0
        self._worker_resume: dict | None = None
        self._anchor: tuple[int, int] | None = None    # a window known to start at or before the cursor
        self._plan_share = PlanShare.at(self.options.plan_dir) if self.options.plan_dir else PlanShare.create()
        self._last_state: dict | None = None
        self._progress: dict | None = None          # worker-side position, for StatefulDataLoader
        self._fetcher = None
        self._fetcher_pid = -1
        self._decoder = None
        self._decode_threads = 1
        self._pool = None
        self._owner_pid = os.getpid()                 # decoder and thread pool belong to this process
        self._position = SharedPosition()             # epoch + cursor for persistent DataLoader workers
        self._position_gen = 0                        # the generation of it this copy has applied
        self._lengths: dict[tuple[int, str], int] = {}  # (epoch, "exact" | "estimate") -> len
        self._warm = self._warm_start() if self.options.warm_start else None

    def _video_policy(self):
        """The model family's video policy (video.policy.VideoPolicy), or None without one."""
        from vlmdata.video.policy import make_video_policy

        return make_video_policy(self.model_family.vision.video_policy) if self.model_family else None

    def _balance(self) -> Balance:
        """The balance of the options, its cost model counting the image policy's patches per token."""
        balance = Balance.of(self.options.balance)
        return replace(balance, cost=balance.cost.for_policy(self.policy)) if balance.active else balance

    # ---- configuration checks ---------------------------------------------------------------
    def _check_sources(self) -> None:
        for s in self.sources:
            if s.kind == "memmap":
                stored = make_policy(s.manifest.image_policy) if s.manifest.image_policy else None
                if not isinstance(self.policy, FixedPolicy) or stored is None or stored.size != self.policy.size:
                    size = getattr(stored, "size", "?")
                    raise ValueError(f"{s.root} is a memmap dataset of {size}px images: pass image_size={size}")
                if self.options.defer_decode:
                    raise ValueError(f"{s.root} is a memmap dataset (already decoded): defer_decode does not apply")

    def tune_fingerprint(self) -> dict:
        """What identifies this pipeline for the tuning cache: sources (URL + manifest hash), packing, policy,
        decoder, cache type, decode placement and mode."""
        sources = [{"url": s.root, "manifest_sha256": hashlib.sha256(s.manifest.to_json().encode()).hexdigest()[:24],
                    "samples": s.num_samples} for s in self.sources]
        return {"sources": sources, "plan": self._plan_identity(), "policy": self.policy.to_dict(),
                "decoder": self.decoder_name, "cache": type(self.cache).__qualname__,
                "defer_decode": self.options.defer_decode, "mode": self.options.mode, "pixels": self.pixels}

    def _plan_identity(self) -> dict:
        """The plan options as fingerprinted: without a balance or a patch budget, as before they existed
        (old states resume)."""
        plan = asdict(self.plan_options)
        if not self.plan_options.balance.active:
            del plan["balance"]
        if plan["max_patches"] is None:           # no patch budget: the fingerprint of datasets before it
            del plan["max_patches"]
        return plan

    def _fingerprint(self, weights: list[float]) -> str:
        # the shards' names and checksums identify a dataset wherever it lives (a copy moved to S3 resumes)
        ident = [hashlib.sha1(";".join(f"{x.name}:{x.crc32}:{x.samples}" for x in s.manifest.shards).encode())
                 .hexdigest() for s in self.sources]
        desc = {"sources": ident, "weights": weights,
                "plan": self._plan_identity(), "policy": self.policy.to_dict(), "seed": self.seed}
        views = [s.view_name for s in self.sources]
        if any(v != "default" for v in views):   # the text view changes the packs (datasets before views: unchanged)
            desc["views"] = views
        return hashlib.sha1(json.dumps(desc, sort_keys=True).encode()).hexdigest()[:16]

    # ---- epoch and state ------------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch to iterate; a resume point loaded for this same epoch is kept."""
        if int(epoch) != self._epoch:
            self._epoch, self._cursor = int(epoch), 0
            self._worker_resume = None
            self._anchor = None
            self._last_state = None
            self._publish_position()

    def _state(self, cursor: int, window: tuple[int, int] | None = None) -> dict:
        state = {"version": STATE_VERSION, "epoch": self._epoch, "cursor": int(cursor), "seed": self.seed,
                 "world_size": self.world_size, "fingerprint": self.fingerprint}
        if window is not None and window[1] <= cursor:
            state["window"] = [int(window[0]), int(window[1])]   # resume plans from here, not from window 0
        return state

    def state_dict(self) -> dict:
        """Plain-data resume point. In a DataLoader worker (StatefulDataLoader) it also says
        where this worker is, so that each worker resumes with its own next pack."""
        info = get_worker_info()
        if info is None:
            return dict(self._last_state) if self._last_state else self._state(self._cursor, self._anchor)
        progress = self._progress or {"base": self._cursor, "next_step": info.id, "cursor": self._cursor}
        if self._worker_resume and self._progress is None:
            progress = dict(self._worker_resume, cursor=self._worker_resume["base"])
        state = self._state(progress["cursor"], progress.get("window", self._anchor))
        state["worker"] = {"id": info.id, "num_workers": info.num_workers, "base": progress["base"],
                           "next_step": progress["next_step"]}
        return state

    def load_state_dict(self, state: dict) -> None:
        """Resume right after the pack that carried `state` (or where a worker's state says)."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"state version {state.get('version')} is not {STATE_VERSION}")
        if state.get("fingerprint") != self.fingerprint:
            raise ValueError("this state belongs to a dataset with other sources, seed, budgets, image policy or balance; "
                             "create the VLMDataset with the same settings to resume")
        self._epoch = int(state["epoch"])
        self._cursor = int(state["cursor"])
        self._last_state = None
        self._worker_resume = None
        hint = state.get("window")
        self._anchor = (int(hint[0]), int(hint[1])) if hint and 0 <= int(hint[1]) <= self._cursor else None
        worker = state.get("worker")
        info = get_worker_info()
        if worker and info is not None and worker["id"] == info.id and worker["num_workers"] == info.num_workers \
                and state.get("world_size") == self.world_size:
            self._worker_resume = {"base": int(worker["base"]), "next_step": int(worker["next_step"])}
        if info is None:
            self._publish_position()
        else:                                        # loaded in this worker: newer than what was published
            self._position_gen = self._position.read()[0]

    def _publish_position(self) -> None:
        """Hand the epoch and cursor to DataLoader workers, persistent ones included (see shared_position)."""
        if get_worker_info() is None:
            self._position_gen = self._position.publish(self._epoch, self._cursor)
            if self.options.warm_start:           # the first window to plan is now the new position's
                self.planner()
                self._warm = self._warm_start()

    def _adopt_position(self) -> None:
        """In a worker: take the epoch and cursor the main process published since this copy last looked."""
        gen, epoch, cursor = self._position.read()
        if gen != self._position_gen:
            self._epoch, self._cursor, self._position_gen = epoch, cursor, gen
            self._worker_resume = None
            self._last_state = None

    # ---- per-process resources ----------------------------------------------------------------
    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_fetcher"] = None
        state["_fetcher_pid"] = -1
        state["_decoder"] = None
        state["_pool"] = None
        state["_warm"] = None
        return state

    @property
    def decode_threads(self) -> int:
        """Threads each pack's images are decoded with (see `set_decode_threads`)."""
        return self._decode_threads

    def set_decode_threads(self, threads: int) -> None:
        """Decode each pack's images with this many threads (Pillow releases the GIL while decoding)."""
        if int(threads) < 1:
            raise ValueError(f"decode threads must be >= 1, got {threads}")
        self._decode_threads = int(threads)
        self._pool = None

    def _decode_images(self, decoder, images: list, sizes: list, counts: list) -> list:
        """Decode `images` (`counts`: the image count of each one's sample, for a per_sample policy)."""
        n = self._decode_threads
        self._own_process()
        per_sample = getattr(self.policy, "per_sample", False)

        def run(ims, szs, cts):
            return decoder.decode(ims, szs, self.policy, cts) if per_sample else decoder.decode(ims, szs, self.policy)

        if n <= 1 or len(images) < 2:
            return run(images, sizes, counts)
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(n, thread_name_prefix="vlmdata-decode")
        step = -(-len(images) // n)
        chunks = [(images[i:i + step], sizes[i:i + step], counts[i:i + step]) for i in range(0, len(images), step)]
        parts = self._pool.map(lambda c: run(*c), chunks)
        return [im for part in parts for im in part]

    def _get_fetcher(self):
        if self._fetcher is None or self._fetcher_pid != os.getpid():
            if self.cache is None:
                self._fetcher = DirectFetcher(self.options.storage_options, self.options.retry)
            else:
                self._fetcher = self.cache.open()
            self._fetcher_pid = os.getpid()
        return self._fetcher

    def _own_process(self) -> None:
        """Drop per-process resources inherited through fork (threads and decoders do not survive it)."""
        if self._owner_pid != os.getpid():
            self._decoder, self._pool, self._owner_pid = None, None, os.getpid()

    def _get_decoder(self):
        self._own_process()
        if self._decoder is None:
            from vlmdata.decode.choose import make_decoder

            vision = self.model_family.vision if self.model_family else None
            name = "pillow" if is_tiled(self.policy) and self.decoder_name == "auto" else self.decoder_name
            self._decoder = make_decoder(name, self.pixels, resample=vision.resample if vision else 3,
                                         crop=bool(vision and vision.image_size is not None))
        return self._decoder

    def _ref(self, shard: int) -> ShardRef:
        i = self.corpus.source_of_shard(shard)
        return self.sources[i].ref(shard - int(self.corpus.shard_base[i]))

    def num_steps(self) -> int:
        """Packs this rank yields in the selected epoch from the resume point (the same on every
        rank; plans the whole epoch, so it costs seconds on a huge dataset)."""
        remaining = max(0, self.planner().total() - self._cursor)
        return -(-remaining // self.world_size)

    def __len__(self) -> int:
        """Packs this rank yields in a whole pass of the selected epoch (see the class docstring)."""
        if self.options.length == "estimate":
            return self.estimated_len()
        key = (self._epoch, "exact")
        if key not in self._lengths:
            self._lengths[key] = -(-self.planner().total() // self.world_size)
        return self._lengths[key]

    def __bool__(self) -> bool:
        return True                                   # never plan the epoch to answer `if ds:`

    def estimated_len(self, windows: int = 4) -> int:
        """`len(ds)` estimated from `windows` windows spread over the epoch (EpochPlanner.estimate_total);
        exact when the epoch has no more windows than that. Cached per epoch."""
        key = (self._epoch, f"estimate-{int(windows)}")
        if key not in self._lengths:
            self._lengths[key] = -(-self.planner().estimate_total(windows) // self.world_size)
        return self._lengths[key]

    # ---- random access by key --------------------------------------------------------------------
    def lookup_all(self, key: str) -> list[FoundSample]:
        """Every sample with this key in the datasets (`source` says which), through their keys.lmdb."""
        found = []
        for i, src in enumerate(self.sources):
            for f in find_samples(src.root, key, src.storage_options, src.manifest):
                f.source = i
                found.append(f)
        return found

    def lookup(self, key: str) -> FoundSample:
        """The sample with this key (e.g. from a batch's `sample_keys`, to inspect a loss spike): its
        location and record (tokens, encoded images, source record `.meta`). KeyError if no dataset holds it;
        FileNotFoundError if a dataset has no keys.lmdb (`vlmdata index --rebuild-keys DATASET` builds it)."""
        found = self.lookup_all(key)
        if not found:
            raise KeyError(f"no sample with key {key!r} in {', '.join(s.root for s in self.sources)}")
        return found[0]

    # ---- iteration ------------------------------------------------------------------------------
    def planner(self, epoch: int | None = None) -> EpochPlanner:
        """The epoch's planner (pure: same inputs, same packs)."""
        warming = self._warm
        if warming is not None and warming is not threading.current_thread():
            warming.join()                      # one planner at a time in this process
            self._warm = None
        return self._planner(epoch)

    def _warm_start(self):
        """Plan the window of the position now (window 0 of a new epoch, or the resume point's) into the
        plan share, in a background thread (`loading.warm_start`); the position is read here, not there."""
        epoch, cursor, anchor = self._epoch, self._cursor, self._anchor
        return warm(lambda: self._planner(epoch, anchor).ensure(cursor))

    def _planner(self, epoch: int | None = None, anchor="current") -> EpochPlanner:
        """The planner of `epoch` from `anchor` (by default the dataset's resume hint for its epoch)."""
        epoch = self._epoch if epoch is None else int(epoch)
        if anchor == "current":
            anchor = self._anchor if epoch == self._epoch else None
        store = partial(self._plan_share.store, f"{self.fingerprint}-e{epoch}")
        return EpochPlanner(self.corpus, self.policy, self.plan_options, self.seed, epoch, store=store,
                            anchor=anchor)

    def __iter__(self):
        info = get_worker_info()
        wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        if info is not None:
            self._adopt_position()                    # persistent workers follow set_epoch/load_state_dict
        planner = self.planner()
        base, step = self._cursor, wid
        if self._worker_resume is not None:
            base, step = self._worker_resume["base"], self._worker_resume["next_step"]
        window = _Window()
        opt = self.plan_options
        budget = f"max_patches={opt.max_patches}" if opt.max_patches is not None else f"max_images={opt.max_images}"
        tally, finished = LengthTally(opt.max_tokens, budget, opt.overlong), False
        look_ahead = None                  # the window whose successor is announced after its first pack
        try:
            for item in rank_packs(planner, base, self.world_size, self.rank, step, nw, self.plan_options.balance):
                key = "tail" if item.window is None else item.window
                if window.key != key:
                    window = _Window()
                    window.key = key
                    if item.window is not None:
                        self._announce(planner, item.window, base, item.step, nw, ahead=False)
                        look_ahead = item.window
                batch = self._make_batch(item.samples, window, item.dropped)
                if item.cost is not None:
                    batch["stats"]["compute_flops"] = item.cost
                    batch["stats"]["step_imbalance"] = item.imbalance
                tally.add(batch["stats"])
                hint = planner.anchor_for(item.cursor)
                state = self._state(item.cursor, hint)
                batch["state"] = state
                self._last_state = state
                self._progress = {"base": base, "next_step": item.step + nw, "cursor": item.cursor, "window": hint}
                yield batch
                if look_ahead is not None:         # planning the next window waited for this first pack
                    self._announce(planner, look_ahead, base, item.step + nw, nw, ahead=True)
                    look_ahead = None
            finished = True
        finally:   # once per epoch and worker (also when the consumer stops early)
            if self.log_lengths:
                tally.log(f"epoch {planner.epoch}{'' if finished else ' (stopped early)'}, rank {self.rank} of "
                          f"{self.world_size}, worker {wid} of {nw}")

    def _announce(self, planner: EpochPlanner, k: int, base: int, step: int, nw: int, ahead: bool) -> None:
        """Tell the fetcher this worker's shard reads from `step` of window k on, in order: exact for
        window k (planned), then for window k + 1 exact when `ahead` (planning it; its last steps, which
        would plan window k + 2, come with its own announcement) or its shards, then the shards of each
        later window of the epoch. A window's first announcement is not `ahead`, so its
        first pack never waits for the next window's planning; the one after that pack is.
        The first announcement also loads the shard indices of windows k and k + 1 in background threads."""
        later = k + 1 < planner.num_windows
        if not ahead:
            self._prefetch_indices(planner.window_shards(k) + (planner.window_shards(k + 1) if later else []))
        order = self._worker_reads(planner, k, base, step, nw, settled=not ahead)
        if later:
            order += self._worker_reads(planner, k + 1, base, step, nw, settled=True) if ahead \
                else planner.window_shards(k + 1)
        for j in range(k + 2, planner.num_windows):
            order.extend(planner.window_shards(j))
        order = list(dict.fromkeys(order))
        self._get_fetcher().plan_ahead([self._ref(int(x)) for x in order])

    def _prefetch_indices(self, shards: list[int]) -> None:
        """Keep only these (global) shards' indices, loading the missing ones in the background."""
        local: list[list[int]] = [[] for _ in self.sources]
        for g in shards:
            i = self.corpus.source_of_shard(int(g))
            local[i].append(int(g) - int(self.corpus.shard_base[i]))
        for src, wanted in zip(self.sources, local):
            src.retain_indices(wanted)
            src.prefetch_indices(wanted)

    def _worker_reads(self, planner: EpochPlanner, k: int, base: int, step: int, nw: int,
                      settled: bool = False) -> list[int]:
        """Shards this worker reads in window k, in first-read order (steps step, step + nw, ...);
        `settled`: only the steps whose packs are located without planning window k + 1."""
        known = planner.window_range(k, learn=True)
        if known is None:
            return []
        world, rank = self.world_size, self.rank
        lo, hi = known
        shards: list[int] = []
        first = max(step, -(-(lo - base - rank) // world))      # first step reaching window k
        s = step + -(-(first - step) // nw) * nw                  # ... that is one of this worker's
        while base + s * world + rank < hi:
            g = base + s * world + rank
            if settled and g + world - rank >= hi:               # locating it would plan window k + 1
                break
            if g >= lo and planner.ensure(g + world - 1 - rank):   # tail steps are announced as they come
                samples = rank_step_samples(planner, g - rank, world, rank, self.plan_options.balance)
                shards.extend(self.corpus.shard_of(samples).tolist())
            s += nw
        return list(dict.fromkeys(shards))

    def _reader(self, shard: int, window: _Window):
        """The shard's sample reader (fetched once per window), or the skip reason."""
        got = window.readers.get(shard)
        if got is None:
            i = self.corpus.source_of_shard(shard)
            local = shard - int(self.corpus.shard_base[i])
            ref = self.sources[i].ref(local)
            try:
                data = self._get_fetcher().get(ref)
                got = self.sources[i].reader(local, data)
            except CorruptShardError as exc:
                log.warning("skipping shard %s: %s", ref.url, exc)
                got = Skip.CORRUPT_SHARD
            except BadIndexError as exc:
                log.warning("skipping shard %s: %s", ref.url, exc)
                got = Skip.BAD_INDEX
            except ShardChangedError as exc:
                log.warning("skipping shard %s: %s", ref.url, exc)
                got = Skip.SHARD_CHANGED
            except FetchError as exc:
                log.warning("skipping shard %s: %s", ref.url, exc)
                got = Skip.FETCH_ERROR
            except (ShardReadError, OSError, ValueError, KeyError) as exc:
                log.warning("skipping shard %s: %s", ref.url, exc)
                got = Skip.SHARD_ERROR
            window.readers[shard] = got
        return got

    def _make_batch(self, samples: np.ndarray, window: _Window, drops: Counter) -> dict:
        stats = StatsDelta()
        stats.skipped.update(drops)
        batch = self._memmap_pack(samples, window, stats) if self.memmap_pack_reads else None
        if batch is None:
            batch = self._read_pack(samples, window, stats)
        if self._fetcher is not None:                 # in-worker cache counts since the last pack
            stats.merge(take_fetch_stats(self._fetcher))
        batch["stats"] = stats.to_dict()
        return batch

    def _memmap_pack(self, samples: np.ndarray, window: _Window, stats: StatsDelta):
        """The pack read whole from memmap shards (`loading.memmap_pack`), or None: read it sample by sample."""
        if self.plan_options.mode != "pack" or not self._memmap_only:
            return None
        shards = self.corpus.shard_of(samples)
        readers = {s: self._reader(s, window) for s in dict.fromkeys(shards.tolist())}
        return read_memmap_pack(readers, shards, self.corpus.local_of(samples), samples, self.collate_config, stats)

    def _read_pack(self, samples: np.ndarray, window: _Window, stats: StatsDelta):
        """The pack read sample by sample: records, decoded images, `build_pack`."""
        records = []
        shards, rows = self.corpus.shard_of(samples).tolist(), self.corpus.local_of(samples).tolist()
        for gid, shard, row in zip(samples.tolist(), shards, rows):
            reader = self._reader(shard, window)
            if isinstance(reader, str):
                stats.skipped[reader] += 1
                continue
            try:
                records.append(reader(row))
            except IndexMismatchError as exc:
                log.warning("skipping sample %d: %s", gid, exc)
                stats.skipped[Skip.INDEX_MISMATCH] += 1
            except ShardChangedError as exc:
                log.warning("skipping sample %d: %s", gid, exc)
                stats.skipped[Skip.SHARD_CHANGED] += 1
            except (ValueError, OSError, KeyError, IndexError) as exc:
                log.warning("skipping sample %d: %s", gid, exc)
                stats.skipped[Skip.BAD_SAMPLE] += 1
        decoded = self._decode(records, stats)
        videos = None
        if any(r.videos for r in records):               # only the sampled frames, clip by clip
            clips_of = defer_videos if self.options.defer_decode else decode_videos
            videos = clips_of(records, self.collate_config.video_policy, stats)
            decoded = [None if vs is None else ims for ims, vs in zip(decoded, videos)]
        return build_pack(records, decoded, self.collate_config, stats, self.plan_options.mode, videos)

    def _decode(self, records: list, stats: StatsDelta) -> list[list | None]:
        """Per record: its images ready for collate, or None (sample skipped, counted)."""
        if self.options.defer_decode or not any(r.images for r in records):
            return [r.images for r in records]
        out: list[list | None] = []
        encoded = [(r, i) for r in records for i in range(len(r.images)) if not isinstance(r.images[i], np.ndarray)]
        decoded: dict[tuple[int, int], np.ndarray | None] = {}
        errors: Counter = Counter()
        if encoded:
            decoder = self._get_decoder()
            t0 = time.perf_counter()
            images = self._decode_images(decoder, [r.images[i] for r, i in encoded], [r.sizes[i] for r, i in encoded],
                                         [len(r.sizes) for r, _ in encoded])
            stats.decode_seconds += time.perf_counter() - t0
            decoded = {(id(r), i): im for (r, i), im in zip(encoded, images)}
            errors = decoder.pop_errors()
        for r in records:
            ims = [decoded.get((id(r), i), im) if not isinstance(im, np.ndarray) else im
                   for i, im in enumerate(r.images)]
            if any(im is None for im in ims):
                reason = next(iter(errors)) if len(errors) == 1 else Skip.CORRUPT_IMAGE
                stats.skipped[reason] += 1
                out.append(None)
            else:
                out.append(ims)
        return out
