"""The CLI contract, walked from the parser tree itself: every command and subcommand, with no arguments,
with `--help`, with an unknown option, with a bad value for each option that takes one, and each example its
`--help` documents. Every run must exit with a documented code (0, 1 or 2; 3 only for a crash), put errors on
stderr as one `loradoctor: error:` line, never print a traceback, and keep placeholder tokens (`?` for a value,
`None`, `(s)`) out of stdout.

Runs are in-process calls of cli.main() (no interpreter start per case); only the children the commands
themselves start (env probes, repro scripts) cost a process.
"""

from __future__ import annotations

import argparse
import io
import re
import shlex
import sys
from pathlib import Path

import pytest

from loradoctor.cli import COMMANDS, build_command_parser, main

ROOT = Path(__file__).resolve().parent.parent
PLACEHOLDERS = [
    (re.compile(r"(^|\s)\?($|[\s,.;:)])", re.M), "'?' standing for a value"),
    (re.compile(r"\bNone\b(?! of\b)"), "'None'"),  # torch's own "None of the inputs ..." is a quote
    (re.compile(r"\w\(s\)"), "a '(s)' plural"),
]
# commands whose examples cannot run here (a GPU measurement) or need what a test machine lacks
NOT_RUN = ("measure",)


def _tree() -> list[tuple[list[str], argparse.ArgumentParser]]:
    """(path, parser) for every command and subcommand."""
    out = []
    for name in COMMANDS:
        parser = build_command_parser(name)
        out.append(([name], parser))
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                out += [([name, sub], p) for sub, p in action.choices.items()]
    return out


TREE = _tree()


def run(capsys, monkeypatch, args: list[str]) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def check(code: int, out: str, err: str, args: list[str]) -> None:
    what = "loradoctor " + " ".join(args)
    assert code in (0, 1, 2), f"{what}: exit {code}\n{err}"
    assert "Traceback" not in err, f"{what}: traceback\n{err}"
    # the documentation may speak of tracebacks (docs/rules.md: a header cut short still opens one)
    assert args[:1] == ["docs"] or "Traceback" not in out, f"{what}: traceback\n{out[-2000:]}"
    errors = [line for line in err.splitlines() if line.startswith("loradoctor: error:")]
    if code == 2 and not out:
        assert len(errors) == 1 and len(err.strip().splitlines()) == 1, f"{what}: not one error line:\n{err}"
    if args[:1] == ["docs"]:
        return  # documentation prose may say `is None` or show a template
    if args[:2] in (["rules", "show"], ["rules", "list"]) and ("show" in args or "json" in args):
        return  # a rule's regexes are quoted as written (`NET/IB ?: ...`)
    # what the report quotes is what the machine or the log said (`torch.version.cuda = None`): fenced
    # Markdown evidence and `code` spans are left out of the check
    out = re.sub(r"(?ms)^```.*?^```", "", out)
    out = re.sub(r"`[^`\n]*`", "", out)
    out = re.sub(r"'[^'\n]*'", "", out)  # and messages quoted in single quotes (a warning torch printed)
    for pattern, name in PLACEHOLDERS:
        hit = pattern.search(out)
        assert hit is None, f"{what}: {name} in stdout: ...{out[max(0, hit.start() - 80):hit.end() + 40]}..."


def test_the_tree_has_every_command():
    assert {p[0] for p, _ in TREE} == set(COMMANDS)
    assert ["repro", "run"] in [p for p, _ in TREE] and ["rules", "lint"] in [p for p, _ in TREE]


