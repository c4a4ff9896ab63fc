"""Readers of the training configs people already have -> the estimate's option names.

Formats: an axolotl YAML, a LLaMA-Factory YAML, a transformers `TrainingArguments` / TRL `SFTConfig`
JSON, a PEFT `adapter_config.json`, or a folder holding some of these (a saved checkpoint). Each
reader returns a dict keyed like the command-line options (model, method, quant, double_quant, rank,
alpha, dropout, targets, modules_to_save, batch, seq_len, grad_accum, gradient_checkpointing, attn,
optim, precision); only keys the file actually sets are present, so the command line can override
them and defaults fill the rest.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from loradoctor.record import field, record
from typing import Any, Iterable, Optional

from loradoctor.errors import UserError


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return [str(v) for v in value]


def _truthy(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes", "auto")
    return bool(value)


def _precision(bf16: Any, fp16: Any, pure_bf16: Any = None) -> Optional[str]:
    if _truthy(pure_bf16):
        return "bf16-true"
    if bf16 is not None and _truthy(bf16):
        return "bf16"
    if fp16 is not None and _truthy(fp16):
        return "fp16"
    if bf16 is False and fp16 is False:
        return "fp32"
    return None


def _put(out: dict[str, Any], key: str, value: Any) -> None:
    if value is not None and value != [] and value != "":
        out[key] = value


# --- axolotl -------------------------------------------------------------------------------------

def read_axolotl(cfg: dict[str, Any]) -> dict[str, Any]:
    """axolotl YAML: base_model, adapter lora|qlora, load_in_4bit/8bit, lora_*, micro_batch_size,
    sequence_len, flash_attention / sdp_attention, optimizer, bf16/fp16. axolotl turns on bnb double
    quantization for 4-bit loads."""
    out: dict[str, Any] = {}
    _put(out, "model", cfg.get("base_model"))
    adapter = str(cfg.get("adapter") or "").lower()
    if adapter in ("lora", "qlora"):
        out["method"] = adapter
    elif not adapter:
        out["method"] = "full"
    if _truthy(cfg.get("load_in_4bit")) or adapter == "qlora":
        out["method"] = "qlora"
        out["quant"] = "nf4"
        out["double_quant"] = True
    elif _truthy(cfg.get("load_in_8bit")):
        out["quant"] = "8bit"
    _put(out, "rank", cfg.get("lora_r"))
    _put(out, "alpha", cfg.get("lora_alpha"))
    _put(out, "dropout", cfg.get("lora_dropout"))
    if _truthy(cfg.get("lora_target_linear")):
        out["targets"] = ["all-linear"]
    else:
        _put(out, "targets", _as_list(cfg.get("lora_target_modules")))
    _put(out, "modules_to_save", _as_list(cfg.get("lora_modules_to_save")))
    _put(out, "batch", cfg.get("micro_batch_size"))
    _put(out, "seq_len", cfg.get("sequence_len"))
    _put(out, "grad_accum", cfg.get("gradient_accumulation_steps"))
    if cfg.get("gradient_checkpointing") is not None:
        out["gradient_checkpointing"] = _truthy(cfg.get("gradient_checkpointing"))
    if _truthy(cfg.get("flash_attention")):
        out["attn"] = "flash_attention_2"
    elif _truthy(cfg.get("sdp_attention")):
        out["attn"] = "sdpa"
    elif cfg.get("eager_attention"):
        out["attn"] = "eager"
    _put(out, "optim", cfg.get("optimizer"))
    _put(out, "precision", _precision(cfg.get("bf16"), cfg.get("fp16")))
    out.update(_axolotl_kernels(cfg))
    return out


def _axolotl_kernels(cfg: dict[str, Any]) -> dict[str, Any]:
    """axolotl's loss / kernel plugins and its DeepSpeed / FSDP settings -> loss, liger_kernels, strategy, offload."""
    out: dict[str, Any] = {}
    plugins = " ".join(_as_list(cfg.get("plugins"))).lower()
    if _truthy(cfg.get("cut_cross_entropy")) or ("cut_cross_entropy" in plugins and cfg.get("cut_cross_entropy") is None):
        out["loss"] = "cce"
    elif _truthy(cfg.get("liger_fused_linear_cross_entropy")):
        out["loss"] = "liger-flce"
    elif _truthy(cfg.get("liger_cross_entropy")) or _truthy(cfg.get("unsloth_cross_entropy_loss")):
        out["loss"] = "fused-ce"
    if any(_truthy(cfg.get(k)) for k in ("liger_rms_norm", "liger_glu_activation", "liger_swiglu", "liger_rope")):
        out["liger_kernels"] = True
    out.update(_parallel_from(cfg.get("deepspeed"), cfg.get("fsdp"), cfg.get("fsdp_config")))
    return out


