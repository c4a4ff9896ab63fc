"""`loradoctor estimate`, `loradoctor preflight` and `loradoctor measure`: one option signature for all three.

The options describing a run are defined once (RUN_OPTIONS) and attached to each command's signature,
so `measure` (issue 5, loradoctor.repro.measure) takes exactly what `estimate` takes.
"""

from __future__ import annotations

import argparse
import inspect
from pathlib import Path
from typing import Any, Callable

from loradoctor.cli._args import new_parser
from loradoctor.errors import UserError
from loradoctor.render.output import write_report


# The options that describe a run, defined once for estimate, preflight and measure:
# (dest, flags, argparse keyword arguments). None defaults mean "not given": config files and defaults fill in.
RUN_OPTIONS: list[tuple[str, tuple[str, ...], dict[str, Any]]] = [
    ("model", ("--model", "-m"), dict(metavar="ID|PATH", help="model folder, config.json, an id in the local HF cache, or a preset (e.g. meta-llama/Llama-3.1-8B)")),
    ("config", ("--config", "-c"), dict(metavar="FILE|DIR", action="append", type=Path, help="axolotl / LLaMA-Factory YAML, TrainingArguments JSON, adapter_config.json, or a folder (repeatable); options on the command line win")),
    ("method", ("--method",), dict(help="full | lora | qlora (default lora); lora on an nf4/fp4 base is estimated as qlora, and says so")),
    ("quant", ("--quant",), dict(help="none | 8bit | nf4 | fp4 (qlora implies nf4; --method qlora --quant none is refused)")),
    ("double_quant", ("--double-quant",), dict(action=argparse.BooleanOptionalAction, help="bitsandbytes double quantization of the 4-bit scales")),
    ("rank", ("--rank", "-r"), dict(type=int, help="LoRA rank (default 8, as PEFT's LoraConfig)")),
    ("alpha", ("--alpha",), dict(type=int, help="LoRA alpha (default 8; does not change memory)")),
    ("dropout", ("--dropout",), dict(type=float, help="LoRA dropout (default 0.0; > 0 keeps a mask and a copy of the input per target)")),
    ("targets", ("--targets",), dict(metavar="LIST", help="target modules, comma-separated, or all-linear (default q_proj,v_proj)")),
    ("modules_to_save", ("--modules-to-save",), dict(metavar="LIST", help="fully trained modules, e.g. embed_tokens,lm_head")),
    ("batch", ("--batch", "-b"), dict(type=int, help="per-device micro-batch size (default 1)")),
    ("seq_len", ("--seq-len", "-s"), dict(type=int, help="longest sequence in a batch, tokens (default 2048)")),
    ("grad_accum", ("--grad-accum",), dict(type=int, help="gradient accumulation steps (does not change the peak)")),
    ("gradient_checkpointing", ("--gradient-checkpointing",), dict(action=argparse.BooleanOptionalAction, help="activation checkpointing (default: on for QLoRA / a quantized base with --framework hf, as PEFT's prepare_model_for_kbit_training turns it on; off otherwise, as TrainingArguments); the output says which")),
    ("attn", ("--attn",), dict(help="eager | sdpa | sdpa_math | flash_attention_2 | xformers (default sdpa)")),
    ("optim", ("--optim",), dict(help="adamw_torch, adamw_torch_fused, adamw_8bit, paged_adamw_8bit, paged_adamw_32bit, adafactor, sgd")),
    ("precision", ("--precision",), dict(help="bf16 | fp16 (mixed; PEFT keeps adapters fp32) | bf16-no-autocast | fp16-no-autocast (half base, fp32 adapters, plain loop) | fp32 | bf16-true (everything bf16)")),
    ("framework", ("--framework",), dict(help="hf (transformers+peft, default) | litgpt | torchtune | unsloth")),
    ("loss", ("--loss",), dict(help="standard | cce | liger-flce | chunked[:N] | unsloth | fused-ce (default: the framework's own)")),
    ("liger_kernels", ("--liger",), dict(action=argparse.BooleanOptionalAction, help="Liger's RMSNorm / SwiGLU / RoPE kernels in the HF model")),
    ("offload_checkpoints", ("--offload-checkpoints",), dict(action=argparse.BooleanOptionalAction, help="checkpointed hidden states in host memory (Unsloth's default with checkpointing)")),
    ("peft", ("--peft",), dict(help="lora (default) | rslora | dora | ia3 | adalora")),
    ("ia3_feedforward", ("--ia3-feedforward",), dict(metavar="LIST", help="IA3's feed-forward modules (IA3Config.feedforward_modules; default down_proj): their vector scales the input")),
    ("keep_logits", ("--keep-logits",), dict(action=argparse.BooleanOptionalAction, help="the training loop keeps the model output through backward (outputs = model(...); outputs.loss.backward()): its half logits stay alive (the HF Trainer frees them)")),
    ("gpus", ("--gpus",), dict(type=int, help="GPUs the run uses (default 1); the estimate is per GPU")),
    ("strategy", ("--strategy",), dict(help="ddp | fsdp | fsdp-hybrid | zero2 | zero3 (default ddp with --gpus > 1)")),
    ("offload", ("--offload",), dict(help="none | optimizer | params: ZeRO / FSDP CPU offload")),
    ("compute_dtype", ("--compute-dtype",), dict(help="bitsandbytes bnb_4bit_compute_dtype: bf16 | fp16 | fp32 (default: the precision's half type)")),
    ("vocab", ("--vocab",), dict(type=int, help="vocabulary size after resize_token_embeddings (added tokens)")),
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
    a verdict against a card (--gpu / --vram: its memory, and for a named card its bf16 / FlashAttention 2 /
    fp8 support) and what to change first. Exit 0; 1 when it does not fit the given card or the card
    cannot run it as configured; 2 bad usage."""
    from loradoctor.estimate.fit import fit as fit_run
    from loradoctor.estimate.inputs import assumed, gpu_budget
    from loradoctor.estimate.memory import estimate

    from loradoctor.estimate.cards import unsupported

    fmt = kw["fmt"]
    _check_format(fmt)
    inputs, provenance = resolve_from_options(kw)
    est = estimate(inputs)
    gpu = gpu_budget(kw.get("gpu"), kw.get("vram"))
    result = fit_run(est.inputs, est, gpu, what_if=kw.get("what_if", True)) if gpu is not None else None
    problems = unsupported(est.inputs, gpu) if gpu is not None else []
    if fmt == "json":
        from loradoctor.render.estimate_view import estimate_document
        from loradoctor.render.json import dumps

        write_report(dumps(estimate_document(est, result, provenance, problems)))
    else:
        from loradoctor.render.estimate_view import print_estimate
        from loradoctor.render.terminal import captured

        write_report(captured(print_estimate, est, result, provenance, assumed(provenance, est.inputs.method), problems))
    return 1 if result is not None and (result.verdict == "does not fit" or problems) else 0


ESTIMATE_EXTRA: list[tuple[str, tuple[str, ...], dict[str, Any]]] = [
    ("gpu", ("--gpu",), dict(metavar="NAME", help="judge against this card, its memory and features (e.g. 'RTX 4090', 'A100 80GB', T4; `loradoctor gpus` lists them); a name that is several cards (A100, V100, A6000, 4060 Ti) asks for the variant. 'local[:INDEX]': the free memory of a GPU here now")),
    ("vram", ("--vram",), dict(metavar="SIZE", help="judge against this much memory; a unit is required: 24GB and 24GiB both mean 24 x 2^30 bytes, as cards are labelled (a '24 GB' RTX 4090 has 24 GiB)")),
    ("what_if", ("--what-if",), dict(action=argparse.BooleanOptionalAction, default=True, help="search the largest batch / longest sequence and rank the fixes (default on)")),
    FORMAT_OPTION,
]


# --- preflight -----------------------------------------------------------------------------------

def _preflight(**kw: Any) -> int:
    """Quick environment checks + the memory estimate against the GPU this run will use (its free memory now,
    other processes included) + the card's features (bf16, FlashAttention 2). One screen. Exit 0 the run can
    start, 1 it will fail or cannot be judged here (no usable GPU: pass --gpu NAME to judge a card instead;
    the verdict then says so), 2 bad usage. Put it before `python train.py`."""
    from loradoctor.estimate.preflight import gpu_index_for_run, run_preflight

    fmt = kw["fmt"]
    _check_format(fmt)
    if kw.get("gpu_index") is not None and (kw.get("gpu") or kw.get("vram")):
        raise UserError("--gpu-index picks a GPU on this machine; --gpu / --vram judge another card: pass one of them")
    if kw.get("gpu") and kw["gpu"].strip().lower().split(":")[0] == "local":
        raise UserError("preflight already judges the local GPU: drop --gpu local (use --gpu-index N to pick one)")
    gpu_index = gpu_index_for_run(kw.get("gpu_index"))
    inputs, provenance = resolve_from_options(kw)
    from loradoctor.estimate.inputs import gpu_budget

    override = gpu_budget(kw.get("gpu"), kw.get("vram"))
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
    out = run_preflight(inputs, snapshot, gpu_index, override, index_given=kw.get("gpu_index") is not None,
                        config_paths=kw.get("config") or [], strict=bool(kw.get("strict")))
    if fmt == "json":
        from loradoctor.render.estimate_view import preflight_document
        from loradoctor.render.json import dumps

        write_report(dumps(preflight_document(out, provenance)))
    else:
        from loradoctor.render.estimate_view import print_preflight
        from loradoctor.render.terminal import captured

        write_report(captured(print_preflight, out, provenance))
    return 0 if out.go else 1


PREFLIGHT_EXTRA: list[tuple[str, tuple[str, ...], dict[str, Any]]] = [
    ("gpu_index", ("--gpu-index",), dict(type=int, metavar="N", help="which GPU here the run uses, as nvidia-smi numbers them (default: first of CUDA_VISIBLE_DEVICES, else 0)")),
    ("gpu", ("--gpu",), dict(metavar="NAME", help="judge against this card (its full memory and its features) instead of this machine's GPU; the verdict says so. Works on a machine without a GPU")),
    ("vram", ("--vram",), dict(metavar="SIZE", help="judge against this much memory instead of this machine's GPU; a unit is required: 24GB and 24GiB both mean 24 x 2^30 bytes, as cards are labelled")),
    ("snapshot", ("--snapshot",), dict(metavar="FILE", help=argparse.SUPPRESS)),  # a saved env snapshot (tests, remote machines)
    ("strict", ("--strict",), dict(action="store_true", help="NO GO on a config warning too (loradoctor lint's findings; errors always stop)")),
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
