"""Probe children end with us (issue 11 item 8, issue 12 item 2): killed with every descendant (a
grandchild that called setsid(), a daemon re-parented to PID 1) on timeout, on normal exit, on SIGINT
and SIGTERM; their output is capped; `--python` must be a Python; a live status line on a terminal."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, run_cli
from loradoctor.env.probes import child

# A torch whose import starts three sleepers (one in its group, one that setsid()s, one double-forked
# daemon whose parent exits), records their pids, then hangs (or fails, with FAKE_TORCH_END=fail).
SPAWNING_TORCH = r'''
import os, subprocess, sys, time
d = os.environ["FAKE_PIDS_DIR"]
sleep = "import time; time.sleep(600)"
a = subprocess.Popen([sys.executable, "-c", sleep])
b = subprocess.Popen([sys.executable, "-c", "import os, time; os.setsid(); time.sleep(600)"])
daemon = ("import os, subprocess, sys; "
          "p = subprocess.Popen([sys.executable, '-c', 'import os, time; os.setsid(); time.sleep(600)']); "
          "open(sys.argv[1], 'w').write(str(p.pid))")
subprocess.run([sys.executable, "-c", daemon, os.path.join(d, "daemon.pid")])
for name, p in (("group", a), ("setsid", b)):
    open(os.path.join(d, name + ".pid"), "w").write(str(p.pid))
open(os.path.join(d, "torch.pid"), "w").write(str(os.getpid()))
if os.environ.get("FAKE_TORCH_END") == "fail":
    raise ImportError("fake torch: broken on purpose")
time.sleep(600)
'''


def _fake_torch(tmp_path: Path, body: str) -> Path:
    root = tmp_path / "fake"
    (root / "torch").mkdir(parents=True)
    (root / "torch" / "__init__.py").write_text(body)
    return root


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as fh:
            return not any(line.startswith("State:") and "Z" in line.split()[1] for line in fh)
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def _pids(folder: Path, names=("torch", "group", "setsid", "daemon")) -> dict:
    out = {}
    for name in names:
        path = folder / f"{name}.pid"
        if path.exists() and path.read_text().strip():
            out[name] = int(path.read_text())
    return out


def _wait_pids(folder: Path, deadline_s: float = 60) -> dict:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        pids = _pids(folder)
        if len(pids) == 4:
            return pids
        time.sleep(0.1)
    raise AssertionError(f"the fake torch did not start its sleepers: {_pids(folder)}")


def _assert_all_gone(pids: dict) -> None:
    end = time.monotonic() + 5
    while time.monotonic() < end and any(_alive(p) for p in pids.values()):
        time.sleep(0.1)
    survivors = {name: pid for name, pid in pids.items() if _alive(pid)}
    for pid in survivors.values():  # never leave them behind, even when the test fails
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    assert not survivors, f"still running after loradoctor ended: {survivors}"


@pytest.fixture(autouse=True)
def _reap_recorded(tmp_path):
    """Whatever the outcome, no sleeper recorded by a fake torch outlives its test."""
    yield
    for pid in _pids(tmp_path).values():
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _env(tmp_path: Path, **extra) -> dict:
    env = dict(os.environ, PYTHONPATH=str(_fake_torch(tmp_path, SPAWNING_TORCH)), FAKE_PIDS_DIR=str(tmp_path),
               NO_COLOR="1", LORADOCTOR_NO_CACHE="1")
    env.update(extra)
    return env


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_mid_probe_kills_every_descendant(tmp_path, sig, code):
    proc = subprocess.Popen([sys.executable, "-m", "loradoctor", "env", "--timeout", "300"], cwd=str(ROOT),
                            env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        pids = _wait_pids(tmp_path)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == code, err
    assert b"Traceback" not in err
    _assert_all_gone(pids)


def test_a_timeout_kills_every_descendant(tmp_path):
    started = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "loradoctor", "env", "--format", "json", "--timeout", "8"],
                         cwd=str(ROOT), env=_env(tmp_path), capture_output=True, text=True, timeout=120)
    pids = _pids(tmp_path)
    assert len(pids) == 4, res.stderr
    assert time.monotonic() - started < 60
    assert json.loads(res.stdout)["snapshot"]["torch"]["probe"]["status"] == "timeout"
    _assert_all_gone(pids)


def test_descendants_are_killed_when_the_probe_ends_by_itself(tmp_path):
    res = subprocess.run([sys.executable, "-m", "loradoctor", "env", "--format", "json", "--timeout", "60"],
                         cwd=str(ROOT), env=_env(tmp_path, FAKE_TORCH_END="fail"), capture_output=True, text=True,
                         timeout=120)
    pids = _pids(tmp_path)
    assert len(pids) == 4, res.stderr
    assert json.loads(res.stdout)["snapshot"]["torch"]["probe"]["status"] == "failed"
    _assert_all_gone(pids)


LOUD_TORCH = r'''
import sys
block = b"x" * (1 << 20)
for _ in range(150):
    sys.stdout.buffer.write(block)      # 150 MB of stdout
for _ in range(150):
    sys.stderr.buffer.write(block)      # 150 MB of stderr without a newline
sys.stderr.flush()
raise ImportError("loud and broken")
'''


def test_huge_child_output_is_capped(tmp_path):
    # VmHWM, the peak of this process's own memory: getrusage's ru_maxrss survives fork and exec on Linux,
    # so it would report the pytest worker's size (a worker that loaded torch for another test) instead
    # read at exit through atexit: the console entry leaves with os._exit after running the atexit handlers
    code = ("import atexit, runpy, sys; sys.argv = ['loradoctor'] + sys.argv[1:]\n"
            "def hwm():\n    kb = [l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM:')]\n"
            "    sys.stderr.write('MAXRSS_KB %s\\n' % kb[0]); sys.stderr.flush()\n"
            "atexit.register(hwm)\n"
            "runpy.run_module('loradoctor', run_name='__main__')\n")
    env = dict(os.environ, PYTHONPATH=str(_fake_torch(tmp_path, LOUD_TORCH)), LORADOCTOR_NO_CACHE="1")
    res = subprocess.run([sys.executable, "-c", code, "env", "--format", "json", "--timeout", "120"], cwd=str(ROOT),
                         env=env, capture_output=True, text=True, timeout=300)
    rss_kb = int(res.stderr.rsplit("MAXRSS_KB", 1)[1].split()[0])
    assert len(res.stdout) < 200_000, f"report of {len(res.stdout)} characters"
    torch = json.loads(res.stdout)["snapshot"]["torch"]
    assert torch["probe"]["status"] == "failed"
    assert "loud and broken" in torch["probe"]["stderr_tail"]
    assert rss_kb < 250_000, f"loradoctor peaked at {rss_kb} kB"


def test_capture_keeps_head_tail_and_the_last_record(tmp_path):
    script = ("import sys; w = sys.stdout.write\n"
              "w('LORADOCTOR_PROBE {\"stage\": \"found\"}\\n'); w('y' * 3000000 + '\\n')\n"
              "w('LORADOCTOR_PROBE {\"stage\": \"done\", \"v\": 1}\\n'); w('z' * 3000000)\n"
              "sys.stderr.write('e' * 5000000)\n")
    c = child.Child([sys.executable, "-c", script])
    rc, timed_out = c.finish(60)
    assert rc == 0 and not timed_out
    assert json.loads(c.stdout_record()[len(child.MARKER):]) == {"stage": "done", "v": 1}
    err = c.stderr_text()
    assert len(err) < child.HEAD_BYTES + child.TAIL_BYTES + 100 and "bytes of output omitted" in err
    section = child.interpret(c.stdout_record(), err, 1, False, 60, 1.0)
    assert len(section["probe"]["stderr_tail"]) < 3 * child.STDERR_LINE_CHARS


@pytest.mark.parametrize("target", ["/usr/bin/ls", "pip"])
def test_python_option_must_be_a_python(tmp_path, target):
    if target == "pip":
        target = str(Path(sys.executable).parent / "pip")
    if not os.path.exists(target):
        pytest.skip(f"no {target} here")
    res = run_cli("env", "--python", target, timeout=60)
    assert res.returncode == 2, res.stdout
    assert res.stderr.count("\n") == 1 and "not a Python interpreter" in res.stderr
    assert res.stdout == ""


def test_status_line_on_a_terminal_and_nothing_when_piped(tmp_path):
    import pty

    hang = _fake_torch(tmp_path, "import time\ntime.sleep(600)\n")
    env = dict(os.environ, PYTHONPATH=str(hang), LORADOCTOR_NO_CACHE="1", TERM="xterm")
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "loradoctor", "env", "--timeout", "3"], cwd=str(ROOT), env=env,
                            stdout=subprocess.PIPE, stderr=slave, start_new_session=True)
    os.close(slave)
    seen = b""
    try:
        proc.stdout.read()
        proc.wait(timeout=60)
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
    finally:
        os.close(master)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert b"waiting for the torch probe" in seen and b" s" in seen
    piped = run_cli("env", "--timeout", "3", env={"PYTHONPATH": str(hang), "LORADOCTOR_NO_CACHE": "1"}, timeout=60)
    assert "waiting for" not in piped.stderr and "\r" not in piped.stderr
