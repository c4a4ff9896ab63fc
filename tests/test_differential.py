"""The differential (docs/explain.md): a verdict whose discriminating numbers are missing or near a
boundary carries its look-alikes with their own rank, lower confidence, evidence and what tells them
apart; a log no rule recognised but whose last failure line names a family gets a labelled guess."""

from __future__ import annotations

import json

import pytest

from loradoctor.logs import differential
from loradoctor.logs.rules import load_rules
from loradoctor.render.explain_view import explain_md
from loradoctor.render.json import dumps

from conftest import explain_text  # noqa: E402

# G2 message: 20 MiB requested, 11 MiB free, 150 MiB cached: capacity, but the cache could have served it
AMBIGUOUS_OOM = ("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 7.79 GiB total "
                 "capacity; 6.41 GiB already allocated; 11.06 MiB free; 6.56 GiB reserved in total by PyTorch)\n")
# G4 message with 9 GiB reserved but unallocated for a 2 GiB request: fragmentation beyond doubt
CLEAR_FRAGMENTATION = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB "
    "of which 1.05 GiB is free. Including non-PyTorch memory, this process has 78.09 GiB memory in use. Of the allocated "
    "memory 68.50 GiB is allocated by PyTorch, and 9.00 GiB is reserved by PyTorch but unallocated. If reserved but "
    "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.\n")


def test_an_ambiguous_oom_lists_its_look_alikes_after_the_verdict(tmp_path):
    report = explain_text(tmp_path, AMBIGUOUS_OOM)
    causes = [f.cause for f in report.findings]
    assert causes[0] == "oom.capacity"
    assert "oom.fragmentation" in causes[1:3]
    verdict = report.findings[0]
    assert verdict.differential and verdict.differential[0]["cause"] == causes[1]
    alt = report.findings[1]
    assert alt.rule == "differential" and alt.confidence < verdict.confidence and alt.confidence_label in ("low", "guess")
    assert alt.evidence and alt.evidence[0].line == 1  # the same OOM line, read another way
    assert any("expandable_segments" in d["tells_apart"] for d in verdict.differential)


def test_an_error_found_on_its_own_evidence_is_not_placed_below_the_look_alikes():
    """A look-alike (0.3) only rereads the verdict's lines; another rule's error at high confidence (the
    bitsandbytes failure after the sm_120 refusal) stays right after the verdict."""
    from conftest import ROOT
    from loradoctor.logs.engine import explain

    report = explain([str(ROOT / "fixtures" / "cascades" / "sm120-unsupported-then-bnb-error")])
    order = [(f.cause, f.rule) for f in report.findings]
    assert order[0][0] == "env.arch_unsupported" and order[1][0] == "env.bnb_broken", order
    assert any(rule == "differential" for _, rule in order[2:4]), order


def test_a_clear_verdict_does_not_list_a_ruled_out_look_alike(tmp_path):
    report = explain_text(tmp_path, CLEAR_FRAGMENTATION)
    assert report.findings[0].cause == "oom.fragmentation"
    # 9 GiB unallocated is far more than twice the request: capacity is not a plausible reading
    assert "oom.capacity" not in [d["cause"] for d in report.findings[0].differential]


def test_the_differential_is_in_json_text_and_markdown(tmp_path):
    report = explain_text(tmp_path, AMBIGUOUS_OOM)
    doc = json.loads(dumps(report.to_dict()))
    assert {"schema", "status", "inputs", "findings"} <= set(doc)
    entry = doc["findings"][0]["differential"][0]
    assert {"cause", "confidence", "confidence_label", "rank", "tells_apart", "evidence"} <= set(entry)
    md = explain_md(report)
    assert "Could also be (the differential):" in md and entry["tells_apart"] in md
    from loradoctor.render.explain_view import explain_text as render_text
    from loradoctor.render.text import Painter

    shown = render_text(report, Painter(color=False, width=200))
    assert "could also be" in shown and entry["tells_apart"] in shown


def test_an_unrecognised_failure_line_gets_a_labelled_guess(tmp_path):
    text = ("Loading checkpoint shards: 100%|##########| 2/2 [00:04<00:00,  2.10s/it]\n"
            "Traceback (most recent call last):\n"
            '  File "/w/train.py", line 88, in <module>\n'
            "    trainer.train()\n"
            "RuntimeError: NCCL communicator init failed on rank 3 (bootstrap: remote process exited)\n")
    report = explain_text(tmp_path, text)
    top = report.findings[0]
    assert top.rule == "guess" and top.confidence_label == "guess" and top.severity == "warning"
    assert top.cause == "dist.nccl_error" and top.title.startswith("Guess:")
    assert [d["cause"] for d in top.differential]  # and its alternatives


