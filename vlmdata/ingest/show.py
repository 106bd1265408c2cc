"""`vlmdata show`: samples found by key, as the dataset stores them.

For each key: where the sample lives (shard file and number, row, bytes),
its text decoded with the tokenizer of the text view shown (`view`, default
the dataset's default view; `ingest.rendering`), images as `<image WxH ×N>`
markers (N: the image tokens it expands to at load time, when the view's
family is known), the trained spans marked (`⟦…⟧`, or colour on a terminal)
and listed with their text, the token counts, its source record (the `.json`
member), its video clips (extension, codec, size, rotation, duration, frame rates,
frames and keyframes, from the probe stored beside each clip), and, with `images_dir`, its images
and clips written to files (`KEY.J.EXT`, `KEY.vJ.EXT`:
the stored bytes; memmap datasets' decoded arrays as PNG; KEY.SHARD-ROW.J.EXT
if several samples share the key). Keys are looked up in the dataset's
keys.lmdb; a view added by `vlmdata retokenize` has its tokens read from its
own files.

A key is a name, never a path: a tar indexed in place may hold `sub/000`,
`../../x` or `/etc/x` as keys. Files are written only directly inside
`images_dir`, under `safe_key(key)` (the key itself when it is a plain name,
else a sanitized form with a digest of the key), never through a symlink,
and never two images under one name in one run.

`render_text` is the one place that turns a sample's stored tokens into text.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import numpy as np

from vlmdata import fsutil
from vlmdata.formats.manifest import Manifest
from vlmdata.formats.sample import safe_key
from vlmdata.formats.text_view import ViewTokens, view_shard_name
from vlmdata.ingest.images import sniff
from vlmdata.ingest.lengths import identity_video_policy
from vlmdata.ingest.rendering import ANSI, PLAIN, Piece, TokenRenderer, format_pieces
from vlmdata.ingest.video import clip_extension
from vlmdata.keyindex.lookup import FoundSample, find_samples
from vlmdata.video.frame_list import FRAME_LIST_CODEC, FRAME_LIST_EXT

__all__ = ["RenderedText", "ViewText", "render_text", "sample_report", "show_samples"]


def _write_new(images_dir: str, name: str, data: bytes, taken: set[str]) -> str:
    """Write `data` as `name` inside images_dir (a name already used in this run gets -2, -3, ...), never
    through a symlink; returns the path."""
    stem, dot, ext = name.rpartition(".")
    n = 1
    while name in taken:
        n += 1
        name = f"{stem}-{n}{dot}{ext}"
    taken.add(name)
    path = os.path.join(images_dir, name)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return path


@dataclass
class RenderedText:
    """A sample's text as stored: all of it (unmarked), the trained spans [start, end) with their text, and
    its pieces (text, trained text, images) for marking."""

    text: str
    tokens: int                                  # stored tokens (each image is one placeholder)
    trained: list[tuple[int, int, str]]
    pieces: list[Piece] = field(default_factory=list)


def render_text(manifest: Manifest, tokens: np.ndarray, sizes: list[tuple[int, int]], view: str | None = None,
                tokenizer_dir: str | None = None) -> RenderedText:
    """Render stored (2, T) tokens (ids, loss flags) of a text view (None: the default one) with that view's
    tokenizer (`tokenizer_dir`: the model folder, when not where the dataset was tokenized)."""
    return _rendered(TokenRenderer.for_identity(manifest.view(view)[1]["tokenizer"], tokenizer_dir), tokens, sizes)


def _rendered(renderer: TokenRenderer, tokens: np.ndarray, sizes: list[tuple[int, int]]) -> RenderedText:
    pieces = renderer.pieces(tokens, sizes)
    trained = [(p.start, p.end, p.text) for p in pieces if p.kind == "trained"]
    return RenderedText("".join(p.text for p in pieces), int(tokens.shape[1]), trained, pieces)


class _ViewReader:
    """A view's tokens of found samples: the shard's own for a view stored in the tars, else the view's files
    (one token file per shard, loaded once)."""

    def __init__(self, root: str, manifest: Manifest, view: str | None, so: dict):
        try:
            self.name, self.entry = manifest.view(view)
        except KeyError as exc:
            raise ValueError(exc.args[0]) from None
        self.root, self.so = root, so
        self._files: dict[str, ViewTokens] = {}

    def tokens(self, found: FoundSample) -> np.ndarray:
        if self.entry.get("tokens", "tar") == "tar":
            return found.record.tokens
        name = view_shard_name(self.name, found.location.shard_name)
        if name not in self._files:
            self._files[name] = ViewTokens.load(fsutil.join(self.root, name), self.so)
        return self._files[name].tokens(found.location.row)


def _write_images(found: FoundSample, images_dir: str, unique: bool, taken: set[str]) -> list[str]:
    os.makedirs(images_dir, exist_ok=True)
    paths = []
    stem = _stem(found, unique)
    for j, image in enumerate(found.record.images):
        if isinstance(image, np.ndarray):
            import io

            from PIL import Image

            buf = io.BytesIO()
            Image.fromarray(np.asarray(image)).save(buf, format="PNG")
            data, ext = buf.getvalue(), "png"
        else:
            data = bytes(image)
            ext = sniff(data) or "bin"
        paths.append(_write_new(images_dir, f"{stem}.{j}.{ext}", data, taken))
    return paths


def _stem(found: FoundSample, unique: bool) -> str:
    stem = safe_key(found.key)               # a name, never a path: 'sub/000' -> 'sub_000_<sha1>'
    return stem if unique else f"{stem}.{found.location.shard}-{found.location.row}"


def _clip_entry(clip, video_policy=None) -> dict:
    """What `show` lists of a stored clip: its member, its probe's main figures and, with the dataset's video
    policy, the frames a loader samples from it (indices, and times as index / measured fps: the rate the
    planner and the family's processor rules use)."""
    info = clip.info
    ext = FRAME_LIST_EXT if info["codec"] == FRAME_LIST_CODEC else clip_extension(bytes(clip.data[:64]))
    entry = {"ext": ext, "bytes": len(clip.data), "codec": info["codec"],
             "width": info["width"], "height": info["height"], "rotation": info["rotation"],
             "duration_s": info["duration_s"], "average_fps": info["average_fps"],
             "measured_fps": info["measured_fps"], "variable_rate": info["variable_rate"], "frames": info["frames"],
             "keyframes": len(info["keyframes"])}
    if video_policy is not None and info["frames"] > 0:
        fps = info["measured_fps"]
        indices = [int(i) for i in video_policy.frame_indices(info["frames"], fps)]
        entry["sampled_frames"] = indices
        entry["sampled_times_s"] = [round(i / fps, 3) if fps > 0 else 0.0 for i in indices]
    return entry


SHOWN_TIMES = 8          # sampled frame times printed in full up to this many; more: the first and last few


def _video_lines(j: int, v: dict) -> list[str]:
    rate = f"{v['average_fps']:.3g} fps declared, {v['measured_fps']:.3g} measured" + \
        (" (variable)" if v["variable_rate"] else "")
    lines = [f"  video {j}   {v['ext']} {v['codec']} {v['width']}x{v['height']}, rotation {v['rotation']}, "
             f"{v['duration_s']:.2f} s, {rate}, {v['frames']} frames, {v['keyframes']} keyframes, {v['bytes']} bytes"
             + (f" -> {v['file']}" if "file" in v else "")]
    times = v.get("sampled_times_s")
    if times is not None:
        shown = [f"{t:.2f}" for t in times]
        if len(shown) > SHOWN_TIMES:
            shown = shown[:SHOWN_TIMES // 2] + ["..."] + shown[-SHOWN_TIMES // 2:]
        lines.append(f"            sampled {len(times)} frames at {', '.join(shown)} s")
    return lines


class ViewText:
    """One text view's tokens and tokenizer for the samples `vlmdata show` renders."""

    def __init__(self, root: str, manifest: Manifest, view: str | None = None, storage_options: dict | None = None,
                 tokenizer_dir: str | None = None):
        self.reader = _ViewReader(root, manifest, view, storage_options or {})
        self.name, self.identity = self.reader.name, self.reader.entry["tokenizer"]
        self.renderer = TokenRenderer.for_identity(self.identity, tokenizer_dir)
        self.others = [v for v in manifest.view_names() if v != self.name]

    def render(self, found: FoundSample) -> RenderedText:
        return _rendered(self.renderer, self.reader.tokens(found), found.record.sizes)


def sample_report(found: FoundSample, manifest: Manifest, images_dir: str | None = None, unique: bool = True,
                  text: ViewText | None = None, taken: set[str] | None = None, video_policy=None) -> dict:
    """Everything `vlmdata show` prints about one sample, as plain data (images written to `images_dir` as
    KEY.J.EXT, or KEY.SHARD-ROW.J.EXT when several samples share the key: `unique=False`; KEY is `safe_key(key)`;
    `taken`: the file names already written in this run); its text in the view `text` (default: the
    dataset's default view); its clips' sampled frames under `video_policy` (`ingest.lengths.dataset_video_policy`)."""
    rec, loc = found.record, found.location
    text = text or ViewText(loc.dataset, manifest)
    rendered = text.render(found)
    images = [{"width": w, "height": h} for w, h in rec.sizes]
    for entry, image in zip(images, rec.images):
        if isinstance(image, np.ndarray):
            entry["stored"] = f"{image.shape[1]}x{image.shape[0]} pixels (memmap)"
        else:
            entry["stored"] = f"{sniff(bytes(image[:16])) or 'unknown'}, {len(image)} bytes"
    videos = [_clip_entry(clip, video_policy) for clip in rec.videos]
    if images_dir is not None:
        taken = set() if taken is None else taken
        for entry, path in zip(images, _write_images(found, images_dir, unique, taken)):
            entry["file"] = path
        for j, (entry, clip) in enumerate(zip(videos, rec.videos)):
            entry["file"] = _write_new(images_dir, f"{_stem(found, unique)}.v{j}.{entry['ext']}", bytes(clip.data),
                                       taken)
    tok = text.identity
    return {"key": found.key, "dataset": loc.dataset, "shard": loc.shard, "shard_file": loc.shard_name,
            "shards": len(manifest.shards), "row": loc.row, "offset": loc.offset, "span": loc.span, "url": loc.url,
            "view": text.name, "other_views": text.others,
            "tokenizer": tok.get("model") or tok.get("path") or tok.get("name"),
            "tokens": rendered.tokens, "image_placeholders": len(rec.sizes),
            "video_placeholders": len(rec.videos),
            "trained_tokens": sum(b - a for a, b, _ in rendered.trained),
            "trained_spans": [{"start": a, "end": b, "text": t} for a, b, t in rendered.trained],
            "text": rendered.text, "pieces": [p.__dict__ for p in rendered.pieces], "images": images,
            "videos": videos, "metadata": rec.meta}


def _format(r: dict, kind: str, style: str) -> str:
    where = "tokens" if kind == "memmap" else "bytes"
    others = f"; other views: {', '.join(r['other_views'])} (--view NAME)" if r["other_views"] else ""
    n_videos = r.get("video_placeholders", 0)
    videos = f", {n_videos} video placeholders" if n_videos else ""
    lines = [f"sample {r['key']}  ({r['dataset']})",
             f"  where     shard {r['shard']} of {r['shards']}: {r['shard_file']}, row {r['row']}, "
             f"{where} {r['offset']}+{r['span']}",
             f"  view      {r['view']}, tokenizer {r['tokenizer']}{others}",
             f"  tokens    {r['tokens']} stored ({r['tokens'] - r['image_placeholders'] - n_videos} text, "
             f"{r['image_placeholders']} image placeholders{videos}); {r['trained_tokens']} trained in "
             f"{len(r['trained_spans'])} span(s)"]
    for j, im in enumerate(r["images"]):
        lines.append(f"  image {j}   {im['width']}x{im['height']}, {im['stored']}" +
                     (f" -> {im['file']}" if "file" in im else ""))
    lines += [line for j, v in enumerate(r["videos"]) for line in _video_lines(j, v)]
    meta = json.dumps(r["metadata"], ensure_ascii=False, sort_keys=True) if r["metadata"] is not None else "(none)"
    lines.append(f"  metadata  {meta}")
    legend = "trained in green" if style == ANSI else "trained in ⟦…⟧"
    lines.append(f"  text      ({legend}; <image WxH ×N>: an image and the tokens it expands to)")
    marked = format_pieces([Piece(**p) for p in r["pieces"]], style)
    lines += ["    " + line for line in marked.split("\n")]
    lines.append("  trained spans")
    lines += [f"    [{s['start']}, {s['end']})  {json.dumps(s['text'], ensure_ascii=False)}"
              for s in r["trained_spans"]] or ["    (none)"]
    return "\n".join(lines)


def show_samples(root: str, keys: list[str], storage_options: dict | None = None, images_dir: str | None = None,
                 as_json: bool = False, view: str | None = None, tokenizer_dir: str | None = None,
                 color: bool = False) -> tuple[str, list[str]]:
    """(the report, the keys not found): the samples' text in `view` (None: the default view), marked in colour
    with `color`. Raises FileNotFoundError / ValueError if the key index is missing or stale or the view
    unknown, ConfigError if the view's tokenizer cannot be loaded."""
    so = storage_options or {}
    manifest = Manifest.load(root, so)
    text = ViewText(root, manifest, view, so, tokenizer_dir)
    videos = identity_video_policy(text.identity) if manifest.stats.get("videos") else None
    reports, missing = [], []
    taken: set[str] = set()
    for key in keys:
        found = find_samples(root, key, so, manifest)
        if not found:
            missing.append(key)
        reports += [sample_report(f, manifest, images_dir, unique=len(found) == 1, text=text, taken=taken,
                                  video_policy=videos) for f in found]
    if as_json:
        return json.dumps({"samples": reports, "missing": missing}, ensure_ascii=False, indent=1), missing
    out = "\n\n".join(_format(r, manifest.kind, ANSI if color else PLAIN) for r in reports)
    if missing:
        out += ("\n\n" if out else "") + "\n".join(f"no sample with key {k!r} in {root}" for k in missing)
    return out, missing
