"""Loss kernels, Unsloth, precision modes, attention backends, PEFT methods and more than one GPU: each term on
hand-computed bytes (Llama-3.1-8B shapes: h 4096, I 14336, 32 heads, 8 kv heads, vocab 128256, 32 layers)."""

from loradoctor.record import replace

import pytest

from loradoctor.errors import UserError
from loradoctor.estimate.arch import resolve_arch
from loradoctor.estimate.losses import liger_chunk_tokens, loss_peak_bytes, parse_loss
from loradoctor.estimate.memory import (
    EstimateInputs, activation_components, attention_mask_bytes, attention_transient_bytes, estimate,
    layer_activation_parts, loss_kind, peft_params, validate,
)
from loradoctor.estimate.parallel import PerGpu, deepspeed_model_states_bytes, per_gpu

LLAMA31 = resolve_arch("meta-llama/Llama-3.1-8B")
H, I, V, KV = 4096, 14336, 128256, 1024
ALL = ("all-linear",)


def inputs(**kw):
    return validate(EstimateInputs(arch=LLAMA31, **kw))


# --- loss kernels --------------------------------------------------------------------------------

def test_parse_loss():
    assert parse_loss("chunked") == ("chunked", 8)
    assert parse_loss("chunked:16") == ("chunked", 16)
    assert parse_loss("liger") == ("liger-flce", 0)
    assert parse_loss("CCE") == ("cce", 0)
    assert parse_loss(None) == (None, 0)
    for bad in ("fused", "chunked:x", "chunked:0", "cce:4"):
        with pytest.raises(UserError):
            parse_loss(bad)


def test_standard_and_chunked_loss_bytes_per_logit():
    tokens = 2048
    assert loss_peak_bytes("standard", 0, tokens, H, V, 2, 2) == 12 * tokens * V
    assert loss_peak_bytes("standard", 0, tokens, H, V, 4, 4) == 16 * tokens * V
    # torchtune: all bf16 logits + one of 8 chunks upcast (12 bytes per logit of that chunk)
    assert loss_peak_bytes("chunked", 8, tokens, H, V, 2, 2) == int(3.5 * tokens * V)
    assert loss_peak_bytes("chunked", 16, tokens, H, V, 2, 2) == int(2.75 * tokens * V)
    # litgpt: bf16 logits + bf16 log-softmax
    assert loss_peak_bytes("chunked", 8, tokens, H, V, 2, 2, half_log_softmax=True) == 4 * tokens * V


def test_cce_never_holds_a_logit():
    # saved hidden states (bf16) + their gradient (bf16) + an fp32 lse per token
    assert loss_peak_bytes("cce", 0, 4096, H, V, 2, 2) == 4096 * (2 * H + 2 * H + 4)
    # HF k-bit training: the final hidden states are fp32
    assert loss_peak_bytes("cce", 0, 4096, H, V, 2, 4) == 4096 * (4 * H + 2 * H + 4)


def test_liger_flce_chunk_and_bytes():
    # inc_factor = ceil(128256 / 4096) = 32; chunk = next_pow2(ceil(4096 / 32)) = 128 tokens
    assert liger_chunk_tokens(4096, H, V) == 128
    assert liger_chunk_tokens(1000, H, V) == 32  # ceil(1000 / 32) = 32
    assert liger_chunk_tokens(3, H, V) == 1
    expected = 4096 * (2 * H + 4) + 128 * V * 2  # grad of the hidden states, fp32 loss, one bf16 logits chunk
    assert loss_peak_bytes("liger-flce", 0, 4096, H, V, 2, 2) == expected
    assert loss_peak_bytes("unsloth", 0, 4096, H, V, 2, 2) == expected


def test_loss_defaults_by_framework():
    assert loss_kind(inputs()) == ("standard", 0)
    assert loss_kind(inputs(framework="unsloth")) == ("unsloth", 0)
    assert loss_kind(inputs(framework="litgpt")) == ("chunked", 8)
    assert loss_kind(inputs(framework="torchtune", chunked_ce=True)) == ("chunked", 8)
    assert loss_kind(inputs(loss="cce")) == ("cce", 0)