@pytest.mark.parametrize("prefix", ["2024-05-01T10:00:00.123Z stdout F ", "trainer-1  | ", "> "])
def test_a_guess_reads_the_failure_line_behind_a_collectors_prefix(tmp_path, prefix):
    """kubelet's CRI tag, docker compose's service column or a reply's `> ` before every line: the guesses'
    patterns anchor at the message's start, so the tail line is read without the prefix."""
    text = "".join(prefix + line + "\n" for line in (
        "Traceback (most recent call last):", '  File "/w/train.py", line 88, in <module>', "    trainer.train()",
        "RuntimeError: NCCL communicator init failed on rank 3 (bootstrap: remote process exited)"))
    top = explain_text(tmp_path, text).findings[0]
    assert top.rule == "guess" and top.cause == "dist.nccl_error"
    assert top.evidence[0].text.endswith("remote process exited)")


@pytest.mark.parametrize("text", [
    # a warning that quotes an error class is no failure line
    "/opt/peft/utils/other.py:1110: UserWarning: Unable to fetch remote file due to the following error "
    "(MaxRetryError(\"HTTPSConnectionPool(host='huggingface.co', port=443)\"))\n",
    # a run that trained to the end
    "RuntimeError: NCCL warning printed by a callback\n{'train_runtime': 12.0, 'train_loss': 1.2, 'epoch': 1.0}\n",
    # a failure line that names no family
    "KeyError: 'lr_scheduler_kwargs'\n",
    # a dataset path the script was given that does not exist: the user's path, not a model file
    "FileNotFoundError: Unable to find '/workspace/data/train.jsonl'\n",
    # Python's own index errors are the script's bug, not a CUDA kernel's assert (torch's `index out of range
    # in self` is one)
    "  File \"train.py\", line 3, in <module>\n    x = rows[5]\nIndexError: list index out of range\n",
    "IndexError: tuple index out of range\n",
])
def test_no_guess_without_a_failure_that_names_a_family(tmp_path, text):
    report = explain_text(tmp_path, text)
    assert not [f for f in report.findings if f.rule in ("guess", "differential")]


def test_an_exception_raised_inside_a_stack_library_is_a_last_resort_version_guess(tmp_path):
    """No rule and no family word: an exception whose innermost frame is a LoRA-stack library's own code
    (site-packages/trl, a LLaMA-Factory checkout) is guessed a version conflict, with the data format and an
    unsupported trainer patch as look-alikes; the same exception raised by the script's own code, or inside
    torch, is no guess."""
    def report(innermost: str):
        return explain_text(tmp_path, (
            "Traceback (most recent call last):\n"
            '  File "/home/u/ft/train.py", line 88, in <module>\n    trainer.train()\n'
            f'  File "{innermost}", line 412, in _prepare\n    a, b = self._split(batch)\n'
            "TypeError: cannot unpack non-iterable NoneType object\n"))

    for path, package in [("/opt/conda/lib/python3.11/site-packages/trl/trainer/grpo_trainer.py", "trl"),
                          ("/home/u/LLaMA-Factory/src/llamafactory/train/sft/workflow.py", "llamafactory"),
                          ("C:\\Users\\u\\miniconda3\\Lib\\site-packages\\unsloth_zoo\\rl_replacements.py", "unsloth_zoo")]:
        r = report(path)
        assert r.facts.get("trace.raised_in") == package, path
        assert [(f.cause, f.rule) for f in r.findings] == [
            ("env.version_conflict", "guess"), ("train.dataset_format", "differential"),
            ("train.patch_unsupported", "differential")], path
    for path in ("/home/u/ft/collate.py", "/opt/conda/lib/python3.11/site-packages/torch/nn/functional.py"):
        r = report(path)
        assert "trace.raised_in" not in r.facts and not r.findings, path


def test_the_table_names_only_catalogue_causes():
    causes = {r.cause for r in load_rules()}
    from loradoctor.logs.rules import cause_ids

    known = set(cause_ids())
    table, guesses = differential.load_table()
    named = set(table) | {a.cause for alts in table.values() for a in alts}
    named |= {g.cause for g in guesses} | {c for g in guesses for c in g.alternatives}
    assert named <= known, sorted(named - known)
    assert causes <= known


