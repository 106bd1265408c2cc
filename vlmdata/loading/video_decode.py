"""A pack's clips in the DataLoader worker: decoded (only the sampled frames, one clip at a time) or deferred.

`decode_videos(records, policy, stats)` gives, per record, its clips laid out for the model
(`video.policy.DecodedVideo`) or None when one of them fails: that sample is skipped and counted under
the clip's reason (the probe's `ClipProblem` reason, else `undecodable_video`); the rest of the pack
is built as usual. Each clip's decoded frames are freed once its patch rows are made, so a worker holds
at most one clip's frames.

`defer_videos(records, policy, stats)` (`defer_decode`) gives the same per record without decoding:
each clip as a `PendingVideo` (its encoded bytes, the part of its probe dict that decoding its sampled
frames needs, `video.frames.decode_window`, and the policy's `ClipLayout`: the frames it samples, their
size, its tokens), decoded later by the training process's video stage
(`decode.dali.video.DaliVideoStage`).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from vlmdata.errors import Skip
from vlmdata.metrics.counts import StatsDelta
from vlmdata.video.frames import decode_window
from vlmdata.video.layout import ClipLayout
from vlmdata.video.probe import ClipInfo, ClipProblem

__all__ = ["PendingVideo", "decode_videos", "defer_videos"]

log = logging.getLogger(__name__)


@dataclass
class PendingVideo:
    """A clip shipped encoded: what the pack needs of it (tokens, placeholder ids) without its pixels."""

    data: memoryview | bytes
    info: dict                  # `decode_window(probe, layout.indices).to_dict()`: not every frame's time
    layout: ClipLayout

    @property
    def tokens(self) -> int:
        return self.layout.tokens

    @property
    def expansion(self):
        return self.layout.expansion

    @property
    def grid(self) -> tuple[int, int, int]:
        return self.layout.grid

    @property
    def second_per_grid(self) -> float:
        return self.layout.second_per_grid


def _pending(policy, data, info: dict) -> PendingVideo:
    clip = ClipInfo.from_dict(info)
    layout = policy.clip_layout(clip)
    return PendingVideo(data, decode_window(clip, layout.indices).to_dict(), layout)


def _decoded(policy, data, info: dict):
    return policy.load(data, info)


def _clip(make, policy, key: str, j: int, clip, stats: StatsDelta):
    try:
        return make(policy, clip.data, clip.info)
    except ClipProblem as exc:
        reason = exc.reason
    except Exception as exc:  # PyAV raises its own error classes; any failure costs only this sample
        log.warning("skipping sample %s: clip %d does not decode: %s", key, j, exc)
        reason = Skip.UNDECODABLE_VIDEO
    stats.skipped[reason] += 1
    return None


def _each_clip(make, records: list, policy, stats: StatsDelta) -> list[list | None]:
    out: list[list | None] = []
    for rec in records:
        clips = []
        for j, clip in enumerate(rec.videos):
            got = None if policy is None else _clip(make, policy, rec.key, j, clip, stats)
            if got is None:
                if policy is None:
                    stats.skipped[Skip.VIDEO_UNSUPPORTED] += 1
                clips = None
                break
            clips.append(got)
        out.append(clips)
    return out


def decode_videos(records: list, policy, stats: StatsDelta) -> list[list | None]:
    """Per record: its decoded clips ([] without clips), or None (a clip failed; counted)."""
    t0 = time.perf_counter()
    out = _each_clip(_decoded, records, policy, stats)
    if any(r.videos for r in records):
        stats.decode_seconds += time.perf_counter() - t0
    return out


def defer_videos(records: list, policy, stats: StatsDelta) -> list[list | None]:
    """Per record: its clips as `PendingVideo` ([] without clips), or None (a clip's metadata is unusable;
    counted)."""
    return _each_clip(_pending, records, policy, stats)
