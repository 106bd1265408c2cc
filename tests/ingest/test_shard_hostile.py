"""`vlmdata shard` on hostile rows: one row never aborts the run, no row is lost without a count
(input rows == written + skipped), --verify strict catches what Pillow decodes with warnings, and `vlmdata inspect`
shows every new skip reason."""
from __future__ import annotations

import io
import json
import struct
import subprocess
import sys
import zlib

import pytest
from PIL import Image

from tests.helpers.shards import jpeg, png, shard, wds_samples
from vlmdata.errors import ConfigError
from vlmdata.ingest import inspect_dataset

CSV_DEFAULT_LIMIT = 131072   # the csv module's field_size_limit() before anything raises it
CONV = [{"from": "human", "value": "<image>\ndescribe"}, {"from": "gpt", "value": "a picture"}]


def llava(i: int, image: str = "imgs/a.jpg") -> dict:
    return {"id": f"r{i}", "image": image, "conversations": CONV}


@pytest.fixture
def root(tmp_path):
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "a.jpg").write_bytes(jpeg(40, 30))
    return tmp_path


def totals_add_up(m, rows: int) -> None:
    st = m.stats
    assert st["input_rows"] == rows == st["samples"] + st["skipped_total"]
    assert st["skipped_total"] == sum(st["skipped"].values())


