"""Every exception vlmdata raises, and every reason a sample or row is skipped, in one place.

All exceptions derive from `VlmdataError`, mixed into the standard type each one
always was, so `except ValueError` / `except OSError` keep catching what they
caught and `except VlmdataError` catches everything of ours:

    VlmdataError
    ├── ConfigError (ValueError)          a configuration problem: stops the run, says what to change
    │   ├── EmptyDatasetError             no rows found, or every row skipped
    │   ├── BatchingError                 packs batched again by a DataLoader (batch_size not None)
    │   └── UnsafePathError               a shared folder or file another user owns or can write, or a symlink
    ├── SkipError (ValueError)            one bad input row / image / sample: skipped and counted by `reason`
    │   ├── RowProblem                    a raw input row (shard time)
    │   └── ImageProblem                  an image (shard or index time)
    ├── DecodeError (ValueError)          an image that cannot be decoded (load time)
    ├── TarFormatError (ValueError)       a corrupt or truncated tar stream
    ├── ShardReadError (ValueError)       a fetched shard that cannot be read
    │   ├── BadIndexError                 a shard index that cannot be read, or that describes another shard
    │   ├── IndexMismatchError            an index row that does not point at its own sample's members
    │   └── ShardChangedError             a mapped shard rewritten in place while it was being read
    ├── BadKeyIndexError (ValueError)     a keys.lmdb that is truncated or not LMDB, or outgrows the address space
    ├── FetchError (OSError)              a shard not fetched intact after all retries
    │   └── CorruptShardError             fetched bytes that fail the size or CRC check
    ├── BadKeyError (ValueError)          a cache key that could name a path outside the cache
    ├── ProtocolError (ValueError)        a malformed or oversized cache-daemon message
    ├── NotServedError (PermissionError)  a cache-daemon request outside its datasets, or without its token
    ├── NoRoomError (RuntimeError)        the SSD tier cannot take an entry now (pinned entries fill it)
    ├── AdapterError (ValueError)         a pack that does not fit a model family's forward inputs
    ├── CacheDirBusy (RuntimeError)       another process owns the cache directory
    ├── TooManySkipsError (RuntimeError)  a run that wrote its output but skipped more than it may
    └── OutOfTime (RuntimeError)          the tuner's time budget ran out (handled inside the tuner)

`Skip` names the reasons under which skipped rows, images and samples are counted
(`manifest.json` stats, `vlmdata inspect`, `batch["stats"]["skipped"]`, the
`vlmdata_skipped_samples_total{reason=...}` metric). They are plain strings, so
counters and JSON keep working with them.
"""
from __future__ import annotations

__all__ = [
    "AdapterError", "BadIndexError", "BadKeyIndexError", "BatchingError", "BadKeyError", "CacheDirBusy",
    "ConfigError", "CorruptShardError", "DecodeError", "EmptyDatasetError", "FetchError", "ImageProblem",
    "IndexMismatchError", "NoRoomError", "NotServedError", "OutOfTime", "ProtocolError", "RowProblem",
    "ShardChangedError", "ShardReadError", "Skip", "SkipError", "TarFormatError", "TooManySkipsError",
    "UnsafePathError", "VlmdataError",
]


class VlmdataError(Exception):
    """Base of every exception vlmdata raises (mixed in beside the standard base of each)."""


class ConfigError(VlmdataError, ValueError):
    """A configuration problem that stops the run at once (the message says what to change)."""


class EmptyDatasetError(ConfigError):
    """The run found no input rows, or every row was skipped: no dataset is written."""


class BatchingError(ConfigError):
    """A DataLoader batching packs again (its batch_size is not None).

    Raised in a DataLoader worker it reaches the main process rebuilt by torch from a message holding the
    worker's whole traceback; the message is cut back to its last line, with the worker named.
    """

    def __init__(self, message: str):
        lines = message.rstrip().splitlines()
        if message.startswith("Caught ") and "Original Traceback" in message and ": " in lines[-1]:
            where = lines[0][len(f"Caught {type(self).__name__} "):].rstrip(".")
            message = f"{lines[-1].split(': ', 1)[1]} (raised {where})"
        super().__init__(message)


class UnsafePathError(ConfigError):
    """A folder or file vlmdata shares between processes that is not private to this user (fsutil)."""


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


class BadIndexError(ShardReadError):
    """A shard's index file cannot be read (truncated, empty, bad CRC) or describes another shard."""


class IndexMismatchError(ShardReadError):
    """An index row that does not point at its own sample's members (name, size or bounds)."""


class ShardChangedError(ShardReadError):
    """A mapped shard file was rewritten in place after it was opened: its bytes are no longer the checked ones."""


class BadKeyIndexError(VlmdataError, ValueError):
    """A key index (keys.lmdb) that is truncated or not LMDB, or needs more address space than may be mapped."""


class FetchError(VlmdataError, OSError):
    """A shard could not be fetched intact after all retries."""


class CorruptShardError(FetchError):
    """Fetched bytes do not match the recorded size or checksum."""


class BadKeyError(VlmdataError, ValueError):
    """A cache key that could name a path outside the cache (or is malformed)."""


class ProtocolError(VlmdataError, ValueError):
    """A malformed or oversized cache-daemon message."""


class NotServedError(VlmdataError, PermissionError):
    """A cache-daemon request for an object outside the datasets it serves, or without its token."""


class NoRoomError(VlmdataError, RuntimeError):
    """The SSD tier cannot take this entry now: what readers have pinned fills its budget (read through)."""
