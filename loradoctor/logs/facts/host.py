"""host: the kernel's OOM killer, a bare `Killed`, exit status 137 / -9 (killed.*), Windows' Code 43 for an
NVIDIA device (code43.*), a line that names a Blackwell card (card.blackwell) and one that names a card older than
Volta (card.pre_volta)."""

from __future__ import annotations

import re
from loradoctor.record import record
from typing import Any, Optional

from loradoctor.lazyre import lazy_re
from loradoctor.logs import oswords
from loradoctor.logs.facts.common import MAX_ID, Extractor, _bounded_int
from loradoctor.units import MAX_PLAUSIBLE_BYTES

@record
class OomKill:
    pid: Optional[int]
    process: Optional[str]
    anon_rss_bytes: Optional[int]


# `Out of memory: Killed process`, `Memory cgroup out of memory: Killed process`, `oom-kill:... Kill process`:
# the prefixes are optional, so the regex starts at `Kill` (an optional `:?\s*` before it rescanned a
# long run of spaces from each of them)
_OOM_KILL_RE = lazy_re(r"Kill(?:ed)? process (\d+) \(([^)]*)\)(?:.*?anon-rss:\s*(\d+)\s*kB)?")
# (`killed` too: a lower-cased paste, an issue title, keeps the shell's word in lower case)
_BARE_KILLED_RE = lazy_re(r"^(?:\S*: line \d+:\s+\d+\s+)?[Kk]illed(?:\s+\S.*)?$")
_EXIT_CODE_RE = lazy_re(r"(?:exit(?:ed with)? (?:code|status)|exitcode|return code|returned non-zero exit status|exit_code)"
                           r"\s*(?:[:=]\s*)?(-?\d+)", re.I)  # not `\s*[:=]?\s*`: two runs that split the same
                                                               # whitespace in n ways (tab padding: 3.2 s a line)


