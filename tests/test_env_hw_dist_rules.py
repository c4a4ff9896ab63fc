"""Environment / hardware / distributed family: traceback locations of sharded checkpoint saves
(loradoctor/data/frames.yaml), and the real-log shapes of the QA round that a fixture alone would not pin
down (which rule wins, which stays silent)."""

from __future__ import annotations

import pytest

from conftest import explain_text
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
    findings = explain_text(tmp_path, text).findings
    return findings[0].cause if findings else None


def _rules_fired(text: str, tmp_path) -> set[str]:
    return {f.rule for f in explain_text(tmp_path, text).findings}


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
    ("AssertionError: CUDA_HOME does not exist, unable to compile CUDA op(s)", "env.extension_build"),
    ("RuntimeError: Failed to find C compiler. Please specify via CC environment variable.", "env.extension_build"),
    ("torch._inductor.exc.InductorError: RuntimeError: Compiler: cl is not found.", "env.extension_build"),
    ("TypeError: Accelerator.unwrap_model() got an unexpected keyword argument 'keep_torch_compile'",
     "env.version_conflict"),
    ("TypeError: MyTrainer.compute_loss() got an unexpected keyword argument 'num_items_in_batch'",
     "env.version_conflict"),
    ("RuntimeError: nvrtc: error: failed to open libnvrtc-builtins.so.12.1.", "env.torch_broken"),
    ("ImportError: libc10_cuda.so: undefined symbol: cudaGraphAddEmptyNode, version libcudart.so.13",
     "env.torch_broken"),
    ("Error invalid device function at line 216 in file /tmp/bnb/csrc/ops.cu", "env.arch_unsupported"),
])

def test_env_pasted_last_line_alone_names_the_cause(line, cause, tmp_path):
    assert _first_cause(line + "\n", tmp_path) == cause


def test_env_a_user_function_typo_is_not_a_version_conflict(tmp_path):
    text = ("Traceback (most recent call last):\n  File \"/h/prep.py\", line 41, in <module>\n"
            "TypeError: build_rows() got an unexpected keyword argument 'shuffle_seed'\n")
    assert "env-version-removed-argument" not in _rules_fired(text, tmp_path)


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


# --- hw / dist QA round 2: short pastes (the last lines or the final error line alone), and near
# misses. A short paste must name the right cause or stay silent; never a wrong cause.

_HWDIST_SHORT_PASTES = [
    # torch >= 2.4 prints these around a collective timeout; the WorkNCCL line may be cut off
    ("[rank1]:[E0415 22:31:05.771052114 ProcessGroupNCCL.cpp:1709] [PG 1 Rank 1] Timeout at NCCL work: 4410, "
     "last enqueued NCCL work: 4411, last completed NCCL work: 4409.\n", "dist.nccl_timeout"),
    ("[2024-05-19 03:40:12,551][__main__][CRITICAL] - Training failed due to NCCL communicator was aborted on rank 2. :\n",
     "dist.nccl_timeout"),
    ("[rank1]:[E1120 04:21:19.556016003 ProcessGroupNCCL.cpp:1595] [PG ID 0 PG GUID 0(default_pg) Rank 1] Received a "
     "dump signal due to a collective timeout from this local rank and we will try our best to dump the debug info.\n",
     "dist.nccl_timeout"),
    # NCCL's `Last error:` payloads, pasted without the DistBackendError above them
    ("[rank2]: Cuda failure 'hipErrorInvalidDevicePointer'\n", "dist.nccl_error"),
    ("NET/OFI Request 0x7fa3310c2e00 completed with error. RC: 113. Error: 2 (UNDELIVERABLE). Completed length: 0\n",
     "dist.nccl_error"),
    ("[rank11]: NET/IB: Got completion from peer 10.20.0.8<41177> with status=IBV_WC_RETRY_EXC_ERR(12) opcode=IBV_WC_SEND(0)\n",
     "dist.nccl_error"),
    ("socketPollConnect: Connect to 10.0.0.4<56849> returned 113(No route to host) errno 115(Operation now in progress)\n",
     "dist.nccl_error"),
    ("[2025-09-09 23:51:24] h:774:854 [0] transport/shm.cc:590 NCCL WARN Cuda failure 800 'operation not permitted'\n",
     "dist.nccl_error"),
    # hardware seen by the Kubernetes device plugin, DCGM, journald without the Xid line
    ("I0412 09:52:17.009205       1 health.go:178] XidCriticalError: Xid=79 on Device=GPU-5c1e7d22; marking device as unhealthy.\n",
     "hw.fell_off_bus"),
    ("I0412 09:52:17.009205       1 health.go:178] XidCriticalError: Xid=48 on Device=GPU-5c1e7d22; marking device as unhealthy.\n",
     "hw.memory_errors"),
    ("|                           | A volatile double-bit ECC error has occurred on GPU 2.   |\n", "hw.memory_errors"),
    ("kernel: NVRM: GPU3 _kgspRpcRecvPoll: timed out waiting for RPC response from GPU3 GSP\n", "hw.gsp_firmware"),
]