def test_cce_saves_what_the_logits_cost():
    tokens = 4096
    std = estimate(EstimateInputs(arch=LLAMA31, seq_len=tokens, gradient_checkpointing=True))
    cce = estimate(EstimateInputs(arch=LLAMA31, seq_len=tokens, gradient_checkpointing=True, loss="cce"))
    assert std.components["logits + cross-entropy"] == 12 * tokens * V
    assert "logits + cross-entropy" not in cce.components
    # with the logits gone the peak moment is a layer's recomputed backward, far below the 6.3 GB of logits
    assert std.device_used_bytes - cce.device_used_bytes > 4 * 2**30


# --- Unsloth -------------------------------------------------------------------------------------

def test_unsloth_layer_parts():
    parts = layer_activation_parts(inputs(framework="unsloth", method="qlora", targets=ALL))
    assert parts == {
        "norms": 2 * (2 * H + 4),  # fast RMSNorm: bf16 input + fp32 rstd per token
        "linear inputs": 2 * (H + H + H),  # X for q/k/v, o_proj's input, X for gate/up
        "attention": 2 * (H + 2 * KV + H) + 4 * 32,  # q, k, v, out, lse
        "mlp": 2 * 2 * I,  # gate and up (down_proj's input is recomputed)
        "lora": 0.0,
    }


def test_unsloth_offloads_checkpoints_and_keeps_16bit_embeddings():
    est = estimate(EstimateInputs(arch=LLAMA31, framework="unsloth", method="qlora", targets=ALL, rank=16,
                                  gradient_checkpointing=True, seq_len=4096))
    assert est.components["checkpointed hidden states (rest offloaded to host)"] == 2 * 2 * H * 4096
    assert est.components["embeddings, lm_head, norms"] == 2 * (2 * V * H + 65 * H)
    hf = estimate(EstimateInputs(arch=LLAMA31, method="qlora", targets=ALL, rank=16, gradient_checkpointing=True,
                                 seq_len=4096))
    assert hf.components["checkpointed hidden states"] == 32 * 4 * H * 4096  # fp32 stream, every layer
    on_gpu = estimate(EstimateInputs(arch=LLAMA31, framework="unsloth", method="qlora", targets=ALL, rank=16,
                                     gradient_checkpointing=True, seq_len=4096, offload_checkpoints=False))
    assert on_gpu.components["checkpointed hidden states"] == 32 * 2 * H * 4096


# --- precision modes and adapters ----------------------------------------------------------------

def test_no_autocast_lora_keeps_fp32_inputs_per_target():
    auto = layer_activation_parts(inputs(targets=("down_proj",), rank=16))
    plain = layer_activation_parts(inputs(targets=("down_proj",), rank=16, precision="bf16-no-autocast"))
    assert auto["lora"] == 2 * I + 2 * 16  # bf16 copy (autocast re-casts PEFT's fp32 cast) + bf16 intermediate
    assert plain["lora"] == 4 * I + 4 * 16  # fp32 copy of the intermediate-wide input + fp32 intermediate
    est = estimate(EstimateInputs(arch=LLAMA31, targets=("down_proj",), rank=16, precision="bf16-no-autocast"))
    assert est.components["base weights"] == 2 * LLAMA31.total_params()
    assert est.components["LoRA parameters"] == 4 * est.trainable_params


def test_dropout_adds_a_mask_per_target():
    base = layer_activation_parts(inputs(targets=("q_proj", "v_proj")))["lora"]
    dropped = layer_activation_parts(inputs(targets=("q_proj", "v_proj"), dropout=0.05))["lora"]
    assert dropped - base == 2 * H  # one byte per input feature, two targets


