"""From command-line options and config files to one `EstimateInputs`: defaults < config files < command line.

`resolve_inputs` also says where each value came from (command line, which file, or an assumed
default), because an estimate is only as good as its sequence length and batch size.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Optional

from loradoctor.errors import UserError
from loradoctor.estimate.arch import resolve_arch
from loradoctor.estimate.memory import EstimateInputs

# What a Hugging Face transformers + peft run does when nothing says otherwise.
DEFAULTS: dict[str, Any] = {
    "method": "lora",
    "quant": "none",
    "double_quant": False,
    "rank": 8,  # LoraConfig defaults: r=8, lora_alpha=8, lora_dropout=0.0
    "alpha": 8,
    "dropout": 0.0,
    "targets": ["q_proj", "v_proj"],  # PEFT's default for Llama-family models
    "modules_to_save": [],
    "batch": 1,
    "seq_len": 2048,
    "grad_accum": 1,
    "gradient_checkpointing": False,
    "attn": "sdpa",
    "optim": "adamw_torch",
    "precision": "bf16",
    "framework": "hf",
    # issue 13: loss kernels, Unsloth / Liger, PEFT methods, more than one GPU (None: the framework's own)
    "loss": None,
    "liger_kernels": False,
    "offload_checkpoints": None,
    "peft": "lora",
    "gpus": 1,
    "strategy": "none",
    "offload": "none",
    "compute_dtype": None,
    "vocab": None,
}
INPUT_KEYS = ("model",) + tuple(DEFAULTS)


def _listify(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return [str(v) for v in value]


def resolve_inputs(cli: dict[str, Any], configs: Iterable[Path] = ()) -> tuple[EstimateInputs, dict[str, str]]:
    """Merge and validate. `cli` holds option values, None meaning 'not given'. Returns (inputs, provenance)."""
    from loradoctor.estimate.configs import read_configs

    values: dict[str, Any] = dict(DEFAULTS)
    source: dict[str, str] = {k: "default" for k in DEFAULTS}
    configs = list(configs)
    if configs:
        seen, from_files = read_configs(configs)
        label = ", ".join(f"{Path(p).name} ({fmt})" for p, fmt in seen) or "config"
        for key, value in from_files.items():
            values[key] = value
            source[key] = f"config: {label}"
    for key, value in cli.items():
        if key in INPUT_KEYS and value is not None:
            values[key] = value
            source[key] = "command line"
    model = values.get("model")
    if not model:
        raise UserError("no model: pass --model ID|PATH or a --config that names one (base_model / model_name_or_path)")
    arch = resolve_arch(str(model))
    if source.get("targets") == "default" and arch.fused:
        values["targets"] = ["qkv_proj"]  # PEFT's default for fused-attention models (Phi-3)
    source["model"] = source.get("model", "default") + f" -> {arch.source}"
    method = str(values["method"]).lower()
    quant = str(values.get("quant") or "none").lower()
    if quant in ("4bit", "bnb4", "int4"):
        quant = "nf4"
    if quant in ("int8", "8-bit", "llm.int8"):
        quant = "8bit"
    rank = int(values["rank"])
    alpha = values.get("alpha") if values.get("alpha") is not None else rank
    try:
        inputs = EstimateInputs(
            arch=arch,
            method=method,
            quant=quant,
            double_quant=bool(values["double_quant"]),
            rank=rank,
            alpha=int(alpha),
            dropout=float(values["dropout"]),
            targets=tuple(_listify(values["targets"])),
            modules_to_save=tuple(_listify(values["modules_to_save"])),
            batch=int(values["batch"]),
            seq_len=int(values["seq_len"]),
            grad_accum=int(values["grad_accum"]),
            gradient_checkpointing=bool(values["gradient_checkpointing"]),
            attn=str(values["attn"]).lower(),
            optim=str(values["optim"]),
            precision=str(values["precision"]).lower(),
            framework=str(values["framework"]).lower(),
            loss=None if values["loss"] is None else str(values["loss"]),
            liger_kernels=bool(values["liger_kernels"]),
            offload_checkpoints=None if values["offload_checkpoints"] is None else bool(values["offload_checkpoints"]),
            peft=str(values["peft"]).lower(),
            gpus=int(values["gpus"]),
            strategy=str(values["strategy"]),
            offload=str(values["offload"]).lower(),
            compute_dtype=None if values["compute_dtype"] is None else str(values["compute_dtype"]),
            vocab=None if values["vocab"] is None else int(values["vocab"]),
        )
    except (TypeError, ValueError) as exc:
        raise UserError(f"bad option value: {exc}") from None
    if method != "full" and not inputs.targets:
        raise UserError("no LoRA target modules: pass --targets q_proj,v_proj or all-linear")
    from loradoctor.estimate.memory import validate

    return validate(inputs), source


def assumed(source: dict[str, str], method: str = "lora") -> list[str]:
    """The inputs nobody set that change the estimate (say them: an estimate is only as good as its inputs)."""
    keys = ["seq_len", "batch", "gradient_checkpointing", "attn", "optim", "precision"]
    if method != "full":
        keys += ["rank", "targets"]
    return [k for k in keys if source.get(k) == "default"]


def gpu_budget(gpu: Optional[str], vram: Optional[str]):
    """The card to judge against from --gpu / --vram (None when neither is given)."""
    from loradoctor.estimate.fit import gpu_by_name, gpu_from_vram

    if gpu and vram:
        raise UserError("pass --gpu or --vram, not both")
    if gpu and gpu.strip().lower().split(":")[0] == "local":
        return local_gpu(gpu)
    if gpu:
        return gpu_by_name(gpu)
    if vram:
        return gpu_from_vram(vram)
    return None


def local_gpu(spec: str = "local"):
    """`--gpu local[:INDEX]`: the free memory of a GPU on this machine now (NVML, else nvidia-smi, via the env
    probe; other processes' memory is already taken). UserError when none is visible."""
    from loradoctor.estimate.fit import gpu_from_snapshot

    _, _, index_text = spec.partition(":")
    try:
        index = int(index_text) if index_text.strip() else 0
    except ValueError:
        raise UserError(f"--gpu {spec}: the index after 'local:' must be a number") from None
    from loradoctor.env.probes import nvidia

    section = nvidia.probe(timeout_s=10.0)
    gpu = gpu_from_snapshot({"nvidia": section}, index)
    if gpu is None:
        reason = section.get("error") if isinstance(section, dict) else None
        raise UserError(f"--gpu {spec}: no local GPU visible ({reason or 'no GPU listed'}); pass --gpu NAME or --vram SIZE")
    return gpu
