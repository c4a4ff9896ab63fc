"""How often one cause takes two of the first three findings (docs/explain.md "Ranking").

    python benchmarks/top3_causes.py [--save OUT.json] [--against BEFORE.json] [-v]

Explains every fixture log (fixtures/logs/*/pos-* and neg-*, fixtures/goodlogs/*.log, fixtures/cascades/*) in this process
and counts the outputs whose top three repeat a cause, and among them those where a further diagnosis
(error or warning) of another cause is listed lower: the ones an order that puts a new cause before a
repeat would still change. `--save` writes the ordered (cause, rule) list per input; `--against` a file
saved before a change: how many first causes and how many top-3 cause sets changed. -v lists the inputs.
"""

from __future__ import annotations

import glob
import json
import os
import sys


def inputs() -> list[str]:
    paths = sorted(glob.glob("fixtures/logs/*/pos-*") + glob.glob("fixtures/logs/*/neg-*"))  # files and folders
    paths += sorted(glob.glob("fixtures/goodlogs/*.log"))
    paths += sorted(p for p in glob.glob("fixtures/cascades/*") if os.path.isdir(p))
    return paths


def run() -> dict[str, list[list[str]]]:
    os.environ.setdefault("LORADOCTOR_NO_CACHE", "1")
    from loradoctor.errors import UserError
    from loradoctor.logs.engine import explain

    out = {}
    for path in inputs():
        try:
            findings = explain([path]).findings
        except UserError:
            continue  # a fixture that is not a log (bad input is exit 2, not a ranking)
        out[path] = [[f.cause, f.rule, f.severity] for f in findings]
    return out


def repeated(rows: list[list[str]]) -> bool:
    causes = [r[0] for r in rows[:3]]
    return len(set(causes)) < len(causes)


def still_open(rows: list[list[str]]) -> bool:
    """A repeat in the top three while a diagnosis of a cause not in the top three is listed lower."""
    top = {r[0] for r in rows[:3]}
    return repeated(rows) and any(r[0] not in top and r[2] in ("error", "warning") for r in rows[3:])


def main(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    result = run()
    rep = [k for k, rows in result.items() if repeated(rows)]
    fixable = [k for k in rep if still_open(result[k])]
    print(f"{len(result)} outputs; a cause repeated in the top 3: {len(rep)}; "
          f"of those with another cause's diagnosis listed lower: {len(fixable)}")
    if "-v" in argv:
        for k in rep:
            print(("OPEN " if k in fixable else "     ") + k + ": " + ", ".join(r[0] for r in result[k][:3]))
    if "--save" in argv:
        with open(argv[argv.index("--save") + 1], "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=0, sort_keys=True)
    if "--against" in argv:
        with open(argv[argv.index("--against") + 1], encoding="utf-8") as fh:
            before = json.load(fh)
        common = sorted(set(before) & set(result))
        first = [k for k in common if [r[0] for r in before[k][:1]] != [r[0] for r in result[k][:1]]]
        sets = [k for k in common if {r[0] for r in before[k][:3]} != {r[0] for r in result[k][:3]}]
        order = [k for k in common if before[k] != result[k]]
        print(f"against {len(common)} saved outputs: first cause changed {len(first)}, "
              f"top-3 cause set changed {len(sets)}, order changed {len(order)}; "
              f"repeated before {sum(repeated(before[k]) for k in common)}, after {sum(repeated(result[k]) for k in common)}")
        for k in first + sets:
            print(("FIRST " if k in first else "TOP3  ") + k + ": " + ", ".join(r[0] for r in before[k][:3]) +
                  " -> " + ", ".join(r[0] for r in result[k][:3]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
