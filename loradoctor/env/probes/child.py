"""Run a probe script in a child process of the user's interpreter, with a timeout.

The child prints `LORADOCTOR_PROBE {json}` lines; we keep the last one. A child that raises,
dies from a signal (negative return code) or hangs (killed at the timeout) yields a result with
`probe.status` = failed / crashed / timeout and the tail of its stderr, instead of taking loradoctor
down with it.

Children end with us. Each starts in its own session (its own process group) with a random tag in
its environment (TAG_VAR), which every descendant inherits; when a child ends, times out, or
loradoctor is interrupted (SIGINT / SIGTERM while `reaping()` is active), its group is killed and so
is every process still carrying its tag: grandchildren that called setsid() and daemons re-parented
to PID 1 included, without cgroups (a descendant that clears its environment escapes; on systems
without /proc the tree psutil sees is used instead). What a child prints is drained as it comes and
capped (the first HEAD_BYTES and the last TAIL_BYTES of each stream): a torch that prints 600 MB
must not cost loradoctor 600 MB.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Optional

MARKER = "LORADOCTOR_PROBE "
STDERR_TAIL_LINES = 25
STDERR_LINE_CHARS = 1000  # a line of evidence longer than this is shortened in the middle
HEAD_BYTES = 16 << 10
TAIL_BYTES = 64 << 10
MAX_RECORD_BYTES = 4 << 20  # a probe record line longer than this is not a record
TAG_VAR = "LORADOCTOR_PROBE_TAG"
# What the child was doing after it printed each stage (child_torch.py / child_ext.py).
STAGE_WHAT = {None: "while starting", "start": "while starting", "found": "during the import",
              "imported": "after the import (CUDA init or extension load)", "cuda_init": "while reading device properties",
              "devices": "during the deep GPU test", "deep": "while finishing"}
_HERE = Path(__file__).resolve().parent
_LIVE: "set[Child]" = set()
_LIVE_LOCK = threading.RLock()  # re-entrant: the SIGINT handler may run while the main thread holds it


def source(script: str) -> str:
    """The text of a child probe script (it runs with `python -c`, so nothing needs installing there)."""
    return (_HERE / script).read_text(encoding="utf-8")


class _Capture(threading.Thread):
    """Drains one pipe of a child: keeps the first HEAD_BYTES and the last TAIL_BYTES, counts the rest,
    and (markers=True) keeps the last complete `LORADOCTOR_PROBE` line whatever else was printed."""

    def __init__(self, pipe: Any, markers: bool) -> None:
        super().__init__(daemon=True)
        self._pipe, self._markers = pipe, markers
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0
        self.record: Optional[bytes] = None
        self._partial = bytearray()
        self._overflow = False
        self.start()

    def run(self) -> None:
        read = getattr(self._pipe, "read1", self._pipe.read)
        try:
            while True:
                chunk = read(1 << 16)
                if not chunk:
                    break
                self.total += len(chunk)
                room = HEAD_BYTES - len(self.head)
                if room > 0:
                    self.head += chunk[:room]
                    chunk_rest = chunk[room:]
                else:
                    chunk_rest = chunk
                if chunk_rest:
                    self.tail += chunk_rest
                    if len(self.tail) > 2 * TAIL_BYTES:
                        del self.tail[:-TAIL_BYTES]
                if self._markers:
                    self._scan(chunk)
        except (OSError, ValueError):
            pass
        finally:
            if self._markers:
                self._line(bytes(self._partial))

    def _scan(self, chunk: bytes) -> None:
        start = 0
        while True:
            nl = chunk.find(b"\n", start)
            if nl < 0:
                if not self._overflow:
                    self._partial += chunk[start:]
                    if len(self._partial) > MAX_RECORD_BYTES:
                        self._partial.clear()
                        self._overflow = True
                return
            if not self._overflow:
                self._partial += chunk[start:nl]
                self._line(bytes(self._partial))
            self._partial.clear()
            self._overflow = False
            start = nl + 1

    def _line(self, line: bytes) -> None:
        if line.startswith(MARKER.encode()):
            self.record = line

    def text(self) -> str:
        """What was kept, with the size of what was dropped in between."""
        del self.tail[:-TAIL_BYTES]
        omitted = self.total - len(self.head) - len(self.tail)
        middle = f"\n[... {omitted} bytes of output omitted ...]\n".encode() if omitted > 0 else b""
        return (bytes(self.head) + middle + bytes(self.tail)).decode("utf-8", "replace")


class Child:
    """A started child process in its own session, tagged, with capped output; see the module doc.
    `finish(timeout_s)` waits for it, then kills whatever of it is left."""

    def __init__(self, argv: list[str], env: Optional[dict] = None, label: str = "probe") -> None:
        self.label = label
        self.started = time.monotonic()
        self.tag = os.urandom(8).hex()
        env = dict(os.environ if env is None else env)
        env[TAG_VAR] = self.tag
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env=env, start_new_session=True)  # its own process group
        with _LIVE_LOCK:
            _LIVE.add(self)
        self._out = _Capture(self.proc.stdout, markers=True)
        self._err = _Capture(self.proc.stderr, markers=False)
        self.timed_out = False

    def running(self) -> bool:
        return self.proc.poll() is None

    def finish(self, timeout_s: float) -> tuple[Optional[int], bool]:
        """(return code, timed out). Everything the child started is gone afterwards."""
        try:
            self.proc.wait(timeout=max(0.0, timeout_s))
        except subprocess.TimeoutExpired:
            self.timed_out = True
        self.kill()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover - a child that survives SIGKILL
            pass
        for cap in (self._out, self._err):
            cap.join(5)
        return self.proc.returncode, self.timed_out

    def kill(self) -> None:
        """SIGKILL the child's group and every process carrying its tag (repeated while new ones appear)."""
        for _ in range(5):
            pids = tagged_pids(self.tag)
            if self.proc.poll() is None:
                pids.add(self.proc.pid)
            if not _PROC_OK:
                pids |= _psutil_descendants(self.proc.pid)
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # the group, grandchildren that stayed in it
            except (AttributeError, OSError):
                pass
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.01)
        with _LIVE_LOCK:
            _LIVE.discard(self)

    def stdout_record(self) -> str:
        return self._out.record.decode("utf-8", "replace") if self._out.record else ""

    def stdout_text(self) -> str:
        return self._out.text()

    def stderr_text(self) -> str:
        return self._err.text()


