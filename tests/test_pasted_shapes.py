"""A log pasted into an issue reply, rendered as HTML or Markdown, lower-cased, indented, numbered, behind
prompts, with its traceback in the IPython / rich dialect or on one line, collected by docker compose or the
kubelet, must be diagnosed as the plain log is (issue 10): the first cause of every positive fixture stays the
same in the shapes of tests/shapes.py. Every fixture is pasted in one shape (picked by a hash of its own name, so
each shape sees about 1/17 of the fixtures, CI stays fast, and adding a fixture moves no other fixture's shape); benchmarks/shape_invariance.py runs the full cross
product and docs/explain.md ("Pasted shapes") records its counts."""

from __future__ import annotations

import zlib
from pathlib import Path

import pytest

from loradoctor.logs import engine
from shapes import SHAPES  # noqa: E402

LOGS = Path(__file__).resolve().parent.parent / "fixtures" / "logs"
FIXTURES = sorted(p for p in LOGS.glob("*/pos-*") if p.suffix not in (".gz", ".bz2", ".xz"))
NAMES = list(SHAPES)
# (fixture folder/name, shape) pairs whose first cause is known to change, xfailed strictly so that a fix
# shows (7 of ~690 on 2026-12-01 after the session's merges; none left after branch fixups: quoted tables,
# rich headers, single wrapped lines); see docs/explain.md "Pasted shapes". The rotation is a hash of each
# fixture's name: adding fixtures moves no other fixture to another shape.
# (the quoted 89-column two-GPU nvidia-smi table wrapped at 80 was the last one: a cut row behind a reply's
# `> ` is recognised by its rest, padding and edge, on the next line: reader._row_rest)
EXCEPTIONS: dict[tuple[str, str], str] = {}


def _texts(path: Path) -> dict[str, str]:
    files = [path] if path.is_file() else sorted(p for p in path.iterdir() if p.is_file())
    return {p.name: p.read_text(encoding="utf-8", errors="replace") for p in files}


def _start(path: Path) -> int:
    """Where a fixture's rotation through the shapes starts: a hash of `folder/name`, stable when fixtures are
    added or removed (a global index moved every later fixture to another shape)."""
    return zlib.crc32(f"{path.parent.name}/{path.name}".encode("utf-8")) % len(NAMES)


def _paste(path: Path, tmp_path: Path):
    """The fixture pasted in the first shape, from its rotation, that changes it: (shape, paths)."""
    texts = _texts(path)
    for k in range(len(NAMES)):
        shape = NAMES[(_start(path) + k) % len(NAMES)]
        pasted = {name: SHAPES[shape](text) for name, text in texts.items()}
        if pasted != texts:
            out = tmp_path / shape
            out.mkdir()
            for name, text in pasted.items():
                (out / name).write_text(text, encoding="utf-8")
            return shape, ([str(out)] if path.is_dir() else [str(out / path.name)])
    return None, []


@pytest.mark.parametrize("path", FIXTURES, ids=lambda v: f"{v.parent.name}/{v.name}")
def test_a_pasted_shape_keeps_the_first_cause(path, tmp_path):
    plain = engine.explain([str(path)]).findings
    if not plain:
        pytest.skip("the plain fixture has no finding (its own test reports that)")
    shape, paths = _paste(path, tmp_path)
    if shape is None:
        pytest.skip("no shape changes this fixture")
    reason = EXCEPTIONS.get((f"{path.parent.name}/{path.name}", shape))
    got = engine.explain(paths).findings
    if reason:
        assert not (got and got[0].cause == plain[0].cause), f"fixed, drop it from EXCEPTIONS: {reason}"
        pytest.xfail(reason)
    assert got and got[0].cause == plain[0].cause, f"{shape}: {plain[0].cause} -> {got[0].cause if got else None}"


def test_every_shape_is_exercised():
    assert len(FIXTURES) >= 2 * len(NAMES)
    starts = [_start(p) for p in FIXTURES]
    assert all(starts.count(i) >= 2 for i in range(len(NAMES))), starts  # each shape is where two rotations start


# A prefix added before the console wrapped the paste (a reply's `> `, docker compose's `trainer-1  | `) is on
# the cut line only, never on its continuation: the wrap is still found and rejoined (the prefix's own `|` is no
# bar or table edge; a rule's message or required frame cut in two is read with the prefix peeled; a cut table
# row whose rest is indented by its padding is still a cut row). One fixture per way it failed before.
PREFIX_THEN_WRAP = [
    ("cuda-illegal-memory-access/pos-rocm-memory-access-fault.log", "compose+wrap80"),  # text glued after a bar
    ("env-torch-import-broken/pos-winerror-title-cut-in-path.log", "quoted+wrap80"),  # cut just before a space
    ("env-version-library-nameerror/pos-colab-unsloth-kernel-unpack.log", "compose+wrap80"),  # a frame cut in two
    ("env-version-unknown-model-type-bare/pos-keyerror-qwen3-glued-to-progress-bar.log", "quoted+wrap80"),
    ("oom-other-process-smi-unlisted/pos-container-no-processes.log", "quoted+wrap80"),  # an 89-column table
]


@pytest.mark.parametrize("name, shape", PREFIX_THEN_WRAP, ids=lambda v: v)
def test_a_prefix_then_a_wrap_keeps_the_first_cause(name, shape, tmp_path):
    path = LOGS / name
    text = path.read_text(encoding="utf-8")
    for part in shape.split("+"):
        text = SHAPES[part](text)
    pasted = tmp_path / path.name
    pasted.write_text(text, encoding="utf-8")
    plain = engine.explain([str(path)])
    got = engine.explain([str(pasted)])
    assert got.inputs[0]["wrap_width"] == 80
    assert got.findings and got.findings[0].cause == plain.findings[0].cause
