"""The repro library: one entry per repro id, what it checks, whether it needs a GPU.

The ids are a contract with the rules (docs/rules.md, `repro:` field) and with `explain`.
"""

from __future__ import annotations

from loradoctor.record import field, record
from pathlib import Path

from loradoctor.errors import UserError

SCRIPTS_DIR = Path(__file__).resolve().parent / "scripts"

# kind: "check" asks "does this capability work here?" (PASS = works);
# "problem" runs a known-bad pattern beside its fix and judges the setup under test (docs/repro.md).
KINDS = ("check", "problem")
# gpu: "yes" = SKIP without a CUDA GPU; "no" = runs on the CPU; "optional" = uses the GPU when
# there is one and runs the same logic on the CPU otherwise.
GPU_NEEDS = ("yes", "no", "optional")


@record(frozen=True)
class ReproSpec:
    id: str
    kind: str
    gpu: str
    checks: str  # one line: what it checks
    options: dict[str, str] = field(default_factory=dict)  # option name -> help

    @property
    def script(self) -> Path:
        return SCRIPTS_DIR / f"{self.id.replace('-', '_')}.py"


_SPECS = (
    ReproSpec("cuda-init", "check", "yes",
              "driver and CUDA runtime talk: context creation, a seeded a @ b on each GPU checked against the CPU"),
    ReproSpec("bf16", "check", "yes",
              "bf16 matmul and a small training step checked against fp32; native bf16 judged by compute capability"),
    ReproSpec("fp16", "check", "yes",
              "fp16 matmul and a small training step checked against fp32"),
    ReproSpec("flash-attn", "check", "yes",
              "flash_attn imports and flash_attn_func runs forward+backward, matching SDPA",
              {"dtype": "bf16 or fp16 (default bf16 where native, else fp16)", "head_dim": "head dimension (default 128)"}),
    ReproSpec("sdpa-backends", "check", "yes",
              "which SDPA backends run here (flash, mem-efficient, math, cudnn) and agree with math",
              {"dtype": "bf16, fp16 or fp32", "head_dim": "head dimension (default 128)"}),
    ReproSpec("bnb-4bit", "check", "yes",
              "bitsandbytes NF4 Linear4bit forward and backward on the GPU, matching the dequantized weight"),
    ReproSpec("bnb-8bit-optim", "check", "yes",
              "one bitsandbytes 8-bit AdamW step changes the weights like torch AdamW does"),
    ReproSpec("fragmentation", "problem", "yes",
              "an allocation pattern that strands reserved memory, with and without expandable_segments",
              {"segments": "number of 20 MiB segments in the pattern (default 48)"}),
    ReproSpec("free-memory", "check", "yes",
              "how much memory the caching allocator can really get now, against NVML's free and other processes"),
    ReproSpec("fp16-overflow", "problem", "optional",
              "values past the fp16 range become inf/nan; bf16 keeps them, loss scaling only protects the weights",
              {"setup": "fp16 | fp16-scaled | bf16 (default: bf16 where native, else fp16-scaled)",
               "value": "activation magnitude to test (default 300: squares to 90000 > 65504)",
               "device": "cpu or cuda (default cuda when available)"}),
    ReproSpec("gc-require-grad", "problem", "no",
              "frozen embeddings + reentrant gradient checkpointing -> 'element 0 of tensors does not require grad'; the input hook fixes it",
              {"use_reentrant": "true/false (default true)", "input_require_grads": "true/false (default true)"}),
    ReproSpec("device-assert", "problem", "optional",
              "an embedding lookup past the vocabulary (tokens added without resizing): device-side assert on GPU, IndexError on CPU",
              {"vocab_size": "embedding rows in the setup under test (default 1001)",
               "token_id": "largest token id fed to it (default 1000)",
               "device": "cpu or cuda (default cuda when available)"}),
    ReproSpec("nccl-allreduce", "check", "optional",
              "a two-process all-reduce with NCCL on two local GPUs; gloo on the CPU checks the launcher path otherwise",
              {"backend": "auto | nccl | gloo (default auto: nccl with 2+ GPUs, else gloo)"}),
)

REPROS: dict[str, ReproSpec] = {s.id: s for s in _SPECS}
REPRO_IDS: tuple[str, ...] = tuple(REPROS)


def get_spec(repro_id: str) -> ReproSpec:
    """The spec for an id; UserError (exit 2) for an unknown one."""
    try:
        return REPROS[repro_id]
    except KeyError:
        raise UserError(f"unknown repro id {repro_id!r}; known: {', '.join(REPRO_IDS)}") from None
