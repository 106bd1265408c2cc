"""Videos in input rows: finding their references, and the clips kept as they are at shard time.

A row carries a video when it has a non-empty `video` / `videos` / `video_url` field anywhere (LLaVA-Video
rows, caption tables), a `{"type": "video"}` or `{"type": "video_url"}` content item (OpenAI / TRL
messages), a `<video>` marker in any of its strings, or an image reference that names a video
(a `data:video/...` URL or a file with a video extension). The word "video" in prose is not a video.

The layouts that know videos (`ingest.records`, `ingest.layouts`) parse them into the sample's
`videos` and the conversation's `{"type": "video"}` items; a row that carries a video some other way
is skipped as `video_unsupported`, never trained as text (`reject_unparsed_video`).

At shard time each clip is read (within `--max-video-bytes`) and probed (`vlmdata.video.probe_clip`,
bounded by `ClipLimits`): a hostile clip is skipped under the probe's own reason. A clip that probes
is kept byte for byte (`prepare_video`) with its extension (`clip_extension`) and its `ClipInfo`, or,
with `--video-transcode`, re-encoded to bounds (`vlmdata.video.transcode`) and probed again; a
`FrameList` is stored as one video by `ingest.frame_list`.
The sample is written only when the text encoder lays out videos (`encodes_video`, see
`require_video_policy`); until the model family has a video policy the row is `video_unsupported`,
counted after its clips were probed.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from vlmdata.errors import RowProblem, Skip
from vlmdata.formats.sample import EncodedVideo
from vlmdata.text.conversation import VIDEO_MARKER
from vlmdata.video.probe import ClipLimits, probe_clip
from vlmdata.video.transcode import TranscodeSettings, transcode_clip

__all__ = ["DEFAULT_MAX_VIDEO_BYTES", "VIDEO_MARKER", "FrameList", "VideoOptions", "clip_extension", "encodes_video",
           "prepare_video", "reject_unparsed_video", "reject_video_refs", "require_video_policy", "video_in_row",
           "video_item_ref", "video_refs"]

VIDEO_FIELDS = ("video", "videos", "video_url")
VIDEO_ITEM_TYPES = ("video", "video_url")
VIDEO_EXTS = (".mp4", ".m4v", ".mov", ".webm", ".mkv", ".avi", ".mpg", ".mpeg", ".flv", ".wmv", ".3gp")
FRAME_EXTS = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff")
FPS_FIELDS = ("fps", "sample_fps", "frame_rate")
DEFAULT_MAX_VIDEO_BYTES = 1 << 30     # one clip read at shard time (the whole clip is held in memory)


@dataclass(frozen=True)
class VideoOptions:
    """What a clip may be at shard time: its size in bytes and the probe's limits; with `transcode`, each clip
    is re-encoded within those settings (`--video-transcode`) instead of kept as it is."""

    max_bytes: int = DEFAULT_MAX_VIDEO_BYTES
    limits: ClipLimits = field(default_factory=ClipLimits)
    transcode: TranscodeSettings | None = None


def _empty(value) -> bool:
    """None, "", [], {}, False, 0: a video field that names no video (e.g. a table's empty column)."""
    return value is None or (isinstance(value, (str, list, tuple, dict, bool, int, float)) and not value)


def video_in_row(data: dict) -> str | None:
    """Why the row carries a video (for the skip detail), or None."""
    stack = [data]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            if VIDEO_MARKER in v:
                return f"a {VIDEO_MARKER} marker in the text"
        elif isinstance(v, dict):
            if v.get("type") in VIDEO_ITEM_TYPES:
                return f"a {v['type']!r} content item"
            for key in VIDEO_FIELDS:
                if not _empty(v.get(key)):
                    return f"a {key!r} field"
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
    return None


@dataclass(frozen=True)
class FrameList:
    """Pre-extracted frames standing for one video: their image references in order, and their frame rate
    (None when the row gives none)."""

    frames: tuple
    fps: float | None = None


def _fps(holder: dict) -> float | None:
    for key in FPS_FIELDS:
        value = holder.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not value > 0:
                raise RowProblem(Skip.BAD_TEXT, f"{key} {value!r} of a frame list is not a positive number")
            return float(value)
    return None


def _is_frame_list(value) -> bool:
    return isinstance(value, (list, tuple)) and bool(value) and all(
        isinstance(v, str) and v.split("?", 1)[0].lower().endswith(FRAME_EXTS) for v in value)


def _frame_list(value, holder: dict) -> FrameList | None:
    """The FrameList `value` stands for: a list of image paths (its rate from `holder`), or a
    {"frames": [...], "fps": F} object (its own rate, else the holder's); None for anything else."""
    if _is_frame_list(value):
        return FrameList(tuple(value), _fps(holder))
    if not (isinstance(value, dict) and "frames" in value):
        return None
    frames = value["frames"]
    if isinstance(frames, (list, tuple)) and not frames:
        raise RowProblem(Skip.NO_VIDEO_FRAMES, "a frame list with no frames")
    if not (isinstance(frames, (list, tuple)) and all(isinstance(f, str) and f for f in frames)):
        raise RowProblem(Skip.BAD_IMAGE_REF, f"frames {str(frames)[:60]!r} is not a list of image paths")
    return FrameList(tuple(frames), _fps(value) or _fps(holder))


def video_refs(value, holder: dict | None = None) -> list:
    """The videos of a `video` / `videos` field: clip references (a path, URL or bytes, Hugging Face style
    {"bytes", "path"} dicts) and `FrameList`s (a list of image paths standing for one video, its rate from
    the `fps` / `sample_fps` field of `holder`, the row; or a {"frames": [...], "fps": F} object);
    RowProblem for anything else. An empty list in a row that gives a frame rate and carries a video
    (a `<video>` marker) is a frame list without frames (no_video_frames); otherwise an empty field names
    no video."""
    holder = holder or {}
    if isinstance(value, (list, tuple)) and not value and _fps(holder) is not None and video_in_row(holder):
        raise RowProblem(Skip.NO_VIDEO_FRAMES, "an empty frame list (the row gives a frame rate)")
    if _empty(value):
        return []
    frames = _frame_list(value, holder)
    if frames is not None:
        return [frames]
    if isinstance(value, (str, bytes)):
        return [value]
    if isinstance(value, dict):
        ref = value.get("bytes") or value.get("path") or value.get("url")
        if isinstance(ref, (str, bytes)) and ref:
            return [ref]
    if isinstance(value, (list, tuple)):
        if all(isinstance(v, (str, bytes, dict, list)) for v in value):
            return [r for v in value for r in video_refs(v, holder)]
    raise RowProblem(Skip.BAD_IMAGE_REF, f"video reference {str(value)[:60]!r} is not a path, URL or bytes")


def video_item_ref(item: dict):
    """The video a `{"type": "video"}` / `{"type": "video_url"}` content item names (a clip reference or a
    `FrameList`), or None when it names none (it then takes the row's next video)."""
    value = item.get("video")
    frames = _frame_list(value, item)
    if frames is not None:
        return frames
    if isinstance(item.get("video_url"), dict):
        value = item["video_url"].get("url")
    for v in (value, item.get("url"), item.get("path"), item.get("bytes")):
        if isinstance(v, dict):
            v = v.get("bytes") or v.get("path") or v.get("url")
        if isinstance(v, (str, bytes)) and v:
            return v
    return None


def reject_unparsed_video(data: dict, videos_parsed: int) -> None:
    """RowProblem(video_unsupported) when the row carries a video its layout did not parse."""
    why = video_in_row(data)
    if why is not None and not videos_parsed:
        raise RowProblem(Skip.VIDEO_UNSUPPORTED, f"the row carries a video ({why}) but names no clip its layout can place")


def _video_ref(ref) -> bool:
    if not isinstance(ref, str):
        return False
    if ref[:11].lower() == "data:video/":
        return True
    return ref.split("?", 1)[0].lower().endswith(VIDEO_EXTS)


def reject_video_refs(image_refs: list) -> None:
    """RowProblem(video_unsupported) when one of the row's image references names a video."""
    if any(_video_ref(r) for r in image_refs):
        raise RowProblem(Skip.VIDEO_UNSUPPORTED, "an image reference names a video; put clips in a video field "
                                                 "or a video item")


def clip_extension(data: bytes, ref=None) -> str:
    """The extension a clip is stored with: from its magic bytes (mp4, mov, webm, mkv), else the reference's
    own video extension, else "video"."""
    head = bytes(data[:64])
    if head[4:8] == b"ftyp":
        return "mov" if head[8:12] == b"qt  " else "mp4"
    if head[:4] == b"\x1a\x45\xdf\xa3":
        return "webm" if b"webm" in head else "mkv"
    if isinstance(ref, str):
        ext = ref.split("?", 1)[0].rsplit(".", 1)[-1].lower()
        if f".{ext}" in VIDEO_EXTS:
            return ext
    return "video"


def prepare_video(data: bytes, ref, opts: VideoOptions) -> EncodedVideo:
    """The clip kept as it is, with its probe (ClipProblem, a counted skip, for a hostile clip); with
    `opts.transcode`, the probed clip re-encoded within those settings, then probed like any kept clip."""
    info = probe_clip(data, opts.limits)
    if opts.transcode is not None:
        data = transcode_clip(data, info, opts.transcode)
        info = probe_clip(data, opts.limits)
    return EncodedVideo(data=data, ext=clip_extension(data, ref), info=info.to_dict())


def encodes_video(encoder) -> bool:
    """Whether a text encoder lays out videos: it says so with `encodes_video = True` and gives the
    `video_token_id` it writes once per video (the family's video policy expands it at load time)."""
    return bool(getattr(encoder, "encodes_video", False)) and getattr(encoder, "video_token_id", None) is not None


def require_video_policy(encoder, n_videos: int) -> None:
    """RowProblem(video_unsupported) for a sample with videos when the encoder has no video layout."""
    if n_videos and not encodes_video(encoder):
        name = getattr(encoder, "name", "")      # a ModelFamily's name; vlmdata's own encoders have none
        who = f"the {name} model family" if name else "vlmdata's own text layout"
        why = getattr(encoder, "video_unsupported_reason", None) or f"{who} has no video policy yet"
        raise RowProblem(Skip.VIDEO_UNSUPPORTED, f"{n_videos} clip(s) probed fine, but {why}: the sample is not "
                                                 "written (never trained as text)")
