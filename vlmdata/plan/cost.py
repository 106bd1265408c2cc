"""What a pack costs to train on: a FLOP model of a VLM's language model and vision encoder.

A pack's cost is the sum of its samples' costs (varlen attention never looks
across samples, the vision encoder never across images):

    sample = lm_token * tokens + lm_attention * tokens**2
           + vit_patch * patches + vit_attention * sum(patches_i**2 over its images)

with patches = image tokens * patches_per_token (Qwen2-VL merges 2 x 2
patches into one token: 4). The coefficients are training FLOPs (forward and
backward, 3x the forward's): 6 x parameters per token or patch, and
6 x width x layers per pair of tokens of one sample (causal: half the pairs) or
12 x width x depth per pair of patches of one image (full attention).

`CostModel.from_config` reads them from a Hugging Face config.json (a dict or a
path: text_config or top-level LM sizes, vision_config); `CostModel()` is a
7B LM (Qwen2-VL-7B's sizes) with a 600M ViT (Qwen2-VL's: 1280 wide, 32 deep).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace

import numpy as np

__all__ = ["CostModel", "lm_coefficients", "vit_coefficients"]


def lm_coefficients(hidden: int, layers: int, ffn: int, heads: int | None = None, kv_heads: int | None = None,
                    vocab: int = 0) -> tuple[float, float]:
    """(FLOPs per token, FLOPs per token pair of one sample) of a decoder LM's training step."""
    kv = hidden * (kv_heads or heads or 1) / (heads or 1)
    params = layers * (2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * ffn) + hidden * vocab
    return 6.0 * params, 6.0 * hidden * layers


def vit_coefficients(width: int, depth: int, mlp: int) -> tuple[float, float]:
    """(FLOPs per patch, FLOPs per patch pair of one image) of a ViT's training step (full attention)."""
    params = depth * (4 * width * width + 2 * width * mlp)
    return 6.0 * params, 12.0 * width * depth


_LM_7B = lm_coefficients(3584, 28, 18944, 28, 4, 152064)
_VIT_600M = vit_coefficients(1280, 32, 5120)


@dataclass(frozen=True)
class CostModel:
    """Training FLOPs of a sample from its tokens and images (see the module docstring)."""

    lm_token: float = _LM_7B[0]
    lm_attention: float = _LM_7B[1]
    vit_patch: float = _VIT_600M[0]
    vit_attention: float = _VIT_600M[1]
    patches_per_token: int = 4

    def __post_init__(self) -> None:
        if min(self.lm_token, self.lm_attention, self.vit_patch, self.vit_attention) < 0 or self.patches_per_token < 1:
            raise ValueError("cost coefficients must be >= 0 and patches_per_token >= 1")

    @classmethod
    def from_config(cls, config: dict | str | os.PathLike) -> CostModel:
        """The cost model of a model family's config.json (a dict, the file, or the model folder)."""
        if not isinstance(config, dict):
            path = os.fspath(config)
            if os.path.isdir(path):
                path = os.path.join(path, "config.json")
            with open(path, encoding="utf-8") as f:
                config = json.load(f)
        text = config.get("text_config") or config
        vision = config.get("vision_config") or {}
        try:
            hidden = int(text["hidden_size"])
            lm = lm_coefficients(hidden, int(text["num_hidden_layers"]), int(text.get("intermediate_size", 4 * hidden)),
                                 text.get("num_attention_heads"), text.get("num_key_value_heads"),
                                 int(text.get("vocab_size", 0)))
        except KeyError as exc:
            raise ValueError(f"the model config has no {exc.args[0]!r} for its language model") from None
        if not vision:
            return cls(lm[0], lm[1], 0.0, 0.0, 1)
        width = int(vision.get("embed_dim") or vision["hidden_size"])
        depth = int(vision.get("depth") or vision["num_hidden_layers"])
        mlp = int(vision.get("intermediate_size") or vision.get("mlp_ratio", 4) * width)
        vit = vit_coefficients(width, depth, mlp)
        merge = int(vision.get("spatial_merge_size", 1))
        return cls(lm[0], lm[1], vit[0], vit[1], merge * merge)

    def for_policy(self, policy) -> CostModel:
        """This model with the image policy's patches per token (a dynamic policy's merge**2, else 1)."""
        return replace(self, patches_per_token=int(getattr(policy, "merge", 1)) ** 2)

    def sample_costs(self, tokens, image_tokens, image_square_tokens) -> np.ndarray:
        """FLOPs per sample from its tokens, its images' tokens and the sum of their squares."""
        t = np.asarray(tokens, dtype=np.float64)
        k = float(self.patches_per_token)
        patches = np.asarray(image_tokens, dtype=np.float64) * k
        squares = np.asarray(image_square_tokens, dtype=np.float64) * (k * k)
        return self.lm_token * t + self.lm_attention * t * t + self.vit_patch * patches + self.vit_attention * squares
