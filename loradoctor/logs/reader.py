"""Open log inputs and normalise their lines.

The one reader of loradoctor: files (plain, .gz, .bz2, .xz by magic bytes), folders of logs and
stdin. It reads raw bytes in large blocks cut at newlines (so a 1 GB log costs a few hundred block
reads, not 15 million line reads), and turns lines into `Line`s: ANSI colours stripped, `\\r`
progress redraws collapsed to the last state, rank prefixes and timestamps moved into metadata,
rich-traceback box characters removed, overlong lines truncated.

The engine does not normalise every line: it asks `loradoctor.logs.scan` for the candidate
segments of each block and calls `make_line` on those only. `iter_lines` normalises everything
and exists for tests and small inputs.
"""

from __future__ import annotations

import codecs
import functools
import io
import os
import re
import sys
from loradoctor.record import field, record
from pathlib import Path
from typing import BinaryIO, Callable, Iterable, Iterator, Optional

from loradoctor.lazyre import lazy_re
from loradoctor import notes
from loradoctor.logs import oswords
from loradoctor.errors import UserError

# 4 MiB blocks: large enough to amortise Python overhead; small enough that the several C passes over a
# block (split, translate, searches) find it in cache (8 MiB blocks took ~7% more CPU on the 200 MB
# benchmark log, and twice the peak RSS)
BLOCK_BYTES = 4 << 20
MAX_LINE_CHARS = 8192  # longer lines are truncated (around the interesting part)
EVIDENCE_CHARS = 400  # how much of the original line a piece of evidence quotes
SNIFF_BYTES = 64 << 10
# Compressed input is refused past either limit (a compression bomb: 4 GiB of gzip took 212 s).
# `explain --max-decompressed SIZE` sets the first and lifts the second (set_decompressed_limit).
MAX_DECOMPRESSED_BYTES = 1 << 30
# ...and past BOMB_RATIO times its own size once above BOMB_FLOOR_BYTES (real logs compress 5-50x).
BOMB_RATIO = 100
BOMB_FLOOR_BYTES = 16 << 20
_limits = {"max": MAX_DECOMPRESSED_BYTES, "ratio": True}


def read_errors() -> tuple:
    """What a read error can be: OSError (BadGzipFile included), EOFError (truncated), and the codecs' own
    once their module is loaded (only reading a compressed file loads gzip / bz2 / lzma: ~2 ms a start)."""
    errors: list = [OSError, EOFError]
    for module, name in (("lzma", "LZMAError"), ("zlib", "error")):
        loaded = sys.modules.get(module)
        if loaded is not None:
            errors.append(getattr(loaded, name))
    return tuple(errors)


def set_decompressed_limit(max_bytes: Optional[int]) -> None:
    """Read compressed input up to `max_bytes` decompressed (0: no limit), with no ratio check;
    None restores the defaults."""
    _limits["max"] = MAX_DECOMPRESSED_BYTES if max_bytes is None else max_bytes
    _limits["ratio"] = max_bytes is None

# Extensions of files we read when a folder is given; compressed variants are added below.
LOG_SUFFIXES = {".log", ".txt", ".out", ".err", ".stdout", ".stderr", ".trace", ""}
COMPRESSED_SUFFIXES = {".gz": "gz", ".bz2": "bz2", ".xz": "xz"}
MAGIC = ((b"\x1f\x8b", "gz"), (b"BZh", "bz2"), (b"\xfd7zXZ\x00", "xz"))


@record
class Line:
    """One normalised log line. `text` is what rules see; `raw` is the original line, trimmed."""

    file: str
    lineno: int  # 1-based physical line number in the (decompressed) input
    text: str
    rank: Optional[int] = None
    timestamp: Optional[str] = None
    time_s: Optional[float] = None  # seconds (epoch, uptime or seconds of day) when derivable
    raw: str = ""
    input_index: int = 0

    def quote(self) -> str:
        """The original line trimmed, for evidence."""
        text = (self.raw or self.text).strip()
        return text if len(text) <= EVIDENCE_CHARS else text[: EVIDENCE_CHARS - 3] + "..."


@record
class Input:
    """One log source: a file or stdin. `lines` and `ranks` are filled while it is read."""

    path: str  # as shown to the user
    source: Optional[Path]  # None for stdin
    bytes: int  # on disk (compressed size when compressed); stdin: decompressed bytes read
    compressed: Optional[str] = None  # "gz" | "bz2" | "xz" | None
    rank: Optional[int] = None  # from the file name (rank3.log, node0_rank7.txt)
    lines: int = 0
    ranks: set = field(default_factory=set)
    index: int = 0
    wrap_width: Optional[int] = None  # hard-wrapped at this many columns (a console copy): lines rejoined
    notes: list = field(default_factory=list)  # what the engine skipped in this input (a rule past its time budget)
    lowered: bool = False  # pasted lower-cased: the vocabulary's case was given back (Recaser)
    recased_title: Optional[int] = None  # the physical line of a lower-cased (or Title-Cased) title given its case back
    title_as_pasted: str = ""  # that title line as it was pasted (evidence quotes it so)

    def to_dict(self) -> dict:
        ranks = sorted(self.ranks | ({self.rank} if self.rank is not None else set()))
        out = {"path": self.path, "bytes": self.bytes, "lines": self.lines,
               "compressed": self.compressed, "ranks": ranks}
        if self.wrap_width:
            out["wrap_width"] = self.wrap_width
        if self.notes:
            out["notes"] = list(self.notes)
        return out


# ---------------------------------------------------------------------------------------------
# resolving inputs

_RANK_FILE_RE = lazy_re(r"(?:^|[^a-z])(?:rank|local_rank|proc|worker)[_-]?(\d{1,5})(?:\D|$)", re.I)


def rank_from_filename(name: str) -> Optional[int]:
    """`rank3.log` -> 3, `node0_rank7.txt` -> 7, `train.log` -> None."""
    m = _RANK_FILE_RE.search(Path(name).name)
    return int(m.group(1)) if m else None


def sniff_compression(head: bytes) -> Optional[str]:
    for magic, kind in MAGIC:
        if head.startswith(magic):
            return kind
    return None


_CONTROL_BYTES = bytes(b for b in range(32) if b not in (8, 9, 10, 12, 13, 27)) + b"\x7f"


def looks_binary(head: bytes) -> bool:
    """NUL bytes, or more than 10% control bytes, in the first decompressed block."""
    if not head:
        return False
    if head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return False  # UTF-16 text (PowerShell redirection); transcoded while reading
    if b"\x00" in head:
        return True
    controls = len(head) - len(head.translate(None, _CONTROL_BYTES))
    return controls > 0.10 * len(head)


def _is_log_name(path: Path) -> bool:
    name = path.name
    if name.startswith("."):
        return False
    suffix = path.suffix.lower()
    if suffix in COMPRESSED_SUFFIXES:
        suffix = Path(path.stem).suffix.lower()
    if suffix.lstrip(".").isdigit():  # rotated logs: train.log.1
        return True
    return suffix in LOG_SUFFIXES or suffix.startswith(".log")


def _open_decompressed(path: Path, kind: Optional[str]) -> BinaryIO:
    if kind == "gz":
        import gzip

        return gzip.open(path, "rb")  # type: ignore[return-value]
    if kind == "bz2":
        import bz2

        return bz2.open(path, "rb")  # type: ignore[return-value]
    if kind == "xz":
        import lzma

        return lzma.open(path, "rb")  # type: ignore[return-value]
    return open(path, "rb")


