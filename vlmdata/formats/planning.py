"""planning.npz: the planning columns of a whole dataset, written shard by shard and read a window at a time.

The file is what `np.savez` writes, an uncompressed zip of `.npy` members, so
`np.load` still reads a small one whole. Members, all in shard order:

    text_tokens  i4  per sample: text tokens, image placeholders excluded
    n_images     i2  per sample
    width        i4  per image (sample-major): original pixels, from the image header
    height       i4  per image
    shard        i4  per sample: its shard            } derivable from the manifest's shard sizes;
    local        i4  per sample: its row in the shard } written for tools that load the file whole,
    image_start  i8  per sample: its first image row  } never read by the planner (optional)
    video_tokens i4  per sample: the tokens of its clips under the dataset's video policy (only in
                     datasets with clips; a file without it reads as 0 video tokens everywhere)

At 10^9 samples the file holds tens of GB, so neither side ever holds it whole:

* `PlanningWriter` streams each column to a temporary file as shards are
  added (one shard's columns in memory at a time), then copies them into
  the zip member by member.
* `PlanningColumns` finds each member's data offset from the zip's central
  directory and the `.npy` header, and reads a window's shards as byte
  ranges: positioned reads (pread) of a local file, one ranged GET per shard
  and column on an object store. A shard's samples and images are
  contiguous, located by the manifest's per-shard counts. Only what a
  window needs is read (through the page cache, which the processes of a
  machine share). A memory map would read the same pages but count them in
  the RSS of every process that touched them, whole page-cache folios at a
  time (up to MBs per touched range): at 10^9 samples hundreds of MB per
  process after a few dozen windows, for data already used and copied out.
"""
from __future__ import annotations

import os
import shutil
import struct
import tempfile
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from vlmdata import fsutil
from vlmdata.retry import RetryPolicy

__all__ = ["PLANNING_COLUMNS", "PlanningColumns", "PlanningWriter"]

SAMPLE_COLUMNS = {"text_tokens": np.dtype("<i4"), "n_images": np.dtype("<i2")}
IMAGE_COLUMNS = {"width": np.dtype("<i4"), "height": np.dtype("<i4")}
VIDEO_COLUMN = {"video_tokens": np.dtype("<i4")}            # optional, per sample
DERIVED_COLUMNS = {"shard": np.dtype("<i4"), "local": np.dtype("<i4"), "image_start": np.dtype("<i8")}
PLANNING_COLUMNS = (*SAMPLE_COLUMNS, *IMAGE_COLUMNS)        # what planning reads
COPY_CHUNK = 4 << 20                                      # copy buffer of commit()
REMOTE_THREADS = 32                  # a window's ranged reads: 4 columns x its shards, small and latency-bound
_LOCAL_HEADER = struct.Struct("<4s22xHH")                  # signature, ..., name length, extra length


