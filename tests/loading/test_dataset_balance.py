"""VLMDataset with balance="compute": exactly once over two ranks and real DataLoader workers, the same
global cursor as the plain plan, elastic resume, the workers' announced reads, the metrics, bad settings."""
import pytest

from tests.loading.test_dataset import corpus, dataset, keys_of, run  # noqa: F401  (corpus is a fixture)
from vlmdata.loading import DatasetOptions
from vlmdata.metrics import MetricSet
from vlmdata.plan import rank_packs

BALANCED = DatasetOptions(window_shards=3, balance="compute")


def test_two_ranks_balanced_exactly_once_with_costs_in_the_stats(corpus):  # noqa: F811
    root, samples = corpus
    per_rank = [run(dataset(root, rank, 2, options=BALANCED), workers=2) for rank in (0, 1)]
    assert len(per_rank[0]) == len(per_rank[1])
    assert sorted(keys_of(per_rank[0]) + keys_of(per_rank[1])) == sorted(samples)
    for a, b in zip(*per_rank):                               # the same step: the same cursor and ratio
        assert a["state"]["cursor"] == b["state"]["cursor"]
        assert a["stats"]["step_imbalance"] == b["stats"]["step_imbalance"] >= 1.0
    metrics = MetricSet()
    for b in per_rank[0]:
        metrics.absorb(b["stats"], rank=0)
    flops = metrics.registry.get_sample_value("vlmdata_compute_flops_total", {"rank": "0"})
    assert flops == pytest.approx(sum(b["stats"]["compute_flops"] for b in per_rank[0])) and flops > 0
    assert metrics.registry.get_sample_value("vlmdata_step_imbalance_ratio_count", {"rank": "0"}) == len(per_rank[0])
    plain = run(dataset(root, 0, 2), workers=0)
    assert "step_imbalance" not in plain[0]["stats"] or plain[0]["stats"]["step_imbalance"] is None


def test_balanced_resume_from_two_ranks_on_one_rank(corpus):  # noqa: F811
    root, samples = corpus
    first = [run(dataset(root, rank, 2, options=BALANCED))[:3] for rank in (0, 1)]
    state = first[0][-1]["state"]
    assert state == first[1][-1]["state"]
    rest = run(dataset(root, 0, 1, options=BALANCED), state=state)
    assert sorted(keys_of(first[0]) + keys_of(first[1]) + keys_of(rest)) == sorted(samples)


def test_announced_reads_follow_the_balanced_deal(corpus):  # noqa: F811
    root, _ = corpus
    for rank in (0, 1):
        ds = dataset(root, rank, 2, options=BALANCED)
        p = ds.planner()
        shard = ds.corpus.shard_of
        for wid in range(2):
            items = list(rank_packs(p, 0, 2, rank, wid, 2, ds.plan_options.balance))
            for k in range(p.num_windows):
                reads = [int(x) for a in items if a.window == k for x in shard(a.samples)]
                first = next((a.step for a in items if a.window is not None and a.window >= k), wid)
                assert ds._worker_reads(p, k, 0, first, 2) == list(dict.fromkeys(reads))


def test_unknown_balance_is_a_clear_error(corpus):  # noqa: F811
    root, _ = corpus
    with pytest.raises(ValueError, match="balance target must be one of"):
        dataset(root, options=DatasetOptions(balance="fastest"))


def test_balance_is_part_of_the_fingerprint_and_none_keeps_the_old_one(corpus):  # noqa: F811
    root, _ = corpus
    plain, balanced = dataset(root), dataset(root, options=BALANCED)
    assert plain.fingerprint != balanced.fingerprint                   # another pack order: no silent resume
    state = run(plain)[2]["state"]
    with pytest.raises(ValueError, match="balance"):
        balanced.load_state_dict(state)
    # without a balance (and a patch budget) the plan's identity is what it was before they existed
    assert "balance" not in plain._plan_identity()
    assert plain.plan_options.max_patches is None
    assert plain._plan_identity() == {k: v for k, v in vars(plain.plan_options).items()
                                      if k not in ("balance", "max_patches")}


def test_balancing_a_qwen2_vl_dataset_keeps_its_patch_budget_and_exactly_once(tmp_path):
    """A dynamic-resolution family packs under a vision-patch budget: the step deal keeps to it too."""
    from torch.utils.data import DataLoader

    from tests.helpers.models import QWEN_TEST_PIXELS, qwen_folder_or_skip, shard_reference_rows
    from vlmdata import VLMDataset

    folder = qwen_folder_or_skip(**QWEN_TEST_PIXELS)
    _, expected, data = shard_reference_rows(tmp_path, folder, max_samples_per_shard=3)
    keys, budget = [], None
    for rank in (0, 1):
        ds = VLMDataset(str(data), max_tokens=1024, rank=rank, world_size=2,
                        options=DatasetOptions(window_shards=2, balance="compute"))
        budget = ds.plan_options.max_patches
        merge = ds.policy.merge
        for batch in DataLoader(ds, batch_size=None):
            keys += batch["sample_keys"]
            patches = int((batch["input_ids"] == ds.collate_config.image_token_id).sum()) * merge * merge
            assert patches <= budget
    assert ds.plan_options.max_images is None and budget == 1024 * 4
    assert sorted(keys) == sorted(f"conv{i}" for i in range(len(expected)))
