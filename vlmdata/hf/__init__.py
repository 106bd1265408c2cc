"""Batches Hugging Face VLMs train on directly: output adapters, M-RoPE, the Trainer recipe.

    spec = ModelSpec.from_folder("Qwen2-VL-2B-Instruct/")         # family, image token, mean/std, patches
    ds = VLMDataset(data, max_tokens=8192, image_size=spec.image_policy())
    adapter = make_adapter(spec, attn_implementation="flash_attention_2")
    for batch in make_loader(ds, adapter=adapter):                  # adapter(pack) runs in the workers
        keys = take_meta(batch)["sample_keys"]                      # provenance, kept off the model
        loss = model(**adapter.finalize(batch, device="cuda", dtype=torch.bfloat16)).loss

`VLMTrainer` does the same inside `transformers.Trainer` (and under
`accelerate launch`); `load_model(DIR)` builds the model with the attention
implementation packed batches need on the device. Importing this package needs
neither torch nor transformers; its modules do.
"""
from vlmdata._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "META_KEY": "adapter", "HFBatchAdapter": "adapter", "LlavaAdapter": "adapter", "QwenVLAdapter": "adapter",
    "Qwen3VLAdapter": "adapter", "InternVLAdapter": "adapter",
    "Idefics3Adapter": "adapter", "Gemma3Adapter": "gemma3_adapter", "gemma3_packed_masks": "gemma3_adapter",
    "LlavaOnevisionAdapter": "llava_onevision_adapter",
    "TiledAdapter": "adapter",
    "make_adapter": "adapter", "ProcessorAdapter": "adapter", "take_meta": "adapter", "text_attention": "adapter",
    "attention_kind": "boundaries", "block_causal_mask": "boundaries", "flash_kwargs": "boundaries",
    "choose_attention": "model", "has_weights": "model", "load_model": "model",
    "mrope_position_ids": "mrope",
    "clip_pixels": "pixels", "fixed_to_patches": "pixels", "qwen_patches": "pixels",
    "FAMILIES": "spec", "ModelSpec": "spec", "OPENAI_CLIP_MEAN": "spec", "OPENAI_CLIP_STD": "spec",
    "VLMTrainer": "trainer",
    "VARLEN_ATTENTION": "varlen", "register_varlen_attention": "varlen", "varlen_attention_forward": "varlen",
})
