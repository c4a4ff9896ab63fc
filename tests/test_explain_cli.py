"""`loradoctor explain` and `loradoctor rules` from the command line.

Most tests run the CLI in-process (fast); a few run it in a child process, as a user would
(stdin, piping, the one-line error path of `python -m loradoctor`).
"""

from __future__ import annotations

import gzip
import json
import re
import sys
from pathlib import Path

import pytest

from conftest import run_cli
from loradoctor.errors import UserError

ROOT = Path(__file__).resolve().parent.parent

# A user rule folder: makes the diagnosis tests independent of what the built-in library says.
USER_RULES = """\
rules:
  - id: test-frobnicator-jam
    cause: train.device_mismatch
    title: The frobnicator jammed
    severity: error
    confidence: high
    patterns: ['FROBNICATOR JAMMED at step (\\d+)']
    summary: The frobnicator jammed at step {match.1}.
    fixes:
      - text: Unjam the frobnicator
        command: frob --unjam
      - text: Replace the frobnicator
    repro: device-assert
    docs: |
      A test rule: the frobnicator jams when fed too many widgets.
    falsepositives: Never.
  - id: test-widget-shortage
    cause: train.target_modules
    title: Widgets ran short
    severity: warning
    confidence: low
    patterns: ['WIDGET SHORTAGE']
    summary: Widgets ran short.
    fixes:
      - text: Order more widgets
    docs: A second test rule.
"""

NOISE = (
    "Loading checkpoint shards: 100%|██████████| 2/2 [00:03<00:00,  1.52s/it]\n"
    "trainable params: 4,194,304 || all params: 6,742,609,920 || trainable%: 0.0622\n"
    "{'loss': 1.9312, 'grad_norm': 0.61, 'learning_rate': 0.0002, 'epoch': 0.01}\n"
)
JAM_LOG = NOISE + "WIDGET SHORTAGE\n" + "something happened\nFROBNICATOR JAMMED at step 42\n"


@pytest.fixture
def user_rules(tmp_path) -> Path:
    folder = tmp_path / "my-rules"
    folder.mkdir()
    (folder / "frob.yaml").write_text(USER_RULES, encoding="utf-8")
    return folder


@pytest.fixture
def jam_log(tmp_path) -> Path:
    path = tmp_path / "jam.log"
    path.write_text(JAM_LOG, encoding="utf-8")
    return path


def cli(capsys, *args: str) -> tuple[int, str, str]:
    """Run `loradoctor ARGS` in-process through cli.main(); return (exit code, stdout, stderr)."""
    from loradoctor.cli import main

    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


# ---------------------------------------------------------------------------- help


@pytest.mark.parametrize("command", [["explain"], ["rules"], ["rules", "list"], ["rules", "show"], ["rules", "lint"]])
def test_help_teaches_with_examples(capsys, command):
    code, out, _ = cli(capsys, *command, "--help")
    assert code == 0
    assert "examples:" in out.lower()
    examples = [line for line in out.splitlines() if line.strip().startswith("loradoctor ")]
    assert len(examples) >= 2, out


# ---------------------------------------------------------------------------- diagnosis, text


def test_text_report_verdict_evidence_fixes_repro(capsys, user_rules, jam_log):
    code, out, err = cli(capsys, "explain", str(jam_log), "--rules", str(user_rules))
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "Most likely: The frobnicator jammed (train.device_mismatch, confidence high)"
    assert "jam.log" in lines[1] and "lines" in lines[1]  # the inputs line
    assert "The frobnicator jammed at step 42." in out  # summary with its number
    assert re.search(r"jam\.log:6 .*FROBNICATOR JAMMED at step 42", out), out  # evidence with file:line
    assert out.index("Unjam the frobnicator") < out.index("Replace the frobnicator")  # fixes in order
    assert "frob --unjam" in out
    assert "loradoctor repro run device-assert" in out
    assert "\x1b[" not in out  # plain when not a terminal


def test_other_findings_brief_unless_verbose(capsys, user_rules, jam_log):
    _, brief, _ = cli(capsys, "explain", str(jam_log), "--rules", str(user_rules))
    assert "Widgets ran short" in brief
    assert "Order more widgets" not in brief  # the second finding is shown briefly
    _, full, _ = cli(capsys, "explain", str(jam_log), "--rules", str(user_rules), "-v")
    assert "Order more widgets" in full and "Unjam the frobnicator" in full


def test_top_limits_the_findings(capsys, user_rules, jam_log):
    code, out, _ = cli(capsys, "explain", str(jam_log), "--rules", str(user_rules), "--top", "1", "--format", "json")
    assert code == 0
    assert len(json.loads(out)["findings"]) == 1


# ---------------------------------------------------------------------------- JSON and Markdown