def _check_file(path: Path, shown: str, explicit: bool) -> Optional[Input]:
    """An Input for a readable text file; None for a binary file inside a folder; UserError else."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            kind = sniff_compression(fh.read(8))
        with _open_decompressed(path, kind) as fh:
            head = fh.read(SNIFF_BYTES)
    except PermissionError:
        raise UserError(f"{shown}: permission denied") from None
    except read_errors() as exc:
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        if kind and not isinstance(exc, PermissionError):
            reason += f"; a truncated or corrupt {kind} file?"
        raise UserError(f"{shown}: cannot read ({reason})") from None
    if looks_binary(head):
        if explicit:
            raise UserError(f"{shown}: looks like a binary file, not a text log (NUL or control bytes)")
        return None
    return Input(path=shown, source=path, bytes=size, compressed=kind, rank=rank_from_filename(path.name))


def resolve_inputs(paths: list[str]) -> list[Input]:
    """Expand the user's paths: folders to the log files in them (recursively, sorted), `-` to
    stdin. Raises UserError (one line) for a missing, unreadable or binary input."""
    if not paths:
        raise UserError("no input: give a log file, a folder of logs, or - for stdin")
    inputs: list[Input] = []
    stdin_seen = False
    for given in paths:
        if given == "-":
            if stdin_seen:
                raise UserError("stdin (-) given twice")
            stdin_seen = True
            inputs.append(Input(path="<stdin>", source=None, bytes=0))
            continue
        path = Path(given)
        if not path.exists():
            raise UserError(f"{given}: no such file or directory")
        if path.is_dir():
            found, skipped = [], []

            def unreadable(exc: OSError) -> None:
                skipped.append(f"{exc.filename}: folder not read ({exc.strerror or exc})")

            for root, dirs, files in os.walk(path, onerror=unreadable):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                for name in sorted(files):
                    child = Path(root) / name
                    if _is_log_name(child) and child.is_file():
                        try:
                            item = _check_file(child, str(child), explicit=False)
                        except UserError as exc:  # one unreadable file does not hide the others
                            skipped.append(f"{exc}; skipped")
                            continue
                        if item is not None:
                            found.append(item)
            for line in skipped:
                notes.add(line, level="warning")
            if not found:
                if skipped:
                    raise UserError(f"{given}: folder holds no readable log files ({len(skipped)} could not be read)")
                raise UserError(f"{given}: folder holds no log files (.log, .txt, .out, .err, or .gz/.bz2/.xz of those)")
            inputs.extend(found)
        elif path.is_file():
            inputs.append(_check_file(path, given, explicit=True))  # type: ignore[arg-type]
        else:
            raise UserError(f"{given}: not a regular file")
    for i, item in enumerate(inputs):
        item.index = i
    return inputs


# ---------------------------------------------------------------------------------------------
# reading blocks

class _PrefixedStream(io.RawIOBase):
    """A stream that first returns `head`, then the rest of `rest` (stdin sniffing)."""

    def __init__(self, head: bytes, rest: BinaryIO):
        self._head = head
        self._rest = rest
        self.raw_bytes = len(head)  # read from the source so far (the compressed size, for stdin)

    def readable(self) -> bool:
        return True

    def close_source(self) -> None:
        self._rest.close()

    def readinto(self, buffer) -> int:  # type: ignore[override]
        if self._head:
            n = min(len(buffer), len(self._head))
            buffer[:n] = self._head[:n]
            self._head = self._head[n:]
            return n
        data = self._rest.read(len(buffer))
        n = len(data)
        self.raw_bytes += n
        buffer[:n] = data
        return n


def _wrap_decompress(raw: BinaryIO, kind: Optional[str]) -> BinaryIO:
    if kind == "gz":
        import gzip

        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    if kind == "bz2":
        import bz2

        return bz2.BZ2File(raw, "rb")  # type: ignore[return-value]
    if kind == "xz":
        import lzma

        return lzma.LZMAFile(raw, "rb")  # type: ignore[return-value]
    return raw


def open_input(item: Input) -> BinaryIO:
    """A binary stream of the decompressed content of an input."""
    if item.source is not None:
        if not item.compressed:
            return _open_decompressed(item.source, None)
        # compressed: count what is read from disk, so the bomb check compares like with like
        raw_file = open(item.source, "rb")
        counted = _PrefixedStream(b"", raw_file)
        _STDIN_COUNTERS[id(item)] = counted
        return _wrap_decompress(io.BufferedReader(counted, buffer_size=64 << 10), item.compressed)  # type: ignore[arg-type]
    stdin = sys.stdin.buffer
    head = stdin.read(8)
    item.compressed = sniff_compression(head)
    prefixed = _PrefixedStream(head, stdin)
    raw = io.BufferedReader(prefixed, buffer_size=1 << 20)  # type: ignore[arg-type]
    stream = _wrap_decompress(raw, item.compressed)  # type: ignore[arg-type]
    _STDIN_COUNTERS[id(item)] = prefixed
    return stream


_STDIN_COUNTERS: dict = {}  # id(Input) -> the stream counting the compressed bytes read (stdin or a file)


def _check_decompressed(item: Input, total: int) -> None:
    """UserError when a compressed input has decompressed past the limits (module constants)."""
    from loradoctor.units import format_bytes

    limit = _limits["max"]
    if limit and total > limit:
        raise UserError(f"{item.path}: decompresses to more than {format_bytes(limit)}; stopped reading "
                        f"(a compression bomb, or a very large log: --max-decompressed 8GiB raises the limit, 0 lifts it)")
    if not _limits["ratio"] or total <= BOMB_FLOOR_BYTES:
        return
    counter = _STDIN_COUNTERS.get(id(item))
    packed = counter.raw_bytes if counter is not None else item.bytes  # read so far: a bomb shows at once
    if packed and total > BOMB_RATIO * packed:
        raise UserError(f"{item.path}: decompresses to more than {BOMB_RATIO} times its size ({format_bytes(total)} "
                        f"from {format_bytes(packed)} so far): a compression bomb? --max-decompressed 8GiB reads it "
                        f"anyway, up to that size")


PROBE_BYTES = 64 << 10  # how far past a block iter_blocks looks for the end of its last line

# Reading a big log allocates and frees a few block-sized buffers per block (the block, the view without
# metric dicts, the pieces of the split). glibc hands memory above its trim threshold back to the system at
# every free and maps it afresh (zeroed pages: ~40% of explain's system time on a 200 MB log). With the
# thresholds above a block's size, the freed blocks are reused instead; peak RSS stays the same.
RETAIN_FROM_BYTES = 64 << 20  # inputs this big (in all) set the thresholds; small ones never load ctypes
# a process-wide setting: only the command line (cli/explain_cmd.py) says the process is its own; explain
# called as a library (the bedside callback inside a training process) never changes the host's allocator
PROCESS_IS_OURS = False
_MALLOC_TUNED: list = []


def retain_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds (mallopt; Linux only, once per process) so that buffers of
    a block's size freed between blocks are reused rather than unmapped and faulted in again. True when
    set; a C library without mallopt (or not glibc-like) is left alone."""
    if _MALLOC_TUNED or not sys.platform.startswith("linux"):
        return bool(_MALLOC_TUNED and _MALLOC_TUNED[0])
    _MALLOC_TUNED.append(False)
    try:
        import ctypes

        mallopt = ctypes.CDLL(None).mallopt
        m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
        # the mmap threshold at glibc's maximum (32 MiB on 64-bit): block-sized buffers come from the heap
        ok = mallopt(m_mmap_threshold, 32 << 20) == 1 and mallopt(m_trim_threshold, 64 << 20) == 1
    except (OSError, AttributeError, ImportError):
        return False
    _MALLOC_TUNED[0] = ok
    return ok


def _plain_fileno(stream: BinaryIO, item: Input) -> Optional[int]:
    """The file descriptor of an uncompressed regular file (pread works on it), else None."""
    if item.source is None or item.compressed or not isinstance(stream, io.BufferedReader):
        return None
    try:
        fileno = stream.fileno()
        return fileno if stream.seekable() and os.path.isfile(item.source) else None
    except (OSError, ValueError, AttributeError):
        return None


# A log copied out of a web page (an issue rendered as HTML) arrives with its markup escaped:
# `&lt;module&gt;`, `&#39;loss&#39;`. Such a block is unescaped before anything reads it.
_HTML_MARKERS = (b"&lt;", b"&gt;", b"&quot;", b"&#39;", b"&#x27;")
_HTML_ENTITIES = ((b"&lt;", b"<"), (b"&gt;", b">"), (b"&quot;", b'"'), (b"&#39;", b"'"), (b"&#x27;", b"'"),
                  (b"&#34;", b'"'), (b"&nbsp;", b" "), (b"&amp;", b"&"))


def unescape_html(block: bytes) -> bytes:
    """`&lt;module&gt;` -> `<module>` when the block holds HTML-escaped text (else unchanged, fast)."""
    if b"&" not in block or not any(marker in block for marker in _HTML_MARKERS):
        return block
    for entity, plain in _HTML_ENTITIES:
        block = block.replace(entity, plain)
    return block


# A message pasted from a URL (a search link, a link's text, an issue opened from a query string) has its
# spaces percent-encoded: `libtorch_cuda.so:%20undefined%20symbol:%20ncclCommRegister`. Patterns are written
# with spaces. Only a line made of one such run (no space in it, at least two `%20`, not a URL itself) is
# decoded; a URL that names a file with spaces stays as it is. Such a line is a paste (a few lines long), so
# only blocks that start within an input's first UNQUOTE_BYTES are looked at: the search for `%20` runs at
# ~1 GB/s on a log of progress bars (its bytes are all common there), 12% of explain's time on a 200 MB log.
UNQUOTE_BYTES = 1 << 20


def unquote_spaces(block: bytes) -> bytes:
    """`a%20b%20c` -> `a b c` on a line with no space and no `://` (else unchanged, fast)."""
    at = block.find(b"%20")
    if at < 0:
        return block
    # only the lines that hold a `%20` are looked at (a big log has a few, in links: splitting every
    # block into lines for them was ~10% of explain's time on a 200 MB log)
    pieces: list[bytes] = []
    done = 0
    while at >= 0:
        start = block.rfind(b"\n", 0, at) + 1
        end = block.find(b"\n", at)
        end = len(block) if end < 0 else end
        line = block[start:end]
        if line.count(b"%20") >= 2 and b"://" not in line and _one_run(line):
            pieces += [block[done:start], line.replace(b"%20", b" ")]
            done = end
        at = block.find(b"%20", end)
    if not pieces:
        return block
    pieces.append(block[done:])
    return b"".join(pieces)


