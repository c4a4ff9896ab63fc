"""How options and configs become inputs: contradictions refused, combinations stated, defaults that follow
the framework and say so (issue 12)."""

import pytest

from loradoctor.errors import UserError
from loradoctor.estimate.fit import gpu_by_name
from loradoctor.estimate.inputs import assumed, resolve_inputs
from loradoctor.estimate.memory import estimate

LLAMA = "meta-llama/Llama-3.1-8B"


def test_qlora_with_quant_none_is_refused(tmp_path):
    with pytest.raises(UserError, match="--method qlora .* --quant none"):
        resolve_inputs({"model": LLAMA, "method": "qlora", "quant": "none"})
    # the same contradiction between a config and the command line names where --quant came from
    cfg = tmp_path / "axolotl.yaml"
    cfg.write_text(f"base_model: {LLAMA}\nadapter: qlora\nload_in_4bit: true\n")
    resolve_inputs({}, [cfg])  # the config alone is fine
    with pytest.raises(UserError, match="the command line"):
        resolve_inputs({"quant": "none"}, [cfg])


def test_full_fine_tuning_of_a_quantized_base_is_refused():
    with pytest.raises(UserError, match="--method full"):
        resolve_inputs({"model": LLAMA, "method": "full", "quant": "nf4"})


def test_lora_on_a_4bit_base_is_qlora_and_says_so():
    inputs, source = resolve_inputs({"model": LLAMA, "method": "lora", "quant": "nf4"})
    assert inputs.method == "qlora" and inputs.quant == "nf4"
    assert "QLoRA" in source["method"] or "qlora" in source["method"].lower()
    assert any("is QLoRA" in note for note in source.notes)
    # an 8-bit base stays LoRA
    inputs, source = resolve_inputs({"model": LLAMA, "method": "lora", "quant": "8bit"})
    assert inputs.method == "lora" and not source.notes


def test_gradient_checkpointing_default_follows_the_framework():
    qlora, source = resolve_inputs({"model": LLAMA, "method": "qlora"})
    assert qlora.gradient_checkpointing is True
    assert "prepare_model_for_kbit_training" in source["gradient_checkpointing"]
    assert any(a.startswith("gradient_checkpointing (on") for a in assumed(source, "qlora"))
    lora, source = resolve_inputs({"model": LLAMA, "method": "lora"})
    assert lora.gradient_checkpointing is False and "TrainingArguments" in source["gradient_checkpointing"]
    eight_bit, _ = resolve_inputs({"model": LLAMA, "method": "lora", "quant": "8bit"})
    assert eight_bit.gradient_checkpointing is True  # k-bit preparation runs for 8-bit bases too
    litgpt, _ = resolve_inputs({"model": LLAMA, "method": "qlora", "framework": "litgpt"})
    assert litgpt.gradient_checkpointing is False
    explicit, source = resolve_inputs({"model": LLAMA, "method": "qlora", "gradient_checkpointing": False})
    assert explicit.gradient_checkpointing is False and source["gradient_checkpointing"] == "command line"


def test_readme_first_example_fits_and_qlora_is_below_lora():
    """README: `estimate --model meta-llama/Llama-3.1-8B --method qlora --gpu 'RTX 5090'`."""
    card = gpu_by_name("RTX 5090")
    qlora = estimate(resolve_inputs({"model": LLAMA, "method": "qlora"})[0])
    lora = estimate(resolve_inputs({"model": LLAMA, "method": "lora"})[0])
    assert qlora.band[1] <= card.memory_bytes  # FITS
    assert qlora.device_used_bytes < lora.device_used_bytes


@pytest.mark.parametrize("key, value", [("batch", 0), ("batch", 10**9), ("seq_len", 10**12), ("rank", 0),
                                        ("grad_accum", -1)])
def test_command_line_numbers_have_bounds(key, value):
    with pytest.raises(UserError, match="--" + key.replace("_", "-")):
        resolve_inputs({"model": LLAMA, key: value})


def test_gradient_checkpointing_default_of_config_frameworks(tmp_path):
    """axolotl and TRL pass their own (unset: off) setting to prepare_model_for_kbit_training."""
    axolotl = tmp_path / "axolotl.yaml"
    axolotl.write_text(f"base_model: {LLAMA}\nadapter: qlora\nload_in_4bit: true\n")
    inputs, source = resolve_inputs({}, [axolotl])
    assert inputs.gradient_checkpointing is False and "axolotl" in source["gradient_checkpointing"]
    adapter = tmp_path / "adapter_config.json"
    adapter.write_text('{"peft_type": "LORA", "r": 8, "target_modules": ["q_proj", "v_proj"], '
                       f'"base_model_name_or_path": "{LLAMA}"}}')
    inputs, source = resolve_inputs({"quant": "nf4"}, [adapter])  # a plain PEFT script
    assert inputs.gradient_checkpointing is True and "PEFT" in source["gradient_checkpointing"]
