"""Every exception vlmdata raises, and every reason a sample or row is skipped, in one place.

All exceptions derive from `VlmdataError`, mixed into the standard type each one
always was, so `except ValueError` / `except OSError` keep catching what they
caught and `except VlmdataError` catches everything of ours:

    VlmdataError
    ├── ConfigError (ValueError)          a configuration problem: stops the run, says what to change
    │   └── EmptyDatasetError             no rows found, or every row skipped
    ├── SkipError (ValueError)            one bad input row / image / sample: skipped and counted by `reason`
    │   ├── RowProblem                    a raw input row (shard time)
    │   └── ImageProblem                  an image (shard or index time)
    ├── DecodeError (ValueError)          an image that cannot be decoded (load time)
    ├── TarFormatError (ValueError)       a corrupt or truncated tar stream
    ├── ShardReadError (ValueError)       a fetched shard that cannot be read
    ├── FetchError (OSError)              a shard not fetched intact after all retries
    │   └── CorruptShardError             fetched bytes that fail the size or CRC check
    ├── BadKeyError (ValueError)          a cache key that could name a path outside the cache
    ├── ProtocolError (ValueError)        a malformed or oversized cache-daemon message
    ├── CacheDirBusy (RuntimeError)       another process owns the cache directory
    └── OutOfTime (RuntimeError)          the tuner's time budget ran out (handled inside the tuner)

`Skip` names the reasons under which skipped rows, images and samples are counted
(`manifest.json` stats, `vlmdata inspect`, `batch["stats"]["skipped"]`, the
`vlmdata_skipped_samples_total{reason=...}` metric). They are plain strings, so
counters and JSON keep working with them.
"""
from __future__ import annotations

__all__ = [
    "BadKeyError", "CacheDirBusy", "ConfigError", "CorruptShardError", "DecodeError", "EmptyDatasetError",
    "FetchError", "ImageProblem", "OutOfTime", "ProtocolError", "RowProblem", "ShardReadError", "Skip",
    "SkipError", "TarFormatError", "VlmdataError",
]


class VlmdataError(Exception):
    """Base of every exception vlmdata raises (mixed in beside the standard base of each)."""


class ConfigError(VlmdataError, ValueError):
    """A configuration problem that stops the run at once (the message says what to change)."""


class EmptyDatasetError(ConfigError):
    """The run found no input rows, or every row was skipped: no dataset is written."""


class SkipError(VlmdataError, ValueError):
    """Something that must be skipped and counted; `reason` is its `Skip` reason, the message the detail."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason


class RowProblem(SkipError):
    """A raw input row that must be skipped."""


class ImageProblem(SkipError):
    """An image that must be skipped."""


class DecodeError(VlmdataError, ValueError):
    """An image could not be decoded (corrupt, truncated, not an image)."""


class TarFormatError(VlmdataError, ValueError):
    """The tar stream is corrupt or truncated."""


class ShardReadError(VlmdataError, ValueError):
    """A fetched shard cannot be read (bad compression, index mismatch)."""


class FetchError(VlmdataError, OSError):
    """A shard could not be fetched intact after all retries."""


class CorruptShardError(FetchError):
    """Fetched bytes do not match the recorded size or checksum."""


class BadKeyError(VlmdataError, ValueError):
    """A cache key that could name a path outside the cache (or is malformed)."""


class ProtocolError(VlmdataError, ValueError):
    """A malformed or oversized cache-daemon message."""


class CacheDirBusy(VlmdataError, RuntimeError):
    """Another process owns this cache directory."""


class OutOfTime(VlmdataError, RuntimeError):
    """The tuner's time budget ran out; the search keeps what it measured."""


class Skip:
    """Reasons for skipping, as counted everywhere (plain strings)."""

    # raw input rows (vlmdata shard)
    BAD_ROW = "bad_row"                        # unparseable row
    READ_ERROR = "read_error"                  # an input or image file that could not be read
    MISSING_FILE = "missing_file"              # an image reference that names no file
    BAD_TEXT = "bad_text"                      # text of the wrong type or layout
    EMPTY_TEXT = "empty_text"
    MISSING_TEXT = "missing_text"
    MISSING_IMAGE_REF = "missing_image_ref"
    BAD_IMAGE_REF = "bad_image_ref"
    MARKER_MISMATCH = "marker_mismatch"        # <image> markers != number of images
    DUPLICATE_KEY = "duplicate_key"
    DUPLICATE_IN_DATASET = "duplicate_in_dataset"   # the key is in a --dedup-against dataset
    # images (vlmdata shard / vlmdata index)
    EMPTY_FILE = "empty_file"
    NOT_AN_IMAGE = "not_an_image"
    BAD_IMAGE_HEADER = "bad_image_header"
    DECOMPRESSION_BOMB = "decompression_bomb"
    TRUNCATED_IMAGE = "truncated_image"
    UNDECODABLE_IMAGE = "undecodable_image"
    # foreign tars (vlmdata index)
    TRUNCATED_SAMPLE = "truncated_sample"
    CORRUPT_SHARD = "corrupt_shard"
    # load time (VLMDataset)
    FETCH_ERROR = "fetch_error"
    SHARD_ERROR = "shard_error"
    BAD_SAMPLE = "bad_sample"
    CORRUPT_IMAGE = "corrupt_image"
    DECODE_ERROR = "decode_error"
    IMAGE_TOO_LARGE = "image_too_large"        # more pixels than the decoder's limit
    TOO_MANY_IMAGES = "too_many_images"
    OVERLONG = "overlong"