@pytest.mark.parametrize("text,cause", _HWDIST_SHORT_PASTES)
def test_hwdist_short_paste_names_the_cause(text, cause, tmp_path):
    assert _first_cause(text, tmp_path) == cause


def test_nccl_shm_warn_lines_outrank_the_dataloader_shm_rule(tmp_path):
    # NCCL's own /dev/shm failure, without the Python NCCL error: dist-nccl-shm is no guess, so it
    # ranks above oom-shm-no-space (which also matches '/dev/shm ... No space left on device')
    text = (
        "w0:318:511 [0] misc/shmutils.cc:72 NCCL WARN Error: failed to extend /dev/shm/nccl-Vb71kQ to 9637892 bytes, "
        "error: No space left on device (28)\n"
        "[rank1]:[E0311 16:20:44.118230 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=2, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600017 milliseconds "
        "before timing out.\n"
    )
    assert _first_cause(text, tmp_path) == "dist.nccl_error"


@pytest.mark.parametrize("text", [
    # a refused connect that NCCL retried, then a finished run
    ("n3:20411:20502 [0] misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to 10.8.0.21<39911> failed : "
     "Connection refused\nn3:20411:20502 [0] NCCL INFO Call to connect returned Connection refused, retrying\n"
     "{'train_runtime': 6120.4, 'train_samples_per_second': 28.7, 'train_steps_per_second': 0.22, 'train_loss': 1.8, 'epoch': 1.0}\n"),
    # torchrun's client warning while the store starts, and the process-group destroy warning at exit
    ("[W305 12:01:46.541216012 socket.cpp:752] [c10d] The client socket has failed to connect to [localhost]:29500 "
     "(errno: 99 - Cannot assign requested address).\n"
     "[rank0]:[W305 12:15:21.771930 ProcessGroupNCCL.cpp:1250] Warning: WARNING: process group has NOT been destroyed "
     "before we destruct ProcessGroupNCCL.\n"),
    # Xid 13 is the application's fault; the device plugin skips it and DCGM says healthy
    ("I0511 19:03:44.201911       1 health.go:168] Skipping non-critical Xid event Xid=13 on Device=GPU-70e2\n"
     "| Overall Health            | Healthy                                                  |\n"),
    # a CSV query where only the SW power cap column can be Active
    ("index, power.draw [W], clocks_event_reasons.sw_power_cap, clocks_event_reasons.hw_thermal_slowdown\n"
     "0, 449.70 W, Active, Not Active\n"),
])
def test_hwdist_near_misses_stay_silent(text, tmp_path):
    cause = _first_cause(text, tmp_path)
    assert cause is None or not cause.startswith(("hw.", "dist.")), cause


# --- hw / dist QA round 3: shapes found in the most-reported issues (torch 2.3's watchdog work line,
# torch 1.x's bare 'Some NCCL operations have failed or timed out.', NCCL < 2.12's IB completion
# error without a peer, IB async events, failed verbs calls, the proxy / transport error trail,
# ncclInvalidArgument, the GSP driver's channel reset for Xid 79), pasted alone.

_HWDIST_SHORT_PASTES_R3 = [
    ("[80748] [rank0]:[E321 02:07:08.465150152 ProcessGroupNCCL.cpp:1664] [PG 1 Rank 0] Exception (either an error "
     "or timeout) detected by watchdog at work: 1580, last enqueued NCCL work: 1582, last completed NCCL work: 1579.\n",
     "dist.nccl_timeout"),
    ("[E ProcessGroupNCCL.cpp:537] Some NCCL operations have failed or timed out.\n"
     "[E ProcessGroupNCCL.cpp:543] To avoid data inconsistency, the entire process is terminated.\n", "dist.nccl_timeout"),
    ("gpu7:41917:41994 [0] transport/net_ib.cu:788 NCCL WARN NET/IB : Got completion with error 12, opcode 1, len 0, "
     "vendor err 129\n", "dist.nccl_error"),
    ("node5:2210:2290 [3] transport/net_ib.cc:101 NCCL WARN NET/IB : Got async event : port error\n", "dist.nccl_error"),
    ("dgx-b7:771204:771290 [0] misc/ibvwrap.cc:187 NCCL WARN Call to ibv_modify_qp failed with error Network is "
     "unreachable\n", "dist.nccl_error"),
    ("ncclInvalidArgument: Invalid value for an argument.\nLast error:\nInvalid config blocking attribute value -2147483648\n",
     "dist.nccl_error"),
    ("trn-w0:3468:3905 [4] NCCL INFO transport/net.cc:1302 -> 6\ntrn-w0:3468:3905 [4] NCCL INFO proxy.cc:698 -> 6\n",
     "dist.nccl_error"),
    ("kernel: NVRM: kgspRcAndNotifyAllChannels_IMPL: RC all channels for critical error 79.\n", "hw.fell_off_bus"),
]


