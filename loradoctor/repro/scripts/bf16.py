"""Repro bf16: does bfloat16 really work on this GPU?

PASS: the GPU has native bf16 (compute capability >= 8.0) and a bf16 matmul and a few autocast
training steps agree with fp32. FAIL: bf16 is not native here (torch.cuda.is_bf16_supported() may
still say True on Turing/Volta: it only checks that a bf16 tensor can be created, and transformers
refuses bf16 there), or the results are wrong / not finite, or an op raises. SKIP: no CUDA GPU.
"""

# The shared harness (_harness.py beside this file): OPTIONS, RID, emit, run_main, import_torch, ...
#     python SCRIPT.py ['{"option": value}']   -> one JSON line, schema loradoctor.repro/1
from _harness import *  # noqa: F401,F403


# fp16.py runs this same program under its own name (RID): one body, two dtypes.
DTYPE_NAME = RID if RID in ("bf16", "fp16") else "bf16"


TOLERANCE = {"bf16": (0.03, 0.15), "fp16": (0.01, 0.05)}  # (matmul relative error, loss relative gap)


def train(torch, device, dtype, steps=5):
    """A few SGD steps of a small MLP under autocast (dtype) or in fp32 (dtype None); returns losses."""
    gen = torch.Generator().manual_seed(0)
    w1 = torch.randn(64, 128, generator=gen) * 0.1
    w2 = torch.randn(128, 1, generator=gen) * 0.1
    x = torch.randn(256, 64, generator=gen)
    y = torch.randn(256, 1, generator=gen)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128, bias=False), torch.nn.GELU(), torch.nn.Linear(128, 1, bias=False))
    with torch.no_grad():
        model[0].weight.copy_(w1.t())
        model[2].weight.copy_(w2.t())
    model.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = x.to(device), y.to(device)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        with torch.autocast("cuda", dtype=dtype, enabled=dtype is not None):
            out = model(x)
        loss = torch.nn.functional.mse_loss(out.float(), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    finite_grads = all(torch.isfinite(p).all().item() for p in model.parameters())
    return losses, finite_grads


def main():
    need_gpu_driver()
    torch = import_torch()
    device = need_cuda(torch)
    torch.backends.cuda.matmul.allow_tf32 = False
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[DTYPE_NAME]
    major, minor = torch.cuda.get_device_capability(device)
    name = torch.cuda.get_device_name(device)
    numbers = {"gpu": name, "compute_capability": f"{major}.{minor}"}
    evidence, problems = [], []
    if DTYPE_NAME == "bf16":
        numbers["is_bf16_supported"] = torch.cuda.is_bf16_supported()
        try:
            numbers["is_bf16_supported_native"] = torch.cuda.is_bf16_supported(including_emulation=False)
        except TypeError:  # torch < 2.4 has no including_emulation
            pass
        if major < 8:
            problems.append(f"{name} is compute capability {major}.{minor}: bf16 is not native before 8.0 (Ampere); "
                            f"is_bf16_supported() says {numbers['is_bf16_supported']}, transformers refuses bf16=True here; use fp16")
    mm_tol, loss_tol = TOLERANCE[DTYPE_NAME]
    try:
        gen = torch.Generator().manual_seed(1)
        a = torch.randn(512, 512, generator=gen).to(device)
        b = torch.randn(512, 512, generator=gen).to(device)
        ref = a @ b
        got = (a.to(dtype) @ b.to(dtype)).float()
        rel = ((got - ref).norm() / ref.norm()).item()
        numbers["matmul_rel_error"] = rel
        if not torch.isfinite(got).all().item() or not rel < mm_tol:
            problems.append(f"{DTYPE_NAME} matmul disagrees with fp32: relative error {rel:.3g} (tolerance {mm_tol})")
        losses_ref, _ = train(torch, device, None)
        losses, finite = train(torch, device, dtype)
        numbers["losses_fp32"] = [round(v, 6) for v in losses_ref]
        numbers[f"losses_{DTYPE_NAME}"] = [round(v, 6) for v in losses]
        gap = max(abs(u - v) / max(abs(v), 1e-6) for u, v in zip(losses, losses_ref))
        numbers["loss_rel_gap"] = gap
        if not finite or not all(v == v and abs(v) != float("inf") for v in losses):
            problems.append(f"{DTYPE_NAME} training step produced non-finite losses or weights: {losses}")
        elif not gap < loss_tol:
            problems.append(f"{DTYPE_NAME} training losses drift from fp32 by {gap:.3g} (tolerance {loss_tol})")
    except Exception as exc:
        problems.append(f"{DTYPE_NAME} compute raised {exc_line(exc)}")
        evidence += traceback.format_exc().splitlines()[-4:]
    if problems:
        emit("FAIL", problems[0], problems + evidence, numbers)
    emit("PASS", f"{DTYPE_NAME} works on {name} (CC {major}.{minor}): matmul error {numbers['matmul_rel_error']:.2g}, "
                 f"training matches fp32 within {numbers['loss_rel_gap']:.2g}", evidence, numbers)


run_main(main)
