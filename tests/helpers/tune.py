"""Helpers for the tuner tests: a model runner (no processes) and a small real dataset."""
from __future__ import annotations

from tests.helpers.corpus import gen_raw_path
from vlmdata.testing import SyntheticSpec
from vlmdata.tune import LoaderSettings, Measurement, MeasurePlan


class ModelRunner:
    """A runner whose rates come from `SyntheticSpec.expected_rate` (no processes): fast search tests.

    Per-worker memory is `mem_per_worker` bytes; `noise` is a deterministic
    relative wobble applied per call so the search meets unequal repeats.
    """

    def __init__(self, spec: SyntheticSpec, mem_per_worker: int = 50 << 20, noise: float = 0.0,
                 first_run_factor: dict[int, float] | None = None, chunk_noise: float = 0.0):
        self.spec = spec
        self.mem_per_worker = mem_per_worker
        self.noise = noise
        self.first_run_factor = dict(first_run_factor or {})   # workers -> factor on its first run only
        self.chunk_noise = chunk_noise                          # relative spread of the chunk rates
        self.calls = 0
        self.seen: list[LoaderSettings] = []

    tunes_threads = True      # the model's rate depends on decode threads

    def measure(self, settings: LoaderSettings, plan: MeasurePlan) -> Measurement:
        self.calls += 1
        self.seen.append(settings)
        rate = self.spec.expected_rate(settings.num_workers, settings.decode_threads)
        rate *= 1 + self.noise * (1 if self.calls % 2 else -1)
        rate *= self.first_run_factor.pop(settings.num_workers, 1.0)
        tok = rate * self.spec.tokens_per_item
        chunks = [tok * (1 + self.chunk_noise * (-1) ** i) for i in range(6)]
        secs = plan.measure_s
        n = max(plan.min_batches, int(rate * secs))
        return Measurement(settings=settings, batches=n, images=n * self.spec.images_per_item,
                           tokens=n * self.spec.tokens_per_item, seconds=n / rate, wall_s=n / rate + 0.5,
                           chunk_rates={"tokens": chunks},
                           worker_pss=[self.mem_per_worker] * settings.num_workers)


def make_small_dataset(root, samples: int = 80, seed: int = 0) -> str:
    """A gen_raw corpus sharded with shard_dataset; returns the dataset directory."""
    import os
    import subprocess
    import sys

    from vlmdata.ingest import ShardConfig, shard_dataset

    raw, out = os.path.join(root, "raw"), os.path.join(root, "ds")
    subprocess.run([sys.executable, str(gen_raw_path()), raw, "--samples", str(samples),
                    "--seed", str(seed)], check=True, stdout=subprocess.DEVNULL)
    shard_dataset(ShardConfig(inputs=[os.path.join(raw, "data.jsonl")], output=out,
                              max_samples_per_shard=max(10, samples // 4), workers=1))
    return out
