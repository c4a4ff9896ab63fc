"""Environment / hardware / distributed family: traceback locations of sharded checkpoint saves
(facts `_LOCATIONS`), and the real-log shapes of the QA round that a fixture alone would not pin
down (which rule wins, which stays silent)."""

from __future__ import annotations

import pytest

from loradoctor.logs.engine import explain
from loradoctor.logs.facts import FactCollector, location_from_frames
from loradoctor.logs.reader import make_line


def collect_raw(texts: list[str]):
    """Facts of these lines, read through the reader's normalisation (rank prefixes)."""
    c = FactCollector()
    for i, t in enumerate(texts, 1):
        c.feed(make_line(t.encode(), "t.log", i))
    return c.finish()


@pytest.mark.parametrize("frames", [
    # DeepSpeed engine called from a plain script (no Trainer frames above it)
    [("train.py", "<module>"), ("deepspeed/runtime/engine.py", "save_checkpoint"),
     ("deepspeed/runtime/engine.py", "_save_zero_checkpoint")],
    # ZeRO-3 16-bit consolidation
    [("train.py", "main"), ("deepspeed/runtime/engine.py", "save_16bit_model"),
     ("deepspeed/runtime/engine.py", "_zero3_consolidated_16bit_state_dict"),
     ("deepspeed/runtime/zero/partition_parameters.py", "__enter__")],
    # FSDP full state dict through accelerate, gathered by the post-state-dict hook
    [("train.py", "main"), ("accelerate/utils/fsdp_utils.py", "save_fsdp_model"),
     ("torch/nn/modules/module.py", "state_dict"),
     ("torch/distributed/fsdp/_state_dict_utils.py", "_full_post_state_dict_hook"),
     ("torch/distributed/fsdp/_flat_param.py", "unshard")],
    # accelerator.get_state_dict and the FSDP optimizer state
    [("sft.py", "main"), ("accelerate/accelerator.py", "get_state_dict"),
     ("torch/distributed/fsdp/fully_sharded_data_parallel.py", "full_optim_state_dict")],
    # torch.distributed.checkpoint
    [("train.py", "main"), ("torch/distributed/checkpoint/state_dict.py", "get_model_state_dict")],
    [("train.py", "main"), ("torch/distributed/checkpoint/state_dict_saver.py", "save")],
    # Lightning
    [("fit.py", "run"), ("lightning/pytorch/trainer/connectors/checkpoint_connector.py", "dump_checkpoint")],
])
def test_sharded_save_frames_are_save(frames):
    assert location_from_frames(frames) == "save"


def test_save_frames_do_not_hide_a_training_step():
    # a plain training step keeps its own phase: none of the new names are step frames
    frames = [("trainer.py", "train"), ("trainer.py", "training_step"), ("engine.py", "backward")]
    assert location_from_frames(frames) == "backward"


def test_oom_during_zero3_save_is_located_at_save():
    f = collect_raw([
        "[rank1]: Traceback (most recent call last):",
        '[rank1]:   File "/w/train_ds.py", line 201, in <module>',
        '[rank1]:     engine.save_16bit_model(out_dir)',
        '[rank1]:   File "/venv/deepspeed/runtime/engine.py", line 3601, in save_16bit_model',
        '[rank1]:     state_dict = self._zero3_consolidated_16bit_state_dict()',
        '[rank1]:   File "/venv/deepspeed/runtime/engine.py", line 3520, in _zero3_consolidated_16bit_state_dict',
        '[rank1]:     get_layer_state_dict(self.module, prefix="")',
        '[rank1]:   File "/venv/deepspeed/runtime/engine.py", line 3496, in get_layer_state_dict',
        '[rank1]:     with deepspeed.zero.GatheredParameters(list(module.parameters(recurse=False)), modifier_rank=0):',
        "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.96 GiB. GPU 1 has a total "
        "capacity of 79.14 GiB of which 1.11 GiB is free. Including non-PyTorch memory, this process has 78.02 GiB "
        "memory in use. Of the allocated memory 75.33 GiB is allocated by PyTorch, and 1.20 GiB is reserved by "
        "PyTorch but unallocated.",
    ]).flat()
    assert f["oom.phase"] == "save" and f["trace.location"] == "save"


