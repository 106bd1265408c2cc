"""No exception raised while decoding one image ends an epoch: Pillow's many exception types are counted by
reason, an unexpected type under its own reason ("decoder_exception"), logged once with its traceback."""
from __future__ import annotations

import json
import logging
import struct
import sys

import PIL
import pytest
from PIL import Image

from tests.helpers.image_zoo import zoo
from tests.helpers.shards import shard
from vlmdata.decode import PillowDecoder, TurboDecoder
from vlmdata.decode.dali import DaliCpuDecoder
from vlmdata.ingest import check_image
from vlmdata.loading import VLMDataset

RAISED = [(ImportError("no LittleCMS"), "decoder_exception"), (MemoryError(), "decoder_exception"),
          (TypeError("bad tile"), "decoder_exception"), (KeyError("mode"), "decoder_exception"),
          (RecursionError(), "decoder_exception"), (struct.error("unpack"), "corrupt_image"),
          (IndexError("tile"), "corrupt_image"), (ZeroDivisionError(), "corrupt_image"),
          (SyntaxError("broken PNG"), "corrupt_image"), (Image.DecompressionBombError("big"), "image_too_large")]


def without_littlecms(monkeypatch) -> None:
    """Pillow as built without LittleCMS: converting a LAB image to RGB raises ImportError (the audit's case)."""
    monkeypatch.delitem(sys.modules, "PIL.ImageCms", raising=False)
    monkeypatch.delattr(PIL, "ImageCms", raising=False)
    monkeypatch.delattr(PIL, "_imagingcms", raising=False)
    monkeypatch.setitem(sys.modules, "PIL._imagingcms", None)


def test_lab_tiff_without_littlecms_raises_inside_pillow(monkeypatch):
    """The reproduction itself: stock decoding code dies on this image with ImportError."""
    import io

    data = zoo()["lab_tiff"]
    without_littlecms(monkeypatch)
    with pytest.raises(ImportError):
        Image.open(io.BytesIO(data)).convert("RGB")


@pytest.mark.parametrize("exc, reason", RAISED, ids=[type(e).__name__ for e, _ in RAISED])
@pytest.mark.parametrize("decoder", [PillowDecoder, TurboDecoder, DaliCpuDecoder])
def test_every_exception_type_is_counted_never_raised(monkeypatch, decoder, exc, reason):
    def explode(self, *args, **kwargs):
        raise exc

    data = zoo()["palette_gif_trns"]   # a palette GIF: every decoder (DALI: its CPU fallback) converts it in Pillow
    good = zoo()["jpeg"]
    sizes = [check_image(data, 1 << 30)[1:], check_image(good, 1 << 30)[1:]]
    dec = decoder()
    monkeypatch.setattr(Image.Image, "convert", explode)   # inside every decoder's Pillow path
    out = dec.decode([data, good], sizes, PillowDecoderPolicy)
    assert out[0] is None and out[1] is not None
    assert dec.pop_errors() == {reason: 1}


class _Native:
    @staticmethod
    def target_size(w, h):
        return w, h


PillowDecoderPolicy = _Native()


def test_an_unexpected_type_is_logged_once(monkeypatch, caplog):
    data = zoo()["lab_tiff"]
    without_littlecms(monkeypatch)
    dec = PillowDecoder()
    with caplog.at_level(logging.WARNING, logger="vlmdata.decode.failures"):
        for _ in range(3):
            assert dec.decode_one(data, 64, 48) is None
    assert dec.pop_errors() == {"decoder_exception": 3}
    records = [r for r in caplog.records if "ImportError" in r.getMessage()]
    assert len(records) <= 1 and all(r.exc_info for r in records)   # once per process (0: logged earlier)


@pytest.mark.parametrize("decoder", ["pillow", "turbo", "dali"])
def test_one_image_never_ends_the_epoch(tmp_path, monkeypatch, decoder):
    """A dataset holding a LAB TIFF, read by a Pillow without LittleCMS: every other sample arrives."""
    names = ["jpeg", "lab_tiff", "webp_lossy", "palette_gif_trns", "png16_grey", "jpeg_exif_6", "cmyk_jpeg"]
    (tmp_path / "imgs").mkdir()
    rows = []
    for n in names:
        ext = {"lab_tiff": "tif", "webp_lossy": "webp", "palette_gif_trns": "gif", "png16_grey": "png"}.get(n, "jpg")
        (tmp_path / "imgs" / f"{n}.{ext}").write_bytes(zoo()[n])
        rows.append({"id": n, "image": f"imgs/{n}.{ext}", "caption": f"the {n} image"})
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    shard(tmp_path / "d.jsonl", tmp_path / "out")
    without_littlecms(monkeypatch)
    ds = VLMDataset(str(tmp_path / "out"), seed=0, max_tokens=1024, image_size=28, rank=0, world_size=1,
                    decoder=decoder)
    batches = list(ds)
    keys = sorted(k for b in batches for k in b["sample_keys"])
    skipped = {}
    for b in batches:
        for reason, count in b["stats"]["skipped"].items():
            skipped[reason] = skipped.get(reason, 0) + count
    assert keys == sorted(set(names) - {"lab_tiff"})
    assert skipped == {"decoder_exception": 1}
