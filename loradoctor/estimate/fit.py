"""Fit and advice: an Estimate against a card (by name, by size, or the local GPU's free memory).

Verdict: 'fits' (the high end of the band is below the budget), 'tight' (the point estimate fits but the
band does not), 'does not fit'. What-if answers: the largest batch and the longest sequence that fit,
and an ordered list of changes, each with what it saves on this very configuration.
"""

from __future__ import annotations

import re
from loradoctor.record import field, record, replace
from pathlib import Path
from typing import Any, Callable, Optional

from loradoctor.errors import UserError
from loradoctor.estimate.memory import Estimate, EstimateInputs, estimate

MIB = 1 << 20


@record
class Gpu:
    name: str
    memory_bytes: int  # budget the run may use (total as nvidia-smi reports, or the free memory now)
    source: str  # 'table' | 'vram' | 'local free memory'
    bf16: Optional[bool] = None  # None: unknown card
    compute_capability: Optional[str] = None

    @property
    def flash_attn_ok(self) -> Optional[bool]:
        """FlashAttention-2 needs Ampere (sm80) or newer; None when the card is unknown."""
        if not self.compute_capability:
            return None
        try:
            return float(self.compute_capability) >= 8.0
        except ValueError:
            return None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "memory_bytes": self.memory_bytes, "source": self.source, "bf16": self.bf16,
                "compute_capability": self.compute_capability}


@record
class Change:
    """One thing to change, the config after it, and what it saves (positive = less memory)."""

    text: str
    option: str  # the command-line spelling, for pasting
    saves_bytes: int
    device_used_bytes: int  # with this change alone
    fits: bool  # this change alone is enough
    cumulative_bytes: int = 0  # with this change and every change listed before it

    def to_dict(self) -> dict[str, Any]:
        return {"change": self.text, "option": self.option, "saves_bytes": self.saves_bytes,
                "device_used_bytes": self.device_used_bytes, "fits": self.fits,
                "cumulative_device_used_bytes": self.cumulative_bytes}


@record
class Fit:
    gpu: Gpu
    verdict: str  # fits | tight | does not fit
    headroom_bytes: int  # budget - point estimate (negative: short by)
    max_batch: Optional[int] = None
    max_seq_len: Optional[int] = None
    advice: list[Change] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # the card cannot run this config as written

    def to_dict(self) -> dict[str, Any]:
        return {"gpu": self.gpu.to_dict(), "verdict": self.verdict, "headroom_bytes": self.headroom_bytes,
                "max_batch": self.max_batch, "max_seq_len": self.max_seq_len,
                "advice": [c.to_dict() for c in self.advice], "warnings": list(self.warnings)}


# --- the card table ------------------------------------------------------------------------------

_GPUS: Optional[dict[str, dict[str, Any]]] = None


def gpu_table() -> dict[str, dict[str, Any]]:
    global _GPUS
    if _GPUS is None:
        import yaml

        path = Path(__file__).resolve().parent.parent / "data" / "gpus.yaml"
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present: 10x faster
        _GPUS = yaml.load(path.read_text(encoding="utf-8"), Loader=loader) or {}
    return _GPUS


def _key(text: str) -> str:
    text = str(text).lower()
    for noise in ("nvidia", "geforce", "tesla", "graphics", "generation"):
        text = text.replace(noise, " ")
    return re.sub(r"[^a-z0-9]+", "", text)


def find_gpu(name: str) -> Optional[str]:
    """Loose match: exact key/alias after dropping vendor words, spaces and dashes; else the longest table
    name contained in the query (so 'NVIDIA A100-SXM4-40GB' finds 'A100 40GB')."""
    from loradoctor.estimate.cards import variants

    want = _key(name)
    if not want:
        return None
    table = gpu_table()
    for card, spec in table.items():
        if want == _key(card) or any(want == _key(a) for a in spec.get("aliases") or []):
            return card
    if variants(name):
        return None  # 'A100' is two cards: gpu_by_name asks which
    best: Optional[tuple[int, str]] = None
    for card, spec in table.items():
        for cand in [card] + list(spec.get("aliases") or []):
            k = _key(cand)
            if k and k in want and (best is None or len(k) > best[0]):
                best = (len(k), card)
    return best[1] if best else None


def gpu_by_name(name: str) -> Gpu:
    from loradoctor.estimate.cards import ambiguous_error, variants

    card = find_gpu(name)
    if card is None and variants(name):
        raise ambiguous_error(name, variants(name))
    if card is None:
        raise UserError(f"unknown GPU {name!r}; known cards: {', '.join(gpu_table())} (or pass --vram 24GB)")
    spec = gpu_table()[card]
    return Gpu(name=card, memory_bytes=int(spec["memory_mib"]) * MIB, source="table", bf16=spec.get("bf16"),
               compute_capability=str(spec["cc"]) if spec.get("cc") else None)


