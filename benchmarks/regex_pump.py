#!/usr/bin/env python3
"""Time every built-in rule regex (patterns, require_all, exclude) against adversarial pump strings
(loradoctor/logs/rules/redos.py) and print the slowest per 1,000 characters.

    python benchmarks/regex_pump.py [--top 20] [--length 2000] [--rules DIR]

A linear pattern costs microseconds per 1,000 characters; a pattern with overlapping or nested
quantifiers costs milliseconds to seconds and grows with the length. A search that exceeds the
timeout (0.25 s) is shown as `>=` the timeout.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loradoctor.logs.rules import load_rules  # noqa: E402
from loradoctor.logs.rules.model import _compile_regex  # noqa: E402
from loradoctor.logs.rules.redos import PUMP_CHARS, PUMP_TIMEOUT_S, worst_time_s  # noqa: E402


def every_pattern(rules) -> list[tuple[str, str, str]]:
    """(rule id, field[index], pattern) for every regex of every rule."""
    out = []
    for rule in rules:
        for fname in ("patterns", "require_all", "exclude"):
            for i, p in enumerate(getattr(rule, fname)):
                out.append((rule.id, f"{fname}[{i}]", p))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--length", type=int, default=PUMP_CHARS, help="pump string length (characters)")
    ap.add_argument("--rules", default=None, help="a user rules folder instead of the built-in library")
    args = ap.parse_args(argv)
    rules = load_rules([args.rules], include_builtin=False) if args.rules else load_rules()
    started = time.perf_counter()
    rows = []
    for rid, where, pattern in every_pattern(rules):
        per_1000, pump = worst_time_s(_compile_regex(pattern), pattern, args.length)
        rows.append((per_1000, rid, where, pattern, pump))
    rows.sort(reverse=True)
    print(f"{len(rows)} regexes, pump strings of {args.length} characters, "
          f"{time.perf_counter() - started:.1f} s in all")
    print(f"{'ms/1000 chars':>14}  rule / field: pattern (pump)")
    for per_1000, rid, where, pattern, pump in rows[: args.top]:
        capped = ">=" if per_1000 >= PUMP_TIMEOUT_S * 1000 / max(1, len(pump)) - 1e-9 else "  "
        print(f"{capped}{per_1000 * 1000:12.3f}  {rid} {where}: {pattern[:90]!r} (pump {pump[:30]!r}...)")
    worst = rows[0] if rows else (0.0, "-", "-", "", "")
    print(f"worst: {worst[0] * 1000:.3f} ms per 1,000 characters ({worst[1]} {worst[2]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