@pytest.mark.parametrize("text,cause", _HWDIST_SHORT_PASTES_R3)
def test_hwdist_round3_short_paste_names_the_cause(text, cause, tmp_path):
    assert _first_cause(text, tmp_path) == cause


def test_hwdist_round3_collective_timeout_is_not_high_confidence(tmp_path):
    # a timeout is the echo of another rank: even a full watchdog line is labelled medium, never high
    text = ("[rank3]:[E ProcessGroupNCCL.cpp:1414] [PG 0 Rank 3] Process group watchdog thread terminated with "
            "exception: [Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=6075, "
            "OpType=_ALLGATHER_BASE, NumelIn=1366, NumelOut=4098, Timeout(ms)=1800000) ran for 2954391 milliseconds "
            "before timing out.\n")
    p = tmp_path / "run.log"
    p.write_text(text)
    f = explain([str(p)]).findings[0]
    assert f.cause == "dist.nccl_timeout" and f.confidence < 0.8, (f.cause, f.confidence)


def test_hwdist_round3_ecc_rank_outranks_the_other_ranks_timeouts(tmp_path):
    text = (
        "[rank0]:[E0907 14:02:55.101 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=9120, OpType=_REDUCE_SCATTER_BASE, NumelIn=8388608, NumelOut=1048576, Timeout(ms)=600000) "
        "ran for 600041 milliseconds before timing out.\n"
        "[rank5]:RuntimeError: CUDA error: uncorrectable ECC error encountered\n"
        "[rank3]:[E0907 14:02:55.140 ProcessGroupNCCL.cpp:616] [Rank 3] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=9120, OpType=_REDUCE_SCATTER_BASE, NumelIn=8388608, NumelOut=1048576, Timeout(ms)=600000) "
        "ran for 600044 milliseconds before timing out.\n"
    )
    assert _first_cause(text, tmp_path) == "hw.memory_errors"


# --- env family, QA round 3: popular shapes as short pastes, messy pastes, confidence honesty ---

@pytest.mark.parametrize("text, cause", [
    ("NameError: name 'PreTrainedConfig' is not defined. Did you mean: 'PretrainedConfig'?\n", "env.version_conflict"),
    ("/usr/local/lib/python3.10/dist-packages/unsloth/kernels/cross_entropy_loss.py in Unsloth_LlamaForCausalLM()\n"
     "NameError: name 'Unpack' is not defined\n", "env.version_conflict"),
    ("CUDA_VERSION=121\npython setup.py install\nCUDA SETUP: Setup Failed!\n", "env.bnb_broken"),
    ("    optim_func = str2optimizer32bit[optimizer_name][0]\n"
     "AttributeError: 'NoneType' object has no attribute 'cpaged_adamw32bit_grad_fp32'\n", "env.bnb_broken"),
    ("subprocess.CalledProcessError: Command '['ninja', '-v']' returned non-zero exit status 1.\n",
     "env.extension_build"),
    ("/usr/local/cuda-12.1/include/crt/host_config.h:143:2: error: #error -- unsupported GNU version! gcc versions "
     "later than 12 are not supported!\n", "env.extension_build"),
    ("ImportError: /root/.cache/torch_extensions/py311_cu121/fused_adam/fused_adam.so: cannot open shared object "
     "file: No such file or directory\n", "env.extension_build"),
    ("OSError: CUDA_HOME environment variable is not set. Please set it to your CUDA install root.\n",
     "env.extension_build"),
    ("ValueError: numpy.dtype size changed, may indicate binary incompatibility. Expected 96 from C header, "
     "got 88 from PyObject\n", "env.version_conflict"),
    ("TypeError: Descriptors cannot be created directly.\n", "env.version_conflict"),
    ("KeyError: 'qwen2'\n", "env.version_conflict"),
    # messy: message glued to a progress bar, escaped newlines of a JSON log record, srun-prefixed ranks
    ("Loading checkpoint shards:  50%|#####     | 1/2 [00:03<00:03,  3.12s/it]ImportError: /v/lib/python3.10/"
     "site-packages/flash_attn_2_cuda.cpython-310-x86_64-linux-gnu.so: undefined symbol: _ZN3c104cuda9SetDeviceEi\n",
     "env.flash_attn_broken"),
    ('{"level":"error","traceback":"Traceback (most recent call last):\\n  File \\"/app/t.py\\", line 1, in <module>'
     '\\n  File \\"/usr/lib/python3.11/site-packages/torch/__init__.py\\", line 367, in <module>\\n    from torch._C '
     'import *\\nImportError: libcudnn.so.9: cannot open shared object file: No such file or directory"}\n',
     "env.torch_broken"),
    ("".join(f"{r}: Failed to initialize NVML: Driver/library version mismatch\n" for r in range(8)),
     "env.nvml_mismatch"),
])
def test_env_round3_short_and_messy_pastes_name_the_cause(text, cause, tmp_path):
    assert _first_cause(text, tmp_path) == cause