@pytest.mark.parametrize("path", [p for p, _ in TREE], ids=[" ".join(p) for p, _ in TREE])
def test_help_no_arguments_and_an_unknown_option(capsys, monkeypatch, path):
    code, out, err = run(capsys, monkeypatch, path + ["--help"])
    assert code == 0 and out.startswith(f"usage: loradoctor {' '.join(path)}") and not err
    check(code, out, err, path + ["--help"])
    code, out, err = run(capsys, monkeypatch, path + ["--no-such-option"])
    assert code == 2 and not out, (out, err)
    check(code, out, err, path + ["--no-such-option"])
    if path[0] in ("env", "preflight", "measure", "completion", "gpus", "docs") or path[:2] in (["repro", "list"], ["rules", "list"], ["rules", "lint"]):
        return  # these run something with no argument (a live check, a listing); covered by their examples
    code, out, err = run(capsys, monkeypatch, path)
    assert code == 2, (path, code, out, err)  # an argument is required, or a group needs its subcommand
    check(code, out, err, path)


def _value_options(parser: argparse.ArgumentParser) -> list[str]:
    return [a.option_strings[-1] for a in parser._actions
            if a.option_strings and a.nargs != 0 and a.help != argparse.SUPPRESS and not isinstance(a, argparse._SubParsersAction)]


BAD_VALUE_CASES = [(path, opt) for path, parser in TREE for opt in _value_options(parser)
                   if path[0] not in NOT_RUN]


@pytest.mark.parametrize("path,option", BAD_VALUE_CASES, ids=[" ".join(p) + " " + o for p, o in BAD_VALUE_CASES])
def test_a_bad_value_is_one_line_and_exit_2(capsys, monkeypatch, tmp_path, path, option):
    # a value no option accepts: not a number, not a file, not a format, not a card
    args = list(path)
    if path == ["explain"]:
        args.append(str(tmp_path / "missing.log"))
    elif path in (["repro", "run"],):
        args.append("bf16")
    elif path in (["repro", "show"], ["rules", "show"]):
        args.append("nothing-by-this-name")
    elif path in (["estimate"], ["preflight"]) and option not in ("--model",):
        args += ["--model", "meta-llama/Llama-3.1-8B"]
    args += [option, "-1x/nonsense"]
    code, out, err = run(capsys, monkeypatch, args)
    assert code == 2, (args, code, out, err)
    check(code, out, err, args)


def _examples(text: str) -> list[list[str]]:
    """The `loradoctor ...` commands a help text shows, each cut at a pipe, redirection or `&&`."""
    found = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("loradoctor "):
            continue
        line = re.split(r"\s(?:\||>>?|&&|\|\|)\s|\s+\(|\s+#", line)[0]
        words = shlex.split(line)[1:]
        if words and words[0] not in NOT_RUN and words not in found:
            found.append(words)
    return found


def _all_examples() -> list[list[str]]:
    from loradoctor.cli import root_help

    texts = [root_help()] + [parser.format_help() for _, parser in TREE]
    out: list[list[str]] = []
    for text in texts:
        out += [e for e in _examples(text) if e not in out]
    return out


EXAMPLES = _all_examples()


@pytest.mark.parametrize("words", EXAMPLES, ids=[" ".join(e) for e in EXAMPLES])
def test_each_documented_example(capsys, monkeypatch, tmp_path, words):
    # examples name files a reader has (crash.log, train.yaml): here they are missing, so exit 2 with one line;
    # run from an empty folder so nothing of the checkout is picked up
    monkeypatch.chdir(tmp_path)
    if words[:2] == ["repro", "run"] and "--all" in words:
        words = [w if w != "--all" else "cuda-init" for w in words]  # one repro stands for all (a child each)
    if words[:1] == ["run"]:
        # `run` starts the user's command and exits with its code (tests/test_bedside_run.py): here a command
        # that succeeds stands in for the example's training script
        words = words[:words.index("--") + 1] + [sys.executable, "-c", "pass"]
        words.insert(1, f"--out={tmp_path / 'run'}")
    code, out, err = run(capsys, monkeypatch, words)
    check(code, out, err, words)


def test_examples_were_found():
    assert len(EXAMPLES) >= 15
    assert ["explain", "train.log"] in EXAMPLES and ["repro", "list"] in EXAMPLES
