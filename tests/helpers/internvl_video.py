"""InternVL's video reference for the tests: transformers' own parts where they run here.

`InternVLVideoProcessor`'s module imports torchvision, which is not installed, so its `sample_frames` is compiled
from the installed module's source alone (`reference_sample_frames`), and `ReferenceVideoProcessor` stands in for
the class: transformers' PyAV reader (`video_utils.load_video`, which decodes the clip from its start up to the
last sampled frame) at the indices of that `sample_frames`, each frame resized and normalised by the folder's own
image processor (`GotOcr2ImageProcessorPil`, one S x S tile per frame: bicubic, aspect not kept, as the video
processor resizes). Given to the real `InternVLProcessor`, its `__call__` then writes `replace_video_token`'s text
into the whole string it tokenizes and merges the frames into `pixel_values` between the image tiles in token
order: the ids and the pixel order under test are the processor's own.
"""
from __future__ import annotations

import ast
import importlib.util

import torch

__all__ = ["ReferenceVideoProcessor", "internvl_video_processor", "reference_sample_frames"]


def reference_sample_frames():
    """`InternVLVideoProcessor.sample_frames` (its class defaults), compiled from the installed module's source:
    (total frames, N) -> indices."""
    from transformers.video_utils import VideoMetadata

    path = importlib.util.find_spec("transformers.models.internvl.video_processing_internvl").origin
    tree = ast.parse(open(path).read())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "InternVLVideoProcessor")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "sample_frames")
    scope = {"torch": torch, "VideoMetadata": VideoMetadata}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), path, "exec"), scope)
    me = type("Defaults", (), {"num_frames": None, "initial_shift": True})()        # the class's defaults
    return lambda frames, n: scope["sample_frames"](me, VideoMetadata(total_num_frames=frames, fps=30.0), num_frames=n)


class ReferenceVideoProcessor:
    """Clips (file paths) -> `pixel_values_videos` [videos, N, 3, S, S], from transformers' parts (module
    docstring)."""

    def __init__(self, image_processor, num_frames: int):
        self.image_processor, self.num_frames = image_processor, num_frames
        self.sample = reference_sample_frames()

    def indices(self, total: int) -> list[int]:
        return self.sample(total, self.num_frames).tolist()

    def frames(self, path: str):
        """(N, H, W, 3) uint8: the sampled frames as transformers' PyAV reader returns them."""
        from transformers.video_utils import load_video

        frames, _ = load_video(str(path), backend="pyav",
                               sample_indices_fn=lambda metadata, **kw: self.indices(metadata.total_num_frames))
        return frames

    def __call__(self, videos, **kwargs):
        from PIL import Image
        from transformers import BatchFeature

        clips = []
        for path in videos:
            tiles = [Image.fromarray(f) for f in self.frames(path)]
            clips.append(self.image_processor(tiles, crop_to_patches=False, return_tensors="pt")["pixel_values"])
        return BatchFeature({"pixel_values_videos": torch.stack(clips)})


def internvl_video_processor(processor, num_frames: int):
    """The InternVLProcessor `processor` (no video processor) given the reference video processor."""
    processor.video_processor = ReferenceVideoProcessor(processor.image_processor, num_frames)
    return processor
