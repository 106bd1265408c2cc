"""The generic family's rescale + normalisation table (`decode.tiling.processor_scale`) against transformers' own
steps, bit for bit, and where the processor runs its own steps instead: an image processor that overrides them,
or one whose pixels the table does not reproduce."""
from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

import vlmdata.decode.tiling.processor_scale as processor_scale
from vlmdata.testing import llava_next_folder
from vlmdata.text.families import load_family


@pytest.mark.parametrize("factor, mean, std", [(1 / 255, (0.48145466, 0.4578275, 0.40821073),
                                                (0.26862954, 0.26130258, 0.27577711)),
                                               (1 / 255, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
                                               (1 / 127.5, (1.0, 0.0, -0.25), (1.0, 3.0, 0.7))])
def test_the_table_is_transformers_rescale_and_normalize_bit_for_bit(factor, mean, std):
    from transformers.image_transforms import normalize, rescale

    every = np.arange(256, dtype=np.uint8)
    pixels = np.stack([np.roll(every, 7 * c) for c in range(3)]).reshape(3, 16, 16)[None, None]   # [1, 1, 3, H, W]
    pixels = np.concatenate([pixels, pixels[..., ::-1, :]], axis=1)                             # 2 patches
    want = np.stack([normalize(rescale(p, factor), mean, std, input_data_format="channels_first")
                     for p in pixels.reshape(-1, 3, 16, 16)]).reshape(pixels.shape)
    got = processor_scale.apply_table(pixels, processor_scale.scale_table(factor, mean, std))
    assert got.dtype == np.float32 and got.shape == pixels.shape
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.fixture
def policy(tmp_path):
    processor_scale._TABLES.clear()
    yield load_family(str(llava_next_folder(tmp_path / "model", side=56)), family="generic").vision.image_policy()
    processor_scale._TABLES.clear()


def _equal_to_the_processor(policy) -> None:
    image = Image.fromarray(np.random.default_rng(3).integers(0, 256, (90, 170, 3), dtype=np.uint8))
    got, (_, want) = policy.pixels(image, 3), policy.run(image)
    assert got.keys() == want.keys() and all(np.array_equal(got[k], want[k]) for k in want)


def test_a_plain_pil_image_processor_gets_the_table(policy):
    assert processor_scale.table_for(policy) is not None
    _equal_to_the_processor(policy)


def test_an_overridden_normalize_runs_the_processors_own_steps(policy, monkeypatch):
    ip = type(policy.processor().image_processor)
    shifted = lambda self, image, mean, std, **kw: super(ip, self).normalize(image, mean, std) + 1   # noqa: E731
    monkeypatch.setattr(ip, "normalize", shifted, raising=False)
    processor_scale._TABLES.clear()
    assert processor_scale.table_for(policy) is None
    _equal_to_the_processor(policy)


def test_a_table_that_does_not_give_the_processors_pixels_is_not_used(policy, monkeypatch):
    monkeypatch.setattr(processor_scale, "scale_table", lambda factor, mean, std: np.zeros((3, 256), np.float32))
    processor_scale._TABLES.clear()
    assert processor_scale.table_for(policy) is None
    _equal_to_the_processor(policy)
