"""Qwen3-VL's video reference without torchvision: transformers' `Qwen3VLVideoProcessor` rules on clip metadata,
and the real `Qwen3VLProcessor` building the placeholder text (timestamps included) and ids from them.

`MetadataVideoProcessor` is `Qwen3VLVideoProcessor` (its settings, its own `sample_frames`, its module's
`smart_resize`, checked against its `get_num_of_video_patches`; uncapped) whose `__call__` takes clip names and returns
what the processor needs for the text: `video_grid_thw` and `video_metadata` (fps, sampled frame indices). It does
not resize pixels, the one part that needs torchvision here.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch


@dataclass(frozen=True)
class ClipMeta:
    frames: int
    fps: float
    width: int
    height: int


def video_processor_class():
    import importlib

    from transformers.feature_extraction_utils import BatchFeature
    from transformers.video_utils import VideoMetadata

    # the module itself (the package's lazy attribute is a placeholder that asks for torchvision)
    ref = importlib.import_module("transformers.models.qwen3_vl.video_processing_qwen3_vl")

    class MetadataVideoProcessor(ref.Qwen3VLVideoProcessor):
        clips: dict = {}

        def sampled(self, clip: ClipMeta):
            """(frame indices, grid t/h/w) of one clip, by the processor's own rules."""
            meta = VideoMetadata(total_num_frames=clip.frames, fps=clip.fps, width=clip.width, height=clip.height)
            idx = self.sample_frames(meta, fps=self.fps)
            n = len(idx)
            assert not self.cap_pixels_per_frame, "smart_resize is called with the uncapped bounds here"
            patches = self.get_num_of_video_patches(n, clip.height, clip.width)
            factor = self.patch_size * self.merge_size
            h, w = ref.smart_resize(n, clip.height, clip.width, self.temporal_patch_size, factor,
                                    self.size["shortest_edge"], self.size["longest_edge"])
            grid = (-(-n // self.temporal_patch_size), h // self.patch_size, w // self.patch_size)
            assert grid[0] * grid[1] * grid[2] == patches               # two reference paths agree
            return idx, grid, meta

        def __call__(self, videos, **kwargs):
            grids, metas = [], []
            for name in videos:
                idx, grid, meta = self.sampled(self.clips[name])
                meta.frames_indices = idx
                grids.append(list(grid))
                metas.append(meta)
            return BatchFeature({"video_grid_thw": torch.tensor(grids), "video_metadata": metas})

    return MetadataVideoProcessor


def video_processor(config: dict, clips: dict[str, ClipMeta] | None = None):
    """The metadata video processor with a folder's video_preprocessor_config.json settings."""
    cls = video_processor_class()
    vp = cls(**{k: v for k, v in config.items() if k != "video_processor_type"})
    vp.clips = dict(clips or {})
    return vp


def qwen3_video_processor(folder: Path, clips: dict[str, ClipMeta]):
    """Qwen3VLProcessor of a folder: its tokenizer, PIL image processor and chat template, the metadata video
    processor with its video_preprocessor_config.json."""
    import transformers
    from transformers import AutoTokenizer, ProcessorMixin

    config = json.loads((folder / "video_preprocessor_config.json").read_text())
    template = json.loads((folder / "chat_template.json").read_text())["chat_template"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ProcessorMixin, "check_argument_for_proper_class", lambda self, name, arg: type(arg))
        return transformers.Qwen3VLProcessor(
            image_processor=transformers.Qwen2VLImageProcessorPil.from_pretrained(str(folder)),
            tokenizer=AutoTokenizer.from_pretrained(str(folder)), video_processor=video_processor(config, clips),
            chat_template=template)
