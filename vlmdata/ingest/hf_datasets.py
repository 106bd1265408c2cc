"""Hugging Face `datasets` inputs: a `datasets.Dataset` / `IterableDataset`, or a `save_to_disk` folder.

Rows are read in the Arrow format (`with_format("arrow")`), so nothing is decoded: a `datasets.Image`
column gives its stored `{"bytes", "path"}` struct (decoded PIL images of an iterable dataset are
encoded by `datasets` itself), and the row layouts of `ingest.records` / `ingest.layouts` read them
like any table's rows (LLaVA `conversations`, OpenAI / TRL `messages`, caption columns). Rows stream
in batches in the calling process and travel to the shard workers in their jobs like the rows of a
Parquet file; the dataset object itself is never pickled. Relative image paths resolve against a
saved folder, or for a dataset object against `--image-root` (default: the current directory).
"""
from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator

from vlmdata.errors import ConfigError

__all__ = ["HF_DATASET_FORMAT", "dataset_label", "is_dataset_object", "iter_dataset", "read_saved_dataset",
           "saved_dataset_kind", "splits_of"]

HF_DATASET_FORMAT = "hf-dataset"
SAVED_FILES = ("dataset_info.json", "state.json")
DICT_FILE = "dataset_dict.json"
BATCH_ROWS = 256


def is_dataset_object(obj) -> bool:
    """True for a `datasets.Dataset` or `datasets.IterableDataset` (checked without importing `datasets`)."""
    return any(c.__module__.startswith("datasets.") and c.__name__ in ("Dataset", "IterableDataset")
               for c in type(obj).__mro__)


def dataset_label(obj) -> str:
    """A stable name for a dataset object in the run's settings and fallback ids."""
    kind = "iterable-dataset" if type(obj).__name__ == "IterableDataset" else "dataset"
    fingerprint = getattr(obj, "_fingerprint", None)
    if not fingerprint:   # iterable datasets carry none: their features and source shards stand in
        described = f"{getattr(obj, 'features', None)!r} {getattr(obj, 'num_shards', 0)}"
        fingerprint = hashlib.sha1(described.encode()).hexdigest()[:16]
    return f"{kind}-{fingerprint}"


def saved_dataset_kind(fs, path: str) -> str | None:
    """"dataset" for a `save_to_disk` folder of one dataset, "dict" for a DatasetDict's, else None."""
    names = {os.path.basename(p.rstrip("/")) for p in fs.ls(path, detail=False)}
    if all(n in names for n in SAVED_FILES):
        return "dataset"
    if DICT_FILE in names:
        return "dict"
    return None


def splits_of(fs, path: str) -> list[str]:
    """The split folders of a saved DatasetDict."""
    return sorted(os.path.basename(p.rstrip("/")) for p in fs.ls(path, detail=False) if fs.isdir(p))


def _datasets():
    try:
        import datasets
    except ImportError:
        raise ConfigError("reading a Hugging Face datasets folder needs the `datasets` package: "
                          "pip install 'vlmdata[hf-datasets]'") from None
    return datasets


def iter_dataset(ds) -> Iterator[dict]:
    """Every row of a Dataset / IterableDataset as a plain dict, images undecoded."""
    for table in ds.with_format("arrow").iter(batch_size=BATCH_ROWS):
        yield from table.to_pylist()


def read_saved_dataset(url: str, so: dict) -> Iterator[dict]:
    """The rows of a `save_to_disk` folder (memory-mapped Arrow files)."""
    ds = _datasets().load_from_disk(url, storage_options=so or None)
    yield from iter_dataset(ds)