def _parallel_from(deepspeed: Any, fsdp: Any, fsdp_config: Any = None) -> dict[str, Any]:
    """A DeepSpeed config (a dict, or a file path whose name says the stage, as axolotl's and LLaMA-Factory's
    shipped ones do: zero2.json, zero3_bf16_cpuoffload_params.json) or an FSDP setting -> strategy / offload."""
    out: dict[str, Any] = {}
    if isinstance(deepspeed, dict):
        zero = deepspeed.get("zero_optimization") or {}
        stage = int(zero.get("stage") or 0) if isinstance(zero, dict) else 0
        if stage in (2, 3):
            out["strategy"] = f"zero{stage}"
            dev = lambda k: str((zero.get(k) or {}).get("device") or "none").lower()  # noqa: E731
            if dev("offload_param") in ("cpu", "nvme"):
                out["offload"] = "params"
            elif dev("offload_optimizer") in ("cpu", "nvme"):
                out["offload"] = "optimizer"
            # the ZeRO-2 gradient bucket: a number ('auto' is Hugging Face's hidden x hidden), doubled by overlap_comm
            bucket = zero.get("reduce_bucket_size")
            if isinstance(bucket, (int, float)) and not isinstance(bucket, bool) and 0 < bucket < 1e12:
                out["reduce_bucket_size"] = int(bucket)
            if isinstance(zero.get("overlap_comm"), bool):
                out["overlap_comm"] = zero["overlap_comm"]
    elif isinstance(deepspeed, str) and deepspeed:
        name = Path(deepspeed).name.lower()
        if "zero3" in name or "z3" in name:
            out["strategy"] = "zero3"
        elif "zero2" in name or "z2" in name:
            out["strategy"] = "zero2"
        if out and "offload" in name:
            out["offload"] = "params" if ("param" in name and out["strategy"] == "zero3") else "optimizer"
    if fsdp and not out:
        text = " ".join(_as_list(fsdp)).lower()
        conf = fsdp_config if isinstance(fsdp_config, dict) else {}
        text += " " + str(conf.get("fsdp_sharding_strategy") or conf.get("sharding_strategy") or "").lower()
        if "hybrid" in text:
            out["strategy"] = "fsdp-hybrid"
        elif "full_shard" in text or "fsdp" in text or text.strip():
            out["strategy"] = "fsdp"
        if "offload" in text or _truthy(conf.get("fsdp_offload_params") or conf.get("offload_params")):
            out["offload"] = "params"
    return out


# --- LLaMA-Factory -------------------------------------------------------------------------------

