"""The log reader: inputs, compression, normalisation, candidate scanning."""

import bz2
import gzip
import lzma
import sys

import pytest

from loradoctor.errors import UserError
from loradoctor.logs import reader
from loradoctor.logs.reader import Line, iter_lines, normalise, rank_from_filename, resolve_inputs
from loradoctor.logs.scan import Literal, Prefilter

from conftest import run_cli  # noqa: E402


def lines_of(path) -> list[Line]:
    return list(iter_lines(resolve_inputs([str(path)])))


TEXT = "step 1 ok\nRuntimeError: boom\nlast line\n"


@pytest.mark.parametrize("suffix,opener", [(".gz", gzip.open), (".bz2", bz2.open), (".xz", lzma.open)])
def test_compressed_files_are_read_transparently(tmp_path, suffix, opener):
    path = tmp_path / f"train.log{suffix}"
    with opener(path, "wb") as fh:
        fh.write(TEXT.encode())
    (item,) = resolve_inputs([str(path)])
    assert item.compressed == suffix.lstrip(".")
    assert [ln.text for ln in iter_lines([item])] == ["step 1 ok", "RuntimeError: boom", "last line"]
    assert item.lines == 3


def test_compression_is_detected_by_magic_bytes_not_extension(tmp_path):
    path = tmp_path / "train.log"  # gzip content, plain name
    path.write_bytes(gzip.compress(TEXT.encode()))
    (item,) = resolve_inputs([str(path)])
    assert item.compressed == "gz"
    assert lines_of(path)[1].text == "RuntimeError: boom"


def test_undecodable_bytes_are_replaced(tmp_path):
    path = tmp_path / "x.log"
    path.write_bytes(b"ok \xff\xfe caf\xc3\xa9\n")
    (line,) = lines_of(path)
    assert line.text == "ok \ufffd\ufffd café"


def test_ansi_colours_are_stripped():
    text, original, *_ = normalise("\x1b[1;31mRuntimeError\x1b[0m: \x1b[33mboom\x1b[0m")
    assert text == "RuntimeError: boom"
    assert "\x1b" not in original


def test_cr_progress_redraws_collapse_to_last_state_and_keep_glued_dict():
    raw = " 10%|█         | 1/10 [00:01<00:09,  1.0it/s]\r 20%|██        | 2/10 [00:02<00:08,  1.0it/s]{'loss': 0.7, 'epoch': 0.2}"
    text, *_ = normalise(raw)
    assert text == "{'loss': 0.7, 'epoch': 0.2}"
    text, *_ = normalise(" 10%|█   | 1/10 [00:01<00:09]\r 20%|██  | 2/10 [00:02<00:08]\r")
    assert text.startswith("20%|") and "\r" not in text


def test_tqdm_write_clears_bar_then_prints_dict(tmp_path):
    path = tmp_path / "t.log"
    path.write_bytes(b" 5%|x  | 5/100 [00:01<00:19, 4.9it/s]\r                  \r{'loss': 1.5}\n")
    assert [ln.text for ln in lines_of(path)] == ["{'loss': 1.5}"]


def test_crlf_line_endings(tmp_path):
    path = tmp_path / "win.log"
    path.write_bytes(b"first\r\nRuntimeError: x\r\n")
    assert [ln.text for ln in lines_of(path)] == ["first", "RuntimeError: x"]


def test_rich_traceback_box_characters_are_removed():
    assert normalise("│ /venv/transformers/trainer.py:1555 in train                     │")[0] == \
        "/venv/transformers/trainer.py:1555 in train"
    assert normalise("╭─────── Traceback (most recent call last) ────────╮")[0] == "Traceback (most recent call last)"


@pytest.mark.parametrize("raw,text,rank", [
    ("[rank3]: RuntimeError: x", "RuntimeError: x", 3),
    ("[default0]:RuntimeError: x", "RuntimeError: x", 0),
    ("rank7: RuntimeError: x", "RuntimeError: x", 7),
    ("[default1]:[rank1]: RuntimeError: x", "RuntimeError: x", 1),
])
def test_rank_prefixes_become_metadata(raw, text, rank):
    got, original, got_rank, _, _ = normalise(raw)
    assert (got, got_rank) == (text, rank)
    assert original == raw  # evidence quotes the original line


@pytest.mark.parametrize("raw,stamp,time_s", [
    ("May 18 19:02:39 host kernel: NVRM: Xid (PCI:0000:05:00): 79", "May 18 19:02:39", None),
    ("[ 5107.644336] NVRM: Xid (PCI:0000:05:00): 79", "[ 5107.644336]", 5107.644336),
    ("[Sun Feb 23 16:24:18 2025] NVRM: Xid (PCI:0000:05:00): 79", "[Sun Feb 23 16:24:18 2025]", 1740327858.0),
    ("2025-02-23T16:24:18.500Z NVRM: Xid (PCI:0000:05:00): 79", "2025-02-23T16:24:18.500Z", 1740327858.5),
    ("2025-02-23 16:24:18,250 - NVRM: Xid (PCI:0000:05:00): 79", "2025-02-23 16:24:18,250", 1740327858.25),
    ("16:24:18 NVRM: Xid (PCI:0000:05:00): 79", "16:24:18", 16 * 3600 + 24 * 60 + 18.0),
])
def test_timestamps_are_recognised_and_removed(raw, stamp, time_s):
    text, _, _, got_stamp, got_time = normalise(raw)
    assert text == "NVRM: Xid (PCI:0000:05:00): 79"
    assert got_stamp == stamp
    if time_s is not None:
        assert got_time == pytest.approx(time_s)
    else:
        assert got_time is not None


