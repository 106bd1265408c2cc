"""On-disk formats: WebDataset tar shards (+ DALI .idx), memmap shards, the sample index, the manifest."""
from vlmdata.formats.index import SampleIndex
from vlmdata.formats.manifest import Manifest, ShardInfo

__all__ = ["Manifest", "SampleIndex", "ShardInfo"]