def test_peft_method_parameters():
    q_v = inputs(targets=("q_proj", "v_proj"), rank=8)
    assert peft_params(q_v)[0] == 32 * 8 * (H + H + H + KV)
    assert peft_params(replace(q_v, peft="rslora"))[0] == peft_params(q_v)[0]
    assert peft_params(replace(q_v, peft="dora"))[0] == 32 * (8 * (H + H + H + KV) + H + KV)  # + magnitude
    assert peft_params(replace(q_v, peft="adalora"))[0] == 32 * (8 * (H + H + H + KV) + 2 * 8)  # + E
    ia3 = inputs(targets=("k_proj", "v_proj", "down_proj"), peft="ia3")
    assert peft_params(ia3)[0] == 32 * (KV + KV + I)  # down_proj scales its input


def test_a_loop_that_keeps_the_output_keeps_the_half_logits():
    # `outputs = model(**batch); outputs.loss.backward()`: outputs.logits (bf16, tokens x vocab) lives through backward
    base = inputs(batch=4, seq_len=768)
    kept = replace(base, keep_logits=True)
    saved0, transient0 = activation_components(base)
    saved1, transient1 = activation_components(kept)
    assert saved1["logits kept by the training loop"] == 2 * 4 * 768 * V
    assert sum(saved1.values()) - sum(saved0.values()) == 2 * 4 * 768 * V and transient1 == transient0
    assert estimate(kept).peak_allocated_bytes - estimate(base).peak_allocated_bytes == 2 * 4 * 768 * V
    # kernels that return no logits in training (or keep them already) are unchanged
    for loss in ("cce", "liger-flce", "chunked", "fused-ce"):
        assert activation_components(replace(kept, loss=loss)) == activation_components(replace(base, loss=loss))


def test_ia3_feedforward_modules_scale_their_input():
    # PEFT's IA3 on a feed-forward module multiplies the module's input (cast to the fp32 vector) before the frozen
    # linear: an in-wide vector, and the fp32 input kept for the vector's gradient; any other target scales its
    # output (an out-wide vector, 4 bytes per output feature kept, as the default down_proj-only setting does)
    mlp = ("gate_proj", "up_proj", "down_proj")
    default = inputs(targets=mlp, peft="ia3")
    ff = inputs(targets=mlp, peft="ia3", ia3_feedforward=mlp)
    assert peft_params(default)[0] == 32 * (I + I + I)  # gate/up out-wide (I), down_proj in-wide (I)
    assert peft_params(ff)[0] == 32 * (H + H + I)  # gate/up in-wide (h), down_proj in-wide (I)
    assert layer_activation_parts(default)["lora"] == 4 * (I + I + I)
    assert layer_activation_parts(ff)["lora"] == 4 * (H + H + I)
    # spellings of the modules are read as elsewhere (w1 = gate_proj, fused gate_up_proj = gate + up)
    assert peft_params(inputs(targets=mlp, peft="ia3", ia3_feedforward=("gate_up_proj", "w2")))[0] == 32 * (H + H + I)
    with pytest.raises(UserError):  # PEFT: feedforward_modules must be a subset of target_modules
        inputs(targets=("k_proj", "v_proj"), peft="ia3", ia3_feedforward=("down_proj",))


def test_dora_keeps_out_wide_results_and_a_weight_norm_temporary():
    lora = layer_activation_parts(inputs(targets=("q_proj",)))["lora"]
    dora = layer_activation_parts(inputs(targets=("q_proj",), peft="dora"))["lora"]
    assert dora - lora == (2 + 2) * H  # the base output and the lora result, both bf16 under autocast
    saved, transient = activation_components(inputs(targets=("q_proj",), peft="dora", seq_len=256, loss="cce"))
    saved0, transient0 = activation_components(inputs(targets=("q_proj",), seq_len=256, loss="cce"))
    layer_key = "one layer's backward"
    # PEFT rebuilds B A from lora_B(lora_A(eye(in))): the fp32 identity (h x h), B A and W + s B A (fp32)
    assert transient[layer_key] - transient0[layer_key] == 4 * H * H + 8 * H * H


# --- attention -----------------------------------------------------------------------------------