class PlanningWriter:
    """Streams planning.npz shard by shard; `commit()` publishes it atomically (uploads it whole if remote).

    `derived=False` leaves out the derivable shard/local/image_start members
    (the planner does not need them; they add 16 bytes per sample).
    """

    def __init__(self, url: str, storage_options: dict | None = None, fsync: bool = True, derived: bool = True,
                 video_policy=None):
        self.url = url
        self.storage_options = storage_options or {}
        self.fsync = fsync
        self.video_policy = video_policy              # set: a video_tokens column from each index's clips
        self.dtypes = {**SAMPLE_COLUMNS, **IMAGE_COLUMNS, **(DERIVED_COLUMNS if derived else {}),
                       **(VIDEO_COLUMN if video_policy is not None else {})}
        self._dir = tempfile.mkdtemp(prefix="vlmdata-planning-")
        self._files = {name: open(os.path.join(self._dir, name), "wb") for name in self.dtypes}
        self.shards = 0
        self.samples = 0
        self.images = 0

    def add_shard(self, text_tokens: np.ndarray, n_images: np.ndarray, width: np.ndarray, height: np.ndarray) -> None:
        """Append one shard's columns (per sample: text_tokens, n_images; per image: width, height)."""
        self.add_shards([len(text_tokens)], text_tokens, n_images, width, height)

    def add_shards(self, samples_per_shard, text_tokens: np.ndarray, n_images: np.ndarray, width: np.ndarray,
                   height: np.ndarray, video_tokens: np.ndarray | None = None) -> None:
        """Append consecutive shards at once: their columns concatenated, `samples_per_shard` splitting them."""
        counts = np.asarray(samples_per_shard, dtype=np.int64)
        n, m = len(text_tokens), len(width)
        if int(counts.sum()) != n or len(n_images) != n or len(height) != m or int(np.sum(n_images, dtype=np.int64)) != m:
            raise ValueError(f"shards from {self.shards}: {int(counts.sum())} samples by shard, {n} token counts and "
                             f"{len(n_images)} image counts ({int(np.sum(n_images))} images), {m} widths and "
                             f"{len(height)} heights")
        cols = {"text_tokens": text_tokens, "n_images": n_images, "width": width, "height": height}
        if "video_tokens" in self.dtypes:
            cols["video_tokens"] = np.zeros(n, np.int32) if video_tokens is None else video_tokens
        if "shard" in self.dtypes:
            n_img = np.asarray(n_images, dtype=np.int64)
            first = np.repeat(np.cumsum(counts) - counts, counts)
            cols["shard"] = np.repeat(np.arange(self.shards, self.shards + len(counts)), counts)
            cols["local"] = np.arange(n) - first
            cols["image_start"] = self.images + np.cumsum(n_img) - n_img
        for name, values in cols.items():
            self._files[name].write(np.ascontiguousarray(values, dtype=self.dtypes[name]).tobytes())
        self.shards += len(counts)
        self.samples += n
        self.images += m

    def add_index(self, index) -> None:
        """Append a shard's columns from its SampleIndex."""
        video = None
        if self.video_policy is not None:
            from vlmdata.video.policy import sample_video_tokens

            video = sample_video_tokens(index.videos, self.video_policy)
        self.add_shards([len(index.text_tokens)], index.text_tokens, index.n_images, index.width, index.height, video)

    def commit(self) -> None:
        """Write the zip (members in a fixed order) and publish it under the final name."""
        try:
            for f in self._files.values():
                f.close()
            with fsutil.AtomicLocalFile(self.url, self.storage_options, self.fsync) as out, \
                    zipfile.ZipFile(out.file, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
                for name, dtype in self.dtypes.items():
                    n = self.samples if name not in IMAGE_COLUMNS else self.images
                    with zf.open(f"{name}.npy", "w", force_zip64=True) as member:
                        header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": (n,)}
                        np.lib.format.write_array_header_1_0(member, header)
                        with open(os.path.join(self._dir, name), "rb") as src:
                            shutil.copyfileobj(src, member, COPY_CHUNK)
        finally:
            shutil.rmtree(self._dir, ignore_errors=True)

    def abort(self) -> None:
        """Drop everything written so far."""
        for f in self._files.values():
            f.close()
        shutil.rmtree(self._dir, ignore_errors=True)


@dataclass(frozen=True)
class _Member:
    offset: int          # of the array data in the file
    dtype: np.dtype
    length: int
    stored: bool         # False: a compressed member (an old or foreign file), read whole once


def _read_members(f) -> dict[str, _Member]:
    """Locate every .npy member's array data (zip central directory, local headers, .npy headers)."""
    members = {}
    with zipfile.ZipFile(f) as zf:
        infos = zf.infolist()
    for info in infos:
        name = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
        if info.compress_type != zipfile.ZIP_STORED:
            members[name] = _Member(-1, np.dtype("u1"), -1, stored=False)
            continue
        f.seek(info.header_offset)
        sig, name_len, extra_len = _LOCAL_HEADER.unpack(f.read(_LOCAL_HEADER.size))
        if sig != b"PK\x03\x04":
            raise ValueError(f"planning file: bad local header for member {info.filename}")
        start = info.header_offset + _LOCAL_HEADER.size + name_len + extra_len
        f.seek(start)
        version = np.lib.format.read_magic(f)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read_header(f)
        if len(shape) != 1 or fortran:
            raise ValueError(f"planning file: member {info.filename} is not a flat array (shape {shape})")
        members[name] = _Member(f.tell(), dtype, int(shape[0]), stored=True)
    return members


class PlanningColumns:
    """A dataset's planning.npz, read a few shards at a time (see the module docstring).

    `shard_samples` and `shard_images` are the manifest's per-shard counts.
    `column_files` reads some columns from other files of the same layout
    (a text view's `text_tokens`); `retry` governs every remote read
    (vlmdata.retry; None: one attempt). Picklable (paths and offsets: each
    process opens the files itself).
    """

    def __init__(self, url: str, shard_samples: np.ndarray, shard_images: np.ndarray,
                 storage_options: dict | None = None, column_files: dict[str, str] | None = None,
                 retry: RetryPolicy | None = None):
        self.url = url
        self.storage_options = dict(storage_options or {})
        self.retry = retry
        self.shard_samples = np.asarray(shard_samples, dtype=np.int64)
        self.shard_images = np.asarray(shard_images, dtype=np.int64)
        self.sample_start = np.concatenate([[0], np.cumsum(self.shard_samples)]).astype(np.int64)
        self.image_start = np.concatenate([[0], np.cumsum(self.shard_images)]).astype(np.int64)
        self.files = {name: url for name in PLANNING_COLUMNS} | dict(column_files or {})
        self.members: dict[str, _Member] = {}
        for file_url in dict.fromkeys(self.files.values()):
            found = self._call(lambda u=file_url: self._members_of(u), file_url)
            wanted = [c for c, u in self.files.items() if u == file_url]
            missing = [c for c in wanted if c not in found]
            if missing:
                raise ValueError(f"{file_url} lacks columns {missing}: re-run `vlmdata index` on the dataset")
            self.members.update({c: found[c] for c in wanted})
            if file_url == url and "video_tokens" in found:       # optional: a dataset with clips
                self.files["video_tokens"] = url
                self.members["video_tokens"] = found["video_tokens"]
        for name in PLANNING_COLUMNS:
            expected = int(self.sample_start[-1] if name in SAMPLE_COLUMNS else self.image_start[-1])
            got = self.members[name].length
            if self.members[name].stored and got != expected:
                kind = "samples" if name in SAMPLE_COLUMNS else "images"
                raise ValueError(f"{self.files[name]}: column {name} has {got} rows but the manifest counts "
                                 f"{expected} {kind}; the planning file belongs to another version of the dataset")
        self._maps: dict[str, np.ndarray] = {}         # compressed members loaded whole
        self._fds: dict[str, int] = {}
        self._fd_pid = -1

    def _members_of(self, url: str) -> dict[str, _Member]:
        with fsutil.open_url(url, "rb", self.storage_options) as f:
            return _read_members(f)

    def _call(self, fn, what: str):
        return fn() if self.retry is None or fsutil.is_local(what) else self.retry.call(fn, what)

    @property
    def num_samples(self) -> int:
        return int(self.sample_start[-1])

    @property
    def num_images(self) -> int:
        return int(self.image_start[-1])

    def _loaded(self, name: str) -> np.ndarray:
        """A compressed member (no byte ranges to read), loaded whole once."""
        col = self._maps.get(name)
        if col is None:
            url = self.files[name]

            def load() -> np.ndarray:
                with fsutil.open_url(url, "rb", self.storage_options) as f, np.load(f) as z:
                    return z[name]

            col = self._maps[name] = self._call(load, url)
        return col

    def _fd(self, url: str) -> int:
        if self._fd_pid != os.getpid():                 # descriptors are per process (a fork inherits none)
            self._fds, self._fd_pid = {}, os.getpid()
        fd = self._fds.get(url)
        if fd is None:
            fd = self._fds[url] = os.open(fsutil.local_path(url), os.O_RDONLY)
        return fd

    def _pread(self, url: str, m: _Member, a: int, b: int) -> np.ndarray:
        fd = self._fd(url)
        out = np.empty(b - a, m.dtype)
        view = memoryview(out).cast("B")
        pos, done = m.offset + a * m.dtype.itemsize, 0
        while done < len(view):
            n = os.preadv(fd, [view[done:]], pos + done)
            if n <= 0:
                raise ValueError(f"{url} is shorter than its columns say (truncated?)")
            done += n
        return out

    def _columns(self, wanted: dict[str, list[tuple[int, int]]]) -> dict[str, list[np.ndarray]]:
        """Each column's values in each of its [a, b) ranges. Ranges that follow each other are read at
        once; on an object store the reads of every column go out together (small, latency-bound)."""
        jobs: list[tuple[str, int, int]] = []
        plans: dict[str, tuple[int, list[list[int]]]] = {}
        for name, ranges in wanted.items():
            runs: list[list[int]] = []                  # [a, b, first range, last range + 1]
            for i, (a, b) in enumerate(ranges):
                if runs and runs[-1][1] == a:
                    runs[-1][1], runs[-1][3] = b, i + 1
                else:
                    runs.append([a, b, i, i + 1])
            plans[name] = (len(jobs), runs)
            jobs += [(name, r[0], r[1]) for r in runs]
        values = self._fetch(jobs)
        out: dict[str, list[np.ndarray]] = {}
        for name, ranges in wanted.items():
            first, runs = plans[name]
            out[name] = [values[first + k][x - a:y - a] for k, (a, _, i, j) in enumerate(runs) for x, y in ranges[i:j]]
        return out

    def _fetch(self, jobs: list[tuple[str, int, int]]) -> list[np.ndarray]:
        """Values [a, b) of the named column for each job; the remote ones in one pool of threads."""
        out: list[np.ndarray | None] = [None] * len(jobs)
        remote = []
        for i, (name, a, b) in enumerate(jobs):
            m, url = self.members[name], self.files[name]
            if not m.stored:
                out[i] = self._loaded(name)[a:b]
            elif fsutil.is_local(url):
                out[i] = self._pread(url, m, a, b)
            else:
                remote.append(i)
        if len(remote) == 1:
            out[remote[0]] = self._range(*jobs[remote[0]])
        elif remote:
            with ThreadPoolExecutor(min(REMOTE_THREADS, len(remote))) as pool:
                for i, values in zip(remote, pool.map(lambda i: self._range(*jobs[i]), remote)):
                    out[i] = values
        return out

    def _range(self, name: str, a: int, b: int) -> np.ndarray:
        """Values [a, b) of a stored column on an object store (one ranged GET, under the retry policy)."""
        m, url = self.members[name], self.files[name]
        if a == b:
            return np.zeros(0, m.dtype)
        start, end = m.offset + a * m.dtype.itemsize, m.offset + b * m.dtype.itemsize
        raw = self._call(lambda: fsutil.read_range(url, start, end, self.storage_options), url)
        if len(raw) != end - start:
            raise ValueError(f"{url} is shorter than its columns say (truncated?)")
        return np.frombuffer(raw, dtype=m.dtype)

    def read_shards(self, shards) -> dict[str, np.ndarray]:
        """The planning columns of these shards' samples, shard after shard in the given order.

        Returns text_tokens (i4), n_images (i2), width, height (i4),
        image_start (i8, into the returned width/height) and, in a dataset with clips, video_tokens (i4).
        """
        shards = np.asarray(shards, dtype=np.int64)
        s_ranges = [(int(self.sample_start[s]), int(self.sample_start[s + 1])) for s in shards.tolist()]
        i_ranges = [(int(self.image_start[s]), int(self.image_start[s + 1])) for s in shards.tolist()]
        per_sample = {**SAMPLE_COLUMNS, **({} if "video_tokens" not in self.members else VIDEO_COLUMN)}
        parts = self._columns({**{name: s_ranges for name in per_sample},
                               **{name: i_ranges for name in IMAGE_COLUMNS}})
        for s, n_img, (a, b) in zip(shards.tolist(), parts["n_images"], i_ranges):
            if int(n_img.sum(dtype=np.int64)) != b - a:
                raise ValueError(f"{self.url}: shard {s} holds {int(n_img.sum())} images by its n_images column but "
                                 f"{b - a} by the manifest; the planning file belongs to another version of the dataset")
        out = {name: (np.concatenate(p) if p else np.zeros(0, dt))
               for name, dt, p in [(n, d, parts[n]) for n, d in {**per_sample, **IMAGE_COLUMNS}.items()]}
        n_img = out["n_images"].astype(np.int64)
        out["image_start"] = np.cumsum(n_img) - n_img
        return out

    def load(self) -> dict[str, np.ndarray]:
        """Every planning column whole (small datasets, inspection); the derived ones computed if absent."""
        cols = self.read_shards(np.arange(len(self.shard_samples)))
        cols["shard"] = np.repeat(np.arange(len(self.shard_samples), dtype=np.int32), self.shard_samples)
        cols["local"] = (np.arange(self.num_samples) - np.repeat(self.sample_start[:-1], self.shard_samples)).astype(np.int32)
        return cols

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_maps"] = {}
        state["_fds"], state["_fd_pid"] = {}, -1
        return state

    def __del__(self) -> None:
        if getattr(self, "_fd_pid", -1) == os.getpid():
            for fd in self._fds.values():
                os.close(fd)
