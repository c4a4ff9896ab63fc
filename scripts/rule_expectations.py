#!/usr/bin/env python3
"""Write (bless) or check the expectations of the rule fixtures: fixtures/logs/<rule-id>/expect.yaml.

For every positive fixture the file names the line(s) the rule must quote and, where a sibling rule
is meant to rank first, that sibling (docs/rules.md "Fixtures"):

    pos-trainer-oom.log:
      quotes:
        - {line: 41, text: 'torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB'}
    pos-two-ranks/:                     # a folder fixture: each quote names its file
      quotes:
        - {file: rank1.log, line: 12, text: '...'}
      first: hw-xid-memory              # a sibling meant to rank first (say why in a comment)

usage:
  python scripts/rule_expectations.py --bless [RULE-ID ...]   # write from the engine's current output
  python scripts/rule_expectations.py [RULE-ID ...]           # report fixtures that disagree (exit 1)

Blessing writes what the engine says today, except that a recorded quote the rule still makes is kept as
it is (a bless that adds a fixture does not move a reviewed quote to another line the rule also quotes):
review the diff (`git diff fixtures/logs`) before committing. Existing `first:` reasons (comments) are not
kept by --bless; re-add them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from loradoctor.logs.engine import explain  # noqa: E402
from loradoctor.logs.rules import load_rules  # noqa: E402
import rule_expect as ex  # noqa: E402  (tests/rule_expect.py: the one reading of the expectations)

FIXTURES = ROOT / "fixtures" / "logs"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rules", nargs="*", help="rule ids (default: every rule with a fixture folder)")
    ap.add_argument("--bless", action="store_true", help="write expect.yaml from the current output")
    args = ap.parse_args(argv)
    rules = {r.id: r for r in load_rules()}
    ids = args.rules or sorted(p.name for p in FIXTURES.iterdir() if p.is_dir() and p.name in rules)
    bad = 0
    for rid in ids:
        folder = FIXTURES / rid
        if rid not in rules or not folder.is_dir():
            print(f"{rid}: no such rule or fixture folder", file=sys.stderr)
            return 2
        current = ex.read(folder)
        fresh: dict = {}
        for fixture in ex.positive_fixtures(folder):
            report = explain([str(fixture)])
            key = ex.key_of(fixture)
            if args.bless:
                fresh[key] = ex.observed(report, rid, fixture, keep=current.get(key))
                continue
            problems = ex.check_fires(report, rules[rid], fixture, current.get(key))
            problems += ex.check_first(report, rules[rid], fixture, current.get(key))
            for p in problems:
                bad += 1
                print(f"{folder.relative_to(ROOT)}/{key}: {p}")
        if args.bless:
            ex.write(folder, rid, fresh)
            print(f"wrote {(folder / ex.EXPECT_FILE).relative_to(ROOT)} ({len(fresh)} fixtures)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
