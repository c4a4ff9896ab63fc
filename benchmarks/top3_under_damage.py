"""Top three under damage: when a damaged paste loses its first cause, is the right cause still 2nd or 3rd?
(issue 10, docs/explain.md "The differential")

Real pastes are degraded copies of a log: cut at a terminal's or a chat client's width, only the last few
lines, lower-cased as an issue title, a traceback collapsed onto one line by a web form. This benchmark
takes every positive rule fixture (fixtures/logs/*/pos-*, files and folders), explains it as it is (its
first cause is the right one), damages it each way below, explains the copy, and over the copies whose
FIRST cause changed reports how often the right cause is still in the top three, and which
(right, got-first) pairs are the most common:

    python benchmarks/top3_under_damage.py --stride 3           # every 3rd fixture (~3 min CPU)
    python benchmarks/top3_under_damage.py --save AFTER.json    # the rows, for comparing runs
    python benchmarks/top3_under_damage.py --against BEFORE.json  # copies whose top-3 verdict changed
    python benchmarks/top3_under_damage.py --damage cut80 -v    # one damage, one line per lost copy

Damages: `cut80`, `cut120` cut every line at that many characters (benchmarks/truncation_probe.py's cut);
`last5`, `last10` keep only the last 5 / 10 lines; `lower` and `one_line` are tests/shapes.py's SHAPES. A
copy identical to its original (nothing to cut, no traceback to collapse) is skipped. `via look-alike`
counts the copies whose right cause is in the top three only as a look-alike or guess (rule
`differential` / `guess`). It is a measurement, not a test: nothing fails.
"""

from __future__ import annotations

import collections
import glob
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from tests.shapes import SHAPES  # noqa: E402
from truncation_probe import cut_text  # noqa: E402


def _last(n: int):
    def keep(text: str) -> str:
        return "".join(text.splitlines(True)[-n:])
    return keep


DAMAGES = {
    "cut80": lambda t: cut_text(t, "80"),
    "cut120": lambda t: cut_text(t, "120"),
    "last5": _last(5),
    "last10": _last(10),
    "lower": SHAPES["lower"],
    "one_line": SHAPES["one_line"],
}


def fixtures(stride: int) -> list[Path]:
    return [Path(p) for p in sorted(glob.glob(str(ROOT / "fixtures/logs/*/pos-*")))][::stride]


def _files(path: Path) -> list[Path]:
    return [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())


def damaged_copy(path: Path, damage, dest: Path) -> Path | None:
    """`path` (a file or a folder of logs) with `damage` applied to every file, written under `dest`;
    None when the damage changes nothing."""
    changed = False
    for f in _files(path):
        raw = f.read_bytes()
        text = raw.decode("utf-8", errors="replace")
        new = damage(text)
        changed |= new != text
        out = dest / f.relative_to(path.parent)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(new, encoding="utf-8")
    return dest / path.name if changed else None


def _rows(path: str, rules) -> list[list[str]]:
    from loradoctor.errors import UserError
    from loradoctor.logs import engine

    try:
        return [[f.cause, f.rule] for f in engine.explain([path], rules=rules).findings]
    except UserError:
        return []


def run(stride: int, damages: list[str]) -> dict[str, dict]:
    os.environ.setdefault("LORADOCTOR_NO_CACHE", "1")
    from loradoctor.logs.rules.load import load_rules

    rules = load_rules()
    out: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n, path in enumerate(fixtures(stride)):
            orig = _rows(str(path), rules)
            if not orig:
                continue
            key = str(path.relative_to(ROOT))
            for name in damages:
                copy = damaged_copy(path, DAMAGES[name], Path(tmp) / f"{n}-{name}")
                if copy is None:
                    continue
                out[f"{key} {name}"] = {"want": orig[0][0], "damage": name, "got": _rows(str(copy), rules)[:3]}
    return out


def _lost(row: dict) -> bool:
    return not row["got"] or row["got"][0][0] != row["want"]


def _top3(row: dict) -> bool:
    return any(c == row["want"] for c, _ in row["got"])


def _via_alike(row: dict) -> bool:
    return _top3(row) and all(r in ("differential", "guess") for c, r in row["got"] if c == row["want"])


def report(result: dict[str, dict], damages: list[str], verbose: bool) -> None:
    rows = list(result.values())
    lost = [r for r in rows if _lost(r)]
    print(f"{len(rows)} damaged copies; first cause kept {len(rows) - len(lost)} "
          f"({100 * (len(rows) - len(lost)) / max(len(rows), 1):.1f}%), right cause in top 3 "
          f"{sum(_top3(r) for r in rows)} ({100 * sum(_top3(r) for r in rows) / max(len(rows), 1):.1f}%)")
    print(f"first cause changed in {len(lost)}: right cause still in top 3 in {sum(_top3(r) for r in lost)} "
          f"({100 * sum(_top3(r) for r in lost) / max(len(lost), 1):.1f}%; via look-alike "
          f"{sum(_via_alike(r) for r in lost)}), silent {sum(not r['got'] for r in lost)}")
    for name in damages:
        d = [r for r in rows if r["damage"] == name]
        dl = [r for r in d if _lost(r)]
        print(f"  {name:9s} copies {len(d):4d}  first changed {len(dl):4d}  still top3 {sum(_top3(r) for r in dl):4d}"
              f"  silent {sum(not r['got'] for r in dl):4d}")
    pairs = collections.Counter((r["want"], r["got"][0][0] if r["got"] else "(silent)") for r in lost if not _top3(r))
    print("most common (right, got first) pairs where the right cause is NOT in the top 3:")
    for (want, got), k in pairs.most_common(25):
        print(f"  {k:4d}  {want} -> {got}")
    if verbose:
        for key, r in result.items():
            if _lost(r) and not _top3(r):
                print(f"  LOST {key}: want {r['want']}; got {', '.join(c for c, _ in r['got']) or '(silent)'}")


def main(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    stride = int(argv[argv.index("--stride") + 1]) if "--stride" in argv else 1
    damages = [argv[i + 1] for i, a in enumerate(argv) if a == "--damage"] or list(DAMAGES)
    result = run(stride, damages)
    report(result, damages, "-v" in argv)
    if "--save" in argv:
        Path(argv[argv.index("--save") + 1]).write_text(json.dumps(result, indent=0, sort_keys=True), encoding="utf-8")
    if "--against" in argv:
        before = json.loads(Path(argv[argv.index("--against") + 1]).read_text(encoding="utf-8"))
        common = sorted(set(before) & set(result))
        first = [k for k in common if before[k]["got"][:1] != result[k]["got"][:1]]
        gained = [k for k in common if not _top3(before[k]) and _top3(result[k])]
        dropped = [k for k in common if _top3(before[k]) and not _top3(result[k])]
        print(f"against {len(common)} saved copies: first finding changed {len(first)}, right cause reached the "
              f"top 3 in {len(gained)}, left it in {len(dropped)}")
        for k in first + dropped:
            print(("FIRST " if k in first else "DROP  ") + k)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