def test_eager_attention_mask_and_backward_scores():
    eager = inputs(attn="eager", seq_len=4096, batch=2)
    assert attention_mask_bytes(eager) == 2 * 2 * 4096 * 4096  # one bf16 (b, 1, s, s) mask
    assert attention_transient_bytes(eager) == (4 + 2) * 2 * 32 * 4096 * 4096
    sdpa = inputs(seq_len=4096, batch=2)
    assert attention_mask_bytes(sdpa) == 0 and attention_transient_bytes(sdpa) == 0
    math = inputs(attn="sdpa_math", seq_len=4096)
    assert layer_activation_parts(math)["attention"] == 2 * (2 * H + H) + 32 * 4096 * 2
    assert attention_transient_bytes(math) == 3 * 2 * 32 * 4096 * 4096


def test_eager_with_checkpointing_peaks_at_the_recomputed_layer():
    est = estimate(EstimateInputs(arch=LLAMA31, attn="eager", seq_len=4096, gradient_checkpointing=True))
    layer = est.components["one layer's backward (recomputed)"]
    assert layer > (6 + 6) * 32 * 4096 * 4096  # recomputed s x s probabilities + their gradients dominate at 4k


# --- more than one GPU ---------------------------------------------------------------------------

def test_per_gpu_sharding_rules():
    kw = dict(weights=16_000, trainable=800, grads=800, optimizer=1_600, layer_bytes=500, layer_grad_bytes=25,
              bucket_bytes=100)
    assert per_gpu("ddp", 4, "none", **kw) == PerGpu(16_000, 800, 800, 1_600, 0, 800, 256 << 20)  # grads twice
    z2 = per_gpu("zero2", 4, "none", **kw)
    assert (z2.weights, z2.grads, z2.optimizer, z2.buckets) == (16_000, 200, 400, 100)
    assert per_gpu("zero2", 4, "optimizer", **kw).optimizer == 0
    z3 = per_gpu("zero3", 4, "none", **kw)
    assert (z3.weights, z3.trainable, z3.grads, z3.optimizer, z3.gathered) == (4_000, 200, 200, 400, 2 * 500 + 25)
    off = per_gpu("zero3", 4, "params", **kw)
    assert (off.weights, off.grads, off.optimizer, off.gathered) == (0, 0, 0, 1_025)
    hybrid = per_gpu("fsdp-hybrid", 16, "none", **kw)  # shards within a node of 8
    assert hybrid.weights == 2_000


def test_zero2_gradient_bucket_is_reduce_bucket_size_elements_doubled_by_overlap_comm():
    # DeepSpeed's stage_1_and_2 backward(): torch.empty(reduce_bucket_size) in the half dtype, a second one with
    # overlap_comm, not sized to the gradients (a q/v LoRA r8 trains 3.4 M parameters, less than one bucket)
    key = "gradient buckets (ZeRO-2 reduce bucket)"
    auto = estimate(EstimateInputs(arch=LLAMA31, gpus=4, strategy="zero2"))
    assert auto.trainable_params == 3_407_872 and auto.components[key] == 4096 * 4096 * 2  # 'auto' = hidden^2, bf16
    qwen = estimate(EstimateInputs(arch=LLAMA31, gpus=4, strategy="zero2", reduce_bucket_size=200_000_000,
                                   overlap_comm=True))
    assert qwen.components[key] == 2 * 200_000_000 * 2 == 800_000_000  # two 2e8-element bf16 buffers
    assert qwen.peak_allocated_bytes - auto.peak_allocated_bytes == 800_000_000 - 33_554_432
    one = estimate(EstimateInputs(arch=LLAMA31, gpus=4, strategy="zero2", reduce_bucket_size=200_000_000))
    assert one.components[key] == 400_000_000  # DeepSpeed's default overlap_comm is off below ZeRO-3
    z3 = estimate(EstimateInputs(arch=LLAMA31, gpus=4, strategy="zero3", reduce_bucket_size=200_000_000))
    assert key not in z3.components


