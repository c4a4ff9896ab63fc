"""`DoctorCallback`: the bedside doctor for a transformers Trainer (TRL trainers are Trainers).

    from loradoctor.integrations.transformers import DoctorCallback
    trainer = Trainer(..., callbacks=[DoctorCallback(out="doctor", seq_len=2048)])

- at train begin: a preflight on the real objects (parameter counts, what is trainable and in which
  dtype, whether quantization really reached the linear layers, use_cache, gradient checkpointing and
  input-require-grads, the attention implementation, the optimizer), compared with loradoctor's
  estimate for the same settings; warnings when quantization silently did not apply, nothing is
  trainable, or the estimate says the run will not fit;
- at each log: a `step` record (loss, grad norm, learning rate, allocated / reserved / peak memory,
  step time, tokens per second) in OUT/timeline.jsonl;
- on an exception that ends the script: memory summary, optional allocator history, OUT/report.md.
Importing loradoctor does not import this module (it imports transformers).
"""

from __future__ import annotations

import sys
from collections import Counter
from typing import Any, Optional

from transformers import TrainerCallback

from loradoctor.integrations.watch import Bedside


def _cfg(model: Any) -> Any:
    return getattr(model, "config", None)


def inspect_model(model: Any, args: Any = None, optimizer: Any = None, seq_len: Optional[int] = None) -> dict[str, Any]:
    """Plain facts about the real objects (never raises)."""
    facts: dict[str, Any] = {}
    warnings: list[str] = []
    try:
        total = trainable = 0
        dtypes: Counter = Counter()
        for p in model.parameters():
            n = p.numel()
            total += n
            if p.requires_grad:
                trainable += n
                dtypes[str(p.dtype).replace("torch.", "")] += n
        facts.update(total_params=total, trainable_params=trainable, trainable_dtypes=dict(dtypes))
        if total and not trainable:
            warnings.append("no parameter is trainable: the loss will not move (wrap the model with get_peft_model)")
    except Exception as exc:  # noqa: BLE001
        facts["params_error"] = str(exc)[:200]
    kinds: Counter = Counter()
    try:
        for m in model.modules():
            name = type(m).__name__
            if "Linear4bit" in name:
                kinds["4bit"] += 1
            elif "Linear8bit" in name:
                kinds["8bit"] += 1
    except Exception:  # noqa: BLE001
        pass
    facts["quantization"] = kinds.most_common(1)[0][0] if kinds else None
    facts["quantized_linear_layers"] = sum(kinds.values())
    cfg = _cfg(model)
    qc = getattr(cfg, "quantization_config", None)
    if qc is not None:
        qd = qc if isinstance(qc, dict) else getattr(qc, "to_dict", lambda: {})()
        requested = "4bit" if qd.get("load_in_4bit") else "8bit" if qd.get("load_in_8bit") else qd.get("quant_method")
        facts["quantization_requested"] = requested
        if requested and not kinds:
            warnings.append(f"quantization ({requested}) was requested but no linear layer is quantized: "
                            "the base model is in 16 bit and needs 3-4x the memory planned")
    facts["use_cache"] = getattr(cfg, "use_cache", None)
    gc = getattr(model, "is_activation_checkpointing", None)
    if gc is None:
        gc = getattr(model, "is_gradient_checkpointing", None)
    if gc is None and args is not None:
        gc = getattr(args, "gradient_checkpointing", None)
    facts["gradient_checkpointing"] = bool(gc) if gc is not None else None
    try:
        emb = model.get_input_embeddings()
        facts["input_require_grads"] = bool(getattr(emb, "_forward_hooks", None))
    except Exception:  # noqa: BLE001
        pass
    if facts.get("gradient_checkpointing") and facts.get("use_cache"):
        warnings.append("use_cache=True with gradient checkpointing: set model.config.use_cache = False")
    facts["attn_implementation"] = getattr(cfg, "_attn_implementation", None)
    if optimizer is not None:
        facts["optimizer"] = type(optimizer).__name__
    elif args is not None:
        facts["optimizer"] = str(getattr(args, "optim", "") or "")
    if args is not None:
        facts["compute_dtype"] = "bfloat16" if getattr(args, "bf16", False) else "float16" if getattr(args, "fp16", False) else None
        facts["batch"] = getattr(args, "per_device_train_batch_size", None)
        facts["grad_accum"] = getattr(args, "gradient_accumulation_steps", None)
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_available():
            i = torch.cuda.current_device()
            major, minor = torch.cuda.get_device_capability(i)
            facts["gpu_cc"] = major + minor / 10
            facts["gpu_total_bytes"] = int(torch.cuda.get_device_properties(i).total_memory)
    except Exception:  # noqa: BLE001
        pass
    facts.update(_estimates(cfg, facts, seq_len, warnings))
    facts["warnings"] = warnings
    return facts


