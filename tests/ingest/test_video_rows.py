"""Rows that carry a video are counted skips (`video_unsupported`) in every layout, never trained as text;
rows that only talk about videos are sharded as before."""
from __future__ import annotations

import json

from tests.helpers.corpus import generate_corpus
from tests.helpers.models import qwen_folder_or_skip
from tests.helpers.shards import read_jsonl, shard, stored_members

QUESTION = "What happens in the video?"


def _video_rows() -> list[dict]:
    llava = [{"from": "human", "value": f"<video>\n{QUESTION}"}, {"from": "gpt", "value": "A dog runs."}]
    return [
        {"id": "v-llava", "video": "clip.mp4", "conversations": llava},                        # LLaVA-Video
        {"id": "v-marker-only", "conversations": llava},                                      # <video> alone
        {"id": "v-videos", "videos": ["a.mp4", "b.mp4"], "conversations": [
            {"from": "human", "value": QUESTION}, {"from": "gpt", "value": "Two clips."}]},
        {"id": "v-messages", "messages": [
            {"role": "user", "content": [{"type": "video", "video": "clip.mp4"}, {"type": "text", "text": QUESTION}]},
            {"role": "assistant", "content": "A dog runs."}]},
        {"id": "v-video-url", "messages": [
            {"role": "user", "content": [{"type": "video_url", "video_url": {"url": "https://x.org/c.mp4"}},
                                         {"type": "text", "text": QUESTION}]},
            {"role": "assistant", "content": "A dog runs."}]},
        {"id": "v-caption", "video": "clip.mp4", "caption": "a dog runs"},
        {"id": "v-mp4-image", "image": "clip.mp4", "caption": "a dog runs"},
    ]


def test_video_rows_are_counted_and_nothing_else_is_lost(tmp_path):
    corpus = generate_corpus(tmp_path / "corpus", 8, seed=5, fmt="llava")
    rows = read_jsonl(corpus / "data.jsonl")
    prose = {**rows[0], "id": "prose", "video": None, "videos": [], "conversations": [   # empty video columns
        {"from": "human", "value": "<image>\nIs this a frame of a video about videos?"},
        {"from": "gpt", "value": "Yes, a video still."}]}
    mixed = rows + [prose] + _video_rows()
    (corpus / "mixed.jsonl").write_text("".join(json.dumps(r) + "\n" for r in mixed))
    model = qwen_folder_or_skip()
    clean = shard(corpus / "data.jsonl", tmp_path / "clean", tokenizer=str(model))
    m = shard(corpus / "mixed.jsonl", tmp_path / "mixed", tokenizer=str(model))
    assert m.stats["skipped"] == {"video_unsupported": len(_video_rows())}
    assert m.num_samples == len(rows) + 1 and m.stats["input_rows"] == len(mixed)
    got = stored_members(tmp_path / "mixed")
    assert "prose" in got and not any(k.startswith("v-") for k in got)
    assert {k: v for k, v in got.items() if k != "prose"} == stored_members(tmp_path / "clean")
    assert "video" in m.stats["examples"]["video_unsupported"]["detail"]
    assert clean.stats["skipped"] == {}
