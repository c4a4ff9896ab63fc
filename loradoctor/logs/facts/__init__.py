"""Extract numbers from log lines: the facts of docs/facts.md.

One module per extractor family, each a pure parser of text (unit-tested on its own) plus an
`Extractor` that declares its trigger literals next to the code that reads them:

- `oom`: the out-of-memory message (`parse_oom_message`), wrapped lines joined, phase and step.
- `memsum`: `torch.cuda.memory_summary()` tables (`parse_memory_summary`).
- `metrics` (line parsers) and `aggregate` (the MetricsExtractor): Trainer records, tables, wandb
  summaries, overflows, PEFT counts; their streaming aggregates (`LossAggregate`).
- `frames`: one parser for every traceback dialect (`parse_frames` -> `Frame`s) and the phase a frame
  list names (`location_from_frames`, tables in loradoctor/data/frames.yaml).
- `trace`: tracebacks, their exception and phase, bitsandbytes 4-bit frames.
- `dist`: torchrun's ChildFailedError, NCCL timeouts and errors, world size.
- `xid`: kernel Xid lines.  `host`: the OOM killer, `Killed`, exit 137, Code 43.
- `tables`: metric keys and other small tables as plain data.
- `collector`: `FactCollector` feeds every line to every extractor in one streaming pass, keeps
  the first event of each group (the root) plus counts, and returns the `Facts`.

`TRIGGER_LITERALS` (every extractor's words) go into the engine's prefilter, so that only such
lines (and the rules' lines) are decoded at all.
"""

from loradoctor.logs.facts.collector import TRIGGER_LITERALS, FactCollector, is_errorish
from loradoctor.logs.facts.common import MAX_GROUP_EVIDENCE, Extractor, Facts
from loradoctor.logs.facts.dist import (ChildFailed, WatchdogTimeout, parse_child_failed, parse_watchdog_timeout,
                                        silent_ranks)
from loradoctor.logs.facts.host import OomKill, is_bare_killed, parse_exit_code, parse_oom_killer
from loradoctor.logs.facts.memsum import MemorySummary, parse_memory_summary
from loradoctor.logs.facts.metrics import (METRIC_DICT_RE, PY_METRIC_DICT_RE, TABLE_HEAD, _metric_bytes,
                                           parse_bar_postfix, parse_metric_record, parse_table_row,
                                           parse_wandb_value, table_columns)
from loradoctor.logs.facts.oom import HELD_BACK_OOM_FORMS, OomMessage, RawPosition, parse_oom_message
from loradoctor.logs.facts.frames import Frame, location_from_frames, parse_frames
from loradoctor.logs.facts.xid import XidEvent, parse_xid

__all__ = [
    "TRIGGER_LITERALS", "FactCollector", "is_errorish", "MAX_GROUP_EVIDENCE", "Extractor", "Facts",
    "ChildFailed", "WatchdogTimeout", "parse_child_failed", "parse_watchdog_timeout", "silent_ranks",
    "OomKill", "is_bare_killed", "parse_exit_code", "parse_oom_killer", "MemorySummary", "parse_memory_summary",
    "METRIC_DICT_RE", "PY_METRIC_DICT_RE", "TABLE_HEAD", "_metric_bytes", "parse_bar_postfix",
    "parse_metric_record", "parse_table_row", "parse_wandb_value", "table_columns", "HELD_BACK_OOM_FORMS",
    "OomMessage", "RawPosition", "parse_oom_message", "Frame", "location_from_frames", "parse_frames", "XidEvent", "parse_xid",
]