def test_nccl_timeout_during_fsdp_save_is_located_at_save():
    f = collect_raw([
        "Traceback (most recent call last):",
        '  File "/w/fsdp_sft.py", line 310, in <module>',
        '  File "/venv/accelerate/utils/fsdp_utils.py", line 107, in save_fsdp_model',
        '  File "/venv/torch/nn/modules/module.py", line 1939, in state_dict',
        '  File "/venv/torch/distributed/fsdp/_state_dict_utils.py", line 347, in _full_post_state_dict_hook',
        '  File "/venv/torch/distributed/fsdp/_flat_param.py", line 1392, in _all_gather_flat_param',
        "torch.distributed.DistBackendError: [Rank 3] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=9021, OpType=_ALLGATHER_BASE, NumelIn=65536000, NumelOut=262144000, Timeout(ms)=600000) "
        "ran for 600118 milliseconds before timing out.",
    ]).flat()
    assert f["trace.location"] == "save"


def _first_cause(text: str, tmp_path) -> str | None:
    p = tmp_path / "run.log"
    p.write_text(text)
    report = explain([str(p)])
    return report.findings[0].cause if report.findings else None


def _rules_fired(text: str, tmp_path) -> set[str]:
    p = tmp_path / "run.log"
    p.write_text(text)
    return {f.rule for f in explain([str(p)]).findings}


def test_paging_file_is_not_a_broken_torch(tmp_path):
    # WinError 1455 while a spawned worker re-imports torch: host commit memory, not a broken install
    text = (
        'Traceback (most recent call last):\n'
        '  File "C:\\Users\\u\\venv\\lib\\site-packages\\torch\\__init__.py", line 148, in <module>\n'
        '    raise err\n'
        'OSError: [WinError 1455] The paging file is too small for this operation to complete. Error loading '
        '"C:\\Users\\u\\venv\\lib\\site-packages\\torch\\lib\\cudnn_ops_infer64_8.dll" or one of its dependencies.\n'
    )
    assert "env-torch-import-broken" not in _rules_fired(text, tmp_path)
    assert _first_cause(text, tmp_path) == "oom.host_ram"


def test_dll_load_failed_paging_file_is_host_ram(tmp_path):
    text = (
        'Traceback (most recent call last):\n'
        '  File "<string>", line 1, in <module>\n'
        '  File "C:\\py\\lib\\multiprocessing\\spawn.py", line 116, in spawn_main\n'
        '  File "C:\\w\\train.py", line 3, in <module>\n'
        '    import torch\n'
        '  File "C:\\py\\lib\\site-packages\\torch\\__init__.py", line 148, in <module>\n'
        '    raise err\n'
        'ImportError: DLL load failed while importing _C: The paging file is too small for this operation to complete.\n'
    )
    assert _first_cause(text, tmp_path) == "oom.host_ram"
    assert "env-torch-import-broken" not in _rules_fired(text, tmp_path)


def test_a_missing_dll_is_still_a_broken_torch(tmp_path):
    text = (
        'Traceback (most recent call last):\n'
        '  File "C:\\py\\lib\\site-packages\\torch\\__init__.py", line 141, in <module>\n'
        '    raise err\n'
        'OSError: [WinError 126] The specified module could not be found. Error loading '
        '"C:\\py\\lib\\site-packages\\torch\\lib\\fbgemm.dll" or one of its dependencies.\n'
    )
    assert _first_cause(text, tmp_path) == "env.torch_broken"


# --- env family, QA round 2: pasted last lines alone, import noise in runs that finished ---

