"""`loradoctor env`: check this machine (or a pasted report of another one) and name the fixes."""

from __future__ import annotations

from typing import List, Optional

from loradoctor.errors import UserError

WANT_ALIASES = {"bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16", "float16": "fp16", "flash-attn": "flash-attn",
                "flash_attn": "flash-attn", "flash-attention": "flash-attn", "fa2": "flash-attn", "bnb": "bnb",
                "bitsandbytes": "bnb", "qlora": "bnb", "4bit": "bnb", "8bit": "bnb"}


def parse_want(text: Optional[str]) -> list[str]:
    """'bf16,flash-attn' -> ['bf16', 'flash-attn']; UserError on an unknown feature."""
    if not text:
        return []
    out = []
    for token in (t.strip().lower() for t in text.split(",")):
        if not token:
            continue
        if token not in WANT_ALIASES:
            raise UserError(f"--want: unknown feature {token!r}; use bf16, fp16, flash-attn or bnb (comma-separated)")
        out.append(WANT_ALIASES[token])
    return sorted(set(out))


ENV_HELP = """Check the machine: driver, CUDA, torch build, bf16 / flash-attn support, bitsandbytes, visible
GPUs, memory held by other processes, GPU health; each problem with its evidence and a fix to paste.

torch, bitsandbytes and flash-attn are probed in child processes of your interpreter (a crash or a
hang there becomes a finding). A healthy torch probe is remembered (~/.cache/loradoctor) until the
torch install, the Python packages, the driver, the relevant environment variables or the boot
change, or for a day; --fresh ignores it, --deep never uses it.

Examples:
  loradoctor env
  loradoctor env --want bf16,flash-attn --strict && python train.py
  loradoctor env --python ~/venvs/train/bin/python --format json > env.json
  loradoctor env --from pasted_collect_env.txt
  loradoctor env --format md >> issue.md

Exit codes: 0 healthy (warnings allowed), 1 an error finding (--strict: a warning too),
2 the doctor could not run or bad usage."""


def build_parser(name: str = "env"):
    """argparse for `loradoctor env`."""
    from loradoctor.cli._args import new_parser

    p = new_parser(name, ENV_HELP, func=lambda opts: run(**opts))
    p.add_argument("--deep", action="store_true", help="also run a tiny bf16/fp16 matmul on each GPU (seconds)")
    p.add_argument("--quick", action="store_true", help="skip the bitsandbytes and flash-attn probes; short torch timeout")
    p.add_argument("--fresh", action="store_true", help="re-run the torch / extension probes even if a remembered result is still valid")
    p.add_argument("--from", dest="from_file", metavar="FILE",
                   help="check another machine from a saved `env --format json`, `python -m torch.utils.collect_env` "
                        "text, or `nvidia-smi` / `nvidia-smi -q` text ('-' for stdin)")
    p.add_argument("--format", dest="fmt", default="text", metavar="FMT",
                   help="text (default), json, or md (Markdown for an issue; UUIDs, host and home paths redacted)")
    p.add_argument("--strict", action="store_true", help="exit 1 on warnings too")
    p.add_argument("--timeout", type=float, metavar="SECONDS",
                   help="per-probe timeout (default 60 s for the child probes, 10 s for the rest)")
    p.add_argument("--python", metavar="PATH", help="probe another interpreter (the one you train with) instead of loradoctor's own")
    p.add_argument("--want", metavar="LIST", help="features you will use, checked against this GPU: bf16, fp16, flash-attn, "
                                                    "bnb (comma-separated); ACCELERATE_MIXED_PRECISION is read too")
    p.add_argument("--gpu", metavar="NAME", help="also judge the --want features against this card (e.g. 'RTX 4090', T4; "
                                                 "compute capability from the card table)")
    p.add_argument("--check", action="append", metavar="NAME", help="run only this check (repeatable); see --list-checks")
    p.add_argument("--list-checks", action="store_true", help="list the checks and exit")
    p.add_argument("-v", "--verbose", action="store_true", help="show info findings too")
    return p


def run(deep: bool = False, quick: bool = False, fresh: bool = False, from_file: Optional[str] = None,
        fmt: str = "text", strict: bool = False, timeout: Optional[float] = None, python: Optional[str] = None,
        want: Optional[str] = None, check: Optional[List[str]] = None, list_checks: bool = False,
        verbose: bool = False, gpu: Optional[str] = None) -> int:
    """`loradoctor env` with parsed options; returns the exit code."""
    from loradoctor.env import checks as env_checks
    from loradoctor.render import env_view

    if list_checks:
        from loradoctor.render.output import write_report

        write_report("\n".join(env_view.checks_table(env_checks.CHECKS)))
        return 0
    if fmt not in ("text", "json", "md"):
        raise UserError(f"--format must be text, json or md, not {fmt!r}")
    if timeout is not None and not (0 < timeout <= 3600):
        raise UserError("--timeout must be between 0 and 3600 seconds")
    if quick and deep:
        raise UserError("--quick and --deep ask for opposite things (skip probes / add a GPU matmul): pass one")
    if from_file is not None:
        probing = [name for name, on in (("--deep", deep), ("--quick", quick), ("--fresh", fresh),
                                         ("--python", python), ("--timeout", timeout is not None)) if on]
        if probing:
            raise UserError(f"--from reads a saved report; {', '.join(probing)} probe this machine and do not apply to it")
    features = parse_want(want)
    if from_file is not None:
        from loradoctor.env.snapshot import load_snapshot

        snapshot = load_snapshot(from_file)
        if features:
            snapshot["requested"] = {"features": features, "source": "--want"}
    else:
        from loradoctor.env import collect_snapshot

        if python is not None:
            import os
            import shutil

            resolved = shutil.which(python) or python
            if not (os.path.isfile(resolved) and os.access(resolved, os.X_OK)):
                raise UserError(f"--python: {python} is not an executable interpreter")
            python = resolved
        snapshot = collect_snapshot(deep=deep, quick=quick, timeout_s=timeout, want=features, python=python,
                                    fresh=fresh)
    if gpu is not None:
        from loradoctor.estimate.fit import gpu_by_name

        card = gpu_by_name(gpu)
        snapshot.setdefault("requested", {"features": features, "source": "--want"})["gpu"] = {
            "name": card.name, "compute_capability": card.compute_capability, "source": "--gpu"}
    findings = env_checks.run_checks(snapshot, only=check or None, strict=strict)
    _render(snapshot, findings, fmt, verbose)
    from loradoctor.findings import exit_code

    return exit_code(findings, strict=strict)


def _render(snapshot: dict, findings: list, fmt: str, verbose: bool) -> None:
    from loradoctor.env.snapshot import REPORT_SCHEMA
    from loradoctor.render import env_view
    from loradoctor.render.output import write_report

    if fmt == "json":
        from loradoctor.render.json import dumps

        write_report(dumps(env_view.report_document(snapshot, findings, REPORT_SCHEMA)))
    elif fmt == "md":
        write_report(env_view.env_markdown(snapshot, findings), end="")
    else:
        from loradoctor.render.terminal import captured

        write_report(captured(env_view.print_env_report, snapshot, findings, verbose=verbose))
