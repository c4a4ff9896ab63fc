"""The fast scanning path gives exactly what the plain definitions give (randomised)."""

from __future__ import annotations

import copy
import random

from loradoctor.logs.engine import _DICT_START, _split_metric_dicts, _split_metric_dicts_slow
from loradoctor.logs.scan import REPLAN_MISSES, Literal, Prefilter

LITERALS = [Literal("Error"), Literal("NCCL"), Literal("killed", ignore_case=True), Literal("nan", ignore_case=True),
            Literal("Tried to allocate"), Literal("-packages"), Literal("loss", ignore_case=True)]

PIECES = [
    " 42%|####      | 420/1000 [01:02<01:30,  2.01s/it]", " 43%|####      | 430/1000 [01:03<-1:29, 2.1s/it]",
    "{'loss': 1.25, 'grad_norm': 0.4, 'learning_rate': 2e-05, 'epoch': 0.5}", "{'loss': nan}",
    "RuntimeError: boom", "gpu0:1:1 [0] NCCL INFO ring", "KILLED by the kernel", "Kill-ed", "plain text",
    "torch/site-packages/x.py:3: UserWarning", "CUDA out of memory. Tried to allocate 2.00 GiB", "", "NaN here",
    "{'loss': 1, 'x': {'loss': 2}", "{'loss': \n1}", "junk {'loss': 1, \"loss\": 2}",
    # a dict cut mid-pair and another start glued to it; a start at the very end; a dict closed right before a start
    "{'loss': 0.5, 'gr{'loss': 0.25, 'epoch': 1.0}", "{'loss': ", "{'loss': 2.0, 'epoch': 1}{'loss': 3.0}",
    "{'loss': 1.5, 'epoch", "{'loss': 1.5, ",
]


def _random_block(rng: random.Random) -> bytes:
    out = []
    for _ in range(rng.randint(1, 60)):
        out.append(rng.choice(PIECES))
        out.append(rng.choice(["\n", "\n", "\r", "\r\n"]))
    return "".join(out).encode()


def _brute_force(block: bytes) -> list[bytes]:
    """Every \\r/\\n segment that holds a literal, in order."""
    found = []
    for line in block.split(b"\n"):
        for seg in line.split(b"\r"):
            low = seg.lower()
            if any((lit.text.lower().encode() in low) if lit.ignore_case else (lit.text.encode() in seg)
                   for lit in LITERALS):
                found.append(seg)
    return found


def test_candidates_match_brute_force_whatever_the_plan():
    rng = random.Random(7)
    pre = Prefilter(LITERALS)
    counted = 0
    for round_no in range(400):
        block = _random_block(rng)
        if round_no % 7 == 0:  # a plan from an unrepresentative sample, or from this block
            pre.plan(_random_block(rng) if round_no % 2 else block)
        for _ in range(2):  # the second call answers from the verdict cache
            segs = pre.candidates(block)
            assert [block[s.start:s.end] for s in segs] == _brute_force(block)
            assert all(block.rfind(b"\n", 0, s.start) + 1 == s.line_start for s in segs)
            # the walk's line count: the engine numbers lines with it
            assert all(s.newlines == block.count(b"\n", 0, s.line_start) for s in segs if s.newlines is not None)
            assert pre.newlines is None or pre.newlines == block.count(b"\n")
            counted += sum(s.newlines is not None for s in segs) + (pre.newlines is not None)
    assert counted > 1000


def test_anchors_that_turn_common_are_reported_and_replanned():
    # the start of the log has no minus signs; later every bar has a negative ETA
    pre = Prefilter([Literal("-packages"), Literal("Error")])
    pre.plan(b"".join(f"{i:3d}%|##| {i}/100 [00:01<00:02, 2.00s/it]\r".encode() for i in range(2000)))
    later = b"".join(f"{i:3d}%|##| {i}/100 [00:01<-{i}:02, 2.00s/it]\r".encode() for i in range(REPLAN_MISSES + 500))
    block = later + b"\nsite-packages/x.py Error\n"
    assert [block[s.start:s.end] for s in pre.candidates(block)] == [b"site-packages/x.py Error"]
    assert pre.misses > REPLAN_MISSES
    pre.plan(block[:1 << 20])
    assert [block[s.start:s.end] for s in pre.candidates(block)] == [b"site-packages/x.py Error"]
    assert pre.misses < 10


def test_split_metric_dicts_matches_the_record_by_record_walk():
    rng = random.Random(3)
    for _ in range(3000):
        block = _random_block(rng)
        pos = block.find(_DICT_START)
        if pos < 0:
            continue
        for cut in (True, False):
            assert _split_metric_dicts(block, pos, cut) == _split_metric_dicts_slow(block, pos, cut), block