def test_a_look_alike_never_claims_more_confidence_than_its_verdict(tmp_path):
    # one nan in a bar's postfix: the guess rule names fp16 overflow (0.2); divergence beside it used to read 0.3,
    # so the second candidate claimed more than the first
    report = explain_text(tmp_path, "Epoch 1/3: 100%|##########| 500/500 [05:00<00:00, loss=nan]\n")
    top = report.findings[0]
    assert top.rule == "nan-loss-few-records-guess" and top.confidence == pytest.approx(0.2)
    alts = [f for f in report.findings if f.rule == "differential"]
    assert alts and all(f.confidence < top.confidence for f in alts)
    assert [d["confidence"] for d in top.differential] == sorted((d["confidence"] for d in top.differential), reverse=True)
    # a verdict above the look-alikes' level keeps them at `low` (0.3, then 0.25)
    ambiguous = explain_text(tmp_path, AMBIGUOUS_OOM)
    assert [d["confidence"] for d in ambiguous.findings[0].differential][:2] == [0.3, 0.25]


@pytest.mark.parametrize("text", [
    "RuntimeError: \"addmm_impl_cpu_\" not implemented for 'Half'\n",
    "runtimeerror: \"addmm_impl_cpu_\" not implemented for 'half'\n",
    # an issue title without its exception class
    "\"LayerNormKernelImpl\" not implemented for 'Half'\n",
    "RuntimeError: \"slow_conv2d_cpu\" not implemented for 'Half'\n",
])
def test_a_half_kernel_refused_on_the_cpu_is_a_labelled_guess_of_a_cpu_run(tmp_path, text):
    report = explain_text(tmp_path, text)
    top = report.findings[0]
    assert top.rule == "guess" and top.cause == "env.no_gpu_visible"
    assert [d["cause"] for d in top.differential] == ["env.torch_cpu_only", "train.device_mismatch"]


def test_a_cuda_kernel_refusing_a_dtype_is_no_cpu_guess(tmp_path):
    # the same refusal by a CUDA kernel is a dtype question, not a run on the CPU
    report = explain_text(tmp_path, "RuntimeError: \"index_add_cuda_\" not implemented for 'Float8_e4m3fn'\n")
    assert not [f for f in report.findings if f.cause == "env.no_gpu_visible"]


@pytest.mark.parametrize("text, cause", [
    # an issue title cut before the GEMM's dtype: in fine-tuning most often bf16 on a pre-Ampere card
    ("RuntimeError: CUDA error: CUBLAS_STATUS_NOT_SUPPORTED when calling `cublasGemmStridedBatchedEx\n",
     "env.bf16_unsupported"),
    ("runtimeerror: cuda error: cublas_status_not_supported when calling `cublasgemmstridedbatchedex(handle, opa\n",
     "env.bf16_unsupported"),
    # an fp16 or fp32 GEMM is no bf16 question
    ("RuntimeError: CUDA error: CUBLAS_STATUS_NOT_SUPPORTED when calling `cublasGemmEx( handle, opa, opb, m, n, k, "
     "&falpha, a, CUDA_R_16F, lda, b, CUDA_R_16F, ldb\n", None),
    ("RuntimeError: CUDA error: CUBLAS_STATUS_NOT_SUPPORTED when calling `cublasSgemmStridedBatched( handle, opa\n",
     None),
])
def test_a_cublas_refusal_cut_before_its_dtype_is_a_bf16_guess(tmp_path, text, cause):
    report = explain_text(tmp_path, text)
    if cause is None:
        assert not [f for f in report.findings if f.cause == "env.bf16_unsupported"]
        return
    top = report.findings[0]
    assert top.rule == "guess" and top.cause == cause
    assert [d["cause"] for d in top.differential] == ["env.version_conflict", "env.arch_unsupported"]


@pytest.mark.parametrize("text", [
    "RuntimeError: cutlassF: no kernel found to launch!\n",
    "runtimeerror: cutlassf: no kernel found to launch!\n",
])
def test_no_sdpa_kernel_for_the_dtype_is_a_bf16_guess(tmp_path, text):
    top = explain_text(tmp_path, text).findings[0]
    assert top.rule == "guess" and top.cause == "env.bf16_unsupported"
    assert [d["cause"] for d in top.differential] == ["env.version_conflict", "env.arch_unsupported"]


