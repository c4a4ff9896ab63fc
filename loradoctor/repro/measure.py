"""`loradoctor measure`: the estimate's prediction next to a real measurement on this GPU.

The model is built from its config with random weights (nothing is downloaded) in a child process
of the user's interpreter (loradoctor/repro/measure_child.py), LoRA is attached with peft (4-bit or
8-bit base layers through bitsandbytes when asked), and a few training steps run with the given
batch, sequence length, checkpointing, attention and optimizer. The child reports
torch.cuda.max_memory_allocated / max_memory_reserved and the NVML peak of device memory in use
(sampled in a thread); this module puts them beside `estimate(inputs)` with the error.

Exit codes: 0 measured; 1 the run does not fit (CUDA out of memory: the numbers up to the OOM are
shown); 2 could not measure (no CUDA GPU, transformers / peft / bitsandbytes missing, a build
error, a timeout). A user who asks for a measurement on a machine that cannot make one gets an
error, not a quiet skip.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Callable, Optional

from loradoctor.repro.runner import parse_result_line, run_child

SCHEMA = "loradoctor.measure/1"
CHILD_SCHEMA = "loradoctor.measure-child/1"
PROGRESS_SCHEMA = "loradoctor.measure-progress/1"
CHILD_SCRIPT = Path(__file__).resolve().parent / "measure_child.py"
METRICS = (("allocated", "peak_allocated_bytes", "peak allocated"),
           ("reserved", "peak_reserved_bytes", "peak reserved"),
           ("device", "device_used_bytes", "device used (NVML)"))
# config.json model types whose module names are the canonical ones the estimate uses (q_proj, gate_proj, ...)
CANONICAL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "granite", "olmo2")


def config_for_child(arch: Any, seq_len: int) -> tuple[dict[str, Any], Optional[str]]:
    """A config dict with model_type for AutoConfig.for_model, and a note when the shape is approximated."""
    source = str(arch.source)
    path = None
    if source.startswith("hf-cache:"):
        path = Path(source.split(":", 1)[1])
    elif not source.startswith("preset:"):
        path = Path(source)
    if path is not None and path.is_file():
        try:
            cfg = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            cfg = None
        if isinstance(cfg, dict) and "text_config" in cfg and "hidden_size" not in cfg:
            cfg = None  # multimodal wrapper: fall back to the text shape below
        if isinstance(cfg, dict) and cfg.get("model_type") in CANONICAL_TYPES:
            return cfg, None
    model_type = "qwen2" if arch.attn_bias else "llama"
    cfg = {
        "model_type": model_type,
        "hidden_size": arch.hidden,
        "intermediate_size": arch.intermediate,
        "num_hidden_layers": arch.layers,
        "num_attention_heads": arch.heads,
        "num_key_value_heads": arch.kv_heads,
        "vocab_size": arch.vocab,
        "tie_word_embeddings": arch.tied,
        "max_position_embeddings": max(4096, seq_len),
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
    }
    if arch.head_dim and arch.head_dim != arch.hidden // arch.heads:
        cfg["head_dim"] = arch.head_dim
    note = None
    if arch.mlp != "gated" or arch.fused or arch.norms_per_layer != 2 or arch.norm != "rms":
        note = f"{arch.name} is measured as a {model_type} model with its sizes (its own layer layout differs a little)"
    return cfg, note


def child_spec(inputs: Any, steps: int) -> dict[str, Any]:
    """What the child needs: the config and the training setup, as plain JSON."""
    cfg, note = config_for_child(inputs.arch, inputs.seq_len)
    return {
        "config": cfg, "note": note, "method": inputs.method, "quant": inputs.quant,
        "double_quant": inputs.double_quant, "rank": inputs.rank, "alpha": inputs.alpha, "dropout": inputs.dropout,
        "targets": list(inputs.targets), "modules_to_save": list(inputs.modules_to_save),
        "batch": inputs.batch, "seq_len": inputs.seq_len, "gradient_checkpointing": inputs.gradient_checkpointing,
        "attn": inputs.attn, "optim": inputs.optim, "precision": inputs.precision, "steps": steps,
    }


def _inputs_summary(inputs: Any) -> dict[str, Any]:
    keep = ("method", "quant", "double_quant", "rank", "alpha", "targets", "batch", "seq_len", "grad_accum",
            "gradient_checkpointing", "attn", "optim", "precision", "framework")
    data = {k: getattr(inputs, k) for k in keep if hasattr(inputs, k)}
    data["model"] = inputs.arch.name
    data["arch_source"] = inputs.arch.source
    return data


def compare(predicted: dict[str, Optional[int]], measured: dict[str, Optional[int]]) -> dict[str, Optional[float]]:
    """Relative error of the prediction per metric, (predicted - measured) / measured; None without a measurement."""
    out: dict[str, Optional[float]] = {}
    for key, value in predicted.items():
        got = measured.get(key)
        out[key] = None if not got or value is None else (value - got) / got
    return out


def build_report(inputs: Any, est: Any, child: Optional[dict[str, Any]], steps: int, note: Optional[str],
                 failure: Optional[str] = None) -> dict[str, Any]:
    """The measure document (schema loradoctor.measure/1) from the estimate and what the child printed."""
    predicted = {key: getattr(est, attr) for key, attr, _ in METRICS}
    measured: dict[str, Optional[int]] = {key: None for key, _, _ in METRICS}
    status = "error"
    reason = failure or "the measuring process printed no result"
    child = child or {}
    if child:
        status = {"measured": "measured", "oom": "oom", "skip": "skipped"}.get(child.get("status"), "error")
        reason = child.get("reason", "")
        for key, attr, _ in METRICS:
            value = child.get(attr)
            measured[key] = int(value) if isinstance(value, (int, float)) else None
    return {
        "schema": SCHEMA,
        "status": status,
        "reason": reason,
        "inputs": _inputs_summary(inputs),
        "predicted": predicted,
        "band": list(est.band),
        "measured": measured,
        "error": compare(predicted, measured) if status == "measured" else {k: None for k in predicted},
        "steps": child.get("steps", []),
        "requested_steps": steps,
        "gpu": child.get("gpu"),
        "versions": child.get("versions"),
        "trainable_params": {"predicted": est.trainable_params, "measured": child.get("trainable_params")},
        "notes": [n for n in [note] if n]
        + ([f"measured with transformers + peft; the prediction is for {inputs.framework}"]
           if getattr(inputs, "framework", "hf") != "hf" else [])
        + ([child["message"]] if child.get("message") else [])
        + [f"  {line}" for line in child.get("traceback", [])],
        "duration_s": child.get("duration_s"),
    }


def run_measure(inputs: Any, steps: int, timeout_s: float,
                on_progress: Optional[Callable[[str], None]] = None, python: Optional[str] = None) -> dict[str, Any]:
    """Estimate, measure in a child, and return the report document."""
    from loradoctor.estimate.memory import estimate

    est = estimate(inputs)
    inputs = est.inputs  # validated: canonical targets, qlora -> nf4
    spec = child_spec(inputs, steps)
    if inputs.arch.experts:
        return build_report(inputs, est, None, steps, spec["note"],
                            failure="measure does not build mixture-of-experts models yet (expert module names differ)")

    def relay(line: str) -> None:
        if on_progress is not None and PROGRESS_SCHEMA in line:
            try:
                on_progress(json.loads(line)["message"])
            except (ValueError, KeyError):
                pass

    run = run_child([python or sys.executable, str(CHILD_SCRIPT), json.dumps(spec)], timeout_s=timeout_s,
                    on_stdout_line=relay)
    child = parse_result_line(run.stdout_lines, CHILD_SCHEMA)
    failure = None
    if run.timed_out:
        child = None
        failure = f"no result within {timeout_s:g} s; killed (--timeout raises the limit)"
    elif child is None:
        tail = [line for line in run.stderr_lines if line.strip()][-3:]
        failure = f"the measuring process exited with code {run.returncode} without a result" + (
            ": " + " | ".join(tail) if tail else "")
    return build_report(inputs, est, child, steps, spec["note"], failure)


def exit_code_for(report: dict[str, Any]) -> int:
    return {"measured": 0, "oom": 1}.get(report["status"], 2)