_PROC_OK = os.path.isdir("/proc/self")


def tagged_pids(tag: str) -> set[int]:
    """Pids of the processes (other than us) whose environment carries TAG_VAR=tag (Linux /proc)."""
    if not _PROC_OK:
        return set()
    needle = f"{TAG_VAR}={tag}".encode()
    me = os.getpid()
    found = set()
    try:
        names = os.listdir("/proc")
    except OSError:
        return found
    for name in names:
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                env = fh.read()
        except OSError:
            continue
        if needle + b"\0" in env or env.endswith(needle):
            found.add(int(name))
    return found


def _psutil_descendants(pid: int) -> set[int]:
    try:
        import psutil

        return {p.pid for p in psutil.Process(pid).children(recursive=True)}
    except Exception:  # noqa: BLE001 - no psutil, or the process is gone
        return set()


def kill_all() -> None:
    """Kill every child still running (and its descendants): on SIGINT / SIGTERM and on the way out."""
    with _LIVE_LOCK:
        live = list(_LIVE)
    for c in live:
        c.kill()


@contextlib.contextmanager
def reaping() -> Iterator[None]:
    """While active (main thread only): SIGINT and SIGTERM first kill every child and its descendants,
    then end loradoctor as they would (KeyboardInterrupt; exit 143). Restores the handlers after, and
    kills whatever is still running when the block is left by an exception."""
    installed = {}
    if threading.current_thread() is threading.main_thread():
        def handler(signum: int, frame: Any) -> None:
            kill_all()
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise SystemExit(128 + signum)

        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                installed[sig] = signal.signal(sig, handler)
            except (ValueError, OSError):
                pass
    try:
        yield
    except BaseException:
        kill_all()
        raise
    finally:
        for sig, old in installed.items():
            signal.signal(sig, old)


def run_capped(argv: list[str], timeout_s: float, env: Optional[dict] = None) -> tuple[Optional[int], str, str, bool]:
    """Run a command as a Child: (return code, stdout head+tail, stderr head+tail, timed out).
    Raises OSError when it cannot start."""
    c = Child(argv, env=env)
    code, timed_out = c.finish(timeout_s)
    return code, c.stdout_text(), c.stderr_text(), timed_out


_PY_CHECK = "import sys; sys.stdout.write('LORADOCTOR_PYTHON %d.%d' % tuple(sys.version_info[:2]))"