def _one_run(line: bytes) -> bool:
    """The line is one run without spaces once a paste's prefix is peeled (a reply's `> `, a prompt, a line
    number, a container's or logger's prefix: normalise() peels them as it does for every line)."""
    if b" " not in line.strip():
        return True
    # (a `\r` redraw: normalise keeps the last segment, and the line is more than that run)
    return b"\r" not in line and " " not in normalise(line.decode("utf-8", "replace"))[0]


# A log that went through a word processor or chat app (Word, WeChat, Notion) has typographic quotes:
# `No module named ‘peft’`. Patterns are written with ASCII quotes.
_CURLY_QUOTES = ((b"\xe2\x80\x98", b"'"), (b"\xe2\x80\x99", b"'"), (b"\xe2\x80\x9c", b'"'), (b"\xe2\x80\x9d", b'"'))


def straighten_quotes(block: bytes) -> bytes:
    """‘ ’ “ ” -> ' and " (else unchanged, fast)."""
    # one memchr first: the byte 0x80 is in no tqdm bar (whose blocks are e2 96 xx), while searching
    # for e2 80 itself stumbles on every bar cell (8 ms per 8 MiB)
    if b"\x80" not in block:
        return block
    for curly, plain in _CURLY_QUOTES:
        if curly in block:
            block = block.replace(curly, plain)
    return block


# A message pasted from an issue title, a search snippet or a chat that lower-cased it
# (`runtimeerror: expected all tensors to be on the same device`) matches no case-sensitive pattern.
# Such an input (no upper-case ASCII letter in its first block) gets the case of the vocabulary the rules
# and extractors are written in back: every phrase of their patterns that holds an upper-case letter, and
# every such word that no pattern also writes in lower case (`GiB`, `OutOfMemoryError`; not `Error`, which
# patterns write both ways: the phrases around it decide). Other text stays lower-case.
def is_lowered(sample: bytes) -> bool:
    """True when the sample's text has letters and none of them is upper-case (bytes.islower, in C), not
    counting metric records and progress bars: those have no capital in any log, so a Trainer log whose
    first block holds only them says nothing about case (it was read as lower-cased, and every rule then
    ignored case for the whole input)."""
    if not sample.islower():
        # a container runtime's line prefix (`2024-05-01T10:00:00.123Z stdout F `) carries capitals of its own
        sample = _CASELESS_CRI_RE.sub(b"", sample)
        if not sample.islower():
            return False
    return _CASELESS_BAR_RE.sub(b"", _CASELESS_RECORD_RE.sub(b"", sample)).islower()


# An issue title typed (or pasted) lower-case above a body that kept its case: `valueerror: asking to pad but
# the tokenizer ...` as the first line, then prose with capitals. The input is not lower-cased as a whole (its
# rules keep their case), so only that line gets the vocabulary's case back; and only a title that names an
# error (the vocabulary is built on demand, ~0.2 s, not for every log whose first line is lower-case).
# (a message without its exception name names the error in other words: `use_libuv was requested but pytorch
# was built without libuv support`, `... is not supported on this gpu`, `torch not compiled with cuda enabled`)
_TITLE_ERROR_WORDS = (b"error", b"exception", b"out of memory", b"failed", b"requested but", b"not supported",
                      b"not compiled", b"timeout", b"timed out", b"does not require grad", b"not found", b"cannot",
                      b"unable to", b"illegal", b"assert", b"killed", b"segmentation fault")
_NONBLANK_RE = lazy_re(rb"[^ \t\r\n]")


# A title typed In Title Case (`CUDA Out Of Memory. Tried To Allocate 20.00 MiB`, `Element 0 Of Tensors Does
# Not Require Grad`) matches no case-sensitive pattern either: it is lower-cased and given the vocabulary's
# case like a lower-cased one. Title Case: most of its words (four or more) start with a capital and go on
# in lower case; a message in its own case (`RuntimeError: CUDA out of memory. Tried to allocate`) is not.
_TITLE_WORD_RE = lazy_re(rb"(?<![\w'])[A-Za-z][a-z]+\b")


def _title_cased(line: bytes) -> bool:
    words = _TITLE_WORD_RE.findall(line)
    capitals = sum(1 for w in words if w[:1].isupper())
    return capitals >= 4 and capitals >= 0.75 * len(words)


def recase_title(block: bytes, recaser: Callable[[], "Recaser"]) -> tuple[bytes, Optional[int]]:
    """The block with its first non-blank line recased when that line is lower-case (or In Title Case) and
    names an error, and that line's number in the block (1-based; None when nothing was recased)."""
    first = _NONBLANK_RE.search(block, 0, 4096)  # no copy of a big first block
    if first is None:
        return block, None
    start = first.start()
    end = block.find(b"\n", start, start + 401)
    end = len(block) if end < 0 and len(block) - start <= 400 else end
    if end < 0:  # longer than a title
        return block, None
    # a container runtime's line prefix (`2024-05-01T10:00:00.123Z stdout F `) carries capitals of its own
    prefix = _CRI_PREFIX_RE.match(block, start, end)
    if prefix is not None:
        start = prefix.end()
    title = block[start:end]
    if not title.islower():
        if not _title_cased(title):
            return block, None
        title = title.lower()
    if not any(w in title for w in _TITLE_ERROR_WORDS):
        return block, None
    return block[:start] + recaser().recase(title) + block[end:], block.count(b"\n", 0, start) + 1


# a one-line metric record (`{'loss': 0.41, 'grad_norm': ...}`, JSON too) and a tqdm bar from its percentage
# to its closing bracket (`100%|#####| 500/500 [05:00<00:00, 1.66it/s]`); a bar's description stays
_CRI_PREFIX = rb"\d{4}-\d\d-\d\dT[\d:.]{8,18}(?:Z|[+-]\d\d:\d\d) (?:stdout|stderr) [FP] "
_CRI_PREFIX_RE = lazy_re(_CRI_PREFIX)  # at a given position (a title line)
_CASELESS_CRI_RE = lazy_re(rb"(?m)^" + _CRI_PREFIX)  # at every line start (a sample)
_CASELESS_RECORD_RE = lazy_re(rb"\{['\"][a-z_/]+['\"]: [^{}\r\n]*\}")
_CASELESS_BAR_RE = lazy_re(rb"\d{1,3}%\|[^|\r\n]{0,400}\|[^\[\r\n]{0,80}\[[^\]\r\n]{0,120}\]")  # bounded: no rescans


_ESCAPED_SPACE_RE = lazy_re(r"\\s[+*]?|\\ | \+| \*| \?")
_ESCAPE_RE = lazy_re(r"\\([^A-Za-z0-9])")
# what ends a run of literal text in a regex: classes, escapes such as \d \w \b, groups, quantifiers
_BREAK_RE = lazy_re(r"\[(?:\\.|[^\]\\])*\]|\\[A-Za-z]|\(\?[:=!<P]?(?:<[^>]*>)?|[()|?*+{}^$]|\{\d+(?:,\d*)?\}")
_DIGITS_RE = lazy_re(r"\((?:\?P<\w+>|\?:)?\\d[+*]?(?:\{\d+(?:,\d*)?\})?\)|\\d[+*]?(?:\{\d+(?:,\d*)?\})?")
_DIGIT_RUN_RE = lazy_re(rb"\d+")
_PHRASE_RE = lazy_re(r"[A-Za-z0-9_]+(?:[ .:,'\"/=-]+[A-Za-z0-9_]+)*")
_WORD_RE = lazy_re(r"[A-Za-z0-9_]+")


def _literal_runs(pattern: str) -> list[str]:
    """The runs of literal text of a regex source (crude: enough to learn the casing of its words)."""
    if pattern.startswith("(?i)"):
        return []
    text = _ESCAPED_SPACE_RE.sub(" ", pattern)
    text = _DIGITS_RE.sub("0", text)  # `GPU (\d+) has` is the phrase `GPU 0 has`: digit runs match any digits
    text = _BREAK_RE.sub("\0", text)
    text = _ESCAPE_RE.sub(r"\1", text)
    return [run for run in text.split("\0") if run.strip()]


