"""DALI webdataset index files (`.idx`), as `fn.readers.webdataset(index_paths=...)` reads them.

The format is the one DALI's own `wds2idx` tool writes (version "v1.2"):

    v1.2 <number of samples>
    <ext> <data offset> <size> <member name> [<ext> <data offset> <size> <member name> ...]

one line per sample, where a member `key.0.jpg` has extension `0.jpg` (the
part after the first dot of the basename) and the offset is that of the
member's data (its header block + 512), not of its header.
"""
from __future__ import annotations

from dataclasses import dataclass

VERSION = "v1.2"


@dataclass(frozen=True)
class Member:
    """A regular-file member of a tar: name, data offset and size."""

    name: str
    offset: int
    size: int


def split_name(name: str) -> tuple[str, str]:
    """(key, extension) split at the first dot of the basename (the webdataset rule)."""
    slash = name.rfind("/") + 1
    dot = name.find(".", slash)
    if dot < 0:
        return name, ""
    return name[:dot], name[dot + 1:]


def format_index(samples: list[list[Member]]) -> bytes:
    """The `.idx` text for samples given as their members in tar order."""
    lines = [f"{VERSION} {len(samples)}"]
    for members in samples:
        parts = []
        for m in members:
            if any(c.isspace() for c in m.name):
                raise ValueError(f"member name {m.name!r} contains whitespace; DALI index cannot hold it")
            parts.append(f"{split_name(m.name)[1]} {m.offset} {m.size} {m.name}")
        lines.append(" ".join(parts))
    return ("\n".join(lines) + "\n").encode("utf-8")


def parse_index(data: bytes) -> list[list[Member]]:
    """Read an `.idx` back (used by tests and `vlmdata inspect`)."""
    lines = data.decode("utf-8").splitlines()
    version, count = lines[0].split()
    if version != VERSION:
        raise ValueError(f"DALI index version {version}, expected {VERSION}")
    out = []
    for line in lines[1:1 + int(count)]:
        f = line.split()
        out.append([Member(name=f[i + 3], offset=int(f[i + 1]), size=int(f[i + 2])) for i in range(0, len(f), 4)])
    return out
