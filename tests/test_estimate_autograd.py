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
        return out + self.B(self.A(x)) * 2.0


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


def saved_bytes_per_token(targets, attn, full=False):
    layer = Layer(targets)
    for name, p in layer.named_parameters():
        is_lora = ".A." in name or ".B." in name
        p.requires_grad_(is_lora or full)
        if not is_lora:
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
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=not full):
            layer(x, cos, sin, attn)
    return (sum(seen.values()) - rope) / (B * S)


def modelled(targets, attn, full=False):
    arch = Arch(name="toy", hidden=H, intermediate=I, layers=1, heads=NH, kv_heads=KV, vocab=1000)
    inp = EstimateInputs(arch=arch, method="full" if full else "lora", targets=targets if not full else (),
                         rank=8, dropout=0.0, seq_len=S, attn=attn, precision="bf16-true" if full else "bf16")
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
