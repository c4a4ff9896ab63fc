"""The OOM message forms outside CUDA's caching allocator text: ROCm (HIP), Apple (MPS) and the
cudaMallocAsync / memory-fraction form publish their numbers (rules/oom.yaml reads them)."""
from loradoctor.logs.facts import HELD_BACK_OOM_FORMS, FactCollector
from loradoctor.logs.reader import Line
from loradoctor.units import parse_size

GIB = 1 << 30
MIB = 1 << 20


def collect(texts):
    c = FactCollector()
    for i, t in enumerate(texts, 1):
        c.feed(Line(file="t.log", lineno=i, text=t, rank=None, time_s=None, raw=t, input_index=0))
    return c.finish().flat()


FRACTION = ["torch.OutOfMemoryError: Allocation on device 0 would exceed allowed memory. (out of memory)",
            "Currently allocated     : 39.71 GiB", "Requested               : 512.00 MiB",
            "Device limit            : 79.25 GiB", "Free (according to CUDA): 37.90 GiB",
            "PyTorch limit (set by user-supplied memory fraction)", ": 39.62 GiB", "next unrelated line"]


def test_no_form_is_held_back():
    assert HELD_BACK_OOM_FORMS == frozenset()


def test_fraction_form_reads_the_limit_on_its_own_line():
    f = collect(FRACTION)
    assert f["oom.era"] == "fraction" and f["oom.requested_bytes"] == 512 * MIB
    assert f["oom.allowed_bytes"] == parse_size("39.62 GiB")
    assert f["oom.reserved_bytes"] == f["oom.allocated_bytes"] == parse_size("39.71 GiB")
    # the user's limit refused the request: the device's free memory says nothing about others
    assert "oom.other_unaccounted_bytes" not in f


def test_fraction_form_without_a_limit_measures_memory_held_elsewhere():
    lines = FRACTION[:4] + ["Free (according to CUDA): 126.00 MiB",
                            "PyTorch limit (set by user-supplied memory fraction)", ": 17179869184.00 GiB"]
    lines[1] = "Currently allocated     : 12.00 GiB"
    f = collect(lines)
    assert "oom.allowed_bytes" not in f  # no fraction set: the figure is garbage
    assert f["oom.other_unaccounted_bytes"] == parse_size("79.25 GiB") - 126 * MIB - 12 * GIB


def test_hip_message_publishes_numbers_and_unaccounted_memory():
    f = collect(["torch.OutOfMemoryError: HIP out of memory. Tried to allocate 594.00 MiB. GPU 0 has a total "
                 "capacity of 15.98 GiB of which 412.00 MiB is free. Of the allocated memory 0 bytes is allocated "
                 "by PyTorch, and 0 bytes is reserved by PyTorch but unallocated."])
    assert f["oom.requested_bytes"] == 594 * MIB and f["oom.allocated_bytes"] == 0
    assert f["oom.other_unaccounted_bytes"] == parse_size("15.98 GiB") - 412 * MIB


def test_cuda_g4_without_process_clauses_keeps_unaccounted_absent():
    f = collect(["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 594.00 MiB. GPU 0 has a total "
                 "capacity of 15.98 GiB of which 412.00 MiB is free. Of the allocated memory 0 bytes is allocated "
                 "by PyTorch, and 0 bytes is reserved by PyTorch but unallocated."])
    assert f["oom.requested_bytes"] == 594 * MIB and "oom.other_unaccounted_bytes" not in f


def test_mps_message_publishes_numbers():
    f = collect(["RuntimeError: MPS backend out of memory (MPS allocated: 14.21 GB, other allocations: 384.00 KB, "
                 "max allowed: 14.36 GB). Tried to allocate 224.00 MB on private pool."])
    assert f["oom.era"] == "mps" and f["oom.requested_bytes"] == 224 * MIB
    assert f["oom.allowed_bytes"] == parse_size("14.36 GiB")


