"""Video clips: probing their metadata without decoding, and decoding only the frames a sampler chose."""
from vlmdata._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "ClipInfo": "probe", "ClipLimits": "probe", "ClipProblem": "probe", "probe_clip": "probe",
    "decode_frames": "frames",
})
