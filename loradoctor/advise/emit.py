"""A recommendation written as the chosen framework's own config: axolotl YAML, LLaMA-Factory YAML,
a transformers `TrainingArguments` + `LoraConfig` snippet, a TRL `SFTConfig` snippet, an Unsloth
`FastLanguageModel` snippet. Each is built from `Recommendation.to_dict()` and nothing else, so what
is printed is what was estimated (tests read each one back)."""

from __future__ import annotations

from typing import Any

from loradoctor.units import gib

ATTN_ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _yaml(data: dict[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False, width=120)


def _head(d: dict[str, Any], run: str = "", note: str = "") -> str:
    """The comment every emitted config starts with: model, card, the estimate of exactly this config."""
    line = (f"# loradoctor recommend: {d['model']} on {d['gpu']['name']}; estimate {gib(d['estimate_bytes'])} of "
            f"{gib(d['card_bytes'])}{note}\n")
    return line + (f"# run with: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True {run}\n" if run else "")


def _targets(d: dict[str, Any]) -> list[str]:
    return list(d["targets"])


def axolotl(d: dict[str, Any]) -> str:
    qlora = d["method"] == "qlora"
    cfg: dict[str, Any] = {"base_model": d["model"]}
    if d["method"] != "full":
        cfg["adapter"] = "qlora" if qlora else "lora"
        cfg["load_in_4bit"] = qlora
        cfg.update(lora_r=d["rank"], lora_alpha=d["alpha"], lora_dropout=d["dropout"], lora_target_modules=_targets(d))
    cfg.update(sequence_len=d["seq_len"], micro_batch_size=d["micro_batch"],
               gradient_accumulation_steps=d["grad_accum"], gradient_checkpointing=d["gradient_checkpointing"])
    if d["attn"] == "flash_attention_2":
        cfg["flash_attention"] = True
    elif d["attn"] == "sdpa":
        cfg["sdp_attention"] = True
    cfg.update(optimizer=d["optim"], learning_rate=d["lr"], lr_scheduler=d["scheduler"], warmup_ratio=d["warmup_ratio"],
               max_grad_norm=d["max_grad_norm"], bf16=d["precision"] == "bf16", fp16=d["precision"] == "fp16",
               dataloader_num_workers=d["dataloader_num_workers"])
    return _head(d, "axolotl train config.yaml") + _yaml(cfg)


def llamafactory(d: dict[str, Any]) -> str:
    cfg: dict[str, Any] = {"model_name_or_path": d["model"], "stage": "sft", "do_train": True,
                           "finetuning_type": "full" if d["method"] == "full" else "lora"}
    if d["method"] == "qlora":
        cfg.update(quantization_bit=4, quantization_type="nf4", double_quantization=d["double_quant"])
    if d["method"] != "full":
        cfg.update(lora_rank=d["rank"], lora_alpha=d["alpha"], lora_dropout=d["dropout"], lora_target=",".join(_targets(d)))
    cfg.update(cutoff_len=d["seq_len"], per_device_train_batch_size=d["micro_batch"],
               gradient_accumulation_steps=d["grad_accum"], disable_gradient_checkpointing=not d["gradient_checkpointing"],
               flash_attn={"flash_attention_2": "fa2", "sdpa": "sdpa", "eager": "disabled"}[d["attn"]],
               optim=d["optim"], learning_rate=d["lr"], lr_scheduler_type=d["scheduler"], warmup_ratio=d["warmup_ratio"],
               max_grad_norm=d["max_grad_norm"], bf16=d["precision"] == "bf16", fp16=d["precision"] == "fp16",
               dataloader_num_workers=d["dataloader_num_workers"])
    return _head(d, "llamafactory-cli train config.yaml") + _yaml(cfg)


def _kw(items: dict[str, Any], indent: str = "    ") -> str:
    return "".join(f"{indent}{k}={v!r},\n" for k, v in items.items())


def _common_args(d: dict[str, Any]) -> dict[str, Any]:
    return {"per_device_train_batch_size": d["micro_batch"], "gradient_accumulation_steps": d["grad_accum"],
            "gradient_checkpointing": d["gradient_checkpointing"], "optim": d["optim"], "learning_rate": d["lr"],
            "lr_scheduler_type": d["scheduler"], "warmup_ratio": d["warmup_ratio"], "max_grad_norm": d["max_grad_norm"],
            "bf16": d["precision"] == "bf16", "fp16": d["precision"] == "fp16",
            "dataloader_num_workers": d["dataloader_num_workers"]}


def _model_block(d: dict[str, Any]) -> str:
    dtype = "torch.bfloat16" if d["precision"] == "bf16" else "torch.float16"
    out = ["import os\nos.environ.setdefault(\"PYTORCH_CUDA_ALLOC_CONF\", \"expandable_segments:True\")  # before torch\n",
           "import torch\nfrom transformers import AutoModelForCausalLM, BitsAndBytesConfig, TrainingArguments\n",
           "from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training\n\n"]
    if d["method"] == "qlora":
        out.append("quantization_config = BitsAndBytesConfig(\n" + _kw({
            "load_in_4bit": True, "bnb_4bit_quant_type": d["quant"], "bnb_4bit_use_double_quant": d["double_quant"]})
            + f"    bnb_4bit_compute_dtype={dtype},\n)\n")
    out.append("model = AutoModelForCausalLM.from_pretrained(\n" + f"    {d['model']!r},\n"
               + _kw({"attn_implementation": d["attn"]}) + f"    torch_dtype={dtype},\n"
               + ("    quantization_config=quantization_config,\n" if d["method"] == "qlora" else "") + ")\n")
    if d["method"] == "qlora":
        out.append(f"model = prepare_model_for_kbit_training(model, use_gradient_checkpointing={d['gradient_checkpointing']!r})\n")
    if d["method"] != "full":
        out.append("lora_config = LoraConfig(\n" + _kw({"r": d["rank"], "lora_alpha": d["alpha"], "lora_dropout": d["dropout"],
                                                         "target_modules": _targets(d), "task_type": "CAUSAL_LM"}) + ")\n")
    return "".join(out)


def hf(d: dict[str, Any]) -> str:
    tail = "model = get_peft_model(model, lora_config)\n" if d["method"] != "full" else ""
    return (_head(d) + _model_block(d) + tail + "args = TrainingArguments(\n    output_dir='out',\n" + _kw(_common_args(d))
            + ")\n# tokenize with truncation at max_length=" + str(d["seq_len"]) + "\n")


def trl(d: dict[str, Any]) -> str:
    peft = ", peft_config=lora_config" if d["method"] != "full" else ""
    return (_head(d) + _model_block(d).replace("from transformers import AutoModelForCausalLM, BitsAndBytesConfig, TrainingArguments",
                                      "from transformers import AutoModelForCausalLM, BitsAndBytesConfig\nfrom trl import SFTConfig, SFTTrainer")
            + "args = SFTConfig(\n    output_dir='out',\n" + _kw({"max_length": d["seq_len"], **_common_args(d)}) + ")\n"
            + f"trainer = SFTTrainer(model=model, args=args, train_dataset=dataset{peft})\n")


def unsloth(d: dict[str, Any]) -> str:
    gc = "unsloth" if d["gradient_checkpointing"] else False
    return (_head(d, note=" (standard checkpointing; Unsloth's offloaded checkpoints need less)")
            + "from unsloth import FastLanguageModel\nfrom trl import SFTConfig, SFTTrainer\n\n"
            "model, tokenizer = FastLanguageModel.from_pretrained(\n" + f"    {d['model']!r},\n"
            + _kw({"max_seq_length": d["seq_len"], "load_in_4bit": d["method"] == "qlora", "dtype": None}) + ")\n"
            "model = FastLanguageModel.get_peft_model(\n    model,\n"
            + _kw({"r": d["rank"], "lora_alpha": d["alpha"], "lora_dropout": d["dropout"], "target_modules": _targets(d),
                   "use_gradient_checkpointing": gc}) + ")\n"
            "args = SFTConfig(\n    output_dir='out',\n"
            + _kw({k: v for k, v in {"max_length": d["seq_len"], **_common_args(d)}.items() if k != "gradient_checkpointing"})
            + ")\n")


EMITTERS = {"axolotl": axolotl, "llamafactory": llamafactory, "hf": hf, "trl": trl, "unsloth": unsloth}


def emit(d: dict[str, Any], framework: str) -> str:
    return EMITTERS[framework](d)
