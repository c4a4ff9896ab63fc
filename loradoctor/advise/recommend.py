"""`loradoctor recommend`: the LoRA / QLoRA config to copy for a model on a card, chosen by the memory
model and the card's capabilities, with one reason per choice.

The search, in order (each step keeps the previous ones):
1. precision: bf16 where the card has it (compute capability >= 8.0), else fp16;
   attention: FlashAttention 2 where the card has it and flash-attn is installed (judged locally),
   else sdpa;
2. method: bf16 LoRA if it fits the budget (card minus headroom) at micro-batch 1 with gradient
   checkpointing; else QLoRA nf4 with double quantization; else nothing fits (the smallest card that
   would is named);
3. targets and rank by goal: quality -> all linear layers, r 16 (attention only when all-linear
   leaves no room); fast -> attention projections, r 8; long-context -> attention, r 16;
4. gradient checkpointing off when a micro-batch of 2 or more fits without it (faster), else on;
   the micro-batch is the largest power of two up to 16 that fits; gradient accumulation makes the
   effective batch reach the target (16 by default);
5. optimizer: fused AdamW while 20% of the budget stays free, else paged 8-bit AdamW;
6. max length: the user's, or (goal long-context or none given) the longest that fits up to 8192;
7. learning rate 2e-4 scaled by sqrt(effective batch / 16) into [1e-4, 3e-4] (2e-5 for full
   fine-tuning), alpha = 2r, cosine schedule, 3% warmup, max_grad_norm 1.0 (0.3 for QLoRA, as the
   QLoRA paper), expandable segments, dataloader workers from the CPUs and /dev/shm when local.
"""

from __future__ import annotations

import math
import os
from loradoctor.record import field, record, replace
from typing import Any, Optional

from loradoctor.errors import UserError
from loradoctor.estimate.memory import Estimate, EstimateInputs, estimate, validate
from loradoctor.units import gib

GOALS = ("fast", "quality", "long-context")
FRAMEWORKS = ("hf", "trl", "axolotl", "llamafactory", "unsloth")
METHODS = ("auto", "lora", "qlora", "full")
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
GIB = 1 << 30


@record
class Recommendation:
    inputs: EstimateInputs
    estimate: Estimate
    gpu: Any
    budget_bytes: int
    framework: str
    goal: str
    effective_batch: int
    lr: float
    max_grad_norm: float
    warmup_ratio: float = 0.03
    scheduler: str = "cosine"
    workers: int = 2
    reasons: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def headroom_bytes(self) -> int:
        return self.gpu.memory_bytes - self.estimate.device_used_bytes

    def to_dict(self) -> dict[str, Any]:
        inp = self.inputs
        return {
            "model": hub_id(inp.arch.name), "gpu": self.gpu.to_dict(), "framework": self.framework, "goal": self.goal,
            "method": inp.method, "quant": inp.quant, "double_quant": inp.double_quant, "precision": inp.precision,
            "attn": inp.attn, "gradient_checkpointing": inp.gradient_checkpointing, "rank": inp.rank,
            "alpha": inp.alpha, "dropout": inp.dropout, "targets": list(inp.targets), "micro_batch": inp.batch,
            "grad_accum": inp.grad_accum, "effective_batch": self.effective_batch, "seq_len": inp.seq_len,
            "optim": inp.optim, "lr": self.lr, "scheduler": self.scheduler, "warmup_ratio": self.warmup_ratio,
            "max_grad_norm": self.max_grad_norm, "dataloader_num_workers": self.workers,
            "env": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
            "estimate_bytes": self.estimate.device_used_bytes, "budget_bytes": self.budget_bytes,
            "card_bytes": self.gpu.memory_bytes, "components": dict(self.estimate.components),
            "reasons": self.reasons, "notes": self.notes,
        }


def hub_id(name: str) -> str:
    """The Hub id to write into a config: a preset name ('qwen2.5-7b') becomes its first 'org/name' alias."""
    if "/" in name:
        return name
    from loradoctor.estimate.arch import presets

    spec = presets().get(name) or {}
    return next((a for a in spec.get("aliases") or [] if "/" in a), name)


def _fits(inp: EstimateInputs, budget: int) -> Optional[Estimate]:
    try:
        est = estimate(validate(inp))
    except UserError:
        return None
    return est if est.device_used_bytes <= budget else None


