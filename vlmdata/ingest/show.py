"""`vlmdata show`: samples found by key, as the dataset stores them.

For each key: where the sample lives (shard file and number, row, bytes),
its text rendered from its tokens (roles, `<image WxH>` placeholders,
decoded text) with the token count and the spans the loss is computed on,
its source record (the `.json` member), and, with `images_dir`, its images
written to files (`KEY.J.EXT`: the stored bytes; memmap datasets' decoded
arrays as PNG; KEY.SHARD-ROW.J.EXT if several samples share the key). Keys
are looked up in the dataset's keys.lmdb.

A key is a name, never a path: a tar indexed in place may hold `sub/000`,
`../../x` or `/etc/x` as keys. Files are written only directly inside
`images_dir`, under `safe_key(key)` (the key itself when it is a plain name,
else a sanitized form with a digest of the key), never through a symlink,
and never two images under one name in one run.

`render_text` is the one place that turns stored tokens into text.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np

from vlmdata.formats.manifest import Manifest
from vlmdata.formats.sample import safe_key
from vlmdata.ingest.images import sniff
from vlmdata.ingest.inspection import render_tokens
from vlmdata.keyindex.lookup import FoundSample, find_samples
from vlmdata.text.tokenizer import load_tokenizer

__all__ = ["RenderedText", "render_text", "sample_report", "show_samples"]

NO_LIMIT = 1 << 30
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
    """A sample's text as stored: all of it, and the trained spans [start, end) with their text."""

    text: str
    tokens: int                                  # stored tokens (each image is one placeholder)
    trained: list[tuple[int, int, str]]


def render_text(manifest: Manifest, tokens: np.ndarray, sizes: list[tuple[int, int]]) -> RenderedText:
    """Render stored (2, T) tokens (ids, loss flags) with the dataset's tokenizer."""
    spec = manifest.tokenizer.get("path") if manifest.tokenizer.get("name") == "hf-tokenizers" else None
    tok = load_tokenizer(spec)
    ids, loss = tokens[0], tokens[1] != 0
    edges = np.flatnonzero(np.diff(np.concatenate([[False], loss, [False]]).astype(np.int8)))
    spans = []
    for a, b in zip(edges[0::2].tolist(), edges[1::2].tolist()):
        before = int((ids[:a] == tok.special.image).sum())
        spans.append((a, b, render_tokens(tok, tokens[:, a:b], sizes[before:], limit=NO_LIMIT).strip()))
    return RenderedText(render_tokens(tok, tokens, sizes, limit=NO_LIMIT), int(tokens.shape[1]), spans)


def _write_images(found: FoundSample, images_dir: str, unique: bool, taken: set[str]) -> list[str]:
    os.makedirs(images_dir, exist_ok=True)
    paths = []
    stem = safe_key(found.key)               # a name, never a path: 'sub/000' -> 'sub_000_<sha1>'
    if not unique:
        stem = f"{stem}.{found.location.shard}-{found.location.row}"
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


def sample_report(found: FoundSample, manifest: Manifest, images_dir: str | None = None, unique: bool = True,
                  taken: set[str] | None = None) -> dict:
    """Everything `vlmdata show` prints about one sample, as plain data (images written to `images_dir` as
    KEY.J.EXT, or KEY.SHARD-ROW.J.EXT when several samples share the key: `unique=False`; KEY is
    `safe_key(key)`; `taken`: the file names already written in this run)."""
    rec, loc = found.record, found.location
    rendered = render_text(manifest, rec.tokens, rec.sizes)
    images = [{"width": w, "height": h} for w, h in rec.sizes]
    for entry, image in zip(images, rec.images):
        if isinstance(image, np.ndarray):
            entry["stored"] = f"{image.shape[1]}x{image.shape[0]} pixels (memmap)"
        else:
            entry["stored"] = f"{sniff(bytes(image[:16])) or 'unknown'}, {len(image)} bytes"
    if images_dir is not None:
        for entry, path in zip(images, _write_images(found, images_dir, unique, set() if taken is None else taken)):
            entry["file"] = path
    return {"key": found.key, "dataset": loc.dataset, "shard": loc.shard, "shard_file": loc.shard_name,
            "shards": len(manifest.shards), "row": loc.row, "offset": loc.offset, "span": loc.span, "url": loc.url,
            "tokens": rendered.tokens, "image_placeholders": len(rec.sizes),
            "trained_tokens": sum(b - a for a, b, _ in rendered.trained),
            "trained_spans": [{"start": a, "end": b, "text": t} for a, b, t in rendered.trained],
            "text": rendered.text, "images": images, "metadata": rec.meta}


def _format(r: dict, kind: str) -> str:
    where = "tokens" if kind == "memmap" else "bytes"
    lines = [f"sample {r['key']}  ({r['dataset']})",
             f"  where     shard {r['shard']} of {r['shards']}: {r['shard_file']}, row {r['row']}, "
             f"{where} {r['offset']}+{r['span']}",
             f"  tokens    {r['tokens']} stored ({r['tokens'] - r['image_placeholders']} text, "
             f"{r['image_placeholders']} image placeholders); {r['trained_tokens']} trained in "
             f"{len(r['trained_spans'])} span(s)"]
    for j, im in enumerate(r["images"]):
        lines.append(f"  image {j}   {im['width']}x{im['height']}, {im['stored']}" +
                     (f" -> {im['file']}" if "file" in im else ""))
    meta = json.dumps(r["metadata"], ensure_ascii=False, sort_keys=True) if r["metadata"] is not None else "(none)"
    lines.append(f"  metadata  {meta}")
    lines.append("  text")
    lines += ["    " + line.strip() for line in r["text"].strip("\n").splitlines()]
    lines.append("  trained spans")
    lines += [f"    [{s['start']}, {s['end']})  {s['text']}" for s in r["trained_spans"]] or ["    (none)"]
    return "\n".join(lines)


def show_samples(root: str, keys: list[str], storage_options: dict | None = None, images_dir: str | None = None,
                 as_json: bool = False) -> tuple[str, list[str]]:
    """(the report, the keys not found). Raises FileNotFoundError / ValueError if the key index is missing
    or stale."""
    so = storage_options or {}
    manifest = Manifest.load(root, so)
    reports, missing = [], []
    taken: set[str] = set()
    for key in keys:
        found = find_samples(root, key, so, manifest)
        if not found:
            missing.append(key)
        reports += [sample_report(f, manifest, images_dir, unique=len(found) == 1, taken=taken) for f in found]
    if as_json:
        return json.dumps({"samples": reports, "missing": missing}, ensure_ascii=False, indent=1), missing
    text = "\n\n".join(_format(r, manifest.kind) for r in reports)
    if missing:
        text += ("\n\n" if text else "") + "\n".join(f"no sample with key {k!r} in {root}" for k in missing)
    return text, missing
