#!/usr/bin/env python3
"""What watching a run costs: the sampler's CPU share at the default interval and its memory over a
simulated 24-hour run, and the memory to read such a timeline back for a diagnosis.

    python benchmarks/run_overhead.py [--seconds 20] [--workers 4]

1. CPU: a real process tree (a parent with N sleeping workers) is sampled every second for --seconds
   with the real psutil source and the real NVML source when a GPU is present (none here: psutil only);
   prints the sampler thread's CPU time as a share of one core. Target: under 1%.
2. Memory: 86,400 samples (24 h at 1 s) of a realistic record (8 workers, one GPU with 3 processes),
   written through the real writer with a fake clock; prints RSS before / after. Target: under 50 MB
   growth (the sampler keeps only a constant-size summary in memory).
3. Reading that 24 h timeline back (bounded reader): peak RSS and time.
"""

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from loradoctor.bedside.sampler import NvmlSource, Sampler, TreeSource  # noqa: E402
from loradoctor.bedside.timeline import TimelineWriter, read_timeline  # noqa: E402


def rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def cpu_share(seconds: float, workers: int) -> None:
    code = ("import subprocess, sys, time\n"
            f"ps = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']) for _ in range({workers})]\n"
            "time.sleep(600)\n")
    parent = subprocess.Popen([sys.executable, "-c", code])
    time.sleep(1.0)
    try:
        with tempfile.TemporaryDirectory() as d:
            w = TimelineWriter(os.path.join(d, "t.jsonl"))
            tree = TreeSource(parent.pid)
            gpu = NvmlSource(tree.pids)
            s = Sampler(w, 1.0, tree=tree, gpu=gpu if gpu.available else None).start()
            time.sleep(seconds)
            s.stop()
            w.close()
            share = s.cpu_seconds / seconds
            print(f"1. sampler CPU at 1 s interval: {s.cpu_seconds * 1000:.1f} ms over {seconds:.0f} s = "
                  f"{share * 100:.3f}% of one core ({s.summary.samples} samples, {workers} workers, "
                  f"NVML {'on' if gpu.available else 'absent'}); target < 1%: {'met' if share < 0.01 else 'NOT met'}")
    finally:
        parent.kill()
        subprocess.run(["pkill", "-P", str(parent.pid)], check=False)


class FakeTree:
    def pids(self):
        return {1}

    def read(self):
        return {"rss_bytes": 12 << 30, "cpu_pct": 180.0, "main_cpu_pct": 99.0, "fds": 250,
                "workers": [{"pid": 100 + i, "name": "pt_data_worker", "rss_bytes": 1 << 30, "cpu_pct": 10.0} for i in range(8)],
                "shm_used_bytes": 2 << 30, "shm_total_bytes": 32 << 30}


class FakeGpu:
    available = True

    def read(self):
        return [{"index": 0, "used_bytes": 30 << 30, "total_bytes": 32 << 30, "util_pct": 97, "power_w": 430.0,
                 "temp_c": 70, "sm_clock_mhz": 2400, "throttle": ["sw_power_cap"],
                 "procs": [{"pid": 1, "used_bytes": 29 << 30, "ours": True}, {"pid": 2, "used_bytes": 1 << 29, "ours": False},
                           {"pid": 3, "used_bytes": 1 << 28, "ours": False}]}]


def memory_24h() -> None:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "t.jsonl")
        t = [1.79e9]

        def clock():
            t[0] += 1.0
            return t[0]

        w = TimelineWriter(path)
        s = Sampler(w, 1.0, tree=FakeTree(), gpu=FakeGpu(), clock=clock)
        before = rss_mb()
        started = time.perf_counter()
        for _ in range(86_400):
            s.sample_once()
        w.close()
        after = rss_mb()
        size = os.path.getsize(path) / 2**20
        print(f"2. 24 h of samples (86,400): RSS {before:.1f} -> {after:.1f} MB (+{after - before:.1f} MB; target < 50 MB: "
              f"{'met' if after - before < 50 else 'NOT met'}); timeline {size:.0f} MB on disk; "
              f"{(time.perf_counter() - started) / 86_400 * 1e6:.0f} us per record written")
        peak0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        started = time.perf_counter()
        tl = read_timeline(path)
        from loradoctor.bedside.diagnose import timeline_findings

        timeline_findings(tl)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"3. reading it back and diagnosing: {time.perf_counter() - started:.1f} s, {len(tl.samples)} samples kept "
              f"(thinned: {tl.thinned}), peak RSS {max(peak, peak0):.0f} MB")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--workers", type=int, default=4)
    a = ap.parse_args()
    cpu_share(a.seconds, a.workers)
    memory_24h()


if __name__ == "__main__":
    main()
