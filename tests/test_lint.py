"""`loradoctor lint`: every lint fires on its positive fixtures (quoting the file and line of the
setting) and not on its negatives; the good-practice configs give nothing; docs/lint.md is current."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from loradoctor.advise.lint import CHECKS, catalogue, lint_configs, lint_docs
from loradoctor.estimate.fit import gpu_by_name

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "fixtures" / "lint"


def _gpu_for(path: Path):
    m = re.search(r"lint with --gpu (\S+)", path.read_text())
    return gpu_by_name(m.group(1)) if m else None


def _cases(prefix):
    return [pytest.param(p, id=f"{p.parent.name}/{p.name}") for p in sorted(FIX.glob(f"*/{prefix}-*")) if p.parent.name != "good"]


def test_every_lint_has_a_check_docs_and_fixtures():
    assert set(CHECKS) == set(catalogue())
    for lint_id, spec in catalogue().items():
        assert {"severity", "title", "why", "example", "fix", "leads_to"} <= set(spec), lint_id
        assert spec["severity"] in ("error", "warning", "info")
        assert list((FIX / lint_id).glob("pos-*")) and list((FIX / lint_id).glob("neg-*")), lint_id


@pytest.mark.parametrize("path", _cases("pos"))
def test_positive_fixture_fires_its_lint_with_the_line(path):
    lint_id = path.parent.name
    found = [f for f in lint_configs([path], gpu=_gpu_for(path)) if f.rule == lint_id]
    assert found, f"{lint_id} did not fire on {path.name}"
    f = found[0]
    lines = path.read_text().splitlines()
    ev = [e for e in f.evidence if e.line]
    assert ev, "no line quoted"
    for e in ev:
        key = e.text.split(":")[0]
        assert key in lines[e.line - 1], (e, lines[e.line - 1])
    assert f.fixes and f.fixes[0].command


@pytest.mark.parametrize("path", _cases("neg"))
def test_negative_fixture_does_not_fire_its_lint(path):
    lint_id = path.parent.name
    assert lint_id not in [f.rule for f in lint_configs([path], gpu=_gpu_for(path))]


@pytest.mark.parametrize("path", sorted(FIX.glob("good/*")), ids=lambda p: p.name)
def test_good_practice_configs_are_clean(path):
    assert lint_configs([path]) == []


def test_fix_uses_the_files_own_key_names():
    f = next(x for x in lint_configs([FIX / "eval-batch-above-train" / "pos-llamafactory.yaml"]))
    assert f.fixes[0].command == "per_device_eval_batch_size: 2"
    f = next(x for x in lint_configs([FIX / "target-modules-missing" / "pos-axolotl-neox-names-on-llama.yaml"]))
    assert f.fixes[0].command == "lora_target_linear: true"


def test_docs_are_generated_from_the_catalogue():
    assert (ROOT / "docs" / "lint.md").read_text(encoding="utf-8") == lint_docs(), \
        "docs/lint.md is stale: python -m loradoctor.advise.lint --write-docs docs/lint.md"


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "loradoctor", "lint", *args], capture_output=True, text=True, cwd=cwd, timeout=60)


def test_cli_exit_codes_errors_warnings_strict(tmp_path):
    err = FIX / "target-modules-missing" / "pos-axolotl-neox-names-on-llama.yaml"
    warn = FIX / "eval-batch-above-train" / "pos-llamafactory.yaml"
    assert _cli(str(err)).returncode == 1
    assert _cli(str(warn)).returncode == 0
    assert _cli(str(warn), "--strict").returncode == 1
    good = _cli(str(FIX / "good" / "axolotl-llama31-qlora.yaml"))
    assert good.returncode == 0 and "no problems found in 1 config" in good.stdout
    out = json.loads(_cli(str(warn), "--format", "json").stdout)
    assert out["findings"][0]["rule"] == "eval-batch-above-train"


@pytest.mark.parametrize("content,needle", [
    (b"\xff\xfe\x00\x00garbage\x00\x01", "cannot"),
    (b"a: &a [1,1,1,1,1,1,1,1]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b]\n"
     b"d: &d [*c,*c,*c,*c,*c,*c,*c,*c]\ne: &e [*d,*d,*d,*d,*d,*d,*d,*d]\nf: [*e,*e,*e,*e,*e,*e,*e,*e]\n", "alias"),
    (b"just text\n", "not an axolotl"),
])
def test_cli_bad_input_is_one_line_exit_2(tmp_path, content, needle):
    p = tmp_path / "c.yaml"
    p.write_bytes(content)
    out = _cli(str(p))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_preflight_shows_lint_and_stops_only_on_errors(tmp_path):
    snap = str(ROOT / "fixtures" / "snapshots" / "healthy_ampere_32gb.json")

    def pre(cfg, *extra):
        return subprocess.run([sys.executable, "-m", "loradoctor", "preflight", "--config", str(cfg), "--snapshot", snap,
                               "--seq-len", "512", "--format", "json", *extra], capture_output=True, text=True, timeout=120)

    warn = FIX / "alpha-rank-ratio" / "pos-axolotl-alpha-below-half.yaml"
    out = pre(warn)
    doc = json.loads(out.stdout)
    assert [f["rule"] for f in doc["lint_findings"]] == ["alpha-rank-ratio"]
    assert out.returncode == 0 and doc["go"] is True
    strict = pre(warn, "--strict")
    assert strict.returncode == 1 and "alpha-rank-ratio" in json.loads(strict.stdout)["reason"]
    err = pre(FIX / "target-modules-missing" / "pos-axolotl-neox-names-on-llama.yaml")
    doc = json.loads(err.stdout)
    assert err.returncode == 1 and doc["go"] is False and "target-modules-missing" in doc["reason"]
    assert doc["first_fix"] == "lora_target_linear: true"