class AdapterError(VlmdataError, ValueError):
    """A pack that does not fit a model family's forward inputs (image tokens vs images, boundaries, layout)."""


class CacheDirBusy(VlmdataError, RuntimeError):
    """Another process owns this cache directory."""


class TooManySkipsError(VlmdataError, RuntimeError):
    """A run finished and wrote everything it could, but skipped more than `max_skip_fraction` of its input.

    `summary` says what was skipped (an `ingest.skips.SkipSummary`), `result` is what the run returned
    otherwise (the written Manifest, or a RetokenizeResult): the output is complete and usable.
    """

    def __init__(self, message: str, summary, result):
        super().__init__(message)
        self.summary = summary
        self.result = result


class OutOfTime(VlmdataError, RuntimeError):
    """The tuner's time budget ran out; the search keeps what it measured."""


class Skip:
    """Reasons for skipping, as counted everywhere (plain strings)."""

    # raw input rows (vlmdata shard)
    BAD_ROW = "bad_row"                        # unparseable row
    READ_ERROR = "read_error"                  # an input or image file that could not be read
    MISSING_FILE = "missing_file"              # an image reference that names no file
    NOT_A_REGULAR_FILE = "not_a_regular_file"  # a device, FIFO or socket named as an image or caption
    FILE_TOO_LARGE = "file_too_large"          # an image or caption file over --max-image-bytes
    READ_TIMEOUT = "read_timeout"              # a remote image read that did not finish in time
    OUTSIDE_ROOT = "outside_root"              # a reference (or symlink) leading outside the image root
    REMOTE_NOT_ALLOWED = "remote_not_allowed"  # a remote or chained URL without --allow-remote / --allow-host
    BAD_TEXT = "bad_text"                      # text of the wrong type or layout
    EMPTY_TEXT = "empty_text"
    TEXT_TOO_LARGE = "text_too_large"          # a stored text over retokenize's --max-text-bytes (not read)
    MISSING_TEXT = "missing_text"
    MISSING_IMAGE_REF = "missing_image_ref"
    BAD_IMAGE_REF = "bad_image_ref"
    MARKER_MISMATCH = "marker_mismatch"        # <image> markers (or image tokens) != number of images
    TEMPLATE_ERROR = "template_error"          # the model's chat template rejects the conversation
    DUPLICATE_KEY = "duplicate_key"
    DUPLICATE_IN_DATASET = "duplicate_in_dataset"   # the key is in a --dedup-against dataset
    BAD_DATA_URL = "bad_data_url"              # a data: image URL that is malformed or not an image media type
    VIDEO_UNSUPPORTED = "video_unsupported"    # a row carrying a video (video fields, <video>, video items)
    # images (vlmdata shard / vlmdata index)
    EMPTY_FILE = "empty_file"
    NOT_AN_IMAGE = "not_an_image"
    UNSUPPORTED_FORMAT = "unsupported_format"  # a format Pillow opens that the loader does not decode (EPS)
    BAD_IMAGE_HEADER = "bad_image_header"
    DECOMPRESSION_BOMB = "decompression_bomb"
    TRUNCATED_IMAGE = "truncated_image"
    UNDECODABLE_IMAGE = "undecodable_image"    # the loader's decoder fails on it (--verify structure/decode/strict, memmap)
    # foreign tars (vlmdata index)
    TRUNCATED_SAMPLE = "truncated_sample"
    CORRUPT_SHARD = "corrupt_shard"            # an unreadable tar header or stream: the rest of the shard
    MEMBER_TOO_LARGE = "member_too_large"      # a member larger than an image or text may be (not read)
    LINK_MEMBER = "link_member"                # a sample with a symlink, hard link, device or FIFO member
    BAD_MEMBER_NAME = "bad_member_name"        # a member name that is not UTF-8
    # load time (VLMDataset)
    FETCH_ERROR = "fetch_error"
    SHARD_ERROR = "shard_error"
    BAD_SAMPLE = "bad_sample"
    CORRUPT_IMAGE = "corrupt_image"
    DECODE_ERROR = "decode_error"
    BAD_INDEX = "bad_index"                    # the shard's index cannot be read or describes another shard
    INDEX_MISMATCH = "index_mismatch"          # an index row that does not match the member it points at
    SHARD_CHANGED = "shard_changed"            # a sample of a shard file rewritten in place after it was opened
    DECODER_EXCEPTION = "decoder_exception"    # an unexpected exception type from a decoder (logged once)
    IMAGE_TOO_LARGE = "image_too_large"        # more pixels than the decoder's limit
    TOO_MANY_IMAGES = "too_many_images"        # more images (max_images) or vision patches (max_patches) than a pack holds
    OVERLONG = "overlong"
    # video clips (vlmdata.video: probing at shard time, decoding at load time)
    BAD_VIDEO = "bad_video"                    # not a readable container, or a probe over its time budget
    NO_VIDEO_STREAM = "no_video_stream"        # a container without video (audio only)
    NO_VIDEO_FRAMES = "no_video_frames"        # a video stream without a single frame
    TRUNCATED_VIDEO = "truncated_video"        # packets end early: cut short, or a container that lies
    VIDEO_TOO_LONG = "video_too_long"          # over the duration or frame-count limit
    VIDEO_TOO_LARGE = "video_too_large"        # frames over the pixel limit (read from the header)
    UNDECODABLE_VIDEO = "undecodable_video"    # frames that do not decode
    MIXED_FRAME_SIZES = "mixed_frame_sizes"    # a frame list whose images differ in size
    TRANSCODE_FAILED = "transcode_failed"      # a --video-transcode over its time limit, or yielding extra frames
