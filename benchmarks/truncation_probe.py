"""Truncation probe: does the first cause survive a CUT paste? (issue 10)

Real pastes are often cut: issue titles end mid-word at GitHub's title limit, terminals and chat clients clip
long lines, people paste only the first 100 characters of a message. This probe takes every case of
fixtures/pastes/round-*/ (their expect.yaml name the cause that must come first), cuts it, explains the cut
copy and scores it against the expected cause:

    python benchmarks/truncation_probe.py                    # all rounds, every cut
    python benchmarks/truncation_probe.py --cut 120 --cut tail  # only these cuts
    python benchmarks/truncation_probe.py --json             # the rows, for comparing runs

Cuts: `uncut` (the reference: the paste as it is), `80`, `100`, `120`, `160` cut every line of the paste at that many characters (line ends kept);
`tail` removes the last third of the paste (by characters, so the last kept line may end mid-line).
Per cut it prints: kept first (the expected cause still comes first), lost to silence (no finding at all),
lost to another cause (something else comes first; `top3` says whether the expected cause is still among the
first three), and one line per lost case. It is a measurement, not a test: nothing fails.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import yaml

from loradoctor.logs import engine
from loradoctor.logs.rules.load import load_rules

ROOT = Path(__file__).resolve().parent.parent
CUTS = ["uncut", "80", "100", "120", "160", "tail"]


def cut_text(text: str, cut: str) -> str:
    """The paste as it would arrive cut: every line at `cut` characters, or its last third removed."""
    if cut == "uncut":
        return text
    if cut == "tail":
        return text[: (len(text) * 2) // 3]
    n = int(cut)
    out = []
    for line in text.splitlines(keepends=True):
        body = line.rstrip("\r\n")
        out.append(body[:n] + line[len(body):])
    return "".join(out)


def cases() -> list[tuple[Path, str]]:
    out = []
    for folder in sorted(ROOT.glob("fixtures/pastes/round-*/")):
        expect = yaml.safe_load((folder / "expect.yaml").read_text(encoding="utf-8"))
        for name, want in sorted(expect.items()):
            out.append((folder / name, want["cause"] if isinstance(want, dict) else want))
    return out


def probe(cut: str, rules, tmp: Path) -> list[dict]:
    rows = []
    for path, want in cases():
        text = path.read_text(encoding="utf-8", errors="replace")
        copy = tmp / path.parent.name / path.name
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text(cut_text(text, cut), encoding="utf-8")
        try:
            got = [f.cause for f in engine.explain([str(copy)], rules=rules).findings]
        except Exception as exc:  # a crash is a result of the probe
            got = ["CRASH " + type(exc).__name__]
        rows.append({"case": f"{path.parent.name}/{path.name}", "want": want, "got": got[:3],
                     "first": bool(got) and got[0] == want, "silent": not got, "top3": want in got[:3]})
    return rows


def main(argv: list[str]) -> int:
    cuts = [argv[i + 1] for i, a in enumerate(argv) if a == "--cut"] or CUTS
    rules = load_rules()
    result = {}
    with tempfile.TemporaryDirectory() as tmp:
        for cut in cuts:
            result[cut] = probe(cut, rules, Path(tmp) / cut)
    if "--json" in argv:
        print(json.dumps(result, indent=1))
        return 0
    for cut, rows in result.items():
        n = len(rows)
        silent = [r for r in rows if r["silent"]]
        other = [r for r in rows if not r["first"] and not r["silent"]]
        print(f"cut {cut}: kept first {n - len(silent) - len(other)}/{n}  lost to silence {len(silent)}  "
              f"lost to another cause {len(other)} (expected still in top3: {sum(r['top3'] for r in other)})")
        for r in silent:
            print(f"  SILENT {r['case']}: want {r['want']}")
        for r in other:
            print(f"  OTHER  {r['case']}: want {r['want']}; got {', '.join(r['got'])}"
                  + ("" if r["top3"] else "  (not in top3)"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