def test_deep_nesting_and_huge_integers_cost_one_row_each(root):
    lines = [json.dumps(llava(i)) for i in range(10)]
    lines[3] = '{"id": "deep", "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
    lines[6] = '{"id": "digits", "n": ' + "7" * 5000 + "}"
    (root / "d.jsonl").write_text("\n".join(lines) + "\n")
    m = shard(root / "d.jsonl", root / "out")
    assert m.stats["skipped"] == {"bad_row": 2} and m.num_samples == 8
    totals_add_up(m, 10)
    arr = [llava(i) for i in range(10)]
    text = json.dumps(arr).replace(json.dumps(arr[4]), '{"id": "deep", "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    (root / "d.json").write_text(text)
    m = shard(root / "d.json", root / "out2")
    assert m.stats["skipped"] == {"bad_row": 1} and m.num_samples == 9


def test_a_syntax_error_in_a_llava_array_costs_one_row(root):
    items = [json.dumps(llava(i), indent=2) for i in range(197)]
    items[2] = '{\n  "id": "r2",,\n  "image": "imgs/a.jpg"\n}'
    (root / "llava.json").write_text("[\n" + ",\n".join(items) + "\n]\n")
    m = shard(root / "llava.json", root / "out")
    assert m.stats["skipped"] == {"bad_row": 1} and m.num_samples == 196
    totals_add_up(m, 197)


def test_csv_field_over_the_limit_and_unterminated_quote(root):
    rows = ["id,image,caption"] + [f"c{i},imgs/a.jpg,caption {i}" for i in range(50)]
    rows[2] = "c1,imgs/a.jpg," + "x" * (CSV_DEFAULT_LIMIT + 1)
    (root / "big.csv").write_text("\n".join(rows) + "\n")
    m = shard(root / "big.csv", root / "o1")
    assert m.num_samples == 50 and m.stats["skipped"] == {}
    totals_add_up(m, 50)
    rows = ["id,image,caption"] + [f"c{i},imgs/a.jpg,caption {i}" for i in range(50)]
    rows[3] = 'c2,imgs/a.jpg,"this quote never closes'
    (root / "quote.csv").write_text("\n".join(rows) + "\n")
    m = shard(root / "quote.csv", root / "o2")
    assert m.stats["skipped"] == {"bad_row": 1} and m.num_samples == 49
    totals_add_up(m, 50)


def test_parquet_damage(root):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"image": ["imgs/a.jpg"] * 100, "caption": [f"caption number {i} " * 5 for i in range(100)]})
    pq.write_table(table, root / "good.parquet", row_group_size=25, compression="zstd")
    raw = (root / "good.parquet").read_bytes()
    (root / "truncated.parquet").write_bytes(raw[: len(raw) // 2])
    (root / "garbage.parquet").write_bytes(b"PAR1" + b"\x13" * 3000)
    for name in ("truncated.parquet", "garbage.parquet"):
        with pytest.raises(ConfigError, match=f"{name} is not a readable Parquet file"):
            shard(root / name, root / f"out-{name}")
    column = pq.ParquetFile(root / "good.parquet").metadata.row_group(1).column(1)
    damaged = bytearray(raw)
    damaged[column.data_page_offset + 40:column.data_page_offset + 240] = b"\x55" * 200
    (root / "damaged.parquet").write_bytes(bytes(damaged))
    m = shard(root / "damaged.parquet", root / "out")
    assert m.num_samples == 75 and m.stats["skipped"] == {"bad_row": 25}     # each row of the unreadable group
    assert "row group 1" in m.stats["examples"]["bad_row"]["detail"]
    totals_add_up(m, 100)


def test_a_row_with_33000_images_is_skipped_not_the_run(root):
    rows = [llava(0), {"id": "many", "images": ["imgs/a.jpg"] * 33_000,
                       "conversations": [{"from": "human", "value": "<image>" * 33_000}, {"from": "gpt", "value": "x"}]},
            llava(2)]
    (root / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    m = shard(root / "d.jsonl", root / "out")
    assert m.stats["skipped"] == {"too_many_images": 1} and m.num_samples == 2


def apng_with_sequence_error() -> bytes:
    """A PNG with an fcTL chunk after its image data whose sequence number is wrong: load() raises SyntaxError."""
    data = png(20, 24)
    body = struct.pack(">IIIIIHHBB", 5, 20, 24, 0, 0, 1, 10, 0, 0)
    chunk = struct.pack(">I", len(body)) + b"fcTL" + body + struct.pack(">I", zlib.crc32(b"fcTL" + body))
    iend = data.rindex(b"IEND") - 4
    return data[:iend] + chunk + data[iend:]


def bmp_bomb(w: int = 20_000, h: int = 10_000) -> bytes:
    """An RLE8 BMP declaring w x h pixels in a few hundred bytes (Pillow raises DecompressionBombError)."""
    palette = b"\0\0\0\0" * 256
    pixels = b"\x00\x01"                                                  # end of bitmap
    offset = 14 + 40 + len(palette)
    header = struct.pack("<IiiHHIIiiII", 40, w, h, 1, 8, 1, len(pixels), 2835, 2835, 256, 0)
    total = offset + len(pixels)
    return b"BM" + struct.pack("<IHHI", total, 0, 0, offset) + header + palette + pixels


def test_images_that_make_pillow_raise_under_memmap_and_resize(root):
    with pytest.raises(SyntaxError):
        Image.open(io.BytesIO(apng_with_sequence_error())).load()         # the reproduction itself
    with pytest.raises(Image.DecompressionBombError):
        Image.open(io.BytesIO(bmp_bomb()))
    (root / "imgs" / "apng.png").write_bytes(apng_with_sequence_error())
    (root / "imgs" / "bomb.bmp").write_bytes(bmp_bomb())
    rows = [llava(0), llava(1, "imgs/apng.png"), llava(2, "imgs/bomb.bmp"), llava(3)]
    (root / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for kw in ({"format": "memmap", "image_size": 28}, {"resize_max_side": 16}):
        m = shard(root / "d.jsonl", root / f"out-{len(kw)}", max_image_pixels=300_000_000, **kw)
        assert m.stats["skipped"] == {"undecodable_image": 1, "decompression_bomb": 1}, kw
        totals_add_up(m, 4)


def garbage_body_jpeg() -> bytes:
    """A valid JPEG header (and end marker) around random entropy-coded data: decodes to noise, or not at all."""
    import numpy as np

    good = jpeg(64, 48)
    sos = good.index(b"\xff\xda")
    length = int.from_bytes(good[sos + 2:sos + 4], "big")
    start = sos + 2 + length
    noise = np.random.default_rng(0).integers(0, 255, len(good) - start - 2, dtype=np.uint8).tobytes()
    return good[:start] + noise.replace(b"\xff", b"\xfe") + b"\xff\xd9"


def test_verify_strict_catches_a_garbage_body_pillow_decodes(root):
    """Noise without 0xFF bytes parses as entropy-coded data: Pillow (the loader) decodes it, libjpeg warns."""
    (root / "imgs" / "noise.jpg").write_bytes(garbage_body_jpeg())
    Image.open(io.BytesIO(garbage_body_jpeg())).load()                   # the loader's decoder takes it
    rows = [llava(0), llava(1, "imgs/noise.jpg"), llava(2)]
    (root / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for verify in ("none", "structure", "decode"):
        m = shard(root / "d.jsonl", root / f"plain-{verify}", verify=verify)
        assert m.num_samples == 3 and m.stats["skipped"] == {}, verify
    m = shard(root / "d.jsonl", root / "verified", verify="strict")
    assert m.num_samples == 2 and m.stats["skipped"] == {"undecodable_image": 1}
    assert sorted(wds_samples(root / "verified")) == ["r0", "r2"]
    with pytest.raises(ConfigError, match="--verify"):
        shard(root / "d.jsonl", root / "bad", verify="pixels")


def test_cli_options_and_inspect_show_the_new_reasons(root):
    (root / "imgs" / "noise.jpg").write_bytes(garbage_body_jpeg())
    (root / "imgs" / "big.jpg").write_bytes(jpeg(400, 300))
    rows = [llava(0), llava(1, "imgs/noise.jpg"), llava(2, "../outside.jpg"), llava(3, "http://127.0.0.1:9/x.jpg"),
            llava(4, "imgs/big.jpg"), {"id": "many", "images": ["imgs/a.jpg"] * 33_000, "conversations": CONV}]
    (root / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + "{broken\n")
    out = root / "out"
    r = subprocess.run([sys.executable, "-m", "vlmdata", "shard", str(root / "d.jsonl"), "-o", str(out),
                        "--workers", "0", "--verify", "strict", "--max-image-bytes", "2K",
                        "--max-skip-fraction", "1"],   # all but one row are hostile on purpose
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    report = inspect_dataset(str(out), samples=0)
    for reason in ("undecodable_image", "outside_root", "remote_not_allowed", "file_too_large", "too_many_images",
                   "bad_row"):
        assert reason in report, reason
    assert "input rows 7: written 1, skipped 6" in report
    r = subprocess.run([sys.executable, "-m", "vlmdata", "shard", str(root / "d.jsonl"), "-o", str(root / "o2"),
                        "--allow-host", "example.com"], capture_output=True, text=True)
    assert r.returncode == 2 and "--allow-host only applies with --allow-remote" in r.stderr


def test_resume_of_a_run_started_before_the_access_settings(root):
    """A `_jobs/config.json` written before --verify and the access policy existed resumes with their defaults."""
    rows = [llava(i) for i in range(4)]
    (root / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    shard(root / "d.jsonl", root / "out", max_samples_per_shard=2)
    config = root / "out" / "_jobs" / "config.json"
    old = json.loads(config.read_text())
    del old["access"], old["image_check"]
    config.write_text(json.dumps(old))      # "verify" absent: the header checks of then, today's "none"
    m = shard(root / "d.jsonl", root / "out", max_samples_per_shard=2, resume=True, verify="none")
    assert m.stats["resumed_jobs"] == 2
    m = shard(root / "d.jsonl", root / "out", max_samples_per_shard=2, resume=True)   # no --verify: the first run's
    assert m.stats["resumed_jobs"] == 2
    with pytest.raises(ConfigError, match="different settings .*image_check"):
        shard(root / "d.jsonl", root / "out", max_samples_per_shard=2, resume=True, verify="structure")
