"""Cache keys: unsafe keys (given, or derived from URLs) are rejected; a local URL is a fine key."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.cache import as_bytes as _bytes
from tests.helpers.cache import make_shards
from tests.helpers.cache import tiered_cache as _cache
from vlmdata.cache import ShardRef
from vlmdata.errors import BadKeyError


@pytest.mark.parametrize("key", ["../etc/passwd", "a/../../b", "/etc/passwd", "file:///etc/passwd", "a\x00b",
                                 "C:\\x", "~/x"])
def test_bad_keys_rejected(tmp_path, key):
    cache = _cache(tmp_path)
    with pytest.raises(BadKeyError):
        cache.get(ShardRef(url="s3://b/x.tar", key=key))
    cache.plan(0, [ShardRef(url="s3://b/x.tar", key=key), ShardRef(url="s3://b/y.tar", key="ok")])
    assert cache.plans.plans[0].keys == ["ok"]  # a bad key in a plan is dropped, not fatal
    cache.close()


def test_bad_url_derived_keys_rejected_and_good_ones_hashed(tmp_path):
    from vlmdata.cache import entry_name, key_for

    with pytest.raises(BadKeyError):
        key_for(ShardRef(url="s3://bucket/a/../../b.tar"))
    with pytest.raises(BadKeyError):
        key_for(ShardRef(url="../outside.tar"))
    k = key_for(ShardRef(url="s3://bucket/a/b.tar"))
    assert "/" not in entry_name(k) and "." not in entry_name(k)


def test_key_equal_to_a_local_url_names_the_object(tmp_path):
    """The dataset passes key=url; for local datasets that is an absolute path, which is fine as a URL."""
    refs = make_shards(tmp_path / "src", 1)
    ref = ShardRef(url=refs[0].url, size=refs[0].size, crc32=refs[0].crc32, key=refs[0].url)
    cache = _cache(tmp_path)
    assert _bytes(cache.get(ref)) == Path(ref.url).read_bytes()
    with pytest.raises(BadKeyError):
        cache.get(ShardRef(url="/x/../etc/passwd", key="/x/../etc/passwd"))
    cache.close()
