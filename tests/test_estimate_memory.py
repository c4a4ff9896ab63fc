"""The memory model, term by term, on hand-computed cases."""

from loradoctor.record import replace

import pytest

from loradoctor.errors import UserError
from loradoctor.estimate.arch import resolve_arch
from loradoctor.estimate.memory import (
    EstimateInputs, estimate, layer_activation_parts, lora_params, optimizer_state_bytes, quantized_linear_bytes,
    resolve_targets, validate,
)

LLAMA2 = resolve_arch("meta-llama/Llama-2-7b-hf")
LLAMA31 = resolve_arch("meta-llama/Llama-3.1-8B")


def test_lora_params_llama2_qv_r8():
    assert lora_params(LLAMA2, ("q_proj", "v_proj"), 8) == 4_194_304


def test_lora_params_llama31_all_linear_r16():
    targets = resolve_targets(LLAMA31, ("all-linear",))
    assert targets == ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    # per layer: q 4096+4096, k/v 4096+1024, o 4096+4096, gate/up/down 4096+14336 -> 81920 x 16 x 32 layers
    assert lora_params(LLAMA31, targets, 16) == 41_943_040


def test_lora_params_lm_head_and_experts():
    assert lora_params(LLAMA2, ("lm_head",), 8) == 8 * (4096 + 32000)
    mixtral = resolve_arch("mistralai/Mixtral-8x7B-v0.1")
    assert lora_params(mixtral, ("down_proj",), 4) == 32 * 8 * 4 * (14336 + 4096)


def test_nf4_state_bytes():
    n = 4096 * 4096
    # 4 bits per weight + one fp32 absmax per 64 weights
    assert quantized_linear_bytes(n, 4096, "nf4", False) == n // 2 + (n // 64) * 4 == 9_437_184
    # double quant: 8-bit absmax per block + fp32 per 256 blocks + the 256-entry fp32 code
    assert quantized_linear_bytes(n, 4096, "nf4", True) == n // 2 + n // 64 + (n // 64 // 256) * 4 + 1024 == 8_655_872
    # LLM.int8: 1 byte per weight + an fp32 scale per output row
    assert quantized_linear_bytes(n, 4096, "8bit", False) == n + 4096 * 4


def test_optimizer_states():
    assert optimizer_state_bytes("adamw_torch", 1000, 4, []) == (8000, False)
    assert optimizer_state_bytes("adamw_torch", 1000, 2, []) == (4000, False)  # bf16 params: bf16 states
    assert optimizer_state_bytes("paged_adamw_32bit", 1000, 2, []) == (8000, True)  # bnb 32-bit: fp32 always
    assert optimizer_state_bytes("adamw_8bit", 4096, 4, [])[0] == 2 * 4096 + 2 * 4 * 3
    assert optimizer_state_bytes("sgd", 1000, 4, []) == (0, False)
    assert optimizer_state_bytes("adafactor", 0, 4, [(8, 4096), (4096, 8)]) == (2 * 4 * (8 + 4096), False)


def test_weights_bf16_lora_and_full_mixed_precision():
    lora = estimate(EstimateInputs(arch=LLAMA31, method="lora"))
    assert lora.components["base weights"] == 2 * 8_030_261_248
    assert lora.components["LoRA parameters"] == 4 * lora.trainable_params  # PEFT keeps adapters fp32
    full = estimate(EstimateInputs(arch=LLAMA31, method="full", seq_len=512))
    assert full.components["base weights"] == 4 * 8_030_261_248  # fp32 master weights under autocast
    assert full.components["optimizer states (adamw_torch)"] == 8 * 8_030_261_248
    pure = estimate(EstimateInputs(arch=LLAMA31, method="lora", precision="bf16-true", framework="litgpt"))
    assert pure.components["LoRA parameters"] == 2 * pure.trainable_params


