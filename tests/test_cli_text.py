"""What the CLI says and how it exits, case by case: text a person in trouble can read (plurals, no engine
internals without -v, wrapping that keeps indentation and commands whole), option combinations refused with
one line, the crash line and exit 3, a closed pipe, the docs / gpus / completion commands."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import run_cli
from loradoctor.cli import main

ROOT = Path(__file__).resolve().parent.parent
CASCADE = ROOT / "fixtures" / "cascades" / "deepspeed-oom-rank0-socket-timeouts"
FRAGMENTATION = ROOT / "fixtures" / "logs" / "oom-fragmentation" / "pos-g2-lightning-v100.log"


def cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(code: int, out: str, err: str, needle: str) -> None:
    assert code == 2, (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("loradoctor: error:") and needle in lines[0], err
    assert "Traceback" not in err


# ---------------------------------------------------------------------------- explain text


def _report(path: Path):
    from loradoctor.logs.engine import explain

    return explain([str(path)])


def test_text_says_why_first_in_words_and_keeps_the_working_for_verbose():
    from loradoctor.render.explain_view import explain_md, explain_text
    from loradoctor.render.text import Painter

    report = _report(CASCADE)
    text = explain_text(report, Painter(), verbose=False)
    assert "why first:" in text and "why this rank" not in text
    assert "consequence_of" not in text and "oom.*" not in text
    verbose = explain_text(report, Painter(), verbose=True)
    assert "matches consequence_of" in verbose  # the ranking's working, on request
    frag = _report(FRAGMENTATION)
    for shown in (explain_text(frag, Painter()), explain_md(frag)):
        assert "reserved_unallocated_bytes" not in shown and "requested_bytes" not in shown, shown
        assert "the only finding; it rests on numbers in the OOM message" in shown
    assert "reserved_unallocated_bytes" in explain_text(frag, Painter(), verbose=True)


def test_wrapping_keeps_indentation_and_never_splits_a_command():
    from loradoctor.render.explain_view import explain_text
    from loradoctor.render.text import Painter

    report = _report(CASCADE)
    lines = explain_text(report, Painter(width=80), verbose=True).splitlines()
    commands = {fix.command.strip() for f in report.findings for fix in f.fixes if fix.command}
    stripped = [line.strip() for line in lines]
    for command in commands:
        for part in command.splitlines():
            assert part.strip() in stripped, f"command split or joined: {part!r}"
    for line in lines:
        if line.strip() in commands or " " not in line.strip():
            continue  # a command, or one token longer than the width
        assert len(line) <= 80, line
    # only the verdict and each finding's heading start at column 0; continuations are indented
    flush = [line for line in lines if line and not line.startswith(" ")]
    assert all(re.match(r"(Most likely:|Read\b|\d+\. (ERROR|WARNING|INFO) |\d+ more finding)", line) for line in flush), flush


def test_plurals_in_explain_and_rules_lint(capsys, tmp_path):
    log = tmp_path / "one.log"
    log.write_text("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n", encoding="utf-8")
    code, out, _ = cli(capsys, "explain", str(log))
    assert "(72 bytes, 1 line)" in out and "1 lines" not in out and "(s)" not in out
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "mine.yaml").write_text("""\
rules:
  - id: test-one-rule
    cause: train.device_mismatch
    title: One rule
    severity: error
    confidence: high
    summary: one rule
    patterns: ['ONE RULE FIRES']