def test_overlong_lines_are_truncated(tmp_path):
    path = tmp_path / "long.log"
    path.write_bytes(b"x" * 100_000 + b"\nshort\n")
    got = lines_of(path)
    assert len(got[0].text) == reader.MAX_LINE_CHARS
    assert got[1].text == "short" and got[1].lineno == 2


def test_binary_file_is_refused_with_clear_message(tmp_path):
    path = tmp_path / "model.bin"
    path.write_bytes(b"\x00\x01\x02PK\x03\x04" * 1000)
    with pytest.raises(UserError, match="binary"):
        resolve_inputs([str(path)])
    gz = tmp_path / "model.log.gz"
    gz.write_bytes(gzip.compress(b"\x00\x00\x07\x08" * 1000))
    with pytest.raises(UserError, match="binary"):
        resolve_inputs([str(gz)])


def test_missing_and_directory_inputs(tmp_path):
    with pytest.raises(UserError, match="no such file"):
        resolve_inputs([str(tmp_path / "nope.log")])
    with pytest.raises(UserError, match="no log files"):
        resolve_inputs([str(tmp_path)])
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "node0_rank7.txt").write_text("RuntimeError: seven\n")
    (tmp_path / "rank3.log").write_text("RuntimeError: three\n")
    (tmp_path / "rank1.log.gz").write_bytes(gzip.compress(b"RuntimeError: one\n"))
    (tmp_path / "weights.bin").write_bytes(b"\x00" * 100)  # skipped inside folders
    (tmp_path / ".hidden.log").write_text("no\n")
    items = resolve_inputs([str(tmp_path)])
    assert sorted(i.rank for i in items) == [1, 3, 7]
    assert {i.path.rsplit("/", 1)[-1] for i in items} == {"node0_rank7.txt", "rank3.log", "rank1.log.gz"}
    texts = {ln.text: ln.rank for ln in iter_lines(items)}
    assert texts == {"RuntimeError: seven": 7, "RuntimeError: three": 3, "RuntimeError: one": 1}


def test_rank_from_filename():
    assert rank_from_filename("rank3.log") == 3
    assert rank_from_filename("node0_rank7.txt") == 7
    assert rank_from_filename("logs/train-rank-12.out") == 12
    assert rank_from_filename("train.log") is None
    assert rank_from_filename("frank1.log") is None


def test_utf16_log_is_transcoded(tmp_path):
    path = tmp_path / "ps.log"
    path.write_bytes("hello\r\nWindows has stopped this device (Code 43)\r\n".encode("utf-16"))
    assert [ln.text for ln in lines_of(path)] == ["hello", "Windows has stopped this device (Code 43)"]


def test_stdin_via_api(monkeypatch, tmp_path):
    import io

    data = gzip.compress(b"a\nRuntimeError: from stdin\n")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    (item,) = resolve_inputs(["-"])
    assert [ln.text for ln in iter_lines([item])] == ["a", "RuntimeError: from stdin"]
    assert item.compressed == "gz" and item.bytes == len(gzip.decompress(data))  # stdin: text bytes read


def test_stdin_via_cli_or_api():
    proc = run_cli("explain", "-", "--format", "json", input="RuntimeError: CUDA error: device-side assert triggered\n")
    if proc.returncode == 2 and "No such command" in proc.stderr:
        pytest.skip("explain CLI not wired yet")
    assert proc.returncode in (0, 1), proc.stderr
    assert "<stdin>" in proc.stdout


def test_block_boundaries_keep_line_numbers(tmp_path):
    path = tmp_path / "many.log"
    lines = [f"line {i}" for i in range(1, 5001)]
    lines[3999] = "RuntimeError: needle"
    path.write_text("\n".join(lines) + "\n")
    (item,) = resolve_inputs([str(path)])
    got = [(ln.lineno, ln.text) for ln in iter_lines([item]) if "needle" in ln.text]
    assert got == [(4000, "RuntimeError: needle")]
    # the same with tiny blocks through the candidate scanner
    pre = Prefilter([Literal("needle")])
    lineno = 0
    found = []
    for block in reader.iter_blocks(item, block_bytes=1000):
        pos = 0
        count = 0
        for seg in pre.candidates(block):
            count += block.count(b"\n", pos, seg.line_start)
            pos = seg.line_start
            found.append(lineno + count + 1)
        lineno += count + block.count(b"\n", pos)
    assert found == [4000] and lineno == 5000


def test_prefilter_finds_literals_case_rules_and_frequent_anchors():
    block = (b"aaa\n" + b"E" * 10000 + b"\nfoo Error bar\r 5%|x| [00:01]\nno match\nKILLED here\n")
    pre = Prefilter([Literal("Error"), Literal("killed", ignore_case=True)])
    segs = pre.candidates(block)
    texts = [block[s.start:s.end] for s in segs]
    assert texts == [b"foo Error bar", b"KILLED here"]


