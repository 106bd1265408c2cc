"""The sample index: validation catches inconsistent columns; planning columns of several shards merge."""
import pytest

from tests.helpers.formats import SAMPLES
from tests.helpers.formats import write_shard as _write_shard
from vlmdata.formats import concat_planning_columns


def test_index_validation_catches_inconsistency():
    _, index = _write_shard(SAMPLES)
    index.image_start = index.image_start + 1
    with pytest.raises(ValueError, match="image_start"):
        index.validate()


def test_planning_columns_merge_shards():
    _, a = _write_shard(SAMPLES)
    _, b = _write_shard(SAMPLES[:1])
    cols = concat_planning_columns([a, b])
    assert cols["shard"].tolist() == [0, 0, 0, 1]
    assert cols["local"].tolist() == [0, 1, 2, 0]
    assert cols["image_start"].tolist() == [0, 1, 1, 3]
    assert cols["width"].tolist() == [10, 30, 50, 10]
