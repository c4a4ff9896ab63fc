"""The log engine behind `loradoctor explain` (docs/rules.md and docs/facts.md are its contract).

- `reader`: inputs (files, folders, stdin, .gz/.bz2/.xz by magic bytes, UTF-16), blocks cut at
  newlines, and line normalisation (`Line`: ANSI, `\\r` redraws, rank prefixes, timestamps, rich boxes).
- `scan`: the block prefilter that finds the few lines any rule or extractor cares about.
- `facts`: the extractors (`parse_oom_message`, `parse_memory_summary`, `parse_metric_record`,
  `parse_xid`, `parse_child_failed`, ...) and the streaming `FactCollector`.
- `rules`: loading, validating (`rules/schema.json`) and compiling rules; the safe `Condition`
  evaluator and the summary templates.
- `engine`: `explain(paths, extra_rule_dirs=(), env=None, progress=None) -> ExplainReport`.
"""
