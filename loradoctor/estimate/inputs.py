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
    "ia3_feedforward": None,
    "keep_logits": False,
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


class Provenance(dict):
    """option -> where its value came from ('command line', 'config: FILE (format)', 'default', or
    'default: why'); a dict, so it is the JSON document's `provenance` as it stands. Also carries
    what the person should read about the inputs: disagreements between config files (`conflicts`),
    what was inferred from a combination (`notes`), and the config files read (`configs`)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.conflicts: list[str] = []
        self.notes: list[str] = []
        self.configs: list[tuple[str, str]] = []  # (path, format)
        self.origin: dict[str, tuple[str, str]] = {}  # option -> (path, format) of the config that set it


# option -> (low, high) for whole numbers from the command line (config values are checked by configs.py)
CLI_BOUNDS: dict[str, tuple[int, int]] = {"rank": (1, 100_000), "alpha": (0, 10_000_000), "batch": (1, 1_000_000),
                                         "seq_len": (1, 10_000_000), "grad_accum": (1, 1_000_000)}


def default_gradient_checkpointing(method: str, quant: str, framework: str,
                                   config_formats: Iterable[str] = ()) -> tuple[bool, str]:
    """What the framework does when nobody sets gradient checkpointing, and why (said in the output).
    PEFT's prepare_model_for_kbit_training turns it on unless told otherwise; axolotl and TRL pass their own
    (unset: off) gradient_checkpointing setting to it."""
    formats = set(config_formats)
    if framework != "hf":
        return False, f"off, as {framework}"
    if method != "qlora" and quant == "none":
        return False, "off, as TrainingArguments"
    if "axolotl" in formats:
        return False, "off, as axolotl passes its unset gradient_checkpointing to prepare_model_for_kbit_training"
    if "training_args" in formats:
        return False, "off, as TrainingArguments (TRL passes it to prepare_model_for_kbit_training)"
    return True, "on, as PEFT's prepare_model_for_kbit_training turns it on for a quantized base"


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def _combination(values: dict[str, Any], source: Provenance) -> None:
    """Method and quantization that contradict each other are refused; a combination that is another
    method under a different name is stated."""
    method = str(values["method"]).lower()
    quant = str(values.get("quant") or "none").lower()
    said = {k: ("the command line" if source.get(k) == "command line" else str(source.get(k, "default")))
            for k in ("method", "quant")}
    if method == "qlora" and quant == "none" and source.get("quant") != "default":
        raise UserError(f"--method qlora loads the base in 4 bit, but --quant none (from {said['quant']}) says unquantized: "
                        "use --method qlora --quant nf4 (or fp4), or --method lora for a bf16/fp16 base")
    if method == "full" and quant != "none" and source.get("quant") != "default":
        raise UserError(f"--method full trains every weight, which a {quant} base cannot do (from {said['quant']}): "
                        "use --method qlora / lora, or --quant none")
    if method == "lora" and quant in ("nf4", "fp4"):
        values["method"] = "qlora"
        source["method"] = f"{source.get('method', 'default')}; lora on a {quant} base is QLoRA"
        source.notes.append(f"LoRA on a {quant} (4-bit) base is QLoRA: estimated as --method qlora --quant {quant}")


def resolve_inputs(cli: dict[str, Any], configs: Iterable[Path] = ()) -> tuple[EstimateInputs, Provenance]:
    """Merge and validate. `cli` holds option values, None meaning 'not given'. Returns (inputs, provenance)."""
    from loradoctor.estimate.configs import read_config_settings

    values: dict[str, Any] = dict(DEFAULTS)
    source = Provenance({k: "default" for k in DEFAULTS})
    configs = list(configs)
    if configs:
        settings = read_config_settings(configs)
        source.configs, source.conflicts = list(settings.files), list(settings.conflicts)
        for key, value in settings.values.items():
            path, fmt = settings.origin.get(key, ("config", "config"))
            values[key] = value
            source[key] = f"config: {Path(path).name} ({fmt})"
            source.origin[key] = (path, fmt)
    for key, value in cli.items():
        if key in INPUT_KEYS and value is not None:
            if key in CLI_BOUNDS and isinstance(value, int) and not CLI_BOUNDS[key][0] <= value <= CLI_BOUNDS[key][1]:
                low, high = CLI_BOUNDS[key]
                raise UserError(f"{_flag(key)} {value}: expected {low:,} to {high:,}")
            values[key] = value
            source[key] = "command line"
            source.origin.pop(key, None)
    model = values.get("model")
    if not model:
        raise UserError("no model: pass --model ID|PATH or a --config that names one (base_model / model_name_or_path)")
    arch = resolve_arch(str(model))
    if source.get("targets") == "default" and arch.fused:
        values["targets"] = ["qkv_proj"]  # PEFT's default for fused-attention models (Phi-3)
    source["model"] = source.get("model", "default") + f" -> {arch.source}"
    quant = str(values.get("quant") or "none").lower()
    if quant in ("4bit", "bnb4", "int4"):
        quant = "nf4"
    if quant in ("int8", "8-bit", "llm.int8"):
        quant = "8bit"
    values["quant"] = quant
    _combination(values, source)
    method = str(values["method"]).lower()
    if source.get("gradient_checkpointing") == "default":
        on, why = default_gradient_checkpointing(method, quant, str(values["framework"]).lower(),
                                                 [fmt for _, fmt in source.configs])
        values["gradient_checkpointing"] = on
        source["gradient_checkpointing"] = f"default: {why}"
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
            ia3_feedforward=None if values["ia3_feedforward"] is None else tuple(_listify(values["ia3_feedforward"])),
            keep_logits=bool(values["keep_logits"]),
            gpus=int(values["gpus"]),
            strategy=str(values["strategy"]),
            offload=str(values["offload"]).lower(),
            compute_dtype=None if values["compute_dtype"] is None else str(values["compute_dtype"]),
            vocab=None if values["vocab"] is None else int(values["vocab"]),
            # only a DeepSpeed config sets these (no option: the defaults are Hugging Face's 'auto' and DeepSpeed's own)
            reduce_bucket_size=None if values.get("reduce_bucket_size") is None else int(values["reduce_bucket_size"]),
            overlap_comm=None if values.get("overlap_comm") is None else bool(values["overlap_comm"]),
        )
    except (TypeError, ValueError, OverflowError) as exc:
        raise UserError(f"bad option value: {str(exc)[:200]}") from None
    if method != "full" and not inputs.targets:
        raise UserError("no LoRA target modules: pass --targets q_proj,v_proj or all-linear")
    from loradoctor.estimate.memory import validate

    return validate(inputs), source


def assumed(source: dict[str, str], method: str = "lora") -> list[str]:
    """The inputs nobody set that change the estimate (say them: an estimate is only as good as its inputs)."""
    keys = ["seq_len", "batch", "gradient_checkpointing", "attn", "optim", "precision"]
    if method != "full":
        keys += ["rank", "targets"]
    out = []
    for k in keys:
        said = str(source.get(k, ""))
        if said == "default":
            out.append(k)
        elif said.startswith("default: "):
            out.append(f"{k} ({said[len('default: '):]})")
    return out


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
    text = index_text.strip()
    if text and not text.isdigit():
        raise UserError(f"--gpu {spec}: the index after 'local:' must be 0 or more (the index nvidia-smi shows)")
    index = int(text) if text else 0
    from loradoctor.env.probes import nvidia

    section = nvidia.probe(timeout_s=10.0)
    listed = [g for g in (section.get("gpus") or []) if isinstance(g, dict)] if isinstance(section, dict) else []
    if text and listed and not any(g.get("index") == index for g in listed):
        have = ", ".join(str(g.get("index")) for g in listed)
        raise UserError(f"--gpu {spec}: this machine has GPU {have}")
    gpu = gpu_from_snapshot({"nvidia": section}, index)
    if gpu is None:
        reason = section.get("error") if isinstance(section, dict) else None
        raise UserError(f"--gpu {spec}: no local GPU visible ({reason or 'no GPU listed'}); pass --gpu NAME or --vram SIZE")
    return gpu