def gpu_from_vram(text: str) -> Gpu:
    from loradoctor.estimate.cards import parse_vram

    size = parse_vram(text)  # 24GB = 24GiB, as cards are labelled
    return Gpu(name=f"{text.strip()} card", memory_bytes=size, source="vram")


def gpu_from_snapshot(snapshot: dict[str, Any], index: "int | str" = 0) -> Optional[Gpu]:
    """The free memory of a GPU in an env snapshot (other processes already subtracted), or None. `index` is
    the NVML index, or a UUID (prefix) as CUDA_VISIBLE_DEVICES may name it."""
    nvidia = snapshot.get("nvidia") if isinstance(snapshot, dict) else None
    gpus = nvidia.get("gpus") if isinstance(nvidia, dict) else None
    if not isinstance(gpus, list) or not gpus:
        return None
    if isinstance(index, str):
        gpu = next((g for g in gpus if isinstance(g, dict) and str(g.get("uuid", "")).startswith(index)), None)
    else:
        gpu = next((g for g in gpus if isinstance(g, dict) and g.get("index") == index), None)
    if gpu is None:
        gpu = gpus[0] if isinstance(gpus[0], dict) else None
    if gpu is None:
        return None
    free = gpu.get("memory_free_bytes")
    if not isinstance(free, int):
        total, used = gpu.get("memory_total_bytes"), gpu.get("memory_used_bytes")
        if not (isinstance(total, int) and isinstance(used, int)):
            return None
        free = total - used
    name = str(gpu.get("name") or f"GPU {index}")
    card = find_gpu(name)
    bf16 = gpu_table()[card].get("bf16") if card else None
    cc = gpu.get("compute_capability") or (gpu_table()[card].get("cc") if card else None)
    if bf16 is None and cc:
        try:
            bf16 = float(cc) >= 8.0
        except ValueError:
            pass
    return Gpu(name=f"{name} (free now)", memory_bytes=int(free), source="local free memory", bf16=bf16,
               compute_capability=str(cc) if cc else None)


# --- verdict and what-if -------------------------------------------------------------------------

def verdict_for(est: Estimate, budget_bytes: int) -> str:
    if est.band[1] <= budget_bytes:
        return "fits"
    if est.device_used_bytes <= budget_bytes:
        return "tight"
    return "does not fit"


def _largest(fits: Callable[[int], bool], lo: int, hi: int) -> Optional[int]:
    """Largest n in [lo, hi] with fits(n), fits monotone decreasing; None if not even lo fits."""
    if not fits(lo):
        return None
    if fits(hi):
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def max_batch(inp: EstimateInputs, budget: int, limit: int = 4096) -> Optional[int]:
    return _largest(lambda b: estimate(replace(inp, batch=b)).device_used_bytes <= budget, 1, limit)


