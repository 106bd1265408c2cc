"""A model family: how one kind of VLM lays out text and image tokens, read from its model folder.

`ModelFamily` (subclassed per family) renders a `Conversation` with the model's
own chat template, tokenizes it with the model's own tokenizer and marks the
trained tokens; the image placeholder is one image token per image, expanded
at load time by the family's image policy to exactly what the model's
processor produces (`VisionSpec.image_policy()`).

`VisionSpec` and `FamilySpec` are plain frozen data: they travel in the
manifest, so a dataset's loader knows its model family, image policy and
vision constants without the model folder (`FamilySpec.from_identity`).

Loss masks (`train_on`):
    "assistant"  every assistant reply and the end-of-turn token closing it (default; what TRL and
                 LLaMA-Factory train on); the template's {% generation %} blocks when it has them
    "last"       the last assistant reply only
    "all"        every token (image tokens and the first token never carry loss; see loading.collate)
Documents (interleaved text and images, no template) are trained on all text.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import partial
from typing import ClassVar

import numpy as np

from vlmdata.errors import ConfigError
from vlmdata.text.chat_template import ChatTemplate, TemplateError
from vlmdata.text.conversation import Conversation
from vlmdata.text.fast_bpe import encode_texts
from vlmdata.text.fast_path import build_fast_path
from vlmdata.text.model_folder import ModelFolder

__all__ = ["TRAIN_ON", "FamilySpec", "ModelFamily", "VisionSpec", "replace_marked"]

TRAIN_ON = ("assistant", "last", "all")


@dataclass(frozen=True)
class VisionSpec:
    """A family's vision preprocessing constants, as its Hugging Face image processor uses them.

    `policy` is the image policy as a dict (`decode.policy.make_policy` input): Qwen2-VL's
    smart_resize bounds ("dynamic") or LLaVA's fixed 336 px ("fixed"). `image_size` is the fixed
    side for fixed-size families (LLaVA resizes the shortest side to it, then centre-crops), else None.
    """

    image_token: str
    image_token_id: int
    vision_start_id: int | None
    vision_end_id: int | None
    patch_size: int
    merge_size: int
    temporal_patch_size: int
    image_mean: tuple[float, ...]
    image_std: tuple[float, ...]
    min_pixels: int | None
    max_pixels: int | None
    image_size: int | None
    resample: int
    policy: dict
    video_policy: dict | None = None     # a family that lays out videos: `video.policy.make_video_policy` input
    video_token_id: int | None = None    # ... and the token it writes once per video
    tokens_per_second: float | None = None   # Qwen2.5-VL's M-RoPE time scale (its config.json)

    def image_policy(self):
        """The `FixedPolicy` / `DynamicPolicy` that expands this family's image tokens."""
        from vlmdata.decode.policy import make_policy

        return make_policy(dict(self.policy))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["image_mean"], d["image_std"] = list(self.image_mean), list(self.image_std)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> VisionSpec:
        d = dict(d)
        d["image_mean"], d["image_std"] = tuple(d["image_mean"]), tuple(d["image_std"])
        return cls(**d)


@dataclass(frozen=True)
class FamilySpec:
    """What a loader needs to know of a dataset's model family (no tokenizer, no model folder)."""

    name: str
    vision: VisionSpec
    pad_token_id: int
    bos_token_id: int | None
    eos_token_id: int | None
    vocab_size: int
    tokenizer_sha256: str

    @classmethod
    def from_identity(cls, identity: dict) -> FamilySpec | None:
        """The spec recorded in a manifest's tokenizer identity; None for vlmdata's own tokenizers."""
        if identity.get("name") != "model-folder":
            return None
        sp = identity["special"]
        return cls(name=identity["family"], vision=VisionSpec.from_dict(identity["vision"]), pad_token_id=sp["pad"],
                   bos_token_id=sp.get("bos"), eos_token_id=sp.get("eos"), vocab_size=identity["vocab_size"],
                   tokenizer_sha256=identity["sha256"])


def _post_processor(tok, cfg: dict, bos: str | None, eos: str | None) -> None:
    """Apply tokenizer_config's add_bos_token / add_eos_token the way transformers does."""
    from tokenizers import processors

    if "add_bos_token" not in cfg and "add_eos_token" not in cfg:
        return
    add_bos = bool(cfg.get("add_bos_token")) and bos is not None
    add_eos = bool(cfg.get("add_eos_token")) and eos is not None
    single = (f"{bos}:0 " if add_bos else "") + "$A:0" + (f" {eos}:0" if add_eos else "")
    pair = single + " " + (f"{bos}:1 " if add_bos else "") + "$B:1" + (f" {eos}:1" if add_eos else "")
    specials = [(t, tok.token_to_id(t)) for t, on in ((bos, add_bos), (eos, add_eos)) if on]
    tok.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=specials)


