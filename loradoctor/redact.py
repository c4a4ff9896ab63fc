"""Redaction of what must not reach a shared report: secrets (Hugging Face, OpenAI, AWS, GitHub,
Slack tokens, bearer / basic auth, passwords in URLs and in `password=` style settings, private key
blocks), e-mail addresses, IPv4 / IPv6 addresses, host names (private FQDNs and this machine's own
name), user names in home-like paths (`/home/<u>`, `/Users/<u>`, `C:\\Users\\<u>`, `/scratch/<u>`,
`/data/users/<u>`, ... and the current user's name as a path component anywhere) and GPU UUIDs.
The shape stays: `hf_****`, `https://user:****@host`, `/home/<user>/run.log`, `GPU-<uuid>`.

Where: at one output point. `install()` (called by the CLI's main) wraps sys.stdout in a stream that
redacts every complete line it is given, so every command's report, in every format, passes through
`Redactor.line`. It is on for `--format md` (a report meant to be pasted into an issue), on for any
format with `--redact`, off with `--no-redact`.

Linear time: every pattern starts at a literal or behind a lookbehind that allows one start per
token, and every repetition is bounded, so a 50 MB line without a match costs one pass per pattern
(tests/test_redact.py times adversarial lines).
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any, Callable, List, Optional

# Hosts whose names are public (docs and download sites in our own fixes): never redacted.
PUBLIC_HOSTS = ("huggingface.co", "hf.co", "github.com", "githubusercontent.com", "pytorch.org", "nvidia.com",
                "pypi.org", "pythonhosted.org", "python.org", "anaconda.org", "conda-forge.org", "readthedocs.io",
                "stackoverflow.com", "example.com", "example.org", "wandb.ai", "docker.com", "ubuntu.com")
# Top-level domains that make a dotted word a host name (not `config.json`, not `torch.nn.functional`).
_TLDS = ("com|net|org|io|ai|edu|gov|mil|dev|app|cloud|co|uk|de|fr|jp|cn|kr|ca|au|nl|ch|se|eu|ru|br|es|pl|"
         "local|localdomain|internal|intranet|lan|corp|home|cluster|svc|priv|private|arpa")
_HOME_ROOTS = r"home|Users|users|scratch|data/users|nfs/home|mnt/home|gpfs/home|lustre/home|export/home|storage/home"
_NOT_SECRET_VALUES = {"none", "null", "true", "false", "****", "***", "<redacted>", "''", '""', "0", "1"}

_KEY_BEGIN = re.compile(r"-----BEGIN [A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----")
_KEY_END = re.compile(r"-----END [A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----")

Sub = Callable[[str], str]


def _sub(pattern: str, repl: Any, flags: int = 0, needles: tuple = ()) -> Sub:
    """A substitution; with `needles`, run only on a line whose lower-case text holds one of them."""
    rx = re.compile(pattern, flags)
    if not needles:
        return lambda text: rx.sub(repl, text)
    return lambda text: rx.sub(repl, text) if any(n in text.lower() for n in needles) else text


def _bearer(m: "re.Match[str]") -> str:
    token = m.group(3)
    # "basic configuration" is prose; a credential has a digit, padding, or is long and mixed-case
    looks = any(c.isdigit() for c in token) or token.endswith("=") or (
        len(token) >= 20 and token.lower() != token)
    return f"{m.group(1)}{m.group(2)}****" if looks else m.group(0)


def _setting(m: "re.Match[str]") -> str:
    name, sep, value = m.group(1), m.group(2), m.group(3)
    if value.lower() in _NOT_SECRET_VALUES or value.startswith(("<", "$", "%", "{")):
        return m.group(0)
    if name.lower().endswith("token"):  # pad_token: <pad>, eos_token = </s> are not secrets
        if len(value) < 16 or not any(c.isdigit() for c in value) or not any(c.isalpha() for c in value):
            return m.group(0)
    return f"{name}{sep}****"


def _ipv4(m: "re.Match[str]") -> str:
    text = m.group(0)
    before = m.string[max(0, m.start() - 9):m.start()].lower()
    if text.startswith(("127.", "0.")) or before.endswith(("==", "version ", "version: ", "v")):
        return text  # loopback, or a four-part version (nvidia-cudnn-cu12==9.1.0.70)
    return "<ip>"


def _ipv6(m: "re.Match[str]") -> str:
    import ipaddress  # here, not at start-up: every command imports this module

    text = m.group(0)
    try:
        addr = ipaddress.IPv6Address(text.split("%", 1)[0])
    except ValueError:
        return text
    return text if addr.is_loopback or addr.is_unspecified else "<ip>"


def _host(m: "re.Match[str]") -> str:
    host = m.group(0)
    low = host.lower()
    if any(low == d or low.endswith("." + d) for d in PUBLIC_HOSTS):
        return host
    return "<host>"


def _current_user() -> Optional[str]:
    import getpass

    for get in (lambda: os.environ.get("USER") or os.environ.get("LOGNAME") or os.environ.get("USERNAME"),
                getpass.getuser):
        try:
            name = get()
        except Exception:  # noqa: BLE001 - no passwd entry in some containers
            continue
        if name:
            return name
    return None


def _own_hostnames() -> List[str]:
    import socket

    names = set()
    try:
        full = socket.gethostname()
    except OSError:
        full = ""
    for name in (full, full.split(".", 1)[0], os.environ.get("HOSTNAME", "")):
        if name and len(name) >= 2 and name.lower() not in ("localhost", "localhost.localdomain"):
            names.add(name)
    return sorted(names, key=len, reverse=True)


class Redactor:
    """Redacts text line by line. Keeps state between lines (inside a private key block), so feed it
    the lines of one output in order; `text()` does that for a whole string."""

    def __init__(self, user: Optional[str] = None, hostnames: Optional[List[str]] = None) -> None:
        self.in_key = False
        user = _current_user() if user is None else user
        hostnames = _own_hostnames() if hostnames is None else hostnames
        subs: List[Sub] = [
            # passwords in URLs: scheme://user:password@host
            _sub(r"\b([A-Za-z][A-Za-z0-9+.-]{0,30}://)([^\s:/@\"'<>]{0,256}):([^\s/@\"'<>]{1,256})@", r"\1\2:****@", needles=("://",)),
            # provider tokens
            _sub(r"\bhf_[A-Za-z0-9]{16,}", "hf_****", needles=("hf_",)),
            _sub(r"\bsk-(?:proj-|ant-|svcacct-)?[A-Za-z0-9_-]{16,}", "sk-****", needles=("sk-",)),
            _sub(r"\b(AKIA|ASIA|AGPA|AIDA|AROA)[0-9A-Z]{16}\b", r"\1****"),
            _sub(r"\b(gh[pousr])_[A-Za-z0-9]{20,}", r"\1_****", needles=("gh",)),
            _sub(r"\bgithub_pat_[A-Za-z0-9_]{20,}", "github_pat_****", needles=("github_pat_",)),
            _sub(r"\b(xox[abprs])-[A-Za-z0-9-]{10,}", r"\1-****", needles=("xox",)),
            _sub(r"\b(glpat)-[A-Za-z0-9_-]{20,}", r"\1-****"),
            _sub(r"\b([Bb]earer|BEARER|[Bb]asic|BASIC|[Tt]oken)(\s{1,5})([A-Za-z0-9._~+/-]{8,2048}={0,2})", _bearer, needles=("bearer", "basic", "token")),
            # password= / secret: / api_key= / aws_secret_access_key = ... settings
            # (the name is matched from its secret-sounding ending: a lazy prefix would retry at every word)
            _sub(r"(?i)(password|passwd|passphrase|secret|api_?key|access_?key|secret_?key|private_?key|token|"
                 r"credentials?)(\"?'?\s{0,3}[:=]\s{0,3}\"?'?)([^\s\"',;{}\[\]]{1,512})", _setting, needles=("pass", "secret", "key", "token", "credential")),
            # GPU and MIG UUIDs
            _sub(r"\b(GPU|MIG)-[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}\b", r"\1-<uuid>", needles=("gpu-", "mig-")),
            # e-mail addresses
            _sub(r"(?<![\w.+-])[\w.+-]{1,64}@[A-Za-z0-9-]{1,63}(?:\.[A-Za-z0-9-]{1,63}){1,8}", "<email>", needles=("@",)),
            # host names: dotted names ending in a known top-level domain (public ones kept)
            _sub(r"(?<![\w.-])(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.){1,10}(?:" + _TLDS + r")(?![\w-])",
                 _host, re.I, needles=(".",)),
            # IPv4 (loopback and 0.x kept), then IPv6 (checked by ipaddress)
            _sub(r"(?<![\w.])(?:(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(?![\w]|\.\d)",
                 _ipv4, needles=(".",)),
            _sub(r"(?<![\w:.])(?:[0-9A-Fa-f]{0,4}:){2,7}[0-9A-Fa-f]{0,4}(?:%[\w]{1,16})?(?![\w:])", _ipv6, needles=("::", ":")),
            # user names in home-like paths
            _sub(r"(/(?:" + _HOME_ROOTS + r")/)(?!<user>)([^/\\\s\"'<>:*|]{1,64})", r"\1<user>"),
            _sub(r"(?i)\b([A-Z]:(?:\\{1,2}|/)(?:Users|Documents and Settings)(?:\\{1,2}|/))(?!<user>)"
                 r"([^\\/\s\"'<>:*|]{1,64})", r"\1<user>"),
        ]
        if user and len(user) >= 2 and user != "root":
            # the current user's name as (part of) a path component anywhere: /opt/work/bob, pytest-of-bob
            esc = re.escape(user)
            subs.append(_sub(r"(?<=[/\\])([^/\\\s\"'<>]{0,64}?[^A-Za-z0-9/\\\s\"'<>])?" + esc + r"(?![A-Za-z0-9])",
                             lambda m: (m.group(1) or "") + "<user>"))
        for name in hostnames:
            subs.append(_sub(r"(?<![\w.-])" + re.escape(name) + r"(?![\w-])", "<host>"))
        self._subs = subs

    def line(self, line: str) -> str:
        """One line (without its newline), redacted."""
        if self.in_key:
            end = _KEY_END.search(line)
            if end is None:
                return "****" if line.strip() else line
            self.in_key = False
            line = ("****" if line[:end.start()].strip() else line[:end.start()]) + line[end.start():]
        line = self._keys_inline(line)
        for sub in self._subs:
            line = sub(line)
        return line

    def _keys_inline(self, line: str) -> str:
        """Private key blocks on this line (a JSON string holds one with \\n escapes); an unfinished one
        starts the block state."""
        out, pos = [], 0
        while True:
            begin = _KEY_BEGIN.search(line, pos)
            if begin is None:
                out.append(line[pos:])
                return "".join(out)
            out.append(line[pos:begin.end()])
            end = _KEY_END.search(line, begin.end())
            if end is None:
                out.append("****" if line[begin.end():].strip() else line[begin.end():])
                self.in_key = True
                return "".join(out)
            out.append("****")
            pos = end.start()

    def text(self, text: str) -> str:
        """A whole text, line by line (line ends kept)."""
        return "\n".join(self.line(part) for part in text.split("\n"))


def redact(text: str) -> str:
    """`text` with secrets and personal details replaced (a fresh Redactor)."""
    return Redactor().text(text)


class RedactingStream:
    """A text stream that redacts each complete line before passing it on; the rest of a line waits
    for its newline (or for close). Everything else (isatty, encoding, fileno) is the wrapped stream's,
    so colours and widths stay as they were."""

    def __init__(self, stream: Any, redactor: Optional[Redactor] = None) -> None:
        self._stream = stream
        self._redactor = redactor or Redactor()
        self._pending = ""

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        data = self._pending + text
        cut = data.rfind("\n")
        if cut < 0:
            self._pending = data
            return len(text)
        self._pending = data[cut + 1:]
        lines = data[:cut].split("\n")
        self._stream.write("\n".join(self._redactor.line(x) for x in lines) + "\n")
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self._stream.flush()

    def close_pending(self) -> None:
        """Write the last, unfinished line."""
        if self._pending:
            pending, self._pending = self._pending, ""
            self._stream.write(self._redactor.line(pending))
        self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


_installed: List[Any] = []


def _own(argv: List[str]) -> List[str]:
    """The arguments before a bare `--` (after it comes another program's command line)."""
    return argv[:argv.index("--")] if "--" in argv else list(argv)


def wanted(argv: List[str]) -> Optional[bool]:
    """Whether this command line asks for redaction: --no-redact off, --redact on, else on for --format md.
    Only loradoctor's own options count: what follows `--` is another program's (`loradoctor run -- CMD`)."""
    argv = _own(argv)
    if "--no-redact" in argv:
        return False
    if "--redact" in argv:
        return True
    for i, arg in enumerate(argv):
        if arg in ("--format=md", "-fmd") or (arg in ("--format", "-f") and argv[i + 1:i + 2] == ["md"]):
            return True
    return None


def install(argv: List[str]) -> List[str]:
    """The CLI's output hook: wrap sys.stdout in a RedactingStream when `wanted(argv)`; returns argv without
    --redact / --no-redact (they apply to every command, whatever its parser)."""
    on = wanted(argv)
    own = _own(argv)
    rest = [a for a in own if a not in ("--redact", "--no-redact")] + argv[len(own):]
    if on and not _installed:
        _installed.append(sys.stdout)
        sys.stdout = RedactingStream(sys.stdout)  # type: ignore[assignment]
    return rest


def uninstall() -> None:
    """Write what is pending and put the real stdout back."""
    if not _installed:
        return
    stream = sys.stdout
    sys.stdout = _installed.pop()
    if isinstance(stream, RedactingStream):
        try:
            stream.close_pending()
        except (OSError, ValueError):
            pass