def test_deepspeed_estimator_anchor():
    p, largest = 8_030_261_248, 14336 * 4096
    assert deepspeed_model_states_bytes(2, p, largest, 8) == 4 * p + 16 * p // 8
    assert deepspeed_model_states_bytes(3, p, largest, 8) == 4 * largest + 18 * p // 8
    assert deepspeed_model_states_bytes(3, p, largest, 8, offload_optimizer=True) == 4 * largest + 2 * p // 8
    # the whole-step estimate carries at least DeepSpeed's model states (and activations on top)
    est = estimate(EstimateInputs(arch=LLAMA31, method="full", gpus=8, strategy="zero3", seq_len=512,
                                  gradient_checkpointing=True))
    states = sum(v for k, v in est.components.items() if k.startswith(("base weights", "optimizer states", "gathered")))
    assert states >= 16 * p // 8


def test_fsdp_optimizer_step_runs_on_sharded_parameters_only():
    # after backward FSDP has resharded every unit: at the optimizer step only the shards live. Full fine-tuning of
    # Llama-3.1-8B under bf16 mixed precision on 4 GPUs, CCE loss, 256 tokens: the step is the peak, with
    # fp32 weights 4P/4 + AdamW states 8P/4 + fp32 gradients 4P/4 + foreach AdamW's temporary 4P/4 + 64 MiB workspace
    p = LLAMA31.total_params()
    est = estimate(EstimateInputs(arch=LLAMA31, method="full", targets=(), seq_len=256, gradient_checkpointing=True,
                                  gpus=4, strategy="fsdp", loss="cce"))
    key = "gathered layers (all-gather: current + prefetch, one layer's gradient)"
    assert "optimizer step temporaries" in est.components and key not in est.components
    assert est.peak_allocated_bytes == 20 * p // 4 + (64 << 20)
    # at the backward peak the gathered layers are alive: two bf16 layers + one fp32 layer gradient
    lora = estimate(EstimateInputs(arch=LLAMA31, seq_len=2048, gpus=4, strategy="fsdp"))
    layer = LLAMA31.layer_params()
    assert lora.components[key] == 2 * 2 * layer + 4 * lora.trainable_params // 32


def test_more_gpus_lower_the_per_gpu_peak_only_when_sharded():
    one = estimate(EstimateInputs(arch=LLAMA31, method="full", seq_len=512, gradient_checkpointing=True))
    ddp = estimate(EstimateInputs(arch=LLAMA31, method="full", seq_len=512, gradient_checkpointing=True, gpus=4))
    z3 = estimate(EstimateInputs(arch=LLAMA31, method="full", seq_len=512, gradient_checkpointing=True, gpus=4,
                                 strategy="zero3"))
    assert ddp.inputs.strategy == "ddp" and ddp.device_used_bytes > one.device_used_bytes
    assert z3.device_used_bytes < one.device_used_bytes / 2
    with pytest.raises(UserError):
        estimate(EstimateInputs(arch=LLAMA31, gpus=2, strategy="zero2", offload="params"))
    with pytest.raises(UserError):
        estimate(EstimateInputs(arch=LLAMA31, gpus=2, strategy="ddp", offload="optimizer"))


def test_unsloth_defaults_double_quant_and_in_place_swiglu_backward():
    inp = inputs(framework="unsloth", method="qlora", targets=ALL, gradient_checkpointing=True, seq_len=1024,
                 loss="cce")
    assert inp.double_quant is True  # Unsloth's loader sets bnb_4bit_use_double_quant=True
    _, transient = activation_components(inp)
    per_layer = sum(layer_activation_parts(inp).values())
    dequant = 2 * H * I  # the widest 4-bit weight dequantized to bf16
    # one intermediate-wide gradient (the rest written into the saved gate/up buffers) + hidden-wide gradients
    expected = 1024 * (2 * I + 4 * 2 * H) + int(per_layer * 1024) + dequant
    assert transient["one layer's backward (recomputed)"] == expected


