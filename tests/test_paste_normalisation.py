"""What the reader and the rule compiler do for pastes that lost their shape (issue 10): a lower-cased
message gets the case of the rules' vocabulary back, line numbers and IPython prompts are peeled,
syslog lines without a host are read, backquotes and the `__` of `__init__` are optional in patterns."""

from __future__ import annotations

from pathlib import Path

import pytest

from loradoctor.logs import reader
from loradoctor.logs.engine import recaser_for
from loradoctor.logs.rules import derive_literals, load_rules, paste_tolerant

from conftest import ROOT, explain_text  # noqa: E402


@pytest.fixture(scope="module")
def recaser():
    return recaser_for(load_rules())


def test_a_lowered_oom_message_gets_its_numbers_read(recaser):
    from loradoctor.logs.facts import parse_oom_message

    text = (b"torch.outofmemoryerror: cuda out of memory. tried to allocate 2.00 gib. gpu 0 has a total capacity "
            b"of 23.65 gib of which 1.20 gib is free. including non-pytorch memory, this process has 22.40 gib memory "
            b"in use. of the allocated memory 20.10 gib is allocated by pytorch, and 1.90 gib is reserved by pytorch "
            b"but unallocated.")
    cased = recaser.recase(text)
    assert len(cased) == len(text)  # only the case changes: line offsets stay right
    msg = parse_oom_message(cased.decode())
    assert msg is not None and msg.device_index == 0
    assert abs(msg.free_bytes - 1.20 * 2**30) < 2 and abs(msg.reserved_unallocated_bytes - 1.90 * 2**30) < 2


def test_metric_records_and_bars_say_nothing_about_case():
    """A Trainer log whose first block is only metric dicts and tqdm bars (no capital letter anywhere) is not
    a lower-cased paste: its rules keep their case for the whole input."""
    bar = "  5%|\u258c         | 25/500 [00:10<03:10,  2.49it/s]\r"
    records = "".join(f"{{'loss': {1 + i / 1000:.4f}, 'grad_norm': 0.5, 'learning_rate': 2e-05, 'epoch': {i / 100:.2f}}}\n"
                      + bar for i in range(300)).encode()
    assert not reader.is_lowered(records)
    assert not reader.is_lowered(b'{"loss": 0.52, "epoch": 1}\n' * 50)
    assert reader.is_lowered(records + b"runtimeerror: cuda out of memory. tried to allocate 2.00 gib\n")
    assert reader.is_lowered(b"epoch 1/3: 100%|##########| 500/500 [05:00<00:00, loss=nan]\nkilled\n")


def test_a_container_runtime_prefix_does_not_hide_a_lower_cased_paste(tmp_path):
    line = "2024-05-01T10:00:00.123Z stdout F valueerror: asking to pad but the tokenizer does not have a padding token\n"
    assert reader.is_lowered(line.encode())
    assert not reader.is_lowered(b"2024-05-01T10:00:00.123Z stderr F ValueError: Asking to pad\n")
    report = explain_text(tmp_path, line)
    assert report.findings and report.findings[0].cause == "train.tokenizer_setup"


def test_lower_cased_apex_overflow_lines_still_count(tmp_path):
    lines = "".join(f"gradient overflow.  skipping step, loss scaler 0 reducing loss scale to {2 ** k}.0\n"
                    for k in (15, 14, 13))
    facts = explain_text(tmp_path, "is this a problem? training prints these lines:\n" + lines).facts
    assert facts.get("metrics.overflow_skips") == 3


def test_recasing_keeps_paths_and_ambiguous_words(recaser):
    text = b'  file "/usr/lib/python3/site-packages/transformers/trainer.py", line 1885, in train\nan error occurred'
    cased = recaser.recase(text).decode()
    assert cased.startswith('  File "/usr/lib/python3/site-packages/transformers/trainer.py"')  # path untouched
    assert cased.endswith("an error occurred")  # `error` is written both ways in patterns: left alone


def test_only_an_input_without_upper_case_is_recased(tmp_path):
    lowered = "runtimeerror: expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!\n"
    report = explain_text(tmp_path, lowered)
    assert report.findings and report.findings[0].cause == "train.device_mismatch"
    assert reader.is_lowered(lowered.encode()) and not reader.is_lowered(b"RuntimeError: x")
    # the rules read the line with the vocabulary's case given back; the evidence quotes it as pasted
    assert report.findings[0].evidence[0].text == lowered.strip()


