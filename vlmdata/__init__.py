"""vlmdata: a high-throughput multimodal data pipeline for training vision-language models.

The public names are imported lazily (PEP 562), so that `import vlmdata.formats`
in sharding workers or the CLI does not pay for importing torch.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "VLMDataset": "vlmdata.dataset",
    "DatasetOptions": "vlmdata.dataset",
    "make_loader": "vlmdata.loader",
    "FixedPolicy": "vlmdata.decode.policy",
    "DynamicPolicy": "vlmdata.decode.policy",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'vlmdata' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
