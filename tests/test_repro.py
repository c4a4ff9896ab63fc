"""The repro library: catalog contract, runner (timeouts, crashes, missing results), CLI usage errors,
and the CPU logic of the repros that run without a GPU (needs torch; skipped cleanly without it)."""

import ast
import json
import re
import sys

import pytest

from loradoctor.errors import UserError
from loradoctor.repro import REPRO_IDS, REPROS
from loradoctor.repro.result import ReproResult, exit_code, overall_status, run_document
from loradoctor.repro.runner import parse_result_line, result_from_child, run_child, run_repro

from conftest import ROOT, run_cli

CPU_REPROS = ("fp16-overflow", "gc-require-grad", "device-assert", "nccl-allreduce")


def _rules_doc_ids():
    text = (ROOT / "docs" / "rules.md").read_text()
    section = text.split("## Repro ids", 1)[1].split("##", 1)[0]
    return re.findall(r"`([a-z0-9-]+)`", section.split("A rule's", 1)[0])


def test_ids_are_the_contract_in_docs_rules_md():
    assert set(_rules_doc_ids()) <= set(REPRO_IDS)
    assert len(_rules_doc_ids()) == 13
    assert isinstance(REPRO_IDS, tuple)


@pytest.mark.parametrize("repro_id", REPRO_IDS)
def test_each_repro_has_a_self_contained_script(repro_id):
    spec = REPROS[repro_id]
    text = spec.script.read_text()
    tree = ast.parse(text)
    doc = ast.get_docstring(tree)
    assert doc and doc.startswith(f"Repro {repro_id}:"), "the docstring says what PASS/FAIL mean"
    assert "PASS" in doc and "FAIL" in doc
    # self-contained: no import of loradoctor, the harness inline
    imported = {n.names[0].name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert "loradoctor" not in imported
    # fp16 runs bf16.py's body under its own name; every body takes the harness from _harness.py beside it
    body = (spec.script.parent / "bf16.py").read_text() if '"bf16.py"' in text else text
    assert "from _harness import *" in body and "run_main(main)" in body
    harness = (spec.script.parent / "_harness.py").read_text()
    assert "def emit(" in harness and "loradoctor" not in {n.names[0].name for n in ast.walk(ast.parse(harness)) if isinstance(n, ast.Import)}
    assert spec.gpu in ("yes", "no", "optional") and spec.kind in ("check", "problem")


# --- the runner, with tiny stand-in children ---------------------------------------------------

def _py(code, timeout_s=20.0):
    return run_child([sys.executable, "-c", code], timeout_s=timeout_s)


def test_last_result_line_wins_and_noise_is_ignored():
    line = lambda s: json.dumps({"schema": "loradoctor.repro/1", "id": "x", "status": s, "summary": s})
    run = _py(f"print('noise {{not json'); print({line('SKIP')!r}); print({line('FAIL')!r}); print('tail')")
    result = result_from_child("bf16", run, 20)
    assert result.status == "FAIL" and result.id == "bf16"


def test_a_hung_child_is_killed_and_reported_as_hung():
    # the grandchild would keep the pipes open: the whole group must go
    code = "import subprocess,sys,time; subprocess.Popen([sys.executable,'-c','import time; time.sleep(60)']); time.sleep(60)"
    run = _py(code, timeout_s=1.5)
    assert run.timed_out and run.duration_s < 15
    result = result_from_child("nccl-allreduce", run, 1.5)
    assert result.status == "FAIL" and "hung" in result.summary and result.numbers["timed_out"] is True


def test_a_crashing_child_is_a_fail_with_its_stderr_tail():
    run = _py("import os,signal,sys; print('about to crash', file=sys.stderr, flush=True); os.kill(os.getpid(), signal.SIGSEGV)")
    result = result_from_child("flash-attn", run, 20)
    assert result.status == "FAIL" and "SIGSEGV" in result.summary
    assert any("about to crash" in e for e in result.evidence)


def test_a_child_without_result_is_an_error_with_its_stderr_tail():
    run = _py("raise SystemExit('boom from child')")
    result = result_from_child("bf16", run, 20)
    assert result.status == "ERROR" and "code 1" in result.summary
    assert any("boom from child" in e for e in result.evidence)


def test_parse_result_line_rejects_other_schemas():
    assert parse_result_line(['{"schema": "other/1", "status": "PASS"}']) is None
    assert parse_result_line(["{broken loradoctor.repro/1"]) is None


def test_statuses_and_exit_codes():
    r = lambda s: ReproResult("bf16", s, "x")
    assert exit_code([r("PASS"), r("SKIP")]) == 0
    assert exit_code([r("PASS"), r("FAIL")]) == 1
    assert exit_code([r("ERROR")]) == 1
    assert overall_status([r("ERROR"), r("FAIL")]) == "FAIL"
    doc = run_document([r("PASS"), r("SKIP")])
    assert doc["schema"] == "loradoctor.repro-run/1" and doc["status"] == "PASS"
    assert doc["counts"] == {"PASS": 1, "FAIL": 0, "SKIP": 1, "ERROR": 0}
    with pytest.raises(ValueError):
        ReproResult("bf16", "OK", "x")


def test_unknown_id_is_a_user_error():
    with pytest.raises(UserError):
        run_repro("no-such-repro")


# --- CLI usage -------------------------------------------------------------------------------

def test_cli_unknown_id_exits_2():
    out = run_cli("repro", "run", "bf16", "nope")
    assert out.returncode == 2 and "unknown repro id 'nope'" in out.stderr and "Traceback" not in out.stderr


def test_cli_nothing_to_run_exits_2():
    assert run_cli("repro", "run").returncode == 2


@pytest.mark.parametrize("content", [None, "not json at all", '{"schema": "loradoctor.env/1", "findings": []}', "[1, 2]"])
def test_cli_from_unreadable_or_wrong_file_exits_2(tmp_path, content):
    path = tmp_path / "explain.json"
    if content is not None:
        path.write_text(content)
    out = run_cli("repro", "run", "--from", str(path))
    assert out.returncode == 2 and out.stderr.startswith("loradoctor: error:") and "Traceback" not in out.stderr


def test_from_explain_takes_ids_in_rank_order_deduplicated(tmp_path):
    from loradoctor.cli.repro_cmd import ids_from_explain

    doc = {"schema": "loradoctor.explain/1", "inputs": ["a.log"], "findings": [
        {"rule": "r3", "rank": 3, "repro": "bf16"},
        {"rule": "r1", "rank": 1, "repro": "fragmentation"},
        {"rule": "r2", "rank": 2, "repro": "bf16"},
        {"rule": "r4", "rank": 4},
        {"rule": "r5", "rank": 5, "repro": "made-up"},
        {"rule": "r6", "rank": 6, "repro": "fragmentation"},
    ]}
    path = tmp_path / "explain.json"
    path.write_text(json.dumps(doc))
    assert ids_from_explain(str(path)) == ["fragmentation", "bf16"]


def test_cli_from_explain_without_repros_exits_0(tmp_path):
    path = tmp_path / "explain.json"
    path.write_text(json.dumps({"schema": "loradoctor.explain/1", "inputs": [], "findings": [{"rule": "x"}]}))
    out = run_cli("repro", "run", "--from", str(path))
    assert out.returncode == 0 and "nothing to run" in out.stderr


def test_cli_list_json_names_every_id():
    out = run_cli("repro", "list", "--format", "json")
    assert out.returncode == 0
    data = json.loads(out.stdout)
    assert [r["id"] for r in data["repros"]] == list(REPRO_IDS)
    text = run_cli("repro", "list")
    assert all(i in text.stdout for i in REPRO_IDS)


def test_cli_show_prints_the_semantics():
    out = run_cli("repro", "show", "gc-require-grad")
    assert out.returncode == 0 and "use_reentrant" in out.stdout and "FAIL" in out.stdout


def test_missing_torch_is_a_skip_with_a_reason(tmp_path):
    # a stand-in package named torch that behaves like an absent one
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'torch'\", name='torch')\n")
    result = run_repro("gc-require-grad", timeout_s=60, env={"PYTHONPATH": str(tmp_path)})
    assert result.status == "SKIP" and "torch is not installed" in result.summary


