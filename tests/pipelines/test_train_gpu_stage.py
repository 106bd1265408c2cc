"""GPU decode wired into training, checked on DALI's CPU backend: packs decoded in the training process by
DaliGpuStage (floating, already normalised pixels) give the model the same loss and gradients as packs decoded
to uint8 in the workers (same DALI decoder), and the trainer runs the deferred+staged source; on CPU the
trainer's source keeps worker decode.

Tolerances (measured on the tiny model: float32 loss 2e-8 relative, gradients 1.5e-6 of each parameter's
largest; bf16 loss 5e-7, gradients 3.8e-3): the float32 stage matches worker decode + model normalisation to
~1e-6 in pixels (both run DALI's CPU decode and resize), so the loss must agree to rtol 1e-5 and every
gradient to 1e-4 of its parameter's largest. The bf16 stage (the GPU default) rounds each normalised pixel to
8 mantissa bits (<= 0.4 % relative): loss rtol 1e-3, gradients 2e-2 there. The vision gradients depend
linearly on the pixels, so normalising twice (or not at all) would fail these checks.
"""
from dataclasses import replace

import pytest
import torch

from tests.helpers.train import assert_grads_close, grads_of, make_dataset
from vlmdata.decode.dali import DaliGpuStage, GpuStageOptions
from vlmdata.loading import DatasetOptions, VLMDataset
from vlmdata_pipelines.data import (
    DataOptions,
    DatasetSource,
    StagedSource,
    check_normalisation,
    gpu_stage_for,
    make_batch_source,
    model_fields_for,
    staged_dataset_source,
)
from vlmdata_pipelines.model import (
    PIXEL_MEAN,
    PIXEL_STD,
    TinyVLM,
    VLMConfig,
    patch_sequence,
    pixels_are_normalised,
)
from vlmdata_pipelines.train import TrainConfig, train

SIZES = {"fixed": 56, "dynamic": "dynamic"}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return make_dataset(str(tmp_path_factory.mktemp("corpus")), samples=24, seed=5, shard_size=12)


def _opts(dataset: str, size) -> DataOptions:
    return DataOptions(data=dataset, max_tokens=768, image_size=size, num_workers=0, decoder="dali")


def _packs(opts: DataOptions, defer: bool, n: int) -> list[dict]:
    ds = VLMDataset(opts.data, seed=opts.seed, max_tokens=opts.max_tokens, image_size=opts.policy(), rank=0,
                    world_size=1, decoder=opts.decoder, options=DatasetOptions(defer_decode=defer))
    ds.set_epoch(0)
    out = []
    for batch in ds:
        if batch.get("sample_keys"):
            out.append(batch)
        if len(out) == n:
            break
    return out


def _stage(opts: DataOptions, dtype: str, image_token_id: int) -> DaliGpuStage:
    return DaliGpuStage(opts.policy(), GpuStageOptions(device="cpu", dtype=dtype, image_token_id=image_token_id))


@pytest.mark.parametrize("kind", sorted(SIZES))
def test_stage_batches_give_the_uint8_loss_and_gradients(dataset, kind):
    opts = _opts(dataset, SIZES[kind])
    cfg = VLMConfig.tiny(**model_fields_for(opts))
    torch.manual_seed(0)
    model = TinyVLM(cfg)
    worker = _packs(opts, defer=False, n=3)
    deferred = _packs(opts, defer=True, n=3)
    assert sum(int(b["pixel_values"].shape[0]) for b in worker) > 0, "the packs must hold images"
    assert all(b["pixel_values"].dtype == torch.uint8 for b in worker)
    assert all("pixel_values" not in b and "image_bytes" in b for b in deferred)

    staged32 = [_stage(opts, "float32", cfg.image_token_id)(dict(b)) for b in deferred]
    assert all(pixels_are_normalised(b["pixel_values"]) for b in staged32)
    loss_u8, count_u8, grads_u8 = grads_of(model, worker)
    loss_32, count_32, grads_32 = grads_of(model, staged32)
    assert count_32 == count_u8 > 0
    torch.testing.assert_close(loss_32, loss_u8, rtol=1e-5, atol=0)
    assert_grads_close(grads_u8, grads_32, rel=1e-4)

    staged16 = [_stage(opts, "bfloat16", cfg.image_token_id)(dict(b)) for b in deferred]
    assert all(b["pixel_values"].dtype == torch.bfloat16 for b in staged16)
    loss_16, count_16, grads_16 = grads_of(model, staged16)
    assert count_16 == count_u8
    torch.testing.assert_close(loss_16, loss_u8, rtol=1e-3, atol=0)
    assert_grads_close(grads_u8, grads_16, rel=2e-2)


