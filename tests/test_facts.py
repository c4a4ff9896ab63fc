"""Fact extractors, one by one, and the streaming collector."""

import math
import re
from pathlib import Path

import pytest

from conftest import explain_text
from loradoctor.logs.factnames import KNOWN_FACTS
from loradoctor.logs.facts import (
    FactCollector, location_from_frames, parse_child_failed, parse_exit_code, parse_memory_summary,
    parse_metric_record, parse_oom_killer, parse_oom_message, parse_watchdog_timeout, parse_xid, is_bare_killed,
)
from loradoctor.logs.reader import Line

ROOT = Path(__file__).resolve().parent.parent
GIB = 1 << 30
MIB = 1 << 20


def test_fact_names_match_docs():
    text = (ROOT / "docs" / "facts.md").read_text()
    names = []
    groups = "|".join(sorted({name.split(".")[0] for name in KNOWN_FACTS}))  # a new group needs no edit here
    for n in re.findall(rf"`((?:{groups})\.[a-z0-9_]+)`", text):
        if n not in names:
            names.append(n)
    assert names == list(KNOWN_FACTS)


# --- oom ------------------------------------------------------------------------------------

G1 = ("RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 10.76 GiB total capacity; "
      "9.41 GiB already allocated; 12.44 MiB free; 9.73 GiB reserved in total by PyTorch)")
G2 = ("RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 1; 79.15 GiB total capacity; 30.00 GiB "
      "already allocated; 40.00 GiB free; 32.00 GiB allowed; 31.00 GiB reserved in total by PyTorch) If reserved "
      "memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.  See documentation for "
      "Memory Management and PYTORCH_CUDA_ALLOC_CONF")
G3 = ("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacty of "
      "23.69 GiB of which 1.12 GiB is free. Process 4242 has 15.00 GiB memory in use. Including non-PyTorch memory, "
      "this process has 7.55 GiB memory in use. Of the allocated memory 6.80 GiB is allocated by PyTorch, and "
      "312.00 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
      "max_split_size_mb to avoid fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF")
G4 = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.40 GiB. GPU 0 has a total capacity of "
      "79.10 GiB of which 2.31 GiB is free. Including non-PyTorch memory, this process has 76.78 GiB memory in use. "
      "Of the allocated memory 66.95 GiB is allocated by PyTorch, with 1.00 GiB allocated in private pools (e.g., "
      "CUDA Graphs), and 9.20 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is "
      "large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
      "documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")
G5 = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB. GPU 3 has a total capacity of "
      "31.36 GiB of which 20.19 MiB is free. Process 1001 has 3.00 GiB memory in use. Process 1002 has 1.50 GiB "
      "memory in use. Including non-PyTorch memory, this process has 26.80 GiB memory in use. 24.00 GiB allowed; "
      "Of the allocated memory 25.90 GiB is allocated by PyTorch, and 100.00 MiB is reserved by PyTorch but "
      "unallocated. If reserved but unallocated memory is large try setting "
      "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory "
      "Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)")
GENERIC = ("torch.OutOfMemoryError: Out of memory. Tried to allocate 1024 bytes. GPU 0 has a total capacity of "
           "23.99 GiB of which 100.00 MiB is free. Of the allocated memory 22.50 GiB is allocated by PyTorch, and "
           "600.00 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try "
           "setting PYTORCH_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")
WDDM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 64.00 MiB. GPU 0 has a total capacity of "
        "8.00 GiB of which 0 bytes is free. Of the allocated memory 7.10 GiB is allocated by PyTorch, and "
        "120.00 MiB is reserved by PyTorch but unallocated. Including non-PyTorch memory, this process has "
        "17179869184.00 GiB memory in use.")


def test_oom_g1_numbers():
    m = parse_oom_message(G1)
    assert m.era == "G1"
    assert m.requested_bytes == 20971520  # 20 * 2**20
    assert m.device_index == 0
    assert m.total_bytes == 11553462026  # round(10.76 * 2**30)
    assert m.allocated_bytes == 10103910564  # round(9.41 * 2**30)
    assert m.free_bytes == 13044285  # round(12.44 * 2**20)
    assert m.reserved_bytes == 10447507948  # round(9.73 * 2**30)
    assert m.reserved_unallocated_bytes == 343597384  # reserved - allocated
    assert m.other_unaccounted_bytes == 1092909793  # total - free - reserved
    assert m.hint is None and m.this_process_bytes is None


def test_oom_g2_hint_and_allowed():
    m = parse_oom_message(G2)
    assert (m.era, m.device_index, m.hint) == ("G2", 1, "max_split_size_mb")
    assert m.allowed_bytes == 32 * GIB
    assert m.reserved_bytes == 31 * GIB and m.allocated_bytes == 30 * GIB and m.free_bytes == 40 * GIB
    assert m.reserved_unallocated_bytes == 1 * GIB


def test_oom_g3_typo_other_process_and_derived():
    m = parse_oom_message(G3)
    assert m.era == "G3"
    assert m.requested_bytes == 2 * GIB
    assert m.total_bytes == 25436943811  # round(23.69 * 2**30)
    assert m.free_bytes == 1202590843  # round(1.12 * 2**30)
    assert m.other_process_bytes == 15 * GIB and m.other_process_count == 1
    assert m.this_process_bytes == 8106750771  # round(7.55 * 2**30)
    assert m.allocated_bytes == 7301444403  # round(6.80 * 2**30)
    assert m.reserved_unallocated_bytes == 312 * MIB
    assert m.reserved_bytes == 7301444403 + 312 * MIB  # allocated + unallocated
    assert m.other_unaccounted_bytes == 25436943811 - 1202590843 - 8106750771  # total - free - this process
    assert m.non_pytorch_bytes == 8106750771 - (7301444403 + 312 * MIB)  # this process - reserved
    assert m.hint == "max_split_size_mb"


def test_oom_g4_private_pools_and_fragmentation_numbers():
    m = parse_oom_message(G4)
    assert m.era == "G4" and m.hint == "expandable_segments"
    assert m.requested_bytes == 4724464026  # round(4.40 * 2**30)
    assert m.reserved_unallocated_bytes == 9878424781  # round(9.20 * 2**30)
    assert m.private_pool_bytes == GIB
    assert m.reserved_bytes == 71887015117 + 9878424781 + GIB  # A + U + P
    assert m.other_process_bytes is None


def test_oom_g5_two_processes_and_allowed():
    m = parse_oom_message(G5)
    assert m.era == "G5" and m.device_index == 3
    assert m.requested_bytes == 512 * MIB
    assert m.other_process_bytes == 3 * GIB + GIB + GIB // 2 and m.other_process_count == 2
    assert m.allowed_bytes == 24 * GIB


def test_oom_generic_form_and_bytes_unit():
    m = parse_oom_message(GENERIC)
    assert m.era == "generic" and m.requested_bytes == 1024
    assert m.reserved_unallocated_bytes == 600 * MIB


def test_oom_wddm_garbage_is_dropped():
    m = parse_oom_message(WDDM)
    assert m.this_process_bytes is None and m.non_pytorch_bytes is None
    assert m.free_bytes == 0 and m.total_bytes == 8 * GIB


def test_oom_bare_and_non_oom():
    assert parse_oom_message("torch.OutOfMemoryError: CUDA out of memory.").era == "bare"
    assert parse_oom_message("RuntimeError: CUDA error: out of memory") is None
    assert parse_oom_message("Out of memory: Killed process 12 (python)") is None
    assert parse_oom_message("everything fine") is None


# --- memory summary --------------------------------------------------------------------------

MEMSUM = """|===========================================================================|
|                  PyTorch CUDA memory summary, device ID 0                 |
|---------------------------------------------------------------------------|
|            CUDA OOMs: 1            |        cudaMalloc retries: 37        |
|===========================================================================|
|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |
|---------------------------------------------------------------------------|
| Allocated memory      |  18636 MiB |  22425 MiB |   2887 GiB |   2870 GiB |
|       from large pool |  18077 MiB |  21752 MiB |   2800 GiB |   2784 GiB |
| GPU reserved memory   |  23961 MiB |  23961 MiB |  25600 MiB |   1638 MiB |
|       from large pool |  23242 MiB |  23242 MiB |  24832 MiB |   1589 MiB |
| Non-releasable memory |   2969 MiB |   4198 MiB |   2048 GiB |   2046 GiB |
| Allocations           |    1843    |    2210    |    4100 K  |    4098 K  |
"""


