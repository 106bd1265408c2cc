"""The worker auto-tuner: settings, measuring a pipeline, the adaptive search, memory sampling, the result cache."""
from vlmdata._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "ConsumerLoad": "consumer",
    "LoopedDataset": "looping",
    "LoaderRunner": "measure", "MeasurePlan": "measure",
    "MemorySampler": "memory", "child_pids": "memory", "read_proc_mem": "memory",
    "TuneCache": "result_cache", "cache_key": "result_cache", "dataset_fingerprint": "result_cache",
    "default_cache_path": "result_cache", "machine_fingerprint": "result_cache",
    "total_memory": "result_cache", "usable_cpus": "result_cache",
    "Measurement": "results", "TuneResult": "results",
    "cost_key": "search", "make_space": "search",
    "LoaderSettings": "settings", "ThreadTunable": "settings", "TuneBudget": "settings", "TuneConfig": "settings",
    "WorkerThreads": "settings",
    "auto_loader_settings": "tuner", "format_table": "tuner", "tune": "tuner", "tune_cached": "tuner",
})