def test_ipex_xpu_message_without_free_figure():
    f = collect(["RuntimeError: XPU out of memory. Tried to allocate 1.96 GiB (GPU 0; 15.56 GiB total capacity; "
                 "13.74 GiB already allocated; 14.19 GiB reserved in total by PyTorch)"])
    assert f["oom.era"] == "ipex" and f["oom.total_bytes"] == parse_size("15.56 GiB")
    assert f["oom.reserved_unallocated_bytes"] == parse_size("14.19 GiB") - parse_size("13.74 GiB")
    assert "oom.free_bytes" not in f


def test_upstream_xpu_message_reads_like_hip():
    f = collect(["torch.OutOfMemoryError: XPU out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
                 "of 47.98 GiB of which 1.41 GiB is free. Of the allocated memory 33.70 GiB is allocated by PyTorch, "
                 "and 12.61 GiB is reserved by PyTorch but unallocated."])
    assert f["oom.reserved_unallocated_bytes"] == parse_size("12.61 GiB")
    assert f["oom.other_unaccounted_bytes"] == parse_size("47.98 GiB") - parse_size("1.41 GiB") - f["oom.reserved_bytes"]


def test_memory_summary_rows_behind_a_logger_prefix():
    rows = ["|                  PyTorch CUDA memory summary, device ID 0                 |",
            "|            CUDA OOMs: 3            |        cudaMalloc retries: 214       |",
            "| Allocated memory      |  14871 MiB |  20913 MiB |   1911 GiB |   1896 GiB |",
            "| GPU reserved memory   |  22208 MiB |  22400 MiB |  61002 MiB |  38794 MiB |",
            "| Non-releasable memory |   7336 MiB |   9120 MiB |   1731 GiB |   1724 GiB |"]
    f = collect(["INFO:__main__:" + r for r in rows] + ["done"])
    assert f["memsum.oom_count"] == 3 and f["memsum.alloc_retries"] == 214
    assert f["memsum.non_releasable_bytes"] == 7336 * MIB and f["memsum.reserved_bytes"] == 22208 * MIB


# ------------------------------------------------------------------ short pastes (QA round 2)
# Real reports often paste only the last line or the last few lines. Each case: the pasted text and
# the cause the FIRST finding must name (None: no oom.* finding above a guess may come first).

import pytest  # noqa: E402

from loradoctor.logs.engine import explain  # noqa: E402

_WARMUP_LINE = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 27.84 GiB. GPU 0 has a total "
                "capacity of 23.55 GiB of which 22.98 GiB is free. Including non-PyTorch memory, this process has "
                "578.00 MiB memory in use. Of the allocated memory 0 bytes is allocated by PyTorch, and 0 bytes is "
                "reserved by PyTorch but unallocated.")
_TRAIN_LINE = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total capacity "
               "of 23.65 GiB of which 1.12 GiB is free. Including non-PyTorch memory, this process has 22.51 GiB "
               "memory in use. Of the allocated memory 21.97 GiB is allocated by PyTorch, and 89.34 MiB is reserved "
               "by PyTorch but unallocated.")
_FRAME = '  File "/venv/lib/python3.11/site-packages/{}", line {}, in {}\n    {}\n'

