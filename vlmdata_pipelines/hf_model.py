"""A Hugging Face VLM in the reference training loop (`vlmdata_pipelines.train --model hf:DIR`).

`HFModelConfig` names a model folder (config.json, preprocessor_config.json,
weights optional); `HFPackedModel` wraps the model built from it
(`vlmdata.hf.load_model`: random initialisation without weights, the packed
attention of the device) behind the interface the loop uses for `TinyVLM`:
`forward(PackedBatch) -> (sum of token losses, number of label tokens)`, so
gradient accumulation, the global label-count normalisation, DDP/FSDP,
checkpoints and metrics work unchanged. Per pack it runs the family's output
adapter (`vlmdata.hf`: [1, T] ids, M-RoPE positions for Qwen, the sample
boundaries, pixels normalised on the model's device) and the model's base
network, then the LM head on the label positions only (no [T, vocab] logits
for the other tokens), like TinyVLM.

Two DDP details: a pack without images runs a one-patch black image (a tiled
family, e.g. Idefics3: one tile-sized black image, laid out by its own image
policy and adapter) through the vision tower and adds it times zero, so every
rank's graph uses the same
parameters; and parameters the model's forward never uses (LLaVA drops the
CLIP tower's last layer and post-layernorm by taking layer -2's features) are
found once with a dry run and frozen, since DDP expects a gradient for every
trainable parameter.
"""
from __future__ import annotations

import inspect
import logging
import math
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F
from torch import nn

from vlmdata.formats import Manifest
from vlmdata.hf import (
    OPENAI_CLIP_MEAN,
    OPENAI_CLIP_STD,
    ModelSpec,
    load_model,
    make_adapter,
    take_meta,
    text_attention,
)
from vlmdata_pipelines.data import DataOptions

log = logging.getLogger(__name__)

IGNORE = -100
PREFIX = "hf:"
ATTENTION = {"auto": "auto", "flash": "flash_attention_2", "torch": "vlmdata_varlen", "reference": "sdpa"}


@dataclass(frozen=True)
class HFModelConfig:
    """A Hugging Face model folder and how to run it (`--model hf:DIR`)."""

    path: str
    attn_implementation: str = "auto"      # auto | flash_attention_2 | vlmdata_varlen | sdpa | eager
    activation_checkpointing: bool = False
    spec: ModelSpec = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "spec", ModelSpec.from_folder(self.path))

    @classmethod
    def from_arg(cls, model: str, attn_backend: str = "auto", activation_checkpointing: bool = False):
        """`hf:DIR` with the trainer's --attn-backend name mapped to a transformers implementation."""
        return cls(model[len(PREFIX):], ATTENTION.get(attn_backend, attn_backend), activation_checkpointing)

    @property
    def image_token_id(self) -> int:
        return self.spec.image_token_id

    def to_dict(self) -> dict:
        return {"path": self.path, "attn_implementation": self.attn_implementation, "family": self.spec.family,
                "activation_checkpointing": self.activation_checkpointing}


def is_hf_model(name: str) -> bool:
    return name.startswith(PREFIX)


def _same(a, b) -> bool:
    return all(math.isclose(x, y, rel_tol=1e-6) for x, y in zip(a, b))


