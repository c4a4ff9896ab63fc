"""Which failure came first across the ranks of a distributed job (loradoctor/logs/timeorder.py): an NCCL
transport failure seen before a rank's CUDA error / OOM / exception is the likelier root; the other order
keeps the catalogue's `consequence_of` (the error is the root). Cases with whole logs: fixtures/cascades/
(nccl-ib-rank1-then-illegal-access-rank0 and its mirror, the stamped rank files, the watchdog ones)."""

from __future__ import annotations

from pathlib import Path

from loradoctor.logs import timeorder
from loradoctor.logs.engine import explain

ROOT = Path(__file__).resolve().parent.parent
CASCADES = ROOT / "fixtures" / "cascades"


def _seen(rank, lineno, text="x", time_s=None, stamp=None, index=0):
    return timeorder.Seen(rank, time_s, stamp, index, lineno, f"f:{lineno}", text)


def test_before_uses_one_clock_then_line_order_within_an_input_and_nothing_across_inputs():
    a = _seen(1, 9, time_s=10.0, stamp="10:00:10", index=0)
    b = _seen(0, 2, time_s=12.0, stamp="10:00:12", index=1)
    assert timeorder.before(a, b) is True and timeorder.before(b, a) is False
    # different stamp formats are not one clock: line order within one input, else unknown
    c = _seen(0, 20, time_s=5.0, stamp="Dec  2 10:00:05", index=0)
    assert timeorder.before(a, c) is True
    assert timeorder.before(_seen(1, 1, index=0), _seen(0, 9, index=1)) is None


def test_a_transport_failure_first_is_the_root_an_echo_line_never_is():
    ib = _seen(1, 4, "NCCL WARN NET/IB : Got completion from peer 10.0.0.2<5> with status=12 opcode=0")
    err = [_seen(0, 12, "RuntimeError: CUDA error: an illegal memory access was encountered")]
    assert "comes before" in timeorder.first_failure("dist.nccl_error", [ib], "cuda.illegal_access", err)
    # the same error before the IB line: the catalogue's order holds
    assert timeorder.first_failure("dist.nccl_error", [_seen(1, 20, ib.text)], "cuda.illegal_access", err) is None
    # NCCL reporting a peer that went away, or a CUDA failure of its own, is an echo wherever it stands
    for echo in ("NCCL WARN socketProgress: Connection closed by remote peer gpu-n1<41234>",
                 "NCCL WARN Cuda failure 'an illegal memory access was encountered'",
                 "ncclRemoteError: remote process exited or there was a network error"):
        assert timeorder.first_failure("dist.nccl_error", [_seen(1, 4, echo)], "cuda.illegal_access", err) is None
    # on the erring rank itself the two are one event told twice (a cut `NCCL error in: ..., unhandled ` then its
    # `Cuda failure 2 'out of memory'`): not ordered
    own = _seen(0, 6, "torch.distributed.DistBackendError: NCCL error in: ../NCCLUtils.hpp:317, unhandled ")
    assert timeorder.first_failure("dist.nccl_error", [own], "cuda.illegal_access", err) is None
    # only a rank's own failure is ordered against NCCL (a wrong driver is not an event in time)
    assert timeorder.first_failure("dist.nccl_error", [ib], "env.driver_too_old", err) is None


def test_a_timeout_comes_first_only_on_the_rank_that_reported_it_before_its_own_error():
    timeouts = [_seen(0, 1, "Watchdog caught collective operation timeout"), _seen(1, 2, "Watchdog caught")]
    own = [_seen(1, 6, "RuntimeError: CUDA error: an illegal memory access was encountered")]
    assert "already waiting" in timeorder.first_failure("dist.nccl_timeout", timeouts, "cuda.illegal_access", own)
    other = [_seen(3, 6, "torch.OutOfMemoryError: CUDA out of memory.")]
    assert timeorder.first_failure("dist.nccl_timeout", timeouts, "oom.capacity", other) is None
    assert "rank 3 reported no timeout" in timeorder.waited_for("dist.nccl_timeout", timeouts, "oom.capacity", other)


def _by_cause(report):
    return {f.cause: f for f in report.findings if f.rule not in ("differential", "guess")}


def test_the_rank_and_the_why_line_say_which_failure_came_first():
    report = explain([str(CASCADES / "nccl-ib-rank1-then-illegal-access-rank0")])
    first = report.findings[0]
    assert first.cause == "dist.nccl_error"
    cuda = _by_cause(report)["cuda.illegal_access"]
    assert cuda.consequence_of == first.rule and cuda.rank > first.rank
    assert "came later" in cuda.why_rank and "rank 1" in cuda.why_rank and "rank 0" in cuda.why_rank
    assert "likelier root" in first.why_rank
    # the verdict's differential says what would tell the two apart
    entry = next(e for e in first.differential if e["cause"] == "cuda.illegal_access")
    assert entry["rank"] == cuda.rank and "which failed first" in entry["tells_apart"]

    mirror = explain([str(CASCADES / "illegal-access-rank0-then-nccl-ib-rank1")])
    assert mirror.findings[0].cause == "cuda.illegal_access"
    assert "comes first in time" in mirror.findings[0].why_rank
    nccl = _by_cause(mirror)["dist.nccl_error"]
    assert nccl.consequence_of == mirror.findings[0].rule
    assert not any(e["cause"] == "dist.nccl_error" and "which failed first" in e["tells_apart"]
                   for e in mirror.findings[0].differential)


def test_timestamps_order_rank_files_that_line_order_cannot():
    assert explain([str(CASCADES / "nccl-ib-rank1-stamped-before-oom-rank0")]).findings[0].cause == "dist.nccl_error"
    assert explain([str(CASCADES / "oom-rank0-stamped-before-nccl-ib-rank1")]).findings[0].cause == "oom.capacity"


def test_an_error_on_the_rank_that_reported_no_timeout_stays_the_root_and_says_why():
    report = explain([str(CASCADES / "merged-journald-oom-flushed-last")])
    assert report.findings[0].cause == "oom.capacity"
    assert "reported no timeout" in report.findings[0].why_rank
