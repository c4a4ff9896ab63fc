"""Loss kernels, Unsloth / Liger and multi-GPU settings read from the configs people already have."""

import json

import pytest

from loradoctor.estimate.configs import read_config
from loradoctor.estimate.inputs import resolve_inputs


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_axolotl_cut_cross_entropy_plugin_liger_and_deepspeed(tmp_path):
    p = write(tmp_path, "a.yaml", (
        "base_model: meta-llama/Llama-3.1-8B\nadapter: qlora\nload_in_4bit: true\nsequence_len: 4096\n"
        "plugins:\n  - axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin\n"
        "liger_rms_norm: true\nliger_glu_activation: true\ndeepspeed: deepspeed_configs/zero3_bf16_cpuoffload_params.json\n"))
    fmt, opts = read_config(p)
    assert fmt == "axolotl"
    assert opts["loss"] == "cce" and opts["liger_kernels"] is True
    assert opts["strategy"] == "zero3" and opts["offload"] == "params"


@pytest.mark.parametrize("keys, loss", [
    ("cut_cross_entropy: true\n", "cce"),
    ("liger_fused_linear_cross_entropy: true\n", "liger-flce"),
    ("liger_cross_entropy: true\n", "fused-ce"),
])
def test_axolotl_loss_flags(tmp_path, keys, loss):
    fmt, opts = read_config(write(tmp_path, "a.yaml", "base_model: x\nadapter: lora\n" + keys))
    assert opts["loss"] == loss


def test_llamafactory_unsloth_and_liger(tmp_path):
    text = ("model_name_or_path: meta-llama/Llama-3.1-8B\nfinetuning_type: lora\nquantization_bit: 4\n"
            "use_unsloth: true\nuse_unsloth_gc: true\nenable_liger_kernel: true\n")
    fmt, opts = read_config(write(tmp_path, "lf.yaml", text))
    assert fmt == "llamafactory"
    assert opts["framework"] == "unsloth" and opts["offload_checkpoints"] is True
    assert opts["liger_kernels"] is True and opts["loss"] == "liger-flce"


def test_training_args_liger_and_fsdp(tmp_path):
    data = {"output_dir": "o", "per_device_train_batch_size": 2, "use_liger_kernel": True,
            "fsdp": "hybrid_shard auto_wrap"}
    fmt, opts = read_config(write(tmp_path, "args.json", json.dumps(data)))
    assert fmt == "training_args"
    assert opts["loss"] == "liger-flce" and opts["strategy"] == "fsdp-hybrid"


def test_deepspeed_json_and_accelerate_yaml(tmp_path):
    ds = {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}, "bf16": {"enabled": "auto"}}
    fmt, opts = read_config(write(tmp_path, "ds.json", json.dumps(ds)))
    assert (fmt, opts) == ("deepspeed", {"strategy": "zero2", "offload": "optimizer"})
    qwen = {"bf16": {"enabled": "auto"}, "zero_optimization": {  # QwenLM/Qwen finetune/ds_config_zero2.json
        "stage": 2, "offload_optimizer": {"device": "none", "pin_memory": True}, "allgather_bucket_size": 2e8,
        "overlap_comm": True, "reduce_scatter": True, "reduce_bucket_size": 2e8, "contiguous_gradients": True}}
    fmt, opts = read_config(write(tmp_path, "qwen_z2.json", json.dumps(qwen)))
    assert opts == {"strategy": "zero2", "reduce_bucket_size": 200_000_000, "overlap_comm": True}
    inputs, source = resolve_inputs({"model": "meta-llama/Llama-3.1-8B", "gpus": 4}, [tmp_path / "qwen_z2.json"])
    assert (inputs.reduce_bucket_size, inputs.overlap_comm) == (200_000_000, True)
    assert source["reduce_bucket_size"].startswith("config:")
    auto = {"zero_optimization": {"stage": 2, "reduce_bucket_size": "auto", "overlap_comm": "yes"}}
    assert read_config(write(tmp_path, "auto_z2.json", json.dumps(auto)))[1] == {"strategy": "zero2"}
    acc = ("compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nnum_processes: 4\nmixed_precision: bf16\n"
           "fsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\n  fsdp_offload_params: false\n")
    fmt, opts = read_config(write(tmp_path, "acc.yaml", acc))
    assert fmt == "accelerate"
    assert opts == {"gpus": 4, "strategy": "fsdp", "precision": "bf16"}


def test_torchtune_chunked_loss_recipe(tmp_path):
    text = ("model:\n  _component_: torchtune.models.llama3_1.qlora_llama3_1_8b\n  lora_attn_modules: [q_proj, v_proj]\n"
            "  apply_lora_to_mlp: true\n  lora_rank: 8\n  lora_alpha: 16\n"
            "loss:\n  _component_: torchtune.modules.loss.CEWithChunkedOutputLoss\n  num_output_chunks: 16\n"
            "batch_size: 2\nenable_activation_checkpointing: true\nenable_activation_offloading: true\ndtype: bf16\n")
    fmt, opts = read_config(write(tmp_path, "tt.yaml", text))
    assert fmt == "torchtune"
    assert opts["loss"] == "chunked:16" and opts["method"] == "qlora" and opts["precision"] == "bf16-true"
    assert opts["targets"] == ["q_proj", "v_proj", "gate_proj", "up_proj", "down_proj"]
    inputs, source = resolve_inputs({"model": "meta-llama/Llama-3.1-8B"}, [tmp_path / "tt.yaml"])
    assert inputs.framework == "torchtune" and inputs.loss == "chunked:16" and inputs.offload_checkpoints is True
    assert source["loss"].startswith("config:")


def test_command_line_wins_over_config(tmp_path):
    p = write(tmp_path, "a.yaml", "base_model: meta-llama/Llama-3.1-8B\nadapter: lora\ncut_cross_entropy: true\n")
    inputs, source = resolve_inputs({"loss": "standard", "gpus": 2}, [p])
    assert inputs.loss == "standard" and source["loss"] == "command line"
    assert inputs.gpus == 2 and inputs.strategy == "ddp"