def replace_marked(text: str, spans, marker: str, replacement) -> tuple[str, tuple[tuple[int, int], ...]]:
    """`text` with every `marker` replaced (as a processor replaces its image marker) by `replacement`, or
    by the n-th of a sequence of replacements for the n-th marker, and the character spans moved to where
    their text now is."""
    found = []
    at = text.find(marker)
    while at >= 0:
        found.append(at)
        at = text.find(marker, at + len(marker))
    texts = [replacement] * len(found) if isinstance(replacement, str) else list(replacement)
    if len(texts) != len(found):
        raise TemplateError(f"the rendered text holds {len(found)} {marker!r} markers for {len(texts)} images")
    if not found:
        return text, tuple(spans)
    starts = np.asarray(found)
    grown = np.concatenate([[0], np.cumsum([len(t) - len(marker) for t in texts])])
    pieces = text.split(marker)
    joined = pieces[0] + "".join(t + p for t, p in zip(texts, pieces[1:]))

    def moved(pos: int) -> int:
        return pos + int(grown[np.searchsorted(starts, pos, side="left")])

    return joined, tuple((moved(a), moved(b)) for a, b in spans)


def _tokens_over(offsets: np.ndarray, a: int, b: int) -> tuple[int | None, int | None]:
    """(first, last) token whose characters overlap [a, b), or (None, None). Every token of a character
    counts: a character the tokenizer spells in several byte-fallback tokens is trained whole."""
    over = np.flatnonzero((offsets[:, 0] < b) & (offsets[:, 1] > a))
    if not len(over):
        return None, None
    return int(over[0]), int(over[-1])


