"""A model folder is input: files are size-checked before they are read (a 2 GB tokenizer.json is a clear error,
not a 2 GB read), must be regular files, and symlinks may not lead out of the folder (a Hugging Face cache
snapshot's links into its blobs/ are fine)."""
from __future__ import annotations

import os
import shutil
import time

import pytest

from vlmdata.errors import ConfigError
from vlmdata.testing import chatml_folder
from vlmdata.text import ModelFolder
from vlmdata.text.families import load_family


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return chatml_folder(tmp_path_factory.mktemp("m") / "qwen-small")


def copy_of(model, tmp_path):
    dst = tmp_path / "model"
    shutil.copytree(model, dst)
    return dst


@pytest.mark.parametrize("name", ["tokenizer.json", "config.json", "chat_template.jinja"])
def test_a_huge_file_is_refused_before_it_is_read(model, tmp_path, name):
    folder = copy_of(model, tmp_path)
    with open(folder / name, "wb") as f:
        f.truncate(2 << 30)                                  # 2 GiB, sparse: costs no disk
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match="2147483648 bytes, more than"):
        ModelFolder.load(str(folder))
    assert time.monotonic() - t0 < 5                         # refused from its size, not after reading it


def test_a_chat_template_symlinked_out_of_the_folder_is_refused(model, tmp_path):
    folder = copy_of(model, tmp_path)
    secret = tmp_path / "secret.txt"
    secret.write_text("{{ 'root-only text' }}")
    os.symlink(secret, folder / "chat_template.jinja")
    with pytest.raises(ConfigError, match="leads outside the model folder"):
        load_family(str(folder))
    os.unlink(folder / "chat_template.jinja")
    os.unlink(folder / "tokenizer_config.json")
    os.symlink("../secret.txt", folder / "tokenizer_config.json")    # relative links count the same
    with pytest.raises(ConfigError, match="leads outside the model folder"):
        ModelFolder.load(str(folder))


def test_links_inside_the_folder_and_a_hub_snapshot_are_followed(model, tmp_path):
    repo = tmp_path / "hub" / "models--org--small"
    snapshot = repo / "snapshots" / "0123abc"
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for name in os.listdir(model):                           # the hub's layout: snapshot files link to blobs/
        blob = repo / "blobs" / f"sha-{name}"
        shutil.copy(model / name, blob)
        os.symlink(os.path.relpath(blob, snapshot), snapshot / name)
    (snapshot / "extra").mkdir()
    (snapshot / "extra" / "t.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    os.symlink("extra/t.jinja", snapshot / "chat_template.jinja")
    got = ModelFolder.load(str(snapshot))
    assert got.chat_template.startswith("{% for m in messages %}")
    assert got.tokenizer_json == (model / "tokenizer.json").read_text()


def test_a_fifo_in_place_of_a_file_is_refused_without_blocking(model, tmp_path):
    folder = copy_of(model, tmp_path)
    os.mkfifo(folder / "chat_template.jinja")
    with pytest.raises(ConfigError, match="not a regular file"):
        ModelFolder.load(str(folder))