def test_memory_summary():
    s = parse_memory_summary(MEMSUM.splitlines())
    assert s.allocated_bytes == 18636 * MIB and s.peak_allocated_bytes == 22425 * MIB
    assert s.reserved_bytes == 23961 * MIB and s.peak_reserved_bytes == 23961 * MIB
    assert s.non_releasable_bytes == 2969 * MIB
    assert s.reserved_unallocated_bytes == (23961 - 18636) * MIB
    assert (s.oom_count, s.alloc_retries) == (1, 37)
    assert parse_memory_summary(["nothing", "| here |"]) is None


# --- metrics ---------------------------------------------------------------------------------

def test_metric_record_dict_with_bare_nan_inf():
    r = parse_metric_record("{'loss': nan, 'grad_norm': inf, 'learning_rate': 1.9e-05, 'epoch': 0.12}")
    assert math.isnan(r["loss"]) and r["grad_norm"] == math.inf
    assert r["learning_rate"] == pytest.approx(1.9e-05) and r["epoch"] == 0.12


def test_metric_record_key_value_forms():
    assert parse_metric_record("step 10 loss=1.2345 lr=2e-5 grad_norm=-inf")["grad_norm"] == -math.inf
    assert parse_metric_record("epoch 1 | loss: 0.75 | eval_loss: 0.9") == {"loss": 0.75, "eval_loss": 0.9}
    assert parse_metric_record("Epoch 0:  40%|████  | 4/10 [00:02<00:03, loss=2.31, v_num=0]")["loss"] == 2.31
    r = parse_metric_record("{'loss': 1.1, 'memory/max_mem_allocated(gib)': 12.5, 'memory/device_mem_reserved(gib)': 14.0}")
    assert r["memory/max_mem_allocated(gib)"] == 12.5
    assert parse_metric_record("gpu_mem=12.3G loss=1.0")["gpu_mem"] == (12.3, "G")
    assert parse_metric_record("nothing to see") is None


def line(text, n=1, file="t.log", rank=None, time_s=None, index=0):
    return Line(file=file, lineno=n, text=text, rank=rank, time_s=time_s, raw=text, input_index=index)


def collect(texts, **kw):
    c = FactCollector()
    for i, t in enumerate(texts, 1):
        c.feed(line(t, i, **kw))
    return c.finish()


def test_metric_series_facts():
    losses = [2.0, 1.5, 1.0, 1.2, 3.5, "nan", "nan"]
    grads = [1.0, 2.0, 4.0, 8.0, 50.0, "nan", "nan"]
    texts = [f"{{'loss': {l}, 'grad_norm': {g}, 'learning_rate': {1e-4 * (i + 1)}, 'epoch': 0.{i}}}"
             for i, (l, g) in enumerate(zip(losses, grads))]
    texts.append("{'eval_loss': 1.91, 'eval_runtime': 12.3, 'epoch': 1.0}")
    f = collect(texts).flat()
    assert f["metrics.steps"] == 7
    assert f["metrics.first_loss"] == 2.0 and f["metrics.last_loss"] == 3.5
    assert f["metrics.min_loss"] == 1.0 and f["metrics.max_loss"] == 3.5
    assert f["metrics.loss_nan_count"] == 2
    assert f["metrics.first_nonfinite_index"] == 6 and f["metrics.finite_before_nan"] == 5
    assert f["metrics.loss_rise_ratio"] == pytest.approx(3.5)
    assert f["metrics.grad_norm_first"] == 1.0 and f["metrics.grad_norm_max"] == 50.0
    assert f["metrics.grad_norm_growth"] == 50.0 and f["metrics.grad_norm_nan_count"] == 2
    assert f["metrics.lr_max"] == pytest.approx(7e-4) and f["metrics.lr_last"] == pytest.approx(7e-4)
    assert f["metrics.eval_loss_last"] == 1.91
    assert "metrics.train_finished" not in f


def test_flat_zero_and_finished():
    texts = ["{'loss': 0.0, 'learning_rate': 0.0}"] * 30 + ["{'loss': 0.5}", "{'loss': 0.5}"]
    texts.append("{'train_runtime': 151.3, 'train_samples_per_second': 5.3, 'train_loss': 0.2, 'epoch': 3.0}")
    f = collect(texts).flat()
    assert f["metrics.loss_zero_count"] == 30 and f["metrics.loss_flat_steps"] == 30
    assert f["metrics.loss_range"] == 0.5 and f["metrics.train_finished"] is True
    assert f["metrics.steps"] == 32  # train_loss is not a step record
    assert f["metrics.train_loss"] == 0.2  # the end-of-training record's run average


def test_loss_before_zero_is_the_record_before_the_first_exact_zero():
    f = collect(["{'loss': 1.7}", "{'loss': 1.69}", "{'loss': 0.0}", "{'loss': 0.0}"]).flat()
    assert f["metrics.loss_before_zero"] == 1.69 and f["metrics.last_loss"] == 0.0
    assert "metrics.loss_before_zero" not in collect(["{'loss': 0.0}", "{'loss': 0.0}"]).flat()
    assert "metrics.loss_before_zero" not in collect(["{'loss': 1.2}", "{'loss': 0.9}"]).flat()


def test_train_loss_needs_the_end_of_training_record():
    f = collect(["{'loss': 1.2, 'train_loss': 1.1}", "{'loss': 1.0}"]).flat()
    assert "metrics.train_loss" not in f


def test_memory_metric_growth():
    texts = [f"{{'loss': 1.0, 'memory/max_mem_allocated(gib)': {10 + i}.0}}" for i in range(6)]
    f = collect(texts).flat()
    assert f["metrics.mem_first_bytes"] == 10 * GIB and f["metrics.mem_last_bytes"] == 15 * GIB
    assert f["metrics.mem_max_bytes"] == 15 * GIB
    assert f["metrics.mem_growth_ratio"] == pytest.approx(1.5) and f["metrics.mem_rising_records"] == 5


def test_long_runs_keep_only_aggregates():
    c = FactCollector()
    for i in range(20000):
        c.feed(line(f"{{'loss': {1 + (i % 7) / 10}}}", i + 1))
    f = c.finish().flat()
    assert f["metrics.steps"] == 20000 and f["metrics.min_loss"] == 1.0 and f["metrics.max_loss"] == 1.6
    assert len(c.groups["metrics"]) <= 6


def test_peft_and_overflow():
    f = collect([
        "trainable params: 4,194,304 || all params: 6,742,609,920 || trainable%: 0.0622",
        "Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 32768.0",
        "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 16384",
    ]).flat()
    assert f["peft.trainable_params"] == 4194304 and f["peft.all_params"] == 6742609920
    assert f["metrics.overflow_skips"] == 2 and f["metrics.loss_scale_min"] == 16384


def test_deepspeed_overflow_line_without_its_head():
    # an issue title or a quoted line keeps only the sentence after `[deepspeed] OVERFLOW!`
    f = collect(["Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768"]).flat()
    assert f["metrics.overflow_skips"] == 1 and f["metrics.loss_scale_min"] == 32768
    assert "metrics.overflow_skips" not in collect(["Skipping step 3: empty batch"]).flat()


# --- traces ----------------------------------------------------------------------------------

def test_traceback_location_and_oom_phase():
    texts = [
        "Traceback (most recent call last):",
        '  File "/w/train.py", line 80, in <module>',
        '  File "/venv/transformers/trainer.py", line 1555, in train',
        '  File "/venv/transformers/trainer.py", line 3048, in evaluation_loop',
        '  File "/venv/torch/nn/modules/module.py", line 1532, in _call_impl',
        '  File "/venv/transformers/models/llama/modeling_llama.py", line 1200, in forward',
        G4,
    ]
    f = collect(texts).flat()
    assert f["trace.count"] == 1 and f["trace.exception"] == "torch.OutOfMemoryError"
    assert f["trace.location"] == "eval" and f["oom.phase"] == "eval"
    assert f["trace.message"].startswith("CUDA out of memory. Tried to allocate 4.40 GiB")


@pytest.mark.parametrize("funcs,phase", [
    ([("a.py", "train"), ("b.py", "training_step"), ("c.py", "backward"), ("d.py", "_engine_run_backward")], "backward"),
    ([("a.py", "main"), ("t/modeling_utils.py", "from_pretrained"), ("m.py", "_load_state_dict_into_meta_model")], "load"),
    ([("a.py", "train"), ("accelerate/optimizer.py", "step"), ("torch/optim/adamw.py", "step")], "optimizer"),
    ([("a.py", "train"), ("t.py", "_save_checkpoint"), ("t.py", "save_pretrained")], "save"),
    ([("a.py", "main"), ("m.py", "to")], "load"),
    ([("a.py", "train"), ("t.py", "training_step"), ("m.py", "forward")], "forward"),
    ([("a.py", "main")], None),
])
def test_location_from_frames(funcs, phase):
    assert location_from_frames(funcs) == phase


