"""The activation terms against torch's own bookkeeping: an HF-style Llama layer with PEFT-style LoRA is run
on the CPU under saved_tensors_hooks, and the bytes autograd keeps for backward are compared with
loradoctor.estimate.memory.layer_activation_parts. Needs torch (CI installs a CPU wheel); skipped without.

The layer mirrors transformers' LlamaDecoderLayer (RMSNorm upcasting to fp32, RoPE, repeat_kv for eager,
sdpa with enable_gqa when unpadded, SwiGLU) and PEFT's LoRA Linear (input cast to the fp32 adapter dtype,
lora_B(lora_A(dropout(x))) * scaling). Dropout is 0 here: on the CPU torch saves an fp32 noise tensor where
CUDA's fused dropout keeps a 1-byte mask (the model follows CUDA).
"""

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from loradoctor.estimate.arch import Arch  # noqa: E402
from loradoctor.estimate.memory import EstimateInputs, layer_activation_parts, validate  # noqa: E402

H, I, NH, KV, HD, B, S = 256, 688, 8, 2, 32, 2, 64
ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class RMSNorm(nn.Module):
    def __init__(self, h):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(h))

    def forward(self, x):
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.weight * x.to(dtype)


class LoraLinear(nn.Module):
    def __init__(self, fin, fout, lora, r=8):
        super().__init__()
        self.base = nn.Linear(fin, fout, bias=False)
        self.lora = lora
        if lora:
            self.A = nn.Linear(fin, r, bias=False)
            self.B = nn.Linear(r, fout, bias=False)

    def forward(self, x):
        out = self.base(x)
        if not self.lora:
            return out
        x = x.to(self.A.weight.dtype)
        return (out + self.B(self.A(x)) * 2.0).to(out.dtype)  # PEFT casts the sum back to the base's dtype


