"""Repro bnb-4bit: does a bitsandbytes NF4 Linear4bit run forward and backward on this GPU?

PASS: the layer quantizes on the GPU, its output matches x @ dequantized(W).T, and the gradient
reaches the input (what a QLoRA adapter needs). FAIL: bitsandbytes cannot load its native library
(CUDA version mismatch, missing libcudart), or the call raises, or the numbers are wrong.
SKIP: no CUDA GPU, or bitsandbytes is not installed.
"""

# The shared harness (_harness.py beside this file): OPTIONS, RID, emit, run_main, import_torch, ...
#     python SCRIPT.py ['{"option": value}']   -> one JSON line, schema loradoctor.repro/1
from _harness import *  # noqa: F401,F403


def main():
    torch, device, (major, minor), name = cuda_gpu()
    numbers = {"gpu": name, "compute_capability": f"{major}.{minor}"}
    bnb, import_noise = import_bnb(numbers)
    compute_dtype = torch.bfloat16 if major >= 8 else torch.float16
    numbers["compute_dtype"] = str(compute_dtype).replace("torch.", "")
    try:
        gen = torch.Generator().manual_seed(0)
        weight = (torch.randn(256, 256, generator=gen) * 0.05).to(torch.float16)
        layer = bnb.nn.Linear4bit(256, 256, bias=False, compute_dtype=compute_dtype, quant_type="nf4")
        layer.weight = bnb.nn.Params4bit(weight, requires_grad=False, quant_type="nf4")
        layer = layer.to(device)  # quantizes here
        x = torch.randn(8, 256, generator=gen).to(device, compute_dtype).requires_grad_(True)
        y = layer(x)
        y.float().sum().backward()
        torch.cuda.synchronize(device)
        deq = bnb.functional.dequantize_4bit(layer.weight.data, layer.weight.quant_state).to(compute_dtype)
        ref = (x.detach() @ deq.t()).float()
        out_err = ((y.detach().float() - ref).norm() / ref.norm()).item()
        quant_err = ((deq.float().cpu() - weight.float()).norm() / weight.float().norm()).item()
        numbers.update({"output_rel_error": out_err, "nf4_weight_rel_error": quant_err,
                        "weight_bytes": layer.weight.data.numel() * layer.weight.data.element_size()})
        grad_ok = x.grad is not None and torch.isfinite(x.grad).all().item() and x.grad.abs().sum().item() > 0
    except Exception as exc:
        emit("FAIL", f"bitsandbytes 4-bit layer failed: {exc_line(exc)}",
             import_noise + traceback.format_exc().splitlines()[-4:], numbers)
    if not grad_ok:
        emit("FAIL", "the 4-bit layer's backward gave no finite gradient to its input", import_noise, numbers)
    if not out_err < 0.02:
        emit("FAIL", f"4-bit layer output differs from x @ dequantized(W).T by {out_err:.3g}", import_noise, numbers)
    if not quant_err < 0.2:
        emit("FAIL", f"NF4 round trip of the weight is off by {quant_err:.3g} (expected about 0.1)", import_noise, numbers)
    emit("PASS", f"bitsandbytes {numbers['bitsandbytes']} NF4 forward+backward works on {name} "
                 f"(output error {out_err:.2g}, NF4 weight error {quant_err:.2g})", import_noise, numbers)


run_main(main)
