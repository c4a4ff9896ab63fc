"""Score a real-paste QA round: first cause and top-3 against the folder's expect.yaml.

    python benchmarks/real_paste_round.py fixtures/pastes/round-env-dist-hw [--json]

expect.yaml maps each case file to a cause id, or to a mapping with `cause:` (and `source:` / `shape:`).
Prints one line per miss (what came first, the top 3, or 'silent' when nothing was found) and the totals.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

from loradoctor.logs import engine


def score(folder: Path) -> dict:
    expect = yaml.safe_load((folder / "expect.yaml").read_text(encoding="utf-8"))
    rows = []
    for name, want in sorted(expect.items()):
        cause = want["cause"] if isinstance(want, dict) else want
        try:
            report = engine.explain([str(folder / name)])
            got = [f.cause for f in report.findings]
            crash = None
        except Exception as exc:  # a crash is a result of the round, not of this script
            got, crash = [], f"{type(exc).__name__}: {exc}"
        rows.append({"case": name, "want": cause, "got": got[:3], "first": bool(got) and got[0] == cause,
                     "top3": cause in got[:3], "silent": not got, "crash": crash})
    n = len(rows)
    return {"cases": n, "first": sum(r["first"] for r in rows), "top3": sum(r["top3"] for r in rows),
            "silent": sum(r["silent"] for r in rows), "crashes": sum(bool(r["crash"]) for r in rows), "rows": rows}


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    folder = Path(argv[0])
    if not (folder / "expect.yaml").is_file():
        print(f"real_paste_round: {folder}/expect.yaml not found (give a round folder such as "
              f"fixtures/pastes/round-7)", file=sys.stderr)
        return 2
    result = score(folder)
    if "--json" in argv:
        print(json.dumps(result, indent=1))
        return 0
    for r in result["rows"]:
        if not r["first"]:
            tag = "CRASH " + r["crash"] if r["crash"] else ("silent" if r["silent"] else "got " + ", ".join(r["got"]))
            print(f"MISS {r['case']}: want {r['want']}; {tag}")
    n = result["cases"]
    print(f"first {result['first']}/{n}  top3 {result['top3']}/{n}  silent {result['silent']}  crashes {result['crashes']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
