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


# --- values are checked with bounds; errors name the file, the key and the value (issue 11, 12) -----

@pytest.mark.parametrize("line, key, shown", [
    ("micro_batch_size: two", "micro_batch_size", "'two'"),
    ("lora_r: sixteen", "lora_r", "'sixteen'"),
    ("lora_r: .inf", "lora_r", "inf"),
    ("lora_dropout: .nan", "lora_dropout", "nan"),
    ("lora_dropout: 1.5", "lora_dropout", "1.5"),
    ("sequence_len: -5", "sequence_len", "-5"),
    ("micro_batch_size: [1, 2]", "micro_batch_size", "[1, 2]"),
    ("lora_r: true", "lora_r", "True"),
    ("lora_target_modules: 5", "lora_target_modules", "5"),
    ("gradient_accumulation_steps: 1.0e+30", "gradient_accumulation_steps", "1e+30"),
])
def test_bad_axolotl_values_name_file_key_value(tmp_path, line, key, shown):
    path = tmp_path / "axolotl.yaml"
    path.write_text(f"base_model: meta-llama/Llama-3.1-8B\nadapter: lora\n{line}\n")
    with pytest.raises(UserError) as exc:
        read_config(path)
    message = str(exc.value)
    assert str(path) in message and f"{key}: {shown}" in message and "\n" not in message


def test_bad_values_in_other_formats(tmp_path):
    lf = tmp_path / "lf.yaml"
    lf.write_text("model_name_or_path: Qwen/Qwen2.5-7B\nfinetuning_type: lora\nlora_rank: eight\n")
    with pytest.raises(UserError, match=r"lf\.yaml: lora_rank: 'eight'"):
        read_config(lf)
    lf.write_text("model_name_or_path: Qwen/Qwen2.5-7B\nfinetuning_type: lora\nquantization_bit: four\n")
    with pytest.raises(UserError, match=r"quantization_bit: 'four'"):
        read_config(lf)
    ta = tmp_path / "training_args.json"
    ta.write_text('{"per_device_train_batch_size": ' + "9" * 5000 + ', "output_dir": "out"}')
    with pytest.raises(UserError, match="training_args.json"):
        read_config(ta)
    ta.write_text('{"per_device_train_batch_size": NaN, "output_dir": "out"}')
    with pytest.raises(UserError, match=r"per_device_train_batch_size: nan"):
        read_config(ta)


def test_numbers_written_as_text_or_whole_floats_still_read(tmp_path):
    path = tmp_path / "a.yaml"
    path.write_text("base_model: x\nadapter: lora\nmicro_batch_size: '4'\nsequence_len: 2048.0\nlora_alpha: 16.5\n")
    _, opts = read_config(path)
    assert opts["batch"] == 4 and opts["seq_len"] == 2048 and opts["alpha"] == 16.5


def test_a_bad_value_inside_a_checkpoint_folder_is_not_skipped(tmp_path):
    folder = tmp_path / "checkpoint-10"
    folder.mkdir()
    (folder / "adapter_config.json").write_text('{"peft_type": "LORA", "r": "sixteen", "target_modules": ["q_proj"], '
                                                '"base_model_name_or_path": "meta-llama/Llama-2-7b-hf"}')
    with pytest.raises(UserError, match=r"adapter_config.json: r: 'sixteen'"):
        read_configs([folder])


def test_two_configs_that_disagree_say_which_won(tmp_path):
    first, second = tmp_path / "first.yaml", tmp_path / "second.yaml"
    first.write_text("base_model: meta-llama/Llama-3.1-8B\nadapter: lora\nmicro_batch_size: 2\n")
    second.write_text("base_model: meta-llama/Llama-3.1-8B\nadapter: lora\nmicro_batch_size: 4\n")
    inputs, source = resolve_inputs({}, [first, second])
    assert inputs.batch == 4 and source["batch"] == "config: second.yaml (axolotl)"
    assert source["method"] == "config: second.yaml (axolotl)"
    (conflict,) = source.conflicts
    assert "batch" in conflict and "first.yaml" in conflict and "second.yaml wins" in conflict
    second.write_text("base_model: meta-llama/Llama-3.1-8B\nadapter: qlora\n")
    inputs, source = resolve_inputs({}, [first, second])
    assert inputs.method == "qlora" and inputs.batch == 2
    assert any("method" in c and "second.yaml wins" in c for c in source.conflicts)
    assert source["batch"] == "config: first.yaml (axolotl)"