class ModelFamily:
    """Base class; a subclass names its family, recognises its folders and gives its vision constants."""

    name: ClassVar[str] = ""
    model_types: ClassVar[tuple[str, ...]] = ()       # config.json model_type values it serves
    processors: ClassVar[tuple[str, ...]] = ()        # processor_class values, when there is no model_type
    image_processors: ClassVar[tuple[str, ...]] = ()  # image_processor_type prefixes, when there is neither
    end_of_turn: ClassVar[tuple[str, ...]] = ()       # tokens trained right after an assistant reply

    def __init__(self, folder: ModelFolder, train_on: str = "assistant"):
        from tokenizers import Tokenizer

        if train_on not in TRAIN_ON:
            raise ConfigError(f"train_on must be one of {', '.join(TRAIN_ON)}, got {train_on!r}")
        self.folder = folder
        self.train_on = train_on
        try:
            self.tokenizer = Tokenizer.from_str(folder.tokenizer_json)
        except Exception as exc:  # the tokenizers library raises plain Exception subclasses
            raise ConfigError(f"{folder.path}/tokenizer.json cannot be loaded: {exc}") from exc
        self.specials = {k: folder.special_token(k) for k in ("bos_token", "eos_token", "unk_token", "pad_token")}
        _post_processor(self.tokenizer, folder.tokenizer_config, self.specials["bos_token"], self.specials["eos_token"])
        self.fast_bpe, self.fast_bpe_reason = build_fast_path(self.tokenizer, folder.tokenizer_json)
        if folder.chat_template is None:
            raise ConfigError(f"model folder {folder.path} has no chat template (chat_template.jinja, "
                              "chat_template.json or tokenizer_config.json's chat_template)")
        self.template = ChatTemplate(folder.chat_template, {k: v for k, v in self.specials.items() if v is not None})
        self.vision = self.vision_spec()
        self.eot_ids = frozenset(self.token_id(t) for t in self.end_of_turn)
        pad = self.specials["pad_token"] or self.specials["eos_token"]
        self.pad_token_id = self.token_id(pad) if pad else self.vision.image_token_id
        self.bos_token_id = self.token_id(self.specials["bos_token"]) if self.specials["bos_token"] else None
        self.eos_token_id = self.token_id(self.specials["eos_token"]) if self.specials["eos_token"] else None

    # ---- what a subclass provides ------------------------------------------------------------
    @classmethod
    def matches(cls, folder: ModelFolder) -> bool:
        """The folder's strongest hint decides: config.json's model_type, else the processor class, else
        the image processor type (a folder with only preprocessor_config.json)."""
        h = folder.hints()
        if h["model_type"] is not None:
            return h["model_type"] in cls.model_types
        if h["processor_class"] is not None:
            return h["processor_class"] in cls.processors
        kind = str(h["image_processor_type"] or "")
        return any(kind.startswith(prefix) for prefix in cls.image_processors)

    def vision_spec(self) -> VisionSpec:
        raise NotImplementedError

    def template_image_marker(self) -> str | None:
        """What the chat template writes for each image when the processor then replaces it with other text
        (InternVL's `<image>`, Gemma 3's `<start_of_image>`); None when the template writes the placeholder."""
        return None

    def placeholder_text(self) -> str:
        """The text vlmdata tokenizes for one image: the processor's replacement with its run of image
        tokens cut to one `image_token` (expanded at load time by the image policy)."""
        return self.vision.image_token

    def image_texts(self, conv: Conversation) -> list[str] | None:
        """Each image's own replacement text, in order, for a family whose text around an image depends on
        the image's stored size (`conv.image_sizes`); None: `placeholder_text` for every image."""
        return None

    def document_image_text(self) -> str:
        """The text standing for one image in a document (no chat template)."""
        return self.placeholder_text()

    def video_config(self) -> dict:
        """The folder's video processor settings: video_preprocessor_config.json, else processor_config.json's
        `video_processor` entry ({} when it ships none)."""
        found = self.folder.read_json("video_preprocessor_config.json")
        nested = self.folder.processor.get("video_processor")
        return found or (nested if isinstance(nested, dict) else {})

    def document_video_text(self) -> str:
        """The text standing for one video in a document (a family that lays out videos gives it)."""
        raise TemplateError(f"the {self.name} model family lays out no videos")

    def document_end(self) -> str | None:
        """The token closing a document (trained)."""
        return self.specials["eos_token"]

    # ---- shared -------------------------------------------------------------------------------
    def token_id(self, token: str) -> int:
        """The id of a token the layout needs; a clear error when the tokenizer lacks it."""
        tid = self.tokenizer.token_to_id(token)
        if tid is None:
            raise ConfigError(f"the tokenizer in {self.folder.path} has no token {token!r}, which the {self.name} "
                              "layout needs; is this the right model folder?")
        return tid

    def ids_between(self, left: str, text: str, right: str) -> tuple[int, ...]:
        """The ids of `text` as a processor's full string tokenizes it between the special tokens `left` and
        `right` (which split the text there, so the ids are fixed per tokenizer)."""
        ids = self.tokenizer.encode(f"{left}{text}{right}", add_special_tokens=False).ids
        return tuple(ids[1:-1])

    @property
    def image_token_id(self) -> int:
        return self.vision.image_token_id

    @property
    def spec(self) -> FamilySpec:
        return FamilySpec(name=self.name, vision=self.vision, pad_token_id=self.pad_token_id,
                          bos_token_id=self.bos_token_id, eos_token_id=self.eos_token_id,
                          vocab_size=self.tokenizer.get_vocab_size(with_added_tokens=True),
                          tokenizer_sha256=self.folder.tokenizer_sha256)

    def identity(self) -> dict:
        """The manifest's tokenizer identity: family, files' hashes, ids and vision constants."""
        return {"name": "model-folder", "family": self.name, "model": self.folder.path.rstrip("/").split("/")[-1],
                "path": self.folder.path, "sha256": self.folder.tokenizer_sha256,
                "vision_sha256": self.folder.vision_sha256,
                "vocab_size": self.tokenizer.get_vocab_size(with_added_tokens=True),
                "special": {"image": self.image_token_id, "pad": self.pad_token_id, "bos": self.bos_token_id,
                            "eos": self.eos_token_id,
                            **({"video": self.video_token_id} if getattr(self, "encodes_video", False) else {})},
                "vision": self.vision.to_dict()}

    def render(self, conv: Conversation) -> tuple[str, tuple[tuple[int, int], ...]]:
        """(text, trained character spans) of a conversation, before tokenization."""
        if conv.kind == "document":
            return self._document_text(conv), ()
        rendered = self.template.render(conv.messages)
        text, spans = rendered.text, rendered.spans
        marker = self.template_image_marker()
        if marker is not None:
            text, spans = replace_marked(text, spans, marker, self.image_texts(conv) or self.placeholder_text())
        if self.train_on == "last":
            spans = spans[-1:]
        return text, spans

    def _document_text(self, conv: Conversation) -> str:
        parts: list[str] = []
        last_text = False
        own = self.image_texts(conv)
        images = iter(own) if own is not None else None
        for m in conv.messages:
            for item in m["content"]:
                if item.get("type") in ("image", "video"):
                    if item["type"] == "video":
                        parts.append(self.document_video_text())
                    else:
                        parts.append(next(images) if images is not None else self.document_image_text())
                    last_text = False
                else:
                    if last_text:
                        parts.append("\n\n")
                    parts.append(item.get("text", ""))
                    last_text = True
        end = self.document_end()
        if end:
            parts.append(end)
        return "".join(parts)

    def _add_special(self, text: str) -> bool:
        bos = self.specials["bos_token"]
        return not (bos is not None and text.startswith(bos))

    def encode(self, conv: Conversation) -> np.ndarray:
        """(2, T) int32 token ids and loss flags; ValueError (TemplateError) for a conversation it cannot encode."""
        out = self.encode_batch([conv])[0]
        if isinstance(out, Exception):
            raise out
        return out

    def encode_batch(self, convs: list[Conversation]) -> list[np.ndarray | ValueError]:
        """`encode` for many conversations at once (the exact fast path, `text.fast_bpe`, where it applies, else
        one fast-tokenizer batch call); failures are returned."""
        rendered: list[tuple[str, tuple, str] | ValueError] = []
        for conv in convs:
            try:
                text, spans = self.render(conv)
                rendered.append((text, spans, "all" if conv.kind == "document" else self.train_on))
            except TemplateError as exc:
                rendered.append(exc)
        results: list[np.ndarray | ValueError | None] = [r if isinstance(r, ValueError) else None for r in rendered]
        for flag in (True, False):
            idx = [i for i, r in enumerate(rendered) if not isinstance(r, ValueError) and self._add_special(r[0]) == flag]
            if not idx:
                continue
            encodings = encode_texts(self.fast_bpe, self.tokenizer, [rendered[i][0] for i in idx], flag)
            for i, enc in zip(idx, encodings):
                results[i] = self._tokens(enc, rendered[i][1], rendered[i][2], convs[i].n_images, convs[i].n_videos)
        return results

    @property
    def video_unsupported_reason(self) -> str | None:
        """Why this folder's videos are not laid out, when the family has a video layout this folder cannot
        use (a video-settings ConfigError kept by `tile_video.laid_out_or_warn`); None otherwise."""
        return None if getattr(self, "encodes_video", False) else getattr(self, "_video_reason", None)

    def stored_tokens(self, out: np.ndarray) -> np.ndarray:
        """The (2, T) ids and loss flags as stored, from the tokenizer's: the same, unless a family's video
        placeholder is not one token of the tokenizer (InternVL's)."""
        return out

    def _tokens(self, enc, spans, mode: str, n_images: int, n_videos: int = 0) -> np.ndarray | ValueError:
        ids = np.asarray(enc.ids, dtype=np.int32)
        out = np.zeros((2, len(ids)), np.int32)
        out[0] = ids
        found = int((ids == self.image_token_id).sum())
        if found != n_images:
            return ValueError(f"the rendered text holds {found} image tokens for {n_images} images")
        if mode == "all":
            out[1] = 1
        else:
            over = getattr(enc, "tokens_over", None)      # the fast path's encodings answer without offsets
            if over is None:
                offsets = np.asarray(enc.offsets, dtype=np.int64).reshape(-1, 2)
                over = partial(_tokens_over, offsets)
            for a, b in spans:
                first, last = over(a, b)
                if first is None:
                    continue
                out[1][first:last + 1] = 1
                nxt = last + 1
                if nxt < len(ids) and int(ids[nxt]) in self.eot_ids and (enc.token_to_chars(nxt) or (b,))[0] >= b:
                    out[1][nxt] = 1
        out[1][ids == self.image_token_id] = 0
        video = getattr(self, "video_token_id", None) if getattr(self, "encodes_video", False) else None
        if video is not None:
            out = self.stored_tokens(out)
            if int((out[0] == video).sum()) != n_videos:
                return ValueError(f"the rendered text holds {int((out[0] == video).sum())} video tokens for "
                                  f"{n_videos} videos")
            out[1][out[0] == video] = 0
        return out
