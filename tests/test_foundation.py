import json

import pytest

from loradoctor.findings import Evidence, Finding, Fix, assign_ranks, confidence_label
from loradoctor.render.json import dumps, findings_data
from loradoctor.render.markdown import findings_md
from loradoctor.units import format_bytes, parse_size, parse_size_or_none

from conftest import run_cli


def _finding(**kw):
    base = dict(cause="oom.capacity", rule="oom-capacity", severity="error", confidence="high", title="t")
    base.update(kw)
    return Finding(**base)


def test_finding_round_trips_through_json():
    f = _finding(
        evidence=[Evidence("a.log", 3, "CUDA out of memory")],
        facts={"oom.requested_bytes": 1024},
        fixes=[Fix("lower the batch", "per_device_train_batch_size: 1")],
        repro="free-memory",
    )
    data = json.loads(dumps({"findings": findings_data([f])}))
    back = Finding.from_dict(data["findings"][0])
    assert back == f
    assert data["findings"][0]["confidence_label"] == "high"


def test_bad_severity_is_rejected():
    with pytest.raises(ValueError):
        _finding(severity="fatal")


def test_ranking_puts_consequences_after_roots_and_errors_first():
    root = _finding(rule="a", confidence=0.5)
    consequence = _finding(rule="b", cause="dist.nccl_timeout", confidence=0.95, consequence_of="a")
    warning = _finding(rule="c", severity="warning", confidence=0.99)
    ranked = assign_ranks([consequence, warning, root])
    assert [f.rule for f in ranked] == ["a", "c", "b"]
    assert [f.rank for f in ranked] == [1, 2, 3]


def test_confidence_labels():
    assert confidence_label(0.95) == "high"
    assert confidence_label(0.6) == "medium"
    assert confidence_label(0.3) == "low"
    assert confidence_label(0.1) == "guess"


@pytest.mark.parametrize(
    "text,expected",
    [("20.00 MiB", 20 * 2**20), ("9.20 GiB", round(9.2 * 2**30)), ("512 bytes", 512), ("32GB", 32 * 10**9), ("1,024 KiB", 2**20)],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


def test_parse_size_bounds_nonsense():
    assert parse_size_or_none("17179869184.00 GiB") is None
    assert parse_size_or_none("lots") is None


def test_format_bytes_matches_pytorch_style():
    assert format_bytes(512) == "512 bytes"
    assert format_bytes(20 * 2**20) == "20.00 MiB"
    assert format_bytes(round(9.2 * 2**30)) == "9.20 GiB"


def test_markdown_report_lists_fixes_and_repro():
    f = _finding(rank=1, fixes=[Fix("lower the batch", "per_device_train_batch_size: 1")], repro="free-memory")
    md = findings_md([f], "Diagnosis")
    assert "per_device_train_batch_size: 1" in md and "loradoctor repro run free-memory" in md


def test_cli_help_and_version():
    out = run_cli("--help")
    assert out.returncode == 0 and "explain" in out.stdout
    assert run_cli("--version").stdout.startswith("loradoctor ")


def test_unknown_command_is_usage_error():
    assert run_cli("no-such-command").returncode == 2