def max_seq_len(inp: EstimateInputs, budget: int, step: int = 64, limit_tokens: int = 1 << 20) -> Optional[int]:
    """Longest sequence (a multiple of `step`) that fits at this batch size."""
    n = _largest(lambda k: estimate(replace(inp, seq_len=k * step)).device_used_bytes <= budget, 1, limit_tokens // step)
    return None if n is None else n * step


def card_warnings(inp: EstimateInputs, gpu: Gpu) -> list[str]:
    """What this card cannot do as configured (bf16, FlashAttention 2, fp8), with what to use instead."""
    from loradoctor.estimate.cards import unsupported

    return [u.text for u in unsupported(inp, gpu)]


def candidate_changes(inp: EstimateInputs, gpu: Optional[Gpu] = None) -> list[tuple[str, str, Callable[[EstimateInputs], EstimateInputs]]]:
    """Changes in the order a person tunes a run: free wins first, then batch/length, then the method.
    Each is a function of the inputs so it can be applied alone or on top of the previous ones."""
    out: list[tuple[str, str, Callable[[EstimateInputs], EstimateInputs]]] = []
    if not inp.gradient_checkpointing:
        out.append(("turn on gradient checkpointing", "--gradient-checkpointing",
                    lambda i: replace(i, gradient_checkpointing=True)))
    from loradoctor.estimate.memory import loss_kind, offloads_checkpoints

    kind, _ = loss_kind(inp)
    if inp.framework == "hf" and kind in ("standard", "chunked", "fused-ce"):
        # both plug into the transformers stack: axolotl's CutCrossEntropyPlugin / cut_cross_entropy_patch,
        # Liger via use_liger_kernel (Trainer, TRL, LLaMA-Factory enable_liger_kernel, axolotl liger_*)
        out.append(("use Cut Cross Entropy (never materialises the logits; axolotl: the CutCrossEntropyPlugin)",
                    "--loss cce", lambda i: replace(i, loss="cce")))
        out.append(("use Liger's fused linear cross-entropy and kernels (use_liger_kernel=True)",
                    "--loss liger-flce --liger", lambda i: replace(i, loss="liger-flce", liger_kernels=True)))
    if inp.framework in ("hf", "unsloth") and inp.gradient_checkpointing and not offloads_checkpoints(inp):
        text = ("use Unsloth's offloaded checkpointing (use_gradient_checkpointing='unsloth')" if inp.framework == "unsloth"
                else "offload checkpointed hidden states to host memory (axolotl gradient_checkpointing: offload, "
                     "LLaMA-Factory use_unsloth_gc)")
        out.append((text, "--offload-checkpoints", lambda i: replace(i, offload_checkpoints=True)))
    if inp.attn != "flash_attention_2" and (gpu is None or gpu.flash_attn_ok is not False):
        out.append(("use flash_attention_2 (no repeated k/v, no s x s scores)", "--attn flash_attention_2",
                    lambda i: replace(i, attn="flash_attention_2")))
    if inp.optim not in ("paged_adamw_8bit", "adamw_8bit", "sgd", "adafactor"):
        out.append(("use a paged 8-bit optimizer", "--optim paged_adamw_8bit", lambda i: replace(i, optim="paged_adamw_8bit")))
    if inp.batch > 1:
        b = max(1, inp.batch // 2)
        acc = inp.grad_accum * (inp.batch // b)
        out.append((f"halve the batch ({inp.batch} -> {b}) and raise gradient accumulation to {acc}",
                    f"--batch {b} --grad-accum {acc}", lambda i: replace(i, batch=b, grad_accum=acc)))
    if inp.seq_len > 256:
        s = max(256, inp.seq_len // 2)
        out.append((f"cut the max length ({inp.seq_len} -> {s})", f"--seq-len {s}", lambda i: replace(i, seq_len=s)))
    if inp.method == "full":
        out.append(("train LoRA adapters instead of all weights", "--method lora --targets all-linear",
                    lambda i: replace(i, method="lora", targets=("all-linear",))))
    if inp.method == "lora" and inp.quant == "none":
        out.append(("load the base model in 4-bit (QLoRA, NF4)", "--method qlora --quant nf4 --double-quant",
                    lambda i: replace(i, method="qlora", quant="nf4", double_quant=True)))
    if inp.quant in ("nf4", "fp4") and not inp.double_quant:
        out.append(("turn on double quantization", "--double-quant", lambda i: replace(i, double_quant=True)))
    if inp.method != "full" and len(inp.targets) > 2:
        out.append(("target only q_proj,v_proj", "--targets q_proj,v_proj", lambda i: replace(i, targets=("q_proj", "v_proj"))))
    if inp.method != "full" and inp.modules_to_save:
        out.append(("drop modules_to_save", "--modules-to-save ''", lambda i: replace(i, modules_to_save=())))
    return out


def advise(inp: EstimateInputs, est: Estimate, budget: int, gpu: Optional[Gpu] = None) -> list[Change]:
    """Each candidate change with what it saves alone on this config, and the total after applying it on top
    of the changes listed before it. Changes that save nothing are dropped."""
    changes: list[Change] = []
    cumulative = inp
    for text, option, apply in candidate_changes(inp, gpu):
        try:
            alone = estimate(apply(inp))
            stacked_inputs = apply(cumulative)
            stacked = estimate(stacked_inputs)
        except UserError:
            continue
        saved = est.device_used_bytes - alone.device_used_bytes
        if saved <= 16 * MIB:
            continue
        cumulative = stacked_inputs
        changes.append(Change(text, option, saved, alone.device_used_bytes, alone.device_used_bytes <= budget,
                              stacked.device_used_bytes))
    return changes


def fit(inp: EstimateInputs, est: Estimate, gpu: Gpu, what_if: bool = True) -> Fit:
    """Verdict against the card, and (what_if) the largest batch / longest sequence and ordered advice."""
    budget = gpu.memory_bytes
    result = Fit(gpu=gpu, verdict=verdict_for(est, budget), headroom_bytes=budget - est.device_used_bytes,
                 warnings=card_warnings(est.inputs, gpu))
    if what_if:
        base = est.inputs
        result.max_batch = max_batch(base, budget)
        result.max_seq_len = max_seq_len(base, budget)
        result.advice = advise(base, est, budget, gpu)
    return result
