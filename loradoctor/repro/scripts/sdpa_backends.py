"""Repro sdpa-backends: which scaled_dot_product_attention backends actually run here?

Each backend (flash, mem-efficient, math, cudnn) is forced alone with torch.nn.attention.sdpa_kernel
(older torch: torch.backends.cuda.sdp_kernel) on tiny causal inputs, forward and backward, and
compared with math. Options: dtype (bf16 | fp16 | fp32), head_dim (default 128).
PASS: math and at least one fused backend (flash or mem-efficient) run and agree.
FAIL: no fused backend runs (attention falls back to math: memory grows with seq_len squared),
or math itself fails, or a backend disagrees with math. SKIP: no CUDA GPU.
"""

# The shared harness (_harness.py beside this file): OPTIONS, RID, emit, run_main, import_torch, ...
#     python SCRIPT.py ['{"option": value}']   -> one JSON line, schema loradoctor.repro/1
from _harness import *  # noqa: F401,F403


import warnings


def backend_context(torch, name):
    """A context manager that allows only this backend, or None when this torch cannot force it."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        member = {"flash": "FLASH_ATTENTION", "mem_efficient": "EFFICIENT_ATTENTION",
                  "math": "MATH", "cudnn": "CUDNN_ATTENTION"}[name]
        if not hasattr(SDPBackend, member):
            return None
        return sdpa_kernel(getattr(SDPBackend, member))
    except ImportError:
        pass
    if name == "cudnn":
        return None
    flags = {"enable_flash": name == "flash", "enable_mem_efficient": name == "mem_efficient", "enable_math": name == "math"}
    return torch.backends.cuda.sdp_kernel(**flags)


def main():
    torch, device, (major, minor), name = cuda_gpu()
    dtype_name = str(OPTIONS.get("dtype") or ("bf16" if major >= 8 else "fp16")).lower()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}.get(dtype_name)
    if dtype is None:
        emit("ERROR", f"unknown dtype {dtype_name!r}; use bf16, fp16 or fp32")
    head_dim = int(OPTIONS.get("head_dim") or 128)
    gen = torch.Generator().manual_seed(0)
    base = [torch.randn(2, 4, 128, head_dim, generator=gen) for _ in range(3)]
    numbers = {"gpu": name, "compute_capability": f"{major}.{minor}", "dtype": dtype_name, "head_dim": head_dim,
               "backends": {}}
    evidence, outputs = [], {}
    for backend in ("math", "flash", "mem_efficient", "cudnn"):
        ctx = backend_context(torch, backend)
        if ctx is None:
            numbers["backends"][backend] = "not in this torch"
            continue
        q, k, v = (t.to(device, dtype).requires_grad_(True) for t in base)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with ctx:
                    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
                    out.float().sum().backward()
                torch.cuda.synchronize(device)
                outputs[backend] = out.detach().float()
                numbers["backends"][backend] = "runs"
            except Exception as exc:
                numbers["backends"][backend] = "fails"
                # torch explains why a backend was rejected in warnings ("Flash attention requires ...")
                reasons = [str(w.message).splitlines()[0] for w in caught][:3]
                evidence.append(f"{backend}: {exc_line(exc)}" + (f" ({'; '.join(reasons)})" if reasons else ""))
    problems = []
    if "math" not in outputs:
        problems.append("the math SDPA backend itself fails: attention cannot run in this setup")
    else:
        # a broken backend is off by O(1); the math backend itself rounds differently in half precision
        tol = 6e-2 if dtype == torch.bfloat16 else (2e-2 if dtype == torch.float16 else 1e-4)
        for backend, out in outputs.items():
            err = (out - outputs["math"]).abs().max().item()
            numbers[f"max_abs_error_{backend}"] = err
            if not err < tol:
                problems.append(f"SDPA {backend} differs from math by {err:.3g} (tolerance {tol})")
    if "math" in outputs and not [b for b in ("flash", "mem_efficient") if b in outputs]:
        problems.insert(0, f"no fused SDPA backend runs in {dtype_name} with head dim {head_dim}: attention falls back "
                           "to math, whose memory grows with seq_len squared")
    runs = ", ".join(b for b, state in numbers["backends"].items() if state == "runs") or "none"
    if problems:
        emit("FAIL", problems[0], problems + evidence, numbers)
    emit("PASS", f"SDPA backends that run on {name} ({dtype_name}, head dim {head_dim}): {runs}", evidence, numbers)


run_main(main)