def test_progress_bar_and_metric_lines_are_not_candidates():
    bars = "".join(f"\r{i:3d}%|#   | {i}/100 [00:{i % 60:02d}<01:00,  2.00it/s]" for i in range(100))
    dicts = "".join(f"{{'loss': 1.{i}, 'grad_norm': 0.5, 'learning_rate': 2e-05, 'epoch': 0.1}}\n" for i in range(50))
    block = (bars + "\n" + dicts + "RuntimeError: CUDA error: device-side assert triggered\n").encode()
    pre = Prefilter([Literal("RuntimeError"), Literal("device-side assert", ignore_case=True), Literal("NCCL"),
                     Literal("torch", ignore_case=True), Literal("Killed")])
    pre.plan(block)
    segs = pre.candidates(block)
    assert [block[s.start:s.end] for s in segs] == [b"RuntimeError: CUDA error: device-side assert triggered"]


def test_case_insensitive_literal_is_not_dropped_for_a_case_sensitive_one():
    pre = Prefilter([Literal("rror"), Literal("error", ignore_case=True)])
    block = b"ok\nFATAL ERROR HERE\nxx\n"
    assert [block[s.start:s.end] for s in pre.candidates(block)] == [b"FATAL ERROR HERE"]


def test_html_escaped_block_is_unescaped():
    from loradoctor.logs.reader import unescape_html

    raw = b'  File "train.py", line 3, in &lt;module&gt;\n{&#39;loss&#39;: 1.2} &quot;x&quot; &amp;&amp;\n'
    assert unescape_html(raw) == b'  File "train.py", line 3, in <module>\n{\'loss\': 1.2} "x" &&\n'
    plain = b"a && b; x = &y\n"  # no escaped markup: left alone
    assert unescape_html(plain) is plain


def test_markdown_quote_markers_are_peeled():
    from loradoctor.logs.reader import normalise

    text, original, rank, _, _ = normalise("> [rank1]: torch.OutOfMemoryError: CUDA out of memory.")
    assert text == "torch.OutOfMemoryError: CUDA out of memory." and rank == 1
    assert normalise(">>   File \"x.py\", line 1")[0] == 'File "x.py", line 1'
    # a numbered view of a reply: the line number, then the quote marker
    assert normalise("  12  > RuntimeError: CUDA error: out of memory")[0] == "RuntimeError: CUDA error: out of memory"
    assert reader.peel_table_line("   6  > | NVIDIA-SMI 535.183.01     Driver Version: 535.183.01 |")[0] \
        == "| NVIDIA-SMI 535.183.01     Driver Version: 535.183.01 |"


@pytest.mark.parametrize("line,rank", [
    ("trainer-1  | torch.OutOfMemoryError: CUDA out of memory.", None),
    ("proj_trainer_1 | torch.OutOfMemoryError: CUDA out of memory.", None),
    ("2024-05-01T10:00:00.123456Z stdout F torch.OutOfMemoryError: CUDA out of memory.", None),
    ("worker-0: torch.OutOfMemoryError: CUDA out of memory.", None),
    ("10.0.0.12: torch.OutOfMemoryError: CUDA out of memory.", None),
    ("3: torch.OutOfMemoryError: CUDA out of memory.", 3),
])
def test_launcher_and_container_prefixes_are_peeled(line, rank):
    from loradoctor.logs.reader import normalise

    text, _, got_rank, _, _ = normalise(line)
    assert text == "torch.OutOfMemoryError: CUDA out of memory." and got_rank == rank


@pytest.mark.parametrize("line", [
    "2024-05-01t10:00:00.123456z stdout f torch.outofmemoryerror: cuda out of memory.",
    "2024-05-01 10:00:00,123 - torch.outofmemoryerror: cuda out of memory.",
    "jan 30 17:40:12 gpu01 kernel: torch.outofmemoryerror: cuda out of memory.",
    "[mon jan 30 17:40:12 2024] torch.outofmemoryerror: cuda out of memory.",
])
def test_prefixes_of_a_lower_cased_paste_are_peeled(line):
    """A paste lower-cased whole (a search snippet, an issue title) keeps its timestamps and stream tags
    in lower case: `t`/`z` of ISO times, kubelet's `stdout f`, syslog and `dmesg -T` month names."""
    from loradoctor.logs.reader import normalise

    text, _, _, stamp, time_s = normalise(line)
    assert text == "torch.outofmemoryerror: cuda out of memory." and stamp and time_s


def test_prefix_peeling_keeps_real_text():
    from loradoctor.logs.reader import normalise

    for keep in ("RuntimeError: CUDA error: out of memory", "Epoch    | Step | loss", "| 10 | nan |",
                 "1:2 ratio", "node: v18.2.0", "12: ", "host_name: gpu01", "may 12 be the day: yes",
                 "the 30 17:40:12 x: y"):
        assert normalise(keep)[0] == keep.strip()


