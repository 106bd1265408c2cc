"""The chat template renderer: transformers' variables and sandbox, trained spans from marks, from
{% generation %} blocks, and from a search when a template rewrites the text."""
from __future__ import annotations

import pytest

from vlmdata.text import ChatTemplate, TemplateError

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
MSGS = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": " Hello there \n"},
        {"role": "user", "content": "More"}, {"role": "assistant", "content": "Bye"}]


def spans_text(r):
    return [r.text[a:b] for a, b in r.spans]


def test_spans_cover_each_assistant_text_exactly():
    r = ChatTemplate(CHATML).render(MSGS)
    assert r.text == ChatTemplate(CHATML).render_text(MSGS)
    assert spans_text(r) == [" Hello there \n", "Bye"]
    assert ChatTemplate(CHATML).render_text(MSGS[:1], add_generation_prompt=True).endswith("<|im_start|>assistant\n")


def test_trim_keeps_rendering_identical_and_span_on_the_kept_text():
    t = ChatTemplate("{% for m in messages %}[{{ m['role'] }}]{{ m['content'] | trim }}{% endfor %}")
    r = t.render(MSGS)
    assert r.text == "[user]Hi[assistant]Hello there[user]More[assistant]Bye"
    assert spans_text(r) == ["Hello there", "Bye"]


def test_rewriting_template_falls_back_to_search_or_rejects():
    twice = ChatTemplate("{% for m in messages %}{{ m['content'] }}={{ m['content'] }}|{% endfor %}")
    r = twice.render([{"role": "user", "content": "ab"}, {"role": "assistant", "content": "cd"}])
    assert r.text == "ab=ab|cd=cd|" and r.spans == ((6, 8),)          # marks came back twice: searched
    sliced = ChatTemplate("{% for m in messages %}{{ m['content'][1:] }}|{% endfor %}")
    with pytest.raises(TemplateError, match="does not reproduce"):  # rewritten text: rejected, never mis-masked
        sliced.render([{"role": "user", "content": "xab"}, {"role": "assistant", "content": "zcd"}])
    hides = ChatTemplate("{% for m in messages %}{% if m['role'] == 'user' %}{{ m['content'] }}{% endif %}{% endfor %}")
    with pytest.raises(TemplateError, match="does not reproduce"):
        hides.render(MSGS)


def test_generation_blocks_and_special_tokens():
    t = ChatTemplate("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'assistant' %}A: {% generation %}"
                     "{{ m['content'] }}{{ eos_token }}{% endgeneration %}{% else %}U: {{ m['content'] }} {% endif %}"
                     "{% endfor %}", {"bos_token": "<s>", "eos_token": "</s>"})
    r = t.render(MSGS)
    assert r.text.startswith("<s>U: Hi A:  Hello there \n</s>")
    assert spans_text(r) == [" Hello there \n</s>", "Bye</s>"]


def test_sandbox_and_errors():
    with pytest.raises(TemplateError, match="failed"):
        ChatTemplate("{{ messages.__class__.__mro__ }}").render_text(MSGS)
    with pytest.raises(TemplateError, match="failed"):
        ChatTemplate("{{ raise_exception('no system role') }}").render_text(MSGS)
    with pytest.raises(TemplateError, match="does not compile"):
        ChatTemplate("{% for %}").render_text(MSGS)
    with pytest.raises(TemplateError, match="noncharacter"):
        ChatTemplate(CHATML).render([{"role": "user", "content": "bad \ufdd0 text"}])
    assert ChatTemplate("{{ messages | tojson }}").render_text([{"role": "user", "content": "é"}]) == \
        '[{"role": "user", "content": "é"}]'
