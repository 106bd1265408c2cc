"""A model's chat template, rendered the way transformers renders it, with the assistant spans found.

The template is compiled once in a sandboxed Jinja environment configured like
transformers' (`ImmutableSandboxedEnvironment`, `trim_blocks`, `lstrip_blocks`,
`loopcontrols`, a `tojson` that keeps non-ASCII text, `raise_exception`,
`strftime_now`, a namespace that refuses underscore names, the `{% generation %}`
tag) and rendered with the variables transformers passes: `messages`, `tools`,
`documents`, `add_generation_prompt` and the tokenizer's special tokens.

Where the trained text is: when the template has `{% generation %}` blocks, they
are the trained spans. Otherwise each assistant message's text is wrapped in two
Unicode noncharacters (inside its leading and trailing whitespace, so `trim`
still works) before rendering; they are removed from the output and their
positions are the spans. If a template rewrites the text so that the marks do
not come back one pair per text, the conversation is rendered again without
marks and each assistant text is searched for in order; if one cannot be found
the conversation is rejected (TemplateError), never silently mis-masked.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime

__all__ = ["ChatTemplate", "RenderedChat", "TemplateError"]

START, END, GEN_START, GEN_END = "\ufdd0", "\ufdd1", "\ufdd2", "\ufdd3"
_MARKS = re.compile("[\ufdd0-\ufdd3]")
_GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")


class TemplateError(ValueError):
    """A conversation the template cannot render, or whose assistant text it does not reproduce."""


@dataclass(frozen=True)
class RenderedChat:
    """The rendered text and the character spans [start, end) of the trained assistant text, in order."""

    text: str
    spans: tuple[tuple[int, int], ...]


def _environment():
    import jinja2
    from jinja2 import nodes
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationTag(Extension):
        """`{% generation %}...{% endgeneration %}`: the body is wrapped in marks that locate it afterwards."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_mark"), [], [], body).set_lineno(lineno)

        def _mark(self, caller) -> str:
            return GEN_START + caller() + GEN_END

    class Namespace(jinja2.utils.Namespace):
        """`namespace()` that refuses attributes starting with an underscore (as transformers' does)."""

        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                if isinstance(name, str) and name.startswith("_"):
                    raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} is not allowed")
            jinja2.utils.Namespace.__init__(self, attrs)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.globals["namespace"] = Namespace
    return env


def _wrap(text: str, pads: list[tuple[str, str]]) -> str:
    """START/END around the text inside its leading and trailing whitespace (kept in `pads`)."""
    core = text.strip()
    if not core:
        return text
    lead = len(text) - len(text.lstrip())
    pads.append((text[:lead], text[lead + len(core):]))
    return text[:lead] + START + core + END + text[lead + len(core):]


def _widen(out: RenderedChat, pads: list[tuple[str, str]]) -> RenderedChat:
    """Spans grown over the text's own leading/trailing whitespace where the template kept it."""
    text, spans = out.text, []
    for (a, b), (lead, trail) in zip(out.spans, pads):
        if lead and text[a - len(lead):a] == lead:
            a -= len(lead)
        if trail and text[b:b + len(trail)] == trail:
            b += len(trail)
        spans.append((a, b))
    return RenderedChat(text, tuple(spans))


class ChatTemplate:
    """A compiled chat template (see the module docstring). Picklable: it recompiles in a new process."""

    def __init__(self, source: str, special_tokens: dict[str, str] | None = None):
        if not isinstance(source, str) or not source.strip():
            raise TemplateError("the chat template is empty")
        self.source = source
        self.special_tokens = dict(special_tokens or {})
        self.has_generation = bool(_GENERATION.search(source))
        self._compiled = None

    def __getstate__(self) -> dict:
        return {"source": self.source, "special_tokens": self.special_tokens, "has_generation": self.has_generation,
                "_compiled": None}

    @property
    def compiled(self):
        if self._compiled is None:
            import jinja2

            try:
                self._compiled = _environment().from_string(self.source)
            except jinja2.TemplateSyntaxError as exc:
                raise TemplateError(f"the chat template does not compile: {exc}") from exc
        return self._compiled

    def render_text(self, messages: list[dict], add_generation_prompt: bool = False) -> str:
        """The rendered conversation, exactly as transformers' apply_chat_template(tokenize=False) gives it."""
        return _MARKS.sub("", self._render(messages, add_generation_prompt))

    def _render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        import jinja2

        try:
            return self.compiled.render(messages=messages, tools=None, documents=None,
                                        add_generation_prompt=add_generation_prompt, **self.special_tokens)
        except jinja2.TemplateError as exc:
            raise TemplateError(f"the chat template failed: {exc}") from exc

    def render(self, messages: list[dict]) -> RenderedChat:
        """Render a conversation for training and locate its trained spans (see the module docstring)."""
        for m in messages:
            content = m.get("content")
            pieces = [content] if isinstance(content, str) else [i.get("text", "") for i in content or ()
                                                                 if isinstance(i, dict)]
            if any(isinstance(p, str) and _MARKS.search(p) for p in pieces):
                raise TemplateError("the text holds a Unicode noncharacter U+FDD0..U+FDD3")
        if self.has_generation:
            out = _split_marks(self._render(messages, False), GEN_START, GEN_END)
            if out is None:
                raise TemplateError("the template's {% generation %} blocks are unbalanced")
            return out
        marked, texts, pads = [], [], []
        for m in messages:
            if m.get("role") == "assistant":
                content = m.get("content")
                if isinstance(content, str):
                    texts.append(content)
                    m = {**m, "content": _wrap(content, pads)}
                elif isinstance(content, list):
                    items = []
                    for item in content:
                        if isinstance(item, dict) and item.get("type") == "text":
                            texts.append(item.get("text", ""))
                            item = {**item, "text": _wrap(item.get("text", ""), pads)}
                        items.append(item)
                    m = {**m, "content": items}
            marked.append(m)
        expect = sum(1 for t in texts if t.strip())
        out = _split_marks(self._render(marked, False), START, END)
        if out is not None and len(out.spans) == expect:
            return _widen(out, pads)
        return self._search(messages, texts)

    def _search(self, messages: list[dict], texts: list[str]) -> RenderedChat:
        """Fallback: render unmarked and find each assistant text (stripped) in order."""
        text = self.render_text(messages)
        spans, pos = [], 0
        for t in texts:
            core = t.strip()
            if not core:
                continue
            at = text.find(core, pos)
            if at < 0:
                raise TemplateError(f"the chat template does not reproduce the assistant text {core[:60]!r}")
            spans.append((at, at + len(core)))
            pos = at + len(core)
        return RenderedChat(text, tuple(spans))


def _split_marks(marked: str, start: str, end: str) -> RenderedChat | None:
    """Remove every mark; spans from the start/end pair given (other marks are dropped); None if unbalanced."""
    if not _MARKS.search(marked):
        return RenderedChat(marked, ())
    out: list[str] = []
    spans: list[tuple[int, int]] = []
    pos = length = 0
    open_at = -1
    ok = True
    for m in _MARKS.finditer(marked):
        piece = marked[pos:m.start()]
        out.append(piece)
        length += len(piece)
        pos = m.end()
        mark = m.group()
        if mark == start:
            ok &= open_at < 0
            open_at = length
        elif mark == end:
            ok &= open_at >= 0
            if open_at >= 0 and length > open_at:
                spans.append((open_at, length))
            open_at = -1
    out.append(marked[pos:])
    if not ok or open_at >= 0:
        return None
    return RenderedChat("".join(out), tuple(spans))
