"""A small but real vision-language model that consumes PackedBatch dicts.

- Vision encoder: ViT over image patches. The dtype of `pixel_values` says
  what the pixels are: uint8 = raw 0-255 (decoded in the DataLoader workers),
  normalised here, on the device; floating = already normalised with the same
  CLIP mean/std (the DALI GPU stage's output, bf16 by default), used as they
  are. Any other dtype is an error. Fixed-resolution packs carry
  `pixel_values` [n_img, 3, S, S]; dynamic-resolution packs carry flattened
  patches [n_patches, 3*p*p] plus `image_grid` (rows, cols per image) and
  `vision_cu_seqlens`. Both become one patch sequence per image, and the
  encoder attends within each image only (varlen, non-causal). Patch
  positions are learned row and column embeddings, so any grid works.
- Projector: merge x merge neighbouring patches are concatenated (as in
  Qwen2-VL's patch merger; the patch rows come merge-block by merge-block, so
  this is a reshape) and mapped by a 2-layer MLP to the LM width.
- Language model: decoder-only, RMSNorm, RoPE on `position_ids` (which
  restart at 0 for every packed sample), SwiGLU, causal varlen attention over
  `cu_seqlens`.
- The image embeddings replace the embeddings at the image-token positions
  (`input_ids == image_token_id`), in order.

`forward(batch)` returns (sum of token losses, number of label tokens), so
the trainer can normalise by the global label count. Labels follow the
PackedBatch contract: aligned with input_ids, -100 where no loss; the model
predicts labels[t+1] from position t (a packed sample's first label is -100,
so nothing is predicted across a sample boundary).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from vlmdata_pipelines.attention import varlen_attention

IGNORE = -100
# CLIP normalisation constants (0-1 scale), applied on the device to uint8 pixels. Floating pixels must
# have been normalised with these already (see `pixels_are_normalised`).
PIXEL_MEAN = (0.48145466, 0.4578275, 0.40821073)
PIXEL_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass(frozen=True)
class VLMConfig:
    """Sizes of the model; `tiny()` is small enough for CPU tests."""

    vocab_size: int = 262
    image_token_id: int = 258
    dim: int = 256
    n_layers: int = 4
    n_heads: int = 4
    vision_dim: int = 192
    vision_layers: int = 2
    vision_heads: int = 3
    patch: int = 14
    merge: int = 1
    max_grid: int = 64
    rope_theta: float = 10000.0
    attn_backend: str = "auto"
    activation_checkpointing: bool = False

    @classmethod
    def tiny(cls, **overrides) -> VLMConfig:
        base = cls(dim=64, n_layers=2, n_heads=4, vision_dim=48, vision_layers=1, vision_heads=2)
        return replace(base, **overrides)

    @classmethod
    def preset(cls, name: str, **overrides) -> VLMConfig:
        """'tiny' (tests), 'small' (CPU demo/bench) or 'base' (a GPU-sized toy)."""
        if name == "tiny":
            return cls.tiny(**overrides)
        if name == "small":
            return replace(cls(), **overrides)
        if name == "base":
            return replace(cls(dim=768, n_layers=12, n_heads=12, vision_dim=768, vision_layers=12,
                               vision_heads=12), **overrides)
        raise ValueError(f"unknown model preset {name!r}: use tiny, small or base")

    def to_dict(self) -> dict:
        return asdict(self)


def _swiglu_hidden(dim: int) -> int:
    return 16 * math.ceil(dim * 8 / 3 / 16)


class RotaryEmbedding(nn.Module):
    """RoPE angles computed from explicit position ids (restarting per packed sample)."""

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        angles = position_ids.to(torch.float32)[:, None] * self.inv_freq[None, :]  # [T, D/2]
        return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate [T, H, D] by per-token angles (rotate-half convention)."""
    x1, x2 = x.float().chunk(2, dim=-1)
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, causal: bool, backend: str, bias: bool):
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim {dim} is not divisible by heads {heads}")
        self.heads, self.head_dim, self.causal, self.backend = heads, dim // heads, causal, backend
        self.qkv = nn.Linear(dim, 3 * dim, bias=bias)
        self.out = nn.Linear(dim, dim, bias=bias)

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
                rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        q, k, v = self.qkv(x).view(x.shape[0], 3, self.heads, self.head_dim).unbind(1)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        o = varlen_attention(q, k, v, cu_seqlens, max_seqlen, causal=self.causal, backend=self.backend)
        return self.out(o.reshape(x.shape[0], -1))


