"""DaliGpuStage run on DALI's CPU backend: deferred packs become normalised pixel tensors in the
PackedBatch layout, identical to decoding in the workers then normalising; a corrupt image costs
its sample's loss and is counted."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.decode import shard_corpus, truncated
from vlmdata.decode import DynamicPolicy, FixedPolicy, flatten_patches
from vlmdata.decode.dali import DaliGpuStage, GpuStageOptions, Normalization, image_owners, patchify
from vlmdata.loading import DatasetOptions, VLMDataset
from vlmdata.text import ByteTokenizer

POLICIES = {"fixed": FixedPolicy(112), "dynamic": DynamicPolicy(patch=14, merge=2, max_pixels=224 * 224)}
NORM = Normalization()
IMAGE_ID = ByteTokenizer().special.image   # the tokenizer `vlmdata shard` uses by default


@pytest.fixture(scope="module")
def dataset(small_llava_corpus, tmp_path_factory):
    return str(shard_corpus(small_llava_corpus, tmp_path_factory.mktemp("ds") / "ds"))


def packs(dataset, policy, defer: bool, n: int = 4) -> list[dict]:
    ds = VLMDataset(dataset, seed=3, max_tokens=4096, image_size=policy, rank=0, world_size=1,
                    decoder="dali", options=DatasetOptions(defer_decode=defer))
    out = []
    for batch in ds:
        out.append(batch)
        if len(out) == n:
            break
    return out


def normalise(pixels: torch.Tensor, channel_dim: int) -> torch.Tensor:
    shape = [1] * pixels.dim()
    shape[channel_dim] = 3
    mean = torch.tensor(NORM.mean).reshape(shape)
    std = torch.tensor(NORM.std).reshape(shape)
    return (pixels.float() - mean) / std


@pytest.mark.parametrize("merge", [1, 2])
def test_patchify_matches_the_collate_layout(merge):
    rng = np.random.default_rng(merge)
    img = rng.integers(0, 256, (56, 84, 3), dtype=np.uint8)
    ours = patchify(torch.from_numpy(img).permute(2, 0, 1), 14, merge)
    np.testing.assert_array_equal(ours.numpy(), flatten_patches(img, 14, merge))


@pytest.mark.parametrize("kind", sorted(POLICIES))
def test_stage_equals_worker_decode_then_normalise(dataset, kind):
    policy = POLICIES[kind]
    stage = DaliGpuStage(policy, GpuStageOptions(device="cpu", dtype="float32"))
    for deferred, ref in zip(packs(dataset, policy, True), packs(dataset, policy, False)):
        assert "pixel_values" not in deferred and deferred["image_sizes"].dtype == torch.int32
        assert deferred["sample_keys"] == ref["sample_keys"]
        got = stage(deferred)
        assert got["pixel_values"].dtype == torch.float32
        assert got["pixel_values"].shape == ref["pixel_values"].shape
        if kind == "fixed":
            expected = normalise(ref["pixel_values"], 1)
        else:
            # uint8 patch rows are (C, py, px): normalise per channel block
            rows = ref["pixel_values"].reshape(len(ref["pixel_values"]), 3, -1)
            expected = normalise(rows, 1).reshape(len(rows), -1)
            np.testing.assert_array_equal(got["image_grid"].numpy(), ref["image_grid"].numpy())
            np.testing.assert_array_equal(got["vision_cu_seqlens"].numpy(), ref["vision_cu_seqlens"].numpy())
        torch.testing.assert_close(got["pixel_values"], expected, atol=1e-4, rtol=1e-5)
        assert "bad_samples" not in got


def test_bf16_output(dataset):
    (batch,) = packs(dataset, POLICIES["fixed"], True, n=1)
    got = DaliGpuStage(POLICIES["fixed"], GpuStageOptions(device="cpu"))(batch)
    assert got["pixel_values"].dtype == torch.bfloat16
    assert got["pixel_values"].shape[1:] == (3, 112, 112)


def _pack_with_images(dataset, policy):
    for batch in packs(dataset, policy, True, n=12):
        sizes = batch["image_sizes"]
        if len(sizes) >= 3 and len(batch["sample_keys"]) >= 2:
            return batch
    raise AssertionError("no pack with >= 3 images among the first 12")


@pytest.mark.parametrize("kind", sorted(POLICIES))
def test_corrupt_image_costs_its_sample(dataset, kind):
    policy = POLICIES[kind]
    batch = _pack_with_images(dataset, policy)
    image_id = IMAGE_ID
    owners = image_owners(batch, policy, batch["image_sizes"].numpy(), image_id)
    clean = DaliGpuStage(policy, GpuStageOptions(device="cpu", dtype="float32"))(
        {**batch, "image_bytes": list(batch["image_bytes"]), "labels": batch["labels"].clone(),
         "stats": {**batch["stats"], "skipped": dict(batch["stats"]["skipped"])}})
    bad = 1
    broken = dict(batch)
    broken["image_bytes"] = list(batch["image_bytes"])
    broken["image_bytes"][bad] = truncated(broken["image_bytes"][bad])
    broken["labels"] = batch["labels"].clone()
    samples_before = batch["stats"]["samples"]
    stage = DaliGpuStage(policy, GpuStageOptions(device="cpu", dtype="float32", image_token_id=image_id))
    got = stage(broken)
    owner = int(owners[bad])
    cu = got["cu_seqlens"].tolist()
    assert got["bad_samples"] == [got["sample_keys"][owner]]
    assert (got["labels"][cu[owner]:cu[owner + 1]] == -100).all()
    outside = torch.cat([got["labels"][:cu[owner]], got["labels"][cu[owner + 1]:]])
    torch.testing.assert_close(outside, torch.cat([batch["labels"][:cu[owner]], batch["labels"][cu[owner + 1]:]]))
    assert got["stats"]["skipped"]["corrupt_image"] == 1 and got["stats"]["samples"] == samples_before - 1
    assert got["pixel_values"].shape == clean["pixel_values"].shape
    if kind == "fixed":
        assert (got["pixel_values"][bad] == 0).all()
        keep = [i for i in range(len(owners)) if i != bad]
        torch.testing.assert_close(got["pixel_values"][keep], clean["pixel_values"][keep])
    else:
        vcu = got["vision_cu_seqlens"].tolist()
        assert (got["pixel_values"][vcu[bad]:vcu[bad + 1]] == 0).all()
        rest = torch.cat([got["pixel_values"][:vcu[bad]], got["pixel_values"][vcu[bad + 1]:]])
        ref = torch.cat([clean["pixel_values"][:vcu[bad]], clean["pixel_values"][vcu[bad + 1]:]])
        torch.testing.assert_close(rest, ref)


def test_image_owners_from_counts_and_from_tokens(dataset):
    policy = POLICIES["dynamic"]
    batch = _pack_with_images(dataset, policy)
    shipped = batch.pop("image_counts").numpy()     # deferred-decode packs carry them; test both ways
    sizes = batch["image_sizes"].numpy()
    from_tokens = image_owners(batch, policy, sizes, IMAGE_ID)
    counts = np.bincount(from_tokens, minlength=len(batch["sample_keys"]))
    np.testing.assert_array_equal(counts, shipped)
    from_counts = image_owners({**batch, "image_counts": counts}, policy, sizes, None)
    np.testing.assert_array_equal(from_tokens, from_counts)
    assert np.all(np.diff(from_tokens) >= 0)
    assert image_owners(batch, policy, sizes, None) is None
    with pytest.raises(ValueError, match="image tokens"):
        image_owners(batch, policy, sizes, ord("#"))  # a byte absent from the text, not the IMAGE id
