"""Child probe: run with the user's interpreter; prints `LORADOCTOR_PROBE {json}` after each stage.

Standalone on purpose (no loradoctor imports): it runs in the Python being diagnosed. The parent
keeps the last record it sees, so a crash or hang in a late stage (CUDA init) still leaves what
the earlier stages learned. Usage: python -c "<this source>" [--deep]
"""
import json
import os
import sys
import time
import traceback
import warnings

out = {"stage": "start"}


def emit(stage):
    out["stage"] = stage
    sys.stdout.write("LORADOCTOR_PROBE " + json.dumps(out, default=str) + "\n")
    sys.stdout.flush()


def main():
    import importlib.util
    import platform

    out["python"] = platform.python_version()
    out["python_executable"] = sys.executable
    if importlib.util.find_spec("torch") is None:
        out["installed"] = False
        emit("missing")
        return 0
    out["installed"] = True
    emit("found")
    t0 = time.monotonic()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            import torch
        except BaseException as exc:  # ImportError, OSError from a missing .so, anything
            out["import_error"] = f"{type(exc).__name__}: {exc}"
            traceback.print_exc()
            emit("import_failed")
            return 1
        out["import_s"] = round(time.monotonic() - t0, 3)
        out["version"] = str(torch.__version__)
        out["origin"] = getattr(torch, "__file__", None)
        out["cuda_version"] = getattr(torch.version, "cuda", None)
        out["hip_version"] = getattr(torch.version, "hip", None)
        out["debug"] = getattr(torch.version, "debug", None)
        emit("imported")
        try:
            flags = torch._C._cuda_getArchFlags() if hasattr(torch._C, "_cuda_getArchFlags") else None
            out["arch_list"] = flags.split() if flags else []
        except Exception as exc:
            out["arch_error"] = f"{type(exc).__name__}: {exc}"
        try:
            out["cudnn_version"] = torch.backends.cudnn.version()
        except Exception as exc:
            out["cudnn_error"] = f"{type(exc).__name__}: {exc}"
        try:
            out["cuda_available"] = bool(torch.cuda.is_available())
            out["device_count"] = int(torch.cuda.device_count())
        except Exception as exc:
            out["cuda_error"] = f"{type(exc).__name__}: {exc}"
            out["cuda_available"], out["device_count"] = False, 0
        emit("cuda_init")
        devices = []
        for i in range(out.get("device_count") or 0):
            try:
                p = torch.cuda.get_device_properties(i)
                devices.append({"index": i, "name": p.name, "capability": f"{p.major}.{p.minor}",
                                "total_memory_bytes": int(p.total_memory)})
            except Exception as exc:
                devices.append({"index": i, "error": f"{type(exc).__name__}: {exc}"})
        out["devices"] = devices
        if out.get("cuda_available"):
            try:
                out["arch_list"] = list(torch.cuda.get_arch_list()) or out.get("arch_list", [])
            except Exception:
                pass
        sdpa = {}
        for key, fn in (("flash", "flash_sdp_enabled"), ("mem_efficient", "mem_efficient_sdp_enabled"),
                        ("math", "math_sdp_enabled"), ("cudnn", "cudnn_sdp_enabled")):
            f = getattr(torch.backends.cuda, fn, None)
            if f is not None:
                try:
                    sdpa[key] = bool(f())
                except Exception:
                    pass
        out["sdpa"] = sdpa
        emit("devices")
        if "--deep" in sys.argv and out.get("cuda_available"):
            out["deep"] = deep_checks(torch, out.get("device_count") or 0)
            emit("deep")
    out["warnings"] = [str(w.message)[:500] for w in caught][:10]
    emit("done")
    return 0


def deep_checks(torch, count):
    """A small matmul per device in bf16 and fp16, compared with fp32: catches broken kernels and missing arch."""
    results = []
    for i in range(count):
        dev = torch.device("cuda", i)
        r = {"index": i}
        try:
            g = torch.Generator(device="cpu").manual_seed(0)
            a = torch.randn(256, 256, generator=g).to(dev)
            b = torch.randn(256, 256, generator=g).to(dev)
            ref = a @ b
            scale = ref.abs().max().item() or 1.0
            for name, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
                try:
                    got = (a.to(dtype) @ b.to(dtype)).float()
                    torch.cuda.synchronize(dev)
                    err = (got - ref).abs().max().item() / scale
                    r[name] = {"ok": err < 5e-2, "max_rel_err": round(err, 5)}
                except Exception as exc:
                    r[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
        except Exception as exc:
            r["error"] = f"{type(exc).__name__}: {exc}"[:300]
        results.append(r)
    return results


code = main()
# Skip interpreter teardown: unloading torch takes seconds and we have printed everything we need.
sys.stdout.flush()
sys.stderr.flush()
os._exit(code)