def test_fixes_are_spelled_in_the_framework_own_keys():
    from loradoctor.estimate.configs import spell_fix

    assert spell_fix("--batch 1 --grad-accum 8", {}, "axolotl") == (
        "micro_batch_size: 1, gradient_accumulation_steps: 8", {"axolotl"})
    assert spell_fix("--batch 1 --grad-accum 8", {}, "llamafactory")[0] == (
        "per_device_train_batch_size: 1, gradient_accumulation_steps: 8")
    assert spell_fix("--gradient-checkpointing", {}, "llamafactory")[0] == "disable_gradient_checkpointing: false"
    assert spell_fix("--seq-len 1024", {}, "training_args")[0] == '"max_length": 1024'
    # targets come from the adapter config in a checkpoint folder, the batch from training_args.json
    assert spell_fix("--targets q_proj,v_proj", {"targets": "adapter_config"}, "training_args") == (
        '"target_modules": ["q_proj", "v_proj"]', {"adapter_config"})
    assert spell_fix("--method qlora --quant nf4 --double-quant", {}, "axolotl")[0] == "adapter: qlora, load_in_4bit: true"


# --- fuzz: any value under any key a reader uses -> options or one line, never a traceback ------------

from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

from loradoctor.estimate.configs import FIELDS  # noqa: E402

_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(min_value=-10**30, max_value=10**30),
                     st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
                     st.sampled_from(["auto", "true", "4", "nf4", "all", "q_proj,v_proj", "1e3", "-0", "16.0"]))
_VALUES = st.one_of(_SCALARS, st.lists(_SCALARS, max_size=3), st.dictionaries(st.text(max_size=5), _SCALARS, max_size=2))
_MARKERS = {"axolotl": {"base_model": "meta-llama/Llama-3.1-8B"},
            "llamafactory": {"model_name_or_path": "meta-llama/Llama-3.1-8B", "finetuning_type": "lora"},
            "training_args": {"output_dir": "out", "model_name_or_path": "meta-llama/Llama-3.1-8B"},
            "adapter_config": {"peft_type": "LORA", "base_model_name_or_path": "meta-llama/Llama-3.1-8B"}}


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fmt=st.sampled_from(sorted(FIELDS)), data=st.data())
def test_any_value_gives_options_or_one_line(tmp_path, fmt, data):
    import json

    settings_ = dict(_MARKERS[fmt])
    keys = data.draw(st.lists(st.sampled_from(sorted(FIELDS[fmt])), min_size=1, max_size=4, unique=True))
    for key in keys:
        settings_[key] = data.draw(_VALUES)
    path = tmp_path / ("c.json" if fmt in ("training_args", "adapter_config") else "c.yaml")
    try:
        text = json.dumps(settings_)  # JSON is YAML; NaN / Infinity are written as the YAML reader sees them
    except ValueError:
        return
    path.write_text(text.replace("NaN", ".nan").replace("-Infinity", "-.inf").replace("Infinity", ".inf")
                    if path.suffix == ".yaml" else text)
    try:
        resolve_inputs({}, [path])
    except UserError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < 600


def test_llamafactory_quantization_bits_other_than_4_or_8_are_refused(tmp_path):
    path = tmp_path / "lf.yaml"
    path.write_text("model_name_or_path: Qwen/Qwen2.5-7B\nfinetuning_type: lora\nquantization_bit: 3\n")
    with pytest.raises(UserError, match=r"lf\.yaml: quantization_bit: 3 is not modelled"):
        read_config(path)