def test_qlora_upcasts_unquantized_params_on_hf_only():
    q = estimate(EstimateInputs(arch=LLAMA31, method="qlora"))
    rest = 2 * 128256 * 4096 + (2 * 32 + 1) * 4096  # embed + lm_head + norms
    assert q.components["embeddings, lm_head, norms (fp32 upcast)"] == 4 * rest
    mods = LLAMA31.linear_modules()
    expected = sum(32 * c * quantized_linear_bytes(i * o, o, "nf4", False) for i, o, c in mods.values())
    assert q.components["base weights (nf4)"] == expected
    tt = estimate(EstimateInputs(arch=LLAMA31, method="qlora", framework="torchtune", precision="bf16-true"))
    assert tt.components["embeddings, lm_head, norms"] == 2 * rest


def test_hf_cross_entropy_upcasts_logits_to_fp32():
    e = estimate(EstimateInputs(arch=LLAMA31, batch=1, seq_len=1024))
    assert e.components["logits + cross-entropy"] == 12 * 128256 * 1024


def test_activations_scale_with_tokens_and_shrink_with_checkpointing():
    base = EstimateInputs(arch=LLAMA2, batch=1, seq_len=1024)
    a1 = estimate(base).components["activations (32 layers)"]
    a2 = estimate(replace(base, batch=2)).components["activations (32 layers)"]
    assert a2 == 2 * a1
    gc = estimate(replace(base, gradient_checkpointing=True))
    assert gc.components["checkpointed hidden states"] == 32 * 2 * 4096 * 1024
    assert gc.peak_allocated_bytes < estimate(base).peak_allocated_bytes


def test_per_layer_parts_hand_computed():
    # Llama-2-7B, sdpa, bf16 autocast, LoRA q,v with dropout 0.05 on fp32 adapters; bytes per token
    parts = layer_activation_parts(validate(EstimateInputs(arch=LLAMA2, targets=("q_proj", "v_proj"), rank=8, dropout=0.05)))
    h, i = 4096, 11008
    assert parts["norms"] == 2 * 4 * h  # two RMSNorms, each keeping an fp32 copy
    assert parts["linear inputs"] == 0  # frozen nn.Linear keeps no input (autograd guards the save)
    assert parts["attention"] == 2 * 4 * h + 4 * 32  # q, k, v, out + logsumexp
    assert parts["mlp"] == 3 * 2 * i  # gate, up, act(gate)
    assert parts["lora"] == 2 * (h + 2 * h) + 2 * 2 * 8  # bool mask + half copy per target, low-rank output


def test_qlora_keeps_linear_inputs_and_runs_the_stream_in_fp32_on_hf():
    # bitsandbytes' matmul keeps its input; k-bit prep upcasts norms/embeddings so the stream is fp32 and each
    # linear gets its own bf16 copy (q, k, v, gate, up: h each; down: intermediate); o_proj's bf16 input is the
    # output sdpa saved (no cast needed, checked in test_estimate_autograd)
    parts = layer_activation_parts(validate(EstimateInputs(arch=LLAMA2, method="qlora", targets=("q_proj",), dropout=0.0)))
    h, i = 4096, 11008
    assert parts["linear inputs"] == 2 * (5 * h + i)
    assert parts["mlp"] == 3 * 4 * i
    pure = layer_activation_parts(validate(EstimateInputs(arch=LLAMA2, method="qlora", framework="torchtune",
                                                          precision="bf16-true", targets=("q_proj",), dropout=0.0)))
    # pure bf16: one input shared by q/k/v, one by gate/up, down's; o_proj's input is a view of the output
    # sdpa saved (its kernels write (batch, seq, heads, dim)), so it is not a second copy
    assert pure["linear inputs"] == 2 * (2 * h + i) and pure["mlp"] == 3 * 2 * i
    full = layer_activation_parts(validate(EstimateInputs(arch=LLAMA2, method="full", precision="bf16-true")))
    assert full["linear inputs"] == 2 * (2 * h + i)
    eager = layer_activation_parts(validate(EstimateInputs(arch=LLAMA2, method="full", precision="bf16-true",
                                                           attn="eager")))
    assert eager["linear inputs"] == 2 * (2 * h + h + i)  # eager's matmul output is reshaped into a copy


