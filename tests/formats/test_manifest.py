"""The manifest: JSON round trip, a clear error for a missing dataset or a newer format version."""
import json

import pytest

from vlmdata.formats import Manifest, ShardInfo
from vlmdata.text import ByteTokenizer


def test_manifest_round_trip_and_errors(tmp_path):
    m = Manifest(kind="webdataset", shards=[ShardInfo("s.tar", "s.index.npz", 3, 3, 100, 7)],
                 tokenizer=ByteTokenizer().identity())
    m.save(str(tmp_path))
    back = Manifest.load(str(tmp_path))
    assert back == m and back.num_samples == 3
    with pytest.raises(FileNotFoundError, match="vlmdata shard"):
        Manifest.load(str(tmp_path / "nowhere"))
    raw = json.loads(m.to_json())
    raw["version"] = 99
    with pytest.raises(ValueError, match="upgrade"):
        Manifest.from_json(json.dumps(raw))