def test_env_round3_thin_evidence_is_not_high_confidence(tmp_path):
    # a bare KeyError naming a model type, or a NameError from library code, is a likely reading, not a certain one
    for text in ("KeyError: 'gemma3'\n",
                 "NameError: name 'PreTrainedConfig' is not defined. Did you mean: 'PretrainedConfig'?\n"):
        p = tmp_path / "run.log"
        p.write_text(text)
        first = explain([str(p)]).findings[0]
        assert first.cause == "env.version_conflict"
        assert first.confidence <= 0.6


@pytest.mark.parametrize("text", [
    # the user's own code: a missing import in a notebook cell next to a library warning line
    ("/usr/local/lib/python3.10/dist-packages/transformers/utils/hub.py:124: FutureWarning: Using "
     "`TRANSFORMERS_CACHE` is deprecated\nCell In[4], line 3\nNameError: name 'SFTTrainer' is not defined\n"),
    # a chat template lookup, not a model type
    ('  File "/opt/LLaMA-Factory/src/llamafactory/data/template.py", line 512, in get_template_and_fix_tokenizer\n'
     "    template = TEMPLATES[data_args.template]\nKeyError: 'qwen2'\n"),
])
def test_env_round3_near_misses_are_not_version_conflicts(text, tmp_path):
    assert _first_cause(text, tmp_path) != "env.version_conflict"


def test_env_round3_lazy_import_wrapper_is_a_medium_guess_below_the_inner_cause(tmp_path):
    wrapper = ("RuntimeError: Failed to import trl.trainer.sft_trainer because of the following error "
               "(look up to see its traceback):\n")
    p = tmp_path / "run.log"
    p.write_text(wrapper)
    first = explain([str(p)]).findings[0]
    assert (first.cause, first.rule) == ("env.version_conflict", "env-version-lazy-import-failed")
    assert first.confidence <= 0.5
    # with the inner flash-attn binary mismatch above it, flash-attn is named first
    inner = ("ImportError: /v/lib/python3.11/site-packages/flash_attn_2_cuda.cpython-311-x86_64-linux-gnu.so: "
             "undefined symbol: _ZN3c104cuda9SetDeviceEi\n")
    assert _first_cause(inner + wrapper, tmp_path) == "env.flash_attn_broken"


@pytest.mark.parametrize("text,cause", [
    # TCPStore timeouts: another rank never answered the store (rank 0 crashed or came far later)
    ("[rank1]: torch.distributed.DistStoreError: Socket Timeout\n", "dist.nccl_timeout"),
    # torch 1.x's aborted communicator names the NCCL error that aborted it: the error, not a timeout
    ("RuntimeError: NCCL communicator was aborted on rank 1.  Original reason for failure was: NCCL error: "
     "unhandled system error, NCCL version 2.10.3\n", "dist.nccl_error"),
    # NCCL's socket 'Last error:' payload
    ("Last error:\nNet : Call to recv from 10.40.2.11<45219> failed : Connection reset by peer\n", "dist.nccl_error"),
    # DCGM's thermal health watch
    ("Detected a WARNING in health system Thermal: 'Detected clocks event due to thermal violation in GPU 2.\n",
     "hw.thermal_power"),
])
def test_hwdist_round3_more_short_pastes(text, cause, tmp_path):
    assert _first_cause(text, tmp_path) == cause


def test_hwdist_round3_smi_table_ecc_outranks_the_illegal_access(tmp_path):
    text = (
        "RuntimeError: CUDA error: an illegal memory access was encountered\n"
        "|   3  NVIDIA A100-SXM4-80GB          On  |   00000000:4E:00.0 Off |                    2 |\n"
    )
    assert _first_cause(text, tmp_path) == "hw.memory_errors"
