"""The on-disk cache (loradoctor/cache.py) cannot be used against its owner: a folder owned or
writable by another user, a symlinked folder, and entries that are FIFOs, links or foreign files are
never read (issue 11, item 1). Each test runs the real command in a child, as a user would."""

from __future__ import annotations

import json
import os
import pickle
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

OOM_LOG = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.64 GiB of which 1.19 GiB is free.\n"

HEALTHY_FAKE_TORCH = """__version__ = "2.5.1+cpu"
class version:
    cuda = None
    hip = None
    debug = False
class _C:
    pass
class backends:
    class cudnn:
        @staticmethod
        def version():
            return None
    class cuda:
        pass
class cuda:
    @staticmethod
    def is_available():
        return False
    @staticmethod
    def device_count():
        return 0
"""


class _Marker:
    """Unpickling this runs code: it creates the marker file."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (exec, (f"open({str(self.path)!r}, 'w').write('pwned')",))


def _run(args, cache: Path, extra_env=None, timeout=60) -> subprocess.CompletedProcess:
    env = dict(os.environ, LORADOCTOR_CACHE_DIR=str(cache), NO_COLOR="1", COLUMNS="200")
    env.pop("LORADOCTOR_NO_CACHE", None)
    env.update(extra_env or {})
    return subprocess.run([sys.executable, "-m", "loradoctor", *args], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=str(ROOT))


def _populate(tmp_path: Path) -> tuple[Path, Path, dict]:
    """A cache folder filled by a real `explain` and `env` (with a healthy fake torch, so its probe is kept)."""
    cache = tmp_path / "cache"
    log = tmp_path / "oom.log"
    log.write_text(OOM_LOG)
    fake = tmp_path / "fake"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text(HEALTHY_FAKE_TORCH)
    env = {"PYTHONPATH": str(fake)}
    assert _run(["explain", str(log)], cache).returncode == 0
    assert _run(["env", "--format", "json"], cache, env).returncode in (0, 1)
    return cache, log, env


def _poison(cache: Path, marker: Path) -> list[str]:
    """Replace every entry with a payload: a probe result that lies, a rule library with no rules (explain
    would then find nothing), and beside them a pickle that creates `marker` under the name an old
    (pickle) rule cache used, in case anything still unpickled."""
    names = []
    for entry in list(cache.iterdir()):
        if entry.suffix == ".json":
            doc = json.loads(entry.read_text())
            if isinstance(doc, dict) and isinstance(doc.get("section"), dict):
                doc["section"]["version"] = "6.6.6+planted"
            else:  # the parsed rule library
                doc = []
            entry.write_text(json.dumps(doc))
            entry.with_suffix(".pickle").write_bytes(pickle.dumps(_Marker(marker)))
        names.append(entry.name)
    return names


def _check_not_used(cache: Path, log: Path, env: dict, marker: Path) -> None:
    res = _run(["explain", str(log)], cache)
    assert res.returncode == 0, res.stderr
    assert "oom" in res.stdout.lower()
    res = _run(["env", "--format", "json"], cache, env)
    assert res.returncode in (0, 1), res.stderr
    assert "planted" not in res.stdout
    assert json.loads(res.stdout)["snapshot"]["torch"]["version"] == "2.5.1+cpu"
    assert not marker.exists(), "code from the cache ran"


def test_the_planted_payloads_do_work_in_a_folder_of_our_own(tmp_path):
    # the control: the same payload in a folder we own is read (so the tests below test something)
    cache, log, env = _populate(tmp_path)
    names = _poison(cache, tmp_path / "marker")
    assert sum(n.endswith(".json") for n in names) >= 2  # the probe result and the rule library
    res = _run(["env", "--format", "json"], cache, env)
    assert "planted" in res.stdout
    res = _run(["explain", str(tmp_path / "oom.log"), "--format", "json"], cache)
    rules = {f["rule"] for f in json.loads(res.stdout)["findings"]}
    assert rules <= {"guess", "differential"}, rules  # the empty planted rule library was used
    assert not (tmp_path / "marker").exists()  # and no pickle was ever loaded


def test_a_cache_folder_owned_by_another_user_is_never_read(tmp_path):
    cache, log, env = _populate(tmp_path)
    marker = tmp_path / "marker"
    _poison(cache, marker)
    try:
        import pwd

        nobody = pwd.getpwnam("nobody")
        for p in [cache, *cache.iterdir()]:
            os.chown(p, nobody.pw_uid, nobody.pw_gid)
    except (KeyError, PermissionError, OSError) as exc:
        pytest.skip(f"cannot hand the folder to another user here: {exc}")
    _check_not_used(cache, log, env, marker)
    res = _run(["explain", "-v", str(log)], cache)
    assert "cache: not using" in res.stderr and "owned by user id" in res.stderr


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o757])
def test_a_group_or_world_writable_cache_folder_is_never_read(tmp_path, mode):
    cache, log, env = _populate(tmp_path)
    marker = tmp_path / "marker"
    _poison(cache, marker)
    os.chmod(cache, mode)
    _check_not_used(cache, log, env, marker)


def test_a_symlinked_cache_folder_is_never_read(tmp_path):
    real, log, env = _populate(tmp_path)
    marker = tmp_path / "marker"
    _poison(real, marker)
    link = tmp_path / "link"
    link.symlink_to(real)
    _check_not_used(link, log, env, marker)


def test_an_entry_owned_by_another_user_in_our_folder_is_never_read(tmp_path):
    cache, log, env = _populate(tmp_path)
    marker = tmp_path / "marker"
    _poison(cache, marker)
    try:
        for p in cache.iterdir():
            os.chown(p, 65534, 65534)
    except (PermissionError, OSError) as exc:
        pytest.skip(f"cannot chown here: {exc}")
    _check_not_used(cache, log, env, marker)


def test_a_fifo_planted_as_an_entry_does_not_hang(tmp_path):
    cache, log, env = _populate(tmp_path)
    for entry in list(cache.iterdir()):
        entry.unlink()
        os.mkfifo(entry)
    res = _run(["explain", str(log)], cache, timeout=60)  # before the fix: blocked forever in open()
    assert res.returncode == 0
    res = _run(["env", "--format", "json"], cache, env, timeout=60)
    assert res.returncode in (0, 1)


def test_a_link_to_dev_zero_is_not_read(tmp_path):
    cache, log, env = _populate(tmp_path)
    for entry in list(cache.iterdir()):
        entry.unlink()
        entry.symlink_to("/dev/zero")
    # a memory cap, so that reading /dev/zero (the old behaviour) fails fast instead of eating the machine
    cap = "import resource, runpy, sys; resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30)); " \
          "sys.argv = ['loradoctor'] + sys.argv[1:]; runpy.run_module('loradoctor', run_name='__main__')"
    env = dict(os.environ, LORADOCTOR_CACHE_DIR=str(cache), NO_COLOR="1")
    res = subprocess.run([sys.executable, "-c", cap, "explain", str(log)], capture_output=True, text=True,
                         env=env, timeout=60, cwd=str(ROOT))
    assert res.returncode == 0, res.stderr[-2000:]


def test_an_oversized_entry_is_ignored(tmp_path, monkeypatch):
    from loradoctor import cache

    monkeypatch.setenv("LORADOCTOR_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.setattr(cache, "MAX_ENTRY_BYTES", 100)
    assert cache.write_bytes("k", "key", ".bin", b"x" * 50)
    assert cache.read_bytes("k", "key", ".bin") == b"x" * 50
    (tmp_path / "c" / cache.entry_name("k", "key", ".bin")).write_bytes(b"y" * 101)
    assert cache.read_bytes("k", "key", ".bin") is None


def test_new_folder_is_private_and_entries_name_the_user(tmp_path, monkeypatch):
    from loradoctor import cache

    folder = tmp_path / "new" / "loradoctor"
    monkeypatch.setenv("LORADOCTOR_CACHE_DIR", str(folder))
    assert cache.write_json("probe", "abc", {"a": 1})
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    [entry] = list(folder.iterdir())
    assert entry.name == f"probe-u{os.geteuid()}-abc.json"
    assert stat.S_IMODE(entry.stat().st_mode) == 0o600
    assert cache.read_json("probe", "abc") == {"a": 1}


def test_a_folder_in_a_parent_another_user_controls_is_not_used(tmp_path, monkeypatch):
    from loradoctor import cache

    parent = tmp_path / "shared"
    parent.mkdir()
    os.chmod(parent, 0o777)  # world-writable, no sticky bit: anyone can swap the folder
    monkeypatch.setenv("LORADOCTOR_CACHE_DIR", str(parent / "loradoctor"))
    assert cache.write_json("probe", "k", {"a": 1}) is False
    os.chmod(parent, 0o1777)  # like /tmp: the sticky bit stops others renaming our folder
    assert cache.write_json("probe", "k", {"a": 1}) is True


def test_yaml_data_is_kept_as_json_and_follows_the_file(tmp_path, monkeypatch):
    from loradoctor import cache

    monkeypatch.setenv("LORADOCTOR_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.delenv("LORADOCTOR_NO_CACHE", raising=False)
    table = tmp_path / "table.yaml"
    table.write_text("phases:\n  load: [from_pretrained]\n", encoding="utf-8")
    assert cache.yaml_data(table, "t") == {"phases": {"load": ["from_pretrained"]}}
    kept = [p for p in (tmp_path / "c").iterdir() if p.suffix == ".json"]
    assert len(kept) == 1 and json.loads(kept[0].read_text()) == {"phases": {"load": ["from_pretrained"]}}
    kept[0].write_text('{"phases": {"from": "the cache"}}')  # the second read comes from the entry
    assert cache.yaml_data(table, "t") == {"phases": {"from": "the cache"}}
    kept[0].write_text("[1, 2]")  # not a mapping: ignored, the file is parsed again
    assert cache.yaml_data(table, "t") == {"phases": {"load": ["from_pretrained"]}}
    table.write_text("phases:\n  save: [save_model]\n", encoding="utf-8")  # an edited file is read again
    assert cache.yaml_data(table, "t") == {"phases": {"save": ["save_model"]}}
    dated = tmp_path / "dated.yaml"
    dated.write_text("when: 2024-05-01\n", encoding="utf-8")  # a date does not survive JSON: never kept
    before = set((tmp_path / "c").iterdir())
    assert str(cache.yaml_data(dated, "t")["when"]) == "2024-05-01"
    assert set((tmp_path / "c").iterdir()) == before


def test_yaml_data_keeps_the_file_order_of_keys_when_cached(tmp_path, monkeypatch):
    """The catalogue's order is the docs page's: a read from the cache gives the keys in the file's order, as a
    fresh parse does (the JSON was written with sorted keys, so the page came out in another order once cached)."""
    from loradoctor import cache

    monkeypatch.setenv("LORADOCTOR_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.delenv("LORADOCTOR_NO_CACHE", raising=False)
    table = tmp_path / "causes.yaml"
    table.write_text("causes:\n  oom.capacity: 1\n  dist.launcher: 2\n  env.no_gpu_visible: 3\n", encoding="utf-8")
    fresh = list(cache.yaml_data(table, "t")["causes"])
    assert any(p.suffix == ".json" for p in (tmp_path / "c").iterdir())
    cached = list(cache.yaml_data(table, "t")["causes"])
    assert fresh == cached == ["oom.capacity", "dist.launcher", "env.no_gpu_visible"]