WRAP_TEXT = (
    "Traceback (most recent call last):\n"
    '  File "/home/u/train.py", line 88, in <module>\n'
    "RuntimeError: Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu! "
    "(when checking argument for argument mat1 in method wrapper_CUDA_addmm)\n"
    "ValueError: Attempting to unscale FP16 gradients. This happens when the optimizer holds float16 master weights "
    "and the loss scaler tries to unscale them.\n"
    "done\n"
)


def _fold(text: str, width: int) -> str:
    out = []
    for line in text.splitlines():
        out += [line[i:i + width] for i in range(0, max(1, len(line)), width)]
    return "\n".join(out) + "\n"


def test_hard_wrapped_console_copy_is_rejoined_with_physical_line_numbers(tmp_path):
    from loradoctor.logs.engine import explain
    from loradoctor.logs.reader import detect_wrap_width

    folded = _fold(WRAP_TEXT, 80)
    assert detect_wrap_width(folded.encode()) == 80
    log = tmp_path / "console.log"
    log.write_text(folded)
    report = explain([str(log)])
    first = report.findings[0]
    assert first.cause == "train.device_mismatch"
    assert first.evidence[0].line == 3  # the physical line where the message starts
    assert report.inputs[0]["wrap_width"] == 80 and report.inputs[0]["lines"] == len(folded.splitlines())


@pytest.mark.parametrize("text", [
    # a long warning repeated every step, longer than everything else: no wrap
    ("/opt/venv/lib/python3.11/site-packages/torch/utils/checkpoint.py:86: UserWarning: " + "x" * 57 + "\n"
     "step line\n") * 6,
    # records of one format and width (kernel asserts with thread numbers, metric dicts)
    "".join(f"Indexing.cu:1289: indexSelectLargeIndex: block: [212,0,0], thread: [{50 + i},0,0] Assertion failed.\n"
            for i in range(8)),
    "".join(f"{{'loss': 0.{i}000, 'grad_norm': nan, 'learning_rate': 4.9{i}e-05, 'epoch': 0.0{i}}}\n" for i in range(8)),
    # fixed-width tables (memory_summary, nvidia-smi) and progress bars
    "|" + "=" * 78 + "|\n" + "".join(f"| Allocated memory {i} " + " " * 57 + "|\n" for i in range(6)),
])
def test_same_width_lines_that_are_not_a_wrap(text):
    from loradoctor.logs.reader import detect_wrap_width

    assert detect_wrap_width(text.encode()) is None


def test_a_wrap_that_falls_on_a_space_is_still_a_wrap(tmp_path):
    """A console cut just before a space leaves that space at the head of the next line: the line is a
    continuation all the same (a frame or an indented record has two spaces or more)."""
    from loradoctor.logs.engine import explain
    from loradoctor.logs.reader import detect_wrap_width

    line = ('Error running job: [WinError 126] The specified module could not be found. Error loading '
            '"D:\\train\\venv\\Lib\\site-packages\\torch\\lib\\c10_cuda.dll" or one of its dependencies.')
    folded = _fold("Running 1 job\n" + line + "\n", 80)
    assert [len(x) for x in folded.splitlines()][1:3] == [80, 80] and folded.splitlines()[2].startswith(" ")
    assert detect_wrap_width(folded.encode()) == 80
    log = tmp_path / "job.log"
    log.write_text(folded)
    report = explain([str(log)])
    assert report.inputs[0]["wrap_width"] == 80
    assert report.findings and report.findings[0].cause == "env.torch_broken"
    # two spaces or more: an indented line after a full-width one (a frame, a list), not a wrap
    indented = ("x" * 79 + "y\n  File \"train.py\", line 3, in <module>\n") * 3
    assert detect_wrap_width(indented.encode()) is None


def test_a_wrap_that_starts_after_a_progress_bar_is_joined():
    """Text glued after a tqdm bar (no newline between them) that reaches the width is wrapped like any line;
    a bar alone padded to the width, or a bar line that ends at a table edge, is not joined."""
    from loradoctor.logs.reader import join_wrapped

    glued = "Loading checkpoint shards:   0%|          | 0/2 [00:00<?, ?it/s]Error named symb"
    assert len(glued) == 80
    joined, joins, tail = join_wrapped((glued + "\nol not found at line 117\n").encode(), 80)
    assert joined == (glued + "ol not found at line 117\n").encode() and joins == [80] and tail == b""
    # a bar cut inside its counter, before its `[...]` (tqdm ends every bar with one)
    counter = "2024-05-01T10:00:00.123Z stdout F Loading checkpoint shards:   0%|          | 0/"
    assert len(counter) == 80
    joined, joins, tail = join_wrapped((counter + "\n3 [00:00<?, ?it/s]KeyError: 'qwen3'\n").encode(), 80)
    assert joins == [80]
    alone = "Loading checkpoint shards:  50%|█████     | 1/2 [00:21<00:21, 10.77s/it]".ljust(80)
    boxed = ("Loading checkpoint shards:   0%|          | 0/2 [00:00<?, ?it/s] | x" + " " * 80)[:79] + "|"
    for line in (alone, boxed):
        assert len(line) == 80
        assert join_wrapped((line + "\nnext line\n").encode(), 80)[1] == []


