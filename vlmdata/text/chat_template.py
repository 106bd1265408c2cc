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

A render is bounded (`RenderBudget`), since a model folder's template is code
run on every row: each loop iteration and each call (macros, methods,
`loop(...)` recursion) is a step, and a render that takes more than its
budget (100 000 steps + 100 per message) is a TemplateError (counted as a `template_error` skip), so nested
loops or runaway recursion cannot hang sharding. Steps, not seconds: the same
row gets the same decision on every machine and on `--resume`. Values are
bounded too: the result of `+`, `*`, `**`, `~`, a call or a filter and what a
`namespace` holds may be at most `max_chars` long (a template cannot double a
string forty times), and deep recursion is a TemplateError, not a crash.
"""
from __future__ import annotations

import contextvars
import functools
import inspect
import json
import re
from dataclasses import dataclass
from datetime import datetime

__all__ = ["ChatTemplate", "RenderBudget", "RenderedChat", "TemplateError"]

START, END, GEN_START, GEN_END = "\ufdd0", "\ufdd1", "\ufdd2", "\ufdd3"
_MARKS = re.compile("[\ufdd0-\ufdd3]")
_GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")
COUNTED = "vlmdata_counted"                  # the filter every loop's iterable goes through (a step per item)


class TemplateError(ValueError):
    """A conversation the template cannot render, or whose assistant text it does not reproduce."""


@dataclass(frozen=True)
class RenderBudget:
    """What one render may take: `base_steps + steps_per_message x messages` loop iterations and calls, and
    values of at most `max_chars` characters or items.

    Real templates stay far inside: Qwen2-VL's takes 2.5 steps per message (a 10 000-message
    conversation: 25 000 of its 1.1 million); a hostile template on a short conversation is stopped
    within 100 000 steps (a tenth of a second for loops, about two seconds for macro calls)."""

    base_steps: int = 100_000
    steps_per_message: int = 100
    max_chars: int = 16 << 20

    def steps_for(self, messages: int) -> int:
        return self.base_steps + self.steps_per_message * messages


_BUDGET: contextvars.ContextVar[list] = contextvars.ContextVar("vlmdata_template_budget")


def _step(n: int = 1) -> None:
    left = _BUDGET.get(None)
    if left is None:
        return
    left[0] -= n
    if left[0] < 0:
        raise TemplateError(f"the chat template took more than {left[2]} steps (loop iterations and calls) "
                            "for one conversation: it loops without bound")


def _check_length(n: int) -> None:
    left = _BUDGET.get(None)
    if left is not None and n > left[1]:
        raise TemplateError(f"the chat template builds a value of {n} characters or items, more than {left[1]}")


def _sized(value):
    """`value`, unless it is a string or sequence longer than the render may build."""
    if isinstance(value, (str, bytes, list, tuple)):
        _check_length(len(value))
    return value


_WIDE_FORMAT = re.compile(r"\{[^{}]*\d{8,}[^{}]*\}|%[^a-zA-Z%]*\d{8,}")   # a format width of 10^7 or more


def _check_arguments(args, kwargs) -> None:
    """Refuse what would build a huge value before it is built: a number argument (a width, a count) larger
    than a value may be, or a format string with such a width."""
    left = _BUDGET.get(None)
    if left is None:
        return
    for a in (*args, *kwargs.values()):
        if isinstance(a, int) and not isinstance(a, bool) and abs(a) > left[1]:
            raise TemplateError(f"the chat template builds a value from an argument of {a}, more than {left[1]}")


def _check_format(fmt) -> None:
    if isinstance(fmt, str) and _WIDE_FORMAT.search(fmt):
        raise TemplateError("the chat template builds a value with a format width of 10^7 or more")


def _counted(iterable):
    """Iterate, one step per item."""
    for item in iterable:
        _step()
        yield item


@dataclass(frozen=True)
class RenderedChat:
    """The rendered text and the character spans [start, end) of the trained assistant text, in order."""

    text: str
    spans: tuple[tuple[int, int], ...]


def _environment():
    import jinja2
    from jinja2 import nodes
    from jinja2.compiler import CodeGenerator
    from jinja2.ext import Extension
    from jinja2.runtime import LoopContext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class BoundedCode(CodeGenerator):
        """Compiled templates whose `~` results are size-checked."""

        def visit_Concat(self, node, frame):
            self.write("environment.sized(")
            super().visit_Concat(node, frame)
            self.write(")")

    class BoundedEnvironment(ImmutableSandboxedEnvironment):
        """The sandbox, with every call a step and every operator's, call's and filter's result size-checked."""

        code_generator_class = BoundedCode
        intercepted_binops = frozenset(["+", "*", "**", "%"])

        def sized(self, value):
            return _sized(value)

        def _parse(self, source, name, filename):
            """The template's tree with every loop's iterable counted a step per item."""
            tree = super()._parse(source, name, filename)
            for loop in tree.find_all(nodes.For):
                loop.iter = nodes.Filter(loop.iter, COUNTED, [], [], None, None, lineno=loop.iter.lineno)
            return tree

        def call_binop(self, context, operator, left, right):
            if operator == "**" and isinstance(right, (int, float)) and abs(right) > 64:
                raise TemplateError(f"the chat template raises to the power {right}")
            if operator == "%":
                _check_format(left)
            if operator == "*":                             # checked before the repeated value is built
                for seq, times in ((left, right), (right, left)):
                    if isinstance(seq, (str, list, tuple)) and isinstance(times, int):
                        _check_length(len(seq) * times)
            return _sized(super().call_binop(context, operator, left, right))

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja's own signature)
            _step()
            if isinstance(__obj, LoopContext) and args:      # recursive loop(...): its items count too
                args = (_counted(args[0]),) + args[1:]
            _check_arguments(args, kwargs)
            _check_format(getattr(inspect.unwrap(__obj), "__self__", None))    # 'x{:>99999999}'.format(...)
            return _sized(super().call(__context, __obj, *args, **kwargs))

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

        def __setitem__(self, name, value):
            jinja2.utils.Namespace.__setitem__(self, name, _sized(value))

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = BoundedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.filters = {name: _sized_filter(name, f) for name, f in env.filters.items()}
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.globals["namespace"] = Namespace
    env.filters[COUNTED] = _counted
    return env