def test_rich_traceback_frames():
    f = collect(["Traceback (most recent call last)", "/venv/transformers/trainer.py:1555 in train",
                 "/venv/peft/tuners/lora/layer.py:497 in forward", "OutOfMemoryError: CUDA out of memory."]).flat()
    assert f["trace.exception"] == "OutOfMemoryError" and f["trace.location"] == "forward"


# --- xid -------------------------------------------------------------------------------------

@pytest.mark.parametrize("text,xid,pci,pid,name,bus", [
    ("NVRM: Xid (PCI:0000:05:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.", 79, "0000:05:00", None, None, True),
    ("NVRM: Xid (PCI:0000:04:00): 69, pid=34566, name=python3, BAR1 access failure at address 0x1", 69, "0000:04:00", 34566, "python3", False),
    ("NVRM: Xid (0000:03:00): 14, Channel 00000001", 14, "0000:03:00", None, None, False),
    ("NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.", 79, "0000:01:00", None, None, True),
    ("NVRM: Xid (PCI:0000:05:00): 79, pid=1173, GPU has fallen off the bus.", 79, "0000:05:00", 1173, None, True),
    ("NVRM: Xid (PCI:0000:3b:00 GPU-I:05): 48, pid=99, name=python, An uncorrectable double bit error", 48, "0000:3b:00", 99, "python", False),
    ("NVRM: Xid (PCI:0000:9B:00): 119, pid=2, name=nvidia-smi, Timeout after 6s of waiting for RPC response", 119, "0000:9b:00", 2, "nvidia-smi", False),
])
def test_parse_xid_shapes(text, xid, pci, pid, name, bus):
    e = parse_xid(text)
    assert (e.xid, e.pci, e.pid, e.process, e.fell_off_bus) == (xid, pci, pid, name, bus)


def test_xid_facts_and_bus_without_xid():
    f = collect([
        "NVRM: GPU 0000:91:00.0: GPU has fallen off the bus.",
        "NVRM: Xid (PCI:0000:3b:00): 63, pid=10, name=python, Row Remapper: New row marked for remapping",
        "NVRM: Xid (PCI:0000:3b:00): 48, pid=10, name=python, DBE",
        "NVRM: Xid (PCI:0000:3b:00): 63, pid=10, name=python, again",
    ]).flat()
    assert f["xid.fell_off_bus"] is True
    assert f["xid.count"] == 3 and f["xid.numbers"] == [63, 48] and f["xid.first"] == 63
    assert f["xid.pci"] == "0000:3b:00" and f["xid.pid"] == 10 and f["xid.process"] == "python"
    assert parse_xid("NVRM: loading NVIDIA UNIX x86_64 Kernel Module") is None


# --- dist ------------------------------------------------------------------------------------

CHILD_FAILED = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2024-05-18_19:02:41
  host      : node1
  rank      : 5 (local_rank: 1)
  exitcode  : 1 (pid: 2222)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2024-05-18_19:02:39
  host      : node1
  rank      : 3 (local_rank: 3)
  exitcode  : -9 (pid: 1234)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 1234
