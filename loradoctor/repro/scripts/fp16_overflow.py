"""Repro fp16-overflow: values past the fp16 range (65504) become inf, then nan.

Three arms train the same tiny model whose activations square a value (default 300 -> 90000):
plain fp16; fp16 with dynamic loss scaling (what GradScaler does: skip a step with inf/nan
gradients and halve the scale); bf16 (fp32's range with fewer digits).
Setup under test: option setup = fp16 | fp16-scaled | bf16; default bf16 where it is native
(CPU, GPUs with compute capability >= 8.0), else fp16-scaled.
FAIL: the setup under test produces non-finite weights, or never makes a finite step (loss
scaling protects the weights but cannot fix a forward overflow). PASS: it trains with finite
values. The other arms are reported beside it. Runs on CPU and GPU.
"""

# The shared harness (_harness.py beside this file): OPTIONS, RID, emit, run_main, import_torch, ...
#     python SCRIPT.py ['{"option": value}']   -> one JSON line, schema loradoctor.repro/1
from _harness import *  # noqa: F401,F403


FP16_MAX = 65504.0


def train_arm(torch, device, arm, value, steps=4):
    """A few steps of a tiny model whose activation squares value * w, normalised like a softmax/norm layer."""
    dtype = torch.bfloat16 if arm == "bf16" else torch.float16
    w = torch.linspace(0.5, 1.0, 8, dtype=torch.float32, device=device)  # fp32 master weights
    x = torch.full((8,), float(value), dtype=torch.float32, device=device)
    scale = 65536.0 if arm == "fp16-scaled" else 1.0
    stats = {"losses": [], "skipped_steps": 0, "applied_steps": 0}
    for _ in range(steps):
        wl = w.to(dtype).requires_grad_(True)  # the low-precision copy the forward uses
        act = (wl * x.to(dtype)) ** 2  # past 65504 in fp16 once |w * value| > 255.9: inf
        p = act / act.mean()  # inf / inf = nan, as in a norm or softmax after an overflow
        loss = ((p - 1.0) ** 2).mean()
        stats["losses"].append(float(loss.float().item()))
        (loss * scale).backward()
        grad = wl.grad.float() / scale
        if arm == "fp16-scaled" and not torch.isfinite(grad).all():
            stats["skipped_steps"] += 1
            scale /= 2.0  # GradScaler's backoff: skip this step, try a smaller scale
            continue
        with torch.no_grad():
            w -= 1e-6 * grad
        stats["applied_steps"] += 1
    stats["weights_finite"] = bool(torch.isfinite(w).all().item())
    stats["loss_finite"] = all(v == v and abs(v) != float("inf") for v in stats["losses"])
    stats["final_scale"] = scale
    return stats


def main():
    torch = import_torch()
    device, use_cuda = pick_device(torch)
    native_bf16 = (not use_cuda) or torch.cuda.get_device_capability(0)[0] >= 8
    setup = str(OPTIONS.get("setup") or ("bf16" if native_bf16 else "fp16-scaled")).lower()
    if setup not in ("fp16", "fp16-scaled", "bf16"):
        emit("ERROR", f"unknown setup {setup!r}; use fp16, fp16-scaled or bf16")
    value = float(OPTIONS.get("value") or 300.0)
    numbers = {"device": str(device), "setup": setup, "value": value, "fp16_max": FP16_MAX}
    probe = torch.tensor([60000.0, 70000.0, value * value], device=device)
    as_fp16 = probe.half().float().tolist()
    as_bf16 = probe.bfloat16().float().tolist()
    numbers["cast_fp16"] = as_fp16
    numbers["cast_bf16"] = as_bf16
    evidence = [f"[60000, 70000, {value:g}^2] in fp16 -> {as_fp16}; in bf16 -> {as_bf16}"]
    arms = {arm: train_arm(torch, device, arm, value) for arm in ("fp16", "fp16-scaled", "bf16")}
    numbers["arms"] = arms
    for arm, s in arms.items():
        evidence.append(f"{arm}: losses {s['losses']}, weights finite {s['weights_finite']}, "
                        f"steps applied {s['applied_steps']}, skipped {s['skipped_steps']}")
    chosen = arms[setup]
    overflow = value * value > FP16_MAX
    numbers["overflow_expected"] = overflow
    if not chosen["weights_finite"]:
        emit("FAIL", f"{setup} overflows: {value:g}^2 = {value * value:g} is past fp16's {FP16_MAX:g}, the loss is "
                     f"{chosen['losses'][-1]} and the weights become non-finite; bf16 keeps them finite "
                     f"(weights finite: {arms['bf16']['weights_finite']})", evidence, numbers)
    if chosen["applied_steps"] == 0:
        emit("FAIL", f"{setup}: loss scaling skips every step ({chosen['skipped_steps']} of "
                     f"{chosen['skipped_steps']}): the overflow is in the forward pass, which scaling cannot fix; "
                     "use bf16 or keep that layer in fp32", evidence, numbers)
    if not chosen["loss_finite"]:
        emit("FAIL", f"{setup}: the loss is not finite ({chosen['losses']})", evidence, numbers)
    other = "fp16 overflows to inf here" if not arms["fp16"]["loss_finite"] else "fp16 stays finite at this value"
    relation = "past" if overflow else "within"
    emit("PASS", f"{setup} trains with finite values at {value:g} ({value:g}^2 = {value * value:g} is {relation} "
                 f"fp16's {FP16_MAX:g}); {other}", evidence, numbers)


run_main(main)