def _sized_filter(name: str, f):
    """A filter whose result is size-checked (jinja's pass_context/... marks are kept by functools.wraps)."""
    @functools.wraps(f)
    def sized(*args, **kwargs):
        _check_arguments(args[1:], kwargs)              # the piped value is args[0] (or after the context)
        if name == "format" and args:
            _check_format(args[0])
        return _sized(f(*args, **kwargs))

    return sized


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

    def __init__(self, source: str, special_tokens: dict[str, str] | None = None,
                 budget: RenderBudget = RenderBudget()):
        if not isinstance(source, str) or not source.strip():
            raise TemplateError("the chat template is empty")
        self.source = source
        self.special_tokens = dict(special_tokens or {})
        self.budget = budget
        self.has_generation = bool(_GENERATION.search(source))
        self._compiled = None

    def __getstate__(self) -> dict:
        return {"source": self.source, "special_tokens": self.special_tokens, "has_generation": self.has_generation,
                "budget": self.budget, "_compiled": None}

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

        steps = self.budget.steps_for(len(messages))
        token = _BUDGET.set([steps, self.budget.max_chars, steps])
        try:
            return _sized(self.compiled.render(messages=messages, tools=None, documents=None,
                                               add_generation_prompt=add_generation_prompt, **self.special_tokens))
        except jinja2.TemplateError as exc:
            raise TemplateError(f"the chat template failed: {exc}") from exc
        except RecursionError:
            raise TemplateError("the chat template recurses too deeply") from None
        except MemoryError:
            raise TemplateError("the chat template ran out of memory") from None
        finally:
            _BUDGET.reset(token)

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
