"""Time `loradoctor env` against `python -m torch.utils.collect_env` on the same machine.

Both run as fresh child processes of this interpreter, interleaved, several times; the script
prints each median and the ratio (target: loradoctor env at most 0.5 of collect_env).

    python benchmarks/env_latency.py [--reps 5] [--deep]

Needs torch installed in this interpreter (collect_env is part of torch).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def timed(cmd: list[str]) -> tuple[float, int, float]:
    """(wall seconds, return code, CPU seconds of the command and all its children)."""
    env = dict(os.environ, NO_COLOR="1")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    res = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT, env=env)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, res.returncode, cpu


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--deep", action="store_true", help="time `loradoctor env --deep` instead")
    args = ap.parse_args()
    if importlib.util.find_spec("torch") is None:
        print("torch is not installed in this interpreter; collect_env needs it (pip install torch)", file=sys.stderr)
        return 2
    ours_cmd = [sys.executable, "-m", "loradoctor", "env", "--format", "json"] + (["--deep"] if args.deep else [])
    theirs_cmd = [sys.executable, "-m", "torch.utils.collect_env"]
    timed(ours_cmd), timed(theirs_cmd)  # warm the page cache for both before measuring
    ours, theirs, ours_cpu, theirs_cpu = [], [], [], []
    for _ in range(args.reps):
        t, rc, cpu = timed(ours_cmd)
        if rc not in (0, 1):
            print(f"loradoctor env exited {rc}", file=sys.stderr)
            return 2
        ours.append(t)
        ours_cpu.append(cpu)
        t, _, cpu = timed(theirs_cmd)
        theirs.append(t)
        theirs_cpu.append(cpu)
    m_ours, m_theirs = statistics.median(ours), statistics.median(theirs)
    print(f"machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, {args.reps} repetitions each (interleaved)")
    print(f"loradoctor env{' --deep' if args.deep else ''}: median {m_ours:.3f} s  (runs: {', '.join(f'{t:.2f}' for t in ours)})")
    print(f"torch.utils.collect_env: median {m_theirs:.3f} s  (runs: {', '.join(f'{t:.2f}' for t in theirs)})")
    print(f"CPU time (user+sys, all processes): loradoctor env median {statistics.median(ours_cpu):.3f} s, "
          f"collect_env median {statistics.median(theirs_cpu):.3f} s")
    try:
        print(f"load average during the run: {open('/proc/loadavg').read().split()[0]} on {os.cpu_count()} CPUs")
    except OSError:
        pass
    ratio = m_ours / m_theirs
    print(f"ratio (wall, medians): {ratio:.2f} (target <= 0.50: {'met' if ratio <= 0.5 else 'NOT met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
