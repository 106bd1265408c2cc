"""`inspect_dataset`: what a user checks before training, as plain text.

Counts, histograms of tokens per sample, images per sample and image sizes
(from the planning columns, read a few thousand shards at a time, so a
dataset of any size fits in memory; no shard is decoded), how many samples
are longer than common `max_tokens` budgets (text + image + video tokens, as the
loader plans them: `ingest.lengths`), for a dataset holding clips their count
and a histogram of their durations (from the shard indices' video columns),
skipped samples by reason with an example each, and a few samples rendered as
text.
"""
from __future__ import annotations

import numpy as np

from vlmdata import fsutil
from vlmdata.errors import ConfigError
from vlmdata.formats.manifest import Manifest
from vlmdata.formats.sample import read_sample, text_decoder_for
from vlmdata.formats.sample_index import SampleIndex
from vlmdata.ingest.lengths import BUDGETS, dataset_policy, iter_planning, length_report
from vlmdata.ingest.rendering import TokenRenderer
from vlmdata.keyindex.build import iter_indices

BAR = 40
TOKEN_EDGES = [0, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
IMAGE_EDGES = [0, 1, 2, 3, 5, 9]
SIZE_EDGES = [0, 128, 256, 512, 768, 1024, 1536, 2048, 4096]
DURATION_EDGES = [0, 5, 10, 30, 60, 120, 300, 600, 1800, 3600]   # seconds


def _bins(edges: list[int]) -> list[int]:
    return list(edges) + [np.iinfo(np.int64).max]


def histogram(values: np.ndarray, edges: list[int], unit: str) -> list[str]:
    """Text histogram with bins [edges[i], edges[i+1])."""
    values = np.asarray(values)
    return histogram_lines(np.histogram(values, bins=_bins(edges))[0] if len(values) else None, edges, unit)


def histogram_lines(counts: np.ndarray | None, edges: list[int], unit: str, continuous: bool = False) -> list[str]:
    """Text histogram of counts per bin [edges[i], edges[i+1]) (None or all zero: none); bins of whole
    numbers are labelled lo-(hi-1), of `continuous` values [lo, hi)."""
    if counts is None or not counts.sum():
        return ["  (none)"]
    bins = _bins(edges)
    top = max(int(counts.max()), 1)
    lines = []
    for lo, hi, c in zip(bins[:-1], bins[1:], counts):
        if hi == bins[-1]:
            label = f">={lo}"
        elif continuous:
            label = f"[{lo}, {hi})"
        else:
            label = str(lo) if hi - 1 == lo else f"{lo}-{hi - 1}"
        lines.append(f"  {label:>13} {unit:<6} {int(c):>9}  {'#' * int(round(BAR * c / top))}")
    return lines


def _column_histograms(root: str, manifest: Manifest, so: dict) -> tuple[int, dict[str, np.ndarray]]:
    """(text tokens in all, counts per bin of text tokens, images and longest image side per sample/image)."""
    counts = {"tokens": np.zeros(len(TOKEN_EDGES), np.int64), "images": np.zeros(len(IMAGE_EDGES), np.int64),
              "sizes": np.zeros(len(SIZE_EDGES), np.int64)}
    total = 0
    for cols in iter_planning(root, manifest, so):
        total += int(cols["text_tokens"].sum(dtype=np.int64))
        counts["tokens"] += np.histogram(cols["text_tokens"], bins=_bins(TOKEN_EDGES))[0]
        counts["images"] += np.histogram(cols["n_images"], bins=_bins(IMAGE_EDGES))[0]
        counts["sizes"] += np.histogram(np.maximum(cols["width"], cols["height"]), bins=_bins(SIZE_EDGES))[0]
    return total, counts


def _transcoded(manifest: Manifest) -> str:
    """How the clips were re-encoded at shard time ("" when they are stored as they were given)."""
    t = manifest.stats.get("video_transcode")
    if not t:
        return ""
    return (f"; re-encoded with --video-transcode {t['max_side']}:{t['max_fps']:g} (H.264, a keyframe every "
            f"{t['keyframe_s']:g} s, CRF {t['crf']})")


def _video_lines(root: str, manifest: Manifest, so: dict) -> list[str]:
    """Clip count, total and extreme durations and a duration histogram (only for a dataset holding clips:
    the shard indices are read for their video columns, a few at a time)."""
    if not manifest.stats.get("videos"):
        return []
    counts = np.zeros(len(DURATION_EDGES), np.int64)
    clips = samples = 0
    total, shortest, longest = 0.0, float("inf"), 0.0
    for _, ix in iter_indices(root, manifest.shards, so):
        v = ix.videos
        if not v.total:
            continue
        clips += v.total
        samples += int((v.n_videos > 0).sum())
        total += float(v.vid_duration.sum())
        shortest, longest = min(shortest, float(v.vid_duration.min())), max(longest, float(v.vid_duration.max()))
        counts += np.histogram(v.vid_duration, bins=_bins(DURATION_EDGES))[0]
    if not clips:
        return []
    lines = [f"\nvideos: {clips} clips in {samples} samples, {total:.1f} s in all (shortest {shortest:.2f} s, "
             f"longest {longest:.2f} s)" + _transcoded(manifest), "video duration (seconds)"]
    return lines + histogram_lines(counts, DURATION_EDGES, "s", continuous=True)


def _one_line(text: str, limit: int = 400) -> str:
    text = " ".join(text.split("\n"))
    return text if len(text) <= limit else text[:limit] + f"... (+{len(text) - limit} chars)"


def _samples(root: str, manifest: Manifest, so: dict, n: int) -> list[str]:
    if not manifest.shards or n <= 0:
        return []
    shard = manifest.shards[0]
    # the tokens read here are the shards' own: their view's tokenizer decodes them
    identity = next((v["tokenizer"] for v in manifest.views.values() if v.get("tokens") == "tar"), manifest.tokenizer)
    try:
        renderer = TokenRenderer.for_identity(identity)
    except ConfigError as exc:
        return [f"- (samples not shown: {exc})"]
    out = []
    if manifest.kind == "memmap":
        from vlmdata.formats.memmap import MemmapShard

        mm = MemmapShard(root, shard, so)
        records = [mm.read_sample(i) for i in range(min(n, len(mm)))]
    else:
        if manifest.layout.get("compression") == "gzip":
            import gzip

            buf = gzip.decompress(fsutil.read_bytes(fsutil.join(root, shard.name), so))
        else:
            buf = fsutil.read_bytes(fsutil.join(root, shard.name), so)
        index = SampleIndex.load(fsutil.join(root, shard.index), so)
        dec = None if manifest.layout.get("text", "tok.npy") == "tok.npy" else text_decoder_for(manifest.layout, manifest.tokenizer)
        records = [read_sample(buf, index, i, text_decoder=dec) for i in range(min(n, len(index)))]
    for r in records:
        out.append(f"- {r.key} ({r.tokens.shape[1]} tokens, {len(r.images)} images):"
                   f"{_one_line(renderer.text(r.tokens, r.sizes))}")
    return out


def _length_lines(root: str, m: Manifest, so: dict, max_tokens: int | None, image_size) -> list[str]:
    policy = dataset_policy(m, image_size)
    budgets = sorted(set(BUDGETS) | ({int(max_tokens)} if max_tokens else set()))
    report = length_report(root, m, so, budgets, policy)
    lines = [f"\nsample lengths (text + image + video tokens, image policy {report.policy})"]
    if max_tokens:
        lines.append(f"  {report.budget_line(int(max_tokens))}")
    lines += [f"  longer than {b:>6} tok {report.over[b]:>9}  ({100 * report.share(b):.1f} %)" for b in budgets]
    lines += [f"  longest: {x['key']} ({x['shard']}): {x['tokens']} tokens, {x['images']} images"
              for x in report.longest]
    return lines


def inspect_dataset(root: str, storage_options: dict | None = None, samples: int = 3, max_tokens: int | None = None,
                    image_size=None) -> str:
    """The report as text; `max_tokens` adds what that budget cuts, with the image policy that
    `VLMDataset(image_size=image_size)` would use (None: the dataset's own)."""
    so = storage_options or {}
    m = Manifest.load(root, so)
    text_tokens, counts = _column_histograms(root, m, so)
    st = m.stats
    lines = [f"dataset {root}",
             f"  kind {m.kind}, format version {m.version}, {len(m.shards)} shards, {m.total_bytes / 1e6:.1f} MB",
             f"  samples {m.num_samples}, images {m.num_images}, text tokens {text_tokens}",
             f"  tokenizer {m.tokenizer.get('model') or m.tokenizer.get('name')}, layout {m.layout}"
             + (f", text views {', '.join(m.views)} (default {m.default_view})" if m.views else "")
             + (f", image policy {m.image_policy}" if m.image_policy else "")]
    if "input_rows" in st:
        lines.append(f"  input rows {st['input_rows']}: written {st.get('samples')}, skipped {st.get('skipped_total', 0)}")
    lines.append("\ntext tokens per sample")
    lines += histogram_lines(counts["tokens"], TOKEN_EDGES, "tok")
    lines.append("\nimages per sample")
    lines += histogram_lines(counts["images"], IMAGE_EDGES, "img")
    lines.append("\nimage size (longest side, original pixels)")
    lines += histogram_lines(counts["sizes"], SIZE_EDGES, "px")
    lines += _video_lines(root, m, so)
    lines += _length_lines(root, m, so, max_tokens, image_size)
    lines.append("\nskipped samples by reason")
    skipped = st.get("skipped", {})
    if not skipped:
        lines.append("  none")
    for reason, count in sorted(skipped.items()):
        ex = st.get("examples", {}).get(reason, {})
        lines.append(f"  {reason:<20} {count:>8}   e.g. {ex.get('id', '?')}: {ex.get('detail', '')}")
    if st.get("duplicate_keys_across_shards"):
        lines.append(f"  (kept) duplicate keys across shards: {st['duplicate_keys_across_shards']}")
    sample_lines = _samples(root, m, so, samples)
    if sample_lines:
        lines.append(f"\nfirst {len(sample_lines)} samples of {m.shards[0].name}")
        lines += sample_lines
    return "\n".join(lines)
