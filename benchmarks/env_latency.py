"""Time `loradoctor env` against `python -m torch.utils.collect_env` on the same machine.

Both run as fresh child processes of this interpreter, interleaved, several times; the script
prints each median and the ratio (target: loradoctor env at most 0.5 of collect_env).

Two ratios, because `loradoctor env` remembers a healthy torch probe for an unchanged install
(loradoctor/env/probes/remember.py):
- `loradoctor env`: what a launch script runs every time (the probe result remembered by the warm-up
  run; a throw-away cache folder, so nothing of yours is used or changed);
- `loradoctor env --fresh`: the first run after any install change (a full child `import torch`).

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


def timed(cmd: list[str], env_extra: dict | None = None) -> tuple[float, int, float]:
    """(wall seconds, return code, CPU seconds of the command and all its children)."""
    env = dict(os.environ, NO_COLOR="1", **(env_extra or {}))
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
    import tempfile

    cache_env = {"LORADOCTOR_CACHE_DIR": tempfile.mkdtemp(prefix="ld-env-bench-")}
    base = [sys.executable, "-m", "loradoctor", "env", "--format", "json"] + (["--deep"] if args.deep else [])
    commands = {
        "loradoctor env" + (" --deep" if args.deep else ""): base,
        "loradoctor env --fresh": base + ["--fresh"],
        "torch.utils.collect_env": [sys.executable, "-m", "torch.utils.collect_env"],
    }
    if args.deep:
        del commands["loradoctor env --fresh"]  # --deep never uses a remembered probe
    for cmd in commands.values():
        timed(cmd, cache_env)  # warm the page cache (and remember the probe) before measuring
    walls: dict[str, list[float]] = {k: [] for k in commands}
    cpus: dict[str, list[float]] = {k: [] for k in commands}
    for _ in range(args.reps):
        for name, cmd in commands.items():
            t, rc, cpu = timed(cmd, cache_env)
            if name.startswith("loradoctor") and rc not in (0, 1):
                print(f"{name} exited {rc}", file=sys.stderr)
                return 2
            walls[name].append(t)
            cpus[name].append(cpu)
    print(f"machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, {args.reps} repetitions each (interleaved)")
    for name in commands:
        print(f"{name:26s} median {statistics.median(walls[name]):.3f} s wall, {statistics.median(cpus[name]):.3f} s CPU"
              f"  (runs: {', '.join(f'{t:.2f}' for t in walls[name])})")
    try:
        print(f"load average during the run: {open('/proc/loadavg').read().split()[0]} on {os.cpu_count()} CPUs")
    except OSError:
        pass
    theirs = statistics.median(walls["torch.utils.collect_env"])
    for name in commands:
        if name.startswith("loradoctor"):
            ratio = statistics.median(walls[name]) / theirs
            print(f"RATIO {name} / collect_env (wall, medians): {ratio:.2f} "
                  f"(target <= 0.50: {'met' if ratio <= 0.5 else 'NOT met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