def test_the_dtype_decides_whether_the_model_normalises(dataset):
    """uint8 pixels are normalised by the model; floating ones are used as they are (never twice)."""
    opts = _opts(dataset, 56)
    cfg = VLMConfig.tiny(**model_fields_for(opts))
    model = TinyVLM(cfg)
    (batch,) = _packs(opts, defer=False, n=1)
    pixels = batch["pixel_values"]
    mean = torch.tensor(PIXEL_MEAN).reshape(1, 3, 1, 1)
    std = torch.tensor(PIXEL_STD).reshape(1, 3, 1, 1)
    with torch.no_grad():
        def encode(pv):
            return model.vision(patch_sequence({**batch, "pixel_values": pv}, cfg.patch, cfg.merge))
        ref = encode(pixels)
        torch.testing.assert_close(encode((pixels.float() / 255 - mean) / std), ref, rtol=1e-5, atol=1e-5)
        assert float((encode(pixels.float()) - ref).abs().max()) > 0.1  # 0-255 floats are not normalised again
    with pytest.raises(TypeError, match="uint8 .* or floating"):
        model({**batch, "pixel_values": pixels.to(torch.int32)})


def test_trainer_runs_the_staged_source(dataset, tmp_path):
    """Deferred decode + the stage in the training process == worker decode, step by step; state is kept."""
    opts = _opts(dataset, 56)
    model_cfg = VLMConfig.tiny(**model_fields_for(opts))
    sources = {}

    def make(name, stage):
        def factory(info):
            sources[name] = staged_dataset_source(opts, info.rank, info.world_size, stage)
            return sources[name]
        return factory

    steps = 4
    plain = train(TrainConfig(steps=steps, out_dir=str(tmp_path / "plain")), model_cfg, make("plain", None))
    staged = train(TrainConfig(steps=steps, out_dir=str(tmp_path / "staged")), model_cfg,
                   make("staged", _stage(opts, "float32", model_cfg.image_token_id)))
    assert isinstance(sources["staged"], StagedSource) and isinstance(sources["plain"], DatasetSource)
    assert sources["staged"].source.dataset.options.defer_decode
    assert plain["decode_stage"] is None and staged["decode_stage"] == "DaliGpuStage"
    assert staged["stage_seconds"] > 0 and plain["stage_seconds"] == 0
    assert staged["images"] == plain["images"] > 0
    torch.testing.assert_close(torch.tensor(staged["losses"]), torch.tensor(plain["losses"]), rtol=1e-4, atol=0)
    assert sources["staged"].state_dict() == sources["plain"].state_dict()


def test_cpu_keeps_worker_decode_and_cuda_uses_the_stage(dataset, monkeypatch):
    opts = _opts(dataset, 56)
    image_id = VLMConfig.tiny(**model_fields_for(opts)).image_token_id
    assert gpu_stage_for(opts, torch.device("cpu"), image_id) is None
    source = make_batch_source(opts, 0, 1, torch.device("cpu"), image_id)
    assert isinstance(source, DatasetSource) and not source.dataset.options.defer_decode

    # the CUDA branch, with make_gpu_stage answering as it would on a GPU machine (a CPU-backend stage here)
    calls = []

    def fake_make_gpu_stage(name, policy, device_id=None, image_token_id=None):
        calls.append((name, device_id, image_token_id))
        return _stage(opts, "bfloat16", image_token_id)

    monkeypatch.setattr("vlmdata.decode.choose.make_gpu_stage", fake_make_gpu_stage)
    stage = gpu_stage_for(opts, torch.device("cuda", 1), image_id)
    assert isinstance(stage, DaliGpuStage) and calls == [("dali", 1, image_id)]

    # "off" never stages; "dali-cpu" stages on DALI's CPU backend on any device; a typo is an error
    assert gpu_stage_for(replace(opts, decode_stage="off"), torch.device("cuda", 0), image_id) is None
    cpu_stage = gpu_stage_for(replace(opts, decode_stage="dali-cpu"), torch.device("cpu"), image_id)
    assert isinstance(cpu_stage, DaliGpuStage) and cpu_stage.options.device == "cpu"
    assert cpu_stage.options.image_token_id == image_id
    with pytest.raises(ValueError, match="unknown decode stage"):
        gpu_stage_for(replace(opts, decode_stage="gpu"), torch.device("cpu"), image_id)

    # a stage that normalises otherwise than the model is refused with a clear error
    with pytest.raises(ValueError, match="CLIP"):
        check_normalisation((127.5, 127.5, 127.5), (127.5, 127.5, 127.5))
