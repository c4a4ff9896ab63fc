"""`loradoctor estimate`, `loradoctor preflight` and `loradoctor measure`: one option signature for all three.

The options describing a run are defined once (RUN_OPTIONS) and attached to each command's signature,
so `measure` (issue 5, loradoctor.repro.measure) takes exactly what `estimate` takes.
"""

from __future__ import annotations

import argparse
import inspect
import os
from pathlib import Path
from typing import Any, Callable, Optional

from loradoctor.cli._args import new_parser
from loradoctor.errors import UserError
from loradoctor.render.output import write_report


# The options that describe a run, defined once for estimate, preflight and measure:
# (dest, flags, argparse keyword arguments). None defaults mean "not given": config files and defaults fill in.
RUN_OPTIONS: list[tuple[str, tuple[str, ...], dict[str, Any]]] = [
    ("model", ("--model", "-m"), dict(metavar="ID|PATH", help="model folder, config.json, an id in the local HF cache, or a preset (e.g. meta-llama/Llama-3.1-8B)")),
    ("config", ("--config", "-c"), dict(metavar="FILE|DIR", action="append", type=Path, help="axolotl / LLaMA-Factory YAML, TrainingArguments JSON, adapter_config.json, or a folder (repeatable); options on the command line win")),
    ("method", ("--method",), dict(help="full | lora | qlora (default lora)")),
    ("quant", ("--quant",), dict(help="none | 8bit | nf4 | fp4 (qlora implies nf4)")),
    ("double_quant", ("--double-quant",), dict(action=argparse.BooleanOptionalAction, help="bitsandbytes double quantization of the 4-bit scales")),
    ("rank", ("--rank", "-r"), dict(type=int, help="LoRA rank (default 8, as PEFT's LoraConfig)")),
    ("alpha", ("--alpha",), dict(type=int, help="LoRA alpha (default 8; does not change memory)")),
    ("dropout", ("--dropout",), dict(type=float, help="LoRA dropout (default 0.0; > 0 keeps a mask and a copy of the input per target)")),
    ("targets", ("--targets",), dict(metavar="LIST", help="target modules, comma-separated, or all-linear (default q_proj,v_proj)")),
    ("modules_to_save", ("--modules-to-save",), dict(metavar="LIST", help="fully trained modules, e.g. embed_tokens,lm_head")),
    ("batch", ("--batch", "-b"), dict(type=int, help="per-device micro-batch size (default 1)")),
    ("seq_len", ("--seq-len", "-s"), dict(type=int, help="longest sequence in a batch, tokens (default 2048)")),
    ("grad_accum", ("--grad-accum",), dict(type=int, help="gradient accumulation steps (does not change the peak)")),
    ("gradient_checkpointing", ("--gradient-checkpointing",), dict(action=argparse.BooleanOptionalAction, help="activation checkpointing (default off, as in TrainingArguments)")),
    ("attn", ("--attn",), dict(help="eager | sdpa | flash_attention_2 (default sdpa)")),
    ("optim", ("--optim",), dict(help="adamw_torch, adamw_torch_fused, adamw_8bit, paged_adamw_8bit, paged_adamw_32bit, adafactor, sgd")),
    ("precision", ("--precision",), dict(help="bf16 | fp16 (mixed; PEFT keeps adapters fp32) | fp32 | bf16-true (everything bf16)")),
    ("framework", ("--framework",), dict(help="hf (transformers+peft, default) | litgpt | torchtune")),
]
RUN_OPTION_NAMES = tuple(name for name, _, _ in RUN_OPTIONS)
FORMAT_OPTION = ("fmt", ("--format",), dict(default="text", help="text or json"))


def build_run_parser(prog: str, description: str, extra: list[tuple[str, tuple[str, ...], dict[str, Any]]],
                     func: Callable[..., int]) -> argparse.ArgumentParser:
    """The parser for one of the three commands: RUN_OPTIONS + the command's own options."""
    parser = new_parser(prog, description, func=lambda opts: func(**opts))
    for dest, flags, kw in RUN_OPTIONS + extra:
        parser.add_argument(*flags, dest=dest, **kw)
    return parser


def resolve_from_options(kwargs: dict[str, Any]):
    """(EstimateInputs, provenance) from the parsed options. Public for measure and tests."""
    from loradoctor.estimate.inputs import resolve_inputs

    cli = {k: kwargs.get(k) for k in RUN_OPTION_NAMES if k != "config"}
    return resolve_inputs(cli, kwargs.get("config") or [])


def _check_format(fmt: str) -> None:
    if fmt not in ("text", "json"):
        raise UserError(f"--format must be text or json, not {fmt!r}")


# --- estimate ------------------------------------------------------------------------------------

