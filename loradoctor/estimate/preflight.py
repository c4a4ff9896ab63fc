"""preflight's judgement: can this run start? Pure: an env snapshot and the run's inputs in, a verdict out.

GO needs all of: no env error, a GPU to judge against, the card's features (bf16, FlashAttention 2,
fp8) for what the run asks, and the memory. The GPU is the one this run will use here (its free memory
now), unless `--gpu NAME` / `--vram SIZE` name another card; then the verdict says what it was judged
against and that this machine was not. A machine with no usable GPU never gets GO on its own: there is
nothing to run on, so the verdict says why it cannot judge and what to do.
"""

from __future__ import annotations

import os
from loradoctor.record import field, record
from typing import Any, Optional

from loradoctor.errors import UserError

GIB = 1 << 30


def requested_features(inputs: Any) -> list[str]:
    """The env features this run needs, in `env --want` spelling (bf16, fp16, flash-attn, bnb)."""
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


def gpu_index_for_run(explicit: Optional[int], environ: Optional[dict[str, str]] = None) -> "int | str":
    """The GPU the run will use: --gpu-index, else the first of CUDA_VISIBLE_DEVICES (an NVML index or a
    GPU UUID), else 0."""
    if explicit is not None:
        if explicit < 0:
            raise UserError(f"--gpu-index {explicit}: must be 0 or more (the index nvidia-smi shows)")
        return explicit
    env = os.environ if environ is None else environ
    first = env.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    if first.isdigit():
        return int(first)
    if first.startswith(("GPU-", "MIG-")):
        return first
    return 0


def _listed_gpus(snapshot: dict[str, Any]) -> list[dict[str, Any]]:
    nvidia = snapshot.get("nvidia") if isinstance(snapshot.get("nvidia"), dict) else {}
    gpus = nvidia.get("gpus") if isinstance(nvidia, dict) else None
    return [g for g in gpus if isinstance(g, dict)] if isinstance(gpus, list) else []


def why_no_local_gpu(snapshot: dict[str, Any]) -> Optional[str]:
    """Why this machine cannot run the training on a GPU, in a sentence; None when it has one to judge."""
    nvidia = snapshot.get("nvidia") if isinstance(snapshot.get("nvidia"), dict) else None
    if not _listed_gpus(snapshot):
        detail = str(nvidia.get("error")) if isinstance(nvidia, dict) and nvidia.get("error") else "the driver lists no GPU"
        return f"no NVIDIA GPU is visible on this machine ({detail})"
    torch = snapshot.get("torch") if isinstance(snapshot.get("torch"), dict) else None
    if torch is not None and torch.get("installed") is False:
        return "torch is not installed in this Python, so nothing here can train on the GPU"
    return None


def article(name: str) -> str:
    """'an' before a card name read with a vowel sound (an H100, an RTX 4090, an 8GB card), else 'a'."""
    first = name.strip()[:1].upper()
    return "an" if first in "AEFHILMNORSX8" and first else "a"


@record
class PreflightResult:
    go: bool
    reason: str
    first_fix: str
    findings: list[Any]
    estimate: Any
    fit: Any  # Fit or None
    judged_against: str = ""  # '' = this machine's GPU, its free memory now
    unsupported: list[Any] = field(default_factory=list)  # cards.Unsupported
    notes: list[str] = field(default_factory=list)
    fix_option: str = ""  # the first fix as a command-line change, when it is one (for the config's spelling)
    lint: list[Any] = field(default_factory=list)  # the config's pitfalls (loradoctor.advise.lint)
    linted: bool = False  # a config was given and linted

    def __getitem__(self, key: str) -> Any:  # the dict shape callers and tests used
        return getattr(self, key)


