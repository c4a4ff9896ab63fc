"""`loradoctor run -- CMD ...`: run a training command under watch.

- CMD runs in its own process group (a new session); SIGINT / SIGTERM / SIGHUP that reach us are
  forwarded to the whole group; a third Ctrl-C kills the group. Our exit code is CMD's (128 + N when a
  signal N ended it, as shells report).
- CMD's stdout and stderr pass through byte for byte (on a terminal through pseudo-terminals, so
  colours and `\\r` progress bars stay as they are) and are teed, in arrival order, to DIR/run.log.
- A sampler thread writes DIR/timeline.jsonl as it goes (flushed each record).
- When CMD fails (or always, with explain="always"), the log and the timeline are diagnosed together:
  DIR/report.md and DIR/run.svg; a one-line summary goes to stderr at the end.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import threading
import time
from loradoctor.record import record
from typing import Any, Callable, Optional

from loradoctor.bedside.sampler import NvmlSource, Sampler, TreeSource
from loradoctor.bedside.timeline import TimelineWriter
from loradoctor.errors import UserError

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@record
class RunResult:
    exit_code: int
    signal: Optional[int]
    out_dir: str
    summary_line: str
    findings: list


def _pump(src: int, dst: Optional[int], log: Any, lock: threading.Lock) -> None:
    """Copy bytes from src to dst and the log until EOF (EIO from a closed pty counts as EOF)."""
    while True:
        try:
            chunk = os.read(src, 1 << 16)
        except OSError as exc:
            if exc.errno in (errno.EIO, errno.EBADF):
                break
            raise
        if not chunk:
            break
        if dst is not None:
            try:
                view = memoryview(chunk)
                while view:
                    n = os.write(dst, view)
                    view = view[n:]
            except OSError:
                dst = None  # our own stdout went away (a closed pipe): keep logging
        with lock:
            log.write(chunk)
            log.flush()
    try:
        os.close(src)
    except OSError:
        pass


def _ptys_wanted(stdout_fd: int) -> bool:
    try:
        return os.isatty(stdout_fd) and sys.platform != "win32"
    except OSError:
        return False


def start_child(cmd: list[str], use_pty: bool) -> tuple[subprocess.Popen, list[tuple[int, int]]]:
    """Start CMD in a new session; return it with (read fd, our fd) pairs for stdout and stderr."""
    if use_pty:
        import pty

        out_r, out_w = pty.openpty()
        err_r, err_w = pty.openpty()
    else:
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
    try:
        child = subprocess.Popen(cmd, stdout=out_w, stderr=err_w, start_new_session=True, close_fds=True)
    except FileNotFoundError:
        for fd in (out_r, out_w, err_r, err_w):
            os.close(fd)
        raise UserError(f"run: command not found: {cmd[0]}") from None
    except PermissionError:
        for fd in (out_r, out_w, err_r, err_w):
            os.close(fd)
        raise UserError(f"run: permission denied: {cmd[0]}") from None
    os.close(out_w)
    os.close(err_w)
    return child, [(out_r, 1), (err_r, 2)]


class _Forwarder:
    """Signal handlers that pass SIGINT / SIGTERM / SIGHUP to the child's process group."""

    def __init__(self, pgid: int) -> None:
        self.pgid, self.count, self.last = pgid, 0, None
        self.saved: dict[int, Any] = {}

    def handle(self, signum: int, _frame: Any) -> None:
        self.count += 1
        self.last = signum
        sig = signal.SIGKILL if self.count >= 3 else signum
        try:
            os.killpg(self.pgid, sig)
        except OSError:
            pass

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for s in FORWARDED:
            self.saved[s] = signal.signal(s, self.handle)

    def restore(self) -> None:
        for s, h in self.saved.items():
            signal.signal(s, h)


def _exit_code(returncode: int) -> tuple[int, Optional[int]]:
    if returncode < 0:
        return 128 + (-returncode), -returncode
    return returncode, None


