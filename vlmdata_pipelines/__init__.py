"""End-to-end programs built on vlmdata: a small VLM, varlen attention, the torchrun trainer, the demo."""
