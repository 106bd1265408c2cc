"""Decoder selection: names, the measured "auto" choice cached per machine, the GPU stage gate."""
from __future__ import annotations

import json

import pytest

import vlmdata.decode.choose as select
from vlmdata.decode import FixedPolicy, PillowDecoder, TurboDecoder
from vlmdata.decode.dali import DaliCpuDecoder


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("VLMDATA_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_names():
    assert isinstance(select.make_decoder("pillow"), PillowDecoder)
    assert isinstance(select.make_decoder("turbo"), TurboDecoder)
    assert isinstance(select.make_decoder("dali"), DaliCpuDecoder)
    with pytest.raises(ValueError, match="unknown decoder 'nvjpeg'"):
        select.make_decoder("nvjpeg")


def test_auto_is_turbo_without_a_measurement(monkeypatch):
    assert select.cached_cpu_choice() is None
    assert isinstance(select.make_decoder("auto"), TurboDecoder)       # simplejpeg is a dependency
    import vlmdata.decode.turbo as turbo

    monkeypatch.setattr(turbo, "turbo_available", lambda: False)      # an install without simplejpeg
    assert isinstance(select.make_decoder("auto"), PillowDecoder)
    with pytest.raises(ValueError, match="simplejpeg"):
        select.make_decoder("turbo")


def test_auto_follows_a_pillow_measurement(cache_dir):
    select.save_cpu_choice("pillow", {"pillow": 150.0, "turbo": 100.0})
    assert isinstance(select.make_decoder("auto"), PillowDecoder)
    select.save_cpu_choice("turbo", {})
    assert isinstance(select.make_decoder("auto"), TurboDecoder)


def test_auto_follows_a_measurement_on_this_machine(cache_dir):
    path = select.save_cpu_choice("dali", {"pillow": 100.0, "dali": 150.0})
    assert path.parent == cache_dir
    assert select.cached_cpu_choice() == "dali"
    assert isinstance(select.make_decoder("auto"), DaliCpuDecoder)


def test_measurement_from_another_machine_is_ignored(cache_dir):
    path = select.save_cpu_choice("dali", {})
    rec = json.loads(path.read_text())
    rec["machine"] = "some other CPU|64|PIL 1|DALI 1"
    path.write_text(json.dumps(rec))
    assert select.cached_cpu_choice() is None
    path.write_text("{not json")
    assert select.cached_cpu_choice() is None
    assert isinstance(select.make_decoder("auto"), TurboDecoder)
    with pytest.raises(ValueError):
        select.save_cpu_choice("turbojpeg", {})


def test_gpu_stage_only_with_a_gpu():
    policy = FixedPolicy(224)
    assert select.make_gpu_stage("pillow", policy) is None
    assert select.make_gpu_stage("turbo", policy) is None
    stage = select.make_gpu_stage("auto", policy)
    assert (stage is not None) == select.gpu_decode_available()
    with pytest.raises(ValueError, match="unknown decoder"):
        select.make_gpu_stage("gpu", policy)
