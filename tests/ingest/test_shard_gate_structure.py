"""The default shard gate (`--verify structure`): a clean JPEG/PNG structure is kept without a decode, every odd
file gets the loader's decode, so a file Pillow decodes is never refused and a refused file never decodes.

The reference is stock Pillow (`pillow_decodes`: open, load, convert, under the loader's LOAD_TRUNCATED_IMAGES).
Fuzzed files (random bodies behind a valid header, cuts, flipped bytes) must get a verdict consistent with it:
refused => Pillow fails; kept => Pillow decodes, or the fast path proved the structure clean (what it does not
prove, the entropy-coded or zlib stream, is counted at load time).
"""
from __future__ import annotations

import io
import json
import zlib

import numpy as np
import pytest
from PIL import Image

from tests.helpers.image_zoo import zoo
from tests.helpers.shards import shard
from tests.ingest.test_shard_gate import corpus, picture, pillow_decodes
from vlmdata.decode import clean_structure
from vlmdata.errors import ConfigError, ImageProblem
from vlmdata.ingest import ImageOptions, check_image

MAX_PIXELS = ImageOptions().max_pixels    # the default limit


def kept(data: bytes, verify: str = "structure") -> bool:
    try:
        check_image(data, MAX_PIXELS, verify)
    except ImageProblem:
        return False
    return True


def _scan_start(jpeg: bytes) -> int:
    sos = jpeg.index(b"\xff\xda")
    return sos + 2 + int.from_bytes(jpeg[sos + 2:sos + 4], "big")


def bases() -> dict[str, bytes]:
    """Clean files of each structure the fast path proves: baseline, progressive, restart markers, CMYK, grey, PNG."""
    rgb = picture(96, 64)
    out = {}
    for name, img, kw in (("baseline", rgb, {}), ("progressive", rgb, {"progressive": True}),
                          ("restarts", rgb, {"restart_marker_blocks": 2}), ("cmyk", rgb.convert("CMYK"), {}),
                          ("grey", rgb.convert("L"), {})):
        buf = io.BytesIO()
        img.save(buf, "JPEG", quality=90, **kw)
        out[name] = buf.getvalue()
    for name, img in (("png", rgb), ("png_palette", rgb.quantize(16))):
        buf = io.BytesIO()
        img.save(buf, "PNG")
        out[name] = buf.getvalue()
    return out


def test_every_file_of_the_zoos_pillow_decodes_is_kept_and_the_rest_refused():
    files = {**zoo(), **corpus()}
    for name, data in files.items():
        assert kept(data) == pillow_decodes(data), name
    proven = [n for n, d in files.items() if clean_structure(d) is not None]
    # the common cases take the fast path; the odd ones (data after EOI, a short APP segment, ICC PNG) do not
    assert {"jpeg", "cmyk_jpeg", "ycck_jpeg", "grey_jpeg", "icc_jpeg", "jpeg_progressive", "png16_rgb",
            "rgba_png", "palette_png_trns"} <= set(proven)
    assert not {"jpeg_data_after_eoi", "jpeg_truncated_app14", "icc_png", "jpeg_garbage_body"} & set(proven)


def test_the_fast_path_reports_pillows_format_and_size():
    for name, data in {**bases(), **zoo()}.items():
        proven = clean_structure(data)
        if proven is None:
            continue
        with Image.open(io.BytesIO(data)) as img:
            assert proven == (img.format, img.size), name


def test_every_base_is_proven_clean():
    for name, data in bases().items():
        assert clean_structure(data) is not None, name


