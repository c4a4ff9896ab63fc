"""Run a repro script in a child process of the user's interpreter, with a timeout.

The child prints one JSON line with schema `loradoctor.repro/1` on stdout (its last such line
wins). A child that hangs is killed with its whole process group (NCCL workers included) and
reported as FAIL; a child killed by a signal (segfault) is FAIL with its stderr tail; a child that
exits without a result is ERROR with its stderr tail.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from loradoctor.record import field, record
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from loradoctor.repro.catalog import get_spec
from loradoctor.repro.result import SCHEMA, ReproResult

DEFAULT_TIMEOUT_S = 180.0
STDERR_TAIL_LINES = 15


@record
class ChildRun:
    """What a child process left behind."""

    returncode: Optional[int]
    stdout_lines: list[str] = field(default_factory=list)
    stderr_lines: list[str] = field(default_factory=list)
    timed_out: bool = False
    duration_s: float = 0.0


def _kill_group(proc: subprocess.Popen) -> None:
    # The child leads its own session, so its grandchildren (NCCL workers, the expandable arm) go too.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, AttributeError):
        try:
            proc.kill()
        except ProcessLookupError:
            pass


def run_child(
    argv: Sequence[str],
    timeout_s: float,
    env: Optional[dict[str, str]] = None,
    on_stdout_line: Optional[Callable[[str], None]] = None,
    cwd: Optional[str] = None,
) -> ChildRun:
    """Run argv, streaming stdout lines to on_stdout_line as they come; kill the group on timeout."""
    full_env = dict(os.environ)
    full_env["PYTHONUNBUFFERED"] = "1"
    if env:
        full_env.update(env)
    started = time.monotonic()
    popen_kwargs: dict[str, Any] = {}
    if os.name == "posix":
        popen_kwargs["start_new_session"] = True
    proc = subprocess.Popen(
        list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, encoding="utf-8", errors="replace", env=full_env, cwd=cwd, **popen_kwargs,
    )
    run = ChildRun(returncode=None)

    def pump_stdout() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip("\n")
            run.stdout_lines.append(line)
            if on_stdout_line is not None:
                try:
                    on_stdout_line(line)
                except Exception:  # a progress printer must never break the run
                    pass

    def pump_stderr() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            run.stderr_lines.append(line.rstrip("\n"))
            if len(run.stderr_lines) > 2000:  # keep memory bounded on chatty children
                del run.stderr_lines[:1000]

    readers = [threading.Thread(target=pump_stdout, daemon=True), threading.Thread(target=pump_stderr, daemon=True)]
    for t in readers:
        t.start()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        run.timed_out = True
        _kill_group(proc)
        proc.wait()
    except BaseException:
        _kill_group(proc)
        proc.wait()
        raise
    if os.name == "posix" and not run.timed_out:
        # Leftover grandchildren holding the pipes open would block the readers forever.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for t in readers:
        t.join(timeout=5)
    run.returncode = proc.returncode
    run.duration_s = time.monotonic() - started
    return run


def parse_result_line(lines: Sequence[str], schema: str = SCHEMA) -> Optional[dict[str, Any]]:
    """The last stdout line that is a JSON object with the given schema, or None."""
    for line in reversed(lines):
        text = line.strip()
        if not (text.startswith("{") and schema in text):
            continue
        try:
            data = json.loads(text)
        except ValueError:
            continue
        if isinstance(data, dict) and data.get("schema") == schema:
            return data
    return None


def _signal_name(returncode: int) -> str:
    try:
        return signal.Signals(-returncode).name
    except (ValueError, AttributeError):
        return f"signal {-returncode}"


def _python_version() -> str:
    return sys.version.split()[0]


def result_from_child(repro_id: str, run: ChildRun, timeout_s: float) -> ReproResult:
    """Turn what a child left behind into a ReproResult (also when it printed nothing)."""
    tail = [line for line in run.stderr_lines if line.strip()][-STDERR_TAIL_LINES:]
    data = parse_result_line(run.stdout_lines)
    if data is not None and not run.timed_out:
        data = dict(data)
        data["id"] = repro_id
        try:
            result = ReproResult.from_dict(data)
        except (TypeError, ValueError) as exc:
            return ReproResult(repro_id, "ERROR", f"the repro printed a malformed result: {exc}",
                               evidence=tail, duration_s=round(run.duration_s, 3), python=_python_version())
        result.duration_s = round(run.duration_s, 3)
        return result
    if run.timed_out:
        return ReproResult(
            repro_id, "FAIL",
            f"hung: no result after {timeout_s:g} s, killed (a stuck driver, NCCL or kernel; "
            f"rerun with a larger --timeout if the first CUDA call is just slow)",
            evidence=tail, numbers={"timed_out": True, "timeout_s": timeout_s},
            duration_s=round(run.duration_s, 3), python=_python_version(),
        )
    if run.returncode is not None and run.returncode < 0:
        return ReproResult(
            repro_id, "FAIL", f"the repro process crashed ({_signal_name(run.returncode)}) before printing a result",
            evidence=tail, numbers={"returncode": run.returncode},
            duration_s=round(run.duration_s, 3), python=_python_version(),
        )
    return ReproResult(
        repro_id, "ERROR", f"the repro process exited with code {run.returncode} without a result",
        evidence=tail, numbers={"returncode": run.returncode},
        duration_s=round(run.duration_s, 3), python=_python_version(),
    )


def run_repro(
    repro_id: str,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    options: Optional[dict[str, Any]] = None,
    python: Optional[str] = None,
    env: Optional[dict[str, str]] = None,
) -> ReproResult:
    """Run one repro in a child of `python` (default: this interpreter) and return its result.

    options travel to the script as one JSON argument; the script also receives `timeout_s` so it
    can size its own inner waits (grandchildren, NCCL timeouts) below the outer limit.
    env adds to (or overrides) this process's environment for the child. Raises UserError for an unknown id.
    """
    spec = get_spec(repro_id)
    script: Path = spec.script
    if not script.is_file():
        return ReproResult(repro_id, "ERROR", f"the repro script is missing: {script}", python=_python_version())
    payload = dict(options or {})
    payload.setdefault("timeout_s", timeout_s)
    run = run_child([python or sys.executable, str(script), json.dumps(payload)], timeout_s=timeout_s, env=env)
    return result_from_child(repro_id, run, timeout_s)
