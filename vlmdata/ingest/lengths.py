"""How long a dataset's samples are, from the stored planning columns: what a `max_tokens` budget cuts.

A sample's length is what the loader plans with (`plan.lengths.sample_lengths`): its text tokens
plus the image tokens of each image under the image policy `VLMDataset(image_size=None)` uses (the
model family's, a memmap dataset's stored size, else 336 px fixed), plus its clips' video tokens. The text tokens are those of
the dataset's default text view. Columns are read a few thousand shards at a time; no shard is read.
At shard and index time `LengthCounter` takes each shard index as the dataset-wide tables are
written (`ingest.finalize`), so nothing is read twice. The keys of the longest samples come from
their shards' index files (one per sample named).
"""
from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from vlmdata import fsutil
from vlmdata.decode.policy import ImagePolicy, make_policy
from vlmdata.formats.manifest import PLANNING_NAME, Manifest
from vlmdata.formats.planning import PlanningColumns
from vlmdata.formats.sample_index import SampleIndex, concat_planning_columns
from vlmdata.formats.text_view import view_planning_name
from vlmdata.loading.text_views import choose_policy
from vlmdata.plan.lengths import sample_lengths
from vlmdata.text.families.base import FamilySpec

__all__ = ["BUDGETS", "LengthCounter", "LengthReport", "dataset_policy", "dataset_video_policy", "identity_video_policy",
           "iter_planning", "length_report"]

BUDGETS = (2048, 4096, 8192, 16384, 32768)   # common max_tokens settings
LONGEST = 3                                  # longest samples named
SHARDS_AT_ONCE = 2000


def dataset_policy(manifest: Manifest, image_size=None) -> ImagePolicy:
    """The image policy a VLMDataset loads `manifest`'s default view with for this `image_size`."""
    if manifest.kind == "memmap" and image_size is None and manifest.image_policy:
        return make_policy(manifest.image_policy)
    _, view = manifest.view(None)
    return choose_policy(image_size, FamilySpec.from_identity(view.get("tokenizer", manifest.tokenizer)))


def dataset_video_policy(manifest: Manifest):
    """The video policy (`video.policy.VideoPolicy`) of a dataset that holds clips; None for the rest."""
    return identity_video_policy(manifest.tokenizer) if manifest.stats.get("videos") else None


def identity_video_policy(identity: dict):
    """The video policy of the model family a tokenizer identity (a text view's) names; None without one."""
    from vlmdata.video.policy import make_video_policy

    family = FamilySpec.from_identity(identity)
    return make_video_policy(family.vision.video_policy) if family is not None else None


def iter_planning(root: str, manifest: Manifest, so: dict) -> Iterator[dict]:
    """The planning columns (default view) of a few thousand shards at a time, in shard order (from the
    shard indices when planning.npz is missing)."""
    url = fsutil.join(root, PLANNING_NAME)
    shards = manifest.shards
    if fsutil.exists(url, so):
        name, view = manifest.view(None)
        sidecar = {"text_tokens": fsutil.join(root, view_planning_name(name))} if view.get("tokens") == "sidecar" \
            else {}
        pc = PlanningColumns(url, [s.samples for s in shards], [s.images for s in shards], so, sidecar)
        for a in range(0, len(shards), SHARDS_AT_ONCE):
            yield pc.read_shards(np.arange(a, min(a + SHARDS_AT_ONCE, len(shards))))
        return
    for a in range(0, len(shards), SHARDS_AT_ONCE):
        part = shards[a:a + SHARDS_AT_ONCE]
        yield concat_planning_columns([SampleIndex.load(fsutil.join(root, s.index), so) for s in part])