SHORT_PASTES = [
    # the first allocation asks for a model-sized block: the loader's warmup (transformers >= 4.51)
    ("warmup-final-line", _WARMUP_LINE, "oom.model_load"),
    ("warmup-frame-tail", _FRAME.format("transformers/modeling_utils.py", 6081, "caching_allocator_warmup",
                                        "_ = torch.empty(byte_count // factor, dtype=torch.float16)") + _WARMUP_LINE,
     "oom.model_load"),
    # the same request with the script's own traceback is a capacity problem of that script
    ("own-buffer-with-traceback", "Traceback (most recent call last):\n"
     + _FRAME.format("bench.py", 3, "<module>", "buf = torch.empty(n, device='cuda')") + _WARMUP_LINE,
     "oom.capacity"),
    ("eval-concat-tail", _FRAME.format("transformers/trainer_pt_utils.py", 94, "torch_pad_and_concatenate",
                                       "return torch.cat((tensor1, tensor2), dim=0)") + _TRAIN_LINE,
     "oom.eval_or_save"),
    ("metal-abort", "libc++abi: terminating due to uncaught exception of type std::runtime_error: [METAL] Command "
     "buffer execution failed: Insufficient Memory (00000008:kIOGPUCommandBufferCallbackErrorOutOfMemory)",
     "oom.capacity"),
    ("hip-raw", "RuntimeError: HIP error: out of memory\nHIP kernel errors might be asynchronously reported at some "
     "other API call, so the stacktrace below might be incorrect.", "oom.non_pytorch"),
    ("enomem-fork", "OSError: [Errno 12] Cannot allocate memory", "oom.host_ram"),
    ("pbs", "=>> PBS: job killed: mem 66215988kb exceeded limit 62914560kb", "oom.host_ram"),
    ("semlock", _FRAME.format("multiprocess/synchronize.py", 57, "__init__", "sl = self._semlock = "
                              "_multiprocessing.SemLock(") + "OSError: [Errno 28] No space left on device",
     "oom.shm"),
    # a disk that is full is not /dev/shm
    ("disk-full-alone", "OSError: [Errno 28] No space left on device", "env.disk_space"),
    ("worker-exited-alone", "RuntimeError: DataLoader worker (pid(s) 40112) exited unexpectedly", "oom.shm"),
    # Slurm's end-of-job note is not a kill; nothing oom-ish may rank first
    ("slurm-at-some-point", "slurmstepd: error: Exceeded job memory limit at some point.", None),
    # a bus error right after loading shards is a truncated mmap as often as /dev/shm: no shm claim
    ("bus-error-while-loading", "Loading checkpoint shards:  50%|#####     | 2/4\nBus error (core dumped)", None),
    # QA round 3: shapes popular in the trackers that no rule knew
    ("vllm-startup-free", "ValueError: Free memory on device cuda:0 (5.87/23.55 GiB) on startup is less than desired "
     "GPU memory utilization (0.9, 21.20 GiB). Decrease GPU memory utilization or reduce GPU memory used by other "
     "processes.", "oom.other_process"),
    # the compiler killed by the OOM killer outranks the build failure it causes
    ("cc1plus-killed", "g++: fatal error: Killed signal terminated program cc1plus\ncompilation terminated.\n"
     "ninja: build stopped: subcommand failed.\nERROR: Failed building wheel for flash-attn", "oom.host_ram"),
    ("cicc-sig9", "nvcc error   : 'cicc' died due to signal 9 (Kill signal)", "oom.host_ram"),
    # a segfaulting nvcc is not memory
    ("cicc-sig11", "nvcc error   : 'cicc' died due to signal 11 (Invalid memory reference)", None),
    ("cudnn-no-algorithm", "RuntimeError: Unable to find a valid cuDNN algorithm to run convolution", "oom.non_pytorch"),
    ("bash-job-killed", "[1]+  Killed                  nohup python train.py > train.log 2>&1", "oom.host_ram"),
    ("sagemaker-137", "AlgorithmError: ExecuteUserScriptError:\nExitCode 137\nErrorMessage \"\"", "oom.host_ram"),
    ("jax-exhausted", "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to "
     "allocate 3.91GiB.", "oom.capacity"),
    ("tf-exhausted", "tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating tensor with "
     "shape[8,512,65536] and type float on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc",
     "oom.capacity"),
]


@pytest.mark.parametrize("text,cause", [pytest.param(t, c, id=i) for i, t, c in SHORT_PASTES])
def test_short_paste_names_the_cause(tmp_path, text, cause):
    log = tmp_path / "paste.log"
    log.write_text(text + "\n")
    findings = explain([str(log)]).findings
    first = findings[0] if findings else None
    if cause is None:
        assert first is None or not first.cause.startswith("oom.") or first.confidence <= 0.3, first
    else:
        assert first is not None and first.cause == cause, [(f.rule, f.cause, f.confidence) for f in findings[:3]]


