"""The memory model: a LoRA / QLoRA / full fine-tuning configuration -> peak GPU memory, one term per component.

Pure: no I/O, no torch. Every term is in bytes and says what it is. The model follows what each
framework keeps alive at the peak of a training step (the start of backward, or the optimizer step
for full fine-tuning):

* frozen base weights (bf16/fp16/fp32, LLM.int8, NF4/FP4 with their exact quantization state);
* trainable parameters (LoRA A/B from the real module shapes, modules_to_save copies), their
  gradients and optimizer states (fp32 adapters as PEFT keeps them, bf16 in pure-bf16 frameworks);
* saved activations per layer: every Linear saves its input (frozen or not), RMSNorm saves an fp32
  upcast of its input, SwiGLU saves gate/up/act, attention saves q/k/v/out (+ the s x s
  probabilities in eager mode), LoRA saves its dropout mask, the dropped-out input and the
  low-rank intermediate; with gradient checkpointing one hidden state per layer + one layer
  recomputed;
* logits and the cross-entropy peak (HF upcasts logits to fp32 -> about 12 bytes per logit);
* library workspaces; the caching allocator's reserved-over-allocated slack; the CUDA context.

Three numbers come out: peak allocated (torch.cuda.max_memory_allocated), peak reserved
(max_memory_reserved) and device memory in use (what nvidia-smi shows), plus a low/high band.
"""

from __future__ import annotations

from loradoctor.record import asdict, field, record, replace
from typing import Any, Optional

from loradoctor.errors import UserError
from loradoctor.estimate.arch import CANONICAL_MODULES, Arch, normalize_module

MIB = 1 << 20

METHODS = ("full", "lora", "qlora")
QUANTS = ("none", "8bit", "nf4", "fp4")
# sdpa: torch picks flash (half precision, sm80+, head_dim <= 256, no explicit mask), else memory-efficient
# (masks, fp32, sm50+), else math; sdpa_math forces the math backend (s x s probabilities like eager).
ATTNS = ("eager", "sdpa", "sdpa_math", "flash_attention_2", "xformers")
ATTN_ALIASES = {"flash": "flash_attention_2", "fa2": "flash_attention_2", "flash_attention_3": "flash_attention_2",
                "flash-attn": "flash_attention_2", "sdpa-math": "sdpa_math", "math": "sdpa_math",
                "sdpa_efficient": "sdpa", "sdpa_flash": "sdpa", "mem_efficient": "xformers"}
# bf16/fp16: autocast (Trainer); *-no-autocast: base in half, PEFT's fp32 adapters, no autocast (plain loops);
# *-true: everything in half (litgpt, torchtune); fp32: everything fp32.
PRECISIONS = ("bf16", "fp16", "fp32", "bf16-true", "fp16-true", "bf16-no-autocast", "fp16-no-autocast")
FRAMEWORKS = ("hf", "litgpt", "torchtune", "unsloth")
PEFT_METHODS = ("lora", "rslora", "dora", "ia3", "adalora")
# optimizer -> (bytes of state per trainable parameter given the parameter's own bytes, paged?)
OPTIMIZERS = (
    "adamw_torch", "adamw_torch_fused", "adamw_hf", "adamw_8bit", "paged_adamw_8bit", "paged_adamw_32bit",
    "adamw_bnb_32bit", "adafactor", "sgd", "lion_8bit", "paged_lion_8bit",
)
OPTIM_ALIASES = {
    "adamw": "adamw_torch", "adam": "adamw_torch", "torch.optim.adamw": "adamw_torch", "adamw_torch_4bit": "adamw_8bit",
    "adamw_bnb_8bit": "adamw_8bit", "bnb_adamw_8bit": "adamw_8bit", "adamw8bit": "adamw_8bit",
    "paged_adamw": "paged_adamw_32bit", "pagedadamw": "paged_adamw_32bit", "pagedadamw8bit": "paged_adamw_8bit",
    "paged_adamw_32": "paged_adamw_32bit", "adamw_apex_fused": "adamw_torch_fused",
}

CUDA_CONTEXT_BYTES = 500 * MIB  # driver context + kernels loaded lazily (CUDA >= 11.7); 300-800 MiB by GPU/driver
WORKSPACE_BYTES = 64 * MIB  # cuBLAS / cuBLASLt workspaces and attention scratch, held in the caching allocator
NF4_BLOCK = 64  # bitsandbytes 4-bit blocksize (absmax per 64 weights)
DQ_BLOCK = 256  # double quantization: one fp32 absmax per 256 first-level blocks


@record(frozen=True)
class EstimateInputs:
    """Everything the memory model needs. Public: the repro engineer's `measure` builds runs from it.

    precision: bf16 / fp16 = mixed precision (autocast; HF keeps LoRA params fp32, full fine-tuning keeps
    fp32 master weights); bf16-true / fp16-true = everything in half precision (litgpt bf16-true,
    torchtune); fp32 = no autocast. framework: hf (transformers + peft + Trainer), litgpt, torchtune.
    """

    arch: Arch
    method: str = "lora"
    quant: str = "none"
    double_quant: bool = False
    rank: int = 8  # PEFT LoraConfig defaults
    alpha: int = 8
    dropout: float = 0.0
    targets: tuple[str, ...] = ("q_proj", "v_proj")
    modules_to_save: tuple[str, ...] = ()
    batch: int = 1
    seq_len: int = 2048
    grad_accum: int = 1
    gradient_checkpointing: bool = False
    attn: str = "sdpa"
    optim: str = "adamw_torch"
    precision: str = "bf16"
    framework: str = "hf"
    torch_compile: bool = False
    chunked_ce: Optional[bool] = None  # None: the framework's default (litgpt chunks, hf/torchtune do not)
    activation_offloading: bool = False
    optimizer_in_backward: bool = False
    upcast_non_quantized: Optional[bool] = None  # None: hf k-bit training upcasts non-quantized params to fp32
    loss: Optional[str] = None  # None: the framework's own (see losses.py): standard|cce|liger-flce|chunked[:N]|unsloth
    liger_kernels: bool = False  # Liger's RMSNorm / SwiGLU / RoPE patched into an HF model
    offload_checkpoints: Optional[bool] = None  # None: Unsloth's checkpointing keeps checkpoints in host memory
    peft: str = "lora"  # lora | rslora | dora | ia3 | adalora
    gpus: int = 1
    strategy: str = "none"  # none | ddp | fsdp | fsdp-hybrid | zero2 | zero3 (see parallel.py)
    offload: str = "none"  # none | optimizer | params (ZeRO / FSDP CPU offload)
    compute_dtype: Optional[str] = None  # bitsandbytes' bnb_4bit_compute_dtype: None = the half precision in use; fp32
    vocab: Optional[int] = None  # the vocabulary after resize_token_embeddings (added tokens), else config.json's
    # DeepSpeed ZeRO-2's gradient bucket: reduce_bucket_size elements (None: Hugging Face's 'auto' = hidden^2),
    # allocated twice with overlap_comm (None: DeepSpeed's default, which is off below ZeRO-3)
    reduce_bucket_size: Optional[int] = None
    overlap_comm: Optional[bool] = None
    # IA3's feed-forward modules (IA3Config.feedforward_modules): their vector scales the input (in-wide), the others'
    # scales the output. None: PEFT's default for Llama-family models, down_proj
    ia3_feedforward: Optional[tuple[str, ...]] = None
    # the training loop holds the model's output through backward (`outputs = model(**batch)`;
    # `outputs.loss.backward()`, as PEFT's method-comparison harness does), so its half-precision logits stay
    # alive; the HF Trainer's compute_loss returns only the loss and they are freed before backward
    keep_logits: bool = False

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["arch"] = self.arch.to_dict()
        data["targets"] = list(self.targets)
        data["modules_to_save"] = list(self.modules_to_save)
        return data


