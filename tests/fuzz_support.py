"""Shared pieces of the fuzz suite (tests/test_fuzz_*.py): a bounded hypothesis profile for CI, and
strategies that build hostile log text out of real log fragments."""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from typing import Iterator

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

# CI: few examples, derandomized (the same inputs every run), no example database written anywhere;
# LORADOCTOR_FUZZ_EXAMPLES=500 for a longer local run (benchmarks/fuzz_campaign.py goes further).
EXAMPLES = int(os.environ.get("LORADOCTOR_FUZZ_EXAMPLES", "20"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=EXAMPLES <= 50,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])
SLOW_S = 10.0  # issue 11: no input under 1 MB may take longer than this

FRAGMENTS = [
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.64 GiB "
    "of which 1.19 GiB is free. Of the allocated memory 20.1 GiB is allocated by PyTorch, and 1.2 GiB is reserved "
    "by PyTorch but unallocated.",
    "RuntimeError: CUDA error: an illegal memory access was encountered",
    "[rank3]:[E ProcessGroupNCCL.cpp:616] [Rank 3] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=1234, OpType=ALLREDUCE, NumelIn=1, Timeout(ms)=600000) ran for 600123 milliseconds",
    "{'loss': 0.4213, 'grad_norm': nan, 'learning_rate': 0.0002, 'epoch': 0.12}",
    "  File \"/home/u/venv/lib/python3.11/site-packages/transformers/trainer.py\", line 1938, in train",
    "Traceback (most recent call last):",
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: exitcode: -9",
    "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.",
    "ValueError: Attempting to unscale FP16 gradients.",
    "  0%|          | 0/1000 [00:00<?, ?it/s]\r 50%|█████     | 500/1000 [01:00<01:00,  8.33it/s]",
    "\x1b[31mERROR\x1b[0m something failed",
    "ImportError: libcudnn.so.9: cannot open shared object file: No such file or directory",
    "bitsandbytes/cextension.py: The installed version of bitsandbytes was compiled without GPU support.",
    "Killed",
    "exit status: 137",
    "[rank3]: RuntimeError: CUDA error: out of memory",
    "[default7]:[rank7]: torch.distributed.DistBackendError: NCCL error",
    # pastes by users writing in other languages (round 11): CJK prose, full-width punctuation, localized OS
    # strings; a block of them makes non-ASCII bytes the rarest ones the prefilter can plan on
    "训练到一半显存不足，报错如下：请问怎么解决？我的环境是 4090 显卡，batch size 已经调到 1 了。",
    "RuntimeError：CUDA out of memory。（已经尝试过 gradient_checkpointing）",
    "OSError: [WinError 1455] 页面文件太小，无法完成操作。",
    "./train.sh: 第 5 行： 12989 已杀死 python train.py",
    "학습 중에 메모리 부족 오류가 발생합니다. 모델 로딩 중에 멈춥니다.",
    "µs µs ÄÖÜ ßẞ ﬁ İı",
]
HOSTILE = ["9" * 5000, "1e999", "-1", "nan", "inf", "\x00", "\ufffd", "\u202e", "\t" * 300, " " * 3000,
           "{'loss': 1, " * 50, "\\", "%", "&lt;module&gt;", "\r", "\x1b[", "😀" * 10, "0x" + "f" * 40,
           "显存不足" * 400, "\u00b5" * 500]


def _mutate(fragment: str, token: str, where: int) -> str:
    cut = where % (len(fragment) + 1)
    return fragment[:cut] + token + fragment[cut:]


log_lines = st.one_of(
    st.sampled_from(FRAGMENTS),
    st.builds(_mutate, st.sampled_from(FRAGMENTS), st.sampled_from(HOSTILE), st.integers(0, 400)),
    st.builds(_mutate, st.sampled_from(FRAGMENTS), st.text(max_size=40), st.integers(0, 400)),
    st.text(max_size=200),
)
log_text = st.lists(log_lines, max_size=30).map("\n".join)


@contextmanager
def bounded(limit_s: float = SLOW_S) -> Iterator[None]:
    """Fails the example when the block takes longer than `limit_s`."""
    started = time.perf_counter()
    yield
    elapsed = time.perf_counter() - started
    assert elapsed < limit_s, f"took {elapsed:.1f} s"
