"""`loradoctor repro list | show | run`: small programs that confirm a diagnosis on this machine.

Parse options, call the runner, render. Exit codes: 0 every repro passed, did not reproduce the
problem, or was skipped; 1 a check failed, a problem was confirmed, or a repro errored; 2 bad usage
(unknown id, an option no chosen repro takes, unreadable --from file).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, List, Optional

from loradoctor.errors import UserError


def parse_opt(text: str) -> tuple[str, Any]:
    """'head_dim=64' -> ('head_dim', 64); values are read as JSON when they parse (numbers, true/false)."""
    if "=" not in text:
        raise UserError(f"--opt takes KEY=VALUE, not {text!r}")
    key, _, raw = text.partition("=")
    key = key.strip().replace("-", "_")
    if not key:
        raise UserError(f"--opt takes KEY=VALUE, not {text!r}")
    try:
        value: Any = json.loads(raw)
    except ValueError:
        value = raw
    return key, value


def ids_from_explain(path: str) -> list[str]:
    """The repro ids the findings of an `explain --format json` document name, deduplicated, in rank order."""
    from loradoctor.repro.catalog import REPROS

    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read {path}: {exc}") from None
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise UserError(f"{path} is not JSON ({exc}); make it with loradoctor explain LOG --format json > explain.json") from None
    if not isinstance(document, dict) or not isinstance(document.get("findings"), list):
        raise UserError(f"{path} is not an explain document (no \"findings\" list; schema loradoctor.explain/1)")
    schema = str(document.get("schema", ""))
    if schema and not schema.startswith("loradoctor.explain/"):
        raise UserError(f"{path} has schema {schema!r}, expected loradoctor.explain/1")
    findings = [f for f in document["findings"] if isinstance(f, dict)]
    # rank order: by "rank" where given (1..n), keeping the file's order for ties and missing ranks
    order = sorted(range(len(findings)), key=lambda i: (
        findings[i].get("rank") if isinstance(findings[i].get("rank"), int) and findings[i].get("rank") > 0 else 10**9, i))
    ids: list[str] = []
    for i in order:
        repro = findings[i].get("repro")
        if not repro or repro in ids:
            continue
        if repro not in REPROS:
            print(f"loradoctor: warning: {path}: finding {findings[i].get('rule') or i + 1} names unknown repro "
                  f"{repro!r}; skipped", file=sys.stderr)
            continue
        ids.append(repro)
    return ids


REPRO_HELP = """Small programs that confirm a diagnosis on this machine, each in a child process of
this Python with a timeout.

A check repro says PASS (works here) or FAIL; a problem repro says CONFIRMED (the problem
reproduces in the setup under test) or NOT REPRODUCED; SKIPPED when it cannot run here.

examples:
  loradoctor repro list
  loradoctor repro show fragmentation
  loradoctor repro run bf16 flash-attn --dtype bf16
  loradoctor explain crash.log --format json > explain.json && loradoctor repro run --from explain.json
"""

RUN_HELP = """Run repros in child processes of this Python.

examples:
  loradoctor repro run bf16
  loradoctor repro run flash-attn sdpa-backends --dtype fp16 --head-dim 64
  loradoctor repro run gc-require-grad --opt use_reentrant=true --opt input_require_grads=false
  loradoctor repro run --all --format json