def interpreter_problem(python: str, timeout_s: float = 20.0) -> Optional[str]:
    """Why `python` cannot be probed (not a Python interpreter, Python 2, does not answer), or None."""
    try:
        code, out, err, timed_out = run_capped([python, "-c", _PY_CHECK], timeout_s)
    except OSError as exc:
        return f"cannot run it ({exc.strerror or exc})"
    if timed_out:
        return f"it did not answer `-c` within {timeout_s:g} s"
    marker = out.rfind("LORADOCTOR_PYTHON ")
    if marker < 0 or code != 0:
        return "not a Python interpreter (it did not run `-c \"import sys ...\"` as Python does)"
    version = out[marker + len("LORADOCTOR_PYTHON "):].strip()
    if not version.startswith("3."):
        return f"Python {version}: the probes need Python 3"
    return None


class ChildProbe:
    """A started child probe; `result()` waits for it (up to its timeout) and returns its section."""

    def __init__(self, script: str, args: list[str], timeout_s: float, python: Optional[str] = None,
                 python_flags: Optional[list[str]] = None) -> None:
        self.script = script
        self.timeout_s = timeout_s
        self.started = time.monotonic()
        text = source(script)
        env = dict(os.environ)
        env.setdefault("PYTHONFAULTHANDLER", "1")  # a segfault prints the Python stack to stderr
        env["PYTHONUNBUFFERED"] = "1"
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        self.child: Optional[Child] = None
        self.spawn_error: Optional[str] = None
        try:
            self.child = Child([python or sys.executable, *(python_flags or []), "-c", text, *args], env=env,
                               label=script)
        except OSError as exc:
            self.spawn_error = f"cannot start {python or sys.executable}: {exc}"

    @property
    def proc(self) -> Optional[subprocess.Popen]:
        return self.child.proc if self.child is not None else None

    def running(self) -> bool:
        return self.child is not None and self.child.running()

    def result(self) -> dict[str, Any]:
        if self.child is None:
            return {"probe": {"status": "failed", "reason": self.spawn_error}}
        remaining = max(0.1, self.timeout_s - (time.monotonic() - self.started))
        code, timed_out = self.child.finish(remaining)
        elapsed = round(time.monotonic() - self.started, 3)
        return interpret(self.child.stdout_record(), self.child.stderr_text(), code, timed_out, self.timeout_s, elapsed)


def interpret(stdout: str, stderr: str, returncode: Optional[int], timed_out: bool, timeout_s: float,
              elapsed_s: float) -> dict[str, Any]:
    """Turn what a child printed into a snapshot section with a `probe` record."""
    record: dict[str, Any] = {}
    for line in stdout.splitlines():
        if line.startswith(MARKER):
            try:
                record = json.loads(line[len(MARKER):])
            except json.JSONDecodeError:
                pass
    tail = "\n".join(_shorten(line) for line in stderr.rstrip().splitlines()[-STDERR_TAIL_LINES:])
    stage = record.pop("stage", None)
    probe: dict[str, Any] = {"elapsed_s": elapsed_s, "returncode": returncode, "last_stage": stage}
    if tail:
        probe["stderr_tail"] = tail
    if timed_out:
        probe.update(status="timeout", timeout_s=timeout_s, reason=f"no answer within {timeout_s:g} s ({STAGE_WHAT.get(stage, stage)})")
    elif returncode is not None and returncode < 0:
        try:
            sig = signal.Signals(-returncode).name
        except ValueError:
            sig = f"signal {-returncode}"
        probe.update(status="crashed", reason=f"killed by {sig} {STAGE_WHAT.get(stage, stage)}")
    elif stage == "missing":
        probe["status"] = "missing"
    elif stage == "done" and returncode == 0:
        probe["status"] = "ok"
    else:
        reason = record.get("import_error") or _last_error_line(tail) or f"exit code {returncode}"
        probe.update(status="failed", reason=reason)
    record["probe"] = probe
    if stage in ("missing",):
        record["installed"] = False
    elif stage is not None:
        record.setdefault("installed", True)
    if probe["status"] not in ("ok", "missing"):
        record["error"] = f"could not check: {probe['reason']}"
    return record


def _last_error_line(tail: str) -> Optional[str]:
    for line in reversed(tail.splitlines()):
        s = line.strip()
        if s and (":" in s) and not s.startswith(("File ", "^", "~")):
            return s[:300]
    return None


def _shorten(line: str, limit: int = STDERR_LINE_CHARS) -> str:
    if len(line) <= limit:
        return line
    half = limit // 2
    return f"{line[:half]} [... {len(line) - 2 * half} characters ...] {line[-half:]}"
