"""Video clips: probing their metadata without decoding, decoding only the frames a sampler chose, re-encoding
them to bounds (opt-in at shard time), and the model families' video policies (which frames, their size and
tokens)."""
from vlmdata._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "ClipInfo": "probe", "ClipLimits": "probe", "ClipProblem": "probe", "probe_clip": "probe",
    "decode_frames": "frames", "decode_window": "frames",
    "FRAME_LIST_CODEC": "frame_list", "decode_frame_list": "frame_list", "frame_list_info": "frame_list",
    "pack_frames": "frame_list",
    "DecodedVideo": "layout", "VideoPolicy": "policy", "make_video_policy": "policy", "sample_video_tokens": "policy",
    "flatten_video": "layout", "POLICY_KINDS": "policy", "ClipLayout": "layout", "video_tokens": "layout",
    "load_clip": "clip_load",
    "OnevisionVideoPolicy": "onevision_policy", "InternVLVideoPolicy": "internvl_policy",
    "frame_prefix_texts": "internvl_policy",
    "Qwen3VideoPolicy": "qwen3_policy", "smart_resize_video": "qwen3_policy",
    "TIMESTAMP_PIECES": "timestamps", "patch_timestamps": "timestamps", "stamp_ids": "timestamps",
    "stamp_pieces": "timestamps", "stamp_text": "timestamps", "stamps_length": "timestamps",
    "TranscodeSettings": "transcode", "parse_transcode": "transcode", "transcode_clip": "transcode",
    "transcoded_size": "transcode", "DEFAULT_TRANSCODE_SECONDS": "transcode",
    "TRANSCODE_OFF": "transcode",
})
