"""The start-up shortcuts of `explain` (issue 9) change no answer: lazily compiled module regexes,
rule patterns searched only when the rule can still fire, the differential table read back from the
user cache, the prefilter's containment test deferred to big inputs."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest

from loradoctor.lazyre import LazyPattern, is_pattern, lazy_re
from loradoctor.logs import differential, engine
from loradoctor.logs.rules import load_rules
from loradoctor.logs.scan import Literal, Prefilter


def test_lazy_re_compiles_on_first_use():
    p = lazy_re(r"(\d+) GiB", 0)
    assert p.pattern == r"(\d+) GiB" and is_pattern(p) and "_compiled" not in p.__dict__
    assert p.search("need 12 GiB").group(1) == "12"
    assert "_compiled" in p.__dict__ and p.flags == p.compiled().flags
    assert p.findall("1 GiB, 2 GiB") == ["1", "2"]
    with pytest.raises(AttributeError):
        p.no_such_method  # noqa: B018


def test_importing_the_engine_compiles_no_extractor_regex():
    code = ("import loradoctor.logs.engine, sys\n"
            "from loradoctor.lazyre import LazyPattern\n"
            "mods = [m for n, m in sys.modules.items() if n.startswith('loradoctor.logs')]\n"
            "lazy = [v for m in mods for v in vars(m).values() if isinstance(v, LazyPattern)]\n"
            "print(len(lazy), sum('_compiled' in v.__dict__ for v in lazy))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    total, compiled = int(out[0]), int(out[1])
    assert total > 100 and compiled <= 2, (total, compiled)  # _SPLIT_RE's source reads one at import


def _report(path: str) -> dict:
    doc = engine.explain([path], rules=RULES).to_dict()
    doc.pop("elapsed_s")
    return doc


RULES = load_rules()
SAMPLE_LOGS = sorted(glob.glob("fixtures/logs/*/pos-*"))[::9][:40]


@pytest.mark.parametrize("path", SAMPLE_LOGS)
def test_deferred_pattern_search_gives_the_eager_answer(path, monkeypatch):
    deferred = _report(path)
    monkeypatch.setattr(engine, "DEFER_LINES", 0)  # every pattern line searched as it comes
    assert _report(path) == deferred


def test_deferral_keeps_the_first_matches_in_order(tmp_path, monkeypatch):
    """More candidate lines than DEFER_LINES, some matching: evidence is the first five matches."""
    lines = []
    for i in range(30):
        lines.append(f"step {i}: CUDA out of memory" if i % 3 == 0 else f"step {i}: out of memory in the cache")
    log = tmp_path / "many.log"
    log.write_text("\n".join(lines) + "\n", encoding="utf-8")
    deferred = _report(str(log))
    monkeypatch.setattr(engine, "DEFER_LINES", 0)
    assert _report(str(log)) == deferred
    first = deferred["findings"][0]
    assert first["evidence"][0]["line"] == 1


def test_the_differential_table_is_read_back_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LORADOCTOR_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("LORADOCTOR_NO_CACHE", raising=False)
    differential._data.cache_clear()
    try:
        parsed = differential._data()
        entries = list(tmp_path.glob("differential-*.json"))
        assert len(entries) == 1
        assert json.loads(entries[0].read_text(encoding="utf-8")) == parsed
        differential._data.cache_clear()
        monkeypatch.setitem(sys.modules, "yaml", None)  # a second read must not need the YAML parser
        assert differential._data() == parsed
    finally:
        differential._data.cache_clear()
        differential._alternatives_for.cache_clear()
        differential._guesses.cache_clear()


def test_prefilter_finds_the_same_segments_with_or_without_the_containment_test():
    literals = [Literal("out of memory", True), Literal("CUDA out of memory"), Literal("Error"), Literal("KeyError")]
    block = b"ok\nKeyError: 'x'\nbar\rRuntimeError: CUDA out of memory\nfine\nOut Of Memory here\n"
    small, big = Prefilter(literals), Prefilter(literals)
    small.plan(block)  # a small sample: every literal is searched
    big.plan(block * 4000)  # a big one: only the literals that contain no other
    assert small.kept == big.kept  # what callers see is always the minimal set
    assert [(s.start, s.end) for s in small.candidates(block)] == [(s.start, s.end) for s in big.candidates(block)]
    assert len(big._kept) < len(small._kept)


def test_a_short_explain_imports_nothing_heavy(tmp_path):
    """What start-up left behind (issue 9): with the rule cache warm, `explain` on a one-line log reads
    no YAML, compiles rules with `re` (not `regex`), and builds its records without `dataclasses`
    (and the `inspect` it pulls in): ~60 ms together on the 2-core CI machine."""
    log = tmp_path / "one.log"
    log.write_text("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n", encoding="utf-8")
    code = ("import sys\nfrom loradoctor import cli\n"
            "try:\n    cli.main(['explain', sys.argv[1]])\nexcept SystemExit:\n    pass\n"
            "heavy = [m for m in ('yaml', 'regex', 'dataclasses', 'inspect', 'shutil', 'gzip') if m in sys.modules]\n"
            "print('HEAVY', *heavy)\n")
    env = {**os.environ, "LORADOCTOR_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("LORADOCTOR_NO_CACHE", None)
    for _ in range(2):  # the first run fills the rule cache
        out = subprocess.run([sys.executable, "-c", code, str(log)], capture_output=True, text=True, env=env)
    last = [line for line in out.stdout.splitlines() if line.startswith("HEAVY")]
    assert last == ["HEAVY"], (last, out.stderr[-2000:])
    assert "CUDA out of memory" in out.stdout or "oom" in out.stdout.lower()


def test_a_gated_when_answers_as_the_parsed_one():
    """A cached rule's `when` that is false without its facts is answered without a parse when the input
    has none of them; on every sample log's facts (and on none) it answers as the parsed condition."""
    from loradoctor.logs.rules.condition import Condition
    from loradoctor.logs.rules.load import _ParsedOnUse, _rule_data, _rules_from_data

    cached = _rules_from_data(json.loads(json.dumps([_rule_data(r) for r in RULES])))  # as read from the cache
    gated = [r for r in cached if isinstance(r.condition, _ParsedOnUse) and r.condition.__dict__["_gate"]]
    assert len(gated) >= 10  # most when-only rules name the facts they need
    samples = [{}, {"unrelated.fact": 1}] + [engine.explain([p], rules=RULES).facts for p in SAMPLE_LOGS[:12]]
    for rule in (r for r in cached if r.condition is not None):
        full = Condition(rule.when)
        for values in samples:
            assert rule.condition.evaluate(values) == full.evaluate(values), (rule.id, values)
    untouched = _ParsedOnUse(gated[0].when, gated[0].condition.__dict__["_gate"], True)
    assert untouched.evaluate({}) is False and "tree" not in untouched.__dict__  # no parse