def run_preflight(inputs: Any, snapshot: dict[str, Any], gpu_index: "int | str", gpu_override: Any = None,
                  index_given: bool = False, config_paths: Any = (), strict: bool = False) -> PreflightResult:
    """Env findings + the estimate against the GPU this run will use (or `gpu_override`, a card named by
    --gpu / --vram) + the card's features. `index_given`: --gpu-index was passed, so an index this
    machine does not have is refused instead of falling back to the first GPU."""
    from loradoctor.env.checks import run_checks
    from loradoctor.estimate.cards import unsupported
    from loradoctor.estimate.fit import fit as fit_run, gpu_from_snapshot
    from loradoctor.estimate.memory import estimate
    from loradoctor.findings import assign_ranks

    snap = dict(snapshot)
    feats = requested_features(inputs)
    if feats:
        prev = snap.get("requested") if isinstance(snap.get("requested"), dict) else {}
        snap["requested"] = {"features": sorted(set(list(prev.get("features") or []) + feats)), "source": "preflight (run config)"}
    listed = _listed_gpus(snap)
    if index_given and listed and isinstance(gpu_index, int) and not any(g.get("index") == gpu_index for g in listed):
        have = ", ".join(str(g.get("index")) for g in listed)
        raise UserError(f"--gpu-index {gpu_index}: this machine has GPU {have}")
    findings = assign_ranks(run_checks(snap))
    est = estimate(inputs)
    no_local = why_no_local_gpu(snap)
    local = None if no_local else gpu_from_snapshot(snap, gpu_index)
    if local is None and not no_local:
        no_local = "the free memory of the GPU is not in the snapshot"
    out = PreflightResult(go=True, reason="", first_fix="", findings=findings, estimate=est, fit=None)
    gpu = gpu_override or local
    if config_paths:
        from loradoctor.advise.lint import lint_configs

        out.lint = lint_configs(list(config_paths), gpu=gpu, local=gpu_override is None)
        out.linted = True
    if gpu_override is not None:
        size = f"{gpu_override.memory_bytes / GIB:.2f} GiB"
        what = f"{article(gpu_override.name)} {gpu_override.name} ({size}" + (", card table)" if gpu_override.source == "table" else ")")
        out.judged_against = (f"judged against {what}, not this machine" if no_local
                              else f"judged against {what}, not the free memory of this machine's {local.name}")
        if gpu_override.source == "vram":
            out.notes.append("--vram gives a size only: the card's bf16 / FlashAttention / fp8 support was not checked")
    result = fit_run(est.inputs, est, gpu, what_if=True) if gpu is not None else None
    out.fit = result
    out.unsupported = unsupported(est.inputs, gpu) if gpu is not None else []
    errors = [f for f in findings if f.severity == "error"]
    blocking = [f for f in out.lint if f.severity == "error" or (strict and f.severity == "warning")]
    if errors:
        top = errors[0]
        out.go = False
        out.reason = f"{top.title} ({top.cause})"
        if top.fixes:
            out.first_fix = top.fixes[0].command or top.fixes[0].text
    elif result is None:
        out.go = False
        out.reason = (f"cannot judge this run here: {no_local}. preflight checks the GPU the run will use; "
                      "without one there is nothing to run on or to measure free memory against")
        out.first_fix = ("run preflight on the machine that trains, or judge a card instead: "
                         "--gpu NAME (e.g. --gpu 'RTX 4090') or --vram 24GB")
    elif out.unsupported:
        out.go = False
        out.reason = "; ".join(u.text for u in out.unsupported)
        if result.verdict == "does not fit":
            out.reason += (f"; and it needs about {est.device_used_bytes / GIB:.2f} GiB, more than the "
                           f"{result.gpu.memory_bytes / GIB:.2f} GiB there")
        out.first_fix = out.fix_option = " ".join(u.option for u in out.unsupported)
    elif result.verdict == "does not fit":
        out.go = False
        out.reason = (f"needs about {est.device_used_bytes / GIB:.2f} GiB, {result.gpu.name} has "
                      f"{result.gpu.memory_bytes / GIB:.2f} GiB: it will run out of memory")
        fitting = [c for c in result.advice if c.fits]
        pick = fitting[0] if fitting else (max(result.advice, key=lambda c: c.saves_bytes) if result.advice else None)
        if pick is not None:
            out.first_fix = f"{pick.text} ({pick.option}), saves {pick.saves_bytes / GIB:.2f} GiB"
            out.fix_option = pick.option
    if out.go and blocking:  # the machine and the memory are fine; the config is not
        top = blocking[0]
        out.go = False
        where = top.evidence[0].where() if top.evidence else ""
        out.reason = f"the config: {top.title} ({top.rule}, {where})"
        if top.fixes:
            out.first_fix = top.fixes[0].command or top.fixes[0].text
    if out.go:
        if result.verdict == "tight":
            out.reason = (f"the run should start; memory is tight ({result.headroom_bytes / GIB:.2f} GiB headroom "
                          f"on {result.gpu.name}, the band reaches {est.band[1] / GIB:.2f} GiB)")
        else:
            out.reason = f"the run can start; {result.headroom_bytes / GIB:.2f} GiB headroom on {result.gpu.name}"
    if out.judged_against and result is not None:
        out.reason += f"; {out.judged_against}"
    return out