NCCL_CUT = ("[rank2]:[E0611 02:40:11.771091857 ProcessGroupNCCL.cpp:627] [Rank 2] To avoid da",
            "ta inconsistency, we are taking the entire process down.")


def test_a_single_wrapped_line_through_a_rule_message_is_a_wrap(tmp_path):
    """One full-width line is too few to count as a wrap, unless a rule's pattern matches it joined with the
    next line across the cut (and neither alone): then the paste is rejoined, line numbers physical."""
    from loradoctor.logs.engine import explain

    assert len(NCCL_CUT[0]) == 80
    log = tmp_path / "short.log"
    log.write_text("{'loss': 0.9127, 'grad_norm': 0.38, 'learning_rate': 0.000142, 'epoch': 0.77}\n"
                   + "\n".join(NCCL_CUT) + "\n")
    report = explain([str(log)])
    assert report.inputs[0]["wrap_width"] == 80
    assert report.findings[0].cause == "dist.nccl_timeout" and report.findings[0].evidence[0].line == 2


ROCM_CUT = ("rocBLAS error: Cannot read /opt/rocm/lib/rocblas/library/TensileLibrary.dat: No ",
            "such file or directory for GPU arch : gfx1031")


@pytest.mark.parametrize("lines,cause", [
    # the cut fell just after a space: the message is still cut in two
    (ROCM_CUT, "env.arch_unsupported"),
    # a lower-cased paste: the rules read the two lines with their case given back
    (("valueerror: cannot use apply_chat_template because this processor does not have ",
      "a chat template. (qwen2-vl-2b base, lora sft)"), "train.tokenizer_setup"),
])
def test_a_single_line_wrapped_after_a_space_through_a_rule_message_is_a_wrap(tmp_path, lines, cause):
    from loradoctor.logs.engine import explain

    assert len(lines[0]) == 80
    log = tmp_path / "short.log"
    log.write_text("$ python train_lora.py\n" + "\n".join(lines) + "\n")
    report = explain([str(log)])
    assert report.inputs[0]["wrap_width"] == 80
    assert report.findings[0].cause == cause and report.findings[0].evidence[0].line == 2


@pytest.mark.parametrize("pair", [
    # the message is whole on the second line: joining adds nothing a rule looks for
    ("x" * 80, "[Rank 2] To avoid data inconsistency, we are taking the entire process down."),
    # a cut next to a space is no cut through a word
    (NCCL_CUT[0][:79] + " ", NCCL_CUT[1]),
    ("a" * 80, " " + NCCL_CUT[1]),
    # a line padded with spaces to the width is no cut (one space after text is)
    (ROCM_CUT[0][:78] + "  ", ROCM_CUT[1]),
])
def test_a_single_full_width_line_is_no_wrap_without_a_message_cut_in_two(pair):
    from loradoctor.logs.engine import Matcher
    from loradoctor.logs.reader import detect_wrap_width
    from loradoctor.logs.rules import load_rules

    assert len(pair[0]) == 80
    matcher = Matcher(load_rules())
    assert detect_wrap_width(("short line\n" + "\n".join(pair) + "\n").encode(), matcher.crosses) is None
    assert detect_wrap_width(("short line\n" + "\n".join(NCCL_CUT) + "\n").encode(), matcher.crosses) == 80
    assert detect_wrap_width(("short line\n" + "\n".join(NCCL_CUT) + "\n").encode()) is None  # no engine: no rules


def test_typographic_quotes_are_straightened(tmp_path):
    from loradoctor.logs.engine import explain
    from loradoctor.logs.reader import straighten_quotes

    assert straighten_quotes("No module named ‘peft’ “x”".encode()) == b"No module named 'peft' \"x\""
    plain = "a — b … c".encode()
    assert straighten_quotes(plain) is plain
    log = tmp_path / "word.log"
    log.write_text("ImportError: cannot import name ‘EncoderDecoderCache’ from ‘transformers’ (/venv/lib/python3.10/"
                   "site-packages/transformers/__init__.py)\n", encoding="utf-8")
    assert explain([str(log)]).findings[0].cause == "env.version_conflict"


def test_a_line_of_percent_encoded_spaces_is_decoded(tmp_path):
    """A message copied from a URL (`libtorch_cuda.so:%20undefined%20symbol:%20...`) reads as words; a URL that
    names a file with spaces, a line with one `%20` and a line that has spaces of its own are left as they are."""
    from loradoctor.logs.engine import explain
    from loradoctor.logs.reader import unquote_spaces

    assert unquote_spaces(b"import error\nlibtorch_cuda.so:%20undefined%20symbol:%20ncclCommRegister\n") == \
        b"import error\nlibtorch_cuda.so: undefined symbol: ncclCommRegister\n"
    kept = (b"https://hf.co/x/resolve/main/my%20lora%20v2.safetensors\n"
            b"file%20name.txt\n"
            b"progress 50%20 steps left%20of%20it\n")
    assert unquote_spaces(kept) == kept
    plain = b"RuntimeError: CUDA error: out of memory\n"
    assert unquote_spaces(plain) is plain
    # behind a paste's prefix (a reply's quote, a compose service, a line number): the run itself is decoded
    for prefix in (b"> ", b"trainer-1  | ", b"  12  "):
        assert unquote_spaces(prefix + b"libtorch_cuda.so:%20undefined%20symbol:%20x\n") == \
            prefix + b"libtorch_cuda.so: undefined symbol: x\n"
    log = tmp_path / "url.log"
    log.write_text("import error\n\nlibtorch_cuda.so:%20undefined%20symbol:%20ncclCommRegister\n", encoding="utf-8")
    report = explain([str(log)])
    assert report.findings[0].cause == "env.torch_broken"
    assert report.findings[0].evidence[0].text == "libtorch_cuda.so: undefined symbol: ncclCommRegister"