# written whole into the vocabulary: the frame and header words the traceback reader needs, the
# exception names and units a lower-cased message lost
CASED_WORDS = ('File "', "Traceback (most recent call last):", "Traceback (most recent call last)",
               "During handling of the above exception",
               "The above exception was the direct cause", "OutOfMemoryError", "RuntimeError", "ValueError",
               "ImportError", "ModuleNotFoundError", "KeyError", "TypeError", "AttributeError", "OSError",
               "AssertionError", "IndexError", "NotImplementedError", "ChildFailedError", "DistBackendError",
               "AcceleratorError", "GiB", "MiB", "KiB", "TiB",
               # torch's OOM message names the device kind (the extractor's alternation teaches no phrase)
               "HIP out of memory", "XPU out of memory", "MPS out of memory",
               # notebook Trainer table heads (tab- or pipe-separated)
               "Step\tTraining Loss", "Epoch\tTraining Loss", "Step | Training Loss", "Epoch | Training Loss")
# single words taken on their own (outside a phrase) only when unambiguous and of these kinds: exception
# names, size units, acronyms; other words (`Trainer`, `Free`) would turn paths and prose upper-case
_CASED_WORD_RE = lazy_re(r"[A-Z]\w*(?:Error|Exception|Warning|Interrupt)|[KMGT]iB|[A-Z][A-Z0-9]{2,}")


class Recaser:
    """Gives a lower-cased text the case of a vocabulary learnt from regex sources."""

    def __init__(self, patterns: Iterable[str], extra: Iterable[str] = ()):
        phrases: dict[str, str] = {}
        words: dict[str, set[str]] = {}
        lower_words: set[str] = set()
        lower_phrases: set[str] = set()
        for exact in extra:  # taken whole: `File "`, `Traceback (most recent call last):`
            phrases.setdefault(exact.lower(), exact)
        for run in (r for p in patterns for r in _literal_runs(p)):
            for phrase in _PHRASE_RE.findall(run):
                for word in _WORD_RE.findall(phrase):
                    if word.islower() or not any(c.isalpha() for c in word):
                        lower_words.add(word.lower())
                    else:
                        words.setdefault(word.lower(), set()).add(word)
                if _WORD_RE.fullmatch(phrase) is not None:
                    continue
                if phrase == phrase.lower():
                    lower_phrases.add(phrase)
                else:
                    phrases.setdefault(phrase.lower(), phrase)
        # a phrase that patterns also write in lower case is left alone (`out of memory`)
        table = {low: cased for low, cased in phrases.items() if low not in lower_phrases}
        for low, forms in words.items():
            word = next(iter(forms))
            if len(forms) == 1 and low not in lower_words and _CASED_WORD_RE.fullmatch(word):
                table.setdefault(low, word)
        # digit runs are written `#` in keys and match any digits (`gpu 1 has` -> `GPU 1 has`)
        self.table = {_DIGIT_RUN_RE.sub(b"#", k.encode()): v.encode() for k, v in table.items()}
        self._regex = re.compile(_trie_regex(sorted(self.table)).encode("latin-1")) if self.table else None

    def recase(self, block: bytes) -> bytes:
        if self._regex is None:
            return block
        table = self.table

        def cased(m: re.Match) -> bytes:
            text = m.group(0)
            key = _DIGIT_RUN_RE.sub(b"#", text)
            template = table[key]
            if b"#" not in key:
                return template
            # the template's digit runs are the key's `#`s, one for one: the matched digits go there
            digits = iter(_DIGIT_RUN_RE.findall(text))
            return _DIGIT_RUN_RE.sub(lambda _: next(digits, b"0"), template)

        block = self._regex.sub(cased, block)
        for fix, repl in _RECASE_FIXES:
            if fix.search(block) is not None:
                block = fix.sub(repl, block)
        return block


# shapes the vocabulary cannot give back (each keeps the length): IPython 8 frames (`file /usr/...:921, in
# loramodel.merge(...)`, `cell in[18], line 4`) and a unit glued to its number (`gpu_mem=38.22gib`)
_RECASE_FIXES = (
    (re.compile(rb"(?m)^([ \t>|:\d]*)file (?=[^\s,]+:\d+, in )"), rb"\1File "),
    (re.compile(rb"\bcell in\[(?=\d+\], line \d+)"), b"Cell In["),
    (re.compile(rb"(?<=\d)([kmgt])ib\b"), lambda m: m.group(1).upper() + b"iB"),
)


def _trie_regex(keys: list[bytes]) -> str:
    """One regex (a trie of alternatives, so the engine follows one branch per position) matching the
    longest key at a position, each key standing alone (no letter or digit right before or after)."""
    trie: dict = {}
    for key in keys:
        node = trie
        for ch in key.decode("latin-1"):  # `#` stands for a digit run
            node = node.setdefault(ch, {})
        node[""] = {}

    def emit(node: dict, last: str) -> str:
        branches = []
        for ch in sorted(k for k in node if k):
            child = node[ch]
            run, end = (r"\d+" if ch == "#" else re.escape(ch)), ch
            while len(child) == 1 and "" not in child:  # a chain: one literal run
                (end, child), = child.items()
                run += r"\d+" if end == "#" else re.escape(end)
            branches.append(run + emit(child, end))
        if "" in node:  # the key ends here (longer keys were tried first)
            branches.append("(?![A-Za-z0-9])" if last.isalnum() else "")
        if len(branches) == 1:
            return branches[0]
        return "(?:" + "|".join(branches) + ")"

    return "(?<![A-Za-z0-9/])" + emit(trie, "")


# A log copied from a console that wraps hard (Windows conhost, tmux copy mode, `fold`) has no line
# longer than the window and many lines exactly that wide: an error message then spans two or three
# lines and no pattern sees it whole. Such an input is recognised from its first block and every line
# of exactly that width is joined with the next one.
WRAP_MIN_WIDTH, WRAP_MAX_WIDTH = 60, 300
WRAP_MIN_FULL_LINES = 4  # lines of exactly the width, at least
WRAP_MIN_SHARE = 0.15  # of the lines at least 40 columns wide


def display_width(text: str) -> int:
    """The columns a terminal gives `text`: an East Asian wide or full-width character (CJK) takes two."""
    if text.isascii():
        return len(text)
    from unicodedata import east_asian_width

    return sum(2 if east_asian_width(ch) in "WF" else 1 for ch in text)


# the blocks of East Asian wide and full-width characters (Hangul Jamo, CJK, kana, Hangul, full-width forms,
# emoji, CJK extensions): a quick test that a text has any
_WIDE_RE = lazy_re("[\u1100-\u115f\u2e80-\ua4cf\uac00-\ud7a3\uf900-\ufaff\ufe30-\ufe4f\uff00-\uff60\uffe0-\uffe6"
                   "\U0001f300-\U0001faff\U00020000-\U0003fffd]")


def _fills(line: str, nxt: str, width: int, display: bool = True) -> bool:
    """`line` fills a console `width` wide: exactly `width` characters (`display` False), or, counting
    display columns, exactly `width` columns or one less when the next line starts with a two-column
    character that did not fit in the last column (a terminal wraps by display columns, so a line of
    Chinese text wrapped at 80 has fewer than 80 characters)."""
    if not display:
        return len(line) == width
    if len(line) > width or 2 * len(line) < width - 1:
        return False  # (quick: a character takes one column or two)
    cols = display_width(line)
    return cols == width or (cols == width - 1 and display_width(nxt[:1]) == 2)


# console widths people actually have: two full lines at one of these are enough (a short paste)
CONSOLE_WIDTHS = frozenset((80, 100, 120, 132, 140, 150, 160, 180, 200, 220, 240, 250))


def detect_wrap_width(sample: bytes, crosses: Optional[Callable[[str, str], bool]] = None) -> Optional[int]:
    """The column width a sample was hard-wrapped at, or None (detect_wrap: also whether by display columns)."""
    return detect_wrap(sample, crosses)[0]


def detect_wrap(sample: bytes, crosses: Optional[Callable[[str, str], bool]] = None) -> tuple[Optional[int], bool]:
    """(width, by display columns) of a hard wrap, or (None, False). A terminal wraps by display columns
    (a CJK character takes two); `fold` and some consoles count characters. A sample with no wide character
    reads the same both ways; otherwise both are tried and the narrower width found wins (a paste folded
    at 80 characters has CJK lines 160 columns wide, one wrapped at 80 columns ASCII lines of 80 characters)."""
    text = sample.decode("utf-8", "replace")
    by_chars = _detect_wrap(text, crosses, False)
    if text.isascii() or _WIDE_RE.search(text) is None:
        return by_chars, False
    by_columns = _detect_wrap(text, crosses, True)
    if by_chars is not None and (by_columns is None or by_chars < by_columns):
        return by_chars, False
    return by_columns, by_columns is not None


