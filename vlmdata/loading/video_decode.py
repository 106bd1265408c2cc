"""Decoding a pack's clips in the DataLoader worker: only the sampled frames, one clip at a time.

`decode_videos(records, policy, stats)` gives, per record, its clips laid out for the model
(`video.policy.DecodedVideo`) or None when one of them fails: that sample is skipped and counted under
the clip's reason (the probe's `ClipProblem` reason, else `undecodable_video`); the rest of the pack
is built as usual. Each clip's decoded frames are freed once its patch rows are made, so a worker holds
at most one clip's frames.
"""
from __future__ import annotations

import logging
import time

from vlmdata.errors import Skip
from vlmdata.metrics.counts import StatsDelta
from vlmdata.video.probe import ClipProblem

__all__ = ["decode_videos"]

log = logging.getLogger(__name__)


def _clip(policy, key: str, j: int, clip, stats: StatsDelta):
    try:
        return policy.load(clip.data, clip.info)
    except ClipProblem as exc:
        reason = exc.reason
    except Exception as exc:  # PyAV raises its own error classes; any failure costs only this sample
        log.warning("skipping sample %s: clip %d does not decode: %s", key, j, exc)
        reason = Skip.UNDECODABLE_VIDEO
    stats.skipped[reason] += 1
    return None


def decode_videos(records: list, policy, stats: StatsDelta) -> list[list | None]:
    """Per record: its decoded clips ([] without clips), or None (a clip failed; counted)."""
    out: list[list | None] = []
    t0 = time.perf_counter()
    for rec in records:
        clips = []
        for j, clip in enumerate(rec.videos):
            got = None if policy is None else _clip(policy, rec.key, j, clip, stats)
            if got is None:
                if policy is None:
                    stats.skipped[Skip.VIDEO_UNSUPPORTED] += 1
                clips = None
                break
            clips.append(got)
        out.append(clips)
    if any(r.videos for r in records):
        stats.decode_seconds += time.perf_counter() - t0
    return out