def _largest_pow2(inp: EstimateInputs, budget: int, cap: int = 16) -> tuple[int, Optional[Estimate]]:
    best, best_est, b = 0, None, 1
    while b <= cap:
        est = _fits(replace(inp, batch=b), budget)
        if est is None:
            break
        best, best_est = b, est
        b *= 2
    return best, best_est


def _cc(gpu: Any) -> Optional[float]:
    try:
        return float(gpu.compute_capability) if gpu.compute_capability else None
    except (TypeError, ValueError):
        return None


def _flash_attn_installed() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("flash_attn") is not None
    except (ImportError, ValueError):
        return False


def _workers(local: bool) -> tuple[int, str]:
    if not local:
        return 2, "2 dataloader workers (judged for another machine: raise to the free CPU cores there)"
    cpus = os.cpu_count() or 2
    try:
        st = os.statvfs("/dev/shm")
        shm = st.f_blocks * st.f_frsize
    except OSError:
        shm = None
    n = max(0, min(4, cpus // 2))
    if shm is not None and shm < 1 * GIB:
        return 0, f"0 dataloader workers: /dev/shm is only {shm / 2**20:.0f} MiB here (workers pass batches through it)"
    return n, f"{n} dataloader workers ({cpus} CPUs here)"


def smallest_card_for(inp: EstimateInputs, headroom: float) -> Optional[str]:
    from loradoctor.estimate.fit import gpu_table
    from loradoctor.units import MIB

    rows = sorted(gpu_table().items(), key=lambda kv: kv[1]["memory_mib"])
    for name, spec in rows:
        if _fits(inp, int(spec["memory_mib"] * MIB * (1 - headroom))) is not None:
            return name
    return None


def recommend(arch: Any, gpu: Any, seq_len: Optional[int] = None, method: str = "auto", goal: str = "quality",
              framework: str = "hf", effective_batch: int = 16, headroom: float = 0.10, local: bool = False) -> Recommendation:
    """See the module doc. UserError when nothing fits (the message names the smallest card that would)."""
    if goal not in GOALS:
        raise UserError(f"--goal must be one of {', '.join(GOALS)}, not {goal!r}")
    if framework not in FRAMEWORKS:
        raise UserError(f"--framework must be one of {', '.join(FRAMEWORKS)}, not {framework!r}")
    if method not in METHODS:
        raise UserError(f"--method must be one of {', '.join(METHODS)}, not {method!r}")
    if not 0 <= headroom < 0.9:
        raise UserError("--headroom must be between 0 and 0.9 (a share of the card)")
    if effective_batch < 1:
        raise UserError("--effective-batch must be at least 1")
    budget = int(gpu.memory_bytes * (1 - headroom))
    reasons: list[str] = []
    notes: list[str] = []
    cc = _cc(gpu)
    bf16 = gpu.bf16 if gpu.bf16 is not None else (cc is not None and cc >= 8.0)
    precision = "bf16" if bf16 else "fp16"
    reasons.append(f"{precision}: " + ("the card supports bf16 (compute capability >= 8.0)" if bf16 else
                                      "the card has no bf16 (compute capability below 8.0 or unknown); fp16 with loss scaling"))
    attn = "sdpa"
    if cc is not None and cc >= 8.0 and local and _flash_attn_installed():
        attn = "flash_attention_2"
        reasons.append("flash_attention_2: compute capability >= 8.0 and flash-attn is installed here")
    elif cc is not None and cc >= 8.0:
        reasons.append("sdpa: PyTorch's fused attention; flash_attention_2 is also possible on this card once flash-attn is installed")
    else:
        reasons.append("sdpa: FlashAttention 2 needs compute capability >= 8.0")
    long_ctx = goal == "long-context" or seq_len is None
    targets = ("all-linear",) if goal == "quality" else ATTENTION
    rank = 8 if goal == "fast" else 16
    dropout = 0.0 if framework == "unsloth" else 0.05
    base = EstimateInputs(arch=arch, method="lora", rank=rank, alpha=2 * rank, dropout=dropout, targets=targets,
                          batch=1, seq_len=seq_len or 2048, gradient_checkpointing=True, attn=attn,
                          optim="adamw_torch_fused", precision=precision)
    qlora = replace(base, method="qlora", quant="nf4", double_quant=True)
    probe_len = min(seq_len or 1024, 1024) if long_ctx and seq_len is None else base.seq_len
    chosen: Optional[EstimateInputs] = None

    def ladder(inp: EstimateInputs) -> tuple[Optional[EstimateInputs], Optional[Estimate]]:
        """The goal's setup, then cheaper ones: attention-only targets, then paged 8-bit AdamW."""
        tries = [inp, replace(inp, targets=ATTENTION), replace(inp, targets=ATTENTION, optim="paged_adamw_8bit")]
        for t in tries if inp.method != "full" else [inp]:
            est = _fits(replace(t, seq_len=probe_len), budget)
            if est is not None:
                return t, est
        return None, None

    if method in ("auto", "lora"):
        found, lora_est = ladder(base)
        if found is not None:
            chosen = found
            reasons.append(f"bf16 LoRA: {gib(lora_est.device_used_bytes)} at micro-batch 1 and {probe_len} tokens, within "
                           f"the {gib(budget)} budget ({headroom:.0%} of the card kept free)")
        elif method == "lora":
            raise UserError(_nothing_fits("LoRA", replace(base, seq_len=probe_len), headroom, gpu))
    if chosen is None and method in ("auto", "qlora"):
        need = estimate(validate(replace(base, targets=ATTENTION, optim="paged_adamw_8bit", seq_len=probe_len))).device_used_bytes
        found, q_est = ladder(qlora)
        if found is None:
            raise UserError(_nothing_fits("QLoRA", replace(qlora, seq_len=probe_len), headroom, gpu))
        chosen = found
        why = (f"QLoRA (nf4, double quantization): bf16 LoRA needs at least {gib(need)} at {probe_len} tokens, more "
               f"than the {gib(budget)} budget" if method == "auto" else "QLoRA: asked for")
        reasons.append(why)
    if method == "full":
        full = replace(base, method="full", targets=(), optim="adamw_8bit")
        if _fits(replace(full, seq_len=probe_len), budget) is None:
            raise UserError(_nothing_fits("full fine-tuning", replace(full, seq_len=probe_len), headroom, gpu))
        chosen = full
        reasons.append("full fine-tuning: asked for; it fits with an 8-bit optimizer")
    assert chosen is not None
    if chosen.method != "full" and chosen.optim == "adamw_torch_fused":
        est1 = estimate(validate(replace(chosen, seq_len=probe_len)))
        if est1.device_used_bytes > 0.8 * budget and _fits(replace(chosen, optim="paged_adamw_8bit", seq_len=probe_len), budget):
            chosen = replace(chosen, optim="paged_adamw_8bit")
    if chosen.optim == "paged_adamw_8bit":
        reasons.append("paged 8-bit AdamW: with fused AdamW less than 20% of the budget would stay free")
    # targets: all-linear only while it leaves room
    if goal == "quality" and chosen.method != "full" and chosen.targets == ATTENTION:
        reasons.append("targets q/k/v/o: all linear layers would not leave the headroom")
    elif chosen.method != "full":
        reasons.append("targets: every linear layer (quality)" if targets == ("all-linear",) else
                       "targets: the attention projections q/k/v/o (" + ("speed" if goal == "fast" else "room for long sequences") + ")")
    # sequence length
    if seq_len is None or goal == "long-context":
        from loradoctor.estimate.fit import max_seq_len

        cap = 8192 if goal != "long-context" else 32768
        longest = max_seq_len(replace(chosen, batch=1), budget) or 0
        if seq_len is None:
            new_len = max(256, min(cap, 2048 if goal != "long-context" else cap, longest // 256 * 256))
            chosen = replace(chosen, seq_len=new_len)
            reasons.append(f"max length {new_len}: none given; the longest that fits is {longest} tokens")
        elif longest < seq_len:
            raise UserError(f"{seq_len} tokens do not fit even at micro-batch 1 with gradient checkpointing "
                            f"(the longest that fits is {longest}); shorten samples or use a larger card")
    # checkpointing and micro-batch
    mb_nogc, est_nogc = _largest_pow2(replace(chosen, gradient_checkpointing=False), budget)
    if goal == "fast" and mb_nogc >= 1 or mb_nogc >= 2:
        chosen = replace(chosen, gradient_checkpointing=False, batch=mb_nogc)
        reasons.append(f"gradient checkpointing off: micro-batch {mb_nogc} fits without it (about 30% faster steps)")
    else:
        mb, est_gc = _largest_pow2(replace(chosen, gradient_checkpointing=True), budget)
        if mb == 0:
            raise UserError(_nothing_fits(chosen.method, chosen, headroom, gpu))
        chosen = replace(chosen, gradient_checkpointing=True, batch=mb)
        reasons.append(f"gradient checkpointing on: without it even micro-batch 2 does not fit; with it, micro-batch {mb}")
    ga = max(1, math.ceil(effective_batch / chosen.batch))
    chosen = replace(chosen, grad_accum=ga)
    reasons.append(f"micro-batch {chosen.batch} x accumulation {ga} = effective batch {chosen.batch * ga}")
    if chosen.optim == "adamw_torch_fused":
        reasons.append("fused AdamW: at micro-batch 1 more than enough memory stays free; the fastest optimizer in torch")
    eff = chosen.batch * chosen.grad_accum
    if chosen.method == "full":
        lr = 2e-5
    else:
        lr = min(3e-4, max(1e-4, 2e-4 * math.sqrt(eff / 16)))
        lr = float(f"{lr:.1g}")
    reasons.append(f"learning rate {lr:g}: the LoRA range (1e-4 to 3e-4), scaled for the effective batch {eff}"
                   if chosen.method != "full" else "learning rate 2e-05: full fine-tuning")
    max_norm = 0.3 if chosen.method == "qlora" else 1.0
    reasons.append(f"max_grad_norm {max_norm}: clip gradients" + (" (the QLoRA paper's value)" if max_norm == 0.3 else ""))
    reasons.append("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: less fragmentation with varying sequence lengths")
    workers, why_workers = _workers(local)
    reasons.append(why_workers)
    if framework == "unsloth" and chosen.gradient_checkpointing:
        notes.append("Unsloth: use_gradient_checkpointing=\"unsloth\" offloads the checkpoints to host memory; the estimate "
                     "above is for standard checkpointing, so it is an upper bound")
    chosen = validate(chosen)
    est = estimate(chosen)
    return Recommendation(inputs=chosen, estimate=est, gpu=gpu, budget_bytes=budget, framework=framework, goal=goal,
                          effective_batch=eff, lr=lr, max_grad_norm=max_norm, workers=workers, reasons=reasons, notes=notes)


def _nothing_fits(what: str, inp: EstimateInputs, headroom: float, gpu: Any) -> str:
    need = estimate(validate(inp)).device_used_bytes
    qlora = replace(inp, method="qlora", quant="nf4", double_quant=True, targets=ATTENTION, optim="paged_adamw_8bit",
                    gradient_checkpointing=True, batch=1) if inp.method != "full" else inp
    card = smallest_card_for(qlora, headroom)
    where = f"; the smallest card in the table that fits QLoRA at micro-batch 1 is {card}" if card else \
        "; no card in the table fits it (shorten the sequence or use several GPUs)"
    return (f"nothing fits on {gpu.name}: {what} needs {gib(need)} at micro-batch 1 and {inp.seq_len} tokens with "
            f"gradient checkpointing, above the {gib(gpu.memory_bytes * (1 - headroom))} budget{where}")


def table(models: list[str], gpu: Any, lengths: tuple[int, ...] = (1024, 2048, 4096), headroom: float = 0.10) -> list[dict]:
    """The field guides' table done right: per model, method and max length, the largest micro-batch
    (power of two up to 16) that fits with gradient checkpointing, and the memory it uses."""
    from loradoctor.estimate.arch import resolve_arch

    budget = int(gpu.memory_bytes * (1 - headroom))
    rows = []
    for m in models:
        arch = resolve_arch(m)
        for method in ("lora", "qlora"):
            base = EstimateInputs(arch=arch, method=method, quant="nf4" if method == "qlora" else "none",
                                  double_quant=method == "qlora", rank=16, alpha=32, targets=ATTENTION,
                                  gradient_checkpointing=True, optim="paged_adamw_8bit",
                                  precision="bf16" if gpu.bf16 is not False else "fp16")
            for n in lengths:
                mb, est = _largest_pow2(replace(base, seq_len=n), budget)
                rows.append({"model": hub_id(arch.name), "method": method, "seq_len": n, "micro_batch": mb,
                             "bytes": est.device_used_bytes if est else None})
    return rows
