"""No cross-contamination: a pack's loss and gradients equal the sum over its samples run one by one.

fp32 on CPU; tolerance: loss rtol 1e-5, every gradient within 1e-5 of that
parameter's largest gradient (measured differences are ~1e-7). Run for every
attention backend usable here; the reference backend always runs.
"""
import pytest
import torch

from tests.helpers.train import assert_grads_close, grads_of, one_by_one
from vlmdata_pipelines.attention import available_backends
from vlmdata_pipelines.model import TinyVLM, VLMConfig
from vlmdata_pipelines.packs import synthetic_pack

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _backend_or_skip(backend: str) -> None:
    if backend == "reference":
        return  # always available: the test asserts for it on every machine
    if backend not in available_backends(DEVICE, torch.bfloat16):
        pytest.skip(f"attention backend {backend!r} is not importable/usable on {DEVICE}")


def _check_pack(model: TinyVLM, pack: dict) -> None:
    """fp32 reference backend: tight tolerance; CUDA kernels run in bf16: loose tolerance."""
    tight = model.cfg.attn_backend == "reference"
    if not tight:
        model = model.to(DEVICE, torch.bfloat16)
    singles = one_by_one(model, pack)
    assert len(singles) == len(pack["cu_seqlens"]) - 1 >= 2
    loss_pack, n_pack, g_pack = grads_of(model, [pack])
    loss_one, n_one, g_one = grads_of(model, singles)
    assert n_pack == n_one > 0
    tol = 1e-5 if tight else 2e-2
    torch.testing.assert_close(loss_pack.float().cpu(), loss_one.float().cpu(), rtol=tol, atol=tol)
    assert_grads_close({k: v.float().cpu() for k, v in g_pack.items()},
                       {k: v.float().cpu() for k, v in g_one.items()}, rel=tol if tight else 5e-2)


@pytest.mark.parametrize("backend", ["reference", "torch", "flash"])
def test_synthetic_pack_equals_samples_one_by_one(backend):
    _backend_or_skip(backend)
    torch.manual_seed(0)
    cfg = VLMConfig.tiny(attn_backend=backend)
    model = TinyVLM(cfg)
    pack = synthetic_pack([40, 25, 60, 90, 7], [1, 0, 2, 1, 0], cfg, image_size=28, seed=1)
    _check_pack(model, pack)


def test_contamination_would_be_detected():
    """Treating the pack as one sequence (cross-sample attention) changes the loss: the check has teeth."""
    torch.manual_seed(0)
    cfg = VLMConfig.tiny()
    model = TinyVLM(cfg)
    pack = synthetic_pack([40, 25, 60], [1, 0, 2], cfg, image_size=28, seed=1)
    leaky = dict(pack, cu_seqlens=torch.tensor([0, int(pack["cu_seqlens"][-1])], dtype=torch.int32))
    loss_ok, _, _ = grads_of(model, [pack])
    loss_leaky, _, _ = grads_of(model, [leaky])
    assert abs(float(loss_ok) - float(loss_leaky)) > 1e-3


def test_image_token_mismatch_is_a_clear_error():
    cfg = VLMConfig.tiny()
    model = TinyVLM(cfg)
    pack = synthetic_pack([40, 25], [1, 1], cfg, image_size=28, seed=1)
    pack["pixel_values"] = pack["pixel_values"][:1]
    with pytest.raises(ValueError, match="image tokens but its images give"):
        model(pack)


def test_pack_without_images_touches_every_parameter():
    """DDP needs the same graph on every rank: a text-only or empty pack still reaches all parameters."""
    cfg = VLMConfig.tiny()
    model = TinyVLM(cfg)
    text_only = synthetic_pack([30, 20], [0, 0], cfg, image_size=28, seed=2)
    empty = {"input_ids": torch.zeros(0, dtype=torch.long), "labels": torch.zeros(0, dtype=torch.long),
             "position_ids": torch.zeros(0, dtype=torch.long), "cu_seqlens": torch.zeros(1, dtype=torch.int32),
             "max_seqlen": 0}
    for pack, expect_tokens in ((text_only, True), (empty, False)):
        model.zero_grad(set_to_none=True)
        loss, n = model(pack)
        loss.backward()
        assert (int(n) > 0) == expect_tokens
        assert all(p.grad is not None for p in model.parameters())
    assert float(loss.detach()) == 0.0


@pytest.mark.parametrize("merge", [1, 2])
def test_dynamic_patch_layout_matches_fixed_pixels(merge):
    """The same images given as vlmdata's flattened patches (decode.patches) or as [n,3,S,S] give the same loss."""
    from vlmdata.decode import pack_patches

    torch.manual_seed(0)
    cfg = VLMConfig.tiny(merge=merge)
    model = TinyVLM(cfg)
    fixed = synthetic_pack([60, 30, 90], [1, 0, 2], cfg, image_size=56, seed=3)
    images = [im.permute(1, 2, 0).numpy() for im in fixed["pixel_values"]]
    patches, grid, cu = pack_patches(images, cfg.patch, merge)
    dynamic = dict(fixed, pixel_values=torch.from_numpy(patches), image_grid=torch.from_numpy(grid),
                   vision_cu_seqlens=torch.from_numpy(cu))
    loss_fixed, n_fixed, g_fixed = grads_of(model, [fixed])
    loss_dyn, n_dyn, g_dyn = grads_of(model, [dynamic])
    assert n_fixed == n_dyn
    torch.testing.assert_close(loss_fixed, loss_dyn, rtol=1e-6, atol=1e-6)
    assert_grads_close(g_fixed, g_dyn)
    _check_pack(model, dynamic)  # and the dynamic pack splits into its samples exactly


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    from tests.helpers.train import make_dataset

    return make_dataset(str(tmp_path_factory.mktemp("corpus")), samples=60, seed=1)


@pytest.mark.parametrize("image_size", [28, "dynamic"])
@pytest.mark.parametrize("backend", ["reference", "torch", "flash"])
def test_dataset_packs_equal_samples_one_by_one(dataset, image_size, backend):
    """Packs made by VLMDataset (fixed and dynamic resolution) split into their samples exactly."""
    _backend_or_skip(backend)
    from tests.helpers.train import load_packs
    from vlmdata_pipelines.data import DataOptions, model_fields_for

    fields = model_fields_for(DataOptions(data=dataset, image_size=image_size))
    torch.manual_seed(0)
    model = TinyVLM(VLMConfig.tiny(attn_backend=backend, **fields))
    packs = [p for p in load_packs(dataset, 6, max_tokens=512, image_size=image_size)
             if len(p["sample_keys"]) >= 2]
    assert len(packs) >= 2
    if image_size == "dynamic":
        assert packs[0]["pixel_values"].dim() == 2 and "vision_cu_seqlens" in packs[0]
    for pack in packs[:2]:
        _check_pack(model, pack)
