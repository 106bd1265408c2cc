"""A tiny Qwen3-VL model folder built on the spot (no download), for examples and fast tests of Qwen3-VL videos.

`qwen3_vl_video_folder(dir)`: the small ChatML tokenizer of `chatml_folder` with Qwen2's pre-tokenizer (digits one
by one, so the `<t seconds>` timestamps compose), a 2-layer `Qwen3VLConfig` (patch 16, a 1-block vision tower),
Qwen3-VL's image settings (mean/std 0.5) and a video processor config with small frames for a CPU. The model it
describes is randomly initialised when loaded.
"""
from __future__ import annotations

import json
from pathlib import Path

from vlmdata.testing.model_folders import chatml_folder

__all__ = ["TINY_QWEN3_VIDEO", "qwen3_vl_video_folder"]

TINY_QWEN3_VIDEO = {"video_processor_type": "Qwen3VLVideoProcessor", "fps": 2.0, "min_frames": 4, "max_frames": 16,
                    "patch_size": 16, "merge_size": 2, "temporal_patch_size": 2,
                    "size": {"shortest_edge": 64 * 64, "longest_edge": 8 * 128 * 128}}


def qwen3_vl_video_folder(path: Path) -> Path:
    """Write the tiny Qwen3-VL folder (see the module docstring) under `path`; returns it."""
    from transformers import Qwen3VLConfig

    folder = chatml_folder(Path(path), qwen2_split=True)
    ids = {t["content"]: t["id"] for t in json.loads((folder / "tokenizer.json").read_text())["added_tokens"]}
    Qwen3VLConfig(
        text_config=dict(vocab_size=8 * -(-(max(ids.values()) + 1) // 8), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3],
                                          "mrope_interleaved": True, "rope_theta": 1e4}),
        vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=16,
                           spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=64,
                           num_position_embeddings=256, deepstack_visual_indexes=[0]),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
    ).save_pretrained(folder)
    (folder / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "Qwen2VLImageProcessor", "patch_size": 16, "merge_size": 2, "temporal_patch_size": 2,
        "image_mean": [0.5] * 3, "image_std": [0.5] * 3, "size": {"shortest_edge": 64 * 64, "longest_edge": 256 * 256}}))
    tok_cfg = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**tok_cfg, "processor_class": "Qwen3VLProcessor"}))
    (folder / "video_preprocessor_config.json").write_text(json.dumps(TINY_QWEN3_VIDEO))
    return folder