class SwiGLU(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        hidden = _swiglu_hidden(dim)
        self.gate_up = nn.Linear(dim, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class DecoderBlock(nn.Module):
    def __init__(self, cfg: VLMConfig):
        super().__init__()
        self.attn_norm = nn.RMSNorm(cfg.dim, eps=1e-6)
        self.attn = Attention(cfg.dim, cfg.n_heads, causal=True, backend=cfg.attn_backend, bias=False)
        self.mlp_norm = nn.RMSNorm(cfg.dim, eps=1e-6)
        self.mlp = SwiGLU(cfg.dim)

    def forward(self, x, cu_seqlens, max_seqlen: int, cos, sin):
        x = x + self.attn(self.attn_norm(x), cu_seqlens, max_seqlen, (cos, sin))
        return x + self.mlp(self.mlp_norm(x))


class VisionBlock(nn.Module):
    def __init__(self, cfg: VLMConfig):
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.vision_dim)
        self.attn = Attention(cfg.vision_dim, cfg.vision_heads, causal=False, backend=cfg.attn_backend, bias=True)
        self.norm2 = nn.LayerNorm(cfg.vision_dim)
        self.mlp = nn.Sequential(nn.Linear(cfg.vision_dim, 4 * cfg.vision_dim), nn.GELU(),
                                 nn.Linear(4 * cfg.vision_dim, cfg.vision_dim))

    def forward(self, x, cu_seqlens, max_seqlen: int):
        x = x + self.attn(self.norm1(x), cu_seqlens, max_seqlen)
        return x + self.mlp(self.norm2(x))


@dataclass
class PatchSequence:
    """All images of a pack as one patch sequence: patch rows + per-image grids.

    Patch rows follow vlmdata.decode.patches (the Qwen2-VL layout): channel-major
    (c, py, px) values, and inside an image merge x merge blocks of neighbouring
    patches are contiguous, blocks in row-major order.
    """

    patches: torch.Tensor        # [N, 3*p*p]: uint8 0-255, or floating already normalised
    grids: torch.Tensor          # int64 [n_img, 2] (rows, cols) in patches
    cu_seqlens: torch.Tensor     # int32 [n_img + 1]
    max_seqlen: int


def fixed_patches(pixel_values: torch.Tensor, patch: int, merge: int = 1) -> PatchSequence:
    """Cut [n, 3, S, S] images into patch rows in the merge-block layout."""
    n, c, h, w = pixel_values.shape
    f = patch * merge
    if h % f or w % f:
        raise ValueError(f"image size {h}x{w} is not a multiple of patch*merge = {f}")
    rows, cols = h // patch, w // patch
    x = pixel_values.reshape(n, c, rows // merge, merge, patch, cols // merge, merge, patch)
    x = x.permute(0, 2, 5, 3, 6, 1, 4, 7)  # n, block row, block col, row in block, col in block, c, py, px
    patches = x.reshape(n * rows * cols, c * patch * patch)
    grids = torch.tensor([[rows, cols]] * n, dtype=torch.int64).reshape(n, 2)
    cu = torch.arange(n + 1, dtype=torch.int32) * (rows * cols)
    return PatchSequence(patches, grids, cu, rows * cols)


def pixels_are_normalised(pixels: torch.Tensor) -> bool:
    """False for uint8 (raw 0-255), True for floating (normalised upstream); other dtypes are an error."""
    if pixels.dtype == torch.uint8:
        return False
    if pixels.dtype.is_floating_point:
        return True
    raise TypeError(f"pixel_values must be uint8 (0-255) or floating (already normalised), got {pixels.dtype}")


def image_grids(batch: dict) -> torch.Tensor:
    """(rows, cols) per image from `image_grid`, given as [n, 2] (h, w) or [n, 3] (t, h, w)."""
    grid = batch["image_grid"].to(torch.int64).cpu()
    grid = grid.reshape(grid.shape[0], -1) if grid.dim() > 1 else grid.reshape(-1, 2)
    return grid[:, -2:]


def patch_sequence(batch: dict, patch: int, merge: int = 1) -> PatchSequence | None:
    """The pack's images as a PatchSequence, or None when it has no image."""
    pixels = batch.get("pixel_values")
    if pixels is None or pixels.shape[0] == 0:
        return None
    if pixels.dim() == 4:
        return fixed_patches(pixels, patch, merge)
    grids = image_grids(batch)
    counts = grids[:, 0] * grids[:, 1]
    cu = batch.get("vision_cu_seqlens")
    if cu is None:
        cu = F.pad(counts.cumsum(0), (1, 0)).to(torch.int32)
    if int(cu[-1]) != pixels.shape[0]:
        raise ValueError(f"vision_cu_seqlens ends at {int(cu[-1])} but the pack has {pixels.shape[0]} patches")
    return PatchSequence(pixels, grids, cu, int(counts.max()))


class VisionEncoder(nn.Module):
    """ViT over a PatchSequence; returns one embedding per merged patch, image after image."""

    def __init__(self, cfg: VLMConfig):
        super().__init__()
        self.cfg = cfg
        self.patch_embed = nn.Linear(3 * cfg.patch * cfg.patch, cfg.vision_dim)
        self.row_embed = nn.Embedding(cfg.max_grid, cfg.vision_dim)
        self.col_embed = nn.Embedding(cfg.max_grid, cfg.vision_dim)
        self.blocks = nn.ModuleList(VisionBlock(cfg) for _ in range(cfg.vision_layers))
        self.norm = nn.LayerNorm(cfg.vision_dim)
        mean = torch.tensor(PIXEL_MEAN).repeat_interleave(cfg.patch * cfg.patch)
        std = torch.tensor(PIXEL_STD).repeat_interleave(cfg.patch * cfg.patch)
        self.register_buffer("pixel_scale", 1.0 / (255.0 * std), persistent=False)
        self.register_buffer("pixel_shift", -mean / std, persistent=False)

    def positions(self, grids: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Row and column of every patch, in the merge-block order of the patch rows."""
        m = self.cfg.merge
        rows, cols = [], []
        for r, c in grids.tolist():
            if r > self.cfg.max_grid or c > self.cfg.max_grid:
                raise ValueError(f"image grid {r}x{c} exceeds max_grid={self.cfg.max_grid}; raise it in VLMConfig")
            if r % m or c % m:
                raise ValueError(f"image grid {r}x{c} is not a multiple of merge={m}")
            shape = (r // m, c // m, m, m)  # block row, block col, row in block, col in block
            block_r = torch.arange(r // m).view(-1, 1, 1, 1).expand(shape)
            block_c = torch.arange(c // m).view(1, -1, 1, 1).expand(shape)
            in_r = torch.arange(m).view(1, 1, -1, 1).expand(shape)
            in_c = torch.arange(m).view(1, 1, 1, -1).expand(shape)
            rows.append((block_r * m + in_r).reshape(-1))
            cols.append((block_c * m + in_c).reshape(-1))
        return torch.cat(rows).to(device), torch.cat(cols).to(device)

    def forward(self, seq: PatchSequence, checkpointing: bool = False) -> torch.Tensor:
        dev = self.patch_embed.weight.device
        x = seq.patches.to(dev, non_blocking=True)
        if not pixels_are_normalised(x):
            x = x.float() * self.pixel_scale + self.pixel_shift
        x = self.patch_embed(x.to(self.patch_embed.weight.dtype))
        rows, cols = self.positions(seq.grids, dev)
        x = x + self.row_embed(rows) + self.col_embed(cols)
        cu = seq.cu_seqlens.to(dev)
        for block in self.blocks:
            if checkpointing and torch.is_grad_enabled():
                x = checkpoint(block, x, cu, seq.max_seqlen, use_reentrant=False)
            else:
                x = block(x, cu, seq.max_seqlen)
        x = self.norm(x)
        # merge x merge neighbours are contiguous rows: the patch merger is a reshape
        return x.reshape(-1, self.cfg.merge * self.cfg.merge * x.shape[-1])


class TinyVLM(nn.Module):
    """Vision encoder + projector + decoder-only LM over packed batches."""

    def __init__(self, cfg: VLMConfig):
        super().__init__()
        self.cfg = cfg
        self.vision = VisionEncoder(cfg)
        merged = cfg.vision_dim * cfg.merge * cfg.merge
        self.projector = nn.Sequential(nn.Linear(merged, cfg.dim), nn.GELU(), nn.Linear(cfg.dim, cfg.dim))
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.rope = RotaryEmbedding(cfg.dim // cfg.n_heads, cfg.rope_theta)
        self.layers = nn.ModuleList(DecoderBlock(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.RMSNorm(cfg.dim, eps=1e-6)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self.apply(self._init)

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)

    def dummy_image(self) -> PatchSequence:
        """A one-patch black image: keeps every parameter in the graph when a pack has no image."""
        p = self.cfg.patch * self.cfg.merge
        pixels = torch.zeros(1, 3, p, p, dtype=torch.uint8)
        return fixed_patches(pixels, self.cfg.patch, self.cfg.merge)

    def embed_inputs(self, batch: dict) -> torch.Tensor:
        """Token embeddings with image embeddings placed at the image-token positions."""
        dev = self.embed.weight.device
        input_ids = batch["input_ids"].to(dev, non_blocking=True)
        h = self.embed(input_ids)
        seq = patch_sequence(batch, self.cfg.patch, self.cfg.merge)
        ckpt = self.cfg.activation_checkpointing
        if seq is None:
            # No image in this pack: run a dummy one and add it times zero so the
            # graph (and DDP's gradient buckets) is the same on every rank.
            img = self.projector(self.vision(self.dummy_image(), ckpt))
            return h + 0.0 * img.sum()
        img = self.projector(self.vision(seq, ckpt)).to(h.dtype)
        mask = input_ids == self.cfg.image_token_id
        n_slots = int(mask.sum())
        if n_slots != img.shape[0]:
            raise ValueError(f"pack has {n_slots} image tokens but its images give {img.shape[0]} embeddings; "
                             "the image policy of the data and the model's patch/merge must agree")
        idx = mask.nonzero(as_tuple=True)[0]
        return h.index_put((idx,), img)

    def forward(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """(sum of token cross-entropies, number of label tokens) for one PackedBatch."""
        dev = self.embed.weight.device
        if batch["input_ids"].numel() == 0:  # no token at all: run one ignored token (zero loss, same graph)
            batch = _one_ignored_token()
        h = self.embed_inputs(batch)
        cu = batch["cu_seqlens"].to(dev, non_blocking=True)
        max_seqlen = int(batch["max_seqlen"])
        cos, sin = self.rope(batch["position_ids"].to(dev, non_blocking=True))
        for layer in self.layers:
            if self.cfg.activation_checkpointing and torch.is_grad_enabled():
                h = checkpoint(layer, h, cu, max_seqlen, cos, sin, use_reentrant=False)
            else:
                h = layer(h, cu, max_seqlen, cos, sin)
        labels = batch["labels"].to(dev, non_blocking=True)
        targets = labels[1:]
        keep = targets != IGNORE
        hidden = self.norm(h[:-1][keep])
        logits = self.lm_head(hidden)
        if logits.dtype in (torch.float16, torch.bfloat16):
            logits = logits.float()
        loss_sum = F.cross_entropy(logits, targets[keep], reduction="sum")
        if not bool(keep.any()):  # keep the head in the graph with a zero loss
            loss_sum = loss_sum * 0.0 + 0.0 * self.lm_head.weight.sum()
        return loss_sum, keep.sum()


def _one_ignored_token() -> dict:
    return {"input_ids": torch.zeros(1, dtype=torch.long), "position_ids": torch.zeros(1, dtype=torch.long),
            "cu_seqlens": torch.tensor([0, 1], dtype=torch.int32), "max_seqlen": 1,
            "labels": torch.full((1,), IGNORE, dtype=torch.long)}


def param_checksum(model: nn.Module) -> float:
    """A float64 fingerprint of all parameters (for cross-rank sync checks)."""
    total = torch.zeros((), dtype=torch.float64)
    for i, p in enumerate(model.parameters()):
        data = p.detach()
        if hasattr(data, "full_tensor"):  # FSDP2 DTensor
            data = data.full_tensor()
        total += (data.double().cpu() * (1.0 + 1e-3 * i)).sum()
    return float(total)