def test_eager_attention_costs_seq_squared():
    base = EstimateInputs(arch=LLAMA31, seq_len=4096, gradient_checkpointing=False)
    eager = estimate(replace(base, attn="eager")).peak_allocated_bytes
    sdpa = estimate(base).peak_allocated_bytes
    fa2 = estimate(replace(base, attn="flash_attention_2")).peak_allocated_bytes
    assert eager > sdpa == fa2  # unpadded HF sdpa passes enable_gqa: k/v stay at their own size, as in flash-attn
    tt = replace(base, framework="torchtune", precision="bf16-true")
    assert estimate(tt).peak_allocated_bytes > estimate(replace(tt, attn="flash_attention_2")).peak_allocated_bytes
    # the s x s probabilities: heads x seq x (4 fp32 + 2 bf16) bytes per token per layer
    assert eager - sdpa >= 32 * 32 * 4096 * 6 * 4096 * 0.9


def test_three_numbers_are_ordered_and_components_add_up():
    for method in ("lora", "qlora", "full"):
        e = estimate(EstimateInputs(arch=LLAMA31, method=method, batch=2, seq_len=1024, gradient_checkpointing=True))
        assert e.peak_allocated_bytes < e.peak_reserved_bytes < e.device_used_bytes
        assert sum(e.components.values()) == e.device_used_bytes
        assert e.band[0] < e.device_used_bytes < e.band[1]


def test_paged_optimizer_not_in_allocated_but_on_device():
    base = EstimateInputs(arch=LLAMA2, method="full", seq_len=256, precision="bf16-true")
    adam = estimate(base)
    paged = estimate(replace(base, optim="paged_adamw_32bit"))
    assert "paged optimizer states (paged_adamw_32bit)" in paged.components
    assert paged.peak_allocated_bytes < adam.peak_allocated_bytes


def test_full_finetune_peak_is_the_optimizer_step_for_short_sequences():
    e = estimate(EstimateInputs(arch=LLAMA2, method="full", seq_len=128))
    assert any("optimizer step" in n for n in e.notes)
    assert e.components["gradients"] == 4 * LLAMA2.total_params()


@pytest.mark.parametrize("kwargs, fragment", [
    ({"method": "dpo"}, "--method"),
    ({"method": "full", "quant": "nf4"}, "full fine-tuning"),
    ({"targets": ("c_attn_x",)}, "not found"),
    ({"optim": "adamw_magic"}, "unknown optimizer"),
    ({"batch": 0}, "--batch"),
    ({"attn": "flash3"}, "--attn"),
])
def test_bad_inputs_are_user_errors(kwargs, fragment):
    with pytest.raises(UserError) as exc:
        estimate(EstimateInputs(arch=LLAMA2, **kwargs))
    assert fragment in str(exc.value)


def test_phi3_fused_names_expand():
    phi3 = resolve_arch("microsoft/Phi-3-mini-4k-instruct")
    assert resolve_targets(phi3, ("qkv_proj", "gate_up_proj")) == ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")


def test_phi3_fused_modules_share_one_lora_a():
    phi3 = resolve_arch("microsoft/Phi-3-mini-4k-instruct")
    targets = resolve_targets(phi3, ("all-linear",))
    # per layer: qkv_proj 3072 -> 9216, o_proj 3072 -> 3072, gate_up_proj 3072 -> 16384, down_proj 8192 -> 3072
    assert lora_params(phi3, targets, 8) == 32 * 8 * ((3072 + 9216) + (3072 + 3072) + (3072 + 16384) + (8192 + 3072))
    with pytest.raises(UserError) as exc:
        resolve_targets(phi3, ("q_proj",))
    assert "qkv_proj" in str(exc.value)
