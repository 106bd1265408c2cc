"""A plan share another local user got at first: a plan_dir they own or can write, a symlinked journal, a forged
window, a counts file of zeros. None is used: folders and files are refused with the reason, forged windows and
counts are planned again (tests run as root: "another user" is a chown to uid 12345)."""
import os

import numpy as np
import pytest

from tests.helpers.dataset import make_samples, write_dataset
from tests.helpers.plan import FIXED112, synthetic_columns
from vlmdata.errors import UnsafePathError
from vlmdata.loading import DatasetOptions, VLMDataset
from vlmdata.plan import Corpus, EpochPlanner, PlanOptions, PlanShare

OPTS = PlanOptions(max_tokens=2048, max_images=8, window_shards=3)
OTHER = 12345


def corpus():
    cols, sizes = synthetic_columns(n_shards=30, seed=4)
    return Corpus.build([cols], [sizes])


def planner(share, key="fp-e0", seed=0):
    return EpochPlanner(corpus(), FIXED112, OPTS, seed, 0, store=lambda n: share.store(key, n))


def test_a_plan_dir_another_user_owns_or_can_write_is_refused(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, OTHER, OTHER)
    with pytest.raises(UnsafePathError, match="owned by .*uid 12345"):
        PlanShare.at(str(theirs))
    open_dir = tmp_path / "world"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    with pytest.raises(UnsafePathError, match="lets group or others write it"):
        PlanShare.at(str(open_dir))
    os.symlink(str(theirs), str(tmp_path / "link"))
    with pytest.raises(UnsafePathError, match="symbolic link"):
        PlanShare.at(str(tmp_path / "link"))
    shared_parent = tmp_path / "tmp-like"                    # writable by all, not sticky: they could swap ours
    shared_parent.mkdir()
    os.chmod(shared_parent, 0o777)
    with pytest.raises(UnsafePathError, match="writable by others"):
        PlanShare.at(str(shared_parent / "plans"))
    os.chmod(shared_parent, 0o1777)                          # sticky like /dev/shm: ours stays ours
    share = PlanShare.at(str(shared_parent / "plans"))
    assert os.stat(share.root).st_mode & 0o777 == 0o700


def test_a_plan_key_folder_planted_by_another_user_is_refused(tmp_path):
    share = PlanShare.at(str(tmp_path / "plans"))
    planted = tmp_path / "plans" / "fp-e0"
    planted.mkdir()
    os.chown(planted, OTHER, OTHER)
    with pytest.raises(UnsafePathError, match="owned by .*uid 12345"):
        share.store("fp-e0", 4)


def test_a_dataset_refuses_a_foreign_plan_dir(tmp_path):
    root = str(tmp_path / "ds")
    write_dataset(root, make_samples(8, seed=1), shard_size=4)
    plans = tmp_path / "plans"
    plans.mkdir()
    os.chown(plans, OTHER, OTHER)
    with pytest.raises(UnsafePathError, match=str(plans)):
        VLMDataset(root, seed=0, max_tokens=512, max_images=6, image_size=56,
                   options=DatasetOptions(plan_dir=str(plans)))


def test_a_journal_symlinked_elsewhere_is_never_appended_to(tmp_path):
    victim = tmp_path / "root-only"
    victim.write_bytes(b"secret\n")
    os.chmod(victim, 0o600)
    share = PlanShare.at(str(tmp_path / "plans"))
    p = planner(share)
    os.symlink(str(victim), str(tmp_path / "plans" / "fp-e0" / "journal"))
    with pytest.raises(UnsafePathError, match="symbolic link"):
        p.plan_window(0)
    assert victim.read_bytes() == b"secret\n"


def test_a_window_file_of_another_user_is_refused(tmp_path):
    share = PlanShare.at(str(tmp_path / "plans"))
    planner(share).plan_window(0)
    os.chown(tmp_path / "plans" / "fp-e0" / "w0000000.plan", OTHER, OTHER)
    with pytest.raises(UnsafePathError, match="owned by .*uid 12345"):
        planner(share).plan_window(0)


def test_a_forged_window_is_planned_again_not_used(tmp_path, caplog):
    share = PlanShare.at(str(tmp_path / "plans"))
    honest = planner(share).plan_window(0)
    path = tmp_path / "plans" / "fp-e0" / "w0000000.plan"
    data = bytearray(path.read_bytes())
    n = len(honest.samples)
    samples_at = len(data) - 8 * (3 * n + honest.num_packs + 1)
    data[samples_at:samples_at + 8 * n] = np.full(n, int(honest.samples[0]), "<i8").tobytes()   # one sample n times
    path.write_bytes(bytes(data))
    again = planner(share)
    got = again.plan_window(0)
    assert len(set(got.samples.tolist())) == n and got.samples.tolist() == honest.samples.tolist()
    assert again.store.computed == 1 and "does not match its checksum" in caplog.text
    assert planner(share).plan_window(0).samples.tolist() == honest.samples.tolist()   # the file was replaced


def test_a_counts_file_of_zeros_is_not_an_empty_epoch(tmp_path):
    share = PlanShare.at(str(tmp_path / "plans"))
    total = EpochPlanner(corpus(), FIXED112, OPTS, 0, 0).total()
    assert total > 0
    first = planner(share)
    counts = tmp_path / "plans" / "fp-e0" / "counts"
    counts.write_bytes(bytes(os.path.getsize(counts)))      # zeros: "every window holds 0 packs"
    again = planner(share)
    assert again.total() == total
    assert again.store.computed == first.num_windows        # unknown counts: every window planned


def test_private_shares_of_other_users_are_not_removed(tmp_path):
    dead = tmp_path / "vlmdata-plan-999999999-x"            # looks like a dead process's share, but not ours
    dead.mkdir()
    (dead / "keep").write_bytes(b"x")
    os.chown(dead, OTHER, OTHER)
    share = PlanShare.create(str(tmp_path))
    assert (dead / "keep").exists()
    assert os.stat(share.root).st_mode & 0o777 == 0o700
    share.close()