def _detect_wrap(text: str, crosses: Optional[Callable[[str, str], bool]], display: bool) -> Optional[int]:
    """The width of detect_wrap, measured in characters or in display columns. Progress
    bars (padded to the terminal's width by tqdm) and `\r` redraws are left out of the count.
    `crosses(line, next_line)` (the engine's: a rule's pattern matches the two joined across the cut, and
    neither alone) lets a single cut full-width line at a console width, too few to tell a wrap by their
    number, count as a wrap (`... To avoid da` + `ta inconsistency, we are taking the entire process down`)."""
    lines = text.split("\n")
    # a last line without its newline (a paste that ends there, a sample cut mid-line) says nothing of
    # the width, but it is the next line of the one before: it shows that one continues
    unfinished = lines.pop()
    counted = [line for line in lines if _wrappable(line) or _glued_after_bar(line)]
    if unfinished:
        lines.append(unfinished)
    if not counted:
        return None
    width = max(display_width(line) if display else len(line) for line in counted)
    if not WRAP_MIN_WIDTH <= width <= WRAP_MAX_WIDTH:
        return None
    # A wrap continues on the next line: not indented, not another record of the same shape. Lines
    # of one width that are records of one format (`thread: [57,...]`, metric dicts, Xid lines, a
    # warning repeated every step) are followed by more of the same, or by an indented line.
    # Counted once per distinct text: a long warning printed every step is one line, however often.
    full_lines: set[str] = set()
    cut_lines: dict[str, str] = {}  # a cut line -> the first line after it
    for i, line in enumerate(lines):
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if not _fills(line, nxt, width, display) or not (_wrappable(line) or _glued_after_bar(line)) or \
                (unfinished and i == len(lines) - 1):
            continue
        full_lines.add(line)
        # a wrap that fell just before a space leaves that one space at the head of the next line
        # (`... could not be found. Error` + ` loading "...\torch\lib\c10.dll"`); an indented line has more
        if nxt and (not nxt[:1].isspace() or _one_space_head(line, nxt) or _row_rest(line, nxt)) and \
                nxt[:8].translate(DIGITS_BLIND) != line[:8].translate(DIGITS_BLIND):
            cut_lines.setdefault(line, nxt)
    full, cut = len(full_lines), len(cut_lines)
    wide = len({line for line in counted if len(line) >= 40})  # distinct, as full_lines is
    needed = 2 if width in CONSOLE_WIDTHS else WRAP_MIN_FULL_LINES
    if cut >= needed and cut >= full / 2 and full >= WRAP_MIN_SHARE * wide:
        return width
    if crosses is not None and width in CONSOLE_WIDTHS and 0 < cut < needed and cut >= full / 2 \
            and full >= WRAP_MIN_SHARE * wide:
        # too few full-width lines to count: a cut through the middle of a rule's message tells
        if any(crosses(line, nxt) for line, nxt in cut_lines.items()):
            return width
    return None


def _one_space_head(line: str, nxt: str) -> bool:
    """`nxt` starts with exactly one space, then text, after a full-width `line` that ends in text: the
    continuation of a hard wrap that fell on a space (a frame or a list item is indented deeper)."""
    return nxt[:1] == " " and not nxt[1:2].isspace() and bool(nxt[1:2]) and not line[-1:].isspace()


def _row_rest(line: str, nxt: str) -> bool:
    """`nxt` is the rest of a table row that the wrap cut (`line` starts with a table edge and ends without
    one, `nxt` ends with one and does not start a row): its padding may indent it (`> |  Fan  Temp ...` +
    `     Compute M. |`)."""
    rest = nxt.strip()
    if not rest or rest[-1] not in _TABLE_EDGES or rest[0] in _TABLE_EDGES or line[-1:] in _TABLE_EDGES:
        return False
    head = _peel_head(line).lstrip()
    return head[:1] in _TABLE_EDGES


# str.translate table writing every digit as 0: lines that differ only in numbers compare equal
DIGITS_BLIND = str.maketrans("123456789", "000000000")
_DIGITS_BLIND_BYTES = bytes.maketrans(b"123456789", b"000000000")


def digits_blind(text: str) -> str:
    """text.translate(DIGITS_BLIND), ~7x faster on a log line: str.translate looks every character up in
    the dict, bytes.translate is one table pass (a digit's byte is in no multi-byte UTF-8 sequence, and
    surrogatepass carries any str there and back)."""
    return text.encode("utf-8", "surrogatepass").translate(_DIGITS_BLIND_BYTES).decode("utf-8", "surrogatepass")


_TABLE_EDGES = "|│┃║+"
# a tqdm bar that ends inside its `| n/total` counter (no `[elapsed<remaining, rate]` after it yet)
_BAR_COUNTER_CUT_RE = lazy_re(r"\|[^|]*\|\s*\d+(?:\.\d+)?[kKMG]?(?:/(?:\d+(?:\.\d+)?[kKMG]?)?)?$")


def _peel_head(line: str) -> str:
    """`line` without the prefixes a paste put before the log's own text (a reply's `> `, docker compose's
    `trainer-1  | `, a kubelet or rank prefix, a line number; the trailing padding kept): a prefix added
    before a console wrapped the paste is on the cut line and not on its continuation (`> | NVIDIA-SMI ...`
    + `2.2     |`), and its own `|` is no table edge or bar. Peeled only where a prefix can hide one."""
    if not any(c in line[:80] for c in _TABLE_EDGES) and line[:1] != ">":
        return line
    head = peel_table_line(line)[0].lstrip()
    if head[:1] == ">":  # a quote behind a collector's prefix or an indent (`    > | NVIDIA-SMI ...`)
        head = _QUOTE_RE.sub("", head, count=1).lstrip()
    trail = line[len(line.rstrip()):]
    return head + trail if head else line


def _wrappable(line: str) -> bool:
    """Lines that can be a hard wrap: not a progress bar (tqdm pads bars to the terminal width), not a
    `\r` redraw, not a table row (memory_summary, nvidia-smi and rich boxes have rows of one width). A row
    that starts with a table edge and ends without one is a row cut by the wrap (an 89-column nvidia-smi
    table in an 80-column console: `| NVIDIA-SMI 535.104.05 ... CUDA Version: 1` + `2.2     |`). The paste's
    prefixes (`> `, `trainer-1  | `) are peeled first (_peel_head)."""
    if not line.strip() or "\r" in line:
        return False
    line = _peel_head(line)
    stripped = line.strip()
    if not stripped:
        return False
    if "%|" in line:
        # a bar is padded to the width, not wrapped, unless the wrap cut it inside its `[00:02<03:58, 5.00it/s,
        # train_loss=` bracket (a bar with a long postfix in a narrower console), or before it, in its counter
        # (`  0%|          | 0/` + `3 [00:00<?, ?it/s]`: tqdm ends every bar with its `[...]`)
        bar = line[line.find("%|"):]
        cut = bar.rfind("[") > bar.rfind("]") or bool(_BAR_COUNTER_CUT_RE.search(bar))
        return cut and not line[-1:].isspace()
    if stripped[0] in _TABLE_EDGES:  # a row: cut when its last character (padding included) is no edge
        return line.rstrip("\r\n")[-1] not in _TABLE_EDGES
    return stripped[-1] not in _TABLE_EDGES


def _glued_after_bar(line: str) -> bool:
    """A tqdm bar with text glued after it (`... 0/2 [00:00<?, ?it/s]Error named symb`) that reaches the
    width: tqdm pads the bar, not what a later print glues after it, so the line is a wrap like any other
    (a bar alone, or a table row, stays unjoined)."""
    if "\r" in line or "%|" not in line:
        return False
    line = _peel_head(line)  # compose's `trainer-1  | ` is no bar edge
    m = _BAR_RE.match(line)
    rest = line[m.end():].strip() if m else ""
    return bool(rest) and rest[-1] not in _TABLE_EDGES


def join_wrapped(block: bytes, width: int, carry: bytes = b"", final: bool = False,
                 display: bool = False) -> tuple[bytes, list[int], bytes]:
    """Join every line of exactly `width` characters with the line after it. Returns the joined block,
    the offsets in it where a newline was taken out (sorted: a physical line starts there), and a tail
    to put before the next block: the last line when it is not finished, and a run of full-width lines
    at the end of the block, whose continuation is in the next block (the run stays whole, so a message
    wrapped over three lines is joined whole across the block boundary). `final`: no block follows (the
    input's end): the last line is joined to the full-width lines before it, a line without a newline too.
    `display`: the width counts display columns (detect_wrap), not characters.
    A full-width line followed by a line that opens a record of its own (_starts_record: an exception
    line, a traceback's head or frame) is a line exactly the width, not a wrap: a console wraps inside
    a line, and such a cut would have to fall exactly before the exception's name."""
    lines = (carry + block).split(b"\n")
    tail = lines.pop()  # b"" when the block ends with a newline
    open_end = False
    if final and tail:
        lines.append(tail)  # the input's last line, without a newline
        tail, open_end = b"", True
    out: list[bytes] = []
    joins: list[int] = []
    at = 0
    run = -1  # index in `lines` of the first line of the open run of joined lines, -1 when none
    run_out, run_at = 0, 0
    for i, line in enumerate(lines):
        last = i == len(lines) - 1
        # (bytes: at least one per column, so a line of fewer bytes than width - 1 fills no console)
        text = line.decode("utf-8", "replace") if len(line) >= width - display else ""
        nxt = lines[i + 1][:4].decode("utf-8", "ignore") if text and not last else ""
        full = bool(text) and _fills(text, nxt, width, display) and (_wrappable(text) or _glued_after_bar(text))
        if full and last and not final:
            # it continues in the next block: carry the whole open run with it
            start = i if run < 0 else run
            tail = b"\n".join(lines[start:]) + b"\n" + tail
            if run >= 0:
                del out[run_out:]
                joins = [j for j in joins if j <= run_at]
                at = run_at
            break
        if full and (last or _starts_record(lines[i + 1])):
            full = False
        if full:
            if run < 0:
                run, run_out, run_at = i, len(out), at
            out.append(line)
            at += len(line)
            joins.append(at)
        else:
            run = -1
            out.append(line if last and open_end else line + b"\n")
            at += len(line) + 1
    return b"".join(out), joins, tail


