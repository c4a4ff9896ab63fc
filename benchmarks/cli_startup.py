"""Start-up time of the CLI against a bare interpreter: `python -c pass`, `loradoctor --help`,
`loradoctor env --help`, `loradoctor explain` on a one-line log.

Runs are interleaved (one of each per round, so a busy machine slows all alike) and the median of
--rounds (default 15) is reported with its difference to `python -c pass`, with the fastest run and
the median CPU time (user + sys of the child): on a loaded machine wall time also counts the wait
for a core, CPU time does not.

    python benchmarks/cli_startup.py [--rounds 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="loradoctor-startup-"))
    log = tmp / "one.log"
    log.write_text("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n", encoding="utf-8")
    # bytecode as an installed package has it (written to a folder of this run, never into the checkout),
    # even where PYTHONDONTWRITEBYTECODE is set: otherwise every run measures compiling the sources
    env = dict(os.environ, LORADOCTOR_CACHE_DIR=str(tmp / "cache"), NO_COLOR="1", PYTHONPYCACHEPREFIX=str(tmp / "pycache"))
    if env.pop("PYTHONDONTWRITEBYTECODE", None) is not None:
        print(f"note: PYTHONDONTWRITEBYTECODE is set in this shell; the runs go without it (bytecode under "
              f"{tmp / 'pycache'}, written by the warm-up run), as an installed package runs")
    py = sys.executable
    cases = {
        "python -c pass": [py, "-c", "pass"],
        "loradoctor --help": [py, "-m", "loradoctor", "--help"],
        "loradoctor env --help": [py, "-m", "loradoctor", "env", "--help"],
        "loradoctor explain one-line.log": [py, "-m", "loradoctor", "explain", str(log)],
    }
    # one warm-up run each: fills the OS file cache and loradoctor's rule cache
    for cmd in cases.values():
        subprocess.run(cmd, capture_output=True, env=env)
    times: dict[str, list[float]] = {name: [] for name in cases}
    cpu: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name, cmd in cases.items():
            start = time.perf_counter()
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
            _, _, usage = os.wait4(proc.pid, 0)
            times[name].append(time.perf_counter() - start)
            cpu[name].append(usage.ru_utime + usage.ru_stime)
            proc.returncode = 0  # reaped by wait4 above
    base = statistics.median(times["python -c pass"])
    base_min = min(times["python -c pass"])
    base_cpu = statistics.median(cpu["python -c pass"])
    if hasattr(os, "getloadavg"):
        load = os.getloadavg()
        print(f"load average after the runs: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} ({os.cpu_count()} CPUs)")
    print(f"{'command':<34}{'median s':>10}{'vs python -c pass':>20}{'fastest':>10}{'vs pass':>9}"
          f"{'CPU s':>8}{'vs pass':>9}   ({args.rounds} interleaved rounds)")
    for name, values in times.items():
        med, low, c = statistics.median(values), min(values), statistics.median(cpu[name])
        print(f"{name:<34}{med:>10.3f}{med - base:>+20.3f}{low:>10.3f}{low - base_min:>+9.3f}"
              f"{c:>8.3f}{c - base_cpu:>+9.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