def test_broken_torch_is_a_fail(tmp_path):
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise OSError('libcudnn.so.9: cannot open shared object file')\n")
    result = run_repro("fp16-overflow", timeout_s=60, env={"PYTHONPATH": str(tmp_path)})
    assert result.status == "FAIL" and any("libcudnn" in e for e in result.evidence)


def test_from_reads_a_real_explain_document(tmp_path):
    logs = sorted((ROOT / "fixtures" / "logs" / "gc-no-grad-fn").glob("pos-*"))
    if not logs:
        pytest.skip("the gc-no-grad-fn fixtures are not there")
    out = run_cli("explain", str(logs[0]), "--format", "json")
    assert out.returncode == 0, out.stderr
    path = tmp_path / "explain.json"
    path.write_text(out.stdout)
    from loradoctor.cli.repro_cmd import ids_from_explain

    ids = ids_from_explain(str(path))
    assert ids and ids[0] == "gc-require-grad" and set(ids) <= set(REPRO_IDS)


def test_text_view_shows_verdict_summary_and_evidence():
    from loradoctor.render.repro_view import result_lines, summary_lines
    from loradoctor.render.text import Painter

    p = Painter()
    fail = ReproResult("gc-require-grad", "FAIL", "reproduces the error", evidence=[f"line {i}" for i in range(20)],
                       numbers={"arms": [1]}, duration_s=1.25)
    ok = ReproResult("bf16", "PASS", "works", evidence=[f"ok {i}" for i in range(9)])
    kinds = {"gc-require-grad": "problem", "bf16": "check"}
    text = "\n".join(result_lines(p, fail, "problem") + result_lines(p, ok, "check")
                     + summary_lines(p, [fail, ok], kinds))
    # a problem repro that reproduces is CONFIRMED, not FAIL; a check that works is PASS
    assert "CONFIRMED gc-require-grad  reproduces the error (1.2 s)" in text or "CONFIRMED gc-require-grad  reproduces the error (1.3 s)" in text
    assert "PASS bf16  works" in text
    assert "line 15" in text and "line 16" not in text and "4 more lines" in text  # FAIL: up to 16 lines
    assert "ok 3" in text and "ok 4" not in text  # PASS: quiet
    assert "FAIL 2 repros: 1 passed, 1 failed (1 confirmed)" in text


def test_all_skipped_is_skipped_not_pass_and_the_reason_is_said_once():
    from loradoctor.render.repro_view import summary_lines
    from loradoctor.render.text import Painter

    reason = "no CUDA GPU here (torch.cuda.is_available() is False)"
    skips = [ReproResult(i, "SKIP", reason) for i in ("bf16", "fp16", "cuda-init")]
    assert overall_status(skips) == "SKIP" and exit_code(skips) == 0
    assert run_document(skips)["status"] == "SKIP"
    text = "\n".join(summary_lines(Painter(), skips, {}))
    assert text.count(reason) == 1 and "bf16, fp16, cuda-init" in text
    assert "SKIPPED 3 repros: nothing ran here" in text and "PASS" not in text
