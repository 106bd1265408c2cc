"""planning.npz streamed shard by shard and read a few shards at a time: the same columns as loading it whole,
memory-mapped locally and range-read remotely, mismatches with the manifest refused, pickling keeps no maps."""
import pickle

import fsspec
import numpy as np
import pytest

from tests.helpers.plan import synthetic_columns
from vlmdata.formats import PlanningColumns, PlanningWriter, concat_planning_columns
from vlmdata.plan import ArrayColumns


def shard_parts(cols, sizes):
    """One dict of columns per shard, as a SampleIndex would hold them."""
    starts = np.concatenate([[0], np.cumsum(sizes)])
    parts = []
    for a, b in zip(starts[:-1], starts[1:]):
        n_img = cols["n_images"][a:b]
        i0 = int(cols["image_start"][a]) if b > a else 0
        i1 = i0 + int(n_img.sum())
        parts.append({"text_tokens": cols["text_tokens"][a:b], "n_images": n_img,
                      "width": cols["width"][i0:i1], "height": cols["height"][i0:i1]})
    return parts


def write(url, cols, sizes, derived=True):
    w = PlanningWriter(url, derived=derived)
    for p in shard_parts(cols, sizes):
        w.add_shard(p["text_tokens"], p["n_images"], p["width"], p["height"])
    w.commit()
    return w


@pytest.fixture
def columns():
    cols, sizes = synthetic_columns(n_shards=12, seed=3)
    sizes[[0, 5]] = 0                                   # empty shards
    keep = ~np.isin(cols["shard"], [0, 5])
    img_keep = np.repeat(keep, cols["n_images"])
    cols = {k: (v[img_keep] if k in ("width", "height") else v[keep]) for k, v in cols.items()}
    cols["image_start"] = np.cumsum(cols["n_images"], dtype=np.int64) - cols["n_images"]
    images = np.array([int(cols["n_images"][cols["shard"] == s].sum()) for s in range(len(sizes))])
    return cols, sizes, images


def test_streamed_file_equals_the_whole_columns_and_loads_with_numpy(tmp_path, columns):
    cols, sizes, _ = columns
    url = str(tmp_path / "planning.npz")
    w = write(url, cols, sizes)
    assert (w.shards, w.samples, w.images) == (len(sizes), int(sizes.sum()), len(cols["width"]))

    class Ix:                                            # what concat_planning_columns reads from a SampleIndex
        def __init__(self, p):
            self.__dict__.update(p)

        def __len__(self):
            return len(self.text_tokens)

    expected = concat_planning_columns([Ix(p) for p in shard_parts(cols, sizes)])
    with np.load(url) as z:
        assert sorted(z.files) == sorted(expected)
        for name, values in expected.items():
            assert z[name].dtype == values.dtype and np.array_equal(z[name], values), name


@pytest.mark.parametrize("where,derived", [("local", True), ("memory", False)])
def test_reading_shards_equals_the_columns_in_memory(tmp_path, columns, where, derived):
    cols, sizes, images = columns
    url = str(tmp_path / "planning.npz") if where == "local" else f"memory://planning-{derived}/planning.npz"
    write(url, cols, sizes, derived=derived)
    pc = PlanningColumns(url, sizes, images)
    ref = ArrayColumns(cols, sizes)
    for shards in ([3], [0], [11, 2, 5, 7], list(range(12))):
        got, exp = pc.read_shards(shards), ref.read_shards(shards)
        for name in ("text_tokens", "n_images", "width", "height", "image_start"):
            assert np.array_equal(got[name], exp[name]), (shards, name)
    whole = pc.load()
    for name in ("shard", "local", "text_tokens", "n_images", "width", "height"):
        assert np.array_equal(whole[name], cols[name]), name
    assert pc._maps == {}                                # nothing held whole
    again = pickle.loads(pickle.dumps(pc))
    assert again._fds == {} and np.array_equal(again.read_shards([4])["width"], pc.read_shards([4])["width"])
    fsspec.filesystem("memory").store.clear()


def test_a_file_that_disagrees_with_the_manifest_is_refused(tmp_path, columns):
    cols, sizes, images = columns
    url = str(tmp_path / "planning.npz")
    write(url, cols, sizes)
    with pytest.raises(ValueError, match="manifest counts"):
        PlanningColumns(url, sizes + 1, images)
    moved = images.copy()
    moved[1] += 1
    moved[2] -= 1
    with pytest.raises(ValueError, match="another version"):
        PlanningColumns(url, sizes, moved).read_shards([1])
    np.savez(str(tmp_path / "old.npz"), text_tokens=cols["text_tokens"])
    with pytest.raises(ValueError, match="lacks columns"):
        PlanningColumns(str(tmp_path / "old.npz"), sizes, images)
    with pytest.raises(ValueError, match="widths"):
        PlanningWriter(str(tmp_path / "x.npz")).add_shard(np.ones(2, np.int32), np.ones(2, np.int16),
                                                          np.ones(1, np.int32), np.ones(1, np.int32))


def test_a_compressed_file_is_still_read(tmp_path, columns):
    cols, sizes, images = columns
    url = str(tmp_path / "planning.npz")
    np.savez_compressed(url, **cols)
    got = PlanningColumns(url, sizes, images).read_shards([6, 1])
    exp = ArrayColumns(cols, sizes).read_shards([6, 1])
    assert all(np.array_equal(got[k], exp[k]) for k in exp)


@pytest.mark.parametrize("where", ["local", "memory"])
def test_a_column_read_from_another_file(tmp_path, columns, where):
    """A text view's own text_tokens (views/NAME/planning.npz) replace the main file's, window by window."""
    cols, sizes, images = columns
    base = str(tmp_path) if where == "local" else "memory://view-test"
    write(f"{base}/planning.npz", cols, sizes)
    view_tokens = (cols["text_tokens"] * 3 + 1).astype(np.int32)
    with fsspec.open(f"{base}/views/qwen/planning.npz", "wb", auto_mkdir=True) as f:
        np.savez(f, text_tokens=view_tokens)
    pc = PlanningColumns(f"{base}/planning.npz", sizes, images,
                         column_files={"text_tokens": f"{base}/views/qwen/planning.npz"})
    ref = ArrayColumns({**cols, "text_tokens": view_tokens}, sizes)
    for shards in ([3], [11, 2, 5, 7]):
        got, exp = pc.read_shards(shards), ref.read_shards(shards)
        for name in ("text_tokens", "n_images", "width", "height"):
            assert np.array_equal(got[name], exp[name]), (shards, name)
    with fsspec.open(f"{base}/views/short/planning.npz", "wb", auto_mkdir=True) as f:
        np.savez(f, text_tokens=view_tokens[:-1])
    with pytest.raises(ValueError, match="manifest counts"):
        PlanningColumns(f"{base}/planning.npz", sizes, images,
                        column_files={"text_tokens": f"{base}/views/short/planning.npz"})
    if where == "memory":
        fsspec.filesystem("memory").store.clear()
