"""The small harness every repro script starts with: options in, one JSON result line out.

A repro script runs on its own as `python SCRIPT.py ['{"option": value}']` and prints one line,
schema loradoctor.repro/1 (docs/repro.md). Python puts the script's folder first on sys.path, so
`from _harness import *` finds this file beside it; nothing here imports loradoctor.
"""

import json
import os
import sys
import time
import traceback

T0 = time.monotonic()
# the script that was run (sys.argv[0]) names the repro: fp16.py -> "fp16"
RID = os.path.basename(sys.argv[0])[:-3].replace("_", "-")
OPTIONS = json.loads(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].strip() else {}


def emit(status, summary, evidence=(), numbers=None):
    """Print the result line and exit 0 (the status is in the JSON, not the exit code)."""
    torch_mod = sys.modules.get("torch")
    print(json.dumps({
        "schema": "loradoctor.repro/1", "id": RID, "status": status, "summary": summary,
        "evidence": [str(e) for e in evidence], "numbers": numbers or {},
        "duration_s": round(time.monotonic() - T0, 3), "python": sys.version.split()[0],
        "torch": getattr(torch_mod, "__version__", None),
    }, default=str), flush=True)
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown: a poisoned CUDA context can hang or crash there


def opt_bool(name, default):
    value = OPTIONS.get(name, default)
    return value if isinstance(value, bool) else str(value).strip().lower() in ("1", "true", "yes", "on")


def exc_line(exc):
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def import_torch():
    """torch, or SKIP when it is not installed, or FAIL when it is installed but broken."""
    try:
        import torch
    except ModuleNotFoundError as exc:
        emit("SKIP", f"torch is not installed for {sys.executable}", [exc_line(exc)])
    except Exception:  # an installed torch that cannot load (missing libs, ABI)
        emit("FAIL", "torch is installed but cannot be imported", traceback.format_exc().splitlines()[-6:])
    return torch


def need_cuda(torch):
    """SKIP unless torch sees a CUDA GPU; the reason names the torch build."""
    if getattr(torch.version, "cuda", None) is None:
        emit("SKIP", f"needs a CUDA GPU: torch {torch.__version__} is a CPU-only build "
                     "(loradoctor repro run cuda-init tells whether a GPU is there)")
    if not torch.cuda.is_available():
        emit("SKIP", "needs a CUDA GPU: torch sees none (CUDA_VISIBLE_DEVICES="
                     f"{os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')}; loradoctor repro run cuda-init says why)")
    return torch.device("cuda", 0)


def need_gpu_driver():
    """SKIP at once, before the slow torch import, on a Linux machine with no GPU driver at all."""
    if not sys.platform.startswith("linux"):
        return
    nodes = ("/dev/nvidiactl", "/proc/driver/nvidia/version", "/dev/dxg", "/dev/kfd")  # NVIDIA, WSL2, ROCm
    if not any(os.path.exists(p) for p in nodes):
        emit("SKIP", "needs a CUDA GPU: this machine has no GPU driver (no /dev/nvidiactl, /proc/driver/nvidia, /dev/dxg)")


def import_bnb(numbers):
    """bitsandbytes, or SKIP when it is not installed, or FAIL when it cannot load; its import chatter comes back as evidence."""
    import io
    import contextlib

    captured = io.StringIO()
    try:
        with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
            import bitsandbytes as bnb
    except ModuleNotFoundError as exc:
        if "bitsandbytes" in str(exc):
            emit("SKIP", "bitsandbytes is not installed (needed only for QLoRA / 8-bit optimizers)", [exc_line(exc)], numbers)
        raise
    except Exception as exc:
        emit("FAIL", f"bitsandbytes cannot be imported: {exc_line(exc)}",
             [line for line in captured.getvalue().splitlines() if line.strip()][-6:], numbers)
    numbers["bitsandbytes"] = getattr(bnb, "__version__", None)
    return bnb, [line for line in captured.getvalue().splitlines() if line.strip()][-6:]


def pick_device(torch):
    """(device, use_cuda) for repros that also run on the CPU: the GPU when there is one, unless the
    `device` option says cpu; SKIP when it says cuda and there is none."""
    want = str(OPTIONS.get("device") or "").lower()
    use_cuda = want != "cpu" and getattr(torch.version, "cuda", None) is not None and torch.cuda.is_available()
    if want == "cuda" and not use_cuda:
        emit("SKIP", "device=cuda asked for, but torch sees no CUDA GPU")
    device = torch.device("cuda", 0) if use_cuda else torch.device("cpu")
    return device, use_cuda


def run_main(main):
    try:
        main()
    except SystemExit:
        raise
    except BaseException as exc:  # a bug or an unexpected library error: say so, with the traceback tail
        emit("ERROR", f"the repro could not complete: {exc_line(exc)}", traceback.format_exc().splitlines()[-10:])
    emit("ERROR", "the repro ended without a verdict")


def cuda_gpu():
    """What a repro of a GPU feature starts with: a driver (else SKIP at once), torch (SKIP / FAIL), a CUDA
    device (SKIP). Returns (torch, device, (major, minor) compute capability, device name)."""
    need_gpu_driver()
    torch = import_torch()
    device = need_cuda(torch)
    return torch, device, torch.cuda.get_device_capability(device), torch.cuda.get_device_name(device)


__all__ = ["json", "os", "sys", "time", "traceback", "T0", "RID", "OPTIONS", "emit", "opt_bool", "exc_line",
           "import_torch", "import_bnb", "pick_device", "need_cuda", "need_gpu_driver", "cuda_gpu", "run_main"]