# a line that opens a record of its own, which no console wrap continues into: an exception line
# (`RuntimeError: ...`, `torch.OutOfMemoryError: ...`), a traceback's head, a frame, and a line that starts
# with a log record's own header (torchrun's `[rank3]:`, a glog `E0208 13:10:45.390000`, an ISO or syslog
# time stamp): such a header is printed at the start of a line, never in the middle of one
_RECORD_START_RE = lazy_re(rb"^(?:\[rank\d+\]:|(?:(?:[A-Za-z_][\w]*\.)*[A-Z]\w*(?:Error|Exception): |Traceback \(most recent call last\)|  File \")|"
                           rb"[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ |\[?\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d|[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d )")


def _starts_record(line: bytes) -> bool:
    return _RECORD_START_RE.match(line) is not None


def iter_blocks(item: Input, block_bytes: int = BLOCK_BYTES, first_block_bytes: Optional[int] = None) -> Iterator[bytes]:
    """Decompressed content in blocks that end at a newline (except a forced cut inside a line
    longer than two blocks, and the last block). UTF-16 input is transcoded to UTF-8; binary
    content raises UserError; HTML-escaped text is unescaped, typographic quotes straightened, a line
    of %20-encoded words decoded; a hard-wrapped input is rejoined (iter_blocks_with_joins gives the
    physical line numbers)."""
    for block, _ in iter_blocks_with_joins(item, block_bytes, first_block_bytes):
        yield block


def iter_blocks_with_joins(item: Input, block_bytes: int = BLOCK_BYTES,
                           first_block_bytes: Optional[int] = None,
                           recaser: Optional[Callable[[], Recaser]] = None,
                           crosses: Optional[Callable[[str, str], bool]] = None) -> Iterator[tuple[bytes, list[int]]]:
    """iter_blocks, with each block the offsets where a hard wrap was joined (empty for most inputs):
    the physical line of offset x is (newlines before x) + (joins before x) + 1, counted from the block's
    first physical line. `first_block_bytes` makes the first read smaller (the engine learns from it
    which rules are already satisfied before reading big blocks). `recaser` (built only when needed)
    gives a lower-cased input the case of the rules' vocabulary; `crosses` goes to detect_wrap_width."""
    width: Optional[int] = None
    display = False
    carry = b""
    first = True
    case: Optional[Recaser] = None
    offset = 0  # of the raw block in the input
    for block, last in _with_last(_raw_blocks(item, block_bytes, first_block_bytes)):
        size = len(block)
        block = straighten_quotes(unescape_html(block))
        if offset < UNQUOTE_BYTES:
            block = unquote_spaces(block)
        offset += size
        # one memchr first: 0x94 is in every box-drawing bar (e2 94 xx) and in no tqdm bar cell (e2 96 xx),
        # while searching for the bar's three bytes runs at ~1 GB/s on a log of progress bars
        if b"\x94" in block and _BOX_BAR in block and b".py:" in block:
            block = rejoin_rich_headers(block)
        if first:
            first = False
            if recaser is not None and is_lowered(block[:1 << 20]):
                item.lowered = True
                case = recaser()
            elif recaser is not None:
                pasted = block
                block, item.recased_title = recase_title(block, recaser)
                if item.recased_title is not None:
                    item.title_as_pasted = pasted.split(b"\n", item.recased_title)[item.recased_title - 1].decode("utf-8", "replace")
            cross = crosses
            if crosses is not None and case is not None:
                # a lower-cased paste: the rules read the lines across a cut with their case given back
                cross = functools.partial(_recased_crosses, crosses, case)
            width, display = detect_wrap(block[:1 << 20], cross)
            item.wrap_width = width
        if case is not None:
            # same length: only the case of letters changes. The input was judged by its first block; a
            # later block that holds upper-case letters (a long log whose first block was only metric dicts
            # and progress bars, then a traceback) is recased line by line, and only where a line has none
            if block.islower():
                block = case.recase(block)
            else:
                block = b"\n".join(case.recase(line) if line.islower() else line for line in block.split(b"\n"))
        if width is None:
            yield block, []
            continue
        # the input's last block is joined to its end (a wrapped last line stays in the block, as when
        # the input is not wrapped)
        joined, joins, carry = join_wrapped(block, width, carry, final=last, display=display)
        if joined:
            yield joined, joins
    if carry:
        if width is None:
            yield carry, []
        else:
            joined, joins, _ = join_wrapped(b"", width, carry, final=True, display=display)
            yield joined, joins


def _with_last(blocks: Iterator[bytes]) -> Iterator[tuple[bytes, bool]]:
    """(block, whether it is the last one), reading one block ahead."""
    prev: Optional[bytes] = None
    for block in blocks:
        if prev is not None:
            yield prev, False
        prev = block
    if prev is not None:
        yield prev, True


# A rich traceback box word-wraps a frame's header at the box edge (rich 15: `│ /x/cuda_accelerator.py:296 in │`,
# then `│ pin_memory │`; also after the colon or the line number): the function's name is completed on the
# header line (the name's own line is kept), so that a rule's `in pin_memory` frame pattern reads it as it reads
# any other dialect. facts/frames.py reads the two box lines as one frame either way.
_BOX_BAR = "│".encode("utf-8")
_RICH_HEAD_B_RE = lazy_re(rb"^(.*?\xe2\x94\x82 ?)(\S[^\r\n]*?\.py:(?:\d+( in)?)?)( *\xe2\x94\x82[ \t\r]*)$")
_RICH_TAIL_B_RE = (lazy_re(rb"^.*?\xe2\x94\x82 ?(\d+ in [\w<>.]+) *\xe2\x94\x82[ \t\r]*$"),  # after `path.py:`
                   lazy_re(rb"^.*?\xe2\x94\x82 ?(in [\w<>.]+) *\xe2\x94\x82[ \t\r]*$"),  # after `path.py:296`
                   lazy_re(rb"^.*?\xe2\x94\x82 ?([\w<>.]+) *\xe2\x94\x82[ \t\r]*$"))  # after `path.py:296 in`


def rejoin_rich_headers(block: bytes) -> bytes:
    """Every rich frame header wrapped onto two box lines completed on its first (same number of lines)."""
    lines = block.split(b"\n")
    changed = False
    for i in range(len(lines) - 1):
        line = lines[i]
        if b".py:" not in line or _BOX_BAR not in line:
            continue
        m = _RICH_HEAD_B_RE.match(line)
        if m is None:
            continue
        head = m.group(2)
        form = 2 if m.group(3) else (1 if head[-1:].isdigit() else 0)
        t = _RICH_TAIL_B_RE[form].match(lines[i + 1])
        if t is None:
            continue
        lines[i] = m.group(1) + head + (b"" if form == 0 else b" ") + t.group(1) + m.group(4)
        changed = True
    return b"\n".join(lines) if changed else block


def _recased_crosses(crosses: Callable[[str, str], bool], case: "Recaser", left: str, right: str) -> bool:
    """crosses() of two lines of a lower-cased paste, recased joined (a word the cut split is recased
    whole; recasing keeps the length, so the cut stays where it was)."""
    joined = case.recase((left + right).encode("utf-8")).decode("utf-8", "replace")
    if len(joined) != len(left) + len(right):
        return crosses(left, right)
    return crosses(joined[:len(left)], joined[len(left):])