def read_llamafactory(cfg: dict[str, Any]) -> dict[str, Any]:
    """LLaMA-Factory YAML: model_name_or_path, finetuning_type, quantization_bit, lora_rank/alpha/dropout,
    lora_target, additional_target, per_device_train_batch_size, cutoff_len, flash_attn, optim,
    bf16/fp16/pure_bf16. LLaMA-Factory checkpoints gradients unless disable_gradient_checkpointing, uses
    lora_alpha = 2 x rank when unset, and double-quantizes 4-bit loads by default."""
    out: dict[str, Any] = {}
    _put(out, "model", cfg.get("model_name_or_path"))
    ftype = str(cfg.get("finetuning_type") or "lora").lower()
    out["method"] = "full" if ftype in ("full", "freeze") else "lora"
    qbit = cfg.get("quantization_bit")
    if qbit is not None and int(qbit) == 4:
        out["method"] = "qlora"
        out["quant"] = "nf4" if str(cfg.get("quantization_type", "nf4")).lower() != "fp4" else "fp4"
        out["double_quant"] = _truthy(cfg.get("double_quantization", True))
    elif qbit is not None and int(qbit) == 8:
        out["quant"] = "8bit"
    elif qbit is not None:  # 2/3/5/6 bits are HQQ / EETQ / AQLM back-ends: another memory layout
        raise ConfigValueError(f"quantization_bit: {qbit} is not modelled (bitsandbytes 4 or 8 bit only)")
    rank = cfg.get("lora_rank")
    _put(out, "rank", rank)
    alpha = cfg.get("lora_alpha")
    if alpha is None and rank is not None:
        alpha = 2 * int(rank)
    _put(out, "alpha", alpha)
    _put(out, "dropout", cfg.get("lora_dropout"))
    target = _as_list(cfg.get("lora_target"))
    if target == ["all"]:
        target = ["all-linear"]
    _put(out, "targets", target)
    _put(out, "modules_to_save", _as_list(cfg.get("additional_target")))
    _put(out, "batch", cfg.get("per_device_train_batch_size"))
    _put(out, "seq_len", cfg.get("cutoff_len"))
    _put(out, "grad_accum", cfg.get("gradient_accumulation_steps"))
    out["gradient_checkpointing"] = not _truthy(cfg.get("disable_gradient_checkpointing", False))
    fa = str(cfg.get("flash_attn") or "auto").lower()
    out["attn"] = {"fa2": "flash_attention_2", "sdpa": "sdpa", "disabled": "eager"}.get(fa, "sdpa")
    _put(out, "optim", cfg.get("optim"))
    _put(out, "precision", _precision(cfg.get("bf16"), cfg.get("fp16"), cfg.get("pure_bf16")))
    if _truthy(cfg.get("enable_liger_kernel")):
        out["liger_kernels"] = True
        out["loss"] = "liger-flce"
    if _truthy(cfg.get("use_unsloth")):
        out["framework"] = "unsloth"
    if _truthy(cfg.get("use_unsloth_gc")):
        out["gradient_checkpointing"] = True
        out["offload_checkpoints"] = True
    if cfg.get("use_dora") is not None and _truthy(cfg.get("use_dora")):
        out["peft"] = "dora"
    out.update(_parallel_from(cfg.get("deepspeed"), None))
    return out


# --- transformers / PEFT JSON --------------------------------------------------------------------

def read_training_args(cfg: dict[str, Any]) -> dict[str, Any]:
    """TrainingArguments / SFTConfig JSON (training_args.to_json_string(), or a hand-written dict)."""
    out: dict[str, Any] = {}
    _put(out, "model", cfg.get("model_name_or_path"))
    _put(out, "batch", cfg.get("per_device_train_batch_size"))
    _put(out, "grad_accum", cfg.get("gradient_accumulation_steps"))
    _put(out, "seq_len", cfg.get("max_length") or cfg.get("max_seq_length"))
    if cfg.get("gradient_checkpointing") is not None:
        out["gradient_checkpointing"] = _truthy(cfg.get("gradient_checkpointing"))
    _put(out, "optim", cfg.get("optim"))
    _put(out, "precision", _precision(cfg.get("bf16"), cfg.get("fp16")))
    model_kwargs = cfg.get("model_init_kwargs") or {}
    if isinstance(model_kwargs, dict) and model_kwargs.get("attn_implementation"):
        out["attn"] = model_kwargs["attn_implementation"]
    if _truthy(cfg.get("use_liger_kernel")) or _truthy(cfg.get("use_liger")):
        out["liger_kernels"] = True
        out["loss"] = "liger-flce"
    out.update(_parallel_from(cfg.get("deepspeed"), cfg.get("fsdp"), cfg.get("fsdp_config")))
    return out


def read_deepspeed(cfg: dict[str, Any]) -> dict[str, Any]:
    """A DeepSpeed JSON (zero_optimization.stage, offload_optimizer / offload_param devices)."""
    return _parallel_from(cfg, None)


def read_accelerate(cfg: dict[str, Any]) -> dict[str, Any]:
    """An `accelerate config` YAML: distributed_type, num_processes, deepspeed_config / fsdp_config."""
    out: dict[str, Any] = {}
    kind = str(cfg.get("distributed_type") or "").upper()
    if cfg.get("num_processes") is not None:
        out["gpus"] = int(cfg["num_processes"])
    if kind == "DEEPSPEED":
        ds = cfg.get("deepspeed_config") or {}
        stage = int(ds.get("zero_stage") or 0)
        if stage in (2, 3):
            out["strategy"] = f"zero{stage}"
            if str(ds.get("offload_param_device") or "none").lower() in ("cpu", "nvme"):
                out["offload"] = "params"
            elif str(ds.get("offload_optimizer_device") or "none").lower() in ("cpu", "nvme"):
                out["offload"] = "optimizer"
    elif kind == "FSDP":
        conf = cfg.get("fsdp_config") or {}
        strategy = str(conf.get("fsdp_sharding_strategy") or "FULL_SHARD").upper()
        out["strategy"] = "fsdp-hybrid" if "HYBRID" in strategy else "fsdp"
        if _truthy(conf.get("fsdp_offload_params")):
            out["offload"] = "params"
    elif kind in ("MULTI_GPU",):
        out["strategy"] = "ddp"
    mp = str(cfg.get("mixed_precision") or "").lower()
    if mp in ("bf16", "fp16"):
        out["precision"] = mp
    return out