class HFPackedModel(nn.Module):
    """forward(PackedBatch) -> (loss sum, label count) for a Hugging Face VLM (see the module docstring)."""

    def __init__(self, cfg: HFModelConfig, device: torch.device | None = None):
        super().__init__()
        self.cfg = cfg
        self.spec = cfg.spec
        self.model = load_model(cfg.path, attn_implementation=cfg.attn_implementation, device=device)
        if cfg.activation_checkpointing:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.adapter = make_adapter(self.spec, text_attention(self.model))
        self.frozen = self._freeze_unused()

    # ---- the pack -> forward inputs ------------------------------------------------------------------
    def _inputs(self, batch: dict) -> dict:
        param = self.model.lm_head.weight
        pixels = batch.get("pixel_values")
        if pixels is not None and pixels.is_floating_point() and not self.adapter.processor_pixels and not (
                _same(self.spec.image_mean, OPENAI_CLIP_MEAN) and _same(self.spec.image_std, OPENAI_CLIP_STD)):
            raise ValueError(f"the pack's pixels were normalised upstream with CLIP's mean/std (the GPU decode "
                             f"stage) but {self.spec.family} uses {self.spec.image_mean}/{self.spec.image_std}: "
                             "run with --decode-stage off")
        host = self.adapter(batch)
        take_meta(host)
        return self.adapter.finalize(host, device=param.device, dtype=param.dtype)

    def _dummy_image_term(self, like: torch.Tensor) -> torch.Tensor:
        """0 x (vision features of a black one-token image): keeps the vision tower in the graph."""
        spec, dev = self.spec, like.device
        inner = self.model.model
        if spec.policy is not None:       # a tiled or generic family: the probe's image, in the adapter's keys
            host = self.adapter(self._probe_pack())
            take_meta(host)
            inputs = self.adapter.finalize(host, device=dev, dtype=like.dtype)
            takes = inspect.signature(inner.get_image_features).parameters
            out = inner.get_image_features(**{k: v for k, v in inputs.items() if k in takes and k != "input_ids"})
        elif spec.is_qwen:
            m = spec.merge_size
            rows = torch.zeros(m * m, 3 * spec.patch_size ** 2, dtype=torch.uint8, device=dev)
            out = inner.get_image_features(self.adapter.normalise(rows, like.dtype),
                                           torch.tensor([[1, m, m]], device=dev))
        else:
            s = _image_side(spec)
            images = self.adapter.normalise(torch.zeros(1, 3, s, s, dtype=torch.uint8, device=dev), like.dtype)
            out = inner.get_image_features(pixel_values=images)
        features = out.pooler_output
        features = features if isinstance(features, torch.Tensor) else torch.cat([f.reshape(-1) for f in features])
        return 0.0 * features.sum()

    def forward(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        inputs = self._inputs(batch)
        labels = inputs.pop("labels")
        hidden = self.model.model(**inputs).last_hidden_state        # [B, T, H]
        targets = labels[..., 1:]
        keep = targets != IGNORE
        logits = self.model.lm_head(hidden[..., :-1, :][keep])
        loss_sum = F.cross_entropy(logits.float(), targets[keep], reduction="sum")
        if "pixel_values" not in inputs:
            loss_sum = loss_sum + self._dummy_image_term(hidden)
        return loss_sum, keep.sum()

    # ---- parallelism ----------------------------------------------------------------------------------
    def fsdp_units(self) -> list[nn.Module]:
        """The transformer blocks to shard one by one (language model, then vision tower)."""
        inner = self.model.model
        text = getattr(inner, "language_model", inner)
        vision = getattr(inner, "visual", None) or getattr(inner, "vision_tower", None)
        blocks = list(getattr(text, "layers", []))
        if vision is not None:
            encoder = getattr(vision, "vision_model", vision)
            blocks += list(getattr(vision, "blocks", None) or getattr(getattr(encoder, "encoder", None), "layers", []))
        return blocks

    def _freeze_unused(self) -> list[str]:
        """Freeze the parameters one forward/backward with an image leaves without a gradient."""
        probe = self._probe_pack()
        loss, _ = self(probe)
        loss.backward()
        unused = [n for n, p in self.model.named_parameters() if p.requires_grad and p.grad is None]
        for n, p in self.model.named_parameters():
            p.grad = None
            if n in unused:
                p.requires_grad_(False)
        if unused:
            log.info("%s: %d parameters unused by the forward pass are frozen (e.g. %s)", self.spec.family,
                     len(unused), unused[0])
        return unused

    def _probe_pack(self) -> dict:
        """A one-sample pack with one small image and a few text tokens (for the dry run)."""
        spec = self.spec
        if spec.family == "generic":
            run, images = _processor_probe_image(spec.image_policy())
        elif spec.policy is not None:                # a tiled family: one tile-sized image, its structured run
            policy = spec.image_policy()
            side = policy.tile
            run = torch.from_numpy(policy.expansion(side, side).copy())
            n = int(policy.tiles(side, side))
            images = {"pixel_values": torch.zeros(n, 3, side, side, dtype=torch.uint8),
                      "image_tiles": torch.tensor([n], dtype=torch.int32),
                      "image_sizes": torch.tensor([[side, side]], dtype=torch.int32)}
        elif spec.is_qwen:
            m = spec.merge_size
            pixels = torch.zeros(m * m, 3 * spec.patch_size ** 2, dtype=torch.uint8)
            images = {"pixel_values": pixels, "image_grid": torch.tensor([[1, m, m]], dtype=torch.int32)}
            run = torch.full((1,), spec.image_token_id)
        else:
            s = int(spec.image_size)
            images = {"pixel_values": torch.zeros(1, 3, s, s, dtype=torch.uint8)}
            run = torch.full(((s // spec.patch_size) ** 2,), spec.image_token_id)
        ids = torch.cat([torch.zeros(1, dtype=torch.int64), run, torch.zeros(3, dtype=torch.int64)])
        labels = ids.clone()
        labels[: 1 + len(run)] = IGNORE
        total = len(ids)
        return {"input_ids": ids, "labels": labels, "position_ids": torch.arange(total),
                "cu_seqlens": torch.tensor([0, total], dtype=torch.int32), "max_seqlen": total, **images}


def _processor_probe_image(policy) -> tuple[torch.Tensor, dict]:
    """The generic family's probe image, by the model's own processor: its expansion and pack fields."""
    run, fields = policy.probe_image()
    return torch.from_numpy(run.copy()), {k: torch.from_numpy(v) for k, v in fields.items()}


def _image_side(spec) -> int:
    """The side of the vision tower's square input: a tiled family's tile, else LLaVA's image size."""
    return int(spec.policy["tile"]) if spec.policy is not None else int(spec.image_size)


def hf_data_options(data: DataOptions, cfg: HFModelConfig) -> DataOptions:
    """`data` with the model's image policy; raises unless the dataset's tokens fit the model."""
    cfg.spec.check_tokenizer(Manifest.load(data.data).tokenizer)
    return replace(data, image_policy=cfg.spec.image_policy())


def build_model(model_cfg, device: torch.device) -> nn.Module:
    """The loop's model: TinyVLM for a VLMConfig, HFPackedModel for an HFModelConfig."""
    if isinstance(model_cfg, HFModelConfig):
        return HFPackedModel(model_cfg, device)
    from vlmdata_pipelines.model import TinyVLM

    return TinyVLM(model_cfg).to(device)