""", encoding="utf-8")
    code, out, err = cli(capsys, "rules", "lint", str(rules))
    assert code == 0 and out.startswith("1 rule OK"), (out, err)


def test_rules_lint_refuses_a_folder_with_no_rules(capsys, tmp_path):
    one_line_error(*cli(capsys, "rules", "lint", str(tmp_path)), "no rule files")
    (tmp_path / "empty.yaml").write_text("rules: []\n", encoding="utf-8")
    one_line_error(*cli(capsys, "rules", "lint", str(tmp_path)), "define no rules")


# ---------------------------------------------------------------------------- repro


@pytest.mark.parametrize("args,needle", [
    (["repro", "run", "bf16", "--all"], "--all"),
    (["repro", "run", "--all", "--from", "x.json"], "--all"),
    (["repro", "run", "bf16", "--dtype", "fp16"], "--dtype"),
    (["repro", "run", "flash-attn", "--dtype", "fp32"], "fp32"),
    (["repro", "run", "bf16", "--opt", "foo=bar"], "--opt foo"),
    (["repro", "run", "gc-require-grad", "--opt", "segments=3"], "--opt segments"),
    (["repro", "run", "bf16", "--head-dim", "64"], "--head-dim"),
])
def test_repro_refuses_options_that_mean_nothing(capsys, args, needle):
    one_line_error(*cli(capsys, *args), needle)


def test_repro_options_that_mean_something_pass_the_checks():
    from loradoctor.cli.repro_cmd import check_options, choose_ids

    check_options(["sdpa-backends"], {}, "fp32")
    check_options(["gc-require-grad"], {"use_reentrant": True}, None)
    assert choose_ids(["bf16", "bf16", "fp16"], False, None) == ["bf16", "fp16"]
    assert len(choose_ids([], True, None)) > 5


def test_repro_show_run_alone_line_works_as_pasted(capsys):
    code, out, _ = cli(capsys, "repro", "show", "gc-require-grad")
    assert code == 0
    lines = out.splitlines()
    command = lines[lines.index("run it alone (default options):") + 1].strip()
    res = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=120)
    assert "JSONDecodeError" not in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert '"schema": "loradoctor.repro/1"' in res.stdout, (res.stdout, res.stderr)


# ---------------------------------------------------------------------------- crash, pipe


def test_an_unexpected_exception_is_one_line_exit_3_and_a_saved_traceback(capsys, monkeypatch, tmp_path):
    import tempfile

    import loradoctor.cli.docs_cmd as docs_cmd

    def boom(fmt: str = "text") -> int:
        raise RuntimeError("planted failure")

    monkeypatch.setattr(docs_cmd, "gpus", boom)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    code, out, err = cli(capsys, "gpus")
    assert code == 3 and not out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err
    assert lines[0].startswith("loradoctor: internal error in `loradoctor gpus` (RuntimeError: planted failure)")
    saved = re.search(r"the full traceback is in (\S+);", lines[0]).group(1)
    assert Path(saved).parent == tmp_path and "report it" in lines[0]
    text = Path(saved).read_text(encoding="utf-8")
    assert "Traceback" in text and "planted failure" in text
    assert oct(os.stat(saved).st_mode & 0o777) == "0o600"


@pytest.mark.parametrize("args,code", [(["rules", "list"], 0), (["explain", "UNRECOGNISED"], 1)])
def test_a_closed_pipe_keeps_the_exit_code_and_prints_no_traceback(tmp_path, args, code):
    log = tmp_path / "odd.log"
    log.write_text("ERROR: the flux capacitor is out of flux\n", encoding="utf-8")
    args = [str(log) if a == "UNRECOGNISED" else a for a in args]
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader (`head`) is already gone: the first write fails with EPIPE
    env = dict(os.environ, NO_COLOR="1")
    proc = subprocess.run([sys.executable, "-m", "loradoctor", *args], stdout=write_end, stderr=subprocess.PIPE,
                          text=True, env=env, timeout=120)
    os.close(write_end)
    assert proc.returncode == code, proc.stderr
    assert proc.stderr == ""


def test_the_console_entry_flushes_everything_runs_atexit_and_keeps_the_code(tmp_path):
    """entry() leaves with os._exit (no interpreter teardown): a long report must still arrive whole,
    an atexit handler must still run, and the exit code is main's."""
    logs = []
    for i in range(3):
        log = tmp_path / f"rank{i}.log"
        log.write_text("".join(f"{{'loss': {0.5 + j / 1000:.4f}, 'grad_norm': 1.2, 'epoch': {j / 100:.2f}}}\n"
                               for j in range(300)) + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
                       "2.00 GiB. GPU 0 has a total capacity of 31.36 GiB of which 1.10 GiB is free.\n",
                       encoding="utf-8")
        logs.append(str(log))
    code = ("import atexit, sys; atexit.register(lambda: sys.stderr.write('ATEXIT-RAN\\n'))\n"
            "sys.argv = ['loradoctor'] + sys.argv[1:]\nfrom loradoctor.cli import entry\nentry()\n"
            "sys.stderr.write('NOT-REACHED\\n')\n")
    proc = subprocess.run([sys.executable, "-c", code, "explain", *logs, "--format", "json"], capture_output=True,
                          text=True, env=dict(os.environ, NO_COLOR="1"), timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)  # the whole report, flushed before the hard exit
    assert report["findings"] and len(proc.stdout) > 2000
    assert "ATEXIT-RAN" in proc.stderr and "NOT-REACHED" not in proc.stderr
    bad = subprocess.run([sys.executable, "-c", code, "explain", str(tmp_path / "missing.log")], capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and "ATEXIT-RAN" in bad.stderr


# ---------------------------------------------------------------------------- docs, gpus, completion


def test_docs_lists_topics_and_prints_one(capsys):
    code, out, _ = cli(capsys, "docs")
    assert code == 0 and "causes" in out and "rules" in out
    code, out, _ = cli(capsys, "docs", "causes")
    from loradoctor import catalogue

    assert code == 0 and out == catalogue.render_docs()  # rendered from the catalogue each time
    one_line_error(*cli(capsys, "docs", "cuases"), "did you mean causes")


def test_gpus_prints_the_card_table(capsys):
    code, out, _ = cli(capsys, "gpus")
    assert code == 0
    assert re.search(r"^T4\s+15\.00 GiB\s+7\.5\s+no\s+tesla t4$", out, re.M), out
    assert re.search(r"^RTX 3060\s+12\.00 GiB\s+8\.6\s+yes\s+3060, geforce rtx 3060$", out, re.M), out


def test_no_output_points_to_files_a_pip_install_lacks(capsys, tmp_path):
    from loradoctor.cli import COMMANDS, build_command_parser, root_help

    texts = [root_help()] + [build_command_parser(name).format_help() for name in COMMANDS]
    log = tmp_path / "odd.log"
    log.write_text("ERROR: the flux capacitor is out of flux\n", encoding="utf-8")
    texts += [cli(capsys, "explain", str(log))[1], cli(capsys, "repro", "list")[1]]
    for text in texts:
        assert not re.search(r"docs/\w+\.md|gpus\.yaml", text), text


def _bash_complete(words: list[str]) -> list[str]:
    script = run_cli("completion", "bash").stdout
    line = " ".join(f"'{w}'" for w in words)
    probe = f'{script}\nCOMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; _loradoctor; echo "${{COMPREPLY[@]}}"'
    res = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stdout.split()


def test_bash_completion_from_the_parser_tree():
    assert _bash_complete(["loradoctor", "ex"]) == ["explain"]
    assert _bash_complete(["loradoctor", "repro", "r"]) == ["run"]
    assert _bash_complete(["loradoctor", "repro", "run", "bf"]) == ["bf16"]
    assert "--format" in _bash_complete(["loradoctor", "explain", "--f"])
    assert _bash_complete(["loradoctor", "explain", "--rules", ""]) == []  # a folder: the shell's file completion


def test_zsh_and_fish_scripts_name_every_command(capsys):
    from loradoctor.cli import COMMANDS

    code, zsh, _ = cli(capsys, "completion", "zsh")
    assert code == 0 and "bashcompinit" in zsh and "complete -o default -F _loradoctor loradoctor" in zsh
    assert subprocess.run(["bash", "-n"], input=zsh, text=True).returncode == 0
    code, fish, _ = cli(capsys, "completion", "fish")
    assert code == 0
    for name in COMMANDS:
        assert f"-a {name} " in fish
    assert "__fish_seen_subcommand_from repro; and __fish_seen_subcommand_from run' -l dtype -r" in fish
    one_line_error(*cli(capsys, "completion", "tcsh"), "tcsh")


def test_help_imports_no_command_module_and_explain_no_rich(tmp_path):
    log = tmp_path / "one.log"
    log.write_text("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n", encoding="utf-8")
    probe = f"""
import contextlib, io, sys
from loradoctor.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    main(["--help"])
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("rich", "yaml", "regex", "typer", "click", "pydantic")
               or m.startswith(("loradoctor.cli.", "loradoctor.logs", "loradoctor.env", "loradoctor.estimate")))
assert not heavy, heavy
with contextlib.redirect_stdout(io.StringIO()):
    main(["explain", {str(log)!r}])
assert "rich" not in sys.modules and "loradoctor.cli.env_cmd" not in sys.modules
"""
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("why,said", [
    ("placed after #1 (cuda-device-side-assert) because it is a consequence of it (cuda.device_assert matches "
     "consequence_of oom.*, cuda.*, env.*); the root cause comes first",
     "placed after #1 (cuda-device-side-assert) because it is a consequence of it; the root cause comes first"),
    ("the only finding; it rests on numbers in the OOM message (free_bytes 14.31 MiB < requested_bytes 288.00 MiB; "
     "allocated_bytes 22.91 GiB >= 0.75 * total_bytes 23.55 GiB)", "the only finding; it rests on numbers in the OOM message"),
    ("the only finding; it rests on numbers in the traceback (phase save in ['eval', 'save']; location save in ['eval'])",
     "the only finding; it rests on numbers in the traceback"),
    ("ranks below #1 (peft-zero-trainable-params): numbers (trainable_params 0 == 0) support this more than "
     "keyword-only finding #2 (optimizer-empty-parameter-list)",
     "ranks below #1 (peft-zero-trainable-params): numbers support this more than keyword-only finding #2 "
     "(optimizer-empty-parameter-list)"),
    ("high confidence, severity error outranks #2 (oom-leak-late-step) (low, error); both rest on numbers",
     "high confidence, severity error outranks #2 (oom-leak-late-step) (low, error); both rest on numbers"),
])
def test_ranking_reasons_in_words(why, said):
    from loradoctor.render.text import plain_why

    assert plain_why(why) == said


def test_startup_done_restores_the_collector_thresholds_once():
    import gc

    import loradoctor.cli as cli

    before = gc.get_threshold()
    try:
        cli._gc_saved = before
        gc.set_threshold(cli.STARTUP_GC_THRESHOLD, *before[1:])
        cli.startup_done()
        assert gc.get_threshold() == before and cli._gc_saved is None
        gc.set_threshold(12345, *before[1:])  # not entry()'s: a second call changes nothing
        cli.startup_done()
        assert gc.get_threshold()[0] == 12345
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
        cli._gc_saved = None