============================================================"""


def test_parse_child_failed_prefers_root_cause():
    e = parse_child_failed(CHILD_FAILED.splitlines())
    assert (e.rank, e.local_rank, e.exit_code, e.pid, e.signal, e.host) == (3, 3, -9, 1234, "SIGKILL", "node1")
    assert parse_child_failed(["nothing"]) is None
    e = parse_child_failed(["[0]:", "  rank      : 2 (local_rank: 2)", "  exitcode  : -6 (pid: 9)"])
    assert (e.rank, e.exit_code, e.signal) == (2, -6, "SIGABRT")


def test_child_failed_facts_streaming():
    f = collect(CHILD_FAILED.splitlines()).flat()
    assert f["dist.child_failed"] is True and f["dist.failed_rank"] == 3
    assert f["dist.exit_code"] == -9 and f["dist.signal"] == "SIGKILL" and f["killed.exit_code"] == -9


WATCHDOG = ("[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, "
            "NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600036 milliseconds before timing out.")


def test_watchdog_timeouts():
    t = parse_watchdog_timeout(WATCHDOG)
    assert (t.rank, t.timeout_ms, t.ran_ms, t.op) == (3, 600000, 600036, "ALLREDUCE")
    c = FactCollector()
    c.feed(line(WATCHDOG.replace("[Rank 3]", "[Rank 1]"), 10, time_s=200.0))
    c.feed(line(WATCHDOG, 11, time_s=100.0))
    c.feed(line("RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1275, unhandled system error", 12, rank=0))
    f = c.finish().flat()
    assert f["dist.timeout_count"] == 2 and f["dist.timeout_ranks"] == [1, 3]
    assert f["dist.first_timeout_rank"] == 3  # earlier by timestamp although later in the file
    assert f["dist.timeout_ms"] == 600000 and f["dist.nccl_error_count"] == 1 and f["dist.ranks"] == [0]


# --- killed, code 43 -------------------------------------------------------------------------

def test_oom_killer_and_bare_killed():
    k = parse_oom_killer("Out of memory: Killed process 12345 (python) total-vm:98765432kB, anon-rss:62914560kB, "
                         "file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:123456kB oom_score_adj:0")
    assert (k.pid, k.process, k.anon_rss_bytes) == (12345, "python", 62914560 * 1024)
    k = parse_oom_killer("Memory cgroup out of memory: Killed process 2231 (pt_main_thread) total-vm:1kB, anon-rss:2048kB")
    assert (k.pid, k.process, k.anon_rss_bytes) == (2231, "pt_main_thread", 2 * MIB)
    assert parse_oom_killer("Out of memory: Kill process 77 (python) score 900 or sacrifice child").pid == 77
    assert is_bare_killed("Killed")
    assert is_bare_killed("/bin/bash: line 1: 12345 Killed                  python train.py")
    assert not is_bare_killed("Killed process 1 (x)") and not is_bare_killed("Process was killed by user")
    # a lower-cased paste keeps the shell's word in lower case
    assert is_bare_killed("killed") and collect(["killed"]).flat()["killed.bare"] is True
    assert parse_exit_code("ERROR: process exited with code 137") == 137
    assert parse_exit_code("subprocess.CalledProcessError: ... died with <Signals.SIGKILL: 9>.") == -9
    f = collect(["Killed", "[ 5107.1] Out of memory: Killed process 9 (python) total-vm:1kB, anon-rss:1024kB"]).flat()
    assert f["killed.bare"] is True and f["killed.oom_killer"] is True and f["killed.anon_rss_bytes"] == MIB


def test_code43():
    f = collect(["NVIDIA GeForce RTX 3080: Windows has stopped this device because it has reported problems. (Code 43)"]).flat()
    assert f["code43.present"] is True and f["code43.device"] == "NVIDIA GeForce RTX 3080"


def test_card_blackwell_names_the_card_or_its_architecture():
    from loradoctor.logs.facts.host import names_blackwell

    for line in ("   \\   /|    NVIDIA GeForce RTX 5060 Ti. Num GPUs = 1. Max memory: 15.478 GB.",
                 "GPU 0: NVIDIA GeForce RTX 5090 D", "b200: cuda error: no kernel image", "the PyTorch Blackwell SM_120 error",
                 "rtx pro 6000 blackwell max-q", "ptxas fatal   : Value 'sm_120a' is not defined", "sm100 build"):
        assert names_blackwell(line), line
    for line in ("NVIDIA GeForce RTX 4090", "RTX 3050 Ti laptop", "{'loss': 1.5, 'grad_norm': 0.5, 'epoch': 0.5}",
                 "batch 5090/6000", "sm_1200 registers", "H200 SXM", "run b2000 done"):
        assert not names_blackwell(line), line
    f = collect(["[bug] rtx 5090 error", "RuntimeError: CUDA error: no kernel image is available"])
    assert f.flat()["card.blackwell"] is True and [e.line for e in f.evidence("card")] == [1]
    assert "card.blackwell" not in collect(["GPU 0: NVIDIA GeForce RTX 4090"]).flat()


def test_card_pre_volta_names_an_old_card_or_its_capability():
    from loradoctor.logs.facts.host import names_pre_volta

    for line in ("   \\   /|    GPU: Tesla P40. Max memory: 23.879 GB. Platform = Linux.",
                 "O^O/ \\_/ \\    Pytorch: 2.3.0+cu121. CUDA = 6.1. CUDA Toolkit = 12.1.", "GPU type: Quadro P6000",
                 "CUDA SETUP: Highest compute capability among GPUs detected: 3.5", "NVIDIA GeForce GTX 1080 Ti",
                 "but your device is of CUDA capability 6.0", "tesla p100-pcie-16gb"):
        assert names_pre_volta(line), line
    for line in ("O^O/ \\_/ \\    Pytorch: 2.3.0. CUDA = 7.5. CUDA Toolkit = 12.1.", "CUDA = 12.1", "Tesla T4*4",
                 "The current PyTorch install supports CUDA capabilities sm_50 sm_60 sm_70 sm_75 sm_80",
                 "Triton only supports devices of CUDA Capability >= 7.0", "Compute capability < 7.5 detected!",
                 "GPU type: Tesla V100-SXM2-32GB", "{'loss': 1.5, 'grad_norm': 0.5, 'epoch': 6.1}"):
        assert not names_pre_volta(line), line
    f = collect(["training failure on pascal", "GPU: Tesla P40. Max memory: 23.879 GB."])
    assert f.flat()["card.pre_volta"] is True and [e.line for e in f.evidence("card")] == [2]
    assert "card.pre_volta" not in collect(["GPU 0: NVIDIA GeForce RTX 4090"]).flat()


def test_evidence_groups_keep_source_lines():
    facts = collect(["noise", G4])
    (ev,) = facts.evidence("oom")
    assert (ev.file, ev.line) == ("t.log", 2) and ev.text.startswith("torch.OutOfMemoryError")
    assert facts.flat()["oom.count"] == 1


def _random_run(rng, n):
    """Losses, grad norms and learning rates as a trainer prints them: plateaus, zeros, nan, inf."""
    losses, gns, lrs = [], [], []
    for _ in range(n):
        r = rng.random()
        losses.append(math.nan if r < 0.05 else math.inf if r < 0.06 else -math.inf if r < 0.07 else 0.0 if r < 0.1
                      else rng.choice([1.0, 1.00005, 1.0005, 1.5, 0.7]) if rng.random() < 0.5 else rng.random() * 3)
        gns.append(math.nan if rng.random() < 0.05 else rng.random() * 10)
        lrs.append(math.inf if rng.random() < 0.02 else rng.random() * 1e-4)
    return losses, gns, lrs


def test_bulk_aggregation_equals_record_by_record():
    """LossAggregate.add_many (the engine's path for blocks of plain dicts) gives exactly what
    add gives record by record, however the records are cut into batches."""
    import random

    from loradoctor.logs.facts.aggregate import LossAggregate

    rng = random.Random(11)
    for trial in range(300):
        losses, gns, lrs = _random_run(rng, rng.randint(1, 120))
        with_gn, with_lr = trial % 3 != 0, trial % 4 != 0
        bulk, slow = LossAggregate(), LossAggregate()
        firsts_bulk, firsts_slow = [], []
        cut = sorted(rng.sample(range(len(losses) + 1), k=min(4, len(losses) + 1)))
        for a, b in zip([0] + cut, cut + [len(losses)]):
            k = bulk.add_many(losses[a:b], gns[a:b] if with_gn else None, lrs[a:b] if with_lr else None)
            if k is not None:
                firsts_bulk.append(a + k)
        for i, loss in enumerate(losses):
            if slow.add(loss, gns[i] if with_gn else None, lrs[i] if with_lr else None):
                firsts_slow.append(i)
        got, want = {}, {}
        bulk.publish(got)
        slow.publish(want)
        assert str(got) == str(want), trial  # str: nan-safe and exact (repr of every float)
        assert firsts_bulk == firsts_slow, trial
        assert (bulk.flat_run, bulk.prev_loss) == (slow.flat_run, slow.prev_loss) or \
            str((bulk.flat_run, bulk.prev_loss)) == str((slow.flat_run, slow.prev_loss)), trial


def test_metric_batch_paths_agree():
    """The collector's bulk path for a block of `{'loss': ...}` dicts and its record-by-record path
    (taken for blocks with odd values) give the same facts and evidence."""
    import random

    rng = random.Random(7)
    for trial in range(40):
        quoted = trial % 2 == 1
        records = []
        for i in range(rng.randint(1, 300)):
            r = rng.random()
            loss = "nan" if r < 0.05 else "inf" if r < 0.07 else "0.0" if r < 0.1 else \
                f"{rng.choice([1.0, 1.00005, 1.0005, 1.5, 0.7]) if rng.random() < 0.5 else rng.random() * 3:.5f}"
            gn = "nan" if rng.random() < 0.05 else f"{rng.random() * 10:.3f}"
            lr = f"{rng.random() * 1e-4:.3e}"
            if quoted and rng.random() < 0.7:  # some trainers log every value as a string
                loss, gn, lr = f"'{loss}'", f"'{gn}'", f"'{lr}'"
            records.append((loss.encode(), gn.encode(), lr.encode(), b", 'epoch': 0.1", b""))
        fast, slow = FactCollector(block_metrics=True), FactCollector(block_metrics=True)
        cut = sorted(rng.sample(range(len(records) + 1), k=min(3, len(records) + 1)))
        for a, b in zip([0] + cut, cut + [len(records)]):
            fast.feed_metric_batch(records[a:b], lambda k, a=a: line("x", a + k + 1))
            slow.metrics._scalar_batch(records[a:b], lambda k, a=a: line("x", a + k + 1))
        f, s = fast.finish(), slow.finish()
        assert f.flat() == s.flat() or str(f.flat()) == str(s.flat()), trial  # nan-safe comparison
        assert f.groups == s.groups, trial


# --- misreadings of real logs (QA reproducers) ----------------------------------------------

from loradoctor.logs.reader import make_line  # noqa: E402
from loradoctor.units import parse_size  # noqa: E402


def collect_raw(texts):
    """Like collect, but through the reader's normalisation (rank prefixes, rich boxes)."""
    c = FactCollector()
    for i, t in enumerate(texts, 1):
        c.feed(make_line(t.encode(), "t.log", i))
    return c.finish()

FULL_OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.02 GiB. GPU 0 has a total capacity of "
            "79.25 GiB of which 1.06 GiB is free. Including non-PyTorch memory, this process has 78.18 GiB memory in "
            "use. Of the allocated memory 52.20 GiB is allocated by PyTorch, and 23.61 GiB is reserved by PyTorch "
            "but unallocated. If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")


def test_bare_oom_warning_does_not_hide_the_numbered_message():
    f = collect(["2024-05-01 10:00:00 | WARNING | CUDA out of memory on batch 311, skipping batch",
                 "Traceback (most recent call last):", FULL_OOM]).flat()
    assert f["oom.count"] == 2 and f["oom.era"] == "G4"
    assert f["oom.requested_bytes"] == parse_size("3.02 GiB") and f["oom.allocated_bytes"] == parse_size("52.20 GiB")
    assert f["oom.reserved_unallocated_bytes"] == parse_size("23.61 GiB")


def test_only_the_first_numbered_message_gives_the_numbers():
    f = collect([FULL_OOM, G1]).flat()
    assert f["oom.count"] == 2 and f["oom.requested_bytes"] == parse_size("3.02 GiB")


def test_headerless_rank_tail_gives_the_phase():
    f = collect_raw([
        '[rank2]:   File "/w/train.py", line 40, in <module>',
        '[rank2]:   File "/venv/transformers/modeling_utils.py", line 4214, in _load_pretrained_model',
        "[rank2]:     error_msgs += _load_state_dict_into_meta_model(",
        '[rank2]:   File "/venv/transformers/modeling_utils.py", line 887, in _load_state_dict_into_meta_model',
        "[rank2]: " + FULL_OOM,
    ]).flat()
    assert f["oom.phase"] == "load" and f["trace.location"] == "load"