def test_plain_file_blocks_end_at_newlines_with_long_lines(tmp_path):
    from loradoctor.logs import reader

    rng = random.Random(5)
    lines = [b"x" * rng.choice([0, 5, 300, 5000, 70000, 200000]) for _ in range(200)]
    data = b"\n".join(lines) + b"\ntail without newline"
    path = tmp_path / "long.log"
    path.write_bytes(data)
    item = reader.resolve_inputs([str(path)])[0]
    blocks = list(reader.iter_blocks(item, block_bytes=64 << 10, first_block_bytes=1000))
    assert b"".join(blocks) == data
    # every block but the last ends a line, unless a line was longer than two blocks
    assert all(b.endswith(b"\n") or len(b) >= 2 * (64 << 10) for b in blocks[:-1])
    assert item.bytes == len(data)


def test_contained_in_follows_the_case_rules():
    from loradoctor.logs.scan import contained_in

    items = [("out of memory", True), ("CUDA out of memory", False), ("Out Of Memory", False),
             ("memory", True), ("OOM", False), ("oom", True), ("ZOOM in", True)]
    got = contained_in(items)
    assert got[0] == {3}  # ci inside ci
    assert got[1] == {0, 3}  # ci literals inside a cs one (lower-cased)
    assert got[2] == {0, 3}  # 'Out Of Memory' lower-cased holds both
    assert got[4] == {5}  # 'oom' (ci) is inside 'OOM'; the reverse is not: cs never inside ci
    assert got[5] == set()
    assert got[6] == {5}  # 'zoom in' holds 'oom'; 'OOM' (cs) is not inside a ci literal
    assert contained_in([(b"abc", False), (b"b", False)]) == [{1}, set()]
    assert contained_in([]) == []


def _naive_union(items, text, empty):
    found = empty()
    for lit, ci, payload in items:
        if (lit.lower() in text.lower()) if ci else (lit in text):
            found |= payload
    return found


def test_literal_index_is_the_naive_union_with_digits_and_case():
    """The one literal index (engine targets and collector bits): the same answer as testing every literal,
    with digit-blind verdicts remembered and literals with digits tested on the real line."""
    from loradoctor.logs.scan import LiteralIndex

    items = [("Xid", False, 1), ("79, pid", False, 2), ("fallen off", True, 4), ("xid (pci:0000", True, 8),
             ("13, pid", False, 16), ("NVRM", False, 32), ("nvrm", False, 64), ("Xid", False, 128)]
    index = LiteralIndex(items, int)
    xid79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has Fallen Off the bus."
    xid13 = xid79.replace("79", "13")  # the same digit-blind line, another Xid number
    for text in (xid79, xid13, xid79.lower(), "nothing here", ""):
        assert index.find(text) == _naive_union(items, text, int), text
    assert index.find(xid79) & 2 and not index.find(xid13) & 2  # the digit literal is not blinded away
    assert index.find(xid79) & 129 == 129  # one literal's payloads are merged
    sets = LiteralIndex([(lit, ci, {n}) for lit, ci, n in items], set)
    assert sets.find(xid13) == _naive_union([(lit, ci, {n}) for lit, ci, n in items], xid13, set)


def test_matcher_hits_are_the_union_of_the_rules_literal_targets():
    from loradoctor.logs.engine import Matcher
    from loradoctor.logs.rules import load_rules

    m = Matcher(load_rules())
    items = [(text, ci, tg) for (text, ci), tg in m.direct.items()]
    xid = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."
    for text in (xid, xid.replace("79", "13"), "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"):
        assert m.hits(text) == _naive_union(items, text, set), text
        assert m.hits(text) == m.hits(text)  # the remembered verdict


def test_error_after_eight_kib_of_other_output_on_one_line_is_read(tmp_path):
    from loradoctor.logs.engine import explain

    log = tmp_path / "long.log"
    log.write_text("a " * 8000 + "RuntimeError: CUDA error: device-side assert triggered\n")
    findings = explain([str(log)]).findings
    assert findings and findings[0].cause == "cuda.device_assert"


def test_json_record_carrying_a_traceback_is_read_as_its_lines(tmp_path):
    from loradoctor.logs.engine import explain

    log = tmp_path / "app.jsonl"
    log.write_text('{"ts": 1, "level": "info", "msg": "loading"}\n'
                   '{"level":"error","traceback":"Traceback (most recent call last):\\n  File \\"/app/t.py\\", line 1, '
                   'in <module>\\nImportError: libcudnn.so.9: cannot open shared object file: No such file or '
                   'directory"}\n')
    findings = explain([str(log)]).findings
    assert findings and findings[0].cause == "env.torch_broken"
    assert findings[0].evidence[0].line == 2


