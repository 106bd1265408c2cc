"""The dataset manifest: one JSON file that names every shard and how it was made.

Layout of a dataset directory (local path or fsspec URL):

    manifest.json                  this file
    planning.npz                   planning columns of all shards merged (see index.concat_planning_columns)
    shard-000000-00.tar            WebDataset shard (or memmap arrays, see formats.memmap)
    shard-000000-00.index.npz      its SampleIndex
    shard-000000-00.idx            its DALI webdataset index
    _jobs/job-000000.json          per-job stats, the durable "done" marker used by --resume
    views/NAME/                    a text view added by `vlmdata retokenize` (see formats.text_view)

Text views: the image bytes never depend on the tokenizer. The tokens written at
shard time (the `.tok.npy` members) are the dataset's default view; every view
added later is a folder of per-shard token files plus its own planning column.
`Manifest.views` names each view and its tokenizer identity; `default_view`
is the view a loader takes unless told otherwise. A manifest without views
(vlmdata before views) has one implicit view, "default".
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from vlmdata import fsutil

MANIFEST_NAME = "manifest.json"
PLANNING_NAME = "planning.npz"
FORMAT_VERSION = 2          # 2: text views (`views`, `default_view`); version 1 manifests read unchanged
IMPLICIT_VIEW = "default"   # the view name of a manifest without views


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
    version: int = 1
    format: str = "vlmdata"
    # view name -> {"tokenizer": identity, "tokens": "tar" | "sidecar", "dir": "views/NAME" (sidecar),
    #               "train_on", "samples", "skipped", "created"}; empty for datasets made before views
    views: dict = field(default_factory=dict)
    default_view: str | None = None

    def view_names(self) -> list[str]:
        """The dataset's text views (the implicit "default" for a manifest without views)."""
        return list(self.views) or [IMPLICIT_VIEW]

    def view(self, name: str | None = None) -> tuple[str, dict]:
        """(name, entry) of a text view (None: the default view); KeyError names the views there are."""
        if not self.views:
            if name not in (None, IMPLICIT_VIEW):
                raise KeyError(f"the dataset has no text view {name!r}; it has only {IMPLICIT_VIEW!r} "
                               "(add one with `vlmdata retokenize`)")
            return IMPLICIT_VIEW, {"tokenizer": self.tokenizer, "tokens": "tar"}
        name = name or self.default_view or next(iter(self.views))
        if name not in self.views:
            raise KeyError(f"the dataset has no text view {name!r}; its views are {', '.join(self.views)}")
        return name, self.views[name]

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
        data = asdict(self)
        if self.views:
            data["version"] = max(self.version, FORMAT_VERSION)
        else:  # no views: stay readable by vlmdata before views
            del data["views"], data["default_view"]
        return json.dumps(data, indent=1, sort_keys=True)

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