def test_a_lower_cased_title_above_a_cased_body_gets_its_case_back(tmp_path):
    """An issue title typed lower-case, then a body with capitals: the input is not lower-cased as a whole
    (its rules keep their case), so only the title line is recased, and only when it names an error."""
    title = ("valueerror: asking to pad but the tokenizer does not have a padding token. please select a token "
             "to use as pad_token (tokenizer.pad_token = tokenizer.eos_token e.g.) or add a new pad token via to\n")
    report = explain_text(tmp_path, title + "\nI hit this with the example script.\n")
    assert report.findings and report.findings[0].cause == "train.tokenizer_setup"
    assert report.findings[0].evidence[0].text == title.strip()  # quoted as pasted
    # the same title below the first line is prose of a cased input: left as it is (no rule reads it; the
    # last failure line may still get a labelled guess)
    report = explain_text(tmp_path, "I hit this with the example script.\n" + title)
    assert not [f for f in report.findings if f.rule not in ("guess", "differential")]


def test_a_lower_cased_title_behind_a_container_prefix_gets_its_case_back(tmp_path):
    """kubelet's CRI tag (`2024-05-01T10:00:00.123Z stdout F `) carries capitals: the title after it is
    what is lower-case, and what is recased; the prefix stays as it was."""
    cri = "2024-05-01T10:00:00.123Z stdout F "
    title = "valueerror: your setup doesn't support bf16/gpu. you need torch>=1.10, using ampere gpu with cuda>=11.0\n"
    report = explain_text(tmp_path, cri + title + cri + "\n" + cri + "> Do you use a V100? It has no bf16.\n")
    assert report.findings and report.findings[0].cause == "env.bf16_unsupported"
    assert report.findings[0].evidence[0].text == (cri + title).strip()  # quoted as pasted


def test_a_title_is_recased_only_when_it_names_an_error():
    calls = []

    def factory():
        calls.append(1)
        return recaser_for(load_rules())

    block = b"loading checkpoint shards: 100%\nRuntimeError: x\n"
    assert reader.recase_title(block, factory) == (block, None) and not calls  # no error word: vocabulary not built
    block = b"\n  runtimeerror: cuda out of memory. tried to allocate 2.00 gib\nPlease help\n"
    cased, lineno = reader.recase_title(block, factory)
    assert lineno == 2 and len(cased) == len(block) and b"RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB" in cased
    assert cased.endswith(b"Please help\n")


@pytest.mark.parametrize("raw, text", [
    ("  12  Traceback (most recent call last):", "Traceback (most recent call last):"),
    ("12\tRuntimeError: CUDA error: device-side assert triggered", "RuntimeError: CUDA error: device-side assert triggered"),
    ("  7 | torch.OutOfMemoryError: CUDA out of memory.", "torch.OutOfMemoryError: CUDA out of memory."),
    ("In [7]: trainer.train()", "trainer.train()"),
    (">>> import torch", "import torch"),
    # a version or a CSV row after the number is no table cell
    ("  10  2.4.1+cpu", "2.4.1+cpu"),
    ("   4  0, NVIDIA GeForce RTX 3090, 92, 176.10 W, 885 MHz, Active, Active", "0, NVIDIA GeForce RTX 3090, 92, 176.10 W, 885 MHz, Active, Active"),
    # kept: a notebook table row, srun's rank label (peeled as a rank), a progress bar
    ("50  No log  0.693147", "50  No log  0.693147"),
    ("50\t0.693100", "50\t0.693100"),
    ("20  0.5  1.25", "20  0.5  1.25"),
    ("3: RuntimeError: x", "RuntimeError: x"),
])
def test_line_numbers_and_prompts_are_peeled(raw, text):
    assert reader.normalise(raw)[0] == text


def test_srun_label_is_still_a_rank():
    assert reader.normalise("3: RuntimeError: x")[2] == 3


