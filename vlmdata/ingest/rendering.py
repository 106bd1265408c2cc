"""Stored tokens as readable text, decoded with the tokenizer of the text view they belong to.

A sample's (2, T) tokens (ids, loss flags) become `Piece`s: text, trained text, and image
placeholders. Text is decoded a whole run at a time (a byte-level BPE token may hold part of a
UTF-8 character, so decoding token by token prints `�`), and a run is cut where its loss flags
change at the longest prefix its own decoding shares with the whole run's: a character split
between two tokens goes whole to the piece where it ends. Joined, the pieces give exactly the
decoded text.

The tokenizer is the view's identity (`Manifest.view(name)[1]["tokenizer"]`): a model folder's
`tokenizer.json` (checked against the SHA-256 recorded at shard time; `tokenizer_dir` points at
a copy elsewhere), a `tokenizers` JSON file, or vlmdata's byte tokenizer. vlmdata's own layouts
show their role ids as `[user]` / `[assistant]`; a model's special tokens print as themselves.

`format_pieces` marks images and trained spans: `⟦…⟧` around trained text in plain text, colour
on a terminal.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from vlmdata.decode.tiled import sample_args
from vlmdata.errors import ConfigError

__all__ = ["ANSI", "PLAIN", "Piece", "TokenRenderer", "format_pieces"]

TRAINED_OPEN, TRAINED_CLOSE = "⟦", "⟧"
PLAIN = "plain"
ANSI = "ansi"
_GREEN, _CYAN, _RESET = "\x1b[32m", "\x1b[36m", "\x1b[0m"


@dataclass(frozen=True)
class Piece:
    """Part of a sample's text: kind "text", "trained" or "image", its tokens [start, end), its text
    (an image's marker for "image")."""

    kind: str
    start: int
    end: int
    text: str


def _split_run(decode: Callable[[list[int]], str], ids: list[int], cuts: list[int]) -> list[str]:
    """The decoded text of ids[cuts[i]:cuts[i + 1]] for each i, cut inside the whole run's decoding."""
    full = decode(ids)
    at = [0]
    for n in cuts[1:-1]:
        prefix = decode(ids[:n])
        while prefix and not full.startswith(prefix):   # a split character: it goes to the next piece
            prefix = prefix[:-1]
        at.append(max(at[-1], len(prefix)))
    at.append(len(full))
    return [full[a:b] for a, b in zip(at[:-1], at[1:])]


class TokenRenderer:
    """Turns stored tokens into `Piece`s with one tokenizer (see the module docstring).

    `decode(ids) -> str` decodes a run of ids; `names` maps ids shown by a fixed text (vlmdata's role
    tokens); `image_tokens(w, h, n)` gives the tokens an image of a sample of n images expands to at load time
    (None: unknown).
    """

    def __init__(self, decode: Callable[[list[int]], str], image_id: int, names: dict[int, str] | None = None,
                 image_tokens: Callable[[int, int], int] | None = None):
        self.decode = decode
        self.image_id = int(image_id)
        self.names = names or {}
        self.image_tokens = image_tokens

    @classmethod
    def for_identity(cls, identity: dict, tokenizer_dir: str | None = None) -> TokenRenderer:
        """The renderer of a text view's tokenizer identity (a manifest's `tokenizer` or a view's)."""
        if identity.get("name") == "model-folder":
            return cls._model_folder(identity, tokenizer_dir)
        from vlmdata.text.tokenizer import load_tokenizer

        tok = load_tokenizer(identity.get("path") if identity.get("name") == "hf-tokenizers" else None)
        sp = tok.special
        names = {sp.bos: "", sp.eos: "<eos>", sp.user: "\n[user] ", sp.assistant: "\n[assistant] ", sp.pad: "<pad>"}
        return cls(tok.decode, sp.image, names)

    @classmethod
    def _model_folder(cls, identity: dict, tokenizer_dir: str | None) -> TokenRenderer:
        from tokenizers import Tokenizer

        from vlmdata.text.families.base import VisionSpec
        from vlmdata.text.model_folder import ModelFolder

        path = tokenizer_dir or identity.get("path", "")
        if not os.path.isfile(os.path.join(path, "tokenizer.json")):
            raise ConfigError(f"the dataset's tokenizer ({identity.get('model')}) was read from {path!r}, which has "
                              "no tokenizer.json here; pass the model folder with --tokenizer DIR")
        folder = ModelFolder.load(path)
        if identity.get("sha256") and folder.tokenizer_sha256 != identity["sha256"]:
            raise ConfigError(f"the tokenizer files in {path} are not those the dataset was tokenized with (sha256 "
                              f"{folder.tokenizer_sha256[:12]}, recorded {identity['sha256'][:12]}); pass the "
                              "original model folder with --tokenizer DIR")
        tok = Tokenizer.from_str(folder.tokenizer_json)
        policy = VisionSpec.from_dict(identity["vision"]).image_policy() if identity.get("vision") else None
        count = (lambda w, h, n: int(policy.tokens([w], [h], *sample_args(policy, [n]))[0])) if policy else None
        video = identity["special"].get("video")
        names = {video: "<video>"} if video is not None and tok.id_to_token(video) is None else {}  # InternVL's id
        return cls(lambda ids: tok.decode(ids, skip_special_tokens=False), identity["special"]["image"], names,
                   image_tokens=count)

    def _image_marker(self, size: tuple[int, int] | None, images: int) -> str:
        if size is None:
            return "<image>"
        w, h = size
        n = self.image_tokens(w, h, images) if self.image_tokens is not None and w and h else None
        return f"<image {w}x{h}" + (f" ×{n}>" if n is not None else ">")

    def pieces(self, tokens: np.ndarray, sizes: list[tuple[int, int]]) -> list[Piece]:
        """The sample's text, images and trained spans, in order (see the module docstring)."""
        ids, trained = tokens[0].tolist(), (np.asarray(tokens[1]) != 0).tolist()
        out: list[Piece] = []
        n_img = 0
        a = 0
        while a < len(ids):
            i = ids[a]
            if i == self.image_id or i in self.names:
                text = self._image_marker(sizes[n_img] if n_img < len(sizes) else None, len(sizes)) \
                    if i == self.image_id else self.names[i]
                n_img += i == self.image_id
                kind = "image" if i == self.image_id else ("trained" if trained[a] else "text")
                out.append(Piece(kind, a, a + 1, text))
                a += 1
                continue
            b = a
            while b < len(ids) and ids[b] != self.image_id and ids[b] not in self.names:
                b += 1
            cuts = [a] + [k for k in range(a + 1, b) if trained[k] != trained[k - 1]] + [b]
            texts = _split_run(self.decode, ids[a:b], [c - a for c in cuts])
            out += [Piece("trained" if trained[s] else "text", s, e, t) for s, e, t in zip(cuts[:-1], cuts[1:], texts)]
            a = b
        return _merge(out)

    def text(self, tokens: np.ndarray, sizes: list[tuple[int, int]]) -> str:
        """The sample's text with image markers, unmarked."""
        return "".join(p.text for p in self.pieces(tokens, sizes))


def _merge(pieces: list[Piece]) -> list[Piece]:
    """Adjacent pieces of the same kind (not images) joined: one piece per trained span."""
    out: list[Piece] = []
    for p in pieces:
        if out and p.kind != "image" and out[-1].kind == p.kind and out[-1].end == p.start:
            q = out.pop()
            p = Piece(p.kind, q.start, p.end, q.text + p.text)
        out.append(p)
    return out


def format_pieces(pieces: list[Piece], style: str = PLAIN) -> str:
    """The text with trained spans in ⟦…⟧ (plain) or green, image markers in cyan (ansi)."""
    if style not in (PLAIN, ANSI):
        raise ValueError(f"style must be {PLAIN!r} or {ANSI!r}, got {style!r}")
    out = []
    for p in pieces:
        if p.kind == "trained":
            out.append(f"{_GREEN}{p.text}{_RESET}" if style == ANSI else f"{TRAINED_OPEN}{p.text}{TRAINED_CLOSE}")
        elif p.kind == "image" and style == ANSI:
            out.append(f"{_CYAN}{p.text}{_RESET}")
        else:
            out.append(p.text)
    return "".join(out)
