"""Architecture shapes: parameter counts of known models, config.json reading, the HF cache, presets."""

import json

import pytest

from loradoctor.errors import UserError
from loradoctor.estimate.arch import (
    arch_from_config, find_in_hf_cache, find_preset, normalize_module, resolve_arch,
)


@pytest.mark.parametrize("model, params", [
    ("meta-llama/Llama-3.1-8B", 8_030_261_248),
    ("Qwen/Qwen2.5-0.5B", 494_032_768),
    ("meta-llama/Llama-2-7b-hf", 6_738_415_616),
    ("mistralai/Mixtral-8x7B-v0.1", 46_702_792_704),
    ("microsoft/Phi-3-mini-4k-instruct", 3_821_079_552),
])
def test_parameter_counts_of_known_models(model, params):
    assert resolve_arch(model).total_params() == params


def test_qwen3_head_dim_differs_from_hidden_over_heads():
    arch = resolve_arch("Qwen/Qwen3-0.6B")
    assert arch.hd == 128 and arch.hidden // arch.heads == 64
    assert arch.q_dim == 16 * 128 and arch.kv_dim == 8 * 128


def test_preset_lookup_is_loose_and_unknown_is_none():
    assert find_preset("meta-llama/Meta-Llama-3.1-8B-Instruct") == "llama-3.1-8b"
    assert find_preset("Llama-3.2-1B") == "llama-3.2-1b"
    assert find_preset("qwen2.5-7b") == "qwen2.5-7b"
    assert find_preset("someone/totally-unknown-13b") is None


def test_unknown_model_lists_presets():
    with pytest.raises(UserError) as exc:
        resolve_arch("someone/totally-unknown-13b")
    assert "llama-3.1-8b" in str(exc.value) and "qwen2.5-0.5b" in str(exc.value)


def test_local_folder_config_json(fixtures_dir):
    folder = fixtures_dir / "configs" / "models" / "qwen2.5-0.5b"
    arch = resolve_arch(str(folder))
    assert arch.name == "qwen2.5-0.5b"
    assert arch.total_params() == 494_032_768
    assert arch.tied and arch.attn_bias and arch.kv_heads == 2
    assert resolve_arch(str(folder / "config.json")).total_params() == 494_032_768


def test_hf_cache_lookup_honours_hf_home(tmp_path, monkeypatch):
    snap = tmp_path / "hub" / "models--acme--tiny-llama" / "snapshots" / "0123abcd"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000, "tie_word_embeddings": False}))
    refs = tmp_path / "hub" / "models--acme--tiny-llama" / "refs"
    refs.mkdir()
    (refs / "main").write_text("0123abcd")
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    assert find_in_hf_cache("acme/tiny-llama") == snap / "config.json"
    arch = resolve_arch("acme/tiny-llama")
    assert arch.source.startswith("hf-cache:")
    # 4 layers x (q 256x256 + k,v 256x128 + o 256x256 + 3 x 256x688 + 2 norms) + 2 x 1000x256 + final norm
    layer = 2 * 256 * 256 + 2 * 256 * 128 + 3 * 256 * 688 + 2 * 256
    assert arch.total_params() == 4 * layer + 2 * 1000 * 256 + 256
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "elsewhere"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "nothing"))
    assert find_in_hf_cache("acme/tiny-llama") is None


def test_config_json_gemma2_moe_and_fused_fields():
    gemma2 = arch_from_config({
        "model_type": "gemma2", "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
        "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "vocab_size": 256000,
        "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0})
    assert gemma2.hd == 256 and gemma2.tied and gemma2.norms_per_layer == 4 and gemma2.final_softcap == 30.0
    assert gemma2.total_params() == 2_614_341_888
    moe = arch_from_config({
        "model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
        "num_local_experts": 8, "num_experts_per_tok": 2})
    assert moe.experts == 8 and moe.experts_per_token == 2
    assert moe.linear_modules()["down_proj"] == (14336, 4096, 8)
    with pytest.raises(UserError):
        arch_from_config({"model_type": "bert", "hidden_size": 768})


def test_module_aliases():
    assert normalize_module("qkv_proj") == ("q_proj", "k_proj", "v_proj")
    assert normalize_module("gate_up_proj") == ("gate_proj", "up_proj")
    assert normalize_module("w2") == ("down_proj",)
    assert normalize_module("model.layers.0.self_attn.o_proj") == ("o_proj",)
    assert normalize_module("output_proj") == ("o_proj",)


@pytest.mark.parametrize("model", ["a" * 5000, "org/" + "a" * 5000, "Qwen/Qwen2.5-7B\x00x"])
def test_a_model_name_no_file_system_takes_is_an_unknown_model_not_a_crash(model):
    """Fuzz campaign seed 24: a mangled model id in a config (5,000 characters) made Path.is_dir() raise
    ENAMETOOLONG; it is looked up as an id, and the one-line error shows at most 200 of its characters."""
    from loradoctor.errors import UserError
    from loradoctor.estimate.arch import resolve_arch

    with pytest.raises(UserError) as err:
        resolve_arch(model)
    assert "unknown model" in str(err.value) and len(str(err.value)) < 2000