def read_torchtune(cfg: dict[str, Any]) -> dict[str, Any]:
    """A torchtune recipe config: its loss component (CEWithChunkedOutputLoss -> chunked:num_output_chunks),
    batch size, checkpointing / offloading, compile, dtype. The model comes from --model (torchtune names a
    builder, not a checkpoint)."""
    out: dict[str, Any] = {"framework": "torchtune"}
    loss = cfg.get("loss") if isinstance(cfg.get("loss"), dict) else {}
    component = str(loss.get("_component_") or "")
    if "Chunked" in component:
        out["loss"] = f"chunked:{int(loss.get('num_output_chunks') or 8)}"
    elif "FusedLinear" in component or "liger" in component.lower():
        out["loss"] = "liger-flce"
    elif component:
        out["loss"] = "standard"
    _put(out, "batch", cfg.get("batch_size"))
    _put(out, "grad_accum", cfg.get("gradient_accumulation_steps"))
    if cfg.get("enable_activation_checkpointing") is not None:
        out["gradient_checkpointing"] = _truthy(cfg.get("enable_activation_checkpointing"))
    if _truthy(cfg.get("enable_activation_offloading")):
        out["offload_checkpoints"] = True
    if str(cfg.get("dtype") or "").lower() in ("bf16", "bfloat16"):
        out["precision"] = "bf16-true"
    model = cfg.get("model") if isinstance(cfg.get("model"), dict) else {}
    if model.get("lora_rank") is not None:
        out["rank"] = model["lora_rank"]
        _put(out, "alpha", model.get("lora_alpha"))
        targets = _as_list(model.get("lora_attn_modules"))
        if _truthy(model.get("apply_lora_to_mlp")):
            targets += ["gate_proj", "up_proj", "down_proj"]
        _put(out, "targets", targets)
        out["method"] = "qlora" if "qlora" in str(model.get("_component_") or "") else "lora"
    elif model:
        out["method"] = "full"
    return out


def read_adapter_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """PEFT adapter_config.json: r, lora_alpha, lora_dropout, target_modules, modules_to_save, base model."""
    out: dict[str, Any] = {}
    peft_type = str(cfg.get("peft_type") or "LORA").upper()
    if peft_type not in ("LORA", "ADALORA"):
        raise UserError(f"adapter_config.json: peft_type {peft_type} is not modelled (LoRA only)")
    out["method"] = "lora"
    _put(out, "model", cfg.get("base_model_name_or_path"))
    _put(out, "rank", cfg.get("r"))
    _put(out, "alpha", cfg.get("lora_alpha"))
    _put(out, "dropout", cfg.get("lora_dropout"))
    targets = cfg.get("target_modules")
    if targets == "all-linear":
        targets = ["all-linear"]
    _put(out, "targets", _as_list(targets))
    _put(out, "modules_to_save", _as_list(cfg.get("modules_to_save")))
    return out


# --- dispatch ------------------------------------------------------------------------------------

def _load(path: Path) -> Any:
    """The file's data through the safe reader (size, encoding and alias limits; one line naming the file)."""
    from loradoctor.safe_yaml import load_config_file

    return load_config_file(path)


def detect_format(data: dict[str, Any]) -> Optional[str]:
    """'axolotl' | 'llamafactory' | 'training_args' | 'adapter_config' | None."""
    keys = set(data)
    if "zero_optimization" in keys:
        return "deepspeed"
    if keys & {"distributed_type", "compute_environment"}:
        return "accelerate"
    if isinstance(data.get("loss"), dict) and "_component_" in data["loss"]:
        return "torchtune"
    if "peft_type" in keys or ({"r", "target_modules"} <= keys):
        return "adapter_config"
    if keys & {"finetuning_type", "cutoff_len", "lora_target", "quantization_bit", "template"}:
        return "llamafactory"
    if keys & {"base_model", "micro_batch_size", "sequence_len", "adapter", "lora_target_modules", "datasets"}:
        return "axolotl"
    if keys & {"per_device_train_batch_size", "gradient_accumulation_steps", "output_dir", "optim"}:
        return "training_args"
    return None


