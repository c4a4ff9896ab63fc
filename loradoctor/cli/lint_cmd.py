"""`loradoctor lint CONFIG...`: a config's pitfalls before launch (loradoctor/advise/lint.py)."""

from __future__ import annotations

from typing import Any

from loradoctor.errors import UserError

LINT_HELP = """Check training configs for the pitfalls that cost a GPU hour: a learning rate at full
fine-tuning scale for LoRA, alpha far from the rank, no gradient clipping, bf16 on a card without it,
fp16 on a bf16 model, packing without FlashAttention's varlen path, an eval batch above the train
batch, more dataloader workers than CPUs or /dev/shm allow, LoRA targets the model lacks, a max length
beyond the model's context, ... Each finding names the file and line, why it matters, the fix as a
config line in the file's own key names, and the cause a run with it tends to end in.
Formats: axolotl YAML, LLaMA-Factory YAML, TrainingArguments / TRL JSON, adapter_config.json.
The lint catalogue, each id with why, example and fix: `loradoctor docs lint`.

Examples:
  loradoctor lint axolotl.yaml
  loradoctor lint train.yaml --gpu T4
  loradoctor lint training_args.json adapter_config.json --model meta-llama/Llama-3.1-8B --gpu local
  loradoctor lint config.yaml --strict && python train.py

Exit codes: 0 no error (warnings are shown), 1 an error (--strict: a warning too), 2 unreadable input or bad usage."""


def build_parser(name: str = "lint"):
    from loradoctor.cli._args import new_parser

    p = new_parser(name, LINT_HELP, func=body)
    p.add_argument("configs", nargs="+", metavar="CONFIG", help="training config files")
    p.add_argument("--model", metavar="ID|PATH", help="the base model, when the config does not name it")
    p.add_argument("--gpu", metavar="NAME|local", help="the card the run will use (bf16 support; local: also CPUs, /dev/shm, disk)")
    p.add_argument("--strict", action="store_true", help="exit 1 on warnings too")
    p.add_argument("-f", "--format", dest="fmt", default="text", metavar="FMT", help="text (default) | json | md")
    return p


def body(opts: dict[str, Any]) -> int:
    from loradoctor.advise.lint import lint_configs

    fmt = opts.get("fmt") or "text"
    if fmt not in ("text", "json", "md"):
        raise UserError(f"--format must be text, json or md, not {fmt!r}")
    gpu, local = None, False
    if opts.get("gpu"):
        local = str(opts["gpu"]).lower().startswith("local")
        from loradoctor.estimate.inputs import gpu_budget

        gpu = gpu_budget(opts["gpu"], None)
    findings = lint_configs(list(opts["configs"]), model=opts.get("model"), gpu=gpu, local=local)
    if fmt == "json":
        import json

        print(json.dumps({"schema": "loradoctor.lint/1", "configs": list(opts["configs"]),
                          "findings": [f.to_dict() for f in findings]}, indent=2))
    elif fmt == "md":
        from loradoctor.render.markdown import findings_md

        print(findings_md(findings, "loradoctor lint"), end="")
    else:
        from loradoctor.render.advise_view import lint_text

        print(lint_text(findings, list(opts["configs"])))
    from loradoctor.findings import exit_code

    return exit_code(findings, strict=bool(opts.get("strict")))