@pytest.mark.parametrize("frames,sources,phase", [
    # kohya: a user function named train loads the model with .to()
    ([("train_network.py", "<module>"), ("train_network.py", "train"), ("train_network.py", "prepare_model"),
      ("torch/nn/modules/module.py", "to"), ("torch/nn/modules/module.py", "_apply")], [], "load"),
    # the OOM raised right in the user's line: the source line is the hint
    ([("train_network.py", "train"), ("train_network.py", "prepare_model")], ["model = model.to(self.device)"], "load"),
    # moving a batch inside a training step is no load
    ([("trainer.py", "train"), ("trainer.py", "training_step"), ("m.py", "to")], ["inputs = inputs.to(device)"],
     "forward"),
    # innermost named frame: an eval inside training, generate inside eval
    ([("a.py", "train"), ("t.py", "evaluate"), ("t.py", "generate"), ("m.py", "forward")], [], "generate"),
])
def test_location_innermost_and_load_hints(frames, sources, phase):
    assert location_from_frames(frames, sources) == phase


def test_kohya_train_then_model_to_is_load():
    f = collect([
        "Traceback (most recent call last):",
        '  File "/k/train_network.py", line 990, in <module>',
        '  File "/k/train_network.py", line 351, in train',
        '  File "/k/library/train_util.py", line 4120, in prepare_model',
        "    model = model.to(self.device)",
        '  File "/venv/torch/nn/modules/module.py", line 1152, in to',
        FULL_OOM,
    ]).flat()
    assert f["oom.phase"] == "load"


def test_oom_phase_and_location_come_from_the_oom_traceback():
    f = collect([
        "Traceback (most recent call last):",
        '  File "/venv/transformers/modeling_utils.py", line 3500, in from_pretrained',
        '  File "/venv/transformers/utils/import_utils.py", line 1500, in _get_module',
        "ImportError: flash_attn is not installed",
        "falling back to sdpa",
        "Traceback (most recent call last):",
        '  File "/w/train.py", line 80, in <module>',
        '  File "/venv/transformers/trainer.py", line 1555, in train',
        '  File "/venv/transformers/trainer.py", line 2300, in _inner_training_loop',
        FULL_OOM,
    ]).flat()
    assert f["trace.exception"] == "ImportError"  # the first traceback still names the exception
    assert "trace.location" not in f and "oom.phase" not in f  # not 'load' from the ImportError


def test_rich_frame_wrapped_onto_two_box_lines():
    f = collect_raw([
        "╭───────────────────── Traceback (most recent call last) ──────────────────────╮",
        "│ /usr/lib/python3.10/site-packages/transformers/modeling_utils.py:             │",
        "│ 698 in _load_state_dict_into_meta_model                                       │",
        "│                                                                               │",
        "╰───────────────────────────────────────────────────────────────────────────────╯",
        "OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB.",
    ]).flat()
    assert f["trace.location"] == "load" and f["oom.phase"] == "load"


def test_wrapped_oom_message_is_joined():
    f = collect([
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10"
        " GiB of which 1.50 GiB is free. Including non-PyTorch memory, this process has 77.58 GiB memory in use. Of t"
        "he allocated memory 44.31 GiB is allocated by P",
        "yTorch, and 31.92 GiB is reserved by PyTorch but unallocated.",
    ]).flat()
    assert f["oom.allocated_bytes"] == parse_size("44.31 GiB") and f["oom.reserved_unallocated_bytes"] == parse_size("31.92 GiB")
    assert f["oom.count"] == 1


def test_notebook_split_after_out_of_memory_is_joined():
    f = collect([
        "OutOfMemoryError: CUDA out of memory. ",
        "Tried to allocate 1.02 GiB. GPU 0 has a total capacity of 14.75 GiB of which 1.01 GiB is free.",
    ]).flat()
    assert f["oom.requested_bytes"] == parse_size("1.02 GiB") and f["oom.total_bytes"] == parse_size("14.75 GiB")
    assert f["oom.count"] == 1 and f["oom.era"] == "G4"


def test_unrelated_line_after_an_unfinished_oom_is_not_joined():
    f = collect(["CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 10.76 GiB total capacity",
                 "{'loss': 1.0}"]).flat()
    assert f["oom.count"] == 1 and f["oom.requested_bytes"] == 20 * MIB and "oom.total_bytes" not in f


def test_hip_mps_and_fraction_forms():
    hip = parse_oom_message("torch.OutOfMemoryError: HIP out of memory. Tried to allocate 3.86 GiB. GPU 0 has a "
                            "total capacity of 63.98 GiB of which 1.00 GiB is free. Of the allocated memory 50.00 GiB "
                            "is allocated by PyTorch, and 2.00 GiB is reserved by PyTorch but unallocated.")
    assert hip.requested_bytes == parse_size("3.86 GiB") and hip.total_bytes == parse_size("63.98 GiB")
    assert hip.reserved_bytes == 52 * GIB
    mps = parse_oom_message("RuntimeError: MPS backend out of memory (MPS allocated: 17.07 GB, other allocations: "
                            "1.22 GB, max allowed: 18.13 GB). Tried to allocate 256.00 MB on private pool.")
    assert mps.era == "mps" and mps.requested_bytes == 256 * MIB
    assert mps.allocated_bytes == parse_size("17.07 GiB") and mps.allowed_bytes == parse_size("18.13 GiB")
    assert mps.non_pytorch_bytes == parse_size("1.22 GiB")
    lines = ["RuntimeError: Allocation on device 0 would exceed allowed memory. (out of memory)",
             "Currently allocated     : 5.17 GiB", "Requested               : 20.00 MiB",
             "Device limit            : 6.00 GiB", "Free (according to CUDA): 0 bytes",
             "PyTorch limit (set by user-supplied memory fraction)", "                        : 17179869184.00 GiB"]
    frac = parse_oom_message(" ".join(lines))
    assert frac.era == "fraction" and frac.device_index == 0 and frac.allocated_bytes == parse_size("5.17 GiB")
    assert frac.requested_bytes == 20 * MIB and frac.total_bytes == 6 * GIB and frac.free_bytes == 0
    assert frac.allowed_bytes is None  # 17179869184 GiB is garbage
    # the collector joins the figure lines; it publishes their numbers once the rules read these forms
    c = FactCollector()
    for i, t in enumerate(lines, 1):
        c.feed(line(t, i))
    assert c.oom._oom_pending is None or c.oom._oom_pending["joins"] >= 4
    f = c.finish().flat()
    assert f["oom.count"] == 1 and f["oom.era"] == "fraction"


def test_this_process_zero_bytes_is_dropped():
    msg = parse_oom_message("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 224.00 MiB. GPU 0 has a "
                            "total capacity of 79.15 GiB of which 113.62 MiB is free. Including non-PyTorch memory, "
                            "this process has 0 bytes memory in use. Of the allocated memory 60.00 GiB is allocated "
                            "by PyTorch, and 1.00 GiB is reserved by PyTorch but unallocated.")
    assert msg.this_process_bytes is None and msg.other_unaccounted_bytes is None
    assert msg.non_pytorch_bytes is None and msg.reserved_bytes == 61 * GIB


def test_loss_scale_with_negative_exponent():
    f = collect(["Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 6.103515625e-05",
                 "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 1e-04, reducing to 3.0517578125e-05"]).flat()
    assert f["metrics.overflow_skips"] == 2 and f["metrics.loss_scale_min"] == pytest.approx(3.0517578125e-05)


@pytest.mark.parametrize("texts", [
    ["[ 1234.5] NVRM: GPU at 0000:01:00.0 has fallen off the bus."],
    ["NVRM: The NVIDIA GPU 0000:b3:00.0", "NVRM: (PCI ID: 10de:2335) installed in this system has",
     "NVRM: fallen off the bus and is not responding to commands."],
])
def test_fell_off_bus_wordings(texts):
    f = collect(texts).flat()
    assert f["xid.fell_off_bus"] is True and "xid.count" not in f


def test_code43_pnputil_shape():
    f = collect(["Instance ID:                PCI\\VEN_10DE&DEV_2684", "Problem Code:               43 (0x2B) [CM_PROB_FAILED_POST_START]",
                 "Problem Code:               0"]).flat()
    assert f["code43.present"] is True
    assert "code43.present" not in collect(["Problem Code:               430 (0x1AE)"]).flat()


def test_mmcv_memory_and_loss():
    texts = [f"2024-01-01 10:00:0{i},000 - mmdet - INFO - Epoch [1][{50 * (i + 1)}/1000]  lr: 1.000e-04, eta: 1:02:03, "
             f"time: 0.812, data_time: 0.015, memory: {6814 + 100 * i}, loss_cls: 0.5, loss: {1.2345 - i / 100:.4f}"
             for i in range(5)]
    f = collect(texts).flat()
    assert f["metrics.steps"] == 5 and f["metrics.first_loss"] == 1.2345
    assert f["metrics.mem_first_bytes"] == 6814 * MIB and f["metrics.mem_last_bytes"] == 7214 * MIB
    assert f["metrics.mem_rising_records"] == 4


