"""The input layouts users have: ShareGPT with system prompts, OpenAI/TRL messages, the_cauldron Parquet,
OBELICS/MMC4 documents, --columns renames; bad rows are counted by reason, nothing is lost."""
from __future__ import annotations

import io
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from vlmdata import ShardConfig, shard_dataset
from vlmdata.errors import ConfigError, RowProblem, Skip
from vlmdata.ingest import ColumnSpec, normalize, parse_columns
from vlmdata.testing import chatml_folder
from vlmdata.text.families import load_family


def png(w=40, h=30) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((h, w, 3), 120, np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def test_sharegpt_keeps_system_prompt_and_system_turns():
    row = {"system": "Be brief.", "image": "a.jpg",
           "conversations": [{"from": "human", "value": "<image>\nWhat?"}, {"from": "gpt", "value": "A cat."}]}
    conv = normalize(row, "x", ColumnSpec()).to_conversation()
    assert [m["role"] for m in conv.messages] == ["system", "user", "assistant"]
    assert conv.messages[0]["content"] == [{"type": "text", "text": "Be brief."}]
    assert conv.messages[1]["content"] == [{"type": "image"}, {"type": "text", "text": "\nWhat?"}]
    turn = {"conversations": [{"from": "system", "value": "S"}, {"from": "human", "value": "hi"},
                              {"from": "gpt", "value": "yo"}]}
    assert normalize(turn, "y", ColumnSpec()).turns[0] == ("system", "S")


def test_openai_messages_rows():
    row = {"messages": [{"role": "system", "content": "Sys"},
                        {"role": "user", "content": [{"type": "text", "text": "Look:"}, {"type": "image"},
                                                     {"type": "image_url", "image_url": {"url": "b.png"}}]},
                        {"role": "assistant", "content": [{"type": "text", "text": "Two."}]}],
           "images": ["a.png"]}
    s = normalize(row, "m", ColumnSpec())
    assert s.images == ["a.png", "b.png"]
    assert s.conversation.messages[0] == {"role": "system", "content": [{"type": "text", "text": "Sys"}]}
    assert s.conversation.n_images == 2
    bad = {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "image"}]}], "images": ["a.png"]}
    with pytest.raises(RowProblem) as e:
        normalize(bad, "b", ColumnSpec())
    assert e.value.reason == Skip.MARKER_MISMATCH
    with pytest.raises(RowProblem, match="unknown role"):
        normalize({"messages": [{"role": "tool", "content": "x"}]}, "t", ColumnSpec())


def test_interleaved_documents_are_trained_on_all_text(tmp_path):
    obelics = {"images": [None, "a.png", None], "texts": ["Intro.", None, "After the image."]}
    s = normalize(obelics, "d", ColumnSpec())
    assert s.conversation.kind == "document" and s.images == ["a.png"]
    mmc4 = {"text_list": ["one", "two"], "image_info": [{"image_name": "x.jpg", "matched_text_index": 1}]}
    s2 = normalize(mmc4, "e", ColumnSpec())
    assert [i["type"] for i in s2.conversation.messages[0]["content"]] == ["text", "image", "text"]
    fam = load_family(str(chatml_folder(tmp_path / "m")))
    ids, loss = fam.encode(s.conversation)
    text = fam.tokenizer.decode(ids.tolist(), skip_special_tokens=False)
    assert text == "Intro.<|vision_start|><|image_pad|><|vision_end|>After the image.<|endoftext|>"
    assert (loss == (ids != fam.image_token_id)).all()


def test_cauldron_parquet_and_column_renames(tmp_path):
    table = pa.table({"pics": [[{"bytes": png(), "path": None}], [{"bytes": png(30, 40), "path": None}]],
                      "turns": [[{"user": "What?", "assistant": "Grey.", "source": "x"}],
                                [{"user": "And?", "assistant": "Grey too.", "source": "x"}]]})
    pq.write_table(table, tmp_path / "c.parquet")
    model = chatml_folder(tmp_path / "m")
    with pytest.raises(ConfigError):  # every row lacks the layout's columns: the error names what the file has
        shard_dataset(ShardConfig(inputs=[str(tmp_path / "c.parquet")], output=str(tmp_path / "x"), workers=0,
                                  tokenizer=str(model)))
    m = shard_dataset(ShardConfig(inputs=[str(tmp_path / "c.parquet")], output=str(tmp_path / "o"), workers=0,
                                  tokenizer=str(model),
                                  columns=ColumnSpec(mapping=parse_columns("images=pics,texts=turns"))))
    assert m.stats["samples"] == 2 and m.stats["images"] == 2
    with pytest.raises(ConfigError, match="not NAME=COLUMN"):
        parse_columns("images")
    with pytest.raises(RowProblem, match="the row has columns pics, turns"):
        normalize({"pics": [], "turns": []}, "r", ColumnSpec(mapping=(("messages", "chat"),)))


def test_bad_rows_are_counted_and_nothing_is_lost(tmp_path):
    (tmp_path / "a.png").write_bytes(png())
    rows = [{"id": "ok", "messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi"}]},
                                      {"role": "assistant", "content": "Hello"}], "images": ["a.png"]},
            {"id": "extra-image", "messages": [{"role": "user", "content": [{"type": "image"}]}], "images": []},
            {"id": "bad-role", "messages": [{"role": "robot", "content": "x"}]},
            {"id": "pad-in-text", "messages": [{"role": "user", "content": "<|image_pad|> sneaky"},
                                               {"role": "assistant", "content": "no"}]}]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    m = shard_dataset(ShardConfig(inputs=[str(tmp_path / "rows.jsonl")], output=str(tmp_path / "o"), workers=0,
                                  tokenizer=str(chatml_folder(tmp_path / "m"))))
    st = m.stats
    assert st["samples"] == 1 and st["input_rows"] == 4 and st["samples"] + st["skipped_total"] == 4
    assert st["skipped"] == {Skip.MARKER_MISMATCH: 2, Skip.BAD_TEXT: 1}
