"""The repository cites no file outside itself (issue 9 item 5): the team's fact sheets and the estimate's
development set are vendored (docs/reference/, benchmarks/data/dev_truth.yaml), and code, rules, docs and
benchmarks cite those copies, never ../shared or an absolute path of a developer machine."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUTSIDE = re.compile(r"\.\./shared/|(?<![\w/])shared/(?:reference|estimate|causes\.md)|(?<![\w/])/work/")


def _files():
    for top in ("loradoctor", "rules", "docs", "benchmarks", "scripts", ".ci"):
        for p in (ROOT / top).rglob("*"):
            if p.is_file() and p.suffix in (".py", ".md", ".yaml", ".yml", ".json", ".sh", "") \
                    and "reference" not in p.relative_to(ROOT).parts[:2] and "__pycache__" not in p.parts:
                yield p
    yield ROOT / "README.md"


def test_no_file_cites_a_path_outside_the_repository():
    bad = []
    for p in _files():
        for n, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if OUTSIDE.search(line):
                bad.append(f"{p.relative_to(ROOT)}:{n}: {line.strip()[:100]}")
    assert not bad, "paths outside the repository:\n" + "\n".join(bad[:20])


def test_the_vendored_copies_are_there():
    for name in ("nvidia.md", "pytorch.md", "hf-stack.md"):
        assert (ROOT / "docs" / "reference" / name).stat().st_size > 1000
    assert (ROOT / "benchmarks" / "data" / "dev_truth.yaml").is_file()