def test_what_if_offers_loss_kernels_and_offloaded_checkpointing_where_the_stack_has_them():
    from loradoctor.estimate.fit import fit, gpu_from_vram

    inp = EstimateInputs(arch=LLAMA31, method="qlora", seq_len=8192, gradient_checkpointing=True)
    est = estimate(inp)
    advice = {c.option: c for c in fit(est.inputs, est, gpu_from_vram("16GB")).advice}
    assert advice["--loss cce"].saves_bytes > 8 * 2**30  # 12 bytes x 8192 x 128256 logits, less CCE's own
    assert advice["--loss liger-flce --liger"].saves_bytes > 8 * 2**30
    assert "--offload-checkpoints" in advice
    lit = EstimateInputs(arch=LLAMA31, method="qlora", seq_len=8192, gradient_checkpointing=True, framework="litgpt")
    est = estimate(lit)
    options = {c.option for c in fit(est.inputs, est, gpu_from_vram("16GB")).advice}
    assert not options & {"--loss cce", "--loss liger-flce --liger", "--offload-checkpoints"}
    uns = EstimateInputs(arch=LLAMA31, method="qlora", seq_len=8192, gradient_checkpointing=True,
                         framework="unsloth", offload_checkpoints=False)
    est = estimate(uns)
    advice = {c.option: c for c in fit(est.inputs, est, gpu_from_vram("16GB")).advice}
    assert "Unsloth" in advice["--offload-checkpoints"].text and "--loss cce" not in advice


def test_qlora_fp32_compute_dtype_keeps_fp32_inputs_and_dequantizes_to_fp32():
    bf16 = layer_activation_parts(inputs(method="qlora", targets=("q_proj",)))
    fp32 = layer_activation_parts(inputs(method="qlora", targets=("q_proj",), compute_dtype="float32"))
    # bf16 compute: each 4-bit linear keeps its own bf16 copy of the fp32 stream (q, k, v, gate, up, down; o_proj
    # reads sdpa's saved bf16 output); fp32 compute: the cast is a no-op for the fp32 attention / MLP inputs (kept
    # once each) and a new fp32 copy of the attention output
    assert bf16["linear inputs"] == 2 * (5 * H + I)
    assert fp32["linear inputs"] == 4 * (2 * H + H + I)
    from loradoctor.estimate.memory import dequant_buffer_bytes
    assert dequant_buffer_bytes(inputs(method="qlora", compute_dtype="fp32")) == 6 * H * I
    assert dequant_buffer_bytes(inputs(method="qlora")) == 2 * H * I
    with pytest.raises(UserError):
        inputs(method="qlora", compute_dtype="int8")


def test_resized_vocabulary_with_modules_to_save():
    est = estimate(EstimateInputs(arch=LLAMA31, vocab=130000, modules_to_save=("embed_tokens", "lm_head"),
                                  seq_len=512))
    assert est.inputs.arch.vocab == 130000
    assert est.components["modules_to_save copies"] == 2 * 2 * 130000 * H  # bf16 copies of both matrices


def test_vision_tower_from_vision_config(tmp_path):
    import json

    from loradoctor.estimate.arch import resolve_arch, vision_tower_params

    cfg = {"model_type": "llava", "text_config": {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32,
                                                  "num_attention_heads": 32, "vocab_size": 32064,
                                                  "intermediate_size": 11008},
           "vision_config": {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24,
                             "patch_size": 14, "image_size": 336}}
    per_layer = 4 * 1024 * 1024 + 2 * 1024 * 4096 + 4 * 1024 + 4096 + 5 * 1024
    embed = (3 * 14 * 14 + 1) * 1024 + 24 * 24 * 1024
    expected = 24 * per_layer + embed + 1024 * 4096 + 4096 * 4096
    assert vision_tower_params(cfg) == expected  # CLIP ViT-L/14-336: ~0.30 B + the projector
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    arch = resolve_arch(str(tmp_path))
    est = estimate(EstimateInputs(arch=arch, seq_len=256))
    assert est.components["vision tower (frozen)"] == 2 * expected
    assert est.total_params == arch.total_params() + expected