# --- values: checked before a reader uses them --------------------------------------------------

# The keys each format's reader uses: file key -> (option, kind, low, high). A value of the wrong type or
# out of bounds is refused with one line naming the file, the key and the value; a reader never sees
# it. The option names also give the advice its spelling in the framework's own words (FIX_SPELLING).
# kinds: int (a whole number), number (finite), fraction ([low, high)), text, names (a string or a list
# of strings), flag (true/false; strings such as 'auto' are the framework's business), mapping.
MAX_COUNT = 1_000_000  # batch, accumulation: more is a typo
MAX_TOKENS = 10_000_000  # sequence length
MAX_RANK = 100_000
FIELDS: dict[str, dict[str, tuple[str, str, float, float]]] = {
    "axolotl": {
        "base_model": ("model", "text", 0, 0), "adapter": ("method", "text", 0, 0),
        "load_in_4bit": ("quant", "flag", 0, 0), "load_in_8bit": ("quant", "flag", 0, 0),
        "lora_r": ("rank", "int", 1, MAX_RANK), "lora_alpha": ("alpha", "number", 0, 1e7),
        "lora_dropout": ("dropout", "fraction", 0, 1), "lora_target_linear": ("targets", "flag", 0, 0),
        "lora_target_modules": ("targets", "names", 0, 0), "lora_modules_to_save": ("modules_to_save", "names", 0, 0),
        "micro_batch_size": ("batch", "int", 1, MAX_COUNT), "sequence_len": ("seq_len", "int", 1, MAX_TOKENS),
        "gradient_accumulation_steps": ("grad_accum", "int", 1, MAX_COUNT),
        "gradient_checkpointing": ("gradient_checkpointing", "flag", 0, 0),
        "flash_attention": ("attn", "flag", 0, 0), "sdp_attention": ("attn", "flag", 0, 0),
        "eager_attention": ("attn", "flag", 0, 0), "optimizer": ("optim", "text", 0, 0),
        "bf16": ("precision", "flag", 0, 0), "fp16": ("precision", "flag", 0, 0),
    },
    "llamafactory": {
        "model_name_or_path": ("model", "text", 0, 0), "finetuning_type": ("method", "text", 0, 0),
        "quantization_bit": ("quant", "int", 1, 8), "quantization_type": ("quant", "text", 0, 0),
        "double_quantization": ("double_quant", "flag", 0, 0),
        "lora_rank": ("rank", "int", 1, MAX_RANK), "lora_alpha": ("alpha", "number", 0, 1e7),
        "lora_dropout": ("dropout", "fraction", 0, 1), "lora_target": ("targets", "names", 0, 0),
        "additional_target": ("modules_to_save", "names", 0, 0),
        "per_device_train_batch_size": ("batch", "int", 1, MAX_COUNT), "cutoff_len": ("seq_len", "int", 1, MAX_TOKENS),
        "gradient_accumulation_steps": ("grad_accum", "int", 1, MAX_COUNT),
        "disable_gradient_checkpointing": ("gradient_checkpointing", "flag", 0, 0),
        "flash_attn": ("attn", "text", 0, 0), "optim": ("optim", "text", 0, 0),
        "bf16": ("precision", "flag", 0, 0), "fp16": ("precision", "flag", 0, 0), "pure_bf16": ("precision", "flag", 0, 0),
    },
    "training_args": {
        "model_name_or_path": ("model", "text", 0, 0),
        "per_device_train_batch_size": ("batch", "int", 1, MAX_COUNT),
        "gradient_accumulation_steps": ("grad_accum", "int", 1, MAX_COUNT),
        "max_length": ("seq_len", "int", 1, MAX_TOKENS), "max_seq_length": ("seq_len", "int", 1, MAX_TOKENS),
        "gradient_checkpointing": ("gradient_checkpointing", "flag", 0, 0), "optim": ("optim", "text", 0, 0),
        "bf16": ("precision", "flag", 0, 0), "fp16": ("precision", "flag", 0, 0),
        "model_init_kwargs": ("attn", "mapping", 0, 0),
    },
    "adapter_config": {
        "peft_type": ("method", "text", 0, 0), "base_model_name_or_path": ("model", "text", 0, 0),
        "r": ("rank", "int", 1, MAX_RANK), "lora_alpha": ("alpha", "number", 0, 1e7),
        "lora_dropout": ("dropout", "fraction", 0, 1), "target_modules": ("targets", "names", 0, 0),
        "modules_to_save": ("modules_to_save", "names", 0, 0),
    },
}
_NAME_CHARS = 200  # a value quoted in an error is cut to this


