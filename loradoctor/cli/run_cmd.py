"""`loradoctor run -- CMD ...`: run a training command under watch (loradoctor/bedside/runner.py)."""

from __future__ import annotations

from typing import Any

from loradoctor.errors import UserError

RUN_HELP = """Run a training command under watch: its output passes through unchanged and is saved to
DIR/run.log; GPU memory (this run's and other processes'), utilisation, clocks, host RSS of the
whole process tree, /dev/shm and open files are sampled into DIR/timeline.jsonl as the run goes.
If the command fails, the log and the timeline are diagnosed together (DIR/report.md, DIR/run.svg),
and one summary line is printed at the end.

The command runs in its own process group; Ctrl-C and SIGTERM are passed on to it (a third Ctrl-C
kills it). The exit code is the command's own (128 + N if signal N ended it), so a launch script
can use `loradoctor run` where it used the command.

Examples:
  loradoctor run -- python train.py --config train.yaml
  loradoctor run --out runs/llama-qlora -- accelerate launch train.py
  loradoctor run --interval 5s --no-explain -- torchrun --nproc-per-node 2 train.py
  loradoctor explain runs/llama-qlora/run.log --timeline runs/llama-qlora   (redo the diagnosis elsewhere)

Exit codes: the command's own; 2 when loradoctor could not start it (bad usage, command not found)."""


def parse_interval(text: str) -> float:
    t = text.strip().lower()
    scale = 1.0
    for suffix, mult in (("ms", 0.001), ("s", 1.0), ("m", 60.0)):
        if t.endswith(suffix):
            t, scale = t[: -len(suffix)], mult
            break
    try:
        value = float(t) * scale
    except ValueError:
        value = -1.0
    if not (0.1 <= value <= 3600):
        raise UserError(f"--interval {text!r}: give a time between 100ms and 60m, e.g. 1s, 500ms, 2m")
    return value


def build_parser(name: str = "run"):
    from loradoctor.cli._args import new_parser

    p = new_parser(name, RUN_HELP, func=body)
    p.add_argument("--out", default="loradoctor-run", metavar="DIR",
                   help="folder for run.log, timeline.jsonl, report.md, run.svg (default: ./loradoctor-run)")
    p.add_argument("--interval", default="1s", metavar="TIME", help="sampling interval (default 1s)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--explain", dest="explain", action="store_const", const="always",
                   help="diagnose even when the command succeeds (slow-training findings)")
    g.add_argument("--no-explain", dest="explain", action="store_const", const="never",
                   help="never diagnose; only record")
    p.add_argument("cmd", nargs="*", metavar="-- CMD", help="the command to run, after --")
    return p


def body(opts: dict[str, Any]) -> int:
    from loradoctor.bedside.runner import run

    cmd = list(opts.get("cmd") or [])
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise UserError("run: no command given; write it after `--`, e.g. loradoctor run -- python train.py")
    interval = parse_interval(opts.get("interval") or "1s")
    from loradoctor.cli import startup_done

    startup_done()  # hours of watching ahead: the collector's usual thresholds
    return run(cmd, opts.get("out") or "loradoctor-run", interval, explain=opts.get("explain") or "on-failure").exit_code

