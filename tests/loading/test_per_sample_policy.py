"""Per-sample tiled policies (decode.tiled `per_sample`, issue 21's LLaVA-OneVision): an image's tokens and tiles
depend on how many images its sample holds. The planner, both pack paths and truncation all tell the policy that
count, so the planned length is the built one, and a truncated sample never keeps one image of several."""
from __future__ import annotations

import numpy as np
import pytest

from tests.loading.test_pack_build import TOK, SampleRecord, cfg, same, slow
from vlmdata.decode import make_policy, sample_args
from vlmdata.loading import IGNORE, pack_build, prepare_sample
from vlmdata.metrics import StatsDelta
from vlmdata.plan import sample_lengths
from vlmdata.text import encode_conversation

POLICY = make_policy({"kind": "llava_onevision", "tile": 28, "patch": 14, "side": 2, "base": 4, "max_patches": 9,
                      "pinpoints": [[28 * a, 28 * b] for a in range(1, 5) for b in range(1, 5)],
                      "image_token_id": TOK.special.image})


def record(key: str, sizes: list[tuple[int, int]], words: int = 5) -> tuple[SampleRecord, list[np.ndarray]]:
    k = len(sizes)
    tokens = encode_conversation(TOK, [("user", "<image>" * k + "Q?"), ("assistant", " ".join(["w"] * words))], k)
    tiles = POLICY.tiles(np.asarray([w for w, _ in sizes]), np.asarray([h for _, h in sizes]), [k] * k) if k else []
    images = [np.full((int(n), 28, 28, 3), j, np.uint8) for j, n in enumerate(tiles)]
    return SampleRecord(key=key, tokens=tokens, images=images, sizes=sizes), images


CORPUS = [[(300, 200)], [(50, 400), (90, 90)], [], [(1000, 30), (64, 64), (640, 480)], [(28, 28)]]


def test_the_count_is_told_in_both_pack_paths_and_the_plan():
    recs, ims = zip(*(record(f"s{i}", sizes) for i, sizes in enumerate(CORPUS)))
    c = cfg(POLICY)
    fast = pack_build._fast_pack(list(recs), list(ims), c, StatsDelta())
    assert fast is not None
    same(fast, slow(recs, ims, c))
    cu, ids = fast["cu_seqlens"].tolist(), fast["input_ids"].numpy()
    alone = int(POLICY.tokens([300], [200])[0])
    want = [alone, 2 * 5, 0, 3 * 5, int(POLICY.tokens([28], [28])[0])]      # several: 2 x 2 features + a newline
    assert [int((ids[a:b] == TOK.special.image).sum()) for a, b in zip(cu[:-1], cu[1:])] == want
    assert alone > 5 and fast["image_tiles"].tolist() == [int(POLICY.tiles([300], [200])[0]), 1, 1, 1, 1, 1, 2]
    sizes = [sz for s in CORPUS for sz in s]
    cols = {"n_images": np.asarray([len(s) for s in CORPUS]), "image_start": np.cumsum([0] + [len(s) for s in CORPUS]),
            "width": np.asarray([w for w, _ in sizes]), "height": np.asarray([h for _, h in sizes]),
            "text_tokens": np.asarray([r.tokens.shape[1] - len(r.sizes) for r in recs])}
    planned, image_tokens = sample_lengths(cols, np.arange(len(CORPUS)), POLICY)
    assert planned.tolist() == np.diff(cu).tolist() and image_tokens.tolist() == want


@pytest.mark.parametrize("fit, kept", [(1, 0), (2, 2), (3, 3)])
def test_a_truncated_sample_never_keeps_one_image_of_several(fit, kept):
    """Cut after `fit` of three images: one alone would be laid out as a lone image, so it goes too."""
    rec, ims = record("t", [(64, 64), (80, 50), (50, 80)], words=40)
    is_img = rec.tokens[0] == TOK.special.image
    first = int(np.flatnonzero(is_img)[0])
    budget = first + 5 * fit + (40 if fit == 3 else 0)
    sample, truncated = prepare_sample("t", rec.tokens, ims, rec.sizes, cfg(POLICY, max_tokens=budget))
    assert truncated and len(sample.images) == kept and len(sample.ids) <= budget
    assert int((sample.ids == TOK.special.image).sum()) == 5 * kept
    assert (sample.labels[sample.ids == TOK.special.image] == IGNORE).all()


def test_sample_args_only_for_per_sample_policies():
    from vlmdata.decode import FixedPolicy

    assert sample_args(POLICY, [2, 2]) == ([2, 2],) and sample_args(POLICY, lambda: [1]) == ([1],)
    assert sample_args(FixedPolicy(56, 14), lambda: pytest.fail("not computed")) == ()