def test_json_contract(capsys, user_rules, jam_log):
    code, out, _ = cli(capsys, "explain", str(jam_log), "--rules", str(user_rules), "--format", "json")
    assert code == 0
    doc = json.loads(out)
    # one document for explain (ExplainReport.to_dict): what the report holds, findings ranked best first
    assert list(doc)[:4] == ["schema", "status", "inputs", "findings"]
    assert {"unrecognised_tail", "facts", "rules_checked"} <= set(doc)
    assert doc["schema"] == "loradoctor.explain/1" and doc["status"] == "diagnosed"
    assert doc["inputs"][0]["path"] == str(jam_log)
    assert doc["inputs"][0]["lines"] == JAM_LOG.count("\n")
    assert {"path", "bytes", "lines", "compressed", "ranks"} <= set(doc["inputs"][0])
    findings = doc["findings"]
    assert [f["rank"] for f in findings] == list(range(1, len(findings) + 1))
    first = findings[0]
    for key in ("rank", "cause", "rule", "severity", "confidence", "title", "summary", "evidence", "facts",
                "fixes", "repro"):
        assert key in first, key
    assert first["rule"] == "test-frobnicator-jam" and first["repro"] == "device-assert"
    assert first["evidence"][0] == {"file": str(jam_log), "line": 6, "text": "FROBNICATOR JAMMED at step 42"}
    assert first["fixes"][0] == {"text": "Unjam the frobnicator", "command": "frob --unjam"}
    assert any(f["rule"] == "test-widget-shortage" for f in findings[1:])


def test_markdown_report(capsys, user_rules, jam_log):
    code, out, _ = cli(capsys, "explain", str(jam_log), "--rules", str(user_rules), "--format", "md")
    assert code == 0
    assert out.startswith("## loradoctor explain")
    assert "**Most likely: The frobnicator jammed (train.device_mismatch, confidence high)**" in out
    assert "```" in out and "jam.log:6: FROBNICATOR JAMMED at step 42" in out
    assert "`loradoctor repro run device-assert`" in out


def test_compressed_input(capsys, user_rules, tmp_path):
    path = tmp_path / "jam.log.gz"
    path.write_bytes(gzip.compress(JAM_LOG.encode()))
    code, out, _ = cli(capsys, "explain", str(path), "--rules", str(user_rules), "--format", "json")
    assert code == 0
    assert json.loads(out)["findings"][0]["rule"] == "test-frobnicator-jam"


# ---------------------------------------------------------------------------- real crash, nothing recognised


OOM_LOG = NOISE + """\
Traceback (most recent call last):
  File "/home/u/train.py", line 88, in <module>
    trainer.train()
  File "/opt/venv/lib/python3.11/site-packages/torch/autograd/graph.py", line 823, in _engine_run_backward
    return Variable._execution_engine.run_backward(  # Calls into the C++ engine to run the backward pass
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.96 GiB. GPU 0 has a total capacity of 23.54 GiB \
of which 1.12 GiB is free. Including non-PyTorch memory, this process has 22.41 GiB memory in use. Of the allocated \
memory 21.87 GiB is allocated by PyTorch, and 88.35 MiB is reserved by PyTorch but unallocated. If reserved but \
unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  \
See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)
"""


def test_a_real_oom_is_diagnosed_with_the_builtin_rules(capsys, tmp_path):
    path = tmp_path / "oom.log"
    path.write_text(OOM_LOG, encoding="utf-8")
    code, out, _ = cli(capsys, "explain", str(path), "--format", "json")
    assert code == 0
    first = json.loads(out)["findings"][0]
    assert first["cause"].startswith("oom."), first
    assert any(e["line"] == 9 for e in first["evidence"]), first["evidence"]


def test_nothing_recognised_says_so_and_shows_the_tail(capsys, tmp_path):
    path = tmp_path / "odd.log"
    path.write_text(NOISE + "ERROR: the flux capacitor reports 1.21 gigawatts\nbye\n", encoding="utf-8")
    code, out, _ = cli(capsys, "explain", str(path))
    assert code == 1
    assert out.startswith("Nothing recognised")
    assert "Last error-looking lines:" in out
    assert re.search(r"odd\.log:4 ERROR: the flux capacitor", out), out


def test_a_finished_run_is_reported_as_finished_and_exits_0(capsys):
    # A healthy run (use_cache warning and all) that reaches the trainer's end-of-training record.
    code, out, _ = cli(capsys, "explain", str(ROOT / "fixtures" / "goodlogs" / "hf-trainer-lora-bf16.log"))
    assert code == 0, out
    assert out.startswith("The run finished without a failure")
    assert "Nothing recognised" not in out and "Last error-looking lines" not in out
    code, out, _ = cli(capsys, "explain", str(ROOT / "fixtures" / "goodlogs" / "hf-trainer-lora-bf16.log"),
                       "--format", "json")
    assert code == 0 and json.loads(out)["status"] == "finished"


