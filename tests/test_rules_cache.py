"""The parsed built-in rule library kept on disk (rules.load._builtin_rules): reused while the files are
unchanged, rebuilt when one changes, never trusted when damaged, never kept when a rule is broken."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from loradoctor.errors import UserError
from loradoctor.logs.rules import load as R


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setenv("LORADOCTOR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("LORADOCTOR_NO_CACHE", raising=False)
    target = tmp_path / "rules"
    shutil.copytree(R.builtin_rules_dir(), target, ignore=shutil.ignore_patterns("__pycache__", "*.py"))
    return target


def test_second_load_comes_from_the_cache_and_matches(folder, monkeypatch):
    first, problems = R._builtin_rules(folder)
    assert not problems and len(first) >= 100
    assert list((Path(os.environ["LORADOCTOR_CACHE_DIR"])).glob("rules-*.json"))

    def boom(*a, **k):
        raise AssertionError("parsed the YAML again")

    monkeypatch.setattr(R, "_collect", boom)
    second, _ = R._builtin_rules(folder)
    assert [r.to_dict() for r in second] == [r.to_dict() for r in first]
    assert [r.literals for r in second] == [r.literals for r in first]
    # the regexes still compile lazily after reading the JSON back, and match what they matched before
    oom = next(r for r in second if r.id == "oom-fragmentation")
    line = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    assert [bool(p.search(line)) for p in oom.compiled_patterns] == \
        [bool(p.search(line)) for p in next(r for r in first if r.id == "oom-fragmentation").compiled_patterns]
    assert len(oom.compiled_patterns) == len(oom.patterns)


def test_a_changed_rule_file_is_read_again(folder):
    R._builtin_rules(folder)
    path = folder / "oom.yaml"
    text = path.read_text(encoding="utf-8")
    path.write_text(text.replace("title:", "title: CHANGED", 1), encoding="utf-8")
    later = time.time_ns() + 10**9
    os.utime(path, ns=(later, later))
    rules, _ = R._builtin_rules(folder)
    assert any(r.title.startswith("CHANGED") for r in rules)


def test_a_damaged_entry_is_rebuilt(folder):
    R._builtin_rules(folder)
    for entry in Path(os.environ["LORADOCTOR_CACHE_DIR"]).glob("rules-*.json"):
        entry.write_bytes(b"not JSON")
    rules, problems = R._builtin_rules(folder)
    assert not problems and len(rules) >= 100


class _Plant:
    """Unpickling this creates the marker file: what a planted pickle would run."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


@pytest.mark.parametrize("payload", ["pickle", "wrong-shape"])
def test_a_planted_entry_is_never_executed_nor_trusted(folder, tmp_path, payload):
    import json
    import pickle

    R._builtin_rules(folder)
    marker = tmp_path / "code-ran"
    entries = list(Path(os.environ["LORADOCTOR_CACHE_DIR"]).glob("rules-*"))  # whatever its format
    assert entries
    for entry in entries:
        if payload == "pickle":
            data = pickle.dumps(_Plant(marker))
            entry.with_suffix(".pickle").write_bytes(data)  # the old cache's name, too
        else:
            data = json.dumps([{"id": "planted", "cause": "oom.fragmentation"}]).encode()
        entry.write_bytes(data)
    rules, problems = R._builtin_rules(folder)
    assert not marker.exists()
    assert not problems and len(rules) >= 100 and "planted" not in {r.id for r in rules}


def test_broken_rules_are_not_kept(folder):
    (folder / "zz-broken.yaml").write_text("rules:\n  - id: broken\n    cause: nope.nope\n", encoding="utf-8")
    _, problems = R._builtin_rules(folder)
    assert problems
    assert not list(Path(os.environ["LORADOCTOR_CACHE_DIR"]).glob("rules-*.json"))


def test_user_rule_clashing_with_a_builtin_id_is_reported(tmp_path):
    user = tmp_path / "mine"
    user.mkdir()
    builtin = R.load_rules()[0]
    (user / "a.yaml").write_text(
        "rules:\n"
        f"  - id: {builtin.id}\n    cause: {builtin.cause}\n    title: Mine\n    severity: error\n"
        "    summary: mine\n    patterns: ['FROBNICATE NOW']\n", encoding="utf-8")
    with pytest.raises(UserError, match="duplicate id"):
        R.load_rules(extra_dirs=[user])
