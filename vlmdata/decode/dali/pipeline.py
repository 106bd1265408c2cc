"""The DALI decode + resize pipeline shared by the DALI CPU decoder and the GPU stage.

One `DaliRunner` owns one pipeline, built lazily in the process that first
uses it (DataLoader workers fork: nothing DALI exists before the fork) and
rebuilt if the object is used in a forked child. The pipeline takes, per
image, the encoded bytes and the target (height, width) from the image
policy, decodes (`device="cpu"` or `"mixed"`), resizes to exactly that size
and optionally normalises to CHW float (mean/std on the device).

Batches may be smaller than `max_batch` (DALI 2.x takes a variable batch
size through `feed_input`). DALI fails a whole batch when one image is bad;
the runner then splits the batch in halves until each bad image is alone and
returns None for it, so a corrupt image costs exactly itself.
"""
from __future__ import annotations

import ctypes
import logging
import os
import re
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from vlmdata.errors import Skip

log = logging.getLogger(__name__)

SYSTEMIC_MIN = 4   # this many images that all fail to decode are a pipeline failure, not bad data
_SAMPLE_RE = re.compile(r"Failed to decode sample #(\d+)")
_INTERP = {"linear": "INTERP_LINEAR", "cubic": "INTERP_CUBIC", "triangular": "INTERP_TRIANGULAR",
           "lanczos": "INTERP_LANCZOS3", "nearest": "INTERP_NN"}


@dataclass(frozen=True)
class Normalization:
    """Per-channel mean/std on the 0-255 scale; output is CHW `dtype` ("float32" or "float16")."""

    mean: tuple[float, float, float] = (0.48145466 * 255, 0.4578275 * 255, 0.40821073 * 255)
    std: tuple[float, float, float] = (0.26862954 * 255, 0.26130258 * 255, 0.27577711 * 255)
    dtype: str = "float32"


@dataclass(frozen=True)
class DaliConfig:
    """How the DALI pipeline is built.

    device: "cpu" (decode and resize on CPU, no GPU needed) or "mixed" (nvJPEG, GPU output).
    max_batch: images per pipeline run; longer inputs are processed in chunks.
    num_threads: DALI CPU worker threads (1 per DataLoader worker is right on small machines).
    interp: resize filter ("linear" matches Pillow BILINEAR with antialiasing, "cubic" BICUBIC).
    normalize: when set, the output is normalised CHW float instead of uint8 HWC.
    """

    device: str = "cpu"
    max_batch: int = 16
    num_threads: int = 1
    device_id: int | None = None
    interp: str = "linear"
    fast_idct: bool = False
    normalize: Normalization | None = None

    def __post_init__(self) -> None:
        if self.device not in ("cpu", "mixed"):
            raise ValueError(f"DALI device must be 'cpu' or 'mixed', got {self.device!r}")
        if self.interp not in _INTERP:
            raise ValueError(f"unknown interp {self.interp!r}: use one of {sorted(_INTERP)}")
        if self.max_batch < 1 or self.num_threads < 1:
            raise ValueError("max_batch and num_threads must be >= 1")
        if self.device == "mixed" and self.device_id is None:
            raise ValueError("device='mixed' needs a device_id (the CUDA device index)")


def build_pipeline(cfg: DaliConfig):
    """A built DALI pipeline with inputs "enc" (uint8 bytes) and "size" (float [H, W]); one output."""
    pipe = define_pipeline(cfg)
    pipe.build()
    return pipe


def define_pipeline(cfg: DaliConfig):
    """The pipeline graph, not built yet (defining a "mixed" one needs no GPU: tests check it here)."""
    from nvidia.dali import fn, types
    from nvidia.dali.pipeline import Pipeline

    device_id = cfg.device_id if cfg.device == "mixed" else None
    pipe = Pipeline(batch_size=cfg.max_batch, num_threads=cfg.num_threads, device_id=device_id,
                    prefetch_queue_depth=1, exec_async=False, exec_pipelined=False)
    with pipe:
        enc = fn.external_source(name="enc", dtype=types.UINT8, ndim=1, no_copy=False)
        size = fn.external_source(name="size", dtype=types.FLOAT, ndim=1)
        img = fn.decoders.image(enc, device=cfg.device, output_type=types.RGB,
                                adjust_orientation=False, use_fast_idct=cfg.fast_idct)
        # `size` stays a CPU node: DALI takes named-argument inputs from the CPU only
        out = fn.resize(img, size=size, interp_type=getattr(types, _INTERP[cfg.interp]), antialias=True)
        if cfg.normalize is not None:
            norm = cfg.normalize
            dtype = types.FLOAT16 if norm.dtype == "float16" else types.FLOAT
            out = fn.crop_mirror_normalize(out, dtype=dtype, output_layout="CHW",
                                           mean=list(norm.mean), std=list(norm.std))
        pipe.set_outputs(out)
    return pipe


def as_uint8(data) -> np.ndarray:
    """Encoded image bytes (bytes, bytearray, memoryview or uint8 array) as a 1-D uint8 array."""
    if isinstance(data, np.ndarray):
        return np.ascontiguousarray(data.reshape(-1).view(np.uint8))
    return np.frombuffer(data, dtype=np.uint8)


