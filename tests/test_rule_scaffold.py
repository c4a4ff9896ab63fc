"""scripts/new_rule.py: the scaffold of a new rule lints clean and gives the fixture harness what it reads."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import rule_expect
from loradoctor.logs.rules import lint_rules

ROOT = Path(__file__).resolve().parent.parent


def _copy_repo_parts(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "rules", tmp_path / "rules")
    (tmp_path / "fixtures" / "logs").mkdir(parents=True)
    return tmp_path


def _scaffold(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "new_rule.py"), *args, "--root", str(root)],
                          capture_output=True, text=True, timeout=60)


def test_scaffold_appends_a_linting_rule_to_the_cause_family_and_writes_the_fixture_folder(tmp_path):
    root = _copy_repo_parts(tmp_path)
    before = (root / "rules" / "oom.yaml").read_text(encoding="utf-8")
    done = _scaffold(root, "oom-scaffolded-case", "--cause", "oom.capacity", "--pattern", "ran out of the widget pool")
    assert done.returncode == 0, done.stderr
    after = (root / "rules" / "oom.yaml").read_text(encoding="utf-8")
    assert after.startswith(before) and "- id: oom-scaffolded-case" in after[len(before):]
    # a copied rules folder repeats every built-in id; anything else is a problem of the stub
    problems = [p for p in lint_rules(root / "rules") if "duplicate id, also defined in" not in p]
    assert problems == []
    folder = root / "fixtures" / "logs" / "oom-scaffolded-case"
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["expect.yaml", "neg-near-miss-TODO.log", "pos-1-TODO.log", "pos-2-TODO.log"]
    expect = rule_expect.read(folder)
    assert set(expect) == {rule_expect.key_of(p) for p in rule_expect.positive_fixtures(folder)}
    # an unblessed expectation fails the fires test instead of passing silently
    assert rule_expect.check_fires(None, None, folder / "pos-1-TODO.log", expect["pos-1-TODO.log"])


def test_scaffold_refuses_a_taken_id_and_an_unknown_cause(tmp_path):
    root = _copy_repo_parts(tmp_path)
    taken = _scaffold(root, "oom-fragmentation", "--cause", "oom.fragmentation")
    assert taken.returncode == 2 and "exists already" in taken.stderr
    unknown = _scaffold(root, "oom-new-thing", "--cause", "oom.not_a_cause")
    assert unknown.returncode == 2 and "unknown cause" in unknown.stderr
    assert not (root / "fixtures" / "logs" / "oom-new-thing").exists()