def rotate_half(x):
    return torch.cat((-x[..., x.shape[-1] // 2:], x[..., : x.shape[-1] // 2]), dim=-1)


class Layer(nn.Module):
    def __init__(self, targets):
        super().__init__()
        mk = lambda name, i, o: LoraLinear(i, o, name in targets)  # noqa: E731
        self.q, self.k, self.v = mk("q_proj", H, NH * HD), mk("k_proj", H, KV * HD), mk("v_proj", H, KV * HD)
        self.o = mk("o_proj", NH * HD, H)
        self.g, self.u, self.d = mk("gate_proj", H, I), mk("up_proj", H, I), mk("down_proj", I, H)
        self.n1, self.n2 = RMSNorm(H), RMSNorm(H)

    def forward(self, x, cos, sin, attn):
        h = self.n1(x)
        q = self.q(h).view(B, S, NH, HD).transpose(1, 2)
        k = self.k(h).view(B, S, KV, HD).transpose(1, 2)
        v = self.v(h).view(B, S, KV, HD).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        if attn == "eager":
            k = k[:, :, None].expand(B, KV, NH // KV, S, HD).reshape(B, NH, S, HD)
            v = v[:, :, None].expand(B, KV, NH // KV, S, HD).reshape(B, NH, S, HD)
            w = torch.matmul(q, k.transpose(2, 3)) / HD ** 0.5 + torch.triu(torch.full((S, S), -1e9), 1).to(q.dtype)
            w = F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
            o = torch.matmul(w, v)
        else:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o(o.transpose(1, 2).reshape(B, S, NH * HD))
        h = self.n2(x)
        return x + self.d(F.silu(self.g(h)) * self.u(h))


def saved_bytes_per_token(targets, attn, full=False, precision="bf16"):
    """precision: bf16 = autocast with fp32 adapters (Trainer); bf16-no-autocast = bf16 base, fp32 adapters, no
    autocast (PEFT in a plain loop); bf16-true = everything bf16 (adapters too), no autocast."""
    layer = Layer(targets)
    for name, p in layer.named_parameters():
        is_lora = ".A." in name or ".B." in name
        p.requires_grad_(is_lora or full)
        if not is_lora or precision == "bf16-true":
            p.data = p.data.to(torch.bfloat16)
    params = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    seen = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            seen[st.data_ptr()] = max(seen.get(st.data_ptr(), 0), st.nbytes())
        return t

    x = torch.randn(B, S, H, dtype=torch.bfloat16, requires_grad=True) * 1
    pos = torch.arange(S, dtype=torch.float32)[:, None] * torch.ones(HD)[None]
    cos, sin = pos.cos().to(torch.bfloat16)[None, None], pos.sin().to(torch.bfloat16)[None, None]
    rope = 2 * cos.numel() * 2  # cos/sin are shared by all layers in a real model
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=not full and precision == "bf16"):
            layer(x, cos, sin, attn)
    return (sum(seen.values()) - rope) / (B * S)


def modelled(targets, attn, full=False, precision="bf16"):
    arch = Arch(name="toy", hidden=H, intermediate=I, layers=1, heads=NH, kv_heads=KV, vocab=1000)
    inp = EstimateInputs(arch=arch, method="full" if full else "lora", targets=targets if not full else (),
                         rank=8, dropout=0.0, seq_len=S, attn=attn, precision="bf16-true" if full else precision)
    return sum(layer_activation_parts(validate(inp)).values())


@pytest.mark.parametrize("targets, attn", [
    (("q_proj", "v_proj"), "sdpa"),
    (("q_proj", "v_proj"), "eager"),
    (ALL, "sdpa"),
    (ALL, "flash_attention_2"),
])
def test_lora_layer_saved_tensors_match_the_model(targets, attn):
    measured = saved_bytes_per_token(targets, "eager" if attn == "eager" else "sdpa")
    assert modelled(targets, attn) == pytest.approx(measured, rel=0.05)


MLP = ("gate_proj", "up_proj", "down_proj")


@pytest.mark.parametrize("precision", ["bf16", "bf16-no-autocast", "bf16-true"])
@pytest.mark.parametrize("targets", [("q_proj", "v_proj"), MLP, ALL])
def test_each_precision_mode_and_mlp_targets_match_the_model(precision, targets):
    # no autocast: each target keeps an fp32 copy of its input (down_proj's is intermediate-wide) and an fp32
    # rank-r intermediate; bf16-true: lora_A keeps the module input itself, shared by q/v and by gate/up
    measured = saved_bytes_per_token(targets, "sdpa", precision=precision)
    assert modelled(targets, "sdpa", precision=precision) == pytest.approx(measured, rel=0.05)


def test_no_autocast_costs_more_than_autocast_and_grows_with_mlp_targets():
    gap_qv = modelled(("q_proj", "v_proj"), "sdpa", precision="bf16-no-autocast") - modelled(("q_proj", "v_proj"), "sdpa")
    gap_mlp = modelled(MLP, "sdpa", precision="bf16-no-autocast") - modelled(MLP, "sdpa")
    # the fp32 copy is 2 bytes wider per input feature: (h + h) for q,v; (h + h + I) for the MLP; + 2 r each
    assert gap_qv == 2 * (H + H) + 2 * 2 * 8
    assert gap_mlp == 2 * (H + H + I) + 3 * 2 * 8


def test_full_finetune_layer_keeps_linear_inputs():
    measured = saved_bytes_per_token((), "sdpa", full=True)
    assert modelled((), "sdpa", full=True) == pytest.approx(measured, rel=0.08)


class _KeepInputMatmul(torch.autograd.Function):
    """What bitsandbytes' MatMul4Bit does with memory: computes with a (dequantized) weight and keeps its
    input A for backward whether or not anything needs the weight's gradient."""

    kept: dict = {}  # storages kept on ctx (saved_tensors_hooks do not see ctx attributes)

    @staticmethod
    def forward(ctx, a, weight):
        ctx.tensors = (a, weight)
        _KeepInputMatmul.kept[a.untyped_storage().data_ptr()] = a.untyped_storage().nbytes()
        return F.linear(a, weight)

    @staticmethod
    def backward(ctx, grad):
        a, weight = ctx.tensors
        return grad @ weight, None


class FakeLinear4bit(nn.Module):
    """bitsandbytes Linear4bit's dtype handling: cast x to the compute dtype, matmul, cast back to x's dtype."""

    def __init__(self, base):
        super().__init__()
        self.weight = nn.Parameter(base.weight.data.to(torch.bfloat16), requires_grad=False)

    def forward(self, x):
        inp_dtype = x.dtype
        return _KeepInputMatmul.apply(x.to(torch.bfloat16), self.weight).to(inp_dtype)


def test_qlora_layer_with_fp32_upcast_matches_the_model():
    # prepare_model_for_kbit_training: norms (and embeddings, so the layer input) in fp32; 4-bit linears
    # return their output in the input's dtype
    layer = Layer(("q_proj", "v_proj"))
    for lin in (layer.q, layer.k, layer.v, layer.o, layer.g, layer.u, layer.d):
        lin.base = FakeLinear4bit(lin.base)
    for name, p in layer.named_parameters():
        p.requires_grad_(".A." in name or ".B." in name)
    params = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    seen = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            seen[st.data_ptr()] = max(seen.get(st.data_ptr(), 0), st.nbytes())
        return t

    x = torch.randn(B, S, H, dtype=torch.float32, requires_grad=True) * 1
    pos = torch.arange(S, dtype=torch.float32)[:, None] * torch.ones(HD)[None]
    cos, sin = pos.cos()[None, None], pos.sin()[None, None]
    _KeepInputMatmul.kept.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = layer(x, cos, sin, "sdpa")  # keep the graph (and what it holds) alive while counting
    seen.update(_KeepInputMatmul.kept)
    measured = (sum(seen.values()) - 2 * cos.numel() * 4) / (B * S)
    del out
    arch = Arch(name="toy", hidden=H, intermediate=I, layers=1, heads=NH, kv_heads=KV, vocab=1000)
    inp = EstimateInputs(arch=arch, method="qlora", targets=("q_proj", "v_proj"), rank=8, dropout=0.0, seq_len=S)
    assert sum(layer_activation_parts(validate(inp)).values()) == pytest.approx(measured, rel=0.08)


def attention_saved_bytes_per_token(attn, s, heads=2, kv_heads=1, hd=16):
    """The attention block alone (frozen bf16 q/k/v projections, transformers' eager path with repeat_kv and an
    fp32 softmax, or sdpa) at long sequence lengths with a tiny width: one layer, batch 1."""
    h = heads * hd
    q_lin, k_lin, v_lin = (nn.Linear(h, n * hd, bias=False).to(torch.bfloat16).requires_grad_(False)
                           for n in (heads, kv_heads, kv_heads))
    x = torch.randn(1, s, h, dtype=torch.bfloat16, requires_grad=True)
    mask = torch.triu(torch.full((s, s), float("-inf"), dtype=torch.bfloat16), 1)
    seen = {}

    def pack(t):
        st = t.untyped_storage()
        seen[st.data_ptr()] = max(seen.get(st.data_ptr(), 0), st.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        q = q_lin(x).view(1, s, heads, hd).transpose(1, 2)
        k = k_lin(x).view(1, s, kv_heads, hd).transpose(1, 2)
        v = v_lin(x).view(1, s, kv_heads, hd).transpose(1, 2)
        if attn == "eager":
            rep = heads // kv_heads
            k = k[:, :, None].expand(1, kv_heads, rep, s, hd).reshape(1, heads, s, hd)
            v = v[:, :, None].expand(1, kv_heads, rep, s, hd).reshape(1, heads, s, hd)
            w = torch.matmul(q, k.transpose(2, 3)) * hd ** -0.5 + mask
            w = F.softmax(w, dim=-1, dtype=torch.float32).to(torch.bfloat16)
            out = torch.matmul(w, v)
        else:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    del out
    return sum(seen.values()) / s


@pytest.mark.parametrize("s", [2048, 4096])
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_attention_quadratic_terms_at_long_sequences(attn, s):
    # eager: q, k and v expanded to all heads, the fp32 softmax and its bf16 copy (6 bytes per score);
    # sdpa: q, k, v, the output and the log-sum-exp, nothing quadratic
    heads, kv_heads, hd = 2, 1, 16
    measured = attention_saved_bytes_per_token(attn, s, heads, kv_heads, hd)
    arch = Arch(name="toy", hidden=heads * hd, intermediate=64, layers=1, heads=heads, kv_heads=kv_heads, vocab=100)
    inp = validate(EstimateInputs(arch=arch, seq_len=s, attn=attn, targets=("q_proj",), precision="bf16-true"))
    assert layer_activation_parts(inp)["attention"] == pytest.approx(measured, rel=0.05)
    if attn == "eager":
        assert measured > heads * s * 6


_EAGER_BACKWARD = r"""
import sys, torch
torch.set_num_threads(1)
F = torch.nn.functional
s, heads, hd = int(sys.argv[1]), int(sys.argv[2]), 16
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
q, k, v = (torch.randn(1, heads, s, hd, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
mask = torch.triu(torch.full((s, s), float("-inf"), dtype=torch.bfloat16), 1)
w = torch.matmul(q, k.transpose(2, 3)) * hd ** -0.5 + mask
out = torch.matmul(F.softmax(w, dim=-1, dtype=torch.float32).to(torch.bfloat16), v)
del w
grad = torch.ones_like(out)
before = status("VmRSS")
open("/proc/self/clear_refs", "w").write("5")  # reset the peak (VmHWM) to the current RSS
out.backward(grad)
print(status("VmHWM") - before)
"""


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/clear_refs"), reason="needs Linux /proc")
def test_eager_backward_transient_per_score(tmp_path):
    # peak process memory while eager attention runs backward, above what it held at the start of backward
    # (large allocations are mapped directly so freed memory leaves the RSS), per score: the slope between 2 and
    # 4 heads at 2,048 tokens (a fixed buffer of other work cancels)
    import os
    import subprocess
    import sys

    script = tmp_path / "eager_backward.py"
    script.write_text(_EAGER_BACKWARD)
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")

    def peak_bytes(heads):
        out = subprocess.run([sys.executable, str(script), "2048", str(heads)], capture_output=True, text=True,
                             env=env, timeout=300)
        return float(out.stdout.strip().splitlines()[-1])

    measured = (peak_bytes(4) - peak_bytes(2)) / (2 * 2048 * 2048)
    arch = Arch(name="toy", hidden=32, intermediate=64, layers=1, heads=2, kv_heads=2, vocab=100)
    from loradoctor.estimate.memory import attention_transient_bytes

    modelled = attention_transient_bytes(validate(EstimateInputs(arch=arch, seq_len=4096, attn="eager",
                                                                 targets=("q_proj",)))) / (2 * 4096 * 4096)
    assert modelled == pytest.approx(measured, rel=0.15)