# An OOM inside from_pretrained. This process holds the card (23.30 of 23.55 GiB), so no other process is a
# reading; nothing in the log says the model was to be quantized, so bitsandbytes is not one either (issue 10:
# the load's 2nd and 3rd readings were another process and bitsandbytes whatever the log said).
LOAD_FRAMES = ('Traceback (most recent call last):\n'
               '  File "/home/u/train.py", line 12, in <module>\n'
               '    model = AutoModelForCausalLM.from_pretrained(name, device_map="cuda")\n'
               '  File "/venv/lib/python3.10/site-packages/transformers/modeling_utils.py", line 4200, in from_pretrained\n'
               '    model = cls._load_pretrained_model(model, state_dict)\n')
LOAD_OOM_OWN = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 500.00 MiB. GPU 0 has a total capacity of "
                "23.55 GiB of which 200.00 MiB is free. Including non-PyTorch memory, this process has 23.30 GiB memory in "
                "use. Of the allocated memory 22.90 GiB is allocated by PyTorch, and 150.00 MiB is reserved by PyTorch but "
                "unallocated.\n")
LOAD_OOM_SHARED = LOAD_OOM_OWN.replace("this process has 23.30 GiB", "this process has 21.80 GiB").replace(
    "22.90 GiB is allocated", "21.40 GiB is allocated")


def _load_readings(tmp_path, text: str) -> list[tuple[str, str]]:
    report = explain_text(tmp_path, text)
    assert report.findings[0].cause == "oom.model_load"
    return [(d["cause"], d["tells_apart"]) for d in report.findings[0].differential]


def test_a_load_oom_offers_bitsandbytes_only_when_the_log_shows_quantized_loading(tmp_path):
    assert _load_readings(tmp_path, LOAD_FRAMES + LOAD_OOM_OWN) == []
    quantized = "$ python train.py --model meta-llama/Llama-2-13b-hf --load_in_4bit True\n" + LOAD_FRAMES + LOAD_OOM_OWN
    assert [c for c, _ in _load_readings(tmp_path, quantized)] == ["env.bnb_broken"]
    # a package list naming bitsandbytes' version shows it installed, not the model loaded with it
    listed = "bitsandbytes==0.43.1\ntransformers==4.44.2\n" + LOAD_FRAMES + LOAD_OOM_OWN
    assert _load_readings(tmp_path, listed) == []


def test_a_load_oom_offers_another_process_when_the_numbers_or_the_ranks_leave_room(tmp_path):
    # 1.5 GiB in use that this process does not hold (too little for the other-process rules to name it first)
    assert [c for c, _ in _load_readings(tmp_path, LOAD_FRAMES + LOAD_OOM_SHARED)] == ["oom.other_process"]
    # several ranks and no numbers: each rank loading the whole model onto GPU 0
    ranks = "".join(f"[rank{r}]: {line}\n" for r in (0, 1) for line in
                    (LOAD_FRAMES + "torch.OutOfMemoryError: CUDA out of memory.\n").splitlines())
    readings = _load_readings(tmp_path, ranks)
    assert readings[0][0] == "oom.other_process" and "local_rank" in readings[0][1]
    assert "env.bnb_broken" not in [c for c, _ in readings]


def test_an_oom_in_words_beside_the_machines_ram_is_a_host_ram_guess(tmp_path):
    report = explain_text(tmp_path, "qlora training on colab, oom and the process gets killed, only 12gb ram\n")
    assert [f.cause for f in report.findings[:2]] == ["oom.host_ram", "oom.capacity"]
    assert report.findings[0].rule == "guess"


def test_a_cjk_lead_in_with_a_full_width_colon_reads_as_the_message_after_it(tmp_path):
    report = explain_text(tmp_path, "错误信息：Killed\n")
    assert report.findings and report.findings[0].cause == "oom.host_ram"
    assert report.findings[0].evidence[0].text == "错误信息：Killed"  # quoted as pasted


@pytest.mark.parametrize("text, cause", [
    # the trainer or collator asked for a column the data does not have (not tokenised, columns dropped)
    ("KeyError: 'input_ids'\n", "train.dataset_format"),
    ("FileNotFoundError: [Errno 2] No such file or directory: './out/checkpoint-500/adapter_config.json'\n",
     "env.model_files"),
    ("ValueError: Cannot use chat template functions because tokenizer.chat_template is not set\n", "train.tokenizer_setup"),
])
def test_a_file_data_or_tokenizer_line_no_rule_reads_is_a_labelled_guess(tmp_path, text, cause):
    report = explain_text(tmp_path, text)
    assert report.findings and report.findings[0].cause == cause
