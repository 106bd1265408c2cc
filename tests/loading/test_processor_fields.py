"""The processor policy's pack fields: per-image outputs of different shapes concatenated along the first axis
and zero-padded on the others, also into a reused (dirty) buffer, as processors batch them."""
from __future__ import annotations

import numpy as np

from vlmdata.decode import make_policy


def test_outputs_of_several_shapes_are_concatenated_and_zero_padded():
    policy = make_policy({"kind": "processor", "folder": "/nowhere", "files": []})   # laying out needs no processor
    a = {"pixel_values": np.full((1, 3, 2, 4, 4), 1.5, np.float32), "image_sizes": np.array([[10, 20]])}
    b = {"pixel_values": np.full((1, 5, 2, 4, 4), -2.0, np.float32), "image_sizes": np.array([[30, 40]])}
    layout = policy.pixel_fields([a, b])
    assert layout == {"pixel_values": (np.dtype(np.float32), (2, 5, 2, 4, 4)),
                      "processor_image_sizes": (np.dtype(np.int64), (2, 2))}
    arrays = {k: np.full(shape, 7, dtype) for k, (dtype, shape) in layout.items()}     # a dirty reused buffer
    policy.fill_pixel_fields([a, b], arrays)
    assert (arrays["pixel_values"][0, :3] == 1.5).all() and (arrays["pixel_values"][0, 3:] == 0).all()
    assert (arrays["pixel_values"][1] == -2.0).all()
    assert arrays["processor_image_sizes"].tolist() == [[10, 20], [30, 40]]
    assert policy.pixel_fields([]) == {}
