"""Every pipelines test leaves no process group behind: trainers may create a 1-rank group."""
import pytest
import torch.distributed as dist


@pytest.fixture(autouse=True)
def process_group():
    """Destroy the default process group a test created, so no other test sees it."""
    yield
    if dist.is_initialized():
        dist.destroy_process_group()
