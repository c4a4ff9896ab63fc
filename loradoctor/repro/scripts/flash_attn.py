"""Repro flash-attn: does flash_attn_func run here with the dtype and head dim your model needs?

Options: dtype (bf16 | fp16; default bf16 where native, else fp16), head_dim (default 128).
PASS: flash_attn imports and flash_attn_func runs forward and backward on tiny tensors and matches
SDPA. FAIL: the import fails (ABI mismatch: undefined symbol), or the call raises (pre-Ampere GPU,
fp32, head dim not a multiple of 8 or above 256), or the output differs. SKIP: no CUDA GPU, or
flash-attn is not installed (then transformers uses SDPA instead; see repro sdpa-backends).
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


def main():
    need_gpu_driver()
    torch = import_torch()
    device = need_cuda(torch)
    major, minor = torch.cuda.get_device_capability(device)
    name = torch.cuda.get_device_name(device)
    dtype_name = str(OPTIONS.get("dtype") or ("bf16" if major >= 8 else "fp16")).lower()
    dtypes = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16,
              "float16": torch.float16, "fp32": torch.float32, "float32": torch.float32}
    if dtype_name not in dtypes:
        emit("ERROR", f"unknown dtype {dtype_name!r}; use bf16 or fp16")
    dtype = dtypes[dtype_name]
    head_dim = int(OPTIONS.get("head_dim") or 128)
    numbers = {"gpu": name, "compute_capability": f"{major}.{minor}", "dtype": dtype_name, "head_dim": head_dim}
    try:
        import flash_attn
        from flash_attn import flash_attn_func
    except ModuleNotFoundError as exc:
        if "flash_attn" in str(exc) and "flash_attn_2_cuda" not in str(exc):
            emit("SKIP", "flash-attn is not installed (transformers will use SDPA; repro sdpa-backends checks that)",
                 [exc_line(exc)], numbers)
        emit("FAIL", "flash-attn is installed but its CUDA extension is missing", [exc_line(exc)], numbers)
    except Exception as exc:  # undefined symbol: a wheel built for another torch / CUDA / C++ ABI
        emit("FAIL", f"flash-attn is installed but cannot be imported: {exc_line(exc)}",
             traceback.format_exc().splitlines()[-4:] + [f"torch {torch.__version__} (CUDA {torch.version.cuda})"], numbers)
    numbers["flash_attn"] = getattr(flash_attn, "__version__", None)
    batch, seqlen, heads = 2, 128, 4
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(batch, seqlen, heads, head_dim, generator=gen).to(device, dtype).requires_grad_(True)
               for _ in range(3))
    try:
        out = flash_attn_func(q, k, v, causal=True)
        out.float().sum().backward()
        torch.cuda.synchronize(device)
    except Exception as exc:
        hint = ""
        if major < 8:
            hint = f" ({name} is CC {major}.{minor}; flash-attn 2 needs Ampere, CC 8.0, or newer)"
        elif dtype not in (torch.float16, torch.bfloat16):
            hint = " (flash-attn runs only in fp16 / bf16: load the model with torch_dtype=torch.bfloat16)"
        elif head_dim % 8 or head_dim > 256:
            hint = " (head dim must be a multiple of 8 and at most 256)"
        emit("FAIL", f"flash_attn_func raised {exc_line(exc)}{hint}", traceback.format_exc().splitlines()[-4:], numbers)
    # reference: SDPA in fp32 on the same inputs ((B, S, H, D) -> (B, H, S, D))
    qr, kr, vr = (t.detach().float().transpose(1, 2) for t in (q, k, v))
    ref = torch.nn.functional.scaled_dot_product_attention(qr, kr, vr, is_causal=True).transpose(1, 2)
    err = (out.detach().float() - ref).abs().max().item()
    numbers["max_abs_error_vs_sdpa"] = err
    grads_finite = all(torch.isfinite(t.grad).all().item() for t in (q, k, v))
    # a broken kernel is off by O(1); bf16 rounding of outputs near 2-3 alone reaches about 1e-2
    tol = 5e-2 if dtype == torch.bfloat16 else 1e-2
    if not grads_finite:
        emit("FAIL", "flash_attn_func backward produced non-finite gradients", [], numbers)
    if not err < tol:
        emit("FAIL", f"flash_attn_func output differs from SDPA by {err:.3g} (tolerance {tol})", [], numbers)
    emit("PASS", f"flash-attn {numbers['flash_attn']} runs forward+backward on {name} in {dtype_name}, head dim "
                 f"{head_dim}; matches SDPA within {err:.2g}", [], numbers)


run_main(main)