@record
class Estimate:
    """The breakdown (component -> bytes, ordered) and the three predicted numbers with a band."""

    inputs: EstimateInputs
    components: dict[str, int]
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    device_used_bytes: int
    band: tuple[int, int]  # low/high of device_used_bytes
    trainable_params: int
    total_params: int
    notes: list[str] = field(default_factory=list)

    def metric(self, name: str) -> int:
        """'allocated' | 'reserved' | 'device' -> bytes."""
        return {"allocated": self.peak_allocated_bytes, "reserved": self.peak_reserved_bytes,
                "device": self.device_used_bytes}[name]


# --- validation ----------------------------------------------------------------------------------

def normalize_optim(name: str) -> str:
    key = name.strip().lower().replace("-", "_")
    key = OPTIM_ALIASES.get(key, key)
    if key not in OPTIMIZERS:
        raise UserError(f"unknown optimizer {name!r}; use one of {', '.join(OPTIMIZERS)}")
    return key


def resolve_targets(arch: Arch, targets: tuple[str, ...]) -> tuple[str, ...]:
    """Canonical target names for this architecture; 'all-linear' = every linear in the layers (not lm_head)."""
    known = set(arch.linear_modules()) - {"router"}
    out: list[str] = []
    for t in targets:
        if t in ("all-linear", "all_linear", "all"):
            names: tuple[str, ...] = tuple(m for m in CANONICAL_MODULES if m in known)
        else:
            names = normalize_module(t)
        for n in names:
            if n == "lm_head" or n in known:
                if n not in out:
                    out.append(n)
            else:
                raise UserError(
                    f"target module {t!r} not found in {arch.name} (PEFT would raise 'Target modules ... not found'); "
                    f"linear modules here: {', '.join(sorted(known))}, lm_head, or all-linear"
                )
    if arch.fused:
        for group in (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj")):
            present = [g for g in group if g in out]
            if present and len(present) != len(group):
                raise UserError(
                    f"target module {present[0]!r} not found in {arch.name}: it fuses q/k/v into qkv_proj and gate/up "
                    f"into gate_up_proj (PEFT would raise 'Target modules ... not found'); target qkv_proj, "
                    f"gate_up_proj, o_proj, down_proj or all-linear"
                )
    return tuple(out)


def validate(inp: EstimateInputs) -> EstimateInputs:
    """Check choices and fill derived defaults (qlora -> nf4, canonical target names). UserError on bad input."""
    if inp.method not in METHODS:
        raise UserError(f"--method must be one of {', '.join(METHODS)}, not {inp.method!r}")
    if inp.quant not in QUANTS:
        raise UserError(f"--quant must be one of {', '.join(QUANTS)}, not {inp.quant!r}")
    inp = replace(inp, attn=ATTN_ALIASES.get(inp.attn, inp.attn), peft=str(inp.peft).lower(),
                  strategy=_strategy(inp.strategy), offload=str(inp.offload or "none").lower())
    if inp.attn not in ATTNS:
        raise UserError(f"--attn must be one of {', '.join(ATTNS)}, not {inp.attn!r}")
    if inp.precision not in PRECISIONS:
        raise UserError(f"--precision must be one of {', '.join(PRECISIONS)}, not {inp.precision!r}")
    if inp.framework not in FRAMEWORKS:
        raise UserError(f"--framework must be one of {', '.join(FRAMEWORKS)}, not {inp.framework!r}")
    if inp.peft not in PEFT_METHODS:
        raise UserError(f"--peft must be one of {', '.join(PEFT_METHODS)}, not {inp.peft!r}")
    from loradoctor.estimate.losses import parse_loss
    from loradoctor.estimate.parallel import validate_parallel

    parse_loss(inp.loss)
    validate_parallel(inp.gpus, inp.strategy, inp.offload)
    if inp.compute_dtype is not None:
        cdt = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32"}.get(
            str(inp.compute_dtype).lower(), str(inp.compute_dtype).lower())
        if cdt not in ("bf16", "fp16", "fp32"):
            raise UserError(f"--compute-dtype must be bf16, fp16 or fp32, not {inp.compute_dtype!r}")
        inp = replace(inp, compute_dtype=cdt)
    if inp.vocab is not None:
        if inp.vocab < 1:
            raise UserError("--vocab must be at least 1")
        inp = replace(inp, arch=replace(inp.arch, vocab=int(inp.vocab)))
    if inp.gpus > 1 and inp.strategy == "none":
        inp = replace(inp, strategy="ddp")  # several processes without sharding: DDP replicas
    for name in ("batch", "seq_len", "grad_accum"):
        if getattr(inp, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} must be at least 1")
    if inp.method != "full" and inp.rank < 1:
        raise UserError("--rank must be at least 1")
    if not 0 <= inp.dropout < 1:
        raise UserError("lora dropout must be in [0, 1)")
    quant = inp.quant
    if inp.method == "qlora" and quant == "none":
        quant = "nf4"
    if inp.method == "full" and quant != "none":
        raise UserError("full fine-tuning of a quantized model is not possible; use --method qlora or --quant none")
    if inp.method == "lora" and quant in ("nf4", "fp4"):
        inp = replace(inp, method="qlora")
    if inp.framework == "unsloth" and quant in ("nf4", "fp4") and not inp.double_quant:
        # Unsloth's loader and its pre-quantized uploads set bnb_4bit_use_double_quant=True
        inp = replace(inp, double_quant=True)
    if inp.framework == "litgpt" and inp.arch.tied:
        # litgpt (2023-2024) converts tied checkpoints into a separate lm_head copy
        inp = replace(inp, arch=replace(inp.arch, tied=False))
    targets = resolve_targets(inp.arch, inp.targets) if inp.method != "full" else tuple(inp.targets)
    if inp.ia3_feedforward is not None:
        ff = tuple(dict.fromkeys(leaf for m in inp.ia3_feedforward for leaf in normalize_module(m)))
        if inp.peft == "ia3" and inp.method != "full" and not set(ff) <= set(targets):
            # PEFT's IA3Config: "feedforward_modules should be a subset of target_modules"
            raise UserError(f"--ia3-feedforward {','.join(ff)} must be among the targets ({','.join(targets)})")
        inp = replace(inp, ia3_feedforward=ff)
    return replace(inp, quant=quant, targets=targets, optim=normalize_optim(inp.optim))