def test_traceback_whose_line_breaks_were_lost_is_read_as_lines(tmp_path, monkeypatch):
    from loradoctor.logs import engine

    flat = ('Traceback (most recent call last):   File "/w/asr_lora.py", line 5, in <module>     import torchaudio   '
            'File "/v/lib/python3.10/site-packages/torchaudio/_extension/utils.py", line 60, in _load_lib     '
            'torch.ops.load_library(path)   File "/v/lib/python3.10/site-packages/torch/_ops.py", line 1295, in '
            'load_library     ctypes.CDLL(path) OSError: /v/lib/python3.10/site-packages/torchaudio/lib/'
            'libtorchaudio.so: undefined symbol: _ZNK5torch8autograd4Node4nameB5cxx11Ev\n')
    log = tmp_path / "flat.log"
    log.write_text(flat)
    findings = engine.explain([str(log)]).findings
    assert findings and findings[0].cause == "env.version_conflict" and findings[0].evidence[0].line == 1
    monkeypatch.setattr(engine, "FLATTENED_MIN_CHARS", 10**9)  # without the split the pattern misses
    assert not [f for f in engine.explain([str(log)], differential_on=False).findings if f.cause == "env.version_conflict"]


def test_line_numbers_of_a_log_of_long_lines_are_counted_alike_either_way(tmp_path, monkeypatch):
    """After a block of long lines (progress-bar redraws) the engine counts newlines by walking from one
    to the next (engine._LineWalk) instead of bytes.count: the evidence lines and the line count are the
    same either way."""
    from loradoctor.logs import engine

    bar = "\r".join(f"  3%|▎         | {k}/9000 [00:{k % 60:02d}<7:39:20, 15.29s/it]" for k in range(40))
    lines = []
    for i in range(1, 400):
        lines.append(bar)
        if i % 97 == 0:
            lines.append(f"[rank0]: UserWarning: step {i}: `use_cache=True` is incompatible with gradient checkpointing")
    lines.append("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
                 "of 23.65 GiB of which 1.02 GiB is free.")
    path = tmp_path / "bars.log"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    monkeypatch.setattr(engine, "FIRST_BLOCK_BYTES", 64 << 10)  # then 4 MiB blocks: the walk counts them
    walked = engine.explain([str(path)]).to_dict()
    monkeypatch.setattr(engine, "LONG_LINE_BYTES", 1 << 40)  # bytes.count throughout
    counted = engine.explain([str(path)]).to_dict()
    for report in (walked, counted):
        report.pop("elapsed_s", None)
    assert walked == counted
    oom_line = len(lines)
    assert any(e["line"] == oom_line for f in walked["findings"] for e in f["evidence"]), walked["findings"][0]
    assert walked["inputs"][0]["lines"] == oom_line


def test_a_case_insensitive_literal_whose_rarest_byte_is_not_ascii_is_planned():
    # 'µ' is b'\xc2\xb5' in UTF-8; chr(0xb5).upper() is U+039C, far outside a byte table: planning on a
    # sample where 0xb5 is the rarest byte of the literal crashed (IndexError) before round 11.
    lit = Literal("dµs", ignore_case=True)
    pre = Prefilter([lit, Literal("Error")])
    pre.plan("显存 § ddddd sssss Error\n".encode() * 50)  # every byte of the literal but 0xb5 is common
    block = "x\nDµS here\n".encode()
    assert [block[s.start:s.end] for s in pre.candidates(block)] == ["DµS here".encode()]


def test_no_extractor_trigger_occurs_in_a_plain_metric_dict_or_bar():
    """The engine cuts the Trainer's metric dicts out of the text it scans unless a prefilter literal occurs in
    them, and reads only the bar redraws that hold one; a rule's literals leave the prefilter once the rule has
    its matches, the extractors' triggers never do. A trigger inside every dict (`learning_rate` was one) keeps
    millions of dict lines in the scan for the whole log: explain on 200 MB took 4x as long."""
    from loradoctor.logs.facts import TABLE_HEAD, TRIGGER_LITERALS
    from loradoctor.logs.rules.lint import METRIC_LINES

    triggers = Prefilter([Literal(text, ci) for text, ci in TRIGGER_LITERALS] + [Literal(TABLE_HEAD.decode("ascii"))])
    for line in METRIC_LINES:
        record = line.encode()
        assert not triggers.occurs_in(record), (line, [t for t in TRIGGER_LITERALS
                                                       if (t[0].lower().encode() in record.lower() if t[1]
                                                           else t[0].encode() in record)])


def test_no_rule_literal_keeps_plain_metric_dicts_in_the_scan():
    """A built-in rule literal that occurs in a plain Trainer metric dict or a progress bar must belong to a
    regex that matches it (rules lint checks it: lint.metric_line_literal_problems); otherwise it stays in the
    prefilter for the whole log, every dict line is scanned, and explain on a 200 MB log takes 4x as long
    (`grad` of an exclude regex did; such a rule gives `exclude_prefilter`)."""
    from loradoctor.logs.rules import load_rules
    from loradoctor.logs.rules.lint import metric_line_literal_problems

    rules = load_rules()
    assert metric_line_literal_problems(rules) == []
    # the check sees the case it guards: an exclude whose derived literal is in every dict
    prose = next(r for r in rules if r.id == "prose-loss-zero")
    bad = copy.copy(prose)
    bad.exclude_literals = [[("grad", True)]]
    assert "exclude_prefilter" in metric_line_literal_problems([bad])[0]
