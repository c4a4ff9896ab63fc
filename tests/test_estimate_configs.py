"""Readers of axolotl / LLaMA-Factory YAML, TrainingArguments JSON and adapter_config.json."""

import pytest

from loradoctor.errors import UserError
from loradoctor.estimate.configs import detect_format, read_config, read_configs
from loradoctor.estimate.inputs import resolve_inputs


def test_axolotl_qlora(fixtures_dir):
    fmt, opts = read_config(fixtures_dir / "configs" / "axolotl_llama3_qlora.yaml")
    assert fmt == "axolotl"
    assert opts == {
        "model": "meta-llama/Llama-3.1-8B", "method": "qlora", "quant": "nf4", "double_quant": True,
        "rank": 32, "alpha": 16, "dropout": 0.05, "targets": ["all-linear"], "batch": 2, "seq_len": 4096,
        "grad_accum": 4, "gradient_checkpointing": True, "attn": "flash_attention_2",
        "optim": "paged_adamw_32bit", "precision": "bf16",
    }


def test_axolotl_8bit_lora(fixtures_dir):
    _, opts = read_config(fixtures_dir / "configs" / "axolotl_mistral_lora.yml")
    assert opts["method"] == "lora" and opts["quant"] == "8bit"
    assert opts["targets"] == ["q_proj", "k_proj", "v_proj", "o_proj"]
    assert opts["attn"] == "sdpa" and opts["optim"] == "adamw_bnb_8bit" and opts["gradient_checkpointing"] is False


def test_llamafactory_defaults(fixtures_dir):
    fmt, opts = read_config(fixtures_dir / "configs" / "llamafactory_qwen_lora.yaml")
    assert fmt == "llamafactory"
    assert opts["model"] == "Qwen/Qwen2.5-7B-Instruct"
    assert opts["targets"] == ["all-linear"] and opts["rank"] == 8 and opts["alpha"] == 16  # 2 x rank
    assert opts["gradient_checkpointing"] is True  # LLaMA-Factory checkpoints unless disabled
    assert opts["attn"] == "flash_attention_2" and opts["seq_len"] == 2048 and opts["batch"] == 2


def test_llamafactory_qlora(fixtures_dir):
    _, opts = read_config(fixtures_dir / "configs" / "llamafactory_llama3_qlora.yaml")
    assert opts["method"] == "qlora" and opts["quant"] == "nf4" and opts["double_quant"] is True
    assert opts["gradient_checkpointing"] is False and opts["optim"] == "paged_adamw_8bit"
    assert opts["targets"] == ["q_proj", "v_proj"] and opts["dropout"] == 0.0


def test_checkpoint_folder_merges_adapter_and_training_args(fixtures_dir):
    seen, opts = read_configs([fixtures_dir / "configs" / "hf_checkpoint"])
    assert sorted(fmt for _, fmt in seen) == ["adapter_config", "training_args"]
    assert opts["model"] == "meta-llama/Llama-2-7b-hf"
    assert opts["rank"] == 8 and sorted(opts["targets"]) == ["q_proj", "v_proj"]
    assert opts["batch"] == 4 and opts["seq_len"] == 1024 and opts["gradient_checkpointing"] is True
    assert opts["optim"] == "adamw_torch_fused" and opts["precision"] == "bf16"


def test_command_line_overrides_the_file(fixtures_dir):
    inputs, source = resolve_inputs({"batch": 1, "seq_len": 512}, [fixtures_dir / "configs" / "axolotl_llama3_qlora.yaml"])
    assert inputs.batch == 1 and inputs.seq_len == 512
    assert source["batch"] == "command line"
    assert source["rank"].startswith("config:") and inputs.rank == 32
    assert inputs.targets == ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    assert source["framework"] == "default"


def test_detect_and_reject(tmp_path):
    assert detect_format({"peft_type": "LORA", "r": 8}) == "adapter_config"
    assert detect_format({"hello": 1}) is None
    bad = tmp_path / "random.yaml"
    bad.write_text("hello: world\n")
    with pytest.raises(UserError):
        read_config(bad)
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(UserError) as exc:
        read_config(broken)
    assert "not valid JSON" in str(exc.value)
    with pytest.raises(UserError):
        read_configs([tmp_path / "missing.yaml"])