@pytest.mark.parametrize("bar,loss", [
    ("Epoch 0:  62%|██▏ | 250/400 [01:02<00:37, 4.01it/s, loss=nan, v_num=3]", "nan"),
    ("Epoch 1: 100%|██████████| 400/400 [01:40<00:00, 4.00it/s, v_num=3, train_loss=0.512]", 0.512),
    ("steps:  10%|█         | 100/1000 [01:40<15:00,  1.00s/it, avr_loss=0.0912]", 0.0912),
])
def test_loss_in_tqdm_postfix(bar, loss):
    f = collect_raw(["\r".join([bar.replace("nan", "0.9"), bar])]).flat()
    assert f["metrics.steps"] == 1
    if loss == "nan":
        assert f["metrics.loss_nan_count"] == 1 and f["metrics.first_nonfinite_index"] == 1
    else:
        assert f["metrics.last_loss"] == loss
    assert "metrics.steps" not in collect_raw(["  5%|▌    | 5/100 [00:01<00:19, 4.9it/s]"]).flat()


def test_world_size_and_silent_ranks():
    texts = ["[rank0]: NCCL INFO comm 0x5581 rank 0 nranks 4 cudaDev 0 busId 1000 - Init COMPLETE",
             "[rank0]: NCCL INFO comm 0x5582 rank 0 nRanks 2 nNodes 1 localRanks 2 localRank 0 MNNVL 0"]
    texts += [f"[rank{r}]:[E ProcessGroupNCCL.cpp:563] [Rank {r}] Watchdog caught collective operation timeout: "
              f"WorkNCCL(SeqNum=5, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600036 milliseconds before timing out."
              for r in (0, 1, 3)]
    f = collect_raw(texts).flat()
    assert f["dist.world_size"] == 4 and f["dist.silent_ranks"] == [2]
    f = collect(["torchrun --nnodes=2 --nproc_per_node=4 train.py"]).flat()
    assert f["dist.world_size"] == 8 and "dist.silent_ranks" not in f
    assert collect(["export WORLD_SIZE=2"]).flat()["dist.world_size"] == 2


# --- metric shapes without float dicts -------------------------------------------------------

STRING_DICTS = ["{'loss': '1.853', 'grad_norm': '0.6612', 'learning_rate': '0.0002', 'epoch': '0.05'}",
                "{'loss': '1.412', 'grad_norm': '0.5', 'learning_rate': '0.00019', 'epoch': '0.1'}",
                "{'loss': 'nan', 'grad_norm': 'nan', 'learning_rate': '0.00018', 'epoch': '0.15'}"]
FLOAT_DICTS = [t.replace("'", "").replace("{", "{'").replace(", ", ", '").replace(": ", "': ") for t in STRING_DICTS]


def test_string_valued_dicts_parse_like_floats():
    assert FLOAT_DICTS[0] == "{'loss': 1.853, 'grad_norm': 0.6612, 'learning_rate': 0.0002, 'epoch': 0.05}"
    as_strings, as_floats = collect(STRING_DICTS).flat(), collect(FLOAT_DICTS).flat()
    assert str(as_strings) == str(as_floats)
    assert as_strings["metrics.steps"] == 3 and as_strings["metrics.loss_nan_count"] == 1
    assert as_strings["metrics.first_loss"] == 1.853 and as_strings["metrics.lr_max"] == 0.0002
    assert as_strings["metrics.grad_norm_nan_count"] == 1 and as_strings["metrics.first_nonfinite_index"] == 3


def test_string_valued_dicts_in_the_bulk_path():
    from loradoctor.logs.facts import METRIC_DICT_RE

    def bulk(texts):
        c = FactCollector(block_metrics=True)
        c.feed_metric_batch(METRIC_DICT_RE.findall("\n".join(texts).encode()), lambda k: line(texts[k], k + 1))
        return c.finish().flat()

    assert str(bulk(STRING_DICTS)) == str(bulk(FLOAT_DICTS)) == str(collect(FLOAT_DICTS).flat())
    json_text = ['{"loss": "2.5", "grad_norm": "nan", "learning_rate": "1e-4", "step": 5}']
    c = FactCollector(block_metrics=True)
    c.feed_metric_batch(METRIC_DICT_RE.findall(json_text[0].encode()), lambda k: line(json_text[0], 1))
    f = c.finish().flat()
    assert f["metrics.first_loss"] == 2.5 and f["metrics.grad_norm_nan_count"] == 1 and f["metrics.lr_max"] == 1e-4


def test_metric_dict_cut_at_the_line_end_is_read_to_its_last_whole_pair():
    """A paste cut at a terminal or title width (issue 10) ends a Trainer dict mid-pair: the whole pairs
    before the cut count, the pair the cut ran into does not (a `'loss': 0.0` cut from `0.0213` is no
    zero loss), and a dict cut inside its loss value is no record."""
    from loradoctor.logs.facts import METRIC_DICT_RE

    cut = [b"{'loss': 0.6931, 'learning_rate': 4.9e-07, 'rewards/chosen': 0.0, 'rewards/rejec",
           b"{'loss': 0.0, 'grad_norm': nan, 'learning_rate': 4.99",
           b"{'loss': 1.6914, 'grad_norm': 2.118e-05, 'learning_rate': 9.92e-06, 'epoch': 0.0"]
    assert METRIC_DICT_RE.findall(b"\n".join(cut) + b"\r\n") == [
        (b"0.6931", b"", b"4.9e-07", b", 'rewards/chosen': 0.0", b""),
        (b"0.0", b"nan", b"", b"", b""),
        (b"1.6914", b"2.118e-05", b"9.92e-06", b"", b"")]
    # the loss itself cut (no `,` after it), or a line that only starts like a dict: nothing
    assert METRIC_DICT_RE.findall(b"{'loss': 0.0\n{'loss': 0.02\n") == []
    texts = [t.decode() for t in cut]
    c = FactCollector(block_metrics=True)
    c.feed_metric_batch(METRIC_DICT_RE.findall("\n".join(texts).encode()), lambda k: line(texts[k], k + 1))
    f = c.finish().flat()
    assert f["metrics.steps"] == 3 and f["metrics.first_loss"] == 0.6931 and f["metrics.grad_norm_nan_count"] == 1


def feed_blocks(blocks):
    """Notebook tables through the block path, as the engine feeds them (line numbers per block)."""
    c = FactCollector(block_metrics=True)
    base = 0
    for block in blocks:
        raw = block.encode()
        c.feed_table_block(raw, lambda r, n, base=base: line(r.decode(), base + n))
        base += raw.count(b"\n")
    return c


FLAT_TABLE = (" [600/600 12:41, Epoch 3/3]\nStep\tTraining Loss\tValidation Loss\n"
              + "".join(f"{50 * i}\t0.693100\t0.693147\n" for i in range(1, 13)) + "TrainOutput(global_step=600)\n")


@pytest.mark.parametrize("table, steps, first, last, nan, eval_last, first_row", [
    (FLAT_TABLE, 12, 0.6931, 0.6931, 0, 0.693147, 3),
    # space-separated, without the Validation column
    ("Step Training Loss\n10 2.104000\n20 1.873000\n30 1.650000\n\n{'train_runtime': 10.0}\n", 3, 2.104, 1.65, 0, None, 2),
    # per-epoch table, `No log` before the first logging step, nan rows
    ("Epoch\tTraining Loss\tValidation Loss\tAccuracy\n1\tNo log\t0.912000\t0.61\n2\t0.850000\t0.880000\t0.64\n"
     "3\tnan\tnan\t0.50\n4\tnan\tnan\t0.50\nDone\n", 3, 0.85, 0.85, 2, math.nan, 3),
    # `|`-separated (markdown pastes), padded columns
    ("| Step | Training Loss | Validation Loss |\n|   5  |  1.2  |  1.3  |\n|  10  |  1.1  |  1.25 |\n", 2, 1.2, 1.1, 0, 1.25, 2),
])
def test_notebook_table_rows_become_records(table, steps, first, last, nan, eval_last, first_row):
    f = feed_blocks([table]).finish()
    v = f.flat()
    assert v["metrics.steps"] == steps and v["metrics.loss_nan_count"] == nan
    assert v["metrics.first_loss"] == first and v["metrics.last_loss"] == last
    if eval_last is None:
        assert "metrics.eval_loss_last" not in v
    else:
        assert str(v["metrics.eval_loss_last"]) == str(eval_last)
    assert f.evidence("metrics")[0].line == first_row  # the first row with a training loss


