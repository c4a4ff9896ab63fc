"""Sample the GPUs and the process tree of a run into a timeline, from a background thread.

Sources are small objects with `read() -> dict` so tests replace NVML with recorded data:
- `NvmlSource`: per GPU memory used / total, utilisation, power, temperature, SM clock, throttle
  reasons, the processes holding memory (ours = in the watched process tree), Xid events;
- `TreeSource`: RSS and CPU of the whole process tree (workers named), /dev/shm use, open fds.

Memory stays bounded for any run length: records go to the file as they are made; in memory only
`Summary` (peaks, a 101-bucket utilisation histogram, counts) is kept.
"""

from __future__ import annotations

import os
import threading
import time
from loradoctor.record import field, record
from typing import Any, Callable, Optional

from loradoctor.bedside.timeline import TimelineWriter


@record
class Summary:
    samples: int = 0
    peak_gpu_used: int = 0            # the largest memory in use on one GPU (all processes)
    peak_gpu_ours: int = 0            # the largest memory held by the watched tree on one GPU
    gpu_total: int = 0
    peak_rss: int = 0
    util_hist: list[int] = field(default_factory=lambda: [0] * 101)
    errors: int = 0

    def median_util(self) -> Optional[int]:
        n = sum(self.util_hist)
        if not n:
            return None
        acc = 0
        for pct, count in enumerate(self.util_hist):
            acc += count
            if acc * 2 >= n:
                return pct
        return 100

    def add(self, record: dict) -> None:
        self.samples += 1
        for g in record.get("gpus", ()):
            self.peak_gpu_used = max(self.peak_gpu_used, int(g.get("used_bytes") or 0))
            ours = sum(int(p.get("used_bytes") or 0) for p in g.get("procs", ()) if p.get("ours"))
            self.peak_gpu_ours = max(self.peak_gpu_ours, ours)
            self.gpu_total = max(self.gpu_total, int(g.get("total_bytes") or 0))
            util = g.get("util_pct")
            if isinstance(util, (int, float)) and 0 <= util <= 100:
                self.util_hist[int(util)] += 1
        host = record.get("host") or {}
        self.peak_rss = max(self.peak_rss, int(host.get("rss_bytes") or 0))


class TreeSource:
    """The watched process tree via psutil (processes are kept between reads so CPU % is meaningful)."""

    def __init__(self, root_pid: int) -> None:
        import psutil

        self._psutil = psutil
        self.root_pid = root_pid
        self._procs: dict[int, Any] = {}

    def pids(self) -> set[int]:
        return set(self._procs) | {self.root_pid}

    def _tree(self) -> list:
        ps = self._psutil
        try:
            root = self._procs.get(self.root_pid) or ps.Process(self.root_pid)
            members = [root] + root.children(recursive=True)
        except (ps.NoSuchProcess, ps.AccessDenied, ps.ZombieProcess):
            return []
        kept = {}
        for p in members:
            kept[p.pid] = self._procs.get(p.pid, p)
        self._procs = kept
        return list(kept.values())

    def read(self) -> dict:
        ps = self._psutil
        rss = fds = 0
        main_cpu = None
        workers = []
        cpu_total = 0.0
        for p in self._tree():
            try:
                with p.oneshot():
                    mem = p.memory_info().rss
                    cpu = p.cpu_percent(None)
                    try:
                        fds += p.num_fds()
                    except (AttributeError, ps.AccessDenied):
                        pass
                    name = p.name()
            except (ps.NoSuchProcess, ps.AccessDenied, ps.ZombieProcess):
                continue
            rss += mem
            cpu_total += cpu
            if p.pid == self.root_pid:
                main_cpu = cpu
            else:
                workers.append({"pid": p.pid, "name": name[:40], "rss_bytes": mem, "cpu_pct": round(cpu, 1)})
        workers.sort(key=lambda w: -w["rss_bytes"])
        host: dict[str, Any] = {"rss_bytes": rss, "cpu_pct": round(cpu_total, 1), "fds": fds,
                                "workers": workers[:16], "n_procs": len(workers) + (main_cpu is not None)}
        if main_cpu is not None:
            host["main_cpu_pct"] = round(main_cpu, 1)
        try:
            st = os.statvfs("/dev/shm")
            host["shm_total_bytes"] = st.f_blocks * st.f_frsize
            host["shm_used_bytes"] = (st.f_blocks - st.f_bfree) * st.f_frsize
        except OSError:
            pass
        return host


