"""A chat template render is bounded: nested loops, exponential macros, runaway recursion and doubling strings are
a TemplateError (a counted template_error skip at shard time), while a real template renders a long conversation."""
from __future__ import annotations

import json
import time

import pytest

from tests.ingest.test_layouts import png
from vlmdata.ingest import ShardConfig, shard_dataset
from vlmdata.testing import chatml_folder
from vlmdata.text import ChatTemplate, RenderBudget, TemplateError

ONE = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
NESTED = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("source, what", [
    (NESTED, "steps"),
    ("{% for m in messages %}{% for a in range(100000) %}{% for b in range(100000) %}{{ '' }}{% endfor %}"
     "{% endfor %}{% endfor %}", "steps"),
    ("{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(60) }}", "steps"),
    ("{% for m in messages recursive %}{{ loop(range(100000)) }}{% endfor %}", "recurses|steps"),
    ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "recurses"),
    ("{% set ns = namespace(s='xy') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", "value"),
    ("{% set ns = namespace(s='xy') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}", "value"),
    ("{{ 'x' * 10 ** 12 }}", "power|value"),
    ("{{ 'x' * 4000000000 }}", "value"),
    ("{{ 'x'|center(4000000000) }}", "value"),
    ("{{ 'x'.ljust(4000000000) }}", "value"),
    ("{{ '%4000000000s' % 'x' }}", "format width"),
    ("{{ '{:>4000000000}'.format('x') }}", "format width"),
    ("{{ '%4000000000s'|format('x') }}", "format width"),
], ids=["nested-loops", "nested-in-messages", "exponential-macro", "recursive-loop", "deep-recursion",
        "doubling-concat", "doubling-plus", "power", "repeat", "center", "ljust", "percent", "str-format",
        "format-filter"])
def test_a_runaway_template_is_a_template_error_soon(source, what):
    t0 = time.monotonic()
    pattern = what.replace("steps", "more than .* steps").replace("value", "builds a value")
    with pytest.raises(TemplateError, match=pattern):
        ChatTemplate(source).render(ONE)
    assert time.monotonic() - t0 < 20


def test_a_real_template_renders_a_long_conversation(tmp_path):
    source = json.loads((chatml_folder(tmp_path / "m") / "tokenizer_config.json").read_text())["chat_template"]
    messages = []
    for i in range(5000):
        messages += [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": f"question {i}"}]},
                     {"role": "assistant", "content": [{"type": "text", "text": f"answer {i}"}]}]
    r = ChatTemplate(source).render(messages)
    assert len(r.spans) == 5000 and r.text[slice(*r.spans[-1])] == "answer 4999"
    with pytest.raises(TemplateError, match="more than 100 steps"):      # the budget is what bounds it
        ChatTemplate(source, budget=RenderBudget(base_steps=100, steps_per_message=0)).render(messages)


def test_the_budget_is_per_render_and_survives_pickling():
    import pickle

    t = pickle.loads(pickle.dumps(ChatTemplate("{% for m in messages %}{{ m['content'] }}{% endfor %}",
                                               budget=RenderBudget(base_steps=50, steps_per_message=0))))
    for _ in range(100):                                  # 100 renders of 2 steps each: never accumulated
        assert t.render_text(ONE) == "hiyo"
    with pytest.raises(TemplateError):
        t.render_text(ONE * 30)


@pytest.mark.timeout(120)
def test_shard_counts_a_hanging_render_as_template_error_and_keeps_the_rest(tmp_path):
    model = chatml_folder(tmp_path / "m")
    cfg_path = model / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = ("{% if 'spin' in (messages|tojson) %}" + NESTED + "{% endif %}") + cfg["chat_template"]
    cfg_path.write_text(json.dumps(cfg))
    (tmp_path / "a.png").write_bytes(png())
    rows = [{"id": f"r{i}", "images": ["a.png"],
             "messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}]},
                          {"role": "assistant", "content": "spin" if i % 3 == 0 else f"answer {i}"}]}
            for i in range(9)]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    m = shard_dataset(ShardConfig(inputs=[str(tmp_path / "rows.jsonl")], output=str(tmp_path / "o"), workers=0,
                                  tokenizer=str(model)))
    assert m.stats["skipped"] == {"template_error": 3}
    assert m.stats["samples"] == 6 and m.stats["input_rows"] == 9
    assert "steps" in m.stats["examples"]["template_error"]["detail"]