def test_info_findings_alone_are_not_a_diagnosis(capsys, tmp_path):
    # The same healthy log cut off before its end-of-training record: nothing to diagnose, exit 1.
    text = (ROOT / "fixtures" / "goodlogs" / "hf-trainer-lora-bf16.log").read_text(encoding="utf-8")
    cut = tmp_path / "cut.log"
    cut.write_text(text[: text.index("{'train_runtime'")], encoding="utf-8")
    code, out, _ = cli(capsys, "explain", str(cut))
    assert code == 1
    assert out.startswith("Nothing recognised")


# ---------------------------------------------------------------------------- bad input: one line, exit 2


def _one_line_error(code: int, out: str, err: str, needle: str) -> None:
    assert code == 2, (code, out, err)
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("loradoctor: error:"), err
    assert needle in lines[0], err


def test_missing_file(capsys, tmp_path):
    _one_line_error(*cli(capsys, "explain", str(tmp_path / "nope.log")), "nope.log")


def test_binary_file(capsys, tmp_path):
    path = tmp_path / "model.bin"
    path.write_bytes(b"\x00\x01\x02PK\x03\x04" * 4096)
    _one_line_error(*cli(capsys, "explain", str(path)), "model.bin")


@pytest.mark.parametrize("make", ["missing", "file"])
def test_bad_rules_folder(capsys, tmp_path, jam_log, make):
    target = tmp_path / "rules-here"
    if make == "file":
        target.write_text("not a folder")
    _one_line_error(*cli(capsys, "explain", str(jam_log), "--rules", str(target)), "rules-here")


def test_broken_user_rule_is_a_one_line_error(capsys, tmp_path, jam_log):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "broken.yaml").write_text(USER_RULES.replace("(\\d+)", "(\\d+"), encoding="utf-8")
    _one_line_error(*cli(capsys, "explain", str(jam_log), "--rules", str(folder)), "broken.yaml")


@pytest.mark.parametrize("content", [None, "{not json", '{"hello": "world"}', "[1, 2, 3]"])
def test_bad_env_file(capsys, tmp_path, jam_log, content):
    path = tmp_path / "env.json"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    _one_line_error(*cli(capsys, "explain", str(jam_log), "--env", str(path)), "env.json")


def test_bad_format(capsys, jam_log):
    _one_line_error(*cli(capsys, "explain", str(jam_log), "--format", "xml"), "xml")


# ---------------------------------------------------------------------------- --env


SNAPSHOT = {
    "schema": "loradoctor.snapshot/1",
    "system": {"os": "Linux", "python": "3.11.7", "wsl": False, "container": False, "ram_total_bytes": 64 << 30},
    "nvidia": {"driver_version": "550.54.15", "cuda_driver_version": "12.4", "gpus": [
        {"index": 0, "name": "NVIDIA GeForce RTX 4090", "compute_capability": "8.9",
         "memory_total_bytes": 24 << 30, "memory_used_bytes": 1 << 30, "memory_free_bytes": 23 << 30,
         "processes": []}]},
    "torch": {"installed": True, "version": "2.5.1+cu124", "cuda_version": "12.4", "cuda_available": True,
              "device_count": 1, "arch_list": ["sm_80", "sm_86", "sm_89", "sm_90"]},
    "packages": {"torch": "2.5.1"},
    "env_vars": {},
}


@pytest.mark.parametrize("wrapped", [True, False], ids=["env-output", "bare-snapshot"])
def test_env_file_is_accepted(capsys, tmp_path, user_rules, jam_log, wrapped):
    from loradoctor.cli.explain_cmd import load_env_snapshot

    path = tmp_path / "env.json"
    data = {"schema": "loradoctor.env/1", "snapshot": SNAPSHOT, "findings": []} if wrapped else SNAPSHOT
    path.write_text(json.dumps(data), encoding="utf-8")
    loaded = load_env_snapshot(str(path))
    loaded.pop("meta", None)  # the reader notes which file it came from
    assert loaded == SNAPSHOT
    code, _, err = cli(capsys, "explain", str(jam_log), "--rules", str(user_rules), "--env", str(path))
    assert code == 0, err


def test_env_live_without_the_collector_is_a_clear_error(monkeypatch):
    import loradoctor.env
    from loradoctor.cli.explain_cmd import load_env_snapshot

    if hasattr(loradoctor.env, "collect_snapshot"):
        monkeypatch.delattr(loradoctor.env, "collect_snapshot")
    with pytest.raises(UserError, match="env --format json"):
        load_env_snapshot("live")