class NvmlSource:
    """Per-GPU readings through NVML (pynvml from nvidia-ml-py, imported here, lazily). `available`
    is False when there is no driver or GPU: the run is still watched, without GPU lines."""

    def __init__(self, ours: Callable[[], set[int]]) -> None:
        self.ours = ours
        self.available = False
        self._events = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nv = pynvml
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            self.available = bool(self.handles)
        except Exception:  # noqa: BLE001 - no driver, no library, no GPU: no GPU lines
            self.handles = []
            return
        try:
            self._events = pynvml.nvmlEventSetCreate()
            for h in self.handles:
                pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, self._events)
        except Exception:  # noqa: BLE001 - Xid events need root or a recent driver
            self._events = None

    def describe(self) -> list[dict]:
        out = []
        for i, h in enumerate(self.handles):
            name = _try(self.nv.nvmlDeviceGetName, h)
            mem = _try(self.nv.nvmlDeviceGetMemoryInfo, h)
            out.append({"index": i, "name": name.decode() if isinstance(name, bytes) else name,
                        "total_bytes": getattr(mem, "total", None)})
        return out

    def read(self) -> list[dict]:
        nv, ours = self.nv, self.ours()
        gpus = []
        for i, h in enumerate(self.handles):
            g: dict[str, Any] = {"index": i}
            mem = _try(nv.nvmlDeviceGetMemoryInfo, h)
            if mem is not None:
                g["used_bytes"], g["total_bytes"] = int(mem.used), int(mem.total)
            util = _try(nv.nvmlDeviceGetUtilizationRates, h)
            if util is not None:
                g["util_pct"] = int(util.gpu)
            power = _try(nv.nvmlDeviceGetPowerUsage, h)
            if power is not None:
                g["power_w"] = round(power / 1000.0, 1)
            temp = _try(nv.nvmlDeviceGetTemperature, h, 0)
            if temp is not None:
                g["temp_c"] = int(temp)
            clock = _try(nv.nvmlDeviceGetClockInfo, h, 1)  # NVML_CLOCK_SM
            if clock is not None:
                g["sm_clock_mhz"] = int(clock)
            reasons = _try(nv.nvmlDeviceGetCurrentClocksThrottleReasons, h)
            if reasons is not None:
                from loradoctor.env.probes.nvidia import throttle_names

                g["throttle"] = [n for n in throttle_names(int(reasons)) if n != "gpu_idle"]
            procs = _try(nv.nvmlDeviceGetComputeRunningProcesses, h) or []
            g["procs"] = [{"pid": int(p.pid), "used_bytes": int(p.usedGpuMemory or 0), "ours": int(p.pid) in ours}
                          for p in procs[:32]]
            gpus.append(g)
        return gpus

    def xids(self) -> list[dict]:
        if self._events is None:
            return []
        out = []
        for _ in range(8):
            try:
                data = self.nv.nvmlEventSetWait_v2(self._events, 0)
            except Exception:  # noqa: BLE001 - timeout: no event waiting
                break
            out.append({"xid": int(data.eventData), "gpu": _try(self.nv.nvmlDeviceGetIndex, data.device)})
        return out


def _try(fn: Callable, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - a field this GPU or driver does not report
        return None


class Sampler:
    """Every `interval` seconds, one `sample` record (and an `event` per Xid) into `writer`."""

    def __init__(self, writer: TimelineWriter, interval: float, tree: Optional[Any] = None,
                 gpu: Optional[Any] = None, clock: Callable[[], float] = time.time) -> None:
        self.writer, self.interval, self.tree, self.gpu, self.clock = writer, max(0.05, interval), tree, gpu, clock
        self.summary = Summary()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.cpu_seconds = 0.0

    def sample_once(self) -> dict:
        record: dict[str, Any] = {"t": self.clock()}
        try:
            if self.gpu is not None and getattr(self.gpu, "available", True):
                record["gpus"] = self.gpu.read()
                for x in getattr(self.gpu, "xids", lambda: [])():
                    self.writer.write("event", name="xid", **x)
            if self.tree is not None:
                record["host"] = self.tree.read()
        except Exception as exc:  # noqa: BLE001 - a sampler must never take the run down
            self.summary.errors += 1
            record["error"] = f"{type(exc).__name__}: {exc}"[:200]
        self.summary.add(record)
        self.writer.write("sample", **record)
        return record

    def _loop(self) -> None:
        while not self._stop.is_set():
            began = time.thread_time()
            self.sample_once()
            self.cpu_seconds += time.thread_time() - began
            self._stop.wait(self.interval)

    def start(self) -> "Sampler":
        self._thread = threading.Thread(target=self._loop, name="loradoctor-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
