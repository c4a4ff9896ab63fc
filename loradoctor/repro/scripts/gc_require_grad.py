"""Repro gc-require-grad: frozen embeddings + reentrant checkpointing -> no gradient at all.

A tiny transformer-like model (frozen embedding and base weights, trainable LoRA-style adapters)
runs its blocks through torch.utils.checkpoint. With use_reentrant=True and an input that does not
require grad, the checkpointed output has no grad_fn and backward raises
"element 0 of tensors does not require grad and does not have a grad_fn". A forward hook that
marks the embedding output as requiring grad (what transformers' enable_input_require_grads()
does, and PEFT's prepare_model_for_kbit_training calls) or use_reentrant=False fixes it.
Setup under test: options use_reentrant (default true) and input_require_grads (default true).
FAIL: the setup under test raises or its adapters get no gradient. PASS: adapters get gradients.
All four combinations are reported. Runs on the CPU.
"""

# The shared harness (_harness.py beside this file): OPTIONS, RID, emit, run_main, import_torch, ...
#     python SCRIPT.py ['{"option": value}']   -> one JSON line, schema loradoctor.repro/1
from _harness import *  # noqa: F401,F403


import warnings


def build(torch):
    nn = torch.nn

    class Adapter(nn.Module):
        def __init__(self, dim, rank=4):
            super().__init__()
            self.base = nn.Linear(dim, dim)
            self.lora_a = nn.Linear(dim, rank, bias=False)
            self.lora_b = nn.Linear(rank, dim, bias=False)
            nn.init.normal_(self.lora_b.weight, std=0.02)  # nonzero so gradients reach lora_a too

        def forward(self, x):
            return self.base(x) + self.lora_b(self.lora_a(x))

    class Block(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.norm = nn.LayerNorm(dim)
            self.proj = Adapter(dim)

        def forward(self, x):
            return x + torch.tanh(self.proj(self.norm(x)))

    class TinyLM(nn.Module):
        def __init__(self, vocab=64, dim=32, layers=2):
            super().__init__()
            self.embed = nn.Embedding(vocab, dim)
            self.blocks = nn.ModuleList(Block(dim) for _ in range(layers))
            self.head = nn.Linear(dim, vocab, bias=False)

        def forward(self, ids, use_reentrant):
            h = self.embed(ids)
            for block in self.blocks:
                h = torch.utils.checkpoint.checkpoint(block, h, use_reentrant=use_reentrant)
            return self.head(h)

    torch.manual_seed(0)
    model = TinyLM()
    for name, p in model.named_parameters():
        p.requires_grad_("lora_" in name)  # what PEFT does: only the adapters train
    return model


def run_arm(torch, use_reentrant, input_require_grads):
    model = build(torch)
    if input_require_grads:
        # transformers' enable_input_require_grads(): the embedding output requires grad
        model.embed.register_forward_hook(lambda module, inputs, output: output.requires_grad_(True))
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            logits = model(ids, use_reentrant)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 64), ids.reshape(-1))
            loss.backward()
            error = None
        except RuntimeError as exc:
            error = exc_line(exc)
    grads = [p.grad for n, p in model.named_parameters() if "lora_" in n]
    with_grad = sum(1 for g in grads if g is not None and g.abs().sum().item() > 0)
    return {"use_reentrant": use_reentrant, "input_require_grads": input_require_grads, "error": error,
            "adapters_with_grad": with_grad, "adapters": len(grads),
            "warnings": sorted({str(w.message).splitlines()[0] for w in caught if "requires_grad" in str(w.message)})}


def main():
    torch = import_torch()
    use_reentrant = opt_bool("use_reentrant", True)
    input_require_grads = opt_bool("input_require_grads", True)
    arms = [run_arm(torch, r, h) for r in (True, False) for h in (False, True)]
    evidence = []
    for a in arms:
        outcome = a["error"] or f"{a['adapters_with_grad']}/{a['adapters']} adapters get gradients"
        evidence.append(f"use_reentrant={a['use_reentrant']}, input_require_grads={a['input_require_grads']}: {outcome}")
        evidence += [f"  warning: '{w}'" for w in a["warnings"]]  # torch's own words, quoted
    chosen = next(a for a in arms if a["use_reentrant"] == use_reentrant and a["input_require_grads"] == input_require_grads)
    bad = arms[0]
    numbers = {"setup": {"use_reentrant": use_reentrant, "input_require_grads": input_require_grads},
               "arms": arms, "reproduced_unfixed": bad["error"] is not None}
    label = f"use_reentrant={use_reentrant}, input_require_grads={input_require_grads}"
    if chosen["error"]:
        emit("FAIL", f"{label} reproduces the error: {chosen['error']}; fix: model.enable_input_require_grads() "
                     "or gradient_checkpointing_kwargs={'use_reentrant': False}", evidence, numbers)
    if chosen["adapters_with_grad"] < chosen["adapters"]:
        emit("FAIL", f"{label}: only {chosen['adapters_with_grad']} of {chosen['adapters']} adapters get gradients",
             evidence, numbers)
    seen = f"the unfixed setup raises '{bad['error']}'" if bad["error"] else "the unfixed setup did not raise here"
    emit("PASS", f"{label}: all adapters get gradients with torch {torch.__version__}; {seen}", evidence, numbers)


run_main(main)