def test_notebook_table_ends_at_first_non_row_and_spans_blocks():
    f = feed_blocks([FLAT_TABLE]).finish().flat()
    assert f["metrics.loss_flat_steps"] == 12  # `TrainOutput(...)` ended the rows
    head, tail = FLAT_TABLE.split("300\t", 1)
    split = feed_blocks([head, "300\t" + tail]).finish()
    assert split.flat() == f
    assert [e.line for e in split.evidence("metrics")] == [3, 14]  # first and last row, file line numbers
    # a header that ends its block takes its rows from the next block
    assert feed_blocks(["Step\tTraining Loss\n", "5\t1.0\n10\t0.9\n"]).finish().flat()["metrics.steps"] == 2
    # rows after a line that is no row are not the table's
    assert feed_blocks(["Step\tTraining Loss\n5\t1.0\nsaving\n10\t0.9\n"]).finish().flat()["metrics.steps"] == 1


def test_notebook_table_does_not_add_to_dict_records():
    from loradoctor.logs.facts import METRIC_DICT_RE

    c = feed_blocks([FLAT_TABLE])
    c.feed_metric_batch(METRIC_DICT_RE.findall("\n".join(FLOAT_DICTS).encode()), lambda k: line(FLOAT_DICTS[k], 100 + k))
    assert str(c.finish().flat()) == str(collect(FLOAT_DICTS).flat())


WANDB_SUMMARY = """wandb: Run history:
wandb:          train/epoch ▁▂▃▄▅▆▇█
wandb:           train/loss ▁▁
wandb:
wandb: Run summary:
wandb:               total_flos 1.2345e+16
wandb:              train/epoch 3.0
wandb:        train/global_step 600
wandb:          train/grad_norm nan
wandb:      train/learning_rate 0.0002
wandb:               train/loss nan
wandb:            train_runtime 761.2
wandb: 🚀 View run fine-tune at: https://wandb.ai/me/proj/runs/abc
""".splitlines()


def test_wandb_summary_is_one_final_record():
    f = collect(WANDB_SUMMARY)
    v = f.flat()
    assert v["metrics.steps"] == 1 and v["metrics.loss_nan_count"] == 1 and v["metrics.grad_norm_nan_count"] == 1
    assert v["metrics.first_nonfinite_index"] == 1 and v["metrics.finite_before_nan"] == 0
    assert v["metrics.lr_max"] == 0.0002 and v["metrics.train_finished"] is True
    assert v["metrics.summary_only"] is True
    assert any("train/loss nan" in e.text for e in f.evidence("metrics"))
    # with dict records in the log, the summary adds nothing (no fake last step)
    both = collect(STRING_DICTS + WANDB_SUMMARY).flat()
    assert both["metrics.steps"] == 3 and both["metrics.last_loss"] == 1.412 and "metrics.summary_only" not in both
    # a history line without a number, and another run's summary, are no records
    assert "metrics.steps" not in collect(WANDB_SUMMARY[:4]).flat()





def test_end_to_end_notebook_table_flat_loss(tmp_path):
    report = explain_text(tmp_path, name="nb.log", text="Unsloth: training on a Tesla T4\n" + FLAT_TABLE)
    assert report.facts["metrics.steps"] == 12 and report.facts["metrics.loss_flat_steps"] == 12
    assert "loss.flat" in [f.cause for f in report.findings]


def test_end_to_end_string_dicts_fp16_nan(tmp_path):
    lines = ["TrainingArguments(output_dir='out', fp16=True, bf16=False)"]
    lines += ["{'loss': '%.3f', 'grad_norm': '0.66', 'learning_rate': '0.0002', 'epoch': '0.%02d'}" % (1.9 - 0.1 * i, i)
              for i in range(6)]
    lines += ["{'loss': 'nan', 'grad_norm': 'nan', 'learning_rate': '0.0002', 'epoch': '0.9'}"] * 3
    report = explain_text(tmp_path, name="s.log", text="\n".join(lines) + "\n")
    assert report.facts["metrics.steps"] == 9 and report.facts["metrics.loss_nan_count"] == 3
    assert report.findings and report.findings[0].cause == "nan.fp16_overflow"


def test_end_to_end_wandb_summary(tmp_path):
    report = explain_text(tmp_path, name="w.log", text="TrainingArguments(fp16=True)\n" + "\n".join(WANDB_SUMMARY) + "\n")
    assert report.facts["metrics.steps"] == 1 and report.facts["metrics.loss_nan_count"] == 1
    assert report.facts["metrics.summary_only"] is True


@pytest.mark.parametrize("text, expected", [
    ("wandb:               train/loss nan", ("loss", "nan")),
    ("wandb:      train/learning_rate 0.0002", ("learning_rate", "0.0002")),
    ("2024-05-01 10:00:00 wandb:   train/grad_norm 1.5", ("grad_norm", "1.5")),
    ("wandb:           train/loss ▁▂▃▄", None),  # Run history sparkline
    ("wandb:               total_flos 1.2e+16", None),  # not a record key
    ("wandb: Tracking run with wandb version 0.16.6", None),
])
def test_parse_wandb_value(text, expected):
    from loradoctor.logs.facts import parse_wandb_value

    got = parse_wandb_value(text)
    assert (got and (got[0], str(got[1]))) == (expected and (expected[0], str(float(expected[1]))))


def test_spaced_metric_lines_are_records():
    from loradoctor.logs.facts import parse_metric_record

    mlx = "Iter 75: Train loss 3.316, Learning Rate 1.000e-04, It/sec 0.52, Tokens/sec 411.2, Peak mem 18.2 GB"
    assert parse_metric_record(mlx) == {"loss": 3.316, "learning_rate": 1e-4}
    rec = parse_metric_record("step 100 | loss nan | lr 2e-4 | grad_norm 0.8")
    assert math.isnan(rec["loss"]) and rec["learning_rate"] == 2e-4 and rec["grad_norm"] == 0.8
    assert parse_metric_record("Iter 80: Val loss 2.901, Val took 12.3s") is None  # validation, not training
    assert parse_metric_record("we expected a loss 2 times lower") is None  # prose: no step at the start


def test_markdown_table_separator_row_does_not_end_the_table(tmp_path):
    from loradoctor.logs.engine import explain

    log = tmp_path / "nb.log"
    log.write_text("| Step | Training Loss |\n|------|---------------|\n| 10   | 2.1000 |\n| 20   | nan |\n")
    facts = explain([str(log)]).facts
    assert facts["metrics.steps"] == 2 and facts["metrics.loss_nan_count"] == 1


def test_old_deepspeed_overflow_wording_counts(tmp_path):
    from loradoctor.logs.engine import explain

    log = tmp_path / "ds.log"
    log.write_text("".join(f"[2024-05-01 10:00:{i:02d}] Overflow detected. Skipping step. Attempted loss scale: "
                           f"{2 ** (10 - i)}, reducing to {2 ** (9 - i)}\n" for i in range(10)))
    facts = explain([str(log)]).facts
    assert facts["metrics.overflow_skips"] == 10
    assert facts["metrics.loss_scale_min"] == 1.0


def test_memory_keys_of_torchtune_and_hand_written_loops():
    from loradoctor.logs.facts import _metric_bytes, parse_metric_record

    tt = parse_metric_record("Step 10 | loss:1.42 lr:3e-05 peak_memory_alloc:18.02 peak_memory_reserved:18.90")
    assert _metric_bytes("peak_memory_alloc", tt["peak_memory_alloc"]) == int(18.02 * 2**30)
    loop = parse_metric_record("Epoch 1 | step 100 | loss 2.1 | GPU memory allocated: 6.12 GB")
    assert loop["loss"] == 2.1 and _metric_bytes("memory_allocated", loop["memory_allocated"]) == 6_120_000_000


def test_private_generation_loops_and_lightning_validation_are_phases():
    from loradoctor.logs.facts import location_from_frames

    gen = [("train.py", "<module>"), ("transformers/generation/utils.py", "_beam_search"), ("torch/nn/modules/module.py", "_call_impl")]
    assert location_from_frames(gen) == "generate"
    val = [("train.py", "<module>"), ("lightning/pytorch/trainer/trainer.py", "_run_sanity_check"),
           ("model.py", "validation_step"), ("torch/nn/modules/module.py", "forward")]
    assert location_from_frames(val) == "eval"