def _raw_blocks(item: Input, block_bytes: int, first_block_bytes: Optional[int]) -> Iterator[bytes]:
    try:
        stream = open_input(item)
    except OSError as exc:
        raise UserError(f"{item.path}: cannot read ({exc.strerror or exc})") from None
    decoder = None
    first = True
    rest = b""
    read_bytes = 0
    decompressed = 0
    fileno = _plain_fileno(stream, item)
    try:
        while True:
            size = first_block_bytes if first and first_block_bytes else block_bytes
            try:
                if fileno is not None and not first and decoder is None and not rest:
                    # a plain file: peek (pread) where the line after `size` bytes ends and read
                    # up to there in one call, so the block needs no second copy to finish it
                    probe = os.pread(fileno, PROBE_BYTES, stream.tell() + size)
                    nl = probe.find(b"\n")
                    size += nl + 1 if nl >= 0 else len(probe)
                chunk = stream.read(size)
                ended = len(chunk) < size  # a short read: the stream's end (a buffered read fills `size` otherwise)
            except read_errors() as exc:
                raise UserError(f"{item.path}: cannot read ({exc}); truncated or corrupt compressed file?") from None
            if item.compressed:
                decompressed += len(chunk)
                _check_decompressed(item, decompressed)
            if first:
                first = False
                if looks_binary(chunk[:SNIFF_BYTES]):
                    raise UserError(f"{item.path}: looks like a binary file, not a text log (NUL or control bytes)")
                if chunk.startswith(codecs.BOM_UTF16_LE) or chunk.startswith(codecs.BOM_UTF16_BE):
                    decoder = codecs.getincrementaldecoder("utf-16")(errors="replace")
            if decoder is not None:
                chunk = decoder.decode(chunk, final=not chunk).encode("utf-8")
            elif chunk and not rest and not chunk.endswith(b"\n"):
                # finish the last line from the stream: one copy instead of cutting and re-joining
                try:
                    chunk += stream.readline(block_bytes)
                except read_errors() as exc:
                    raise UserError(f"{item.path}: cannot read ({exc}); truncated or corrupt compressed file?") from None
            if item.source is None:
                read_bytes += len(chunk)
            if not chunk:
                if rest:
                    yield rest
                break
            buf = rest + chunk if rest else chunk
            cut = buf.rfind(b"\n")
            if cut < 0:
                if len(buf) >= 2 * block_bytes:  # a line longer than two blocks: cut it
                    yield buf
                    rest = b""
                else:
                    rest = buf
                continue
            if cut == len(buf) - 1 or (ended and decoder is None):
                # (at the end, the last line without its newline stays in the block: the wrap detection
                # and the join see it after the line it continues)
                yield buf
                rest = b""
            else:
                yield buf[: cut + 1]
                rest = buf[cut + 1:]
    finally:
        counter = _STDIN_COUNTERS.pop(id(item), None)
        if item.source is not None:
            stream.close()
            if counter is not None:
                counter.close_source()
        else:
            item.bytes = read_bytes


# ---------------------------------------------------------------------------------------------
# normalising one line

