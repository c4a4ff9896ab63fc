"""`loradoctor recommend`: the config to copy for a model on a card (loradoctor/advise/recommend.py)."""

from __future__ import annotations

from typing import Any

from loradoctor.errors import UserError

RECOMMEND_HELP = """The LoRA / QLoRA config to copy for a model on a card, as your framework's own config.

Chosen by the memory model and the card's capabilities: method (bf16 LoRA when it fits with
headroom, else QLoRA nf4 with double quantization), precision (bf16 on compute capability >= 8.0,
else fp16), attention, gradient checkpointing, micro-batch and accumulation to the effective batch,
max length, LoRA rank / alpha / dropout / targets, optimizer, learning rate, schedule, clipping.
Each choice comes with one line saying why, and the estimate of exactly this config.

Examples:
  loradoctor recommend --model Qwen/Qwen2.5-7B --gpu 'RTX 4090' --seq-len 2048
  loradoctor recommend --model meta-llama/Llama-3.1-8B --gpu local --framework axolotl > config.yaml
  loradoctor recommend --model ./my-model --vram 16GB --goal fast --framework unsloth
  loradoctor recommend --table --gpu 'RTX 5090' --model qwen2.5-7b,llama-3.1-8b

Exit codes: 0 a config was found; 1 nothing fits this card (the smallest card that would is named);
2 bad usage."""


def build_parser(name: str = "recommend"):
    from loradoctor.cli._args import new_parser

    p = new_parser(name, RECOMMEND_HELP, func=body)
    p.add_argument("--model", metavar="ID|PATH", help="Hub id, a folder with config.json, or a preset name "
                                                       "(with --table: a comma-separated list)")
    p.add_argument("--gpu", metavar="NAME|local", help="a card from `loradoctor gpus`, or local (this machine's GPU)")
    p.add_argument("--vram", metavar="SIZE", help="a card by its memory, e.g. 24GB")
    p.add_argument("--seq-len", type=int, metavar="N", help="the longest sample in tokens (default: the longest that fits, up to 2048)")
    p.add_argument("--method", default="auto", metavar="M", help="auto (default) | lora | qlora | full")
    p.add_argument("--goal", default="quality", metavar="G", help="quality (default) | fast | long-context")
    p.add_argument("--framework", default="hf", metavar="F", help="hf (default) | trl | axolotl | llamafactory | unsloth")
    p.add_argument("--effective-batch", type=int, default=16, metavar="N", help="micro-batch x accumulation to reach (default 16)")
    p.add_argument("--headroom", type=float, default=0.10, metavar="SHARE", help="share of the card kept free (default 0.10)")
    p.add_argument("--table", action="store_true", help="for each model: method x max length -> the micro-batch that fits and its memory")
    p.add_argument("-f", "--format", dest="fmt", default="text", metavar="FMT",
                   help="text (default: config + reasons + estimate) | yaml (the config alone) | json")
    return p


def _gpu(opts: dict[str, Any]):
    from loradoctor.estimate.inputs import gpu_budget

    gpu = gpu_budget(opts.get("gpu"), opts.get("vram"))
    if gpu is None:
        raise UserError("recommend needs a card: --gpu NAME (see `loradoctor gpus`), --gpu local, or --vram 24GB")
    return gpu


def body(opts: dict[str, Any]) -> int:
    from loradoctor.advise.emit import emit
    from loradoctor.advise.recommend import recommend
    from loradoctor.estimate.arch import resolve_arch

    fmt = opts.get("fmt") or "text"
    if fmt not in ("text", "yaml", "json"):
        raise UserError(f"--format must be text, yaml or json, not {fmt!r}")
    if not opts.get("model"):
        raise UserError("recommend needs --model ID|PATH")
    if opts.get("seq_len") is not None and not 16 <= opts["seq_len"] <= 1 << 20:
        raise UserError("--seq-len must be between 16 and 1048576 tokens")
    gpu = _gpu(opts)
    local = str(opts.get("gpu") or "").lower().startswith("local")
    if opts.get("table"):
        return _table(opts, gpu, fmt)
    arch = resolve_arch(opts["model"])
    try:
        rec = recommend(arch, gpu, seq_len=opts.get("seq_len"), method=opts.get("method") or "auto",
                        goal=opts.get("goal") or "quality", framework=opts.get("framework") or "hf",
                        effective_batch=opts.get("effective_batch") or 16, headroom=opts.get("headroom", 0.10), local=local)
    except UserError as exc:
        if str(exc).startswith("nothing fits"):
            print(f"loradoctor recommend: {exc}")
            return 1
        raise
    d = rec.to_dict()
    if fmt == "json":
        import json

        d["config"] = emit(d, rec.framework)
        print(json.dumps(d, indent=2))
        return 0
    config = emit(d, rec.framework)
    if fmt == "yaml":
        print(config, end="")
        return 0
    from loradoctor.render.advise_view import recommend_text

    print(recommend_text(d, config, rec.reasons + rec.notes, gpu.name))
    return 0


def _table(opts: dict[str, Any], gpu: Any, fmt: str) -> int:
    from loradoctor.advise.recommend import table

    rows = table([m.strip() for m in opts["model"].split(",") if m.strip()], gpu, headroom=opts.get("headroom", 0.10))
    if fmt == "json":
        import json

        print(json.dumps(rows, indent=2))
        return 0
    from loradoctor.render.advise_view import recommend_table_text

    print(recommend_table_text(rows, gpu.name, opts.get("headroom", 0.10)), end="")
    return 0