def test_torchtune_bar_description_is_a_record(tmp_path):
    from loradoctor.logs.engine import explain

    log = tmp_path / "tt.log"
    log.write_text("".join(f"1|{i}|Loss: {v}:   0%|          | {i}/1617 [00:09<4:05:51,  9.13s/it]\n"
                           for i, v in enumerate(["1.87", "1.52", "nan", "nan"], 1)))
    facts = explain([str(log)]).facts
    assert facts["metrics.steps"] == 4 and facts["metrics.loss_nan_count"] == 2 and facts["metrics.first_loss"] == 1.87


def test_validation_image_frames_are_eval():
    from loradoctor.logs.facts import location_from_frames

    frames = [("train_network.py", "train"), ("train_util.py", "sample_images"), ("unet.py", "forward")]
    assert location_from_frames(frames) == "eval"


_VAL_BAR = "Validation DataLoader 0:  23%|██▎       | 29/125 [00:11<00:37,  2.55it/s]"
_TRAIN_BAR = "Epoch 1:   3%|▎         | 15/500 [00:12<06:30,  1.24it/s, v_num=3, train_loss=1.380]"


@pytest.mark.parametrize("bars, want", [
    ([_VAL_BAR], "eval"),
    # catalyst's bar has no bar characters, only the percentage and n/total
    (["1/20 * Epoch (valid):  14% 9/64 [00:04<00:26,  2.08it/s, loss=0.804]"], "eval"),
    (["Sanity Checking DataLoader 0:  50%|█████     | 1/2 [00:00<00:00,  2.1it/s]"], "eval"),
    # a training bar after the validation bar: the next epoch had started
    ([_VAL_BAR, _TRAIN_BAR], None),
    # a validation bar at its total: the loop had finished
    (["Validation DataLoader 0: 100%|██████████| 125/125 [00:48<00:00,  2.58it/s]"], None),
    ([_TRAIN_BAR], None),
    ([], None),
    # transformers' evaluation bar has no description: its banner before it names the loop
    (["***** Running Evaluation *****", "  Num examples = 2400", "  Batch size = 4",
      " 62%|██████▏   | 372/600 [04:11<02:33,  1.49it/s]"], "eval"),
    # the banner of an earlier evaluation, then a training bar: not the eval loop
    (["***** Running Evaluation *****", "  Batch size = 4", " 10%|█         | 50/500 [00:41<06:10,  1.2it/s]",
      "100%|██████████| 600/600 [04:11<00:00,  1.49it/s]", " 11%|█         | 55/500 [00:45<06:10,  1.2it/s]"], None),
])
def test_oom_bar_phase_is_the_interrupted_evaluation_bar(tmp_path, bars, want):
    text = "\n".join(["start"] + bars + ["Traceback (most recent call last):", "RuntimeError: CUDA error: out of memory"])
    facts = explain_text(tmp_path, text + "\n").facts
    assert facts.get("oom.bar_phase") == want


@pytest.mark.parametrize("lines, want", [
    # no bar pasted: the sentence just before the error names transformers' loading step
    (['But on the "Loading checkpoint shards" step I\'m getting an error:', ""], "load"),
    (["it dies while loading checkpoint shards:"], "load"),
    # the step named as passed, or far above the error: no phase from it
    (['It gets past the "Loading checkpoint shards" stage and trains.', "a", "b", "c", "d"], None),
    (["Loading checkpoint shards finished, then the first step:"], None),
])
def test_oom_bar_phase_reads_the_loading_step_named_in_prose(tmp_path, lines, want):
    text = "\n".join(["start"] + lines + ["torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."])
    facts = explain_text(tmp_path, text + "\n").facts
    assert facts.get("oom.bar_phase") == want


def test_last_training_bar_read_from_the_tail_is_the_whole_windows_last_bar():
    """The OOM's step comes from the last tqdm bar before it; the tail of the window is read first
    (from a line break no bar match can straddle) and must give what a scan of the whole window gives."""
    import random

    from loradoctor.logs.facts import oom

    rng = random.Random(7)
    toks = [b"\r", b"\n", b" ", b"|", b"5", b"12", b"%|", b"/", b"[", b"]", b"s/it", b"it/s", b"Train ", b"Map ",
            b"x", b"\t", b"10/20 [00:01<00:02, 2.0s/it]", b"  50%|#####     | ", b"\r\n", b"] \r 3/4", b"|\r7/9 ["]
    first = oom.BAR_TAIL_FIRST_BYTES
    try:
        oom.BAR_TAIL_FIRST_BYTES = 16  # the tail path on short texts
        found = 0
        for i in range(1500):
            text = b"".join(rng.choice(toks) for _ in range(rng.randrange(0, 400)))
            end = rng.randrange(0, len(text) + 1)
            window = rng.choice([1 << 20, 100, 1000])
            whole = oom._last_bar_in(text, max(0, end - window), end)
            assert oom._last_training_bar(text, end, window) == whole, (text, end, window)
            found += whole is not None
        assert found > 100
    finally:
        oom.BAR_TAIL_FIRST_BYTES = first
    bars = "".join(f"\r  {k // 10}%|#         | {k}/1000 [00:{k % 60:02d}<01:00, 2.0s/it]" for k in range(1, 900))
    log = ("Map: 100%|##########| 50/50 [00:01<00:00, 40.0it/s]\n" + bars + "\n{'loss': 1.0}\nOOM\n").encode()
    assert oom._last_training_bar(log, log.index(b"OOM")) == (899, 1000)
    # a bar whose `\s*` runs over a line break (`| 12/20` + `\n` + `[ 5%|x| 3/4 [...]`): read from that
    # break, the rest would look like a bar of its own (3/4); the whole bar is 12/20
    log = (bars + "\r 60%|######| 12/20\n[ 5%|x| 3/4 [00:01, 2.0s/it]\nOOM\n").encode()
    end = log.index(b"OOM")
    assert oom._last_bar_in(log, 0, end) == (12, 20)
    try:
        oom.BAR_TAIL_FIRST_BYTES = end - log.index(b"\n[ 5%") + 1  # the tail starts at that break
        assert oom._last_training_bar(log, end) == (12, 20)
    finally:
        oom.BAR_TAIL_FIRST_BYTES = first


def test_eval_loss_nonfinite_only_for_nan_or_inf():
    assert collect(["{'loss': 1.2}", "{'eval_loss': nan, 'epoch': 0.5}"]).flat()["metrics.eval_loss_nonfinite"] is True
    assert collect(["{'loss': 1.2}", "{'eval_loss': inf, 'epoch': 0.5}"]).flat()["metrics.eval_loss_nonfinite"] is True
    assert "metrics.eval_loss_nonfinite" not in collect(["{'loss': 1.2}", "{'eval_loss': 1.3, 'epoch': 0.5}"]).flat()


@pytest.mark.parametrize("text, lr", [
    ("python finetune.py --base_model=x --learning_rate=0.003 --lora_r=128 --micro_batch_size=12", 0.003),
    ("    --learning_rate 2e-4 \\", 2e-4),
    ("accelerate launch train.py --learning-rate 1E-5", 1e-5),
    ("learning_rate: 0.0003", 3e-4),
    ("TrainingArguments(output_dir=out, learning_rate=5e-05, warmup_ratio=0.03)", 5e-5),
    # kohya: the highest of the two networks' rates (and above --learning_rate when that is lower)
    ('accelerate launch train_network.py --unet_lr=1e-4 --text_encoder_lr=5e-3 --learning_rate=1e-4', 5e-3),
    ("text_encoder_lr = 5e-05", 5e-5),
])
def test_config_learning_rate_forms(text, lr):
    f = collect([text]).flat()
    assert f["config.learning_rate"] == pytest.approx(lr)


@pytest.mark.parametrize("text", [
    "{'loss': 1.62, 'learning_rate': 0.003, 'epoch': 0.01}",  # the scheduler's value in a metric record
    '{"loss": 1.62, "learning_rate": 0.003}',
    "wandb:            train/learning_rate 0.0003",
    "--learning_rate 0 \\",
    "lr_scheduler: cosine",
])
def test_config_learning_rate_ignores_metric_records_and_zero(text):
    assert "config.learning_rate" not in collect([text]).flat()