@pytest.mark.parametrize("line, cause", [
    # the final error line of a report, pasted without its traceback
    ("ImportError: libcudnn.so.9: cannot open shared object file: No such file or directory", "env.torch_broken"),
    ("ImportError: /v/lib/python3.11/site-packages/torch/lib/libtorch_cuda.so: undefined symbol: ncclCommRegister",
     "env.torch_broken"),
    ("ImportError: /v/lib/python3.11/site-packages/torch/lib/../../nvidia/cusparse/lib/libcusparse.so.12: "
     "undefined symbol: __nvJitLinkComplete_12_4, version libnvJitLink.so.12", "env.torch_broken"),
    ("TypeError: __init__() got an unexpected keyword argument 'use_dora'", "env.version_conflict"),
    ("AttributeError: module 'torch.nn' has no attribute 'Buffer'", "env.version_conflict"),
    ("ImportError: LlamaTokenizer requires the SentencePiece library but it was not found in your environment. "
     "Checkout the instructions on the installation page of its repo.", "env.version_conflict"),
    ("_pickle.UnpicklingError: Weights only load failed. This file can still be loaded, to do so you have two "
     "options, do those steps only if you trust the source of the checkpoint.", "env.version_conflict"),
    ("ImportError: vLLM is not available and `use_vllm` is set to True. Please install vLLM with "
     "`pip install vllm` to use it.", "env.version_conflict"),
    ("ImportError: /e/site-packages/vllm/_C.abi3.so: undefined symbol: _ZN3c104cuda9SetDeviceEab",
     "env.version_conflict"),
    ("ImportError: This modeling file requires the following packages that were not found in your environment: "
     "flash_attn. Run `pip install flash_attn`", "env.flash_attn_broken"),
    ("ImportError: This modeling file requires the following packages that were not found in your environment: "
     "einops. Run `pip install einops`", "env.version_conflict"),
    ("ImportError: No bitsandbytes / bitsandbytesがインストールされていないようです", "env.bnb_broken"),
    ("AssertionError: CUDA_HOME does not exist, unable to compile CUDA op(s)", "env.version_conflict"),
    ("RuntimeError: Failed to find C compiler. Please specify via CC environment variable.", "env.version_conflict"),
])
def test_env_pasted_last_line_alone_names_the_cause(line, cause, tmp_path):
    assert _first_cause(line + "\n", tmp_path) == cause


def test_env_bare_cuda_library_line_defers_to_the_loader_that_raised_it(tmp_path):
    # bitsandbytes' ctypes loader: not torch's install, the bare-library rule stays silent
    text = (
        'Traceback (most recent call last):\n'
        '  File "/h/.venv/lib/python3.10/site-packages/bitsandbytes/cextension.py", line 20, in <module>\n'
        '    lib = ct.cdll.LoadLibrary(binary_path)\n'
        'OSError: libcudart.so.11.0: cannot open shared object file: No such file or directory\n'
    )
    assert "env-cuda-library-missing-bare" not in _rules_fired(text, tmp_path)


NUMPY2_BANNER = (
    "A module that was compiled using NumPy 1.x cannot be run in\n"
    "NumPy 2.1.3 as it may crash. To support both 1.x and 2.x\n"
    "UserWarning: Failed to initialize NumPy: _ARRAY_API not found (Triggered internally at tensor_numpy.cpp:84.)\n"
)


def test_env_import_noise_in_a_run_that_trained_to_the_end_is_silent(tmp_path):
    finished = NUMPY2_BANNER + (
        "{'loss': 2.011, 'grad_norm': 0.9, 'learning_rate': 0.0001, 'epoch': 0.2}\n"
        "{'train_runtime': 300.1, 'train_samples_per_second': 6.0, 'train_loss': 1.7, 'epoch': 1.0}\n"
    )
    assert "env-version-import-error" not in _rules_fired(finished, tmp_path)
    # the same banner in a run that stopped is the cause
    stopped = NUMPY2_BANNER + "RuntimeError: Numpy is not available\n"
    assert _first_cause(stopped, tmp_path) == "env.version_conflict"


def test_env_weights_only_futurewarning_is_not_the_refusal(tmp_path):
    text = ("FutureWarning: You are using `torch.load` with `weights_only=False` (the current default value). "
            "In a future release, the default value for `weights_only` will be flipped to `True`.\n")
    assert "env-version-weights-only-load" not in _rules_fired(text, tmp_path)