def test_the_focus_of_an_overlong_line_is_found_window_by_window_as_in_one_pass(monkeypatch):
    """engine._literal_at searches window by window (a 20 MB hostile line cost seconds when every literal
    was searched over all of it): on random lines, with tiny windows, it finds the first literal a
    search over the whole line finds, wherever it starts within FOCUS_SEARCH_BYTES."""
    import random

    class Kept:  # the part of a Prefilter _literal_at reads
        kept = [(b"CUDA out", False), (b"error", True), (b"oom", True), (b"Xid", False), (b"a" * 9, False)]

    def whole(raw: bytes) -> int:
        low = raw.lower()
        found = [(low if ci else raw).find(lit) for lit, ci in Kept.kept]
        return min((pos for pos in found if pos >= 0), default=0)

    monkeypatch.setattr(engine, "FOCUS_WINDOW_BYTES", 16)
    monkeypatch.setattr(engine, "FOCUS_SEARCH_BYTES", 1 << 20)
    rng = random.Random(3)
    pieces = [b"x", b" ", b"CUDA out", b"ERROR", b"Oom", b"Xi", b"d", b"a" * 5, b"a" * 9, b"cuda out"]
    for _ in range(3000):
        raw = b"".join(rng.choice(pieces) for _ in range(rng.randint(0, 40)))
        assert engine._literal_at(raw, Kept) == whole(raw), raw
