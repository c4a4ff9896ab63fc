"""Hostile input against the fact extractors and the engine's metric-dict splitter (issue 11,
items 2 and 4, log side): no pattern runs away on padded lines, and numbers too large to be real
(sizes that overflow a float, integers past Python's 4,300-digit conversion limit, absurd world
sizes) are dropped as implausible instead of crashing or hanging."""

from __future__ import annotations

import time

import pytest

from loradoctor.logs.facts import (FactCollector, parse_child_failed, parse_exit_code, parse_memory_summary,
                                   parse_oom_killer, parse_oom_message, parse_watchdog_timeout, parse_xid)
from loradoctor.logs.reader import Line

LIMIT_S = 1.0  # each case takes milliseconds once linear; the quadratic forms took 3-17 s
ENGINE_LIMIT_S = 4.0  # a whole explain of ~1 MB (0.15 s on a quiet machine; 116 s before the fix on a busy one)
BIG = "9" * 5000  # past Python's int-conversion limit (4,300 digits)


def line(text, n=1):
    return Line(file="t.log", lineno=n, text=text, rank=None, time_s=None, raw=text, input_index=0)


def timed(fn, *args, limit_s=LIMIT_S):
    started = time.perf_counter()
    result = fn(*args)
    elapsed = time.perf_counter() - started
    assert elapsed < limit_s, f"{fn.__name__} took {elapsed:.2f} s"
    return result


def collect(*texts):
    def run():
        c = FactCollector()
        for i, t in enumerate(texts, 1):
            c.feed(line(t, i))
        return c.finish().flat()
    return timed(run)


# --- patterns that ran away ------------------------------------------------------------------

OOM_HEAD = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "


@pytest.mark.parametrize("padding", ["1" * 7950, "1." * 4000, "1 " * 4000])
def test_oom_line_padded_with_digits_is_linear(padding):
    msg = timed(parse_oom_message, OOM_HEAD + padding)
    assert msg is not None and msg.requested_bytes == 2 << 30
    f = collect(OOM_HEAD + padding)
    assert f["oom.count"] == 1


def test_oom_fraction_figures_padded_are_linear():
    text = ("Allocation on device 0 would exceed allowed memory. (out of memory) Currently allocated : "
            + "7" * 7950)
    assert timed(parse_oom_message, text).era == "fraction"


@pytest.mark.parametrize("text", ["exit code" + "\t" * 100_000 + "x", "exit status" + " " * 50_000 + ":" + "\t" * 50_000,
                                  "returned non-zero exit status" + "\t" * 100_000])
def test_exit_status_padded_with_whitespace_is_linear(text):
    assert timed(parse_exit_code, text) is None
    collect(text)


def test_metric_dict_splitter_is_linear(tmp_path):
    from loradoctor.logs.engine import explain

    path = tmp_path / "train.log"
    path.write_text("{'loss': 1, " * 80_000 + "\n{'loss': 0.5, 'grad_norm': 1.0, 'learning_rate': 1e-05, 'epoch': 1.0}\n")
    report = timed(lambda: explain([str(path)], rules=[]), limit_s=ENGINE_LIMIT_S)
    assert report.facts["metrics.steps"] == 1 and report.facts["metrics.first_loss"] == 0.5


def test_metric_dicts_with_far_closing_brace_are_linear(tmp_path):
    from loradoctor.logs.engine import explain

    path = tmp_path / "train.log"
    path.write_text(("{'loss': 1, " * 400 + "x" * 4200 + "}\n") * 100)
    timed(lambda: explain([str(path)], rules=[]), limit_s=ENGINE_LIMIT_S)


# --- numbers too large to be real ------------------------------------------------------------

@pytest.mark.parametrize("size", ["9" * 400 + ".00 GiB", BIG + " bytes", "1" * 330 + " MiB"])
def test_overflowing_sizes_are_dropped(size):
    msg = timed(parse_oom_message, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate " + size
                + ". GPU 0 has a total capacity of 79.25 GiB of which " + size + " is free.")
    assert msg is not None and msg.requested_bytes is None and msg.free_bytes is None
    assert msg.total_bytes == int(79.25 * (1 << 30))
    summary = parse_memory_summary([f"| Allocated memory      | {size} | {size} | 1 GiB | 1 GiB |",
                                    "| GPU reserved memory   |   2.00 GiB |   3.00 GiB |"])
    assert summary is not None and summary.allocated_bytes is None and summary.reserved_bytes == 2 << 30


@pytest.mark.parametrize("text", [
    f"[Rank {BIG}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, "
    f"Timeout(ms)={BIG}) ran for {BIG} milliseconds before timing out.",
    f"NCCL communicator was aborted on rank {BIG}.",
    f"NVRM: Xid (PCI:0000:05:00): {BIG}, pid={BIG}, name=python, GPU has fallen off the bus.",
    f"XidCriticalError: Xid={BIG}",
    f"| CUDA OOMs: {BIG} | cudaMalloc retries: {BIG} |",
    f"Out of memory: Killed process {BIG} (python) total-vm:1kB, anon-rss:{BIG}kB",
    f"nranks {BIG}", f"WORLD_SIZE={BIG}", f"torchrun --nproc_per_node={BIG} --nnodes={BIG} train.py",
    f"exit code: {BIG}", f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU {BIG} has a "
    "total capacity of 79.25 GiB of which 1.06 GiB is free. Process " + BIG + " has 3.00 GiB memory in use.",
    f"Allocation on device {BIG} would exceed allowed memory. (out of memory)",
    f"trainable params: {BIG} || all params: {BIG} || trainable%: 0.1",
    f"{BIG}|{BIG}|Loss: 1.5:  3%|#         | 1/30 [00:01<00:30,  1.00it/s]",
])
def test_huge_integers_do_not_crash(text):
    collect(text)


def test_huge_integers_are_dropped_as_implausible():
    t = timed(parse_watchdog_timeout, f"[Rank {BIG}] Watchdog caught collective operation timeout: "
                                      f"WorkNCCL(OpType=ALLREDUCE, Timeout(ms)={BIG}) ran for 600036 milliseconds")
    assert t is not None and t.rank is None and t.timeout_ms is None and t.ran_ms == 600036
    entry = timed(parse_child_failed, ["Root Cause (first observed failure):", f"  rank      : {BIG} (local_rank: {BIG})",
                                       f"  exitcode  : {BIG} (pid: {BIG})", "  traceback : Signal 9 (SIGKILL)"])
    assert entry is None or (entry.rank is None and entry.exit_code is None)
    assert timed(parse_xid, f"NVRM: Xid (PCI:0000:05:00): {BIG}, pid=12, name=python") is None
    kill = timed(parse_oom_killer, f"Out of memory: Killed process 12 (python) total-vm:1kB, anon-rss:{BIG}kB")
    assert kill is not None and kill.pid == 12 and kill.anon_rss_bytes is None


def test_absurd_world_size_is_dropped_not_enumerated():
    # silent_ranks lists the ranks that did not time out: a world of 10^11 ranks must not be built
    f = collect("NCCL INFO comm 0x1 rank 0 nranks 99999999999 cudaDev 0 busId 1000 - Init COMPLETE",
                "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, "
                "Timeout(ms)=600000) ran for 600036 milliseconds before timing out.")
    assert "dist.world_size" not in f and "dist.silent_ranks" not in f and f["dist.timeout_ranks"] == [0]
