"""The video columns of a shard's sample index: where each clip lives and what its probe found.

Written beside the image columns only when the shard holds a clip (older indices, and shards without
videos, have none: every sample then has 0 videos). Names in the `.npz`:

per sample (length N)
  n_videos         i2  clips of the sample
  video_start      i8  index of the sample's first clip in the per-video arrays

per video (length V = n_videos.sum())
  vid_offset       i8  data offset of the clip member (its original bytes)
  vid_size         i8
  vid_info_offset  i8  data offset of the clip's `.clip.json` member (the full `ClipInfo`, frame times and
  vid_info_size    i8  keyframes included: what a seeking decoder needs)
  vid_width        i4  coded frame size and display rotation (counter-clockwise degrees)
  vid_height       i4
  vid_rotation     i2
  vid_frames       i8  frame count, duration and measured frame rate: what a planner counts tokens from
  vid_duration     f8
  vid_fps          f8
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

__all__ = ["VideoColumns", "VideoColumnsBuilder"]

SAMPLE_COLUMNS = {"n_videos": np.int16, "video_start": np.int64}
VIDEO_COLUMNS = {"vid_offset": np.int64, "vid_size": np.int64, "vid_info_offset": np.int64,
                 "vid_info_size": np.int64, "vid_width": np.int32, "vid_height": np.int32,
                 "vid_rotation": np.int16, "vid_frames": np.int64, "vid_duration": np.float64,
                 "vid_fps": np.float64}
_INFO_KEYS = {"vid_width": "width", "vid_height": "height", "vid_rotation": "rotation", "vid_frames": "frames",
              "vid_duration": "duration_s", "vid_fps": "measured_fps"}


@dataclass
class VideoColumns:
    """Per-sample clip counts and per-clip locations and metadata (see the module docstring)."""

    n_videos: np.ndarray
    video_start: np.ndarray
    vid_offset: np.ndarray
    vid_size: np.ndarray
    vid_info_offset: np.ndarray
    vid_info_size: np.ndarray
    vid_width: np.ndarray
    vid_height: np.ndarray
    vid_rotation: np.ndarray
    vid_frames: np.ndarray
    vid_duration: np.ndarray
    vid_fps: np.ndarray

    @classmethod
    def empty(cls, n_samples: int) -> VideoColumns:
        """No clips for `n_samples` samples (an index written without video columns)."""
        cols = {f: np.zeros(n_samples, t) for f, t in SAMPLE_COLUMNS.items()}
        cols.update({f: np.zeros(0, t) for f, t in VIDEO_COLUMNS.items()})
        return cls(**cols)

    @classmethod
    def from_npz(cls, z, n_samples: int) -> VideoColumns:
        """The columns of an opened `.npz` index (all zero when it has none)."""
        if "n_videos" not in z.files:
            return cls.empty(n_samples)
        return cls(**{f.name: z[f.name] for f in fields(cls)})

    def columns(self) -> dict[str, np.ndarray]:
        """The arrays to store (none when no sample has a clip: the index stays as it was before videos)."""
        if not len(self.vid_offset):
            return {}
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @property
    def total(self) -> int:
        return len(self.vid_offset)

    def video_slice(self, i: int) -> slice:
        start = int(self.video_start[i])
        return slice(start, start + int(self.n_videos[i]))

    def row(self, i: int, shift: int) -> VideoColumns:
        """The columns of sample `i` alone, its byte offsets moved back by `shift` (a sample read on its own)."""
        sl = self.video_slice(i)
        cols = {f: getattr(self, f)[sl] for f in VIDEO_COLUMNS}
        cols["vid_offset"] = cols["vid_offset"] - shift
        cols["vid_info_offset"] = cols["vid_info_offset"] - shift
        return VideoColumns(n_videos=self.n_videos[i:i + 1], video_start=np.zeros(1, np.int64), **cols)

    def validate(self, n_samples: int) -> None:
        """ValueError if the arrays disagree with each other or with the index's sample count."""
        for f in SAMPLE_COLUMNS:
            if len(getattr(self, f)) != n_samples:
                raise ValueError(f"index field {f} has {len(getattr(self, f))} rows, expected {n_samples}")
        v = int(self.n_videos.sum()) if n_samples else 0
        for f in VIDEO_COLUMNS:
            if len(getattr(self, f)) != v:
                raise ValueError(f"index field {f} has {len(getattr(self, f))} rows, expected {v}")
        start = np.concatenate([[0], np.cumsum(self.n_videos, dtype=np.int64)[:-1]]) if n_samples else np.zeros(0)
        if not np.array_equal(self.video_start, start):
            raise ValueError("index video_start does not match n_videos")


class VideoColumnsBuilder:
    """Accumulates the video columns while a shard is written."""

    def __init__(self) -> None:
        self._samples: dict[str, list] = {f: [] for f in SAMPLE_COLUMNS}
        self._videos: dict[str, list] = {f: [] for f in VIDEO_COLUMNS}

    def add(self, videos: list[tuple[int, int, int, int, dict]]) -> None:
        """One sample's clips: (offset, size, info offset, info size, ClipInfo dict) each."""
        self._samples["n_videos"].append(len(videos))
        self._samples["video_start"].append(len(self._videos["vid_offset"]))
        for off, size, info_off, info_size, info in videos:
            row = {"vid_offset": off, "vid_size": size, "vid_info_offset": info_off, "vid_info_size": info_size}
            row.update({col: info[key] for col, key in _INFO_KEYS.items()})
            for f, value in row.items():
                self._videos[f].append(value)

    def build(self) -> VideoColumns:
        cols = {f: np.asarray(self._samples[f], dtype=t) for f, t in SAMPLE_COLUMNS.items()}
        cols.update({f: np.asarray(self._videos[f], dtype=t) for f, t in VIDEO_COLUMNS.items()})
        return VideoColumns(**cols)
