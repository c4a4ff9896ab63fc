"""`loradoctor run -- CMD`: exit codes kept, output passed through byte for byte, the timeline written,
signals forwarded, explain on failure. Small Python children stand in for training scripts."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from loradoctor.bedside.timeline import read_timeline

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="process groups and signals are POSIX here")


def _alive(pid, wait=3.0):
    """True while pid runs (a zombie waiting for its reaper counts as gone)."""
    deadline = time.time() + wait
    while time.time() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return False
        if state in ("Z", "X"):
            return False
        time.sleep(0.1)
    return True


def _run(tmp_path, code, *opts, timeout=60):
    script = tmp_path / "child.py"
    script.write_text(code)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "loradoctor", "run", "--out", str(out), "--interval", "100ms", *opts,
           "--", sys.executable, str(script)]
    proc = subprocess.run(cmd, capture_output=True, timeout=timeout)
    return proc, out


def test_exit_zero_output_unchanged_and_no_report(tmp_path):
    proc, out = _run(tmp_path, "import sys\nsys.stdout.write('hello\\x1b[32m green\\x1b[0m\\n')\nsys.stderr.write('warn\\n')\n")
    assert proc.returncode == 0
    assert proc.stdout == b"hello\x1b[32m green\x1b[0m\n"
    assert proc.stderr.startswith(b"warn\n") and b"loradoctor run: exit 0" in proc.stderr
    assert (out / "run.log").read_bytes().count(b"hello") == 1
    tl = read_timeline(out)
    assert tl.meta["cmd"][-1].endswith("child.py") and tl.end["exit_code"] == 0
    assert not (out / "report.md").exists()


def test_exit_code_kept_and_failure_explained(tmp_path):
    code = ("import sys, time\nprint('step 1', flush=True)\ntime.sleep(0.4)\n"
            "sys.stderr.write('RuntimeError: CUDA error: device-side assert triggered\\n')\nsys.exit(3)\n")
    proc, out = _run(tmp_path, code)
    assert proc.returncode == 3
    assert proc.stdout == b"step 1\n"
    report = (out / "report.md").read_text()
    assert "cuda.device_assert" in report and (out / "run.svg").read_text().startswith("<svg")
    assert b"first cause: cuda.device_assert" in proc.stderr
    tl = read_timeline(out)
    assert tl.samples and tl.end["exit_code"] == 3


def test_segfault_reports_signal_exit_code(tmp_path):
    proc, out = _run(tmp_path, "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n", "--no-explain")
    assert proc.returncode == 128 + signal.SIGSEGV
    assert read_timeline(out).end["signal"] == signal.SIGSEGV
    assert not (out / "report.md").exists()


def test_killed_child_is_137(tmp_path):
    proc, out = _run(tmp_path, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    assert proc.returncode == 137
    assert b"exit 137 (signal 9)" in proc.stderr


def test_progress_bars_and_multi_megabyte_output_pass_through(tmp_path):
    code = ("import sys\n"
            "for i in range(200):\n    sys.stdout.write(f'\\r{i:3d}%|' + '#' * (i % 50))\n"
            "sys.stdout.write('\\n')\n"
            "chunk = ('x' * 1023 + '\\n') * 1024\n"
            "for _ in range(5):\n    sys.stdout.write(chunk)\n")
    proc, out = _run(tmp_path, code, "--no-explain")
    assert proc.returncode == 0
    expected = "".join(f"\r{i:3d}%|" + "#" * (i % 50) for i in range(200)) + "\n" + ("x" * 1023 + "\n") * 1024 * 5
    assert proc.stdout == expected.encode()
    assert (out / "run.log").read_bytes() == expected.encode()


def test_sigterm_is_forwarded_and_a_child_that_ignores_it_is_killed_by_the_third(tmp_path):
    script = tmp_path / "child.py"
    script.write_text("import signal, sys, time\n"
                      "signal.signal(signal.SIGTERM, lambda *a: print('got TERM', flush=True))\n"
                      "print('ready', flush=True)\n"
                      "while True:\n    time.sleep(0.05)\n")
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "loradoctor", "run", "--out", str(out), "--interval", "100ms",
                             "--no-explain", "--", sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"ready\n"
        for _ in range(3):
            proc.send_signal(signal.SIGTERM)
            time.sleep(1.0)  # time for the child's handler to run before the next one
        stdout, stderr = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert stdout.count(b"got TERM") == 2  # the third one was SIGKILL
    assert proc.returncode == 137
    assert not _alive(read_timeline(out).meta["pid"])


def test_sigint_reaches_the_child_and_its_exit_code_is_kept(tmp_path):
    script = tmp_path / "child.py"
    script.write_text("import sys, time\nprint('ready', flush=True)\n"
                      "try:\n    time.sleep(30)\nexcept KeyboardInterrupt:\n    print('interrupted', flush=True)\n    sys.exit(5)\n")
    proc = subprocess.Popen([sys.executable, "-m", "loradoctor", "run", "--out", str(tmp_path / "o"), "--no-explain",
                             "--", sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"ready\n"
        proc.send_signal(signal.SIGINT)
        stdout, _ = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert stdout == b"interrupted\n" and proc.returncode == 5


def test_workers_left_behind_are_ended_with_the_run(tmp_path):
    code = ("import subprocess, sys\n"
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
            "print(p.pid, flush=True)\n")
    proc, out = _run(tmp_path, code, "--no-explain")
    pid = int(proc.stdout.split()[0])
    assert not _alive(pid)


@pytest.mark.parametrize("argv,needle", [
    (["run"], b"no command given"),
    (["run", "--"], b"no command given"),
    (["run", "--interval", "0", "--", "true"], b"--interval"),
    (["run", "--", "/nonexistent/train"], b"command not found"),
])
def test_bad_usage_is_one_line_and_exit_2(tmp_path, argv, needle):
    proc = subprocess.run([sys.executable, "-m", "loradoctor", *argv], capture_output=True, cwd=tmp_path, timeout=30)
    assert proc.returncode == 2
    assert needle in proc.stderr + proc.stdout and b"Traceback" not in proc.stderr