def _estimates(cfg: Any, facts: dict[str, Any], seq_len: Optional[int], warnings: list[str]) -> dict[str, Any]:
    """loradoctor's estimate for these settings, and for the same run in bf16 LoRA (never raises)."""
    if cfg is None or not hasattr(cfg, "to_dict"):
        return {}
    try:
        from loradoctor.estimate.arch import arch_from_config
        from loradoctor.estimate.memory import EstimateInputs, estimate

        arch = arch_from_config(cfg.to_dict(), source="the model's config")
        quant = {"4bit": "nf4", "8bit": "int8"}.get(facts.get("quantization") or "", "none")
        common = dict(arch=arch, batch=int(facts.get("batch") or 1), seq_len=int(seq_len or 1024),
                      gradient_checkpointing=bool(facts.get("gradient_checkpointing")))
        out: dict[str, Any] = {"estimate_seq_len": common["seq_len"], "estimate_seq_len_assumed": seq_len is None}
        try:
            this = estimate(EstimateInputs(method="qlora" if quant != "none" else "lora", quant=quant, **common))
            out["estimate_bytes"] = int(this.device_used_bytes)
        except Exception:  # noqa: BLE001
            pass
        try:
            out["estimate_bf16_lora_bytes"] = int(estimate(EstimateInputs(method="lora", **common)).device_used_bytes)
        except Exception:  # noqa: BLE001
            pass
        card = facts.get("gpu_total_bytes")
        if card and out.get("estimate_bytes") and out["estimate_bytes"] > card:
            from loradoctor.units import gib

            warnings.append(f"the estimate for this run is {gib(out['estimate_bytes'])}, more than the "
                            f"{gib(card)} card: expect an out-of-memory error")
        return out
    except Exception as exc:  # noqa: BLE001 - an architecture the model does not know: no estimate
        return {"estimate_error": str(exc)[:200]}


class DoctorCallback(TrainerCallback):
    """See the module doc. `seq_len`: the longest sequence the run trains on (for the estimate)."""

    def __init__(self, out: str = "loradoctor-run", seq_len: Optional[int] = None,
                 record_memory_history: bool = False, catch_exceptions: bool = True) -> None:
        self.out, self.seq_len, self.record_history = out, seq_len, record_memory_history
        self.catch = catch_exceptions
        self.bedside: Optional[Bedside] = None
        self._hook: Any = None

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None, **kw: Any) -> None:
        if not getattr(state, "is_world_process_zero", True):
            return
        self.bedside = Bedside(out=self.out, record_memory_history=self.record_history)
        if model is not None:
            self.bedside.preflight(inspect_model(model, args, optimizer, self.seq_len))
        if self.catch and self._hook is None:
            previous = sys.excepthook

            def hook(etype: Any, exc: Any, tb: Any) -> None:
                if self.bedside is not None and not self.bedside.closed and isinstance(exc, Exception):
                    self.bedside.on_exception(exc)
                previous(etype, exc, tb)

            self._hook, self._previous = hook, previous
            sys.excepthook = hook

    def on_log(self, args: Any, state: Any, control: Any, logs: Optional[dict] = None, **kw: Any) -> None:
        if self.bedside is None or self.bedside.closed or not logs:
            return
        extra = {k: v for k, v in logs.items() if k.startswith("eval_") and isinstance(v, (int, float))}
        self.bedside.step(step=state.global_step, loss=logs.get("loss"), grad_norm=logs.get("grad_norm"),
                          lr=logs.get("learning_rate"), tokens=getattr(state, "num_input_tokens_seen", None) or None,
                          **extra)

    def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self.bedside is not None:
            self.bedside.close(exit_code=0)
        if self._hook is not None and sys.excepthook is self._hook:
            sys.excepthook = self._previous
        self._hook = None

    def handle_exception(self, exc: BaseException) -> Optional[str]:
        """Call from your own `except` (notebooks do not run sys.excepthook): writes the report."""
        return self.bedside.on_exception(exc) if self.bedside is not None else None