exit codes: 0 every repro passed, did not reproduce its problem, or was skipped; 1 a check failed,
a problem was confirmed, or a repro errored; 2 bad usage.
"""

# --dtype values each repro accepts (the shorthand goes only to repros that take a dtype)
DTYPES = {"flash-attn": ("bf16", "fp16"), "sdpa-backends": ("bf16", "fp16", "fp32")}


def build_parser(name: str = "repro"):
    from loradoctor.cli._args import add_subcommands, format_option, new_parser, sub_parser

    p = new_parser(name, REPRO_HELP)
    subs = add_subcommands(p)
    lst = sub_parser(subs, "list", "List the repros: id, whether it needs a GPU, what it checks.", lambda o: list_cmd(**o))
    format_option(lst, ("text", "json"))
    show = sub_parser(subs, "show", "Show what a repro does, how its verdict is decided, and how to run its script alone.",
                      lambda o: show_cmd(**o))
    show.add_argument("repro_id", metavar="ID", help="a repro id (loradoctor repro list)")
    show.add_argument("--source", action="store_true", help="print the whole script (to run or paste it elsewhere)")
    run = sub_parser(subs, "run", RUN_HELP, lambda o: run_cmd(**o))
    run.add_argument("ids", nargs="*", metavar="ID", help="repro ids (loradoctor repro list)")
    run.add_argument("--all", dest="run_all", action="store_true", help="run every repro (not with ids or --from)")
    run.add_argument("--from", dest="from_file", metavar="EXPLAIN.json",
                     help="run the repros named by `loradoctor explain --format json` (- for stdin)")
    format_option(run, ("text", "json"))
    run.add_argument("--timeout", dest="timeout_s", type=float, default=180.0, metavar="S",
                     help="seconds per repro before it counts as hung (default 180)")
    run.add_argument("--dtype", help="bf16 | fp16 for flash-attn; bf16 | fp16 | fp32 for sdpa-backends")
    run.add_argument("--head-dim", type=int, help="your model's head dim (flash-attn, sdpa-backends)")
    run.add_argument("--opt", dest="opts", action="append", default=[], metavar="KEY=VALUE",
                     help="a repro option (see loradoctor repro show ID); repeatable")
    run.add_argument("-v", "--verbose", action="store_true", help="all evidence lines and the numbers")
    return p


def list_cmd(fmt: str = "text") -> int:
    from loradoctor.cli._args import check_format
    from loradoctor.render.output import write_report
    from loradoctor.render.repro_view import list_document, list_text
    from loradoctor.repro.catalog import REPROS

    if check_format(fmt, ("text", "json")) == "json":
        from loradoctor.render.json import dumps

        write_report(dumps(list_document(REPROS.values())))
    else:
        write_report(list_text(REPROS.values()))
    return 0


def run_alone_command(script: Path) -> str:
    """The shell line that runs a repro script by itself with its default options (pastes as printed)."""
    import shlex

    return f"{shlex.quote(sys.executable)} {shlex.quote(str(script))}"


def show_cmd(repro_id: str, source: bool = False) -> int:
    import ast

    from loradoctor.render.output import write_report
    from loradoctor.repro.catalog import get_spec

    spec = get_spec(repro_id)
    text = spec.script.read_text(encoding="utf-8")
    if source:
        write_report(text, end="")
        return 0
    lines = [(ast.get_docstring(ast.parse(text)) or spec.checks).rstrip(), "", f"script: {spec.script}",
             "run it alone (default options):", "  " + run_alone_command(spec.script)]
    if spec.options:
        lines += [f"options go after the script as one JSON object in single quotes, with the keys "
                  f"{', '.join(spec.options)}; `loradoctor repro run {spec.id} --opt KEY=VALUE` does the same"]
    write_report("\n".join(lines))
    return 0


def choose_ids(ids: list[str], run_all: bool, from_file: Optional[str]) -> list[str]:
    """The repros to run, in order, each once; UserError for a meaningless combination."""
    from loradoctor.repro.catalog import REPRO_IDS, get_spec

    if run_all and (ids or from_file is not None):
        raise UserError("--all runs every repro: give it alone, not with repro ids or --from")
    if run_all:
        return list(REPRO_IDS)
    chosen: list[str] = []
    for repro_id in ids:
        get_spec(repro_id)  # unknown id -> UserError before anything runs
        if repro_id not in chosen:
            chosen.append(repro_id)
    if from_file is not None:
        chosen += [i for i in ids_from_explain(from_file) if i not in chosen]
    return chosen


def check_options(chosen: list[str], options: dict[str, Any], dtype: Optional[str]) -> None:
    """Refuse an option that none of the chosen repros takes, and a --dtype a chosen repro cannot run."""
    from loradoctor.repro.catalog import REPROS

    for key in options:
        takers = [i for i in chosen if key in REPROS[i].options]
        if not takers:
            known = sorted({k for i in chosen for k in REPROS[i].options})
            hint = f"they take: {', '.join(known)}" if known else "they take no options"
            raise UserError(f"--opt {key}: none of {', '.join(chosen)} takes it ({hint})")
    if dtype is not None:
        takers = [i for i in chosen if i in DTYPES]
        if not takers:
            raise UserError(f"--dtype: none of {', '.join(chosen)} takes a dtype (flash-attn and sdpa-backends do)")
        for i in takers:
            if dtype not in DTYPES[i]:
                raise UserError(f"--dtype {dtype!r}: {i} runs {' or '.join(DTYPES[i])}")


def run_cmd(ids: list[str], run_all: bool = False, from_file: Optional[str] = None, fmt: str = "text",
            timeout_s: float = 180.0, dtype: Optional[str] = None, head_dim: Optional[int] = None,
            opts: list[str] = (), verbose: bool = False) -> int:
    """Run repros in child processes of this Python; the exit code of the run (loradoctor.repro.result)."""
    from loradoctor.cli._args import check_format
    from loradoctor.render.output import write_report
    from loradoctor.render.repro_view import result_lines, summary_lines
    from loradoctor.render.text import Painter
    from loradoctor.repro.catalog import REPROS
    from loradoctor.repro.result import exit_code, run_document
    from loradoctor.repro.runner import run_repro

    fmt = check_format(fmt, ("text", "json"))
    if not timeout_s > 0:
        raise UserError("--timeout must be a positive number of seconds")
    if head_dim is not None and head_dim < 1:
        raise UserError("--head-dim must be a positive whole number")
    chosen = choose_ids(list(ids), run_all, from_file)
    if not chosen:
        if from_file is not None:
            print("loradoctor: no finding in that explain document names a repro; nothing to run", file=sys.stderr)
            return 0
        raise UserError("name repro ids, or use --all or --from explain.json (loradoctor repro list shows the ids)")
    options: dict[str, Any] = dict(parse_opt(o) for o in opts)
    check_options(chosen, options, dtype)
    if head_dim is not None:
        if not any("head_dim" in REPROS[i].options for i in chosen):
            raise UserError(f"--head-dim: none of {', '.join(chosen)} takes it (flash-attn and sdpa-backends do)")
        options["head_dim"] = head_dim
    if dtype is not None:
        options["dtype"] = dtype

    painter = Painter.for_stdout()
    show_progress = sys.stderr.isatty()
    results = []
    for n, repro_id in enumerate(chosen, 1):
        if show_progress:
            print(f"[{n}/{len(chosen)}] running {repro_id} (up to {timeout_s:g} s) ...", file=sys.stderr, flush=True)
        result = run_repro(repro_id, timeout_s=timeout_s, options=options)
        results.append(result)
        if fmt == "text" and result.status != "SKIP":  # skips are said once, grouped, at the end
            write_report("\n".join(result_lines(painter, result, REPROS[repro_id].kind, verbose=verbose)))
    if fmt == "json":
        from loradoctor.render.json import dumps

        write_report(dumps(run_document(results)))
    else:
        write_report("\n".join(summary_lines(painter, results, {i: REPROS[i].kind for i in chosen}, verbose=verbose)))
    return exit_code(results)