def parse_oom_killer(text: str) -> Optional[OomKill]:
    """`Out of memory: Killed process 12345 (python) total-vm:..kB, anon-rss:..kB, ...` (and the
    older `Kill process N (name) score ...`, the cgroup form). None for other text."""
    if "process" not in text or "ill" not in text:
        return None
    m = _OOM_KILL_RE.search(text)
    if not m:
        return None
    rss_kb = _bounded_int(m.group(3), MAX_PLAUSIBLE_BYTES // 1024)
    return OomKill(pid=_bounded_int(m.group(1), MAX_ID), process=m.group(2),
                   anon_rss_bytes=rss_kb * 1024 if rss_kb is not None else None)


def is_bare_killed(text: str) -> bool:
    """`Killed` alone, or the shell's `bash: line 1: 1234 Killed   python train.py`."""
    return bool(_BARE_KILLED_RE.match(text.strip())) and "process" not in text


def parse_exit_code(text: str) -> Optional[int]:
    m = _EXIT_CODE_RE.search(text)
    if m:
        return _bounded_int(m.group(1), MAX_ID)
    if "Signals.SIGKILL" in text:
        return -9
    return None


_CODE43_RE = lazy_re(r"\(?Code 43\)?|Problem Code:\s*43\b")
# (a name of at most 80 characters: each lazy step's lookahead scans the spaces after it)
_DEVICE_NAME_RE = lazy_re(r"((?:NVIDIA )?(?:GeForce|Quadro|Tesla|TITAN|RTX|GTX)[\w \-]{0,80}?)(?=\s*[:;,()]|\s+(?:Windows|has|is|reported)\b|$)")


# a Blackwell-generation GPU named anywhere (a title, a banner, collect_env, prose): RTX 50xx (5050-5090, Ti / D),
# RTX PRO ... Blackwell, B100 / B200 / GB200, or its architecture (sm_120 / sm_100, with or without `_`)
_BLACKWELL_RE = lazy_re(r"\b(?:rtx ?(?:pro ?)?50[5-9]0(?: ?ti| ?d)?\b|blackwell\b|g?b[12]00\b|sm_?1[02]0a?\b)", re.I)


def names_blackwell(text: str) -> bool:
    """The line names a Blackwell-generation GPU or its architecture (`RTX 5090`, `B200`, `sm_120`)."""
    return bool(_BLACKWELL_RE.search(text))


# a GPU older than Volta (compute capability below 7.0: Kepler, Maxwell, Pascal) named anywhere: a Tesla K / M / P
# data-center card, a Quadro K / M / P, a GeForce GTX 9xx / 10xx or TITAN X / Xp, or its capability in a banner or a
# library's check (Unsloth's `CUDA = 6.1.`, bitsandbytes' `Highest compute capability among GPUs detected: 3.5`,
# torch's `your device is of CUDA capability 6.0`). Not an `sm_6x` token: torch's lists of the architectures a
# wheel carries (`supports CUDA capabilities sm_50 sm_60 sm_70`) name every old one.
_PRE_VOLTA_RE = lazy_re(
    r"\b(?:tesla ?(?:[km]\d{1,2}|p(?:4|40|100|6))|quadro ?[kmp]\d{3,4}|gtx ?(?:9[5-8]0|10[5-8]0)|titan ?xp?)\b"
    r"|\bCUDA ?[=:] ?[3-6]\.\d\b(?! ?\d)"
    r"|\b(?:compute|CUDA) capability\b[^\n<>=]{0,40}?(?<![\d.])[3-6]\.\d\b(?!\.\d)", re.I)


def names_pre_volta(text: str) -> bool:
    """The line names a GPU older than Volta (`Tesla P40`, `GTX 1080 Ti`) or a compute capability below 7.0 in a
    banner or a library's check (`CUDA = 6.1.`, `compute capability among GPUs detected: 3.5`)."""
    return bool(_PRE_VOLTA_RE.search(text))


class HostExtractor(Extractor):
    TRIGGERS = (
        ("Killed", True), ("Kill process", False), ("exit code", True), ("exit status", True),
        ("return code", True), ("SIGKILL", False), ("Code 43", False), ("Problem Code", False),
        # the rest of _EXIT_CODE_RE's words (`failed (exitcode: -9)`, `exit_code: 137`, `exited with code`)
        ("exitcode", True), ("exit_code", True), ("exited with", True),
        # card.blackwell (_BLACKWELL_RE's words)
        ("RTX 50", True), ("RTX50", True), ("RTX PRO", True), ("Blackwell", True), ("B200", True), ("B100", True),
        ("sm_120", True), ("sm_100", True), ("sm120", True), ("sm100", True),
        # card.pre_volta (_PRE_VOLTA_RE's words)
        ("Tesla K", True), ("Tesla M", True), ("Tesla P", True), ("Quadro K", True), ("Quadro M", True),
        ("Quadro P", True), ("GTX 9", True), ("GTX9", True), ("GTX 10", True), ("GTX10", True), ("TITAN X", True),
        ("CUDA = ", True), ("CUDA: ", True), ("capability", True),
    ) + oswords.trigger_words()  # the shell's `Killed` / `Segmentation fault` in the user's locale (the reader
                                 # gives the line the English words: data/os_strings.yaml)

    def feed(self, line: Any) -> bool:
        text = line.text
        touched = self._killed(line)
        touched |= self._code43(line)
        if "card.blackwell" not in self.sink.values and names_blackwell(text):
            self.sink.values["card.blackwell"] = True
            self.sink._evidence("card", line)
        if "card.pre_volta" not in self.sink.values and names_pre_volta(text):
            self.sink.values["card.pre_volta"] = True
            self.sink._evidence("card", line)
        code = parse_exit_code(text) if ("xit" in text or "return code" in text or "SIGKILL" in text) else None
        if code is not None and code in (137, -9):
            self.sink._set_first({"killed.exit_code": code})
            self.sink._evidence("killed", line)
            touched = True
        return touched

    def _killed(self, line: Any) -> bool:
        """OOM-killer and bare `Killed` lines; True when the line was one."""
        text = line.text
        kill = parse_oom_killer(text)
        if kill is not None:
            self.sink.values["killed.oom_killer"] = True
            self.sink._set_first({"killed.pid": kill.pid, "killed.process": kill.process,
                             "killed.anon_rss_bytes": kill.anon_rss_bytes})
            self.sink._evidence("killed", line)
            return True
        if "illed" in text and is_bare_killed(text):
            self.sink.values["killed.bare"] = True
            self.sink._evidence("killed", line)
            return True
        return False

    def _code43(self, line: Any) -> bool:
        if not _CODE43_RE.search(line.text):
            return False
        self.sink.values["code43.present"] = True
        self.sink._evidence("code43", line)
        d = _DEVICE_NAME_RE.search(line.text)
        if d and "code43.device" not in self.sink.values:
            self.sink.values["code43.device"] = d.group(1).strip()
        return True

