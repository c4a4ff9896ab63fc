"""Repro free-memory: how much GPU memory can this process really get right now?

For each visible GPU: NVML's total / free / used and the other processes holding memory, then the
caching allocator grabs chunks until it cannot (256 MiB halving down to 2 MiB) and a binary search
finds the largest single block. PASS: other processes hold less than 5% of the GPU and this
process can get at least 80% of what NVML reported free. FAIL: otherwise (the numbers say who holds
what: a leftover notebook kernel, a zombie trainer, another user). SKIP: no CUDA GPU.
"""

# The shared harness (_harness.py beside this file): OPTIONS, RID, emit, run_main, import_torch, ...
#     python SCRIPT.py ['{"option": value}']   -> one JSON line, schema loradoctor.repro/1
from _harness import *  # noqa: F401,F403


MIB = 1 << 20
OTHERS_LIMIT = 0.05
OBTAINABLE_LIMIT = 0.80
CONTEXT_ALLOWANCE_BYTES = 1024 * MIB  # one CUDA context plus the driver's own reserve


def nvml_view(torch, index):
    """NVML's numbers for torch's device `index` (matched by UUID, as CUDA_VISIBLE_DEVICES renumbers), or {}."""
    try:
        import pynvml
        pynvml.nvmlInit()
    except Exception:
        return {}
    try:
        handle = None
        uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
        if uuid is not None:
            try:
                handle = pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
            except Exception:
                handle = None
        if handle is None and "CUDA_VISIBLE_DEVICES" not in os.environ:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        if handle is None:
            return {}
        mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
        procs = []
        for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
            try:
                for p in getattr(pynvml, getter)(handle):
                    procs.append({"pid": p.pid, "used_bytes": p.usedGpuMemory or 0})
            except Exception:
                pass
        return {"total_bytes": mem.total, "free_bytes": mem.free, "used_bytes": mem.used, "processes": procs}
    except Exception:
        return {}
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def process_name(pid):
    try:
        import psutil
        return " ".join(psutil.Process(pid).cmdline()[:3]) or psutil.Process(pid).name()
    except Exception:
        return "?"


def grab_all(torch, device):
    """Allocate until nothing more fits; return (total bytes obtained, the tensors)."""
    held, chunk, total = [], 256 * MIB, 0
    while chunk >= 2 * MIB:
        try:
            held.append(torch.empty(chunk, dtype=torch.uint8, device=device))
            total += chunk
        except RuntimeError:  # OutOfMemoryError subclasses RuntimeError in every torch 2.x
            chunk //= 2
    return total, held


def largest_block(torch, device, hi_bytes):
    lo, hi = 0, hi_bytes
    while hi - lo > 16 * MIB:
        mid = (lo + hi) // 2
        try:
            t = torch.empty(mid, dtype=torch.uint8, device=device)
            del t
            lo = mid
        except RuntimeError:
            hi = mid
        torch.cuda.empty_cache()
    return lo


def main():
    need_gpu_driver()
    torch = import_torch()
    need_cuda(torch)
    me = os.getpid()
    devices, problems, evidence = [], [], []
    for index in range(torch.cuda.device_count()):
        device = torch.device("cuda", index)
        name = torch.cuda.get_device_name(index)
        torch.zeros(1, device=device)
        free_bytes, total_bytes = torch.cuda.mem_get_info(device)
        nv = nvml_view(torch, index)  # after our context exists, so NVML lists this process too
        obtained, held = grab_all(torch, device)
        del held
        torch.cuda.empty_cache()
        largest = largest_block(torch, device, free_bytes)
        entry = {"index": index, "name": name, "total_bytes": total_bytes, "cuda_free_bytes": free_bytes,
                 "obtainable_bytes": obtained, "largest_block_bytes": largest}
        others_bytes = None
        if nv:
            entry.update({"nvml_free_bytes": nv["free_bytes"], "nvml_used_bytes": nv["used_bytes"]})
            pids = {p["pid"] for p in nv["processes"]}
            if me in pids:
                others = [p for p in nv["processes"] if p["pid"] != me]
                entry["other_processes"] = [{"pid": p["pid"], "name": process_name(p["pid"]), "used_bytes": p["used_bytes"]}
                                            for p in others]
                others_bytes = sum(p["used_bytes"] for p in others)
        if others_bytes is None:
            # No usable process list (a container shows host pids, or no NVML): what is used beyond about
            # one CUDA context (ours) stands in for the other processes.
            used = entry.get("nvml_used_bytes", total_bytes - free_bytes)
            others_bytes = max(0, used - CONTEXT_ALLOWANCE_BYTES)
            entry["others_estimated"] = True
        entry["others_bytes"] = others_bytes
        devices.append(entry)
        for p in entry.get("other_processes", []):
            evidence.append(f"GPU {index}: pid {p['pid']} ({p['name']}) holds {p['used_bytes'] / MIB:.0f} MiB")
        if others_bytes > OTHERS_LIMIT * total_bytes:
            problems.append(f"GPU {index} {name}: other processes hold {others_bytes / MIB:.0f} MiB "
                            f"({others_bytes / total_bytes:.0%} of {total_bytes / MIB:.0f} MiB)")
        if obtained < OBTAINABLE_LIMIT * free_bytes:
            problems.append(f"GPU {index} {name}: this process could get only {obtained / MIB:.0f} MiB "
                            f"of {free_bytes / MIB:.0f} MiB reported free")
    numbers = {"devices": devices}
    if problems:
        emit("FAIL", problems[0], problems + evidence, numbers)
    summary = "; ".join(f"GPU {d['index']} {d['name']}: can get {d['obtainable_bytes'] / MIB:.0f} of "
                        f"{d['total_bytes'] / MIB:.0f} MiB, largest block {d['largest_block_bytes'] / MIB:.0f} MiB"
                        for d in devices)
    emit("PASS", summary, evidence, numbers)


run_main(main)
