"""NVIDIA DALI decoding: the pipeline runner, the CPU decoder for DataLoader workers, the GPU stages (images, videos) for the training process."""
from vlmdata._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "DaliCpuDecoder": "cpu", "target_hw": "cpu",
    "DaliGpuStage": "gpu", "GpuStageOptions": "gpu", "image_owners": "gpu", "patchify": "gpu",
    "DaliConfig": "pipeline", "DaliRunner": "pipeline", "Normalization": "pipeline",
    "define_pipeline": "pipeline", "looks_like_image": "pipeline",
    "cpu_only": "routing", "plan_decode": "routing",
    "DaliVideoStage": "video", "DaliVideoPipeline": "video", "VideoStageOptions": "video", "DALI_VIDEO_CODECS": "video",
    "DEFERRED_VIDEO_FIELDS": "video", "drop_samples": "bad_samples",
})