def test_percent_encoded_lines_are_decoded_only_near_the_start_of_an_input(tmp_path):
    """A %20-encoded line is a paste of a few lines: blocks that start past UNQUOTE_BYTES are not searched."""
    from loradoctor.logs import reader

    encoded = b"libtorch_cuda.so:%20undefined%20symbol:%20ncclCommRegister\n"
    filler = b"step 1 loss 2.0\n" * ((reader.UNQUOTE_BYTES + (64 << 10)) // 16 + 1)
    path = tmp_path / "big.log"
    path.write_bytes(encoded + filler + encoded)
    item = reader.resolve_inputs([str(path)])[0]
    text = b"".join(reader.iter_blocks(item, block_bytes=64 << 10))
    assert text.startswith(b"libtorch_cuda.so: undefined symbol: ncclCommRegister\n")
    assert text.endswith(encoded)
    assert len(text) == len(encoded) + len(filler) + len(encoded) - 3 * 2  # three `%20` became spaces


def test_a_wrap_through_repeated_frame_paths_is_detected():
    """Six frames under one long site-packages path are cut at the same column: one distinct full-width line.
    The share of full-width lines compares distinct lines with distinct lines (it compared 2 distinct with
    15 counted, and the 80-column wrap of a short traceback went unseen)."""
    from loradoctor.logs import reader

    path = "/home/user/miniconda3/envs/llm/lib/python3.10/site-packages/torch/distributed/"
    frames = "".join(f'  File "{path}{name}.py", line {n}, in {fn}\n    {code}\n' for name, n, fn, code in (
        ("c10d_logger", 75, "wrapper", "return func(*args, **kwargs)"),
        ("distributed_c10d", 1305, "init_process_group", "store, rank, world_size = next(rendezvous_iterator)"),
        ("rendezvous", 234, "_env_rendezvous_handler", 'rank = int(_get_env_or_raise("RANK"))'),
        ("rendezvous", 219, "_get_env_or_raise", "raise _env_error(env_var)"),
        ("elastic/utils/store", 64, "synchronize", "agent_data = get_all(store, rank, key_prefix, world_size)"),
        ("elastic/utils/store", 32, "get_all", "data_arr = store.multi_get([f'{prefix}{idx}' for idx in range(n)])")))
    text = ("Traceback (most recent call last):\n" + frames + "ValueError: Error initializing torch.distributed using "
            "env:// rendezvous: environment variable RANK expected, but not set\n")
    wrapped = "".join(line[i:i + 80] + "\n" for line in text.splitlines() for i in range(0, max(len(line), 1), 80))
    assert reader.detect_wrap_width(wrapped.encode()) == 80
    assert reader.detect_wrap_width(text.encode()) is None


def test_digits_blind_is_the_str_translate_it_replaces():
    import random

    from loradoctor.logs.reader import DIGITS_BLIND, digits_blind

    rng = random.Random(1)
    alphabet = "abc0123456789 é€😀\ud800\udfff\t٣"  # non-ASCII, astral, lone surrogates, an Arabic digit
    for _ in range(5000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        assert digits_blind(text) == text.translate(DIGITS_BLIND), repr(text)


def test_retain_freed_memory_only_for_big_inputs(tmp_path, monkeypatch):
    """explain sets glibc's thresholds (reader.retain_freed_memory) only when its inputs are big; the call is
    safe anywhere (False where there is no mallopt) and answers the same the second time."""
    import sys

    from loradoctor.logs import engine, reader

    calls = []
    monkeypatch.setattr(reader, "retain_freed_memory", lambda: calls.append(1) or True)
    monkeypatch.setattr(reader, "PROCESS_IS_OURS", False)  # an in-process CLI test before this one sets it
    log = tmp_path / "train.log"
    log.write_text("RuntimeError: CUDA error: an illegal memory access was encountered\n")
    monkeypatch.setattr(reader, "RETAIN_FROM_BYTES", 10)
    engine.explain([str(log)])
    assert calls == []  # explain as a library (the bedside callback in a training process): never
    monkeypatch.setattr(reader, "PROCESS_IS_OURS", True)  # as cli/explain_cmd.py sets it
    monkeypatch.setattr(reader, "RETAIN_FROM_BYTES", 64 << 20)
    engine.explain([str(log)])
    assert calls == []  # a small input: never
    monkeypatch.setattr(reader, "RETAIN_FROM_BYTES", 10)
    engine.explain([str(log)])
    assert calls == [1]
    monkeypatch.undo()
    first = reader.retain_freed_memory()
    assert reader.retain_freed_memory() is first
    if sys.platform.startswith("linux") and "glibc" in " ".join(__import__("platform").libc_ver()):
        assert first is True


def test_a_table_wider_than_the_console_is_rejoined_row_by_row():
    """An 89-column nvidia-smi table in an 80-column console: each row is cut after a table edge it starts
    with and ends on the next line (`| NVIDIA-SMI ... CUDA Version: 1` + `2.2     |`); rows that end with an
    edge at the width (a table as wide as the console) are whole rows and stay as they are."""
    from loradoctor.logs.reader import detect_wrap_width, join_wrapped

    rows = ["+" + "-" * 87 + "+",
            "| NVIDIA-SMI 535.104.05             Driver Version: 535.104.05   CUDA Version: 12.2     |",
            "|   0  NVIDIA L4                      Off | 00000000:00:03.0 Off |                    0 |",
            "| N/A   52C    P0              28W /  72W |  22384MiB / 23034MiB |      0%      Default |",
            "|    0   N/A  N/A      1402      C   /usr/bin/python3                          14502MiB |",
            "+" + "-" * 87 + "+"]
    assert {len(r) for r in rows} == {89}
    folded = "OutOfMemoryError: CUDA out of memory.\n" + "".join(r[:80] + "\n" + r[80:] + "\n" for r in rows)
    assert detect_wrap_width(folded.encode()) == 80
    joined, joins, _ = join_wrapped(folded.encode(), 80)
    assert joined.decode().splitlines()[1:] == rows and len(joins) == len(rows)
    whole = "\n".join(r[:79] + "|" for r in rows) + "\n"  # a table exactly as wide as the console
    assert detect_wrap_width(whole.encode()) is None


def test_a_bar_cut_inside_its_stats_bracket_is_a_wrap():
    """A Lightning bar with a long postfix in an 80-column console: the wrap cuts it inside `[... train_loss=`
    and `0.000]` starts the next line; a bar padded to the width (its bracket closed) stays a bar."""
    from loradoctor.logs.reader import detect_wrap_width, join_wrapped

    bars = [f"Epoch 0:   {k}%|          | {10 * k}/1000 [00:0{k}<03:58,  5.00it/s, v_num=3, train_loss=0.000]"
            for k in range(1, 7)]
    assert {len(b) for b in bars} == {85}
    folded = "".join(b[:80] + "\n" + b[80:] + "\n" for b in bars)
    assert detect_wrap_width(folded.encode()) == 80
    assert join_wrapped(folded.encode(), 80)[0].decode().splitlines() == bars
    padded = "".join(b[:74].ljust(79) + "]\n" + "next\n" for b in bars)
    assert detect_wrap_width(padded.encode()) is None


def test_unquote_spaces_looks_only_at_lines_with_a_percent_20_and_answers_as_line_by_line():
    """The block-level unquote_spaces (it visits only the lines around each `%20`) gives what decoding
    every line on its own gives, on random blocks of the pieces that matter."""
    import random

    from loradoctor.logs.reader import normalise, unquote_spaces

    def one_run(line: bytes) -> bool:  # no space, or none once normalise() peeled a paste's prefix
        return b" " not in line.strip() or (b"\r" not in line and " " not in normalise(line.decode("utf-8", "replace"))[0])

    def line_by_line(block: bytes) -> bytes:
        return b"\n".join(line.replace(b"%20", b" ") if line.count(b"%20") >= 2 and one_run(line)
                          and b"://" not in line else line for line in block.split(b"\n"))

    rng = random.Random(7)
    pieces = [b"%20", b"a", b" ", b"\n", b"://", b"%2", b"0", b"\r", b"x%20y%20z", b"\t"]
    for _ in range(5000):
        block = b"".join(rng.choice(pieces) for _ in range(rng.randint(0, 30)))
        assert unquote_spaces(block) == line_by_line(block), block


@pytest.mark.parametrize("head, tail, whole", [
    # rich word-wraps a frame's header at the box edge: the name alone on the next box line
    ("/x/deepspeed/accelerator/cuda_accelerator.py:296 in", "pin_memory",
     "/x/deepspeed/accelerator/cuda_accelerator.py:296 in pin_memory"),
    ("/x/transformers/trainer.py:1885", "in train", "/x/transformers/trainer.py:1885 in train"),
    ("/x/transformers/trainer.py:", "1885 in train", "/x/transformers/trainer.py:1885 in train"),
])
def test_a_rich_frame_header_wrapped_in_its_box_is_completed_on_its_first_line(tmp_path, head, tail, whole):
    box = [f"│ {head.ljust(60)} │", f"│ {tail.ljust(60)} │", f"│ {'':60} │"]
    log = tmp_path / "rich.log"
    log.write_text("\n".join(box) + "\nRuntimeError: CUDA error: out of memory\n", encoding="utf-8")
    lines = lines_of(log)
    assert [line.text for line in lines[:2]] == [whole, tail] and len(lines) == 4
    # a complete header, and the blank box line after it, are left alone
    assert reader.rejoin_rich_headers("\n".join([box[2], f"│ {whole} │", box[2]]).encode()) \
        == "\n".join([box[2], f"│ {whole} │", box[2]]).encode()



def _wrapped_paste(tmp_path, last: str, newline: bool):
    """A paste hard-wrapped at 80 columns (enough full-width lines to show the width) whose last message
    is `last`, folded; written with or without the final newline."""
    warn = "x" * 10 + " some warning text that is long enough to wrap at eighty columns, and more words" * 2
    text = "\n".join([warn, "a " + warn, "bb " + warn, "Traceback (most recent call last):",
                      '  File "/workspace/train.py", line 12, in <module>', "    trainer.train()", last])
    folded = []
    for line in text.split("\n"):
        while len(line) > 80:
            folded.append(line[:80])
            line = line[80:]
        folded.append(line)
    path = tmp_path / ("nl.log" if newline else "open.log")
    path.write_text("\n".join(folded) + ("\n" if newline else ""), encoding="utf-8")
    return path


@pytest.mark.parametrize("newline", [True, False])
@pytest.mark.parametrize("size", [117, 160, 240])
def test_a_wrapped_last_line_is_rejoined_whole(tmp_path, size, newline):
    """The input's last message wrapped onto two or three lines is one line again: also when its last piece
    is itself full width (160 = 80 + 80: its continuation would be in a next block that never comes), and
    when the paste does not end with a newline."""
    msg = ("RuntimeError: CUDA error: an illegal memory access was encountered while the kernel ran; " * 4)[:size]
    lines = lines_of(_wrapped_paste(tmp_path, msg, newline))
    assert lines[-1].text == msg.strip()
    assert sum(1 for ln in lines if "RuntimeError" in ln.text) == 1


def test_a_full_width_line_before_an_exception_line_is_not_joined_to_it():
    """A line exactly the console's width followed by a line that opens a record of its own (an exception,
    a traceback head, a frame) is a line of that width, not a wrap: the cut would have to fall exactly
    before the exception's name (a paste cut at 120 columns ends this way: a cut frame, then the cut error)."""
    from loradoctor.logs.reader import join_wrapped

    full = "    return F.linear(input, self.weight, self.bias) # a code line exactly eighty cols"
    full = full[:80]
    for nxt in ("RuntimeError: CUDA error: an illegal memory access was encountered",
                "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB",
                "Traceback (most recent call last):", '  File "/x/train.py", line 3, in <module>'):
        joined, joins, _ = join_wrapped((full + "\n" + nxt + "\n").encode(), 80, final=True)
        assert joins == [] and joined == (full + "\n" + nxt + "\n").encode()
    # nor before a line that starts with a log record's own header (a paste cut at 120 columns: every line
    # full width, each a record: torchrun's rank prefix, a glog line, a time stamp)
    for nxt in ("[rank3]:[E0208 13:02:44.118330007 ProcessGroupNCCL.cpp:1385] [PG ID 0 PG GUID 0",
                "E0208 13:10:45.390000 7711 torch/distributed/elastic/multiprocessing/api.py:869] failed",
                "2024-05-01 10:00:00,123 - INFO - step 10", "Mar 14 04:10:06 gpu-n4 kernel: NVRM: Xid 79"):
        assert join_wrapped((full + "\n" + nxt + "\n").encode(), 80, final=True)[1] == []
    # a continuation that is not one of those is joined
    assert join_wrapped((full + "\nnel ran out of time\n").encode(), 80, final=True)[1] == [80]


def test_a_console_wrap_by_display_columns_is_rejoined_in_chinese_text(tmp_path):
    """A terminal wraps by display columns: a CJK character takes two, so a line of Chinese wrapped at 80
    columns has fewer than 80 characters, and 79 columns when a wide character did not fit in the last one.
    Both lines are taken for the wrap they are and rejoined (tests/shapes.py: wrap80cjk)."""
    import os
    import sys

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from shapes import fold_display
    from loradoctor.logs.reader import display_width

    prose = ("训练的时候一切正常，但是在合并LoRA权重的时候报错显存溢出了，请问这是什么原因？我用的是两张3090显卡，"
             "每张24G显存，模型是Qwen-7B，合并的脚本是官方提供的merge_lora.py，报错信息如下所示")
    error = ("RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 23.69 GiB total capacity; "
             "22.91 GiB already allocated; 8.56 MiB free; 23.09 GiB reserved in total by PyTorch)")
    pasted = fold_display(prose + "\n" + error + "\n")
    physical = pasted.splitlines()
    assert any(len(line) < 80 and display_width(line) in (79, 80) for line in physical[:2])
    path = tmp_path / "cjk.log"
    path.write_text(pasted, encoding="utf-8")
    lines = lines_of(path)
    assert [ln.text for ln in lines] == [prose, error]


def test_a_line_one_column_short_is_no_wrap_unless_a_wide_character_follows():
    from loradoctor.logs.reader import join_wrapped

    short = "a" * 79
    assert join_wrapped((short + "\nnext\n").encode(), 80, final=True)[1] == []
    assert join_wrapped((short + "\n显存溢出\n").encode(), 80, final=True, display=True)[1] == [79]
    assert join_wrapped((short + "\n显存溢出\n").encode(), 80, final=True)[1] == []  # counting characters
