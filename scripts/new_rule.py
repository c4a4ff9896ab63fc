#!/usr/bin/env python3
"""Scaffold a new log rule: a YAML stub (with its docs) appended to the family file of its cause,
a fixture folder with two positive stubs, one negative stub and an expect.yaml (docs/rules.md).

    python scripts/new_rule.py oom-my-case --cause oom.capacity [--pattern 'REGEX'] [--file rules/oom.yaml]

Then: paste real logs into the stubs (whole tracebacks with their noise), write the pattern, run
`loradoctor rules lint`, bless the expectations (`python scripts/rule_expectations.py --bless ID`),
review them, and run `python -m pytest tests/test_rule_fixtures.py -k ID`. Until the stubs hold real
logs the fixture tests of the new rule fail, on purpose.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

STUB = """\

  - id: {id}
    cause: {cause}
    title: TODO one line a person in trouble understands
    severity: error
    confidence: medium
    patterns:
      - '{pattern}'
    summary: >-
      TODO what went wrong and why, in the log's own numbers (facts in braces, see docs/facts.md; optional parts in double brackets).
    fixes:
      - text: TODO the first thing to try
        command: TODO a command to paste
    falsepositives: >-
      TODO when this rule fires on a healthy run or on another cause.
    docs: |
      TODO what it means, why it happens, an example, and how to fix it (`loradoctor rules show {id}`).
"""

POS = ("TODO: replace this file with a real log (whole traceback and the noise around it) where\n"
       "rule {id} must fire. Expected line below:\n{sample}\n")
NEG = ("TODO: replace this file with a near miss: a real log that looks like {id}'s case but is not\n"
       "(its first finding must not be {cause}).\n")
EXPECT = """\
# What fixtures/logs/{id}/pos-* must produce (docs/rules.md "Fixtures"). Bless from the engine once the
# stubs hold real logs: python scripts/rule_expectations.py --bless {id}, then review the diff.
pos-1-TODO.log:
  quotes: []
pos-2-TODO.log:
  quotes: []
"""


def family_file(root: Path, cause: str) -> Path:
    """The rules file holding most rules of `cause`, else the one named after its prefix."""
    counts = {}
    for path in sorted((root / "rules").glob("*.yaml")):
        counts[path] = len(re.findall(rf"^\s+cause: {re.escape(cause)}\s*$", path.read_text(encoding="utf-8"), re.M))
    best = max(counts, key=lambda p: counts[p], default=None)
    if best is not None and counts[best]:
        return best
    return root / "rules" / f"{cause.split('.', 1)[0]}.yaml"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("id", help="the new rule id (kebab-case, never reused)")
    ap.add_argument("--cause", required=True, help="a cause id of loradoctor/data/causes.yaml (loradoctor docs causes)")
    ap.add_argument("--pattern", default=None, help="the regex of the message (default: a TODO literal)")
    ap.add_argument("--file", default=None, help="the rules file to append to (default: the family of the cause)")
    ap.add_argument("--root", default=str(ROOT), help=argparse.SUPPRESS)  # tests scaffold into a copy
    args = ap.parse_args(argv)
    root = Path(args.root)
    if not re.fullmatch(r"[a-z0-9]+(?:-[a-z0-9]+)*", args.id):
        print(f"new_rule: {args.id!r} is not a kebab-case id", file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT))
    from loradoctor import catalogue

    if args.cause not in catalogue.cause_ids():
        print(f"new_rule: unknown cause {args.cause!r} (add it to loradoctor/data/causes.yaml first)", file=sys.stderr)
        return 2
    taken = [p for p in (root / "rules").glob("*.yaml")
             if re.search(rf"^\s+- id: {re.escape(args.id)}\s*$", p.read_text(encoding="utf-8"), re.M)]
    folder = root / "fixtures" / "logs" / args.id
    if taken or folder.exists():
        print(f"new_rule: {args.id} exists already ({taken[0] if taken else folder})", file=sys.stderr)
        return 2
    target = Path(args.file) if args.file else family_file(root, args.cause)
    pattern = args.pattern or f"TODO message of {args.id}"
    text = target.read_text(encoding="utf-8") if target.exists() else "# yaml-language-server: $schema=./schema.json\nrules:\n"
    if not text.endswith("\n"):
        text += "\n"
    target.write_text(text + STUB.format(id=args.id, cause=args.cause, pattern=pattern.replace("'", "''")),
                      encoding="utf-8")
    folder.mkdir(parents=True)
    for name in ("pos-1-TODO.log", "pos-2-TODO.log"):
        (folder / name).write_text(POS.format(id=args.id, sample=pattern), encoding="utf-8")
    (folder / "neg-near-miss-TODO.log").write_text(NEG.format(id=args.id, cause=args.cause), encoding="utf-8")
    (folder / "expect.yaml").write_text(EXPECT.format(id=args.id), encoding="utf-8")
    print(f"appended {args.id} to {target}\nwrote {folder}/ (pos-1-TODO.log, pos-2-TODO.log, "
          f"neg-near-miss-TODO.log, expect.yaml)\nnext: real logs in the stubs, the pattern, "
          f"`loradoctor rules lint`, `python scripts/rule_expectations.py --bless {args.id}`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