class BadConfigValue(UserError):
    """A recognised config with a value that cannot be used (never skipped, even inside a folder)."""


class ConfigValueError(ValueError):
    """A value in a config file that the estimate cannot use; `str()` is the user's one line without the file."""


def _shown(value: Any) -> str:
    text = repr(value) if not isinstance(value, (int, float)) or isinstance(value, bool) else (
        str(value) if len(str(value)) <= 40 else f"a {len(str(value))}-digit number")
    return text if len(text) <= _NAME_CHARS else text[: _NAME_CHARS - 3] + "..."


def _bounds(low: float, high: float) -> str:
    return f"{low:,.0f} to {high:,.0f}"


def check_value(key: str, value: Any, kind: str, low: float = 0, high: float = 0) -> Any:
    """The value as the reader expects it (whole numbers as int), or ConfigValueError naming the key."""
    if kind == "int":
        number: Any = value
        if isinstance(value, str) and value.strip().lstrip("+").isdigit() and len(value.strip()) <= 20:
            number = int(value.strip())
        elif isinstance(value, float) and math.isfinite(value) and value.is_integer():
            number = int(value)
        if isinstance(number, bool) or not isinstance(number, int):
            raise ConfigValueError(f"{key}: {_shown(value)} is not a whole number (expected {_bounds(low, high)})")
        if not low <= number <= high:
            raise ConfigValueError(f"{key}: {_shown(value)} is out of range (expected {_bounds(low, high)})")
        return number
    if kind in ("number", "fraction"):
        number = value
        if isinstance(value, str):
            try:
                number = float(value) if len(value) <= 40 else None
            except ValueError:
                number = None
        if isinstance(number, bool) or not isinstance(number, (int, float)) or not math.isfinite(number):
            raise ConfigValueError(f"{key}: {_shown(value)} is not a finite number")
        inside = low <= number < high if kind == "fraction" else low <= number <= high
        if not inside:
            span = f"at least {low:g} and below {high:g}" if kind == "fraction" else f"{low:g} to {high:g}"
            raise ConfigValueError(f"{key}: {_shown(value)} is out of range (expected {span})")
        return number
    if kind == "text":
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise ConfigValueError(f"{key}: {_shown(value)} should be a single name, not a {type(value).__name__}")
        return value
    if kind == "names":
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not all(isinstance(v, str) for v in items):
            raise ConfigValueError(f"{key}: {_shown(value)} should be a name or a list of names")
        return value
    if kind == "flag":
        if isinstance(value, (list, dict)) or (isinstance(value, float) and not math.isfinite(value)):
            raise ConfigValueError(f"{key}: {_shown(value)} should be true or false")
        return value
    if kind == "mapping":
        if not isinstance(value, dict):
            raise ConfigValueError(f"{key}: {_shown(value)} should be a mapping")
        return value
    raise AssertionError(kind)  # pragma: no cover - FIELDS uses the kinds above


def checked(fmt: str, data: dict[str, Any]) -> dict[str, Any]:
    """A copy of the file's settings with every key the reader uses checked and normalised."""
    out = dict(data)
    for key, (_, kind, low, high) in FIELDS.get(fmt, {}).items():
        if out.get(key) is not None:
            out[key] = check_value(key, out[key], kind, low, high)
    return out


READERS = {
    "axolotl": read_axolotl,
    "llamafactory": read_llamafactory,
    "training_args": read_training_args,
    "adapter_config": read_adapter_config,
    "deepspeed": read_deepspeed,
    "accelerate": read_accelerate,
    "torchtune": read_torchtune,
}


