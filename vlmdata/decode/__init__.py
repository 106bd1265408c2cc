"""Image decoding: image policies, and the Pillow and DALI decoders."""
from vlmdata.decode.policy import DynamicPolicy, FixedPolicy, ImagePolicy, make_policy

__all__ = ["DynamicPolicy", "FixedPolicy", "ImagePolicy", "make_policy"]
