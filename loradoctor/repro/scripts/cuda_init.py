"""Repro cuda-init: can this torch create a CUDA context and compute correctly on each GPU?

PASS: every visible GPU creates a context and a seeded 256x256 fp32 a @ b matches the CPU.
FAIL: an NVIDIA GPU is present but torch cannot use it (CPU-only build, driver too old, no kernel
image for this architecture, CUDA unknown error), or the product is wrong.
SKIP: no NVIDIA GPU or driver on this machine (nothing to check).
"""

# The shared harness (_harness.py beside this file): OPTIONS, RID, emit, run_main, import_torch, ...
#     python SCRIPT.py ['{"option": value}']   -> one JSON line, schema loradoctor.repro/1
from _harness import *  # noqa: F401,F403


def nvidia_gpu_present():
    """(present, how we know) without torch: NVML first, then the driver's files."""
    try:
        import pynvml
        pynvml.nvmlInit()
        try:
            count = pynvml.nvmlDeviceGetCount()
            driver = pynvml.nvmlSystemGetDriverVersion()
            driver = driver.decode() if isinstance(driver, bytes) else driver
        finally:
            pynvml.nvmlShutdown()
        return count > 0, f"NVML: {count} GPU{'' if count == 1 else 's'}, driver {driver}"
    except Exception:
        pass
    if os.path.exists("/proc/driver/nvidia/version") or os.path.exists("/dev/nvidiactl"):
        return True, "the NVIDIA kernel driver is loaded (/proc/driver/nvidia or /dev/nvidiactl)"
    return False, "no NVML and no NVIDIA kernel driver"


def main():
    need_gpu_driver()
    import warnings

    torch = import_torch()
    present, how = nvidia_gpu_present()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        available = torch.cuda.is_available()
    warned = [str(w.message).splitlines()[0] for w in caught]
    numbers = {"torch_cuda": torch.version.cuda, "gpu_present": present}
    if not available:
        if not present:
            emit("SKIP", f"no NVIDIA GPU on this machine ({how})", warned, numbers)
        if torch.version.cuda is None:
            emit("FAIL", f"an NVIDIA GPU is here but torch {torch.__version__} is a CPU-only build; "
                         "install a CUDA wheel (pip install torch --index-url https://download.pytorch.org/whl/cu124 or newer)",
                 [how] + warned, numbers)
        reason = []
        try:
            torch.cuda.init()
        except Exception as exc:
            reason.append(exc_line(exc))
        emit("FAIL", "an NVIDIA GPU is here but torch cannot initialise CUDA", [how] + warned + reason, numbers)

    torch.backends.cuda.matmul.allow_tf32 = False  # compare full fp32 with full fp32
    count = torch.cuda.device_count()
    arch_list = torch.cuda.get_arch_list()
    numbers.update({"device_count": count, "arch_list": arch_list, "devices": []})
    evidence, failures = list(warned), []
    gen = torch.Generator().manual_seed(1234)
    a = torch.randn(256, 256, generator=gen)
    b = torch.randn(256, 256, generator=gen)
    expected = a @ b
    for index in range(count):
        name = torch.cuda.get_device_name(index)
        major, minor = torch.cuda.get_device_capability(index)
        entry = {"index": index, "name": name, "compute_capability": f"{major}.{minor}"}
        sm = f"sm_{major}{minor}"
        # a GPU newer than every compiled arch runs only through PTX JIT (slow first call) or not at all
        if arch_list and sm not in arch_list and not any(x.startswith("compute_") for x in arch_list):
            evidence.append(f"GPU {index} {name} is {sm}; this torch was built for {' '.join(arch_list)}")
        try:
            t0 = time.monotonic()
            device = torch.device("cuda", index)
            torch.zeros(1, device=device)
            torch.cuda.synchronize(device)
            entry["context_s"] = round(time.monotonic() - t0, 3)
            got = (a.to(device) @ b.to(device)).cpu()
            err = ((got - expected).abs().max() / expected.abs().max()).item()
            entry["max_rel_error"] = err
            if not (err < 1e-4):
                failures.append(f"GPU {index} {name}: a @ b differs from the CPU (max relative error {err:.3g})")
        except Exception as exc:
            failures.append(f"GPU {index} {name} ({sm}): {exc_line(exc)}")
        numbers["devices"].append(entry)
    if failures:
        emit("FAIL", failures[0], failures + evidence, numbers)
    names = ", ".join(d["name"] for d in numbers["devices"])
    emit("PASS", f"CUDA works on {count} GPU{'' if count == 1 else 's'} ({names}); a @ b matches the CPU", evidence, numbers)


run_main(main)
