"""Repro bnb-8bit-optim: does one bitsandbytes 8-bit AdamW step update the weights correctly?

PASS: bnb.optim.AdamW8bit keeps uint8 state and moves the weights like torch.optim.AdamW does
(same direction, similar size). FAIL: the native library cannot load, the step raises, the weights
do not change or become non-finite. SKIP: no CUDA GPU, or bitsandbytes is not installed.
"""

# --- the same small harness heads every repro script, so each one runs on its own: -----------
#     python SCRIPT.py ['{"option": value}']   -> one JSON line, schema loradoctor.repro/1
import json
import os
import sys
import time
import traceback

T0 = time.monotonic()
RID = os.path.basename(__file__)[:-3].replace("_", "-")
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


def run_main(main):
    try:
        main()
    except SystemExit:
        raise
    except BaseException as exc:  # a bug or an unexpected library error: say so, with the traceback tail
        emit("ERROR", f"the repro could not complete: {exc_line(exc)}", traceback.format_exc().splitlines()[-10:])
    emit("ERROR", "the repro ended without a verdict")
# --- end of harness ---------------------------------------------------------------------------


def import_bnb(numbers):
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


def main():
    need_gpu_driver()
    torch = import_torch()
    device = need_cuda(torch)
    name = torch.cuda.get_device_name(device)
    numbers = {"gpu": name}
    bnb, import_noise = import_bnb(numbers)
    gen = torch.Generator().manual_seed(0)
    # 8-bit state is used only for tensors of 4096+ elements (min_8bit_size): 128 x 128 = 16384
    init = torch.randn(128, 128, generator=gen) * 0.05
    grad = torch.randn(128, 128, generator=gen)
    deltas = {}
    try:
        for label, make in (("torch", lambda p: torch.optim.AdamW([p], lr=1e-3)),
                            ("bnb", lambda p: bnb.optim.AdamW8bit([p], lr=1e-3))):
            p = torch.nn.Parameter(init.clone().to(device))
            opt = make(p)
            p.grad = grad.clone().to(device)
            opt.step()
            torch.cuda.synchronize(device)
            deltas[label] = (p.detach() - init.to(device)).float().cpu()
            if label == "bnb":
                states = {k: str(v.dtype).replace("torch.", "") for k, v in opt.state[p].items() if hasattr(v, "dtype")}
                numbers["bnb_state_dtypes"] = states
                if not torch.isfinite(p.detach()).all().item():
                    emit("FAIL", "the 8-bit AdamW step made the weights non-finite", import_noise, numbers)
    except Exception as exc:
        emit("FAIL", f"bitsandbytes 8-bit optimizer step failed: {exc_line(exc)}",
             import_noise + traceback.format_exc().splitlines()[-4:], numbers)
    changed = deltas["bnb"].abs().max().item()
    cosine = torch.nn.functional.cosine_similarity(deltas["bnb"].flatten(), deltas["torch"].flatten(), dim=0).item()
    ratio = deltas["bnb"].norm().item() / max(deltas["torch"].norm().item(), 1e-12)
    numbers.update({"max_weight_change": changed, "cosine_vs_torch_adamw": cosine, "size_ratio_vs_torch_adamw": ratio})
    if changed == 0.0:
        emit("FAIL", "the 8-bit AdamW step did not change the weights", import_noise, numbers)
    if not (cosine > 0.9 and 0.5 < ratio < 2.0):
        emit("FAIL", f"the 8-bit AdamW step disagrees with torch AdamW (cosine {cosine:.3f}, size ratio {ratio:.2f})",
             import_noise, numbers)
    if "uint8" not in numbers.get("bnb_state_dtypes", {}).values():
        import_noise = import_noise + [f"optimizer state is {numbers.get('bnb_state_dtypes')}, not uint8"]
    emit("PASS", f"bitsandbytes {numbers['bitsandbytes']} 8-bit AdamW step matches torch AdamW "
                 f"(cosine {cosine:.3f}) on {name}", import_noise, numbers)


run_main(main)
