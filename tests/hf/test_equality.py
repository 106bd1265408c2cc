"""No cross-contamination, with the real models: a packed batch's loss and gradients equal the sum over its
samples run one by one (fp32, 1e-5), with images, for a tiny Qwen2-VL and a tiny LLaVA; wrong boundaries fail.

The packed batch is vlmdata's (processor token ids, vlmdata-decoded pixels, collate, the output adapter); each
sample alone is the plain Hugging Face path: the processor's own tensors for that sample, the model computing
its own positions. Both losses are sums over the same label tokens (`num_items_in_batch` = that count).
"""
from __future__ import annotations

import pytest
import torch

from tests.helpers.hf import (
    label_count,
    llava_processor,
    make_conversations,
    packed_inputs,
    qwen_processor,
    references,
    run_one_by_one,
    run_packed,
    shift_one_boundary,
    tiny_model,
    write_llava_folder,
    write_qwen_folder,
)
from tests.helpers.train import assert_grads_close
from vlmdata.hf import ModelSpec, block_causal_mask, mrope_position_ids

TOL = 1e-5


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    out = {}
    proc = qwen_processor()
    spec = ModelSpec.from_folder(write_qwen_folder(str(tmp_path_factory.mktemp("qwen")), proc))
    refs = references(make_conversations(5, seed=21, max_images=2), proc, "qwen2-vl", spec.image_policy())
    out["qwen2-vl"] = (spec, refs)
    proc = llava_processor()
    spec = ModelSpec.from_folder(write_llava_folder(str(tmp_path_factory.mktemp("llava")), proc))
    refs = references(make_conversations(3, seed=22, max_images=1, max_words=25), proc, "llava", spec.image_policy())
    out["llava"] = (spec, refs)
    return out


# eager differs from sdpa only in taking an additive mask: checked on the smaller Qwen pack
CASES = [("qwen2-vl", "sdpa"), ("qwen2-vl", "eager"), ("qwen2-vl", "vlmdata_varlen"),
         ("llava", "sdpa"), ("llava", "vlmdata_varlen")]


@pytest.mark.parametrize("family,attn", CASES)
def test_packed_equals_sum_of_samples(families, tmp_path, family, attn):
    spec, refs = families[family]
    assert sum(len(r.decoded) for r in refs) >= 2 and len(refs) >= 3       # images, several samples
    folder = (write_qwen_folder if family != "llava" else write_llava_folder)(str(tmp_path))
    model = tiny_model(folder, attn=attn)
    count = label_count(refs)
    packed_loss, packed_grads = run_packed(model, packed_inputs(spec, refs, attn), count)
    alone_loss, alone_grads = run_one_by_one(model, refs, count)
    assert abs(packed_loss - alone_loss) <= TOL * max(1.0, abs(alone_loss))
    assert_grads_close(packed_grads, alone_grads, rel=TOL)
    assert any(n.startswith(("model.visual", "model.vision_tower")) for n in packed_grads)   # images trained


def _whole_pack_positions(spec, inputs: dict) -> torch.Tensor:
    """Positions of the pack taken as one sequence (what a collator that ignores boundaries computes)."""
    ids = inputs["input_ids"][0]
    if spec.is_qwen:
        whole = torch.tensor([0, len(ids)])
        return mrope_position_ids(ids, whole, inputs["image_grid_thw"], spec.image_token_id, spec.merge_size)[:, None]
    return torch.arange(len(ids))[None]


@pytest.mark.parametrize("family", ["qwen2-vl", "llava"])
def test_wrong_boundaries_are_caught(families, tmp_path, family):
    spec, refs = families[family]
    folder = (write_qwen_folder if family != "llava" else write_llava_folder)(str(tmp_path))
    count = label_count(refs)
    model = tiny_model(folder, attn="sdpa")
    alone_loss, alone_grads = run_one_by_one(model, refs, count)
    good = packed_inputs(spec, refs, "sdpa")
    no_mask = {k: v for k, v in good.items() if k != "attention_mask"}      # sdpa ignores cu_seq_lens
    shifted = shift_one_boundary(good)
    shifted["attention_mask"] = block_causal_mask(shifted["cu_seq_lens_q"], good["input_ids"].shape[1])
    # (Positions alone are not boundaries: RoPE sees only position differences, so whole-pack positions under
    # the right mask give the same loss; without mask and restarts nothing separates the samples.)
    wrong = {"a boundary moved into the next sample": shifted,
             "no mask, positions over the whole pack": dict(no_mask, position_ids=_whole_pack_positions(spec, good))}
    if family != "llava":
        # Qwen's 3-row positions hide the restarts from transformers' packed-sequence detection: without the
        # mask the samples attend to each other. (LLaVA's Llama finds the restarts in its 1-row position_ids
        # when no cache is used, and masks by itself.)
        wrong["no mask"] = no_mask
    varlen = tiny_model(folder, attn="vlmdata_varlen")
    wrong_varlen = shift_one_boundary(packed_inputs(spec, refs, "vlmdata_varlen"))
    for name, inputs in [*wrong.items(), ("vlmdata_varlen, shifted boundary", wrong_varlen)]:
        loss, grads = run_packed(varlen if name.startswith("vlmdata_varlen") else model, inputs, count)
        assert abs(loss - alone_loss) > TOL * max(1.0, abs(alone_loss)), name   # the equality check fails
        # (differences seen: 4e-4 to 2e-3 on a randomly initialised model; the tolerance is 1e-5 relative)
        with pytest.raises(AssertionError):
            assert_grads_close(grads, alone_grads, rel=TOL)
