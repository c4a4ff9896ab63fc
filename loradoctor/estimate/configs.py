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
from pathlib import Path
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
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        if path.suffix.lower() == ".json":
            return json.loads(text)
        import yaml

        return yaml.safe_load(text)
    except Exception as exc:  # yaml/json errors: one line for the user
        raise UserError(f"{path}: not valid {'JSON' if path.suffix.lower() == '.json' else 'YAML'}: "
                        f"{str(exc).splitlines()[0]}") from None


def detect_format(data: dict[str, Any]) -> Optional[str]:
    """'axolotl' | 'llamafactory' | 'training_args' | 'adapter_config' | None."""
    keys = set(data)
    if "peft_type" in keys or ({"r", "target_modules"} <= keys):
        return "adapter_config"
    if keys & {"finetuning_type", "cutoff_len", "lora_target", "quantization_bit", "template"}:
        return "llamafactory"
    if keys & {"base_model", "micro_batch_size", "sequence_len", "adapter", "lora_target_modules", "datasets"}:
        return "axolotl"
    if keys & {"per_device_train_batch_size", "gradient_accumulation_steps", "output_dir", "optim"}:
        return "training_args"
    return None


READERS = {
    "axolotl": read_axolotl,
    "llamafactory": read_llamafactory,
    "training_args": read_training_args,
    "adapter_config": read_adapter_config,
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
        return fmt, READERS[fmt](data)
    except (TypeError, ValueError) as exc:
        raise UserError(f"{path}: bad value in a {fmt} config: {exc}") from None


CONFIG_SUFFIXES = (".yaml", ".yml", ".json")
# config.json is the model's own config (read by arch.py), not a training config
SKIP_NAMES = ("config.json", "tokenizer_config.json", "generation_config.json", "special_tokens_map.json",
              "tokenizer.json", "trainer_state.json")


def read_configs(paths: Iterable[Path]) -> tuple[list[tuple[str, str]], dict[str, Any]]:
    """Merge several files / folders in order (later files win). Returns ([(path, format)], options).
    A folder contributes its training configs; its config.json makes the folder the model."""
    merged: dict[str, Any] = {}
    seen: list[tuple[str, str]] = []
    for p in paths:
        p = Path(p).expanduser()
        if p.is_dir():
            files = sorted(f for f in p.iterdir() if f.suffix.lower() in CONFIG_SUFFIXES and f.name not in SKIP_NAMES)
            found = False
            for f in files:
                try:
                    fmt, opts = read_config(f)
                except UserError:
                    continue  # other files in a checkpoint folder
                seen.append((str(f), fmt))
                merged.update(opts)
                found = True
            if (p / "config.json").is_file():
                merged.setdefault("model", str(p))
                found = True
            if not found:
                raise UserError(f"{p}: no training config found (axolotl/LLaMA-Factory YAML, TrainingArguments JSON, adapter_config.json)")
        elif p.is_file():
            fmt, opts = read_config(p)
            seen.append((str(p), fmt))
            merged.update(opts)
        else:
            raise UserError(f"--config {p}: no such file or folder")
    return seen, merged
