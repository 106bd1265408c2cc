"""The DALI pipeline runner: clear input errors, signature sniffing, the GPU graph defined without a GPU, the
copied hook once per run."""
from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.decode import NOT_AN_IMAGE, corpus_images
from vlmdata.decode.dali import DaliConfig, DaliRunner, looks_like_image


@pytest.fixture(scope="module")
def images(small_llava_corpus):
    return corpus_images(small_llava_corpus, limit=24)


def test_runner_rejects_mismatched_inputs_clearly():
    runner = DaliRunner(DaliConfig())
    with pytest.raises(ValueError, match="2 images but 1 target sizes"):
        runner.run([b"a", b"b"], [(10, 10)], lambda t: t)
    with pytest.raises(ValueError, match="device"):
        DaliConfig(device="gpu")
    with pytest.raises(ValueError, match="device_id"):
        DaliConfig(device="mixed")


def test_signature_sniffing():
    assert looks_like_image(np.frombuffer(b"\xff\xd8\xff\xe0" + b"\0" * 10, np.uint8))
    assert looks_like_image(np.frombuffer(b"\x89PNG\r\n\x1a\n" + b"\0" * 4, np.uint8))
    assert not looks_like_image(np.frombuffer(NOT_AN_IMAGE, np.uint8))


def test_mixed_pipeline_graph_is_valid_without_a_gpu():
    """Defining the GPU ("mixed") graph checks operator placement (e.g. CPU-only argument inputs)."""
    from vlmdata.decode.dali import Normalization, define_pipeline

    for norm in (None, Normalization(), Normalization(dtype="float16")):
        pipe = define_pipeline(DaliConfig(device="mixed", device_id=0, normalize=norm))
        assert pipe is not None


def test_copied_hook_runs_once_per_pipeline_run(images):
    data, sizes = images
    calls = []
    runner = DaliRunner(DaliConfig(max_batch=4))
    runner.run(data[:10], [(28, 28)] * 10, lambda t: np.array(t), lambda: calls.append(1))
    assert len(calls) == 3 == runner.runs
