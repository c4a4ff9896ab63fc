"""A log pasted into an issue reply, rendered as HTML, saved with Windows line ends, or collected by
docker compose or the kubelet must be diagnosed as the plain log is: the first cause of every sampled positive fixture stays the same."""

from __future__ import annotations

import html
from pathlib import Path

import pytest

from loradoctor.logs import engine

LOGS = Path(__file__).resolve().parent.parent / "fixtures" / "logs"
SAMPLE = sorted(p for p in LOGS.glob("*/pos-*") if p.is_file())[::5]
SHAPES = {
    "quoted": lambda t: "".join("> " + line for line in t.splitlines(True)),
    "html": html.escape,
    "crlf": lambda t: t.replace("\n", "\r\n"),
    "compose": lambda t: "".join("trainer-1  | " + line for line in t.splitlines(True)),
    "kubelet": lambda t: "".join("2024-05-01T10:00:00.123Z stdout F " + line for line in t.splitlines(True)),
}


@pytest.mark.parametrize("path", SAMPLE, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_pasted_shapes_keep_the_first_cause(path, tmp_path):
    plain = engine.explain([str(path)]).findings
    if not plain:
        pytest.skip("the plain fixture has no finding (its own test reports that)")
    text = path.read_text(encoding="utf-8", errors="replace")
    for name, shape in SHAPES.items():
        if name in ("quoted", "compose", "kubelet") and ("Training Loss" in text or "Epoch" in text):
            continue  # notebook tables are read from raw blocks, before line prefixes are peeled
        pasted = tmp_path / f"{name}.log"
        pasted.write_bytes(shape(text).encode("utf-8"))
        got = engine.explain([str(pasted)]).findings
        assert got and got[0].cause == plain[0].cause, f"{name}: {plain[0].cause} -> {got[0].cause if got else None}"
