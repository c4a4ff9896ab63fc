"""The log engine behind `loradoctor explain` (docs/rules.md and docs/facts.md are its contract).

- `reader`: inputs (files, folders, stdin, .gz/.bz2/.xz by magic bytes, UTF-16), blocks cut at
  newlines, and line normalisation (`Line`: ANSI, `\\r` redraws, rank prefixes, timestamps, rich boxes).
- `scan`: the block prefilter that finds the few lines any rule or extractor cares about.
- `facts/`: one extractor per family (oom, memsum, metrics, trace, dist, xid, host), each with its
  trigger literals beside its parser, and the streaming `FactCollector` that composes them.
- `rules/`: the rule model, the safe condition language, templates, literal derivation, loading
  (with the cache) and lint, one module each.
- `engine`: `explain(paths, extra_rule_dirs=(), env=None, progress=None) -> ExplainReport`.
"""
