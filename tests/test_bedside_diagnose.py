"""Timeline fixtures -> findings, the timeline reader's bounds, and how timeline findings rank with a log's."""

import json
from pathlib import Path

import pytest

from loradoctor.bedside.diagnose import combine, timeline_findings
from loradoctor.bedside.timeline import read_timeline
from loradoctor.errors import UserError

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "timelines"
EXPECT = {  # file-name prefix -> the cause its positive case must name first
    "leak": "oom.leak", "other-process": "oom.other_process", "host-ram": "oom.host_ram",
    "slow-dataloader": "slow.dataloader", "slow-host-sync": "slow.host_sync", "throttling": "hw.thermal_power",
    "attention": "slow.attention_fallback", "qlora-unneeded": "slow.qlora_unneeded",
}


def _cases(kind):
    out = []
    for path in sorted(FIX.glob("*.jsonl")):
        for prefix, cause in EXPECT.items():
            if path.name.startswith(prefix + "-" + kind):
                out.append(pytest.param(path, cause, id=path.stem))
    return out


def test_every_timeline_cause_has_a_positive_and_a_negative_fixture():
    for prefix in EXPECT:
        assert list(FIX.glob(f"{prefix}-pos-*.jsonl")) and list(FIX.glob(f"{prefix}-neg-*.jsonl")), prefix


@pytest.mark.parametrize("path,cause", _cases("pos"))
def test_positive_timeline_names_its_cause_first(path, cause):
    findings = timeline_findings(read_timeline(path))
    assert findings and findings[0].cause == cause, [f.cause for f in findings]
    first = findings[0]
    assert first.evidence and all(e.file == path.name and isinstance(e.line, int) for e in first.evidence)
    lines = path.read_text().splitlines()
    for e in first.evidence:  # the quoted line is a real record of the file
        assert json.loads(lines[e.line - 1])["kind"] in ("sample", "step", "preflight")


@pytest.mark.parametrize("path,cause", _cases("neg"))
def test_negative_timeline_does_not_name_the_cause(path, cause):
    assert cause not in [f.cause for f in timeline_findings(read_timeline(path))]


def test_healthy_baseline_has_no_warning():
    findings = timeline_findings(read_timeline(FIX / "healthy-lora-5090.jsonl"))
    assert [f for f in findings if f.severity in ("error", "warning")] == []


def test_leak_numbers_are_the_recorded_ones():
    f = timeline_findings(read_timeline(FIX / "leak-pos-eval-preds-kept.jsonl"))[0]
    assert f.facts["timeline.memory_series"] == "allocated"
    assert f.severity == "error"  # the run ended badly with the card full
    assert "per 100 steps" in f.summary


def test_other_process_names_pid_and_moment():
    f = timeline_findings(read_timeline(FIX / "other-process-pos-grab-mid-run.jsonl"))[0]
    assert f.facts["timeline.other_pid"] == 9911 and f.facts["timeline.other_appeared_during"] is True
    assert "+0:02:0" in f.evidence[0].text and "kill 9911" in f.fixes[0].command


def test_host_ram_names_the_workers():
    f = timeline_findings(read_timeline(FIX / "host-ram-pos-workers-killed.jsonl"))[0]
    assert "pt_data_worker" in f.summary and f.severity == "error"


def test_a_timeline_root_outranks_the_logs_generic_oom(tmp_path):
    from loradoctor.logs.engine import explain

    log = tmp_path / "run.log"
    log.write_text("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity "
                   "of 31.84 GiB of which 220.00 MiB is free. Including non-PyTorch memory, this process has 21.60 GiB "
                   "memory in use. Of the allocated memory 20.90 GiB is allocated by PyTorch, and 310.00 MiB is "
                   "reserved by PyTorch but unallocated.\n")
    report = explain([str(log)])
    ranked = combine(report.findings, timeline_findings(read_timeline(FIX / "other-process-pos-grab-mid-run.jsonl")))
    assert ranked[0].cause == "oom.other_process"
    assert [f.rank for f in ranked] == list(range(1, len(ranked) + 1))


def test_reader_skips_bad_lines_and_refuses_non_timelines(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_bytes(b'{"kind":"sample","t":1.0}\nnot json\n\xff\xfe\n{"kind":"sample","t":"x"}\n[1,2]\n'
                  b'{"kind":"sample","t":2.0,"host":{"rss_bytes":5}}\n')
    tl = read_timeline(p)
    assert len(tl.samples) == 2 and tl.skipped == 4
    bad = tmp_path / "b.jsonl"
    bad.write_text("hello\nworld\n")
    with pytest.raises(UserError):
        read_timeline(bad)
    with pytest.raises(UserError):
        read_timeline(tmp_path / "missing.jsonl")


def test_reader_memory_is_bounded_for_long_runs(tmp_path):
    p = tmp_path / "long.jsonl"
    with p.open("w") as fh:
        for i in range(20000):
            fh.write(json.dumps({"kind": "sample", "t": float(i), "gpus": [{"used_bytes": i}]}) + "\n")
    tl = read_timeline(p, cap=1000)
    assert len(tl.samples) <= 1001 and tl.thinned
    assert tl.samples[0]["t"] == 0.0 and tl.samples[-1]["t"] == 19999.0  # first and newest kept
    ts = [r["t"] for r in tl.samples]
    assert ts == sorted(ts)


def test_explain_cli_reads_a_timeline_folder(tmp_path, run_cli=None):
    import shutil
    import subprocess
    import sys

    d = tmp_path / "run"
    d.mkdir()
    shutil.copy(FIX / "leak-pos-eval-preds-kept.jsonl", d / "timeline.jsonl")
    (d / "run.log").write_text("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB.\n")
    out = subprocess.run([sys.executable, "-m", "loradoctor", "explain", str(d / "run.log"), "--timeline", str(d),
                          "--format", "json"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["findings"][0]["cause"] == "oom.leak"


def test_timeline_only_causes_have_timeline_fixtures():
    from loradoctor.bedside.diagnose import TIMELINE_ONLY_CAUSES

    assert set(TIMELINE_ONLY_CAUSES) <= set(EXPECT.values())
