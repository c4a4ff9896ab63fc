"""The extractors' declared TRIGGERS are their only dispatch (issue 9 item 2): the collector hands a
line to an extractor only when the line holds one of its triggers or while the extractor has a record
open, and the trigger lists are complete for the regexes that recognise a record on a line of its own
(every fixture line such a regex matches holds one of its extractor's triggers)."""

from __future__ import annotations

import glob
import os
import re

import pytest

from loradoctor.env import snapshot
from loradoctor.logs.facts import aggregate, config, dist, frames, host, memsum, metrics, oom, prose, smi, trace, xid
from loradoctor.logs.facts.collector import Dispatch, FactCollector
from loradoctor.logs import reader
from loradoctor.logs.reader import make_line

# per extractor: the regexes that recognise a record from one line, with nothing open yet (the
# others read the rest of a line one of these matched, or the lines of an open record)
ENTRY = {
    oom.OomExtractor: [oom._OOM_HEAD_RE, oom._OOM_BARE_RE, oom._OOM_MPS_RE, oom._OOM_FRACTION_RE],
    xid.XidExtractor: [xid._XID_RE, xid._XID_MONITOR_RE, xid._BUS_RE, xid._BUS_TAIL_RE],
    host.HostExtractor: [host._OOM_KILL_RE, host._BARE_KILLED_RE, host._EXIT_CODE_RE, host._CODE43_RE],
    dist.DistExtractor: [dist._WATCHDOG_RE, dist._NCCL_ERROR_RE, dist._NRANKS_RE, dist._WORLD_SIZE_RE, dist._NPROC_RE,
                         dist._NNODES_RE],
    memsum.MemsumExtractor: [memsum._MEMSUM_COUNTERS_RE],
    trace.TraceExtractor: [frames._CPYTHON_RE, frames._IPYTHON_RE, frames._OLD_IPYTHON_RE, frames._RICH_RE,
                           frames._CELL_RE, frames._RICH_HEAD_RE],
    config.ConfigExtractor: [config._FOUR_BIT_RE, config._CHECKPOINTING_RE, config._MICRO_BATCH_RE, config._LEARNING_RATE_RE],
    aggregate.MetricsExtractor: [metrics._PEFT_RE, metrics._APEX_OVERFLOW_RE, metrics._DS_OVERFLOW_RE,
                                 metrics._OLD_OVERFLOW_RE],
    # the header opens a table; the engine then hands it every line (EVERY_LINE_WHILE_OPEN), so a GPU row
    # needs no trigger of its own (a driver before 470 names the GPU without `NVIDIA`)
    smi.SmiExtractor: [smi._HEADER_RE, snapshot._SMI_USE_ROW, snapshot._SMI_PROC],
    # a CJK line naming one of the symptom words of loradoctor/data/prose_words.yaml (Latin ones case-blind)
    prose.ProseExtractor: [re.compile(f"(?=.*{prose._CJK_RE.pattern})(?i:.*(?:"
                                      + "|".join(map(re.escape, prose.prose_table().anchors + prose.prose_table().weak))
                                      + "))")],
}

# lines that each entry regex must be complete for, beyond the fixtures (forms a fixture may lack)
EXTRA_LINES = [
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: exit_code: -9",
    "Process exited with code 137",
    "worker failed (exitcode: -9) local_rank: 0",
    "torchrun --nnodes=2 --nproc_per_node=8 train.py",
    "Out of memory: Killed process 4242 (python) total-vm:1kB, anon-rss:2048kB",
    "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.",
]


def _corpus_lines() -> list[str]:
    lines: list[str] = list(EXTRA_LINES)
    for path in sorted(glob.glob("fixtures/**/*", recursive=True)):
        if not os.path.isfile(path) or path.endswith((".gz", ".bz2", ".xz", ".zst", ".zip", ".json", ".yaml", ".yml")):
            continue
        with open(path, "rb") as fh:
            data = fh.read()
        if reader.is_lowered(data[:1 << 20]):
            # a paste lower-cased as a whole reaches the extractors with the vocabulary's case given back
            data = _recaser().recase(data)
        lines.extend(data.decode("utf-8", "replace").replace("\r", "\n").split("\n"))
    return lines


def _recaser() -> "reader.Recaser":
    from loradoctor.logs.engine import recaser_for
    from loradoctor.logs.rules import load_rules

    return recaser_for(load_rules())


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    lines = _corpus_lines()
    assert len(lines) > 10_000, "the fixture logs were not found (run from the repository root)"
    return lines


