"""`vlmdata show --images DIR` on keys from a tar indexed in place: keys are names, not paths. `../../x` and
absolute keys write inside DIR only, a key with a folder part (`sub/000`) works, names never collide, and a
symlink planted in DIR is not followed."""
from __future__ import annotations

import os

import pytest

from tests.helpers.tars import end
from tests.ingest.test_index_foreign_hostile import img, index, sample
from vlmdata.cli import main
from vlmdata.ingest import show_samples


@pytest.fixture
def foreign(tmp_path):
    escape = tmp_path / "escaped"
    keys = ["../../escaped", str(escape / "abs"), "sub/000", "sub2/000", "sub_000"]
    colors = [(200, 30, 30), (30, 200, 30), (30, 30, 200), (200, 200, 30), (30, 200, 200)]
    tar = b"".join(sample(k, color=c) for k, c in zip(keys, colors)) + end()
    manifest, root = index(tmp_path, {"a.tar": tar})
    assert manifest.num_samples == len(keys)
    return root, keys, dict(zip(keys, colors))


def files_under(path) -> set[str]:
    return {os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs}


def test_every_image_is_written_inside_dir_under_its_own_name(foreign, tmp_path):
    root, keys, colors = foreign
    out = tmp_path / "deep" / "a" / "imgs"
    before = files_under(tmp_path) - files_under(out)
    text, missing = show_samples(str(root), keys, images_dir=str(out))
    assert missing == []
    written = sorted(os.listdir(out))
    assert len(written) == len(keys)                             # one image each, no two under one name
    assert all("/" not in n and not n.startswith(".") for n in written)
    assert files_under(tmp_path) - files_under(out) == before    # nothing written anywhere else
    assert not (tmp_path / "escaped").exists()
    for key in keys:                                             # each file holds its own sample's image
        line = next(ln for ln in text.splitlines() if ln.startswith(f"sample {key} "))
        block = text[text.index(line):].split("\n\n")[0]
        path = block.split(" -> ")[1].splitlines()[0]
        assert os.path.dirname(path) == str(out)
        with open(path, "rb") as f:
            assert f.read() == img(colors[key])


def test_a_key_with_a_folder_part_works_from_the_command_line(foreign, tmp_path, capsys):
    root, _, colors = foreign
    assert main(["show", str(root), "sub/000", "--images", str(tmp_path / "imgs")]) == 0
    (name,) = os.listdir(tmp_path / "imgs")
    assert (tmp_path / "imgs" / name).read_bytes() == img(colors["sub/000"])
    assert f"-> {tmp_path / 'imgs' / name}" in capsys.readouterr().out


def test_a_symlink_planted_in_dir_is_not_followed(foreign, tmp_path):
    root, _, _ = foreign
    out = tmp_path / "imgs"
    out.mkdir()
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    show_samples(str(root), ["sub/000"], images_dir=str(tmp_path / "probe"))
    (name,) = os.listdir(tmp_path / "probe")
    os.symlink(victim, out / name)
    with pytest.raises(OSError):
        show_samples(str(root), ["sub/000"], images_dir=str(out))
    assert victim.read_bytes() == b"keep"