def run(cmd: list[str], out_dir: str, interval: float = 1.0, explain: str = "on-failure",
        gpu_factory: Optional[Callable[[Callable[[], set[int]]], Any]] = None,
        stdout_fd: int = 1, stderr_fd: int = 2, say: Optional[Callable[[str], None]] = None) -> RunResult:
    """Run CMD under watch; see the module doc. `gpu_factory(ours)` builds the GPU source (NVML by default;
    tests pass recorded data). `explain`: 'on-failure', 'always' or 'never'."""
    if not cmd:
        raise UserError("run: no command given; write it after `--`, e.g. loradoctor run -- python train.py")
    os.makedirs(out_dir, exist_ok=True)
    log_path = os.path.join(out_dir, "run.log")
    tl_path = os.path.join(out_dir, "timeline.jsonl")
    for p in (log_path, tl_path):
        if os.path.exists(p):
            os.replace(p, p + ".prev")
    say = say or (lambda text: os.write(stderr_fd, (text + "\n").encode()))
    writer = TimelineWriter(tl_path)
    log = open(log_path, "wb")
    lock = threading.Lock()
    child, pairs = start_child(cmd, _ptys_wanted(stdout_fd))
    forward = _Forwarder(child.pid)
    forward.install()
    tree = TreeSource(child.pid)
    gpu = (gpu_factory or NvmlSource)(tree.pids)
    ram = _host_ram()
    writer.write("meta", schema="loradoctor.timeline/1", cmd=[str(c)[:200] for c in cmd[:64]], pid=child.pid,
                 interval_s=interval, host_ram_bytes=ram, source="run",
                 gpus=gpu.describe() if getattr(gpu, "available", False) else [])
    sampler = Sampler(writer, interval, tree=tree, gpu=gpu if getattr(gpu, "available", False) else None).start()
    pumps = [threading.Thread(target=_pump, args=(r, {1: stdout_fd, 2: stderr_fd}[ours], log, lock), daemon=True)
             for r, ours in pairs]
    for t in pumps:
        t.start()
    try:
        while True:
            try:
                returncode = child.wait()
                break
            except KeyboardInterrupt:  # a handler could not be installed (not the main thread)
                forward.handle(signal.SIGINT, None)
    finally:
        forward.restore()
        sampler.stop()
        _reap_group(child.pid)  # before draining: a leftover worker holding our pipes would block it
        for t in pumps:
            t.join(timeout=5)
        log.close()
    code, sig = _exit_code(returncode)
    writer.write("end", exit_code=code, signal=sig, forwarded=forward.last)
    writer.close()
    findings: list = []
    failed = code != 0
    if explain == "always" or (failed and explain == "on-failure"):
        from loradoctor.bedside.report import write_report

        findings = write_report(out_dir, log_path, tl_path)
    line = summary_line(sampler.summary, code, sig, findings, out_dir)
    say(line)
    return RunResult(exit_code=code, signal=sig, out_dir=out_dir, summary_line=line, findings=findings)


def _reap_group(pgid: int) -> None:
    """Whatever CMD left running in its group (workers it did not wait for) is ended with it."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except OSError:
            return
        time.sleep(0.2)


def _host_ram() -> Optional[int]:
    try:
        import psutil

        return int(psutil.virtual_memory().total)
    except Exception:  # noqa: BLE001 - no psutil data: the host-RAM check stays quiet
        return None


def summary_line(summary: Any, code: int, sig: Optional[int], findings: list, out_dir: str) -> str:
    from loradoctor.bedside.diagnose import gib

    parts = [f"exit {code}" + (f" (signal {sig})" if sig else "")]
    if summary.gpu_total:
        parts.append(f"peak GPU {gib(summary.peak_gpu_used)} of {gib(summary.gpu_total)}")
    if summary.peak_rss:
        parts.append(f"peak host RSS {gib(summary.peak_rss)}")
    med = summary.median_util()
    if med is not None:
        parts.append(f"median GPU utilisation {med}%")
    top = next((f for f in findings if f.severity in ("error", "warning")), None)
    if top is not None:
        parts.append(f"first cause: {top.cause} ({top.title})")
        parts.append(f"report: {os.path.join(out_dir, 'report.md')}")
    elif code == 0:
        parts.append("finished")
    else:
        parts.append(f"no cause recognised; log: {os.path.join(out_dir, 'run.log')}")
    return "loradoctor run: " + " · ".join(parts)
