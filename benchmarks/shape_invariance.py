"""Count, per pasted shape (tests/shapes.py), the positive fixtures whose first cause changes when the
fixture is pasted in that shape. The numbers go into docs/explain.md ("Pasted shapes").

    python benchmarks/shape_invariance.py [--stride N] [--offset K] [--json OUT] [--shapes a,b,c+d]

--stride N keeps every Nth fixture (deterministic), for a quick reading; the default is all of them.
--pastes reads the real-paste rounds (fixtures/pastes/, already in a real shape) instead of the rule fixtures.
--shapes picks shapes; `a+b` is a composed shape (a, then b: `markdown+lower` is a rendered page whose
text was then lower-cased), as real pastes often carry two at once.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from shapes import SHAPES  # noqa: E402

from loradoctor.logs import engine  # noqa: E402


def positive_fixtures() -> list[Path]:
    return sorted(p for p in (ROOT / "fixtures" / "logs").glob("*/pos-*"))


def real_pastes() -> list[Path]:
    return sorted(p for p in (ROOT / "fixtures" / "pastes").rglob("*") if p.is_file() and p.suffix != ".yaml")


def read_files(path: Path) -> dict[str, str]:
    """name -> text of a fixture (a file, or the files of a folder fixture); compressed ones are skipped."""
    files = [path] if path.is_file() else sorted(p for p in path.iterdir() if p.is_file())
    return {p.name: p.read_text(encoding="utf-8", errors="replace") for p in files if p.suffix not in (".gz", ".bz2", ".xz")}


def first_cause(paths: list[str]):
    findings = engine.explain(paths).findings
    return findings[0].cause if findings else None


def pasted(path: Path, shape: str, out: Path):
    """Write `path` pasted in `shape` under `out`; the paths to explain, or None when it does not apply."""
    texts = read_files(path)
    if not texts:
        return None
    changed = False
    written = []
    out.mkdir(parents=True, exist_ok=True)
    for name, text in texts.items():
        new = text
        for part in shape.split("+"):
            new = SHAPES[part](new)
        changed |= new != text
        target = out / name
        target.write_text(new, encoding="utf-8")
        written.append(str(target))
    if not changed:
        return None
    return [str(out)] if path.is_dir() else written


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stride", type=int, default=1)
    parser.add_argument("--offset", type=int, default=0)
    parser.add_argument("--json")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--pastes", action="store_true", help="the real-paste rounds instead of the rule fixtures")
    args = parser.parse_args()
    shapes = args.shapes.split(",")
    fixtures = (real_pastes() if args.pastes else positive_fixtures())[args.offset::args.stride]
    changed: Counter = Counter()
    tried: Counter = Counter()
    details: list[dict] = []
    started = time.process_time()
    with tempfile.TemporaryDirectory() as tmp:
        for n, path in enumerate(fixtures):
            want = first_cause([str(path)])
            if want is None:
                continue
            for shape in shapes:
                paths = pasted(path, shape, Path(tmp) / f"{n}-{shape}")
                if paths is None:
                    continue
                tried[shape] += 1
                got = first_cause(paths)
                if got != want:
                    changed[shape] += 1
                    details.append({"fixture": str(path.relative_to(ROOT)), "shape": shape, "want": want, "got": got})
    print(f"{len(fixtures)} fixtures, {sum(tried.values())} pasted copies, {time.process_time() - started:.0f} s CPU")
    print(f"{'shape':<14} {'applied':>8} {'changed':>8}")
    for shape in shapes:
        print(f"{shape:<14} {tried[shape]:>8} {changed[shape]:>8}")
    if args.json:
        Path(args.json).write_text(json.dumps({"tried": tried, "changed": changed, "details": details}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