class DaliRunner:
    """Runs the pipeline on lists of images, isolating bad ones; picklable (the pipeline is not sent)."""

    def __init__(self, cfg: DaliConfig):
        self.cfg = cfg
        self._pipe = None
        self._pid: int | None = None
        self._lock = threading.Lock()
        self._last_error = ""
        self.errors: Counter = Counter()
        self.runs = 0

    def __getstate__(self) -> dict:
        return {"cfg": self.cfg}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["cfg"])

    @property
    def built(self) -> bool:
        return self._pipe is not None and self._pid == os.getpid()

    def _pipeline(self):
        if not self.built:
            if self._pipe is not None:
                _abandon_inherited(self._pipe)
            self._pipe = None
            self._pipe = build_pipeline(self.cfg)
            self._pid = os.getpid()
        return self._pipe

    def run(self, encoded: Sequence, hw: Sequence[tuple[int, int]],
            convert: Callable[[Any], Any], copied: Callable[[], None] | None = None, strict: bool = True) -> list:
        """Decode each image to its (height, width); `convert(dali_tensor)` copies one result out.

        `copied()`, when given, is called after each pipeline run's results were converted and
        before the next run may reuse DALI's output buffers (e.g. to wait for async GPU copies).
        Returns a list aligned with `encoded`, None where the image could not be decoded.
        `strict`: raise when all of at least SYSTEMIC_MIN valid-looking images fail (a pipeline
        problem); callers that fall back to a CPU decoder per image pass False and judge themselves.
        Thread-safe: concurrent calls take turns on the one pipeline (DALI's own threads
        give the parallelism; see `DaliConfig.num_threads`).
        """
        if len(encoded) != len(hw):
            raise ValueError(f"{len(encoded)} images but {len(hw)} target sizes")
        arrays = [as_uint8(e) for e in encoded]
        out: list = [None] * len(arrays)
        good = []
        for i, a in enumerate(arrays):
            if a.size == 0:
                self._note_bad(Skip.EMPTY_FILE, i, "zero-length image")
            elif not looks_like_image(a):
                self._note_bad(Skip.NOT_AN_IMAGE, i, f"unknown signature {a[:8].tobytes()!r}")
            else:
                good.append(i)
        step = self.cfg.max_batch
        with self._lock:
            self._last_error = ""
            for start in range(0, len(good), step):
                self._isolate(good[start:start + step], arrays, hw, (convert, copied), out)
        if strict and len(good) >= SYSTEMIC_MIN and all(out[i] is None for i in good):
            raise RuntimeError(f"DALI decoded none of {len(good)} images that look valid; this is a pipeline "
                               f"or device problem, not bad data (first error: {self._last_error})")
        return out

    def _isolate(self, idx: list[int], arrays, hw, sink: tuple, out: list) -> None:
        try:
            results = self._run_once([arrays[i] for i in idx], [hw[i] for i in idx], sink)
        except RuntimeError as e:
            # DALI declares the pipeline invalid after an error: drop it, a fresh one is built lazily.
            self._pipe = None
            if len(idx) == 1:
                self._last_error = self._last_error or _first_line(e)
                self._note_bad(Skip.DECODE_ERROR, idx[0], _first_line(e))
                return
            for part in _split(idx, _failed_sample(e)):
                self._isolate(part, arrays, hw, sink, out)
            return
        for i, r in zip(idx, results):
            out[i] = r

    def _run_once(self, arrays: list[np.ndarray], hw: list[tuple[int, int]], sink: tuple) -> list:
        """One pipeline run; `sink` is (convert, copied) as given to `run`."""
        pipe = self._pipeline()
        pipe.feed_input("enc", arrays)
        pipe.feed_input("size", [np.array(s, dtype=np.float32) for s in hw])
        self.runs += 1
        (tl,) = pipe.run()
        convert, copied = sink
        results = [convert(tl[i]) for i in range(len(arrays))]
        if copied is not None:
            copied()
        return results

    def _note_bad(self, reason: str, index: int, detail: str) -> None:
        if not self.errors[reason]:
            log.warning("DALI could not decode an image (%s, e.g. input #%d: %s); "
                        "such images are returned as None", reason, index, detail)
        self.errors[reason] += 1


def _abandon_inherited(pipe) -> None:
    """Never destroy a pipeline inherited through fork.

    Its worker threads exist only in the parent, so shutting it down in the child
    (its `__del__`, or DALI's atexit hook) waits forever. Keep one extra reference so
    it is never freed, and take it off DALI's at-exit list; it only costs the
    copy-on-write memory the child already shares with its parent.
    """
    import weakref

    from nvidia.dali.pipeline import Pipeline

    ctypes.pythonapi.Py_IncRef(ctypes.py_object(pipe))
    Pipeline._pipes.discard(weakref.ref(pipe))


def _failed_sample(e: Exception) -> int | None:
    """The batch position DALI names in "Failed to decode sample #k", if any."""
    m = _SAMPLE_RE.search(str(e))
    return int(m.group(1)) if m else None


def _split(idx: list[int], hint: int | None) -> list[list[int]]:
    """Parts to retry: the named sample alone plus the rest, else two halves."""
    if hint is not None and 0 <= hint < len(idx):
        rest = idx[:hint] + idx[hint + 1:]
        return [[idx[hint]], rest] if rest else [[idx[hint]]]
    mid = len(idx) // 2
    return [idx[:mid], idx[mid:]]


def _first_line(e: Exception) -> str:
    """The informative line of a DALI error (what the operator "encountered")."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    for i, ln in enumerate(lines):
        if ln.startswith("Failed to decode"):
            return ln[:200]
        if ln == "encountered:" and i + 1 < len(lines):
            return lines[i + 1][:200]
    return lines[0][:200] if lines else type(e).__name__


def looks_like_image(a: np.ndarray) -> bool:
    """Whether the bytes start with the signature of a format DALI decodes (cheap pre-check)."""
    head = a[:12].tobytes()
    if head[:2] == b"BM" or (len(head) > 1 and head[:1] == b"P" and head[1:2] in b"123456"):
        return True
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return True
    return any(head.startswith(sig) for sig in _SIGNATURES)


_SIGNATURES = (b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"II*\x00", b"MM\x00*",
               b"\x00\x00\x00\x0cjP  ", b"\xffO\xffQ")