@dataclass
class LengthReport:
    """Sample lengths (text + image + video tokens) against token budgets."""

    samples: int
    policy: dict
    over: dict[int, int]                                  # budget -> samples longer than it
    images_fill: dict[int, int] = field(default_factory=dict)   # budget -> samples whose image tokens fill it
    longest: list[dict] = field(default_factory=list)     # {"key", "shard", "tokens", "images"}, longest first

    def share(self, budget: int) -> float:
        return self.over[budget] / self.samples if self.samples else 0.0

    def to_stats(self) -> dict:
        """As stored in the manifest's stats (`lengths`)."""
        return {"policy": self.policy, "over": {str(b): n for b, n in self.over.items()},
                "images_fill": {str(b): n for b, n in self.images_fill.items()}, "longest": self.longest}

    @classmethod
    def from_stats(cls, lengths: dict, samples: int) -> LengthReport:
        """Inverse of to_stats (`samples`: the dataset's sample count)."""
        return cls(samples=samples, policy=lengths["policy"], over={int(b): n for b, n in lengths["over"].items()},
                   images_fill={int(b): n for b, n in lengths.get("images_fill", {}).items()},
                   longest=list(lengths.get("longest", [])))

    def budget_line(self, budget: int) -> str:
        """What VLMDataset(max_tokens=budget) does with the samples longer than it."""
        over, fill = self.over[budget], self.images_fill.get(budget, 0)
        line = f"max_tokens={budget}: {over} of {self.samples} samples ({100 * self.share(budget):.1f} %) are longer"
        if over:
            line += (f"; overlong='truncate' (default) cuts {over - fill} at the text tail and drops {fill} whose "
                     f"image tokens alone fill it, overlong='drop' drops all {over}")
        return line

    def summary(self) -> str:
        """'longest N tokens (key); longer than 2048: n (x %), ...' on one line."""
        if not self.longest:
            return "no samples"
        top = self.longest[0]
        over = ", ".join(f"{b}: {n} ({100 * self.share(b):.1f} %)" for b, n in self.over.items())
        return f"longest sample {top['tokens']} tokens ({top['key']}); longer than {over}"


def _keys(root: str, manifest: Manifest, so: dict, rows: list[int]) -> list[tuple[str, str]]:
    """(shard name, key) of each global sample row."""
    starts = np.cumsum([0] + [s.samples for s in manifest.shards])
    out, loaded = [], {}
    for g in rows:
        s = int(np.searchsorted(starts, g, side="right") - 1)
        if s not in loaded:
            loaded[s] = SampleIndex.load(fsutil.join(root, manifest.shards[s].index), so).keys()
        out.append((manifest.shards[s].name, loaded[s][g - int(starts[s])]))
    return out


def _longest(tokens: np.ndarray, k: int) -> np.ndarray:
    """Positions of the k largest values, largest first, earlier first among equals (no full sort)."""
    k = min(k, len(tokens))
    if k == 0:
        return np.zeros(0, np.int64)
    kth = np.partition(tokens, len(tokens) - k)[len(tokens) - k]
    candidates = np.flatnonzero(tokens >= kth)
    return candidates[np.argsort(-tokens[candidates], kind="stable")][:k]


class LengthCounter:
    """Counts sample lengths against budgets chunk by chunk (planning columns, or one shard index at a time)."""

    def __init__(self, policy: ImagePolicy, budgets=BUDGETS, video_policy=None):
        self.policy = policy
        self.video_policy = video_policy
        self.budgets = sorted({int(b) for b in budgets})
        self.over = dict.fromkeys(self.budgets, 0)
        self.fill = dict.fromkeys(self.budgets, 0)
        self.top: list[tuple[int, int, int]] = []      # (tokens, -row, images): a min-heap of the longest
        self.samples = 0

    def add(self, cols: dict[str, np.ndarray]) -> None:
        """The next samples' planning columns (text_tokens, n_images, image_start, width, height)."""
        n = len(cols["text_tokens"])
        tokens, image_tokens = sample_lengths(cols, np.arange(n), self.policy)
        for b in self.budgets:
            self.over[b] += int((tokens > b).sum())
            self.fill[b] += int(((tokens > b) & (image_tokens >= b)).sum())
        for i in _longest(tokens, LONGEST).tolist():
            item = (int(tokens[i]), -(self.samples + i), int(cols["n_images"][i]))
            (heapq.heappush if len(self.top) < LONGEST else heapq.heappushpop)(self.top, item)
        self.samples += n

    def add_index(self, index: SampleIndex) -> None:
        """The next shard's samples, from its index."""
        self.add(concat_planning_columns([index], self.video_policy))

    def report(self, root: str, manifest: Manifest, so: dict) -> LengthReport:
        """The counts, with the keys of the longest samples (read from their shards' indices)."""
        top = sorted(self.top, reverse=True)
        names = _keys(root, manifest, so, [-r for _, r, _ in top])
        longest = [{"key": key, "shard": shard, "tokens": t, "images": im}
                   for (t, _, im), (shard, key) in zip(top, names)]
        return LengthReport(samples=self.samples, policy=self.policy.to_dict(), over=dict(self.over),
                            images_fill=dict(self.fill), longest=longest)


def length_report(root: str, manifest: Manifest | None = None, storage_options: dict | None = None,
                  budgets=BUDGETS, policy: ImagePolicy | None = None) -> LengthReport:
    """Lengths of every sample of the dataset at `root` against `budgets` (see the module docstring)."""
    so = storage_options or {}
    manifest = manifest or Manifest.load(root, so)
    counter = LengthCounter(policy or dataset_policy(manifest), budgets)
    for cols in iter_planning(root, manifest, so):
        counter.add(cols)
    return counter.report(root, manifest, so)
