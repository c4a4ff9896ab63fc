"""Remembered child-probe results (env/probes/remember.py): reused only while the install is unchanged,
never for a broken result, and a torch that breaks after a healthy run is found by a fresh probe."""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from pathlib import Path

import pytest

from conftest import run_cli
from loradoctor import cache
from loradoctor.env.probes import remember

HEALTHY_TORCH = """\
import os
with open(os.environ["FAKE_TORCH_COUNTER"], "a") as fh:
    fh.write("imported\\n")
__version__ = "2.5.1+cu124"
class _V:
    cuda = "12.4"
    hip = None
    debug = False
version = _V()
class _C:
    @staticmethod
    def _cuda_getArchFlags():
        return "sm_80 sm_90"
class _Cudnn:
    @staticmethod
    def version():
        return 90100
class _Backends:
    cudnn = _Cudnn()
    class cuda:
        pass
backends = _Backends()
class cuda:
    @staticmethod
    def is_available():
        return False
    @staticmethod
    def device_count():
        return 0
"""


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("LORADOCTOR_CACHE_DIR", str(folder))
    monkeypatch.delenv("LORADOCTOR_NO_CACHE", raising=False)
    return folder


def _env_json(site: Path, counter: Path, cache_folder: Path, *extra: str):
    res = run_cli("env", "--quick", "--format", "json", *extra, timeout=120,
                  env={"PYTHONPATH": str(site), "FAKE_TORCH_COUNTER": str(counter),
                       "LORADOCTOR_CACHE_DIR": str(cache_folder)})
    assert res.returncode in (0, 1), res.stderr
    return json.loads(res.stdout)


def _imports(counter: Path) -> int:
    return len(counter.read_text().splitlines()) if counter.exists() else 0


@pytest.mark.skipif(remember.has_nvidia_nodes(), reason="the fake torch sees no CUDA; on a GPU box that is not healthy")
def test_healthy_probe_is_reused_until_the_install_changes(tmp_path, cache_dir):
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    init = site / "torch" / "__init__.py"
    init.write_text(HEALTHY_TORCH)
    counter = tmp_path / "imports.txt"

    first = _env_json(site, counter, cache_dir)
    assert first["snapshot"]["torch"]["version"] == "2.5.1+cu124"
    assert "remembered" not in first["snapshot"]["torch"]["probe"]
    assert _imports(counter) == 1

    second = _env_json(site, counter, cache_dir)
    assert _imports(counter) == 1  # no child import this time
    assert second["snapshot"]["torch"]["probe"]["remembered"]["age_s"] >= 0
    assert second["snapshot"]["torch"]["version"] == "2.5.1+cu124"
    assert [f["cause"] for f in second["findings"]] == [f["cause"] for f in first["findings"]]

    _env_json(site, counter, cache_dir, "--fresh")
    assert _imports(counter) == 2  # --fresh probes again

    # the install breaks after a healthy run: the key changes, the fresh probe finds it
    init.write_text('raise ImportError("libcudnn.so.9: cannot open shared object file")\n')
    os.utime(init, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))
    broken = _env_json(site, counter, cache_dir)
    assert broken["snapshot"]["torch"]["probe"]["status"] == "failed"
    assert "env.torch_broken" in {f["cause"] for f in broken["findings"]}
    # and a broken result is never remembered
    again = _env_json(site, counter, cache_dir)
    assert "remembered" not in again["snapshot"]["torch"]["probe"]


def test_key_follows_env_vars_and_package_folders(tmp_path, cache_dir, monkeypatch):
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("x = 1\n")
    monkeypatch.syspath_prepend(str(site))
    key = remember.probe_key("src", [], "torch")
    assert key is not None and key == remember.probe_key("src", [], "torch")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert remember.probe_key("src", [], "torch") != key
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    key = remember.probe_key("src", [], "torch")
    (site / "newpkg-1.0.dist-info").mkdir()  # pip install anything: the folder's mtime moves
    os.utime(site, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))
    assert remember.probe_key("src", [], "torch") != key
    assert remember.probe_key("other source", [], "torch") != remember.probe_key("src", [], "torch")
    monkeypatch.setenv("LORADOCTOR_NO_CACHE", "1")
    assert remember.probe_key("src", [], "torch") is None


def test_recall_marks_age_and_expires(cache_dir):
    section = {"version": "2.5.1", "cuda_available": True, "probe": {"status": "ok", "elapsed_s": 2.1}}
    assert remember.remember("k1", "torch", section) is True
    got = remember.recall("k1")
    assert got["probe"]["remembered"]["age_s"] >= 0 and got["probe"]["elapsed_s"] == 0.0
    old = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=remember.MAX_AGE_S + 60)).isoformat()
    cache.write_json(remember.KIND, "k2", {"created": old, "section": section})
    assert remember.recall("k2") is None
    assert remember.recall("missing") is None
    (cache_dir / "probe-k3.json").write_text("{not json")
    assert remember.recall("k3") is None


@pytest.mark.parametrize("section,nodes,ok", [
    ({"probe": {"status": "ok"}, "cuda_available": True}, True, True),
    ({"probe": {"status": "ok"}, "cuda_available": False}, True, False),  # GPU there, torch blind: re-probe
    ({"probe": {"status": "ok"}, "cuda_available": False}, False, True),  # no GPU at all: a CPU box
    ({"probe": {"status": "failed"}, "error": "could not check: ImportError"}, False, False),
    ({"probe": {"status": "timeout"}}, False, False),
    ({"probe": {"status": "ok"}, "cuda_available": True, "cuda_error": "RuntimeError: x"}, True, False),
    ({"probe": {"status": "ok"}, "cuda_available": True, "devices": [{"index": 0, "error": "x"}]}, True, False),
])
def test_only_healthy_torch_results_are_remembered(monkeypatch, section, nodes, ok):
    monkeypatch.setattr(remember, "has_nvidia_nodes", lambda: nodes)
    assert remember.worth_remembering("torch", section) is ok


def test_bnb_without_cuda_on_a_gpu_box_is_not_remembered(monkeypatch):
    monkeypatch.setattr(remember, "has_nvidia_nodes", lambda: True)
    assert not remember.worth_remembering("bitsandbytes", {"probe": {"status": "ok"}, "cuda": False})
    assert remember.worth_remembering("bitsandbytes", {"probe": {"status": "ok"}, "cuda": True})


def test_unwritable_cache_never_fails(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("LORADOCTOR_CACHE_DIR", str(blocker / "sub"))  # a folder under a file
    assert cache.write_json("probe", "k", {"a": 1}) is False
    assert cache.read_json("probe", "k") is None


def test_no_home_folder_means_no_cache(monkeypatch):
    from pathlib import Path

    monkeypatch.delenv("LORADOCTOR_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)

    def no_home():
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    assert cache.read_json("probe", "k") is None
    assert cache.write_json("probe", "k", {"a": 1}) is False
