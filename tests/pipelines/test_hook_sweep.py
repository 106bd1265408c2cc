"""vlmdata_pipelines.hook_sweep's config specs (its 2-rank torchrun run is in test_comm_torchrun.py)."""
import pytest

from vlmdata_pipelines.comm import CommOptions
from vlmdata_pipelines.hook_sweep import parse_config


def test_sweep_config_specs():
    base = CommOptions(bucket_mb=1.0, powersgd_start_iter=3)
    assert parse_config("bf16", base) == CommOptions(hook="bf16", bucket_mb=1.0, powersgd_start_iter=3)
    both = parse_config("powersgd+static+noview", base)
    assert both.hook == "powersgd" and both.static_graph and not both.gradient_as_bucket_view
    tuned = parse_config("powersgd+rank8+start20", base)
    assert (tuned.powersgd_rank, tuned.powersgd_start_iter, tuned.bucket_mb) == (8, 20, 1.0)
    with pytest.raises(ValueError, match="unknown hook"):
        parse_config("int8", base)
    with pytest.raises(ValueError, match="unknown modifier"):
        parse_config("none+fast", base)