def read_config(path: Path) -> tuple[str, dict[str, Any]]:
    """(format, options) for one file. UserError for unreadable or unknown files."""
    data = _load(path)
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a mapping of settings")
    fmt = detect_format(data)
    if fmt is None:
        raise UserError(f"{path}: not an axolotl / LLaMA-Factory YAML, TrainingArguments JSON or adapter_config.json")
    try:
        return fmt, READERS[fmt](checked(fmt, data))
    except ConfigValueError as exc:
        raise BadConfigValue(f"{path}: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise UserError(f"{path}: bad value in a {fmt} config: {str(exc)[:_NAME_CHARS]}") from None


CONFIG_SUFFIXES = (".yaml", ".yml", ".json")
# config.json is the model's own config (read by arch.py), not a training config
SKIP_NAMES = ("config.json", "tokenizer_config.json", "generation_config.json", "special_tokens_map.json",
              "tokenizer.json", "trainer_state.json")


@record
class ConfigSettings:
    """What the config files say, merged in order (a later file wins), with where each value came from
    and every disagreement between files (the person should know which file won)."""

    files: list[tuple[str, str]] = field(default_factory=list)  # (path, format) in reading order
    values: dict[str, Any] = field(default_factory=dict)
    origin: dict[str, tuple[str, str]] = field(default_factory=dict)  # option -> (path, format) that set it
    conflicts: list[str] = field(default_factory=list)

    def take(self, path: str, fmt: str, opts: dict[str, Any]) -> None:
        self.files.append((path, fmt))
        for key, value in opts.items():
            if key in self.values and self.values[key] != value and self.origin[key][0] != path:
                before = self.origin[key][0]
                self.conflicts.append(f"{key}: {_shown(self.values[key])} in {Path(before).name}, {_shown(value)} in "
                                      f"{Path(path).name}; {Path(path).name} wins (the later --config)")
            self.values[key] = value
            self.origin[key] = (path, fmt)


def read_config_settings(paths: Iterable[Path]) -> ConfigSettings:
    """Read several files / folders in order (later files win). A folder contributes its training configs;
    its config.json makes the folder the model."""
    out = ConfigSettings()
    for p in paths:
        p = Path(p).expanduser()
        if p.is_dir():
            files = sorted(f for f in p.iterdir() if f.suffix.lower() in CONFIG_SUFFIXES and f.name not in SKIP_NAMES)
            found = False
            for f in files:
                try:
                    fmt, opts = read_config(f)
                except BadConfigValue:
                    raise
                except UserError:
                    continue  # other files in a checkpoint folder
                out.take(str(f), fmt, opts)
                found = True
            if (p / "config.json").is_file():
                if "model" not in out.values:
                    out.values["model"] = str(p)
                    out.origin["model"] = (str(p), "model folder")
                found = True
            if not found:
                raise UserError(f"{p}: no training config found (axolotl/LLaMA-Factory YAML, TrainingArguments JSON, adapter_config.json)")
        elif p.exists():
            fmt, opts = read_config(p)
            out.take(str(p), fmt, opts)
        else:
            raise UserError(f"--config {p}: no such file or folder")
    return out


def read_configs(paths: Iterable[Path]) -> tuple[list[tuple[str, str]], dict[str, Any]]:
    """([(path, format)], merged options): `read_config_settings` without the sources."""
    settings = read_config_settings(paths)
    return settings.files, settings.values


# --- fixes in the framework's own words ------------------------------------------------------------

# command-line change -> the same change as a line of the config format. Keys: (flag, value) for a
# value with its own spelling, (flag, None) for any value ({v} is the value). A change with no spelling
# in a format (double quant in axolotl, which always double-quantizes 4-bit loads) keeps its flag.
FIX_SPELLING: dict[str, dict[tuple[str, Optional[str]], str]] = {
    "axolotl": {
        ("--gradient-checkpointing", None): "gradient_checkpointing: true",
        ("--attn", "flash_attention_2"): "flash_attention: true", ("--attn", "sdpa"): "sdp_attention: true",
        ("--attn", "eager"): "flash_attention: false",
        ("--optim", None): "optimizer: {v}", ("--batch", None): "micro_batch_size: {v}",
        ("--grad-accum", None): "gradient_accumulation_steps: {v}", ("--seq-len", None): "sequence_len: {v}",
        ("--method", "lora"): "adapter: lora", ("--method", "qlora"): "adapter: qlora", ("--quant", "nf4"): "load_in_4bit: true",
        ("--targets", "all-linear"): "lora_target_linear: true", ("--targets", None): "lora_target_modules: [{v}]",
        ("--modules-to-save", ""): "lora_modules_to_save: []",
        ("--precision", "fp16"): "bf16: false, fp16: true", ("--precision", "bf16"): "bf16: true",
    },
    "llamafactory": {
        ("--gradient-checkpointing", None): "disable_gradient_checkpointing: false",
        ("--attn", "flash_attention_2"): "flash_attn: fa2", ("--attn", "sdpa"): "flash_attn: sdpa",
        ("--attn", "eager"): "flash_attn: disabled",
        ("--optim", None): "optim: {v}", ("--batch", None): "per_device_train_batch_size: {v}",
        ("--grad-accum", None): "gradient_accumulation_steps: {v}", ("--seq-len", None): "cutoff_len: {v}",
        ("--method", "lora"): "finetuning_type: lora", ("--method", "qlora"): "quantization_bit: 4",
        ("--quant", "nf4"): "quantization_bit: 4", ("--double-quant", None): "double_quantization: true",
        ("--targets", "all-linear"): "lora_target: all", ("--targets", None): "lora_target: {v}",
        ("--modules-to-save", ""): "additional_target: null",
        ("--precision", "fp16"): "bf16: false, fp16: true", ("--precision", "bf16"): "bf16: true",
        ("--precision", "fp16-true"): "pure_bf16: false, fp16: true",
    },
    "training_args": {
        ("--gradient-checkpointing", None): '"gradient_checkpointing": true',
        ("--attn", None): '"model_init_kwargs": {{"attn_implementation": "{v}"}}',
        ("--optim", None): '"optim": "{v}"', ("--batch", None): '"per_device_train_batch_size": {v}',
        ("--grad-accum", None): '"gradient_accumulation_steps": {v}', ("--seq-len", None): '"max_length": {v}',
        ("--precision", "fp16"): '"bf16": false, "fp16": true', ("--precision", "bf16"): '"bf16": true',
    },
    "adapter_config": {
        ("--targets", "all-linear"): '"target_modules": "all-linear"', ("--targets", None): '"target_modules": {vl}',
        ("--modules-to-save", ""): '"modules_to_save": null',
    },
}
# the option (EstimateInputs field) each flag changes: which config set it decides the spelling
FLAG_OPTION = {"--gradient-checkpointing": "gradient_checkpointing", "--attn": "attn", "--optim": "optim",
               "--batch": "batch", "--grad-accum": "grad_accum", "--seq-len": "seq_len", "--method": "method",
               "--quant": "quant", "--double-quant": "double_quant", "--targets": "targets",
               "--modules-to-save": "modules_to_save", "--precision": "precision"}


def _flag_values(option: str) -> list[tuple[str, Optional[str]]]:
    import shlex

    try:
        words = shlex.split(option)
    except ValueError:
        return []
    out: list[tuple[str, Optional[str]]] = []
    for i, word in enumerate(words):
        if word.startswith("--"):
            value = words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("--") else None
            out.append((word, value))
    return out


def spell_fix(option: str, fmt_for: "dict[str, str]", default_fmt: str) -> Optional[tuple[str, set[str]]]:
    """A command-line change ('--batch 1 --grad-accum 8') as config lines ('micro_batch_size: 1,
    gradient_accumulation_steps: 8') and the formats used: each flag in the format of the config that set
    that option (`fmt_for`: option -> format), else `default_fmt`. None when no flag has a spelling there."""
    parts: list[str] = []
    used: set[str] = set()
    spelled = False
    for flag, value in _flag_values(option):
        fmt = fmt_for.get(FLAG_OPTION.get(flag, ""), default_fmt)
        table = FIX_SPELLING.get(fmt, {})
        line = table.get((flag, value)) or table.get((flag, None))
        if line is None and fmt != default_fmt:
            fmt, table = default_fmt, FIX_SPELLING.get(default_fmt, {})
            line = table.get((flag, value)) or table.get((flag, None))
        if line is None:
            if flag == "--double-quant" and "axolotl" in (fmt, default_fmt):
                continue  # axolotl double-quantizes 4-bit loads itself
            parts.append(f"{flag} {value}" if value is not None else flag)
            continue
        spelled = True
        used.add(fmt)
        names = [v.strip() for v in (value or "").split(",") if v.strip()]
        shown = ", ".join(names) if flag == "--targets" else value
        text = line.format(v=shown, vl=json.dumps(names))
        if text not in parts:
            parts.append(text)
    return (", ".join(parts), used) if spelled else None
