"""Reading Markdown for the documentation tests: fenced code blocks and sections."""
from __future__ import annotations

import re
from dataclasses import dataclass

FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>[^\n`]*)$")


@dataclass(frozen=True)
class CodeBlock:
    lang: str       # the info string's first word ("" when untagged)
    code: str
    line: int       # 1-based line of the opening fence


def code_blocks(text: str) -> list[CodeBlock]:
    """Every fenced code block of a Markdown text, in order (CommonMark fences: ``` or ~~~, same or longer close)."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        fence, start, body = opening["fence"], i + 1, []
        i += 1
        while i < len(lines) and not re.match(rf"^ {{0,3}}{fence[0]}{{{len(fence)},}}\s*$", lines[i]):
            body.append(lines[i])
            i += 1
        if i == len(lines):
            raise ValueError(f"line {start}: code block never closed")
        words = opening["info"].split()
        blocks.append(CodeBlock(words[0] if words else "", "\n".join(body) + "\n", start))
        i += 1
    return blocks


def heading_span(text: str, heading: str) -> range:
    """The 1-based line numbers under `heading` (e.g. "## Quick start"), up to the next heading of its level
    or higher outside code blocks."""
    level = len(heading) - len(heading.lstrip("#"))
    lines, inside, start = text.splitlines(), False, None
    for number, line in enumerate(lines, 1):
        if FENCE.match(line):
            inside = not inside
        elif not inside and start is None and line.rstrip() == heading:
            start = number
        elif not inside and start is not None and re.match(rf"^#{{1,{level}}} ", line):
            return range(start, number)
    if start is None:
        raise ValueError(f"no heading {heading!r}")
    return range(start, len(lines) + 1)
