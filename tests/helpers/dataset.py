"""Small datasets for the dataset/plan/collate tests, written with the format helpers.

`write_dataset(root, samples, ...)` writes WebDataset tar shards (or memmap
shards), their indices, planning.npz and manifest.json the way `vlmdata shard`
does, without going through the ingest pipeline (so these tests only depend on
the formats). `make_samples` makes deterministic synthetic LLaVA-style samples.
"""
from __future__ import annotations

import io
import os
import zlib
from dataclasses import dataclass

import numpy as np
from PIL import Image

from vlmdata import fsutil
from vlmdata.formats import (
    PLANNING_NAME,
    EncodedImage,
    IndexBuilder,
    Manifest,
    ShardInfo,
    TarShardWriter,
    concat_planning_columns,
    write_sample,
)
from vlmdata.text import ByteTokenizer, encode_conversation

TOK = ByteTokenizer()
WORDS = "a the red blue dog cat car street tree sky sign chart value page line two bright dark".split()


@dataclass
class RawSample:
    key: str
    tokens: np.ndarray            # (2, T) int32
    images: list[EncodedImage]
    pixels: list[np.ndarray]      # original decoded pixels (for memmap shards)


def jpeg(rng: np.random.Generator, w: int, h: int) -> tuple[bytes, np.ndarray]:
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255 // max(w, 1), y * 255 // max(h, 1), (x + y) * 127 // max(w + h, 1)], -1)
    arr = np.clip(base + rng.integers(0, 40, 3), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="JPEG", quality=85)
    return buf.getvalue(), arr


def make_samples(n: int, seed: int = 0, max_images: int = 3, long_text: int = 0, prefix: str = "s") -> list[RawSample]:
    """n samples with 0..max_images small JPEGs and text of varying length (some of `long_text` words)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        k = int(rng.integers(0, max_images + 1))
        words = int(rng.integers(3, 60)) if not long_text or rng.random() > 0.2 else long_text
        text = " ".join(WORDS[j] for j in rng.integers(0, len(WORDS), words))
        images, pixels = [], []
        for _ in range(k):
            w, h = int(rng.integers(40, 200)), int(rng.integers(40, 200))
            data, arr = jpeg(rng, w, h)
            images.append(EncodedImage(data, "jpg", w, h))
            pixels.append(arr)
        tokens = encode_conversation(TOK, [("user", "<image>\n" * k + "Describe."), ("assistant", text)], k)
        out.append(RawSample(f"{prefix}{i:05d}", tokens, images, pixels))
    return out


def write_dataset(root: str, samples: list[RawSample], shard_size: int = 16, kind: str = "webdataset",
                  image_size: int = 56, corrupt_keys: frozenset = frozenset(), truncate: bool = False) -> Manifest:
    """Write a dataset directory; images of samples in `corrupt_keys` get non-image bytes
    (or, with truncate=True, the first half of their JPEG bytes)."""
    os.makedirs(root, exist_ok=True)
    shards, indices = [], []
    for s0 in range(0, len(samples), shard_size):
        part = samples[s0:s0 + shard_size]
        stem = f"shard-{s0 // shard_size:06d}-00"
        if kind == "memmap":
            from vlmdata.formats import MemmapPartWriter

            w = MemmapPartWriter(root, stem, image_size)
            for smp in part:
                ims = [np.asarray(Image.fromarray(p).resize((image_size, image_size))) for p in smp.pixels]
                w.add(smp.key, {"id": smp.key}, smp.tokens, ims, [(im.width, im.height) for im in smp.images])
            info = w.close()
            from vlmdata.formats import SampleIndex

            indices.append(SampleIndex.load(os.path.join(root, info.index)))
            shards.append(info)
            continue
        buf = io.BytesIO()
        writer, builder = TarShardWriter(buf, mtime=0), IndexBuilder()
        for smp in part:
            images = smp.images
            if smp.key in corrupt_keys and images:
                images = [EncodedImage(im.data[:len(im.data) // 2] if truncate else b"<html>not an image</html>" * 8,
                                       "jpg", im.width, im.height) for im in images]
            write_sample(writer, builder, smp.key, {"id": smp.key}, smp.tokens, images, TOK.special.image)
        writer.close()
        data = buf.getvalue()
        index = builder.build().describes(len(data), zlib.crc32(data) & 0xFFFFFFFF)
        name = f"{stem}.tar"
        with open(os.path.join(root, name), "wb") as f:
            f.write(data)
        index.save(os.path.join(root, f"{stem}.index.npz"))
        indices.append(index)
        shards.append(ShardInfo(name=name, index=f"{stem}.index.npz", samples=len(index),
                                images=index.n_image_total, bytes=len(data), crc32=zlib.crc32(data) & 0xFFFFFFFF,
                                files=[name]))
    cols = concat_planning_columns(indices)
    buf = io.BytesIO()
    np.savez(buf, **cols)
    fsutil.atomic_write_bytes(os.path.join(root, PLANNING_NAME), buf.getvalue())
    policy = {"kind": "fixed", "size": image_size, "patch": 14, "merge": 1} if kind == "memmap" else None
    manifest = Manifest(kind=kind, shards=shards, tokenizer=TOK.identity(), image_policy=policy)
    manifest.save(root)
    return manifest


def expected_sample(sample: RawSample, image_tokens: list[int], max_tokens: int | None = None):
    """(input_ids, labels) a sample must produce, recomputed independently of collate."""
    ids, loss = [], []
    for t, f in zip(sample.tokens[0].tolist(), sample.tokens[1].tolist()):
        if t == TOK.special.image:
            n = image_tokens.pop(0)
            ids += [t] * n
            loss += [0] * n
        else:
            ids.append(t)
            loss.append(f)
    labels = [t if f else -100 for t, f in zip(ids, loss)]
    labels[0] = -100
    return ids, labels
