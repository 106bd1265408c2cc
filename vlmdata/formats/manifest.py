"""The dataset manifest: one JSON file that names every shard and how it was made.

Layout of a dataset directory (local path or fsspec URL):

    manifest.json                  this file
    planning.npz                   planning columns of all shards merged (see index.concat_planning_columns)
    shard-000000-00.tar            WebDataset shard (or memmap arrays, see formats.memmap)
    shard-000000-00.index.npz      its SampleIndex
    shard-000000-00.idx            its DALI webdataset index
    _jobs/job-000000.json          per-job stats, the durable "done" marker used by --resume
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from vlmdata import fsutil

MANIFEST_NAME = "manifest.json"
PLANNING_NAME = "planning.npz"
FORMAT_VERSION = 1


@dataclass
class ShardInfo:
    """One shard: its files (relative to the dataset root) and what it holds."""

    name: str                 # the data file (tar) or the memmap stem
    index: str                # the SampleIndex file
    samples: int
    images: int
    bytes: int                # size of the data file(s)
    crc32: int                # zlib.crc32 of the data file (tar); memmap: of the token array
    dali_index: str | None = None
    files: list[str] = field(default_factory=list)  # every data file of the shard (memmap has several)


@dataclass
class Manifest:
    """What `vlmdata shard` and `vlmdata index` write; what the loader reads first."""

    kind: str                              # "webdataset" or "memmap"
    shards: list[ShardInfo]
    tokenizer: dict
    image_policy: dict | None = None       # memmap stores pre-resized images: its fixed policy
    layout: dict = field(default_factory=lambda: {"text": "tok.npy"})
    # layout["text"]: "tok.npy" (pre-tokenized, vlmdata's own shards) or, for shards written by
    # other tools and indexed in place, "txt" / "json" (tokenized at load time; for "json" the
    # caption is layout["json_field"]). The index's tok_offset/tok_size then point at that member.
    stats: dict = field(default_factory=dict)
    version: int = FORMAT_VERSION
    format: str = "vlmdata"

    @property
    def num_samples(self) -> int:
        return sum(s.samples for s in self.shards)

    @property
    def num_images(self) -> int:
        return sum(s.images for s in self.shards)

    @property
    def total_bytes(self) -> int:
        return sum(s.bytes for s in self.shards)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        raw = json.loads(text)
        if raw.get("format") != "vlmdata":
            raise ValueError("not a vlmdata manifest (missing \"format\": \"vlmdata\")")
        if raw.get("version", 0) > FORMAT_VERSION:
            raise ValueError(f"manifest version {raw['version']} is newer than this vlmdata ({FORMAT_VERSION}); upgrade vlmdata")
        raw["shards"] = [ShardInfo(**s) for s in raw["shards"]]
        return cls(**raw)

    def save(self, root: str, storage_options: dict | None = None) -> None:
        fsutil.atomic_write_bytes(fsutil.join(root, MANIFEST_NAME), self.to_json().encode(), storage_options)

    @classmethod
    def load(cls, root: str, storage_options: dict | None = None, retry=None) -> Manifest:
        """Read `root`/manifest.json (with `retry`, a vlmdata.retry.RetryPolicy, transient errors are retried)."""
        url = fsutil.join(root, MANIFEST_NAME)
        try:
            text = fsutil.read_bytes(url, storage_options, retry).decode("utf-8")
        except FileNotFoundError:
            raise FileNotFoundError(f"no {MANIFEST_NAME} in {root}: run `vlmdata shard` or `vlmdata index` on it first") from None
        return cls.from_json(text)
