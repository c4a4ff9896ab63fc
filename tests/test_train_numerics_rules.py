"""Edge cases of the training-numerics, training-error and CUDA rules (rules/numerics.yaml,
rules/train.yaml, rules/cuda.yaml) that the fixture folders do not pin down on their own."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import explain_text
from loradoctor.logs.rules import load_rules

RULES = {r.id: r for r in load_rules()}


def _fires_on_line(rule_id: str, text: str) -> bool:
    """Would this one line count as a pattern hit (prefilter literal present and a pattern matches)?"""
    rule = RULES[rule_id]
    if rule.prefilter and not any(lit in text for lit in rule.prefilter):
        return False
    return any(p.search(text) for p in rule.compiled_patterns)


@pytest.mark.parametrize("line, is_fp16", [
    ("fp16=True,", True),
    ("fp16=False,", False),                 # every TrainingArguments dump has these three
    ("fp16_backend=auto,", False),
    ("fp16_opt_level=O1,", False),
    ("bf16=True,", False),
    ("--fp16 True --bf16 False", True),
    ("--fp16=False", False),
    ("--fp16 False", False),
    ("--fp16_full_eval", False),
    ("--mixed_precision fp16", True),
    ("--mixed_precision=bf16", False),
    ("Mixed precision type: fp16", True),
    ('"fp16": {"enabled": true, "loss_scale": 0}', True),
    ('"fp16": {"enabled": false}', False),
    ("compute dtype: torch.float16", True),
    ("compute dtype: torch.bfloat16", False),
    ("Using 16bit Automatic Mixed Precision (AMP)", True),
    ("Using bfloat16 Automatic Mixed Precision (AMP)", False),
    # the model (or its 4-bit compute dtype) loaded in float16: the forward runs in fp16
    ('model = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.float16)', True),
    ("BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.float16)", True),
    ("BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.bfloat16)", False),
    ("swift sft --model_type qwen-7b --torch_dtype float16", True),
    ("Instantiating LlamaForCausalLM model under default dtype torch.float16.", True),
    ('  "torch_dtype": "float16",', False),   # a checkpoint's config.json, not the run
    ("   \\   /|    GPU: Tesla T4. Max memory: 14.741 GB. Platform: Linux.", True),
    ("   \\   /|    GPU: NVIDIA A100-SXM4-40GB. Max memory: 39.39 GB. Platform: Linux.", False),    ("2024-09-20 17:24:23 INFO     unet dtype: torch.float16, device: cuda:0    train_network.py:1058", True),
    ("    INFO     text_encoder [1] dtype: torch.float16, device: cuda:0", True),
    ("2025-07-10 12:52:16 INFO     unet dtype: torch.bfloat16, device: cuda:0", False),
    # torchtune: the recipe config's dtype and the model's precision line
    ("dtype: fp16", True),
    ("dtype: bf16", False),
    ("  compute_dtype: fp16_but_not_the_recipe_dtype", False),
    ("INFO:torchtune.utils._logging:Model is initialized with precision torch.float16.", True),
    ("INFO:torchtune.utils._logging:Model is initialized with precision torch.bfloat16.", False),
    # bitsandbytes: 4-bit layers fed float16 activations (the forward runs in fp16)
    ("UserWarning: Input type into Linear4bit is torch.float16, but bnb_4bit_compute_dtype=torch.float32 (default).", True),
    ("UserWarning: Input type into Linear4bit is torch.bfloat16, but bnb_4bit_compute_dtype=torch.float32 (default).", False),
])
def test_fp16_evidence_lines(line, is_fp16):
    assert _fires_on_line("fp16-nan-loss", line) is is_fp16


def _records(losses, grad_norms=None, lr=2e-4):
    grad_norms = grad_norms or [0.5] * len(losses)
    return "\n".join(
        f"{{'loss': {l}, 'grad_norm': {g}, 'learning_rate': {lr}, 'epoch': {round((i + 1) / 100, 2)}}}"
        for i, (l, g) in enumerate(zip(losses, grad_norms))
    )


def _explain(tmp_path: Path, text: str):
    return explain_text(tmp_path, text)


def test_nan_from_the_first_record_in_bf16_is_masking_not_fp16(tmp_path):
    text = "fp16=False,\nbf16=True,\nfp16_opt_level=O1,\n" + _records(["nan"] * 12, ["nan"] * 12)
    report = _explain(tmp_path, text)
    causes = [f.cause for f in report.findings if f.rule != "differential"]
    assert causes and causes[0] == "loss.zero"
    assert "nan.fp16_overflow" not in causes


def test_same_nan_run_in_fp16_is_overflow_with_medium_confidence(tmp_path):
    # nan from the first record: overflow and all-masked labels give the same numbers, so the
    # fp16 reading comes first but only at medium confidence, and its first fix is the label check.
    text = "fp16=True,\nbf16=False,\n" + _records(["nan"] * 12, ["nan"] * 12)
    report = _explain(tmp_path, text)
    first = report.findings[0]
    assert (first.cause, first.rule) == ("nan.fp16_overflow", "fp16-nan-from-first-record")
    assert first.confidence_label == "medium"
    assert "-100" in first.fixes[0].text
    assert "fp16-nan-loss" not in [f.rule for f in report.findings]
    assert "loss.zero" not in [f.cause for f in report.findings if f.rule != "differential"]


def test_fp16_nan_after_finite_records_stays_high_confidence(tmp_path):
    text = "fp16=True,\n" + _records([1.9, 1.7, 1.6] + ["nan"] * 6, [0.5, 0.4, 0.4] + ["nan"] * 6)
    report = _explain(tmp_path, text)
    assert report.findings[0].rule == "fp16-nan-loss"
    assert report.findings[0].confidence_label == "high"
    assert "fp16-nan-from-first-record" not in [f.rule for f in report.findings]


@pytest.mark.parametrize("line, fires", [
    ("Exception: Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.", True),
    ("[Rank 0] Overflow detected. Skipping step. Attempted loss scale: 1.0, reducing to 1.0", True),
    ("[Rank 0] Overflow detected. Skipping step. Attempted loss scale: 0.5, reducing to 0.25", True),
    ("[Rank 0] Overflow detected. Skipping step. Attempted loss scale: 2048.0, reducing to 1024.0", False),
    ("[Rank 0] Overflow detected. Skipping step. Attempted loss scale: 16.0, reducing to 8.0", False),
    ("Reducing dynamic loss scale from 1.0 to 1.0", True),
    ("Reducing dynamic loss scale from 134217728.0 to 67108864.0", False),
])
def test_loss_scale_minimum_lines(line, fires):
    assert _fires_on_line("fp16-loss-scale-minimum-message", line) is fires


@pytest.mark.parametrize("loss, fires", [("0.6931", True), ("1.0986", True), ("1.3863", True),
                                         ("0.6937", False), ("2.0794", False)])
def test_flat_loss_at_chance_level(tmp_path, loss, fires):
    report = _explain(tmp_path, _records([loss] * 3, [0.0] * 3))
    assert ("loss-flat-at-chance" in [f.rule for f in report.findings]) is fires


@pytest.mark.parametrize("line, kernel", [
    ("../aten/src/ATen/native/cuda/Loss.cu:94: operator(): block: [0,0,0], thread: [12,0,0] "
     "Assertion `input_val >= zero && input_val <= one` failed.", "operator"),
    ("/pytorch/aten/src/THC/THCTensorIndex.cu:361: void indexSelectLargeIndex(TensorInfo<T, IndexType>, "
     "TensorInfo<long, IndexType>, int, int, IndexType, IndexType, long) [with T = float, IndexType = unsigned int, "
     "DstDim = 2, SrcDim = 2, IdxDim = -2, IndexIsMajor = true]: block: [485,0,0], thread: [47,0,0] "
     "Assertion `srcIndex < srcSelectDimSize` failed.", "indexSelectLargeIndex"),
])
def test_kernel_assert_line_forms(line, kernel):
    rule = RULES["cuda-device-side-assert"]
    matches = [m for m in (p.search(line) for p in rule.compiled_patterns) if m]
    assert matches and matches[0].group("kernel") == kernel


@pytest.mark.parametrize("line, is_row", [
    ("| 75   | nan           |", True),
    ("75\tnan\tnan", True),
    ("| 50   | 1.402200      | nan             |", False),   # only the validation loss is nan
    ("|------|---------------|", False),
])
def test_notebook_table_nan_rows(line, is_row):
    assert _fires_on_line("nan-loss-notebook-table", line) is is_row


def test_healthy_fp16_run_with_skipped_first_steps_reports_nothing_bad(tmp_path):
    losses = [round(1.8 - i * 0.01, 4) for i in range(60)]
    grads = ["inf", "nan", "inf", "nan"] + [0.4] * 56
    text = ("fp16=True,\n`use_cache=True` is incompatible with gradient checkpointing. Setting `use_cache=False`.\n"
            + _records(losses, grads))
    report = _explain(tmp_path, text)
    assert [f for f in report.findings if f.severity in ("error", "warning")] == []


def test_zero_trainable_params_outranks_the_no_grad_error_it_causes(tmp_path):
    text = ("trainable params: 0 || all params: 6,738,415,616 || trainable%: 0.0000\n"
            "Traceback (most recent call last):\n"
            '  File "train.py", line 9, in <module>\n'
            "    loss.backward()\n"
            "RuntimeError: element 0 of tensors does not require grad and does not have a grad_fn\n")
    report = _explain(tmp_path, text)
    by_rule = {f.rule: f for f in report.findings}
    assert report.findings[0].rule == "peft-zero-trainable-params"
    assert by_rule["gc-no-grad-fn"].consequence_of is not None


def test_loss_that_plateaus_in_the_fourth_decimal_is_not_flat(tmp_path):
    losses = [round(1.2345 - 0.0002 * i, 4) for i in range(40)]
    report = _explain(tmp_path, _records(losses))
    assert "loss.flat" not in [f.cause for f in report.findings if f.rule != "differential"]


def test_illegal_access_after_a_device_assert_is_its_consequence(tmp_path):
    text = ("../aten/src/ATen/native/cuda/Indexing.cu:1289: indexSelectLargeIndex: block: [1,0,0], thread: [0,0,0] "
            "Assertion `srcIndex < srcSelectDimSize` failed.\n"
            "RuntimeError: CUDA error: device-side assert triggered\n"
            "RuntimeError: CUDA error: an illegal memory access was encountered\n")
    report = _explain(tmp_path, text)
    assert report.findings[0].cause == "cuda.device_assert"
    illegal = [f for f in report.findings if f.cause == "cuda.illegal_access"]
    assert illegal and illegal[0].consequence_of is not None


@pytest.mark.parametrize("rule_id, line, fires", [
    ("cuda-launch-timeout", "RuntimeError: CUDA error: the launch timed out and was terminated", True),
    ("cuda-launch-timeout", "RuntimeError: cuda runtime error (6) : the launch timed out and was terminated at x.cpp:36", True),
    ("cuda-launch-timeout", "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9) ran for 600047 milliseconds "
                            "before timing out.", False),
    ("unsloth-labels-all-masked", "ValueError: Unsloth: train_on_responses_only masked every label to -100 in "
                                  "train_dataset, so there is nothing to train on.", True),
    ("unsloth-labels-all-masked", "Unsloth: Most labels in your dataset are -100.", True),
    ("unsloth-labels-all-masked", "labels in your dataset are -100 (quoted from the Unsloth docs)", False),
])
def test_new_message_forms(rule_id, line, fires):
    assert _fires_on_line(rule_id, line) is fires


@pytest.mark.parametrize("line, fires", [
    ('ValueError: Trying to set a tensor of shape torch.Size([32000, 4096]) in "weight" (which has shape '
     'torch.Size([49013, 4096])), this look incorrect.', True),
    ('ValueError: Trying to set a tensor of shape torch.Size([128256, 8192]) in "weight" (which has shape '
     'torch.Size([0])), this looks incorrect.', False),          # ZeRO-3 placeholder, not a vocabulary
    ('ValueError: Trying to set a tensor of shape torch.Size([11008, 4096]) in "weight" (which has shape '
     'torch.Size([13824, 4096])), this looks incorrect.', False),  # MLP widths: another model, not a vocabulary
])
def test_set_tensor_vocab_mismatch(line, fires):
    assert _fires_on_line("vocab-size-mismatch-set-tensor", line) is fires


def test_printed_loss_tensors_need_a_finite_print_and_fp16(tmp_path):
    finite_then_nan = "tensor(2.4410, device='cuda:0')\n" + "tensor(nan, device='cuda:0')\n" * 4
    half = "model = AutoModel.from_pretrained(name).half().cuda()\n"
    fires = lambda text: "printed-loss-tensor-nan-fp16" in [f.rule for f in _explain(tmp_path, text).findings]
    assert fires(half + finite_then_nan)
    assert not fires(finite_then_nan)                                     # precision not shown
    assert not fires(half + "tensor(nan, device='cuda:0')\n" * 5)         # nan from the first print


def test_meta_tensor_error_is_device_placement(tmp_path):
    text = ("Some parameters are on the meta device because they were offloaded to the cpu.\n"
            "NotImplementedError: Cannot copy out of meta tensor; no data! Please use torch.nn.Module.to_empty() "
            "instead of torch.nn.Module.to() when moving module from meta to a different device.\n")
    assert _explain(tmp_path, text).findings[0].cause == "train.device_mismatch"


def test_multinomial_kernel_assert_is_nan_probabilities_with_the_assert_as_consequence(tmp_path):
    text = ("../aten/src/ATen/native/cuda/MultinomialKernel.cu:112: binarySearchForMultinomial: block: [0,0,0], "
            "thread: [0,0,0] Assertion `cumdist[size - 1] > static_cast<scalar_t>(0)` failed.\n"
            "    next_tokens = torch.multinomial(probs, num_samples=1).squeeze(1)\n"
            "RuntimeError: CUDA error: device-side assert triggered\n")
    report = _explain(tmp_path, text)
    assert report.findings[0].rule == "generate-nan-probabilities"
    asserts = [f for f in report.findings if f.cause == "cuda.device_assert"]
    assert asserts and asserts[0].consequence_of is not None


def test_index_assert_alone_stays_the_root(tmp_path):
    text = ("../aten/src/ATen/native/cuda/Indexing.cu:1289: indexSelectLargeIndex: block: [9,0,0], thread: [0,0,0] "
            "Assertion `srcIndex < srcSelectDimSize` failed.\nRuntimeError: CUDA error: device-side assert triggered\n")
    report = _explain(tmp_path, text)
    assert report.findings[0].cause == "cuda.device_assert"
    assert report.findings[0].consequence_of is None


@pytest.mark.parametrize("text, cause", [
    ("fp16=True,\nTrainOutput(global_step=60, training_loss=nan, metrics={'train_loss': nan})\n", "nan.fp16_overflow"),
    ("bf16=True,\nTrainOutput(global_step=60, training_loss=nan, metrics={'train_loss': nan})\n", None),
    ("TrainOutput(global_step=120, training_loss=0.0, metrics={'train_loss': 0.0})\n", "loss.zero"),
    ("  Continuing training from checkpoint, will skip to saved global_step\n"
     "TrainOutput(global_step=500, training_loss=0.0, metrics={'train_loss': 0.0})\n", None),
    ("TrainOutput(global_step=120, training_loss=0.0213, metrics={'train_loss': 0.0213})\n", None),
])
def test_trainoutput_only_pastes(tmp_path, text, cause):
    findings = _explain(tmp_path, text).findings
    assert (findings[0].cause if findings else None) == cause


def test_short_paste_with_a_grad_norm_blowup_before_the_nan_is_divergence(tmp_path):
    # The last lines only: one finite record whose grad_norm is already in the thousands, then nan.
    text = _records(["8.9127", "nan", "nan"], ["2412.7", "nan", "nan"], lr=1e-3)
    report = _explain(tmp_path, text)
    assert report.findings and report.findings[0].cause == "nan.divergence"
    # A normal grad_norm before the same nans is not divergence (overflow jumps straight to nan).
    calm = _explain(tmp_path, _records(["1.4127", "nan", "nan"], ["0.41", "nan", "nan"]))
    assert "nan.divergence" not in [f.cause for f in calm.findings if f.rule != "differential"]


def test_nan_from_the_first_record_of_losses_that_cannot_be_masked_is_not_masking(tmp_path):
    dpo = "\n".join(
        f"{{'loss': nan, 'grad_norm': nan, 'learning_rate': {i}e-07, 'rewards/chosen': nan, 'rewards/rejected': nan, 'epoch': 0.0{i}}}"
        for i in range(1, 5))
    assert "loss.zero" not in [f.cause for f in _explain(tmp_path, dpo).findings if f.rule != "differential"]
    bars = "\n".join(f"steps:   {i}%|   | {i * 12}/1500 [00:51<1:46:02,  4.28s/it, avr_loss=nan]" for i in range(1, 5))
    causes = [f.cause for f in _explain(tmp_path, bars).findings if f.rule != "differential"]
    assert causes and causes[0] == "nan.fp16_overflow" and "loss.zero" not in causes


def test_diffusion_avr_loss_nan_is_silent_for_bf16_runs(tmp_path):
    text = ("accelerate launch --mixed_precision bf16 train_network.py --mixed_precision=bf16\n"
            "steps:  10%|█   | 120/1200 [02:05<18:39,  1.04s/it, avr_loss=nan]\n")
    assert "diffusion-avr-loss-nan" not in [f.rule for f in _explain(tmp_path, text).findings]


@pytest.mark.parametrize("config, fires", [("dtype: fp16", True), ("dtype: bf16", False)])
def test_torchtune_bar_loss_nan_needs_fp16_and_a_finite_loss_first(tmp_path, config, fires):
    bars = ("1|3|Loss: 1.6920441389083862:   0%|          | 3/1617 [00:26<3:56:02,  8.80s/it]\n"
            "1|4|Loss: nan:   0%|          | 4/1617 [00:35<3:55:11,  8.76s/it]\n")
    report = _explain(tmp_path, config + "\n" + bars)
    assert ("torchtune-bar-loss-nan-fp16" in [f.rule for f in report.findings]) is fires
    only_nan = _explain(tmp_path, config + "\n1|1|Loss: nan:   0%|          | 1/1617 [00:09<4:05:51,  9.13s/it]\n")
    assert "torchtune-bar-loss-nan-fp16" not in [f.rule for f in only_nan.findings]


def test_wandb_summary_nan_without_precision_is_reported(tmp_path):
    text = "wandb: Run summary:\nwandb:         train/grad_norm nan\nwandb:              train/loss nan\n"
    report = _explain(tmp_path, text)
    assert report.findings and report.findings[0].rule == "nan-loss-precision-unknown"


@pytest.mark.parametrize("records, cause", [(3, "nan.divergence"), (4, "nan.divergence"), (6, "loss.zero")])
def test_all_nan_paste_needs_five_records_to_claim_masking(tmp_path, records, cause):
    # The last few lines of a run that went nan look like a run that was nan from the start: under five
    # records the bf16 run gets only the labelled guess (divergence), never a masking claim.
    report = _explain(tmp_path, "bf16=True,\n" + _records(["nan"] * records, ["nan"] * records))
    named = [f for f in report.findings if f.rule != "differential"]
    assert named and named[0].cause == cause
    if records < 5:
        assert named[0].rule == "nan-loss-few-records-bf16-guess" and named[0].confidence_label == "guess"
        assert "loss.zero" not in [f.cause for f in named]


# --- third real-log QA round: short pastes and messy shapes ---------------------------------------

@pytest.mark.parametrize("line, fires", [
    ("Error invalid program counter at line 74 in file /src/csrc/ops.cu", True),
    ("RuntimeError: CUDA error: invalid program counter", True),
    ("al memory access was encountered Compile with TORCH_USE_CUDA_DSA to enable device-side assertions.", True),
    ("Memory access fault by GPU node-2 (Agent handle: 0x55d8c2a4f1b0) on address 0x7f2a1c600000. Reason: Unknown.", True),
    # a word that merely ends in -al before the phrase, mid-line, is not the wrapped tail
    ("the normal memory access was encountered in the profiler", False),
    ("Error operation not supported at line 380 in file /src/csrc/pythonInterface.c", False),
])
def test_illegal_access_short_forms(line, fires):
    assert _fires_on_line("cuda-illegal-memory-access", line) is fires


def _first(tmp_path: Path, text: str):
    findings = _explain(tmp_path, text).findings
    return findings[0] if findings else None


def test_a_single_nan_record_is_a_labelled_guess_not_silence(tmp_path):
    first = _first(tmp_path, "{'loss': nan, 'grad_norm': nan, 'learning_rate': 0.0001, 'epoch': 0.41}\n")
    assert first is not None and first.cause == "nan.fp16_overflow"
    assert first.rule == "nan-loss-few-records-guess" and first.confidence <= 0.25


def test_the_few_records_guess_never_outranks_a_specific_error(tmp_path):
    text = ("{'loss': nan, 'grad_norm': nan, 'learning_rate': 0.0001, 'epoch': 0.41}\n"
            "RuntimeError: element 0 of tensors does not require grad and does not have a grad_fn\n")
    assert _first(tmp_path, text).cause == "train.no_grad"


def test_the_few_records_guess_stays_silent_for_bf16_and_long_series(tmp_path):
    # in bf16 the fp16 guess is silent; its bf16 twin names divergence, as a guess
    bf16 = _explain(tmp_path, "bf16=True\n{'loss': nan, 'grad_norm': nan, 'learning_rate': 0.0001, 'epoch': 0.4}\n")
    assert [f.rule for f in bf16.findings if f.rule != "differential"] == ["nan-loss-few-records-bf16-guess"]
    # six records, three of them finite first: the fuller rules decide, not the guess
    rules = {f.rule for f in _explain(tmp_path, _records([1.2, 1.1, 1.0, "nan", "nan", "nan"]) + "\n").findings}
    assert "nan-loss-few-records-guess" not in rules


def test_bf16_sudden_nan_is_divergence_with_low_confidence(tmp_path):
    text = "  bf16=True,\n" + _records([1.5 - i * 0.01 for i in range(12)] + ["nan"] * 4) + "\n"
    first = _first(tmp_path, text)
    assert first.cause == "nan.divergence" and first.rule == "nan-loss-bf16-sudden"
    assert first.confidence < 0.5
    # the same records in fp16 are overflow
    assert _first(tmp_path, text.replace("bf16", "fp16")).cause == "nan.fp16_overflow"


@pytest.mark.parametrize("line, fires", [
    ("\tsize mismatch for model.mm_projector.0.weight: copying a param with shape torch.Size([5120, 1024]) from "
     "checkpoint, the shape in current model is torch.Size([4096, 1024]).", True),
    ("\tsize mismatch for classifier.out_proj.weight: copying a param with shape torch.Size([5, 768]) from "
     "checkpoint, the shape in current model is torch.Size([3, 768]).", False),
    ("\tsize mismatch for model.layers.0.mlp.up_proj.weight: copying a param with shape torch.Size([11008, 4096]) "
     "from checkpoint, the shape in current model is torch.Size([0]).", False),
])
def test_adapter_checkpoint_shape_mismatch_lines(line, fires):
    assert _fires_on_line("adapter-checkpoint-shape-mismatch", line) is fires


def test_windows_crlf_jupyter_paste_of_no_grad(tmp_path):
    text = ("-" * 75 + "\r\nRuntimeError                              Traceback (most recent call last)\r\n"
            "Cell In[14], line 7\r\n----> 7 trainer.train()\r\n\r\n"
            "File C:\\Users\\u\\envs\\lora\\Lib\\site-packages\\torch\\_tensor.py:522, in Tensor.backward(self)\r\n"
            "RuntimeError: element 0 of tensors does not require grad and does not have a grad_fn\r\n")
    assert _first(tmp_path, text).cause == "train.no_grad"
