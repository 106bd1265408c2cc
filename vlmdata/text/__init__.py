"""Text: tokenizers and the conversation encoding (token ids and loss flags)."""
from vlmdata._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "ByteTokenizer": "tokenizer", "IMAGE_MARKER": "tokenizer", "encode_conversation": "tokenizer",
    "load_tokenizer": "tokenizer",
})