@pytest.mark.parametrize("raw", [
    "Jan 30 17:40:12 kernel: NVRM: Xid (PCI:0008:01:00): 74, pid=1, name=python, NVLink: fatal error",
    "Jan 30 17:40:12 node07 kernel: NVRM: Xid (PCI:0008:01:00): 74, pid=1, name=python, NVLink: fatal error",
    "[Thu Jan 30 17:40:12 2025] NVRM: Xid (PCI:0008:01:00): 74, pid=1, name=python, NVLink: fatal error",
])
def test_kernel_lines_with_or_without_host_keep_their_nvrm_tag(raw):
    text, _, _, stamp, _ = reader.normalise(raw)
    assert text.startswith("NVRM: Xid (PCI:0008:01:00): 74") and stamp


def test_backquotes_and_dunders_are_optional_in_patterns():
    import regex

    pattern = paste_tolerant(r"Assertion `(?P<assertion>[^`]+)` failed")
    assert regex.search(pattern, "Assertion `t >= 0 && t < n_classes` failed")
    assert regex.search(pattern, "Assertion t >= 0 && t < n_classes failed").group("assertion") == "t >= 0 && t < n_classes"
    dunder = paste_tolerant(r"[/\\]torch[/\\]__init__\.py")
    assert regex.search(dunder, "/venv/torch/__init__.py") and regex.search(dunder, "/venv/torch/init.py")
    # the prefilter literal derived from the tolerant pattern is still in both forms of the line
    lits = derive_literals(r"Assertion `(?P<assertion>[^`]+)` failed")
    assert lits and all(t in "Assertion t >= 0 failed" for t, _ in lits)


def test_recasing_changes_only_the_case(recaser):
    """Any mix of vocabulary, digits and other bytes keeps its length and its lower-case form."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    words = sorted(recaser.table)
    piece = st.one_of(st.sampled_from(words).map(lambda w: w.replace(b"#", b"7")), st.binary(max_size=8),
                      st.integers(0, 10**6).map(lambda n: str(n).encode()))

    @settings(max_examples=300, deadline=None)
    @given(st.lists(piece, max_size=8))
    def check(parts):
        text = b" ".join(parts).lower()
        out = recaser.recase(text)
        assert len(out) == len(text) and out.lower() == text

    check()


def test_a_long_log_whose_first_block_is_only_dicts_and_bars_keeps_the_case_of_its_traceback(tmp_path):
    """A Trainer log whose first 512 KiB hold only metric dicts and progress bars (no upper-case letter:
    judged lower-cased), then a mixed-case OOM: the later lines that have upper-case letters are not
    recased (`Of the Allocated memory` lost the fragmentation figures and read as capacity)."""
    from loradoctor.logs import engine

    oom = (ROOT / "fixtures/logs/oom-fragmentation/pos-rocm-hip-mi250-cached.log").read_text(encoding="utf-8")
    lines = []
    for i in range(1, 9000):
        lines.append(f"{{'loss': {1.5 - i * 0.0001:.4f}, 'grad_norm': 0.51, 'learning_rate': 4e-06, 'epoch': {i / 9000:.2f}}}\n")
        lines.append(f" {i * 100 // 9000}%|▏         | {i}/9000 [09:41<7:39:20, 15.29s/it]\n")
    path = tmp_path / "long.log"
    path.write_text("".join(lines) + oom, encoding="utf-8")
    assert path.stat().st_size > engine.FIRST_BLOCK_BYTES
    report = engine.explain([str(path)])
    assert report.facts.get("oom.allocated_bytes") == 50530290237
    assert report.findings[0].cause == "oom.fragmentation"
    assert report.facts.get("metrics.first_loss") == 1.4999


def test_a_word_boundary_also_falls_between_cjk_and_ascii():
    """Chinese and Japanese writers glue English to their own words (`微调时显存OOM了`, `报错RuntimeError`);
    `re` counts CJK characters as \\w, so the rules' \\b is widened when a pattern is compiled. It only adds
    boundaries: the same pattern still refuses a word inside a word, and a `\\b` in a class or escaped stays."""
    import re

    from loradoctor.logs.rules.literals import wide_boundaries

    oom = re.compile(wide_boundaries(r"\bCUDA OOM\b"))
    assert oom.search("报错CUDA OOM了") and oom.search("got CUDA OOM.") and not oom.search("xCUDA OOMs")
    # a group whose every alternative starts with a letter, an optional first atom, a lookbehind
    grows = re.compile(wide_boundaries(r"\bmemory\b[^.]{0,20}?\b(?:keeps growing|grows)"))
    assert grows.search("显存memory一直grows")
    assert not grows.search("显存memory一直xgrows")
    unsure = re.compile(wide_boundaries(r"(?<!\bno )\b(?:more than )?\d+ steps\b"))
    assert unsure.search("跑了300 steps之后") and not unsure.search("no 300 steps")
    # what a \b is not: a backspace in a class, an escaped backslash before a b
    assert wide_boundaries(r"[\b]x") == r"[\b]x" and wide_boundaries(r"a\\b") == r"a\\b"
    assert wide_boundaries(r"[]\b]") == r"[]\b]"
    # no boundary is added inside an ASCII word or between two CJK characters
    word = re.compile(wide_boundaries(r"\bOOM\b"))
    assert not word.search("ROOM") and not word.search("OOMs") and word.search("显OOM存")
    assert not re.search(wide_boundaries(r"显\b存"), "显存")


def test_a_glued_cjk_title_is_read_by_a_rule_with_word_boundaries(tmp_path):
    report = explain_text(tmp_path, "微调Qwen2-VL时报错CUDA OOM了，batch size已经是1\n")
    assert report.findings and report.findings[0].cause == "oom.capacity"


def _known_misses(folder: Path) -> set:
    """The cases a round's expect.yaml admits are not recognised (`known_miss`): they may quote nothing."""
    import yaml

    expect = folder / "expect.yaml"
    if not expect.is_file():
        return set()
    data = yaml.safe_load(expect.read_text(encoding="utf-8")) or {}
    return {name for name, want in data.items() if isinstance(want, dict) and want.get("known_miss")}


