import numpy as np
import pytest

from vlmdata.decode import DynamicPolicy, FixedPolicy, make_policy


def test_fixed_policy_tokens():
    assert FixedPolicy(336, patch=14).tokens_per_image == 576
    assert FixedPolicy(336, patch=14, merge=2).tokens_per_image == 144
    assert FixedPolicy(448, patch=14, merge=2).tokens(np.array([5, 9]), np.array([7, 1])).tolist() == [256, 256]
    with pytest.raises(ValueError):
        FixedPolicy(300, patch=14)


@pytest.mark.parametrize("w,h", [(640, 480), (1344, 800), (64, 64), (3000, 100), (28, 28), (1, 1)])
def test_dynamic_policy_bounds_and_multiples(w, h):
    p = DynamicPolicy(patch=14, merge=2, min_pixels=56 * 56, max_pixels=448 * 448)
    tw, th = p.target_size(w, h)
    assert tw % 28 == 0 and th % 28 == 0
    assert p.min_pixels <= tw * th <= p.max_pixels
    rows, cols = p.grid(w, h)
    assert rows * cols // 4 == int(p.tokens(w, h))
    # aspect ratio is roughly preserved (rounding to 28 px steps)
    if min(w, h) >= 56 and max(w, h) / min(w, h) < 10:
        assert abs(np.log((tw / th) / (w / h))) < 0.25


def test_dynamic_policy_is_vectorised_consistently():
    p = DynamicPolicy()
    rng = np.random.default_rng(0)
    w = rng.integers(16, 2000, 200)
    h = rng.integers(16, 2000, 200)
    vec = p.tokens(w, h)
    one = [int(p.tokens(int(a), int(b))) for a, b in zip(w, h)]
    assert vec.tolist() == one


def test_make_policy():
    assert make_policy(224) == FixedPolicy(224)
    d = DynamicPolicy(max_pixels=1000 * 28 * 28)
    assert make_policy(d.to_dict()) == d
    with pytest.raises(ValueError, match="image policy"):
        make_policy("big")


def test_dynamic_policy_equals_transformers_smart_resize():
    """Every size, tiny sides and long strips included, gets Qwen2-VL's own smart_resize (the
    PIL image processor's function, importable without torchvision)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    policy = DynamicPolicy(patch=14, merge=2, min_pixels=56 * 56, max_pixels=448 * 448)
    rng = np.random.default_rng(0)
    sizes = [(1, 14), (14, 1), (14, 1000), (1000, 14), (13, 13), (27, 2000), (5, 900), (3000, 20)]
    sizes += [(int(w), int(h)) for w, h in rng.integers(1, 3000, size=(400, 2))]
    checked = 0
    for w, h in sizes:
        if max(w, h) / min(w, h) > 200:          # the processor refuses these
            continue
        want_h, want_w = smart_resize(h, w, factor=28, min_pixels=policy.min_pixels, max_pixels=policy.max_pixels)
        assert policy.target_size(w, h) == (want_w, want_h), (w, h)
        assert int(policy.tokens(np.array([w]), np.array([h]))[0]) == want_w * want_h // (28 * 28)
        checked += 1
    assert checked > 350
