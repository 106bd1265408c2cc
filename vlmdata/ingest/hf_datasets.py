"""Hugging Face `datasets` inputs: a `datasets.Dataset` / `IterableDataset`, or a `save_to_disk` folder.

Rows are read in the Arrow format (`with_format("arrow")`), so nothing is decoded: a `datasets.Image`
column gives its stored `{"bytes", "path"}` struct, and the row layouts of `ingest.records` /
`ingest.layouts` read them like any table's rows (LLaVA `conversations`, OpenAI / TRL `messages`,
caption columns). Relative image paths resolve against a saved folder, or for a dataset object against
`--image-root` (default: the current directory).

Index ranges: a saved folder, and a dataset object whose tables are memory-mapped files (what
`load_from_disk` and `load_dataset` give; it pickles to a few KB: file names and indices), are read by
the shard workers themselves. The calling process streams only each row's id columns (for the ids and
the duplicate check); a job's rows are a range of row numbers, and its worker opens the dataset once
(`RangedDataset`) and reads the range (`fill_rows`). The dataset object is never pickled per row. Other
datasets (in-memory tables, `IterableDataset`s) stream whole rows in the calling process, in batches,
and the rows travel in their jobs like a Parquet file's.
"""
from __future__ import annotations

import hashlib
import os
import pickle
from collections.abc import Iterator
from dataclasses import dataclass

from vlmdata.errors import ConfigError

__all__ = ["HF_DATASET_FORMAT", "RangedDataset", "dataset_inputs", "dataset_label", "fill_rows", "is_dataset_object",
           "iter_dataset", "read_saved_dataset", "saved_dataset_kind", "splits_of"]

HF_DATASET_FORMAT = "hf-dataset"
SAVED_FILES = ("dataset_info.json", "state.json")
DICT_FILE = "dataset_dict.json"
BATCH_ROWS = 256
ID_BATCH_ROWS = 8192
MAX_HANDLE_BYTES = 1 << 20     # a pickled dataset object larger than this holds its data: its rows stream


@dataclass(frozen=True)
class RangedDataset:
    """An input whose rows the shard workers read by index: a saved folder (`url`), or a memory-mapped
    dataset object (`pickled`)."""

    source: int
    url: str
    pickled: bytes | None = None


def _kind(obj) -> str | None:
    """"Dataset" | "IterableDataset" for those `datasets` types (checked without importing `datasets`)."""
    return next((c.__name__ for c in type(obj).__mro__
                 if c.__module__.startswith("datasets.") and c.__name__ in ("Dataset", "IterableDataset")), None)


def is_dataset_object(obj) -> bool:
    """True for a `datasets.Dataset` or `datasets.IterableDataset`."""
    return _kind(obj) is not None


def dataset_label(obj) -> str:
    """A stable name for a dataset object in the run's settings and fallback ids."""
    kind = "iterable-dataset" if _kind(obj) == "IterableDataset" else "dataset"
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


def _handle(source: int, url: str, obj) -> RangedDataset | None:
    """How workers open the input by index, or None when its rows must stream (in memory, iterable)."""
    if obj is None:
        return RangedDataset(source, url)
    if _kind(obj) != "Dataset" or not obj.cache_files:
        return None
    pickled = pickle.dumps(obj)
    return RangedDataset(source, url, pickled) if len(pickled) <= MAX_HANDLE_BYTES else None


def _ids(ds, id_columns: tuple[str, ...]) -> Iterator[dict]:
    """Each row's id columns only (an empty dict per row when it has none)."""
    names = [c for c in dict.fromkeys(id_columns) if c in ds.column_names]
    if not names:
        yield from ({} for _ in range(len(ds)))
        return
    for table in ds.select_columns(names).with_format("arrow").iter(batch_size=ID_BATCH_ROWS):
        yield from table.to_pylist()


def dataset_inputs(inputs: list, sources: list, id_columns: tuple[str, ...],
                   storage_options: dict) -> tuple[dict[int, tuple[Iterator[dict], bool]], tuple[RangedDataset, ...]]:
    """For the hf-dataset inputs of a run: per source number, (its rows, True when they hold only the id
    columns: read by index in the workers), and the handles those workers open."""
    rows: dict[int, tuple[Iterator[dict], bool]] = {}
    handles = []
    for i, (given, src) in enumerate(zip(inputs, sources)):
        if src.format != HF_DATASET_FORMAT:
            continue
        obj = given if is_dataset_object(given) else None
        ds = obj if obj is not None else _datasets().load_from_disk(src.url, storage_options=storage_options or None)
        handle = _handle(i, src.url, obj)
        if handle is None:
            rows[i] = (iter_dataset(ds), False)
        else:
            rows[i] = (_ids(ds, id_columns), True)
            handles.append(handle)
    return rows, tuple(handles)


_OPENED: dict[RangedDataset, object] = {}   # per worker process: each input opened once


def _open(handle: RangedDataset, storage_options: dict):
    if handle not in _OPENED:
        if handle.pickled is not None:
            _OPENED[handle] = pickle.loads(handle.pickled)
        else:
            _OPENED[handle] = _datasets().load_from_disk(handle.url, storage_options=storage_options or None)
    return _OPENED[handle]


def fill_rows(rows: list, handles: tuple[RangedDataset, ...], storage_options: dict) -> None:
    """Read the whole records of a job's id-only rows (`row.partial`), one index range per input; a range
    that cannot be read makes each of its rows a bad row (counted, not lost)."""
    by_source = {h.source: h for h in handles}
    groups: dict[int, list] = {}
    for row in rows:
        if row.partial:
            groups.setdefault(row.source, []).append(row)
    for source, group in groups.items():
        lo, hi = group[0].number, group[-1].number
        try:
            table = _open(by_source[source], storage_options).with_format("arrow")[lo:hi + 1]
            records = table.to_pylist()
        except Exception as exc:   # a deleted or damaged Arrow file: datasets and pyarrow raise many types
            for row in group:
                row.data, row.error = None, f"rows {lo}-{hi} of the dataset cannot be read: {type(exc).__name__}: {exc}"
                row.partial = False
            continue
        for row in group:
            row.data, row.partial = records[row.number - lo], False