def _estimate(**kw: Any) -> int:
    """Predict peak GPU memory of a LoRA / QLoRA / full fine-tuning run: a breakdown per component, a band,
    a verdict against a card (--gpu / --vram) and what to change first. Exit 0; 1 when it does not fit
    the given card; 2 bad usage."""
    from loradoctor.estimate.fit import fit as fit_run
    from loradoctor.estimate.inputs import assumed, gpu_budget
    from loradoctor.estimate.memory import estimate

    fmt = kw["fmt"]
    _check_format(fmt)
    inputs, provenance = resolve_from_options(kw)
    est = estimate(inputs)
    gpu = gpu_budget(kw.get("gpu"), kw.get("vram"))
    result = fit_run(est.inputs, est, gpu, what_if=kw.get("what_if", True)) if gpu is not None else None
    if fmt == "json":
        from loradoctor.render.estimate_view import estimate_document
        from loradoctor.render.json import dumps

        write_report(dumps(estimate_document(est, result, provenance)))
    else:
        from loradoctor.render.estimate_view import print_estimate
        from loradoctor.render.terminal import captured

        write_report(captured(print_estimate, est, result, provenance, assumed(provenance, est.inputs.method)))
    return 1 if result is not None and result.verdict == "does not fit" else 0


ESTIMATE_EXTRA: list[tuple[str, tuple[str, ...], dict[str, Any]]] = [
    ("gpu", ("--gpu",), dict(metavar="NAME", help="judge against this card (e.g. 'RTX 4090', A100-80GB, T4; `loradoctor gpus` lists them), or 'local[:INDEX]' for the free memory of a GPU here now")),
    ("vram", ("--vram",), dict(metavar="SIZE", help="judge against this much memory, e.g. 24GB or 22.5GiB")),
    ("what_if", ("--what-if",), dict(action=argparse.BooleanOptionalAction, default=True, help="search the largest batch / longest sequence and rank the fixes (default on)")),
    FORMAT_OPTION,
]


# --- preflight -----------------------------------------------------------------------------------

def _requested_features(inputs: Any) -> list[str]:
    feats = []
    if inputs.precision.startswith("bf16"):
        feats.append("bf16")
    if inputs.precision.startswith("fp16"):
        feats.append("fp16")
    if inputs.attn == "flash_attention_2":
        feats.append("flash-attn")
    if inputs.quant != "none" or "8bit" in inputs.optim or "paged" in inputs.optim:
        feats.append("bnb")
    return feats


def _gpu_index(explicit: Optional[int]) -> "int | str":
    """The GPU the run will use: --gpu-index, else the first of CUDA_VISIBLE_DEVICES (an NVML index or a
    GPU UUID), else 0."""
    if explicit is not None:
        return explicit
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    if first.isdigit():
        return int(first)
    if first.startswith(("GPU-", "MIG-")):
        return first
    return 0


def run_preflight(inputs: Any, snapshot: dict[str, Any], gpu_index: "int | str", gpu_override: Any = None) -> dict[str, Any]:
    """Pure core of preflight: env findings + the estimate against the free memory of the GPU in the snapshot.
    Returns {go, reason, first_fix, findings, estimate, fit}."""
    from loradoctor.env.checks import run_checks
    from loradoctor.estimate.fit import fit as fit_run, gpu_from_snapshot
    from loradoctor.estimate.memory import estimate
    from loradoctor.findings import assign_ranks

    snap = dict(snapshot)
    feats = _requested_features(inputs)
    if feats:
        prev = snap.get("requested") if isinstance(snap.get("requested"), dict) else {}
        snap["requested"] = {"features": sorted(set(list(prev.get("features") or []) + feats)), "source": "preflight (run config)"}
    findings = assign_ranks(run_checks(snap))
    est = estimate(inputs)
    gpu = gpu_override or gpu_from_snapshot(snap, gpu_index)
    result = fit_run(est.inputs, est, gpu, what_if=True) if gpu is not None else None
    errors = [f for f in findings if f.severity == "error"]
    go, reason, first_fix = True, "", ""
    if errors:
        top = errors[0]
        go = False
        reason = f"{top.title} ({top.cause})"
        if top.fixes:
            first_fix = top.fixes[0].command or top.fixes[0].text
    elif result is None:
        go = False
        reason = "no GPU visible to judge the memory against (nvidia section missing or failed)"
        first_fix = "loradoctor env"
    elif result.verdict == "does not fit":
        go = False
        reason = (f"needs about {est.device_used_bytes / 2**30:.2f} GiB, {result.gpu.name} has "
                  f"{result.gpu.memory_bytes / 2**30:.2f} GiB: it will run out of memory")
        fitting = [c for c in result.advice if c.fits]
        pick = fitting[0] if fitting else (max(result.advice, key=lambda c: c.saves_bytes) if result.advice else None)
        if pick is not None:
            first_fix = f"{pick.text} ({pick.option}), saves {pick.saves_bytes / 2**30:.2f} GiB"
    if go:
        if result is not None and result.verdict == "tight":
            reason = (f"the run should start; memory is tight ({result.headroom_bytes / 2**30:.2f} GiB headroom "
                      f"on {result.gpu.name}, the band reaches {est.band[1] / 2**30:.2f} GiB)")
        else:
            room = f"{result.headroom_bytes / 2**30:.2f} GiB headroom on {result.gpu.name}" if result else ""
            reason = f"the run can start; {room}"
    return {"go": go, "reason": reason, "first_fix": first_fix, "findings": findings, "estimate": est, "fit": result}