# --- dtypes --------------------------------------------------------------------------------------

def _act_bytes(inp: EstimateInputs) -> int:
    return 4 if inp.precision == "fp32" else 2


def _pure_half(inp: EstimateInputs) -> bool:
    return inp.precision in ("bf16-true", "fp16-true")


def _no_autocast(inp: EstimateInputs) -> bool:
    """A base loaded in half precision, PEFT's fp32 adapters, no autocast (the plain-loop default of PEFT)."""
    return inp.precision.endswith("-no-autocast")


def _strategy(text: str) -> str:
    from loradoctor.estimate.parallel import normalize_strategy

    return normalize_strategy(text)


def base_weight_bytes(inp: EstimateInputs) -> float:
    """Bytes per unquantized base weight. HF LoRA loads the base in half precision (torch_dtype) even under
    mixed precision; full fine-tuning under autocast keeps fp32 master weights; litgpt's bf16-mixed
    keeps every weight in fp32; torchtune is pure bf16."""
    if inp.precision == "fp32":
        return 4
    if _pure_half(inp) or _no_autocast(inp) or inp.framework == "torchtune":
        return 2
    if inp.framework == "litgpt":
        return 4
    return 4 if inp.method == "full" else 2


def trainable_bytes(inp: EstimateInputs) -> float:
    """Bytes per trainable parameter: PEFT upcasts adapters to fp32 (autocast_adapter_dtype); pure-bf16
    frameworks keep them in bf16."""
    if inp.method == "full":
        return base_weight_bytes(inp)
    if inp.precision == "fp32" or _no_autocast(inp):
        return 4
    if _pure_half(inp) or inp.framework == "torchtune":
        return 2
    return 4


# --- parameters ----------------------------------------------------------------------------------

def lora_modules(arch: Arch, targets: tuple[str, ...]) -> list[tuple[str, int, int, int]]:
    """The LoRA-wrapped Linear layers: (name, in_features, out_features, copies in the model). On fused
    architectures (Phi-3) q/k/v are one qkv_proj and gate/up one gate_up_proj: one A matrix for the group."""
    mods = arch.linear_modules()
    out: list[tuple[str, int, int, int]] = []
    groups = (("qkv_proj", ("q_proj", "k_proj", "v_proj")), ("gate_up_proj", ("gate_proj", "up_proj"))) if arch.fused else ()
    grouped: set[str] = set()
    for name, members in groups:
        if all(m in targets for m in members):
            fin = mods[members[0]][0]
            out.append((name, fin, sum(mods[m][1] for m in members), arch.layers * mods[members[0]][2]))
            grouped.update(members)
    for t in targets:
        if t in grouped:
            continue
        if t == "lm_head":
            out.append(("lm_head", arch.hidden, arch.vocab, 1))
        else:
            fin, fout, copies = mods[t]
            out.append((t, fin, fout, arch.layers * copies))
    return out


def lora_params(arch: Arch, targets: tuple[str, ...], rank: int) -> int:
    """r * (in + out) for every LoRA-wrapped linear (experts included), over all layers, plus lm_head if targeted."""
    return sum(copies * rank * (fin + fout) for _, fin, fout, copies in lora_modules(arch, targets))


def ia3_is_feedforward(inp: EstimateInputs, name: str) -> bool:
    """Whether IA3 treats this target as a feed-forward module (PEFT: its vector multiplies the module's input, cast
    to the vector's dtype, before the base layer; otherwise it multiplies the base layer's output)."""
    ff = inp.ia3_feedforward if inp.ia3_feedforward is not None else ("down_proj",)
    return name in {leaf for m in ff for leaf in normalize_module(m)}


def peft_params(inp: EstimateInputs) -> tuple[int, list[tuple[int, int]]]:
    """(trainable parameters, their matrices for factored optimizers) of the PEFT method. LoRA / rsLoRA (same
    shapes; rsLoRA changes the scaling only): r x (in + out) per target. DoRA: + a magnitude vector (out) per
    target. AdaLoRA: A, B and the singular values E (r) per target, at its initial rank. IA3: one vector per
    target, out-wide (in-wide on feed-forward modules: ia3_feedforward, by default down_proj)."""
    arch = inp.arch
    mods = lora_modules(arch, inp.targets)
    matrices: list[tuple[int, int]] = []
    if inp.peft == "ia3":
        n = sum(copies * (fin if ia3_is_feedforward(inp, name) else fout) for name, fin, fout, copies in mods)
        return n, [(1, n)]
    n = lora_params(arch, inp.targets, inp.rank)
    for _, fin, fout, copies in mods:
        matrices += [(inp.rank, fin), (fout, inp.rank)] * copies
    if inp.peft == "dora":
        n += sum(copies * fout for _, _, fout, copies in mods)
    if inp.peft == "adalora":
        n += sum(copies * inp.rank for _, _, _, copies in mods)
    return n, matrices


def modules_to_save_params(arch: Arch, names: tuple[str, ...]) -> int:
    n = 0
    for name in names:
        leaf = normalize_module(name)[0]
        if leaf in ("embed_tokens", "wte", "tok_embeddings", "embeddings"):
            n += arch.embedding_params()
        elif leaf == "lm_head":
            n += arch.vocab * arch.hidden
        elif leaf in ("score", "classifier"):
            n += arch.hidden * 2
        else:
            raise UserError(f"modules_to_save {name!r}: only embed_tokens and lm_head are modelled")
    return n


