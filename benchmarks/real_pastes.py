"""Score a real-paste QA round: each case of benchmarks/data/pastes_r4.yaml (a log written for this
project in the shape of a public report) is explained and its expected cause looked up among the
findings: first, or within the first three distinct causes.

    python benchmarks/real_pastes.py [--cases benchmarks/data/pastes_r4.yaml] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from loradoctor.logs import engine  # noqa: E402


def causes(path: Path) -> list[str]:
    """The distinct causes of the findings, in rank order."""
    out: list[str] = []
    for f in engine.explain([str(path)]).findings:
        if f.cause not in out:
            out.append(f.cause)
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", default=str(ROOT / "benchmarks" / "data" / "pastes_r4.yaml"))
    parser.add_argument("--json")
    args = parser.parse_args()
    spec = yaml.safe_load(Path(args.cases).read_text(encoding="utf-8"))
    folder = Path(args.cases).parent / spec["folder"]
    rows = []
    for case in spec["cases"]:
        got = causes(folder / case["file"])
        rank = got.index(case["cause"]) + 1 if case["cause"] in got else None
        rows.append({"file": case["file"], "want": case["cause"], "got": got[:3], "rank": rank})
        mark = "ok " if rank == 1 else ("top3" if rank and rank <= 3 else "MISS")
        print(f"{mark:<5} {case['file']:<48} want {case['cause']:<24} got {', '.join(got[:3]) or '-'}")
    n = len(rows)
    first = sum(r["rank"] == 1 for r in rows)
    top3 = sum(bool(r["rank"]) and r["rank"] <= 3 for r in rows)
    print(f"{n} cases: first {first}/{n} ({100 * first / n:.0f}%), top-3 {top3}/{n} ({100 * top3 / n:.0f}%)")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