def _lowered_pastes() -> list:
    root = ROOT / "fixtures" / "pastes"
    found = [p for p in sorted(root.rglob("*.log")) if reader.is_lowered(p.read_bytes()[: 1 << 20])]
    misses = {folder: _known_misses(folder) for folder in {p.parent for p in found}}
    return [p for p in found if p.name not in misses[p.parent]][:40]


@pytest.mark.parametrize("path", _lowered_pastes(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_evidence_of_a_lowered_paste_quotes_it_as_pasted(path):
    """The rules read a lower-cased paste with the vocabulary's case given back; what the report quotes
    is the user's own line (the evidence is found in the file, lower-case)."""
    from loradoctor.logs.engine import explain

    report = explain([str(path)])
    pasted = path.read_text(encoding="utf-8", errors="replace")
    quotes = [e.text for f in report.findings for e in f.evidence if e.line is not None and e.file == str(path)]
    quotes += [e.text for e in report.unrecognised_tail]
    assert quotes, "a lowered fixture paste with nothing quoted"
    for q in quotes:
        q = q[:-3] if q.endswith("...") else q
        assert q.lower() == q or q.split()[0][:4].isdigit(), q  # a timestamp prefix keeps its own capitals
        assert q in pasted or q in " ".join(pasted.split()), q


@pytest.mark.parametrize("title, cause", [
    ("CUDA Out Of Memory. Tried To Allocate 20.00 MiB", "oom.capacity"),
    ("ValueError: Asking To Pad But The Tokenizer Does Not Have A Padding Token", "train.tokenizer_setup"),
    ("Element 0 Of Tensors Does Not Require Grad And Does Not Have A Grad_fn", "train.no_grad"),
])
def test_a_title_cased_title_is_read_and_quoted_as_pasted(tmp_path, title, cause):
    """An issue title typed In Title Case matches no case-sensitive pattern: it is read with the
    vocabulary's case, like a lower-cased title, and the evidence quotes it as it was typed."""
    report = explain_text(tmp_path, title + "\n\nI get this when I run the example script.\n")
    assert report.findings and report.findings[0].cause == cause
    assert report.findings[0].evidence[0].text == title


@pytest.mark.parametrize("line, cased", [
    (b"CUDA Out Of Memory. Tried To Allocate 20.00 MiB", True),
    (b"Loss Becomes Nan After 200 Steps With Fp16", True),
    (b"RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 23.65 GiB total capacity)", False),
    (b"Loading Checkpoint Shards: 100%", False),  # three words: too few to tell
    (b"ValueError: Target modules {'q_proj'} not found in the base model. Please check the target modules", False),
])
def test_title_case_is_most_words_capitalised(line, cased):
    assert reader._title_cased(line) is cased