def test_env_live_uses_the_quick_collector(monkeypatch):
    import loradoctor.env
    from loradoctor.cli.explain_cmd import load_env_snapshot

    calls = []

    def fake_collect(quick=False):
        calls.append(quick)
        return dict(SNAPSHOT)

    monkeypatch.setattr(loradoctor.env, "collect_snapshot", fake_collect, raising=False)
    assert load_env_snapshot("live") == SNAPSHOT
    assert calls == [True]


# ---------------------------------------------------------------------------- child process: stdin, piping


def test_stdin_in_a_child_process(user_rules):
    result = run_cli("explain", "-", "--rules", str(user_rules), input=JAM_LOG)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Most likely: The frobnicator jammed")
    assert "<stdin>:6" in result.stdout
    assert result.stderr == ""  # no progress meter when stderr is not a terminal


def test_missing_file_in_a_child_process(tmp_path):
    result = run_cli("explain", str(tmp_path / "gone.log"))
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "gone.log" in result.stderr
    assert "Traceback" not in result.stderr


# ---------------------------------------------------------------------------- rules list / show / lint


def _cause_ids() -> list[str]:
    from loradoctor import catalogue

    return catalogue.cause_ids()


def test_rules_list_text(capsys):
    from loradoctor.logs.rules import load_rules

    code, out, _ = cli(capsys, "rules", "list")
    assert code == 0
    header = out.splitlines()[0].split()
    assert header == ["ID", "CAUSE", "SEVERITY", "TITLE"]
    rule = load_rules()[0]
    assert any(line.split()[:3] == [rule.id, rule.cause, rule.severity] for line in out.splitlines())


def test_rules_list_json_covers_every_cause(capsys):
    code, out, _ = cli(capsys, "rules", "list", "--format", "json")
    assert code == 0
    rules = json.loads(out)
    assert all({"id", "cause", "severity", "title"} <= set(r) for r in rules)
    produced = {r["cause"] for r in rules}
    from loradoctor.bedside.diagnose import TIMELINE_ONLY_CAUSES

    produced |= set(TIMELINE_ONLY_CAUSES)  # tested with fixtures/timelines (tests/test_bedside_diagnose.py)
    missing = [c for c in _cause_ids() if c not in produced]
    assert not missing, f"causes no rule produces: {missing}"


def test_rules_list_includes_user_rules(capsys, user_rules):
    code, out, _ = cli(capsys, "rules", "list", "--rules", str(user_rules), "--format", "json")
    assert code == 0
    assert {"test-frobnicator-jam", "test-widget-shortage"} <= {r["id"] for r in json.loads(out)}


def test_rules_show_prints_the_docs(capsys, user_rules):
    code, out, _ = cli(capsys, "rules", "show", "test-frobnicator-jam", "--rules", str(user_rules))
    assert code == 0
    for needle in ("test-frobnicator-jam: The frobnicator jammed", "train.device_mismatch",
                   "the frobnicator jams when fed too many widgets", "FROBNICATOR JAMMED at step",
                   "1. Unjam the frobnicator", "frob --unjam", "2. Replace the frobnicator",
                   "loradoctor repro run device-assert", "False positives:", "Never."):
        assert needle in out, needle


def test_rules_show_a_builtin_rule(capsys):
    from loradoctor.logs.rules import load_rules

    rule = load_rules()[0]
    code, out, _ = cli(capsys, "rules", "show", rule.id)
    assert code == 0 and out.startswith(f"{rule.id}: {rule.title}") and "Fixes, in order:" in out


def test_rules_show_unknown_id(capsys):
    _one_line_error(*cli(capsys, "rules", "show", "no-such-rule-anywhere"), "no-such-rule-anywhere")


def test_rules_lint_builtin_ok(capsys):
    code, out, _ = cli(capsys, "rules", "lint")
    assert code == 0, out
    assert re.match(r"\d+ rules OK", out)


def test_rules_lint_user_folder(capsys, user_rules):
    code, out, _ = cli(capsys, "rules", "lint", str(user_rules))
    assert code == 0, out
    assert out.startswith("2 rules OK")


def test_rules_lint_broken_folder_names_the_file(capsys, tmp_path):
    (tmp_path / "oops.yaml").write_text(USER_RULES.replace("train.device_mismatch", "no.such_cause"), encoding="utf-8")
    code, out, _ = cli(capsys, "rules", "lint", str(tmp_path))
    assert code == 1
    assert "oops.yaml" in out


def test_rules_lint_missing_folder(capsys, tmp_path):
    _one_line_error(*cli(capsys, "rules", "lint", str(tmp_path / "nowhere")), "nowhere")