def quantized_linear_bytes(n_params: int, out_rows: int, quant: str, double_quant: bool) -> int:
    """Bytes of one quantized weight group: NF4/FP4 = 4 bits + absmax per 64 (fp32, or 8-bit + an fp32 per
    256 blocks with double quant); LLM.int8 = 1 byte + an fp32 scale per output row."""
    if quant in ("nf4", "fp4"):
        blocks = -(-n_params // NF4_BLOCK)
        if double_quant:
            state = blocks * 1 + (-(-blocks // DQ_BLOCK)) * 4 + 256 * 4  # int8 absmax + fp32 absmax2 + code
        else:
            state = blocks * 4
        return n_params // 2 + state
    if quant == "8bit":
        return n_params + out_rows * 4
    raise ValueError(quant)


def weight_components(inp: EstimateInputs) -> dict[str, int]:
    """Frozen/base weights: layer linears (quantized or not) and the unquantized rest (embeddings,
    lm_head, norms, biases), the rest upcast to fp32 by prepare_model_for_kbit_training on HF."""
    arch = inp.arch
    wb = base_weight_bytes(inp)
    mods = arch.linear_modules()
    linear_params = arch.layers * sum(i * o * c for i, o, c in mods.values())
    other_layer = arch.layers * arch.layer_params() - linear_params
    embed = arch.embedding_params()
    head = arch.lm_head_params()
    final_norm = arch.total_params() - arch.layers * arch.layer_params() - embed - head
    comps: dict[str, int] = {}
    if arch.vision_params:
        # a multimodal checkpoint's vision tower and projector: resident, not trained (bitsandbytes quantizes its
        # linears on HF k-bit loads; Unsloth keeps vision layers 16-bit)
        if inp.quant != "none" and inp.framework == "hf":
            comps["vision tower (frozen)"] = quantized_linear_bytes(arch.vision_params, arch.vision_params // 1024 or 1,
                                                                    inp.quant, inp.double_quant)
        else:
            comps["vision tower (frozen)"] = int(arch.vision_params * (4 if inp.precision == "fp32" else 2))
    if inp.quant == "none":
        comps["base weights"] = int((linear_params + other_layer + final_norm + embed + head) * wb)
        return comps
    qbytes = 0
    for fin, fout, copies in mods.values():
        qbytes += arch.layers * copies * quantized_linear_bytes(fin * fout, fout, inp.quant, inp.double_quant)
    rest = other_layer + final_norm + embed
    quant_head = inp.framework == "litgpt" and head > 0  # Fabric's bnb plugin converts every nn.Linear
    if quant_head:
        qbytes += quantized_linear_bytes(head, arch.vocab, inp.quant, inp.double_quant)
    else:
        rest += head
    upcast = inp.upcast_non_quantized if inp.upcast_non_quantized is not None else inp.framework == "hf"
    rest_bytes = 4 if upcast else wb
    comps[f"base weights ({inp.quant}{' + double quant' if inp.double_quant and inp.quant != '8bit' else ''})"] = qbytes
    label = "embeddings, lm_head, norms (fp32 upcast)" if upcast else "embeddings, lm_head, norms"
    comps[label] = int(rest * rest_bytes)
    return comps


def optimizer_state_bytes(optim: str, n_params: int, param_bytes: float, matrices: list[tuple[int, int]]) -> tuple[int, bool]:
    """(bytes, paged). AdamW keeps 2 states like the parameter; bitsandbytes 8-bit keeps 2 x 1 byte + an fp32
    absmax per 2048-block; bnb 32-bit keeps fp32; Adafactor factors the second moment (rows + cols);
    SGD without momentum keeps nothing."""
    paged = optim.startswith("paged_")
    if optim in ("adamw_torch", "adamw_torch_fused", "adamw_hf"):
        return int(2 * n_params * param_bytes), False
    if optim in ("adamw_8bit", "paged_adamw_8bit"):
        return int(2 * n_params + 2 * 4 * (n_params // 2048 + 1)), paged
    if optim in ("lion_8bit", "paged_lion_8bit"):
        return int(n_params + 4 * (n_params // 2048 + 1)), paged
    if optim in ("paged_adamw_32bit", "adamw_bnb_32bit"):
        return 8 * n_params, paged
    if optim == "adafactor":
        return sum(4 * (r + c) for r, c in matrices), False
    if optim == "sgd":
        return 0, False
    raise ValueError(optim)


# --- activations ---------------------------------------------------------------------------------

def _lora_saved_per_input(inp: EstimateInputs, in_features: int) -> float:
    """Bytes per token a LoRA module saves for its input path: the dropout mask (1 byte) and the dropped-out
    input that lora_A saves; PEFT casts x to the fp32 adapter dtype, so under autocast lora_A saves a new
    half-precision copy even without dropout. Pure-bf16 frameworks without dropout share the layer input."""
    a = _act_bytes(inp)
    mask = in_features if inp.dropout > 0 else 0
    if _no_autocast(inp):
        # no autocast: x.to(fp32) is a new fp32 tensor per module, and lora_A keeps it (or its dropout)
        return mask + trainable_bytes(inp) * in_features
    copy_needed = inp.dropout > 0 or (_mixed(inp) and (trainable_bytes(inp) != a or stream_bytes(inp)[0] != a))
    return mask + (a * in_features if copy_needed else 0)


def _bnb_compute_bytes(inp: EstimateInputs) -> int:
    """bytes of bitsandbytes' compute dtype (bnb_4bit_compute_dtype; the precision's half type unless set)."""
    if inp.compute_dtype == "fp32":
        return 4
    return _act_bytes(inp) if inp.compute_dtype is None else 2


def _lora_compute_bytes(inp: EstimateInputs) -> int:
    """Bytes of the adapter's own activations (the rank-r intermediate, DoRA's lora result): the adapter dtype
    without autocast, the half-precision compute dtype under it."""
    return trainable_bytes(inp) if _no_autocast(inp) else _act_bytes(inp)


def _mixed(inp: EstimateInputs) -> bool:
    return inp.precision in ("bf16", "fp16")


def _upcast(inp: EstimateInputs) -> bool:
    """prepare_model_for_kbit_training upcasts embeddings, norms and lm_head to fp32 (HF); Unsloth's 4-bit
    checkpoints keep them 16-bit."""
    return inp.upcast_non_quantized if inp.upcast_non_quantized is not None else inp.framework == "hf"


def stream_bytes(inp: EstimateInputs) -> tuple[int, int]:
    """(hidden-state bytes, linear-output bytes). HF k-bit training upcasts embeddings and norms to fp32 and
    bitsandbytes returns its output in the input's dtype, so the whole residual stream and the MLP run in
    fp32; fp32 master weights (full fine-tuning, litgpt bf16-mixed) make an fp32 stream whose linears
    still compute in half precision under autocast."""
    a = _act_bytes(inp)
    if inp.quant != "none" and inp.framework == "hf" and _upcast(inp) and (_mixed(inp) or _no_autocast(inp)):
        return 4, 4
    if not _mixed(inp):
        return a, a
    if base_weight_bytes(inp) == 4:
        return 4, a
    return a, a


def _peft_module_saved(inp: EstimateInputs, name: str, fin: int, fout: int) -> float:
    """Bytes per token one adapted linear keeps for its adapter (PEFT). LoRA/rsLoRA/AdaLoRA: the (dropped-out,
    dtype-cast) input lora_A multiplies and the rank-r intermediate lora_B multiplies. DoRA adds the base
    output and the lora result that the magnitude scaling multiplies (out-wide). IA3 scales the output (k/v:
    the output cast to the fp32 vector's dtype is kept) or, on feed-forward modules (ia3_feedforward, by default
    down_proj), the input cast to the vector's dtype."""
    c = _lora_compute_bytes(inp)
    if inp.peft == "ia3":
        t = trainable_bytes(inp)
        return t * (fin if ia3_is_feedforward(inp, name) else fout)
    saved = _lora_saved_per_input(inp, fin) + c * inp.rank
    if inp.peft == "dora":
        saved += (_act_bytes(inp) + c) * fout
    return saved


def _unsloth_layer_parts(inp: EstimateInputs) -> dict[str, float]:
    """Unsloth's patched decoder layer: fast RMSNorm keeps its half-precision input (+ an fp32 rstd per row),
    RoPE runs in place, attention (flash-attn / xformers / sdpa) keeps q, k, v, out and the log-sum-exp
    with k/v at their own size, and its LoRA autograd functions (LoRA_QKV, LoRA_W, LoRA_MLP) keep the input X
    once per group (q/k/v share it, gate/up share it), o_proj's input, and SwiGLU's gate and up (the
    down_proj input is recomputed from them in backward); the rank-r intermediates are recomputed."""
    arch = inp.arch
    a = _act_bytes(inp)
    h, qd, kvd = arch.hidden, arch.q_dim, arch.kv_dim
    k_active = arch.experts_per_token if arch.experts else 1
    width = arch.expert_width * k_active
    parts: dict[str, float] = {
        "norms": arch.norms_per_layer * (a * h + 4),
        "linear inputs": a * (2 * h + qd),
        "attention": a * (qd + 2 * kvd + qd) + 4 * arch.heads,
        "mlp": 2 * a * width if arch.mlp == "gated" else a * width,
        "lora": 0.0,
    }
    if inp.dropout > 0:  # Unsloth's fast path needs dropout 0; otherwise PEFT's module runs: mask + dropped copy
        layer_mods = lora_modules(arch, tuple(t for t in inp.targets if t != "lm_head"))
        parts["lora"] = sum((copies // arch.layers) * (1 + a) * fin for _, fin, _, copies in layer_mods)
    return parts


def layer_activation_parts(inp: EstimateInputs) -> dict[str, float]:
    """Bytes per token that one decoder layer keeps for backward, by part (checked against torch autograd's
    saved tensors on an HF-style Llama layer with PEFT LoRA: see docs/estimate.md)."""
    if inp.framework == "unsloth":
        return _unsloth_layer_parts(inp)
    arch = inp.arch
    a = _act_bytes(inp)
    stream, lin_out = stream_bytes(inp)
    h, qd, kvd = arch.hidden, arch.q_dim, arch.kv_dim
    k_active = arch.experts_per_token if arch.experts else 1
    width = arch.expert_width * k_active
    s = inp.seq_len
    parts: dict[str, float] = {}
    # RMSNorm upcasts to fp32 and keeps that copy (a fused/compiled norm, Liger's included, keeps its input
    # and an fp32 rstd per row); LayerNorm keeps its input (in fp32 under autocast). A trainable norm weight
    # also keeps the normalized input.
    if arch.norm == "rms":
        if inp.liger_kernels:
            per_norm = stream * h + 4
        else:
            per_norm = stream * h if inp.torch_compile else 4 * h
    else:
        per_norm = 4 * h if _mixed(inp) and inp.framework == "hf" else stream * h
    if inp.method == "full":
        per_norm += stream * h
    parts["norms"] = arch.norms_per_layer * per_norm
    # Inputs of the layer's linears. A matmul keeps its input only to compute the weight's gradient, so a
    # frozen nn.Linear keeps nothing (PyTorch guards the save); trainable weights (full fine-tuning) keep
    # it, and bitsandbytes' 4-/8-bit matmul functions keep it regardless. When the stream is fp32 and the
    # matmul runs in half precision, each linear gets (and keeps) its own cast copy.
    # bitsandbytes casts its input to bnb_4bit_compute_dtype and keeps that: fp32 compute keeps fp32 inputs
    lin_a = _bnb_compute_bytes(inp) if (inp.quant != "none" and inp.framework == "hf") else a
    per_module_copies = stream != lin_a
    if per_module_copies:
        n_in = 3 + (2 if arch.mlp == "gated" else 1) * k_active
        attn_mlp_inputs = lin_a * h * n_in
    else:
        attn_mlp_inputs = lin_a * h * (1 if arch.parallel_residual else 2) + (lin_a * h * k_active if arch.experts else 0)
    flash_like = inp.attn in ("flash_attention_2", "xformers")
    # flash-attn, xformers and sdpa's flash / efficient kernels write their output in (batch, seq, heads, dim)
    # order: the reshape feeding o_proj is a view of the output attention saved (checked for sdpa on CPU)
    o_shared = flash_like or inp.attn == "sdpa"
    # (a half-precision attention output that o_proj must cast, e.g. to an fp32 compute dtype, is a new copy)
    o_input = 0 if (o_shared and lin_a == a) else lin_a * qd
    linear_inputs = attn_mlp_inputs + o_input + lin_a * width
    keepers = 0
    if inp.method == "full":
        keepers += 1
    if inp.quant != "none":
        keepers += 1
    if inp.framework == "litgpt" and inp.method != "full":
        # litgpt's published tables (torch 2.1-2.4) show about this much more per layer than the saved
        # tensors above account for, LoRA or not: modelled as retained linear inputs.
        keepers += 1
    parts["linear inputs"] = keepers * linear_inputs
    # attention: q, k, v after RoPE, output and logsumexp in the compute dtype. Eager attention expands k/v to
    # all heads (repeat_kv) and keeps the fp32 softmax and its half copy (s x s per head); sdpa's math backend
    # keeps the half-precision probabilities. sdpa (flash / efficient backends): litgpt and torchtune expand
    # k/v; transformers (>= 4.48 on torch >= 2.5) passes enable_gqa when there is no padding mask, so
    # unpadded batches keep k/v at their own size (padded batches repeat them: a few % more).
    eager = inp.attn == "eager" or (arch.attn_softcap > 0 and inp.framework == "litgpt")
    math = inp.attn == "sdpa_math"
    repeat_kv = eager or math or (inp.attn == "sdpa" and inp.framework != "hf")
    kv_saved = qd if repeat_kv else kvd
    if eager:
        capped = a if arch.attn_softcap > 0 else 0  # the tanh soft-cap output
        parts["attention"] = a * (2 * qd + kv_saved) + arch.heads * s * (4 + a + capped)
    elif math:
        parts["attention"] = a * (2 * qd + kv_saved) + arch.heads * s * a
    else:
        parts["attention"] = a * (qd + 2 * kv_saved + qd) + 4 * arch.heads
    # MLP: SwiGLU keeps gate, up and act(gate) (a fused one, Liger's or compiled, only gate and up); GELU its input
    if arch.mlp == "gated":
        parts["mlp"] = (2 if (inp.torch_compile or inp.liger_kernels) else 3) * lin_out * width
    else:
        parts["mlp"] = lin_out * width
    lora = 0.0
    if inp.method != "full":
        mods = arch.linear_modules()
        layer_targets = [t for t in inp.targets if t != "lm_head"]
        if inp.framework == "litgpt":
            # litgpt: one LoRA on the fused qkv (one dropout), one per other linear
            groups = {("qkv" if t in ("q_proj", "k_proj", "v_proj") else t) for t in layer_targets}
            for g in groups:
                fin = h if g == "qkv" else mods[g][0]
                lora += _lora_saved_per_input(inp, fin)
            lora += sum(a * inp.rank for _ in layer_targets)
        else:
            for name, fin, fout, _ in lora_modules(arch, tuple(layer_targets)):
                mult = k_active if (arch.experts and name in ("gate_proj", "up_proj", "down_proj")) else 1
                lora += mult * _peft_module_saved(inp, name, fin, fout)
            if inp.peft != "ia3" and _lora_saved_per_input(inp, 1) == 0 and not keepers:
                # no cast and no dropout: lora_A keeps the module's own input, one storage per input shared by
                # the targets reading it (q/k/v, gate/up); under flash attention o_proj's input is the saved output
                shared = {"qkv_proj": "attn", "q_proj": "attn", "k_proj": "attn", "v_proj": "attn",
                          "gate_up_proj": "mlp", "gate_proj": "mlp", "up_proj": "mlp", "o_proj": "o", "down_proj": "down"}
                groups = {shared.get(t, t) for t in layer_targets}
                widths = {"attn": h, "mlp": h * k_active, "o": 0 if o_shared else qd, "down": width}
                lora += sum(a * widths.get(g, h) for g in groups)
    parts["lora"] = lora
    return parts


def attention_transient_bytes(inp: EstimateInputs) -> int:
    """What an attention implementation adds while one layer runs backward, beyond what it saved: eager's
    s x s terms (the gradient of the half probabilities and its fp32 upcast exist together: 4 + a bytes per
    score; measured on the CPU: 6.6 for a = 2) and the math backend's (3 a, not measured); flash / efficient /
    xformers backends work in tiles (none)."""
    if inp.framework == "unsloth":
        return 0
    a = _act_bytes(inp)
    scores = inp.batch * inp.arch.heads * inp.seq_len * inp.seq_len
    eager = inp.attn == "eager" or (inp.arch.attn_softcap > 0 and inp.framework == "litgpt")
    if eager:
        return (4 + a) * scores
    if inp.attn == "sdpa_math":
        return 3 * a * scores
    return 0


def attention_mask_bytes(inp: EstimateInputs) -> int:
    """transformers builds one 4-D causal mask (batch x 1 x s x s, in the compute dtype) for eager attention and
    sdpa's math backend; it lives for the whole step and every layer reads it."""
    if inp.framework != "hf" or inp.attn not in ("eager", "sdpa_math"):
        return 0
    return _act_bytes(inp) * inp.batch * inp.seq_len * inp.seq_len


def loss_kind(inp: EstimateInputs) -> tuple[str, int]:
    """(kind, chunks): --loss, else the framework's own (Unsloth's fused loss, litgpt's chunked loss, torchtune's
    chunked loss where the recipe sets it, transformers' standard upcast)."""
    from loradoctor.estimate.losses import DEFAULT_CHUNKS, parse_loss

    kind, chunks = parse_loss(inp.loss)
    if kind is not None:
        return kind, chunks
    if inp.framework == "unsloth":
        return "unsloth", 0
    chunked = inp.chunked_ce if inp.chunked_ce is not None else inp.framework == "litgpt"
    return ("chunked", DEFAULT_CHUNKS) if chunked else ("standard", 0)


def offloads_checkpoints(inp: EstimateInputs) -> bool:
    """Checkpointed hidden states kept in host memory: torchtune's activation offloading, Unsloth's
    use_gradient_checkpointing='unsloth' (its default), or --offload-checkpoints."""
    if not inp.gradient_checkpointing:
        return False
    if inp.offload_checkpoints is not None:
        return inp.offload_checkpoints
    return inp.activation_offloading or inp.framework == "unsloth"


def activation_components(inp: EstimateInputs) -> tuple[dict[str, int], dict[str, int]]:
    """(saved activations, transient peak terms) in bytes for the whole step."""
    from loradoctor.estimate.losses import loss_peak_bytes

    arch = inp.arch
    a = _act_bytes(inp)
    tokens = inp.batch * inp.seq_len
    per_layer = sum(layer_activation_parts(inp).values())
    saved: dict[str, int] = {}
    transient: dict[str, int] = {}
    if inp.gradient_checkpointing:
        offloaded = offloads_checkpoints(inp)
        # on the GPU: the layer being recomputed and the next one coming back from the host
        kept_layers = min(arch.layers, 2) if offloaded else arch.layers
        label = "checkpointed hidden states" + (" (rest offloaded to host)" if offloaded else "")
        # each layer's input, in the residual stream's dtype (fp32 in HF k-bit training)
        saved[label] = int(kept_layers * stream_bytes(inp)[0] * arch.hidden * tokens)
    else:
        saved[f"activations ({arch.layers} layers)"] = int(arch.layers * per_layer * tokens)
    mask = attention_mask_bytes(inp)
    if mask:
        saved["4-D attention mask"] = mask
    # final norm (fp32 copy; a fused norm keeps its input); the lm_head keeps its input only when it trains,
    # is quantized (bitsandbytes), or under litgpt's retention (see layer_activation_parts); LoRA on lm_head
    fused_norm = inp.framework == "unsloth" or inp.liger_kernels
    lm_extra = (stream_bytes(inp)[0] + 0.0) * arch.hidden if fused_norm else 4 * arch.hidden
    lm_head_quantized = inp.quant != "none" and inp.framework == "litgpt" and not arch.tied
    keeps = (inp.method == "full") + lm_head_quantized + (inp.framework == "litgpt" and inp.method != "full")
    lm_extra += keeps * a * arch.hidden
    if "lm_head" in inp.targets and inp.method != "full":
        lm_extra += _lora_saved_per_input(inp, arch.hidden) + a * inp.rank
    saved["final norm, lm_head input"] = int(lm_extra * tokens)
    # the loss kernel at its peak (losses.py): HF's fp32 upcast ~12 bytes per logit; chunked, fused (Liger,
    # Unsloth) and cut (CCE) losses far less
    kind, chunks = loss_kind(inp)
    ce = loss_peak_bytes(kind, chunks, tokens, arch.hidden, arch.vocab, a, stream_bytes(inp)[0],
                         softcap=arch.final_softcap > 0, compiled=inp.torch_compile,
                         half_log_softmax=inp.framework == "litgpt")
    if inp.keep_logits and kind == "standard":
        # the returned logits (the lm_head's output, in the activations' dtype) outlive the loss: through the loss
        # backward (12 bytes per logit above them) and every layer's backward. The other kernels return no logits
        # in training (CCE, Liger FLCE, Unsloth), or already count them as kept (chunked; fused-ce writes its
        # gradient into them)
        saved["logits kept by the training loop"] = int(a * tokens * arch.vocab)
    dq = dequant_buffer_bytes(inp)
    if lm_head_quantized:
        ce += dq  # the lm_head is dequantized again for its backward while the logit gradients are alive
    # backward of one layer: its recomputed activations (checkpointing), gradients of the MLP intermediate
    # and the hidden state, attention's s x s gradients (eager / math), a dequantized weight for 4-bit
    # layers, DoRA's weight-norm temporaries (W + BA in fp32 and BA, for the widest target)
    width = arch.expert_width * (arch.experts_per_token if arch.experts else 1)
    # Unsloth's SwiGLU backward writes its results into the saved gate / up buffers and the incoming gradient
    # (in place): one intermediate-wide gradient instead of three
    mlp_grads = 1 if inp.framework == "unsloth" else 3
    layer = int(tokens * (mlp_grads * a * width + 4 * a * arch.hidden)) + attention_transient_bytes(inp)
    if inp.gradient_checkpointing:
        layer += int(per_layer * tokens)
    if inp.quant != "none" and not lm_head_quantized:
        layer += dq
    if inp.peft == "dora" and inp.method != "full":
        # PEFT's DoRA rebuilds B A through lora_B(lora_A(eye(in))) each forward: the identity (in x in, in the
        # adapter's input dtype), B A (in x out, fp32) and W + s B A (fp32) for the weight norm, widest target
        mods = lora_modules(arch, tuple(t for t in inp.targets if t != "lm_head"))
        if mods:
            eye = trainable_bytes(inp) if (_mixed(inp) or _no_autocast(inp)) else a
            layer += max(eye * fin * fin + 8 * fin * fout for _, fin, fout, _ in mods)
    # the loss is freed before the layers run backward: the peak is the larger of the two moments
    if ce >= layer:
        transient[f"logits + cross-entropy ({kind}{':' + str(chunks) if kind == 'chunked' else ''})"
                  if kind != "standard" else "logits + cross-entropy"] = ce
    else:
        transient["one layer's backward" + (" (recomputed)" if inp.gradient_checkpointing else "")] = layer
    return saved, transient


def dequant_buffer_bytes(inp: EstimateInputs) -> int:
    """bitsandbytes dequantizes a 4-bit/8-bit weight to a full matrix for every matmul (forward and backward).
    In the weight's original dtype (fp32 for litgpt checkpoints loaded under Fabric's plugin) plus the cast
    to the compute dtype; HF loads in half precision so there is one half-precision copy."""
    if inp.quant == "none":
        return 0
    arch = inp.arch
    largest = max(i * o for i, o, _ in arch.linear_modules().values())
    if inp.framework == "litgpt" and not arch.tied:
        largest = max(largest, arch.vocab * arch.hidden)
    # an fp32 compute dtype dequantizes to fp32 and autocast casts that copy to half for the matmul
    per_param = 6 if inp.framework == "litgpt" or (inp.compute_dtype == "fp32" and _mixed(inp)) else _bnb_compute_bytes(inp)
    return per_param * largest


# --- more than one GPU ---------------------------------------------------------------------------

def zero2_bucket_bytes(inp: EstimateInputs, half: int) -> int:
    """DeepSpeed ZeRO-1/2 (stage_1_and_2.py, ``backward``): with contiguous_gradients (its default) every backward
    starts by allocating ``torch.empty(reduce_bucket_size)`` in the half dtype of the model, and a second one when
    overlap_comm is on (double buffering), whatever the number of trainable parameters. reduce_bucket_size:
    the config's number, or Hugging Face's ``auto`` = hidden x hidden."""
    elements = inp.reduce_bucket_size if inp.reduce_bucket_size else inp.arch.hidden * inp.arch.hidden
    return int(elements) * half * (2 if inp.overlap_comm else 1)


def _apply_parallel(inp: EstimateInputs, comps: dict[str, int], trainable: int, tb: float, grads: int,
                    opt_bytes: int, step_transient: int, notes: list[str]):
    """The single-GPU parameters / gradients / optimizer states -> one GPU's share under --strategy (parallel.py).
    Returns (weight and trainable components, grads, optimizer, optimizer-step temporaries, NCCL bytes, shard
    count, whether layers are gathered in the compute dtype)."""
    from loradoctor.estimate.parallel import per_gpu, shard_count

    arch = inp.arch
    n = shard_count(inp.strategy, inp.gpus)
    train_keys = [k for k in comps if k.endswith(" parameters") or k == "modules_to_save copies"]
    weight_keys = [k for k in comps if k not in train_keys]
    weights = sum(comps[k] for k in weight_keys)
    train = sum(comps[k] for k in train_keys)
    half = 4 if inp.precision == "fp32" else 2
    if inp.method == "full" and inp.strategy in ("zero2", "zero3") and _mixed(inp):
        # DeepSpeed runs the model in half precision, reduces half-precision gradients and keeps the fp32
        # master copy next to the optimizer states (ZeRO's 2 + 2 + 12 bytes per parameter)
        weights = weights * half // 4
        opt_bytes += 4 * trainable
        grads = trainable * half
    linear = sum(i * o * c for i, o, c in arch.linear_modules().values())
    if inp.quant != "none":
        layer_bytes = sum(c * quantized_linear_bytes(i * o, o, inp.quant, inp.double_quant)
                          for i, o, c in arch.linear_modules().values()) + (arch.layer_params() - linear) * half
    else:
        layer_bytes = arch.layer_params() * half
    layer_grad = int(arch.layer_params() * tb) if inp.method == "full" else int(trainable * tb) // arch.layers
    pg = per_gpu(inp.strategy, inp.gpus, inp.offload, weights=weights, trainable=train, grads=grads,
                 optimizer=opt_bytes, layer_bytes=layer_bytes, layer_grad_bytes=layer_grad,
                 bucket_bytes=zero2_bucket_bytes(inp, half))
    out: dict[str, int] = {}
    for k in weight_keys:
        out[k] = int(comps[k] * pg.weights / weights) if weights else 0
    for k in train_keys:
        out[k] = int(comps[k] * pg.trainable / train) if train else 0
    if pg.gathered:
        out["gathered layers (all-gather: current + prefetch, one layer's gradient)"] = pg.gathered
    if pg.buckets:
        out["gradient buckets (" + ("DDP" if inp.strategy == "ddp" else "ZeRO-2 reduce bucket") + ")"] = pg.buckets
    label = f"{inp.gpus} GPUs, {inp.strategy}" + (f", {inp.offload} offloaded to the host" if inp.offload != "none" else "")
    notes.append(f"per-GPU memory ({label}); activations are per GPU (the batch is per device)")
    if inp.offload != "none":
        step_transient = 0
    else:
        step_transient = step_transient // n
    sharded_compute = inp.strategy in ("zero3", "fsdp", "fsdp-hybrid") or (
        inp.method == "full" and inp.strategy == "zero2" and _mixed(inp))
    return out, pg.grads, pg.optimizer, step_transient, pg.comm, n, sharded_compute


# --- the estimate --------------------------------------------------------------------------------

def estimate(inp: EstimateInputs) -> Estimate:
    """Predict the peak memory of one training step. Raises UserError on invalid inputs."""
    inp = validate(inp)
    arch = inp.arch
    notes: list[str] = []
    comps: dict[str, int] = {}
    comps.update(weight_components(inp))

    # trainable parameters
    tb = trainable_bytes(inp)
    matrices: list[tuple[int, int]] = []
    if inp.method == "full":
        trainable = arch.total_params()
        for fin, fout, copies in arch.linear_modules().values():
            matrices += [(fin, fout)] * (copies * arch.layers)
    else:
        trainable, matrices = peft_params(inp)
        label = {"lora": "LoRA", "rslora": "LoRA", "dora": "DoRA", "ia3": "IA3", "adalora": "AdaLoRA"}[inp.peft]
        comps[f"{label} parameters"] = int(trainable * tb)
        mts = modules_to_save_params(arch, inp.modules_to_save)
        if mts:
            mts_bytes = 4 if (inp.quant != "none" and inp.framework == "hf") else base_weight_bytes(inp)
            comps["modules_to_save copies"] = int(mts * mts_bytes)
            matrices.append((arch.vocab, arch.hidden))
            trainable_bytes_total = trainable * tb + mts * mts_bytes
            trainable += mts
            tb = trainable_bytes_total / trainable
    grads = int(trainable * tb)
    if inp.optimizer_in_backward:
        # each gradient is applied and freed in backward: only the largest parameter's gradient lives
        grads = int(max(arch.vocab * arch.hidden, max(i * o for i, o, _ in arch.linear_modules().values())) * tb)
    opt_bytes, paged = optimizer_state_bytes(inp.optim, trainable, tb, matrices)
    if inp.optim in ("adamw_torch", "adamw_hf") and not inp.optimizer_in_backward:
        step_transient = int(trainable * tb)  # foreach AdamW: one state-sized temporary (sqrt of exp_avg_sq)
    else:
        step_transient = 0
    if paged:
        notes.append("paged optimizer states live in CUDA unified memory: counted in device use, not in torch's allocator")
    comm_bytes, shard_n, sharded_compute = 0, 1, False
    if inp.strategy != "none":
        comps, grads, opt_bytes, step_transient, comm_bytes, shard_n, sharded_compute = _apply_parallel(
            inp, comps, trainable, tb, grads, opt_bytes, step_transient, notes)
    # FSDP / ZeRO-3 gather a layer's parameters to run it and free them after its backward (the root unit after the
    # whole backward): alive at the backward peak, not at the optimizer step, which runs on the sharded parameters
    gathered_key = "gathered layers (all-gather: current + prefetch, one layer's gradient)"
    gathered = comps.pop(gathered_key, 0)
    comps["workspaces (cuBLAS, attention)"] = WORKSPACE_BYTES

    saved, transient = activation_components(inp)
    autocast_copies = 0
    if inp.method == "full" and base_weight_bytes(inp) == 4 and inp.precision in ("bf16", "fp16"):
        # autocast casts each fp32 weight to half once per forward; backward keeps the copies alive
        autocast_copies = 2 * sum(i * o * c for i, o, c in arch.linear_modules().values()) * arch.layers
        autocast_copies += 2 * arch.vocab * arch.hidden  # the lm_head matmul (tied or not)
    elif (inp.quant != "none" and inp.framework == "hf" and inp.upcast_non_quantized is not False
          and inp.precision in ("bf16", "fp16")):
        # the fp32-upcast lm_head is cast to half by autocast each forward and kept for backward
        autocast_copies = 2 * arch.vocab * arch.hidden
    elif inp.method != "full" and inp.framework == "litgpt" and base_weight_bytes(inp) == 4 and inp.precision in ("bf16", "fp16"):
        autocast_copies = 2 * sum(i * o * c for i, o, c in arch.linear_modules().values()) * arch.layers
        autocast_copies += 2 * arch.lm_head_params()
    if sharded_compute:
        autocast_copies = 0  # the gathered layers are already in the compute dtype (counted with them)

    static = sum(comps.values())
    act_total = sum(saved.values()) + sum(transient.values()) + autocast_copies
    # the peak: start of backward (activations + loss) with the gradients still to come, or the optimizer
    # step (all gradients + optimizer temporaries) for full fine-tuning; LoRA grads are small either way.
    step_peak = grads + step_transient
    backward_peak = act_total + (grads if inp.method != "full" else 0) + gathered
    head_grads = int(arch.vocab * arch.hidden * tb) // shard_n
    if inp.method == "full" and not inp.optimizer_in_backward:
        # lm_head / embedding gradients appear at the very start of backward
        backward_peak += head_grads
    dynamic = max(backward_peak, step_peak)
    if opt_bytes and not paged:
        comps[f"optimizer states ({inp.optim})"] = opt_bytes
    # the breakdown lists what is alive at the peak moment, so the components add up to the total
    if backward_peak >= step_peak:
        if gathered:
            comps[gathered_key] = gathered
        if inp.method == "full":
            if not inp.optimizer_in_backward:
                comps["lm_head/embedding gradients"] = head_grads
        else:
            comps["gradients"] = grads
        comps.update(saved)
        if autocast_copies:
            comps["autocast half-precision weight copies"] = autocast_copies
        comps.update(transient)
    else:
        comps["gradients"] = grads
        if step_transient:
            comps["optimizer step temporaries"] = step_transient
        notes.append("the peak is the optimizer step (all gradients + optimizer temporaries), not the backward pass; "
                     f"activations at the start of backward: {act_total / 2**30:.2f} GiB")
    peak_alloc = static + (opt_bytes if not paged else 0) + dynamic

    # caching allocator: blocks are rounded and fragment as activation shapes vary from step to step
    slack = int(0.02 * static + 0.07 * dynamic) + 128 * MIB
    peak_reserved = peak_alloc + slack
    paged_bytes = opt_bytes if paged else 0
    device = peak_reserved + CUDA_CONTEXT_BYTES + paged_bytes + comm_bytes
    comps["allocator slack (reserved - allocated)"] = slack
    if paged_bytes:
        comps[f"paged optimizer states ({inp.optim})"] = paged_bytes
    if comm_bytes:
        comps["NCCL buffers"] = comm_bytes
    comps["CUDA context"] = CUDA_CONTEXT_BYTES

    fixed = static + (opt_bytes if not paged else 0) + CUDA_CONTEXT_BYTES + paged_bytes + comm_bytes
    low = int(0.98 * fixed + 0.85 * (dynamic + slack) - 150 * MIB)
    high = int(1.03 * fixed + 1.25 * (dynamic + slack) + 300 * MIB)
    if inp.grad_accum > 1:
        notes.append(f"gradient accumulation ({inp.grad_accum}) does not raise the peak: it is per micro-batch")
    if inp.attn == "eager" and inp.seq_len >= 2048:
        notes.append("eager attention keeps batch x heads x seq^2 probabilities per layer; sdpa/flash_attention_2 do not")
    return Estimate(
        inputs=inp,
        components=comps,
        peak_allocated_bytes=int(peak_alloc),
        peak_reserved_bytes=int(peak_reserved),
        device_used_bytes=int(device),
        band=(min(low, device), max(high, device)),
        trainable_params=int(trainable),
        total_params=arch.total_params() + arch.vision_params,
        notes=notes,
    )


# Components that are not part of peak allocated (they are listed in the breakdown for the total).
NOT_ALLOCATED = ("allocator slack (reserved - allocated)", "CUDA context")
