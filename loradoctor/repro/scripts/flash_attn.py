"""Repro flash-attn: does flash_attn_func run here with the dtype and head dim your model needs?

Options: dtype (bf16 | fp16; default bf16 where native, else fp16), head_dim (default 128).
PASS: flash_attn imports and flash_attn_func runs forward and backward on tiny tensors and matches
SDPA. FAIL: the import fails (ABI mismatch: undefined symbol), or the call raises (pre-Ampere GPU,
fp32, head dim not a multiple of 8 or above 256), or the output differs. SKIP: no CUDA GPU, or
flash-attn is not installed (then transformers uses SDPA instead; see repro sdpa-backends).
"""

# The shared harness (_harness.py beside this file): OPTIONS, RID, emit, run_main, import_torch, ...
#     python SCRIPT.py ['{"option": value}']   -> one JSON line, schema loradoctor.repro/1
from _harness import *  # noqa: F401,F403


def main():
    torch, device, (major, minor), name = cuda_gpu()
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
