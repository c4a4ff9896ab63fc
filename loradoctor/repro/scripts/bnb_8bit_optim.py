"""Repro bnb-8bit-optim: does one bitsandbytes 8-bit AdamW step update the weights correctly?

PASS: bnb.optim.AdamW8bit keeps uint8 state and moves the weights like torch.optim.AdamW does
(same direction, similar size). FAIL: the native library cannot load, the step raises, the weights
do not change or become non-finite. SKIP: no CUDA GPU, or bitsandbytes is not installed.
"""

# The shared harness (_harness.py beside this file): OPTIONS, RID, emit, run_main, import_torch, ...
#     python SCRIPT.py ['{"option": value}']   -> one JSON line, schema loradoctor.repro/1
from _harness import *  # noqa: F401,F403


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
