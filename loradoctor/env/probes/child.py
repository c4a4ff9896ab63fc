"""Run a probe script in a child process of the user's interpreter, with a timeout.

The child prints `LORADOCTOR_PROBE {json}` lines; we keep the last one. A child that raises,
dies from a signal (negative return code) or hangs (killed at the timeout, with its whole
process group) yields a result with `probe.status` = failed / crashed / timeout and the tail of
its stderr, instead of taking loradoctor down with it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

MARKER = "LORADOCTOR_PROBE "
STDERR_TAIL_LINES = 25
# What the child was doing after it printed each stage (child_torch.py / child_ext.py).
STAGE_WHAT = {None: "while starting", "start": "while starting", "found": "during the import",
              "imported": "after the import (CUDA init or extension load)", "cuda_init": "while reading device properties",
              "devices": "during the deep GPU test", "deep": "while finishing"}
_HERE = Path(__file__).resolve().parent


def source(script: str) -> str:
    """The text of a child probe script (it runs with `python -c`, so nothing needs installing there)."""
    return (_HERE / script).read_text(encoding="utf-8")


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
        self.proc: Optional[subprocess.Popen] = None
        self.spawn_error: Optional[str] = None
        try:
            self.proc = subprocess.Popen(
                [python or sys.executable, *(python_flags or []), "-c", text, *args],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                start_new_session=True,  # its own process group, so a timeout kills grandchildren too
            )
        except OSError as exc:
            self.spawn_error = f"cannot start {python or sys.executable}: {exc}"

    def result(self) -> dict[str, Any]:
        if self.proc is None:
            return {"probe": {"status": "failed", "reason": self.spawn_error}}
        remaining = max(0.1, self.timeout_s - (time.monotonic() - self.started))
        timed_out = False
        try:
            out, err = self.proc.communicate(timeout=remaining)
        except subprocess.TimeoutExpired:
            timed_out = True
            self._kill()
            try:
                out, err = self.proc.communicate(timeout=5)
            except subprocess.TimeoutExpired:  # pragma: no cover - a child that survives SIGKILL
                out, err = b"", b""
        elapsed = round(time.monotonic() - self.started, 3)
        return interpret(out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), self.proc.returncode,
                         timed_out, self.timeout_s, elapsed)

    def _kill(self) -> None:
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # POSIX: the whole group, grandchildren included
        except (AttributeError, ProcessLookupError, PermissionError, OSError):  # AttributeError: Windows
            try:
                self.proc.kill()
            except OSError:
                pass


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
    tail = "\n".join(stderr.rstrip().splitlines()[-STDERR_TAIL_LINES:])
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