_ANSI_RE = lazy_re(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[()][A-Za-z0-9]|\x1b[=>78]")
# tqdm: "Loading checkpoint shards:  66%|██████▌   | 890/1352 [05:32<01:07,  6.89it/s]"
_BAR_RE = lazy_re(r"^[^|\r\n]{0,200}?\d{1,3}%\|[^|]{0,400}\|\s*\d+(?:\.\d+)?[kKMG]?/\d+(?:\.\d+)?[kKMG]?\s*(?:\[[^\]]*\])?")
_BAR_TOTAL_RE = lazy_re(r"(?:^|\s)(\d{1,3})%\|[^|]*\|\s*(\d+)/(\d+)\s*\[")
_BOX_LEAD_RE = lazy_re(r"^[\s│┃╭╰╮╯─━┌└┐┘├┤┬┴┼║╔╚╗╝═]+")
_BOX_TAIL_RE = lazy_re(r"[\s│┃╭╰╮╯─━┌└┐┘├┤┬┴┼║╔╚╗╝═]+$")
_BOX_CHARS = "│┃╭╰╮╯─━┌└┐┘├┤┬┴┼║╔╚╗╝═"

# Prefixes peeled off one after the other (up to a few), each kept as metadata.
_RANK_PREFIX_RE = lazy_re(
    r"^\s*(?:\[(?:rank|default|Rank)\s?(\d+)\]\s*:?|(?:rank|Rank)(\d+)\s*:|\[\d+,(\d+)\]<std(?:out|err)>:)\s?"
)
# `srun --label` puts the task number first: `3: RuntimeError: ...`
_SRUN_LABEL_RE = lazy_re(r"^(\d{1,4}): (?=\S)")
# docker compose (`trainer-1  | `, v1 `proj_trainer_1 | `), the CRI stream tag kubelet writes
# after its timestamp (`2024-05-01T10:00:00.12Z stdout F `), and the host pdsh puts before every line
# of a multi-node DeepSpeed launch (`worker-0: `, `node07: `, `10.0.0.12: `)
_SOURCE_PREFIX_RE = lazy_re(r"^(?:[A-Za-z0-9][\w.\-]*[-_]\d+\s+\| ?|(?:stdout|stderr) [FPfp] |"
                               r"(?:worker|node|host|gpu|compute|trainer)[-_]?\d+: |\d{1,3}(?:\.\d{1,3}){3}: )")
_MONTHS = {m: i for i, m in enumerate(("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), 1)}
# the host is left out by some collectors (`Jan 30 17:40:12 kernel: NVRM: ...`): a host never ends with `:`
_SYSLOG_RE = lazy_re(r"^([A-Za-z][a-z]{2}) +(\d{1,2}) (\d{2}):(\d{2}):(\d{2}) (?:(\S*[^\s:]) )?([\w.\-/\[\]]+?)(?:\[\d+\])?: ")
_DMESG_UPTIME_RE = lazy_re(r"^\[\s*(\d+\.\d+)\]\s?")
_DMESG_T_RE = lazy_re(r"^\[(?:[A-Za-z][a-z]{2} )?([A-Za-z][a-z]{2}) +(\d{1,2}) (\d{2}):(\d{2}):(\d{2}) (\d{4})\]\s?")
_ISO_RE = lazy_re(
    r"^\[?(\d{4})-(\d{2})-(\d{2})[Tt _](\d{2}):(\d{2}):(\d{2})(?:[.,](\d+))?([Zz]|[+-]\d{2}:?\d{2})?\]?(?:\s*[-|:]\s*|\s+)"
)
_HMS_RE = lazy_re(r"^\[?(\d{2}):(\d{2}):(\d{2})(?:[.,](\d+))?\]?\s+")


def _epoch(year: int, month: int, day: int, hh: int, mm: int, ss: int, frac: str = "") -> float:
    """Seconds since the epoch, timezone-free, so logs from different machines compare alike."""
    import calendar  # here: its import (and datetime's) is not needed before a timestamp is read

    try:
        base = calendar.timegm((year, month, day, hh, mm, ss, 0, 0, 0))
    except (ValueError, OverflowError):
        return 0.0
    return base + (float("0." + frac) if frac else 0.0)


def strip_prefixes(text: str) -> tuple[str, Optional[int], Optional[str], Optional[float]]:
    """Peel rank prefixes and timestamps off a line. Returns (text, rank, timestamp, time_s)."""
    rank: Optional[int] = None
    stamp: Optional[str] = None
    time_s: Optional[float] = None
    for _ in range(5):
        m = _RANK_PREFIX_RE.match(text)
        if m:
            value = m.group(1) or m.group(2) or m.group(3)
            rank = int(value) if len(value) <= 7 else None  # 5,000 digits: not a rank (and int() refuses it)
            text = text[m.end():]
            continue
        m = _SOURCE_PREFIX_RE.match(text)
        if m:
            text = text[m.end():]
            continue
        if rank is None and text[:1].isdigit():
            m = _SRUN_LABEL_RE.match(text)
            if m:
                rank = int(m.group(1))
                text = text[m.end():]
                continue
        if text[:1] == "[":
            m = _DMESG_UPTIME_RE.match(text)
            if m:
                stamp = stamp or m.group(0).strip()
                time_s = time_s if time_s is not None else float(m.group(1))
                text = text[m.end():]
                continue
            m = _DMESG_T_RE.match(text)
            if m:
                stamp = stamp or m.group(0).strip()
                if time_s is None and m.group(1).title() in _MONTHS:
                    time_s = _epoch(int(m.group(6)), _MONTHS[m.group(1).title()], int(m.group(2)),
                                    int(m.group(3)), int(m.group(4)), int(m.group(5)))
                text = text[m.end():]
                continue
        c = text[:1]
        if c.isdigit() or c == "[":
            m = _ISO_RE.match(text)
            if m:
                stamp = stamp or m.group(0).strip(" -|:[]")
                if time_s is None:
                    time_s = _epoch(*(int(m.group(i)) for i in range(1, 7)), m.group(7) or "")
                text = text[m.end():]
                continue
            m = _HMS_RE.match(text)
            if m:
                stamp = stamp or m.group(0).strip(" []")
                if time_s is None:
                    time_s = int(m.group(1)) * 3600 + int(m.group(2)) * 60 + int(m.group(3)) + (
                        float("0." + m.group(4)) if m.group(4) else 0.0)
                text = text[m.end():]
                continue
        elif c.isupper() or (c.islower() and text[3:4] == " " and text[:3].title() in _MONTHS):  # (lower-cased paste)
            m = _SYSLOG_RE.match(text)
            if m and m.group(1).title() in _MONTHS:
                stamp = stamp or m.group(0)[:m.start(7)].rstrip().rsplit(" ", 1 if m.group(6) else 0)[0]
                if time_s is None:
                    # syslog has no year; a fixed one keeps lines of one log comparable
                    time_s = _epoch(2000, _MONTHS[m.group(1).title()], int(m.group(2)), int(m.group(3)),
                                    int(m.group(4)), int(m.group(5)))
                text = text[m.end():]
                continue
        break
    return text, rank, stamp, time_s


def collapse_cr(text: str) -> str:
    """The last state of a line redrawn with `\\r` (tqdm), keeping a log dict glued after a bar."""
    if "\r" in text:
        parts = [p for p in text.split("\r") if p.strip()]
        text = parts[-1] if parts else ""
    return strip_bar(text)


def strip_bar(text: str) -> str:
    """`  5%|▌    | 5/100 [00:01<00:19, 4.9it/s]{'loss': 0.7}` -> `{'loss': 0.7}`; a bar alone stays."""
    if "%|" not in text:
        return text
    m = _BAR_RE.match(text)
    if m and m.end() < len(text):
        rest = text[m.end():].lstrip()
        if rest:
            return rest
    return text


def is_progress_bar(text: str) -> bool:
    """True for a tqdm bar state (possibly with a postfix), false for anything with text glued after."""
    m = _BAR_RE.match(text)
    return bool(m) and not text[m.end():].lstrip().startswith("{")


def strip_box(text: str) -> str:
    """Rich traceback frames: `│ /x/trainer.py:1555 in train │` -> `/x/trainer.py:1555 in train`."""
    if text and (text[0] in _BOX_CHARS or text[-1:] in _BOX_CHARS or text.lstrip()[:1] in _BOX_CHARS):
        text = _BOX_TAIL_RE.sub("", _BOX_LEAD_RE.sub("", text))
    return text


def truncate(text: str, focus: int = 0, limit: int = MAX_LINE_CHARS) -> str:
    """Cut an overlong line to `limit` characters around `focus` (the position that matters)."""
    if len(text) <= limit:
        return text
    start = max(0, min(focus - limit // 2, len(text) - limit))
    return text[start:start + limit]


_QUOTE_RE = lazy_re(r"^(?:> ?)+")  # markdown quote markers (and `>>> ` prompts) of a pasted log
# a paste with line numbers (a gist, a numbered code view: `  12  Traceback ...`, `12\t...`, `12 | ...`, an
# nvidia-smi table row `  18  |   3  NVIDIA A100 ... |`)
# or an IPython input prompt (`In [7]: trainer.train()`); not a notebook table row (`50  No log  0.69`,
# `50  0.6931`, `100\tnan\tnan`: a number, nan or inf follows) nor srun's `3: ` rank label. A version
# (`  10  2.4.1+cpu`: two dots) or a CSV row (`   4  0, NVIDIA GeForce RTX 3090, 92, ...`: a number and a
# comma) is no table cell: the line number before it is peeled (and a reply's `> ` after it: a numbered view
# of a quoted paste)
_PASTE_PREFIX_STARTS = frozenset("0123456789 \tI")
_PASTE_PREFIX_RE = lazy_re(r"^(?:In \[\d+\]: |[ \t]{0,6}\d{1,5}(?:\t| {2,}| \| )(?=[A-Za-z_\[{(<>'\"/\\~.|+-]|\d{1,4}\.\d{1,4}\.\d|\d{1,5}, )"
                           r"(?!No log|nan\b|inf\b|NaN\b|-?inf\b))")


# a line number before a notebook table row, once its header showed the paste is numbered (`  13  50  0.69`)
_LINE_NUMBER_RE = lazy_re(r"^[ \t]{0,6}\d{1,5}(?:\t| {2,}| \| )")


def peel_table_line(raw: str, numbered: Optional[bool] = None) -> tuple[str, bool]:
    """A raw line of a notebook table behind the prefixes normalise() peels (ANSI colours, markdown quote
    markers and `>>> ` prompts, line numbers, rank / source / timestamp prefixes), without its bars or box
    characters: (text, whether a line number was peeled). A header (`numbered` None) loses a line number
    as normalise() peels it; a row starts with a number of its own (and `20  -  1.1` looks like a numbered
    line), so its first number is peeled only when `numbered` is True (its header's was)."""
    if "\x1b" in raw:
        raw = _ANSI_RE.sub("", raw)
    if raw[:1] == ">":
        raw = _QUOTE_RE.sub("", raw, count=1)
    had_number = False
    if numbered is not False and raw[:1] in _PASTE_PREFIX_STARTS:
        m = (_PASTE_PREFIX_RE if numbered is None else _LINE_NUMBER_RE).match(raw)
        if m and m.end():
            raw, had_number = raw[m.end():], not raw.startswith("In [")
            if raw[:1] == ">":  # a numbered view of a reply: `   6  > | NVIDIA-SMI 535.183.01 ...`
                raw = _QUOTE_RE.sub("", raw, count=1)
    return strip_prefixes(raw.rstrip())[0], had_number


def normalise(raw: str) -> tuple[str, str, Optional[int], Optional[str], Optional[float]]:
    """Raw decoded line -> (text for rules, original trimmed, rank, timestamp, time_s)."""
    if "\x1b" in raw:
        raw = _ANSI_RE.sub("", raw)
    if raw[:1] == ">":
        raw = _QUOTE_RE.sub("", raw, count=1)
    if raw[:1] in _PASTE_PREFIX_STARTS:
        raw = _PASTE_PREFIX_RE.sub("", raw, count=1)
        if raw[:1] == ">":  # a numbered view of a reply (`  12  > RuntimeError: ...`)
            raw = _QUOTE_RE.sub("", raw, count=1)
    if "\r" in raw:
        raw = collapse_cr(raw)
    original = raw.strip()
    raw = fold_fullwidth_colon(raw)  # `original` keeps it
    text, rank, stamp, time_s = strip_prefixes(raw.rstrip())
    if "%|" in text:
        text = strip_bar(text)
    text = strip_box(text).strip()
    # rank prefixes can follow a timestamp (journald around torchrun output)
    if rank is None and text[:1] in "[r":
        text2, rank2, _, _ = strip_prefixes(text)
        if rank2 is not None:
            text, rank = text2.strip(), rank2
    if len(text) <= oswords.MAX_CHARS:
        # the shell's signal line in the user's locale (`Getötet`, `Zeile 38: 4242 Speicherzugriffsfehler`) reads
        # as the English one (data/os_strings.yaml); `original` keeps the line as pasted
        text = oswords.unlocalize(text)
    return text, original, rank, stamp, time_s


def fold_fullwidth_colon(text: str) -> str:
    """The full-width colon of CJK prose before an English message (`错误信息：Killed`, `エラー：ValueError: ...`)
    as the ASCII one the rules write (`: killed`)."""
    return text.replace("\uff1a", ": ") if "\uff1a" in text else text


_NORMALISED: dict[str, tuple] = {}  # decoded line -> normalise(line); bounded, cleared when full


def make_line(raw: bytes, file: str, lineno: int, default_rank: Optional[int] = None,
              focus: int = 0, input_index: int = 0) -> Line:
    """Decode (bad bytes replaced), truncate and normalise one raw line or `\\r` segment."""
    if len(raw) > MAX_LINE_CHARS:
        start = max(0, min(focus - MAX_LINE_CHARS // 2, len(raw) - MAX_LINE_CHARS))
        raw = raw[start:start + MAX_LINE_CHARS]
    decoded = raw.decode("utf-8", "replace")
    cached = _NORMALISED.get(decoded)
    if cached is None:
        cached = normalise(decoded)  # a pure function of the line: repeated lines reuse it
        if len(decoded) <= 2048:
            if len(_NORMALISED) >= 4096:
                _NORMALISED.clear()
            _NORMALISED[decoded] = cached
    text, original, rank, stamp, time_s = cached
    return Line(file=file, lineno=lineno, text=text, rank=rank if rank is not None else default_rank,
                timestamp=stamp, time_s=time_s, raw=original, input_index=input_index)


def iter_lines(inputs: list[Input]) -> Iterator[Line]:
    """Every line of every input, normalised (progress-bar redraws collapsed). For tests and small
    inputs; the engine reads candidate lines only (loradoctor.logs.scan)."""
    for item in inputs:
        lineno = 0
        for block in iter_blocks(item):
            lines = block.split(b"\n")
            if block.endswith(b"\n"):
                lines.pop()
            for raw in lines:
                lineno += 1
                if raw.endswith(b"\r"):
                    raw = raw[:-1]
                line = make_line(raw, item.path, lineno, item.rank, input_index=item.index)
                if line.rank is not None:
                    item.ranks.add(line.rank)
                yield line
        item.lines = lineno