def fuzzed(data: bytes, rng: np.random.Generator) -> list[bytes]:
    """Random bodies behind the header, cuts at many points, single flipped bytes."""
    start = _scan_start(data) if data[:2] == b"\xff\xd8" else 33    # PNG: after the IHDR chunk
    out = [data[:start] + rng.integers(0, 256, len(data) - start, dtype=np.uint8).tobytes() for _ in range(6)]
    out += [data[:cut] for cut in np.linspace(start // 2, len(data) - 1, 16).astype(int)]
    for pos in rng.integers(2, len(data), 24):
        flipped = bytearray(data)
        flipped[pos] ^= int(rng.integers(1, 256))
        out.append(bytes(flipped))
    return out


@pytest.mark.parametrize("name", list(bases()))
def test_fuzzed_files_get_a_verdict_consistent_with_pillow(name):
    rng = np.random.default_rng(sum(name.encode()))
    data = bases()[name]
    verdicts = {"refused": 0, "kept_decodes": 0, "kept_structure_only": 0}
    for i, bad in enumerate(fuzzed(data, rng)):
        decodes = pillow_decodes(bad)
        if not kept(bad):
            assert not decodes, (name, i)                 # refused => the loader's Pillow fails on it too
            verdicts["refused"] += 1
        elif decodes:
            verdicts["kept_decodes"] += 1
        else:                                             # kept, Pillow fails: only a clean structure may do that
            assert clean_structure(bad) is not None, (name, i)
            verdicts["kept_structure_only"] += 1
        if i < 6:                                         # random bodies: the fast path never vouches for them
            assert clean_structure(bad) is None, (name, i)
        elif i < 22:                                      # cuts: no end marker / IEND, never proven
            assert clean_structure(bad) is None, (name, i)
    assert verdicts["refused"] >= 6, verdicts             # most cuts and garbage bodies are refused
    assert sum(verdicts.values()) == 46


def test_odd_structures_go_to_the_decode():
    base = bases()
    restarts = base["restarts"]
    first = restarts.index(b"\xff\xd0", _scan_start(restarts))
    second = restarts.index(b"\xff\xd1", first)
    swapped = bytearray(restarts)
    swapped[first + 1], swapped[second + 1] = 0xD1, 0xD0          # RST markers out of order
    png = base["png"]
    bad_crc = png[:-5] + bytes([png[-5] ^ 1]) + png[-4:]         # IEND's CRC
    ztxt = with_chunk(png, b"zTXt", b"k\x00\x00" + zlib.compress(b"v"))   # Pillow inflates it when opening
    bad_name = with_chunk(png, b"a b!", b"x")                     # not a chunk name: Pillow refuses the file
    for odd in (bytes(swapped), restarts + b"trailer", restarts[:-2], bad_crc, ztxt, bad_name, png + b"x"):
        assert clean_structure(odd) is None
        assert kept(odd) == pillow_decodes(odd)
    assert pillow_decodes(ztxt) and kept(ztxt)
    assert not pillow_decodes(bad_name) and not kept(bad_name)


def with_chunk(png: bytes, kind: bytes, body: bytes) -> bytes:
    """`png` with a chunk (good CRC) inserted after IHDR, where Pillow's open reads it."""
    chunk = len(body).to_bytes(4, "big") + kind + body + zlib.crc32(kind + body).to_bytes(4, "big")
    return png[:33] + chunk + png[33:]


def test_default_shard_keeps_what_pillow_decodes_and_loses_nothing(tmp_path):
    files = {**corpus(), **{f"fuzz{i}": f for i, f in enumerate(fuzzed(bases()["baseline"],
                                                                        np.random.default_rng(1))[:12])}}
    (tmp_path / "imgs").mkdir()
    rows = []
    for name, data in files.items():
        (tmp_path / "imgs" / name).write_bytes(data)
        rows.append({"id": name, "images": [f"imgs/{name}"],
                     "conversations": [{"from": "human", "value": "<image>\nwhat?"}, {"from": "gpt", "value": "x"}]})
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    m = shard(tmp_path / "d.jsonl", tmp_path / "out", max_skip_fraction=1)
    expected = sum(pillow_decodes(d) for d in files.values())
    assert m.num_samples == expected
    assert m.num_samples + sum(m.stats["skipped"].values()) == len(files)      # nothing lost


def test_a_resumed_run_keeps_its_first_runs_mode(tmp_path):
    data = bases()["baseline"]
    (tmp_path / "a.jpg").write_bytes(data)
    rows = [{"id": f"r{i}", "images": ["a.jpg"],
             "conversations": [{"from": "human", "value": "<image>"}, {"from": "gpt", "value": "x"}]} for i in range(4)]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    shard(tmp_path / "d.jsonl", out, max_samples_per_shard=2, verify="decode")      # the old default
    m = shard(tmp_path / "d.jsonl", out, max_samples_per_shard=2, resume=True)      # no --verify: the first run's
    assert m.stats["resumed_jobs"] == 2
    assert json.loads((out / "_jobs" / "config.json").read_text())["image_check"] == "decode"
    with pytest.raises(ConfigError, match="different settings .*image_check"):
        shard(tmp_path / "d.jsonl", out, max_samples_per_shard=2, resume=True, verify="structure")
    fresh = shard(tmp_path / "d.jsonl", tmp_path / "fresh", max_samples_per_shard=2)
    assert fresh.num_samples == 4
    assert json.loads((tmp_path / "fresh" / "_jobs" / "config.json").read_text())["image_check"] == "structure"