def _preflight(**kw: Any) -> int:
    """Quick environment checks + the memory estimate against the GPU this run will use (its free memory now,
    other processes included). One screen. Exit 0 the run can start, 1 it will fail (with the reason and
    the first fix), 2 bad usage. Put it before `python train.py`."""
    fmt = kw["fmt"]
    _check_format(fmt)
    inputs, provenance = resolve_from_options(kw)
    snap_path = kw.get("snapshot")
    if snap_path:
        from loradoctor.env.snapshot import load_snapshot

        snapshot = load_snapshot(str(snap_path))
    else:
        try:
            from loradoctor.env import collect_snapshot
        except ImportError as exc:  # pragma: no cover - the env package is part of loradoctor
            raise UserError(f"environment probes unavailable: {exc}") from None
        snapshot = collect_snapshot(quick=True)
    from loradoctor.estimate.inputs import gpu_budget

    override = gpu_budget(kw.get("gpu"), kw.get("vram"))
    out = run_preflight(inputs, snapshot, _gpu_index(kw.get("gpu_index")), override)
    if fmt == "json":
        from loradoctor.render.estimate_view import preflight_document
        from loradoctor.render.json import dumps

        write_report(dumps(preflight_document(out["estimate"], out["fit"], provenance, out["findings"], out["go"],
                                              out["reason"], out["first_fix"])))
    else:
        from loradoctor.render.estimate_view import print_preflight
        from loradoctor.render.terminal import captured

        write_report(captured(print_preflight, out["estimate"], out["fit"], out["findings"], out["go"], out["reason"],
                              out["first_fix"]))
    return 0 if out["go"] else 1


PREFLIGHT_EXTRA: list[tuple[str, tuple[str, ...], dict[str, Any]]] = [
    ("gpu_index", ("--gpu-index",), dict(type=int, help="which GPU the run uses (default: first of CUDA_VISIBLE_DEVICES, else 0)")),
    ("gpu", ("--gpu",), dict(metavar="NAME", help="judge against this card's full memory instead of the free memory now")),
    ("vram", ("--vram",), dict(metavar="SIZE", help="judge against this much memory instead of the free memory now")),
    ("snapshot", ("--snapshot",), dict(metavar="FILE", help=argparse.SUPPRESS)),  # a saved env snapshot (tests, remote machines)
    FORMAT_OPTION,
]


# --- measure (issue 5: loradoctor.repro.measure) -------------------------------------------------

def _measure(**kw: Any) -> int:
    """Build the model from its config with random weights on this GPU and measure a few real training steps
    (peak allocated / reserved / device), next to the estimate. Needs an NVIDIA GPU and a CUDA torch."""
    fmt = kw["fmt"]
    _check_format(fmt)
    steps, timeout_s = kw["steps"], kw["timeout"]
    if steps < 1:
        raise UserError("--steps must be at least 1")
    if not 0 < timeout_s <= 24 * 3600:
        raise UserError("--timeout must be between 0 and 86400 seconds")
    inputs, _ = resolve_from_options(kw)
    import sys

    from loradoctor.repro.measure import exit_code_for, run_measure

    def progress(message: str) -> None:
        if fmt == "text" or sys.stderr.isatty():
            print(f"  {message}", file=sys.stderr, flush=True)

    report = run_measure(inputs, steps, timeout_s, on_progress=progress)
    if fmt == "json":
        from loradoctor.render.json import dumps

        write_report(dumps(report))
    elif report["status"] == "skipped":
        print(f"loradoctor: error: measure needs a CUDA GPU and transformers + peft: {report['reason']}", file=sys.stderr)
    else:
        from loradoctor.render.measure_view import measure_text

        write_report(measure_text(report))
    return exit_code_for(report)


MEASURE_EXTRA: list[tuple[str, tuple[str, ...], dict[str, Any]]] = [
    ("steps", ("--steps",), dict(type=int, default=5, help="training steps to measure (the first is warm-up; default 5)")),
    ("timeout", ("--timeout",), dict(type=float, default=600.0, metavar="SECONDS", help="give up after this long (default 600)")),
    FORMAT_OPTION,
]


def _doc(func: Callable[..., Any]) -> str:
    return inspect.cleandoc(func.__doc__ or "")


COMMANDS = {"estimate": (_estimate, ESTIMATE_EXTRA), "preflight": (_preflight, PREFLIGHT_EXTRA),
            "measure": (_measure, MEASURE_EXTRA)}


def build_parser(name: str) -> argparse.ArgumentParser:
    """The parser of `loradoctor estimate`, `preflight` or `measure` (one module, one option signature)."""
    func, extra = COMMANDS[name]
    return build_run_parser(name, _doc(func), extra, func)