@pytest.mark.parametrize("extractor", list(ENTRY), ids=lambda e: e.__name__)
def test_triggers_are_complete_for_the_entry_regexes(extractor, corpus):
    dispatch = Dispatch([extractor.TRIGGERS])
    missed = [line[:120] for line in corpus
              if any(r.search(line) for r in ENTRY[extractor]) and not dispatch.mask(line)]
    assert not missed, f"{extractor.__name__}: lines its regexes read hold none of its TRIGGERS: {missed[:5]}"


def test_every_extractor_is_checked():
    collector = FactCollector()
    assert {type(e) for e in collector.extractors} == set(ENTRY)


def test_the_engine_path_dispatches_on_the_class_triggers():
    """The engine's collector (block_metrics) dispatches on exactly the TRIGGERS its prefilter decodes."""
    collector = FactCollector(block_metrics=True)
    assert all(e.triggers == type(e).TRIGGERS for e in collector.extractors)


def test_feed_is_called_only_for_trigger_lines_or_open_records(corpus):
    """Every extractor's feed, spied on over the whole fixture corpus: each call is for a line that
    holds one of that extractor's triggers, or comes while it had a record open; and every line that
    holds a trigger is fed (the dispatch comes from the declarations, nothing else)."""
    collector = FactCollector()
    calls: list[tuple[type, bool, str]] = []

    def spy(extractor):
        feed = extractor.feed

        def wrapped(line):
            calls.append((type(extractor), extractor.open, line.text))
            return feed(line)

        extractor.feed = wrapped

    for extractor in collector.extractors:
        spy(extractor)
    fed: list[tuple[str, dict]] = []
    for n, text in enumerate(corpus[:60_000], 1):
        line = make_line(text.encode("utf-8", "replace"), "corpus.log", n)
        before = len(calls)
        opened = {type(e): e.open for e in collector.extractors}
        collector.feed(line)
        fed.append((line.text, opened, {c[0] for c in calls[before:]}))
    alone = {type(e): Dispatch([e.triggers]) for e in collector.extractors}
    for kind, was_open, text in calls:
        assert was_open or alone[kind].mask(text), f"{kind.__name__}.feed got a line without its triggers: {text[:100]!r}"
    for text, opened, got in fed:
        if not text:
            continue
        for kind, dispatch in alone.items():
            if dispatch.mask(text) or opened[kind]:
                assert kind in got, f"{kind.__name__} was not fed {text[:100]!r}"


OLD_DRIVER_TABLE = """\
+-----------------------------------------------------------------------------+
| NVIDIA-SMI 450.80.02    Driver Version: 450.80.02    CUDA Version: 11.0     |
|-------------------------------+----------------------+----------------------+
| GPU  Name        Persistence-M| Bus-Id        Disp.A | Volatile Uncorr. ECC |
| Fan  Temp  Perf  Pwr:Usage/Cap|         Memory-Usage | GPU-Util  Compute M. |
|===============================+======================+======================|
|   0  A100-SXM4-40GB      On   | 00000000:07:00.0 Off |                    0 |
| N/A   32C    P0    60W / 400W |  30210MiB / 40537MiB |      0%      Default |
+-------------------------------+----------------------+----------------------+
|   1  A100-SXM4-40GB      On   | 00000000:0F:00.0 Off |                    0 |
| N/A   30C    P0    58W / 400W |      3MiB / 40537MiB |      0%      Default |
+-------------------------------+----------------------+----------------------+

+-----------------------------------------------------------------------------+
| Processes:                                                                  |
|  GPU   GI   CI        PID   Type   Process name                  GPU Memory |
|=============================================================================|
|  No running processes found                                                 |
+-----------------------------------------------------------------------------+
$ python train.py
"""


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_an_open_table_is_handed_every_line(tmp_path, newline):
    """A GPU row holds no trigger (an old driver's `A100-SXM4-40GB`, no `NVIDIA`): the open table still reads
    it, so the GPU is known and its 30 GB that no listed process holds are found; the first line after the
    table that is no row ends it."""
    from loradoctor.logs.engine import explain

    path = tmp_path / "smi.log"
    path.write_bytes(OLD_DRIVER_TABLE.replace("\n", newline).encode())
    report = explain([str(path)])
    facts = report.facts
    assert facts["smi.gpu_index"] == 0 and facts["smi.unlisted_bytes"] > 29 << 30, facts
    assert facts["smi.process_count"] == 0