def test_an_oom_the_run_survived_is_not_the_crash(tmp_path):
    """torch.compile's autotuner (and scripts that catch OOM and retry) print a full OOM message, then
    training goes on and finishes: no OOM finding may rank first. The same message as the end of a
    second run after a finished one still does."""
    survived = tmp_path / "survived.log"
    survived.write_text("[0/0] Runtime error during autotuning:\n[0/0] " + _TRAIN_LINE.split(": ", 1)[1]
                        + "\n[0/0] Ignoring this choice.\n{'loss': 1.2, 'epoch': 0.5}\n{'loss': 1.1, 'epoch': 1.0}\n"
                        "{'train_runtime': 100.0, 'train_loss': 1.15, 'epoch': 1.0}\n")
    findings = explain([str(survived)]).findings
    assert not findings or not findings[0].cause.startswith("oom."), findings[0]
    rerun = tmp_path / "rerun.log"
    rerun.write_text("{'loss': 1.2, 'epoch': 0.5}\n{'loss': 1.1, 'epoch': 1.0}\n"
                     "{'train_runtime': 100.0, 'train_loss': 1.15, 'epoch': 1.0}\n" + _TRAIN_LINE + "\n")
    assert explain([str(rerun)]).findings[0].cause == "oom.capacity"


def test_a_message_without_a_device_index_still_gives_the_card_and_the_processes():
    # a container's message prints `GPU  has a total capacity` (two spaces): before round 11 the total was
    # lost, and with it every reading of the two Process clauses
    f = collect(["torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 18.00 MiB. GPU  has a total "
                 "capacity of 95.00 GiB of which 6.50 MiB is free. Process 3927658 has 73.02 GiB memory in use. "
                 "Process 4105349 has 21.96 GiB memory in use. Of the allocated memory 21.65 GiB is allocated by "
                 "PyTorch, and 1.51 MiB is reserved by PyTorch but unallocated."])
    assert f["oom.total_bytes"] == 95 * GIB and "oom.device_index" not in f
    assert f["oom.other_process_count"] == 2


def test_outof_memory_as_ocr_or_a_retyped_title_writes_it_is_read():
    f = collect(["torch.cuda.0utOfMemoryError: CUDA outof memory. Tried to allocate 270.00 MiB (GPU 0; 31.75 GiB "
                 "total capacity; 30.9l GiB already allocated; 1O3.50 MiB free; 30.96 GiB reserved in total by PyTorch)"])
    assert f["oom.requested_bytes"] == 270 * MIB


BLIND = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 130.00 MiB. GPU 0 has a total capacity of "
         "79.10 GiB of which 12.81 MiB is free. Process 3427 has 0 bytes memory in use. Process 3423 has 0 bytes "
         "memory in use. Including non-PyTorch memory, this process has 0 bytes memory in use. Of the allocated "
         "memory 10.47 GiB is allocated by PyTorch, and 93.52 MiB is reserved by PyTorch but unallocated.")


def test_cuda_g4_blind_listing_measures_memory_held_elsewhere():
    # a container's NVML view: every process, this one included, at 0 bytes; the listing names who shares
    # the card, total - free - reserved says how much they hold
    f = collect([BLIND])
    assert f["oom.other_process_count"] == 2 and f["oom.other_process_bytes"] == 0
    assert "oom.this_process_bytes" not in f
    reserved = parse_size("10.47 GiB") + parse_size("93.52 MiB")
    assert abs(f["oom.other_unaccounted_bytes"] - (parse_size("79.10 GiB") - parse_size("12.81 MiB") - reserved)) < MIB


def test_cuda_g4_listing_with_figures_is_not_blind():
    # one listed process with a figure: the listing is not blind, the figures are used as they are
    f = collect([BLIND.replace("Process 3423 has 0 bytes", "Process 3423 has 60.00 GiB")])
    assert f["oom.other_process_bytes"] == 60 * GIB and "oom.other_unaccounted_bytes" not in f
