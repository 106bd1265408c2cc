"""Text: tokenizers, the conversation encoding (token ids and loss flags), model folders and chat templates,
the exact fast BPE paths (`FastBPE`, `MetaspaceBPE`, chosen by `build_fast_path`); `text.families`: each model's own layout."""
from vlmdata._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "ByteTokenizer": "tokenizer", "IMAGE_MARKER": "tokenizer", "encode_conversation": "tokenizer",
    "load_tokenizer": "tokenizer",
    "ChatTemplate": "chat_template", "RenderBudget": "chat_template", "RenderedChat": "chat_template",
    "TemplateError": "chat_template",
    "Conversation": "conversation", "messages_from_turns": "conversation", "turns_from_messages": "conversation",
    "BuiltinEncoder": "encoder", "load_text_encoder": "encoder",
    "ModelFolder": "model_folder", "is_model_folder": "model_folder",
    "FastBPE": "fast_bpe", "FastEncoding": "fast_bpe", "KNOWN_PATTERNS": "fast_bpe", "encode_texts": "fast_bpe",
    "MetaspaceBPE": "metaspace_bpe", "build_fast_path": "fast_path",
})
