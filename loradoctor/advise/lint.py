"""`loradoctor lint CONFIG...`: a training config's pitfalls before a GPU hour is spent.

Each lint is a small function registered with `@lint(ID)`; its wording (title, why, fix, the cause it
leads to) lives in loradoctor/data/lints.yaml, written once. A lint sees `Cfg`: the raw settings of
one file with the line of each top-level key, its format (axolotl, llamafactory, training_args,
adapter_config), and the options the estimate readers take from it. Findings quote file:line and the
framework's own key names, so the fix is a line to paste.
"""

from __future__ import annotations

import json
import math
import os
import re
from loradoctor.record import field, record
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Optional

from loradoctor.errors import UserError
from loradoctor.findings import Evidence, Finding, Fix

KEYS = {  # logical setting -> the key each format uses
    "lr": {"axolotl": "learning_rate", "llamafactory": "learning_rate", "training_args": "learning_rate"},
    "rank": {"axolotl": "lora_r", "llamafactory": "lora_rank", "adapter_config": "r", "training_args": "lora_r"},
    "alpha": {"axolotl": "lora_alpha", "llamafactory": "lora_alpha", "adapter_config": "lora_alpha", "training_args": "lora_alpha"},
    "dropout": {"axolotl": "lora_dropout", "llamafactory": "lora_dropout", "adapter_config": "lora_dropout"},
    "rslora": {"axolotl": "peft_use_rslora", "llamafactory": "use_rslora", "adapter_config": "use_rslora"},
    "max_grad_norm": {"axolotl": "max_grad_norm", "llamafactory": "max_grad_norm", "training_args": "max_grad_norm"},
    "bf16": {"axolotl": "bf16", "llamafactory": "bf16", "training_args": "bf16"},
    "fp16": {"axolotl": "fp16", "llamafactory": "fp16", "training_args": "fp16"},
    "train_batch": {"axolotl": "micro_batch_size", "llamafactory": "per_device_train_batch_size",
                    "training_args": "per_device_train_batch_size"},
    "eval_batch": {"axolotl": "eval_batch_size", "llamafactory": "per_device_eval_batch_size",
                   "training_args": "per_device_eval_batch_size"},
    "workers": {"axolotl": "dataloader_num_workers", "llamafactory": "dataloader_num_workers",
                "training_args": "dataloader_num_workers"},
    "seq_len": {"axolotl": "sequence_len", "llamafactory": "cutoff_len", "training_args": "max_length"},
    "targets": {"axolotl": "lora_target_modules", "llamafactory": "lora_target", "adapter_config": "target_modules"},
}
PACKING_KEYS = ("sample_packing", "packing", "neat_packing")


@record
class Cfg:
    path: str
    fmt: str
    raw: dict[str, Any]
    lines: dict[str, int]
    opts: dict[str, Any]
    model: Optional[str] = None
    gpu: Any = None
    local: bool = False
    facts: dict[str, Any] = field(default_factory=dict)

    def key(self, logical: str) -> Optional[str]:
        """The key this file uses for a logical setting (the one present, else the format's own)."""
        k = KEYS.get(logical, {}).get(self.fmt)
        if logical == "seq_len" and self.fmt == "training_args" and "max_seq_length" in self.raw:
            return "max_seq_length"
        return k

    def get(self, logical: str) -> Any:
        k = self.key(logical)
        return self.raw.get(k) if k else None

    def ev(self, *keys: Optional[str]) -> list[Evidence]:
        out = []
        for k in keys:
            if k and k in self.raw:
                out.append(Evidence(file=self.path, line=self.lines.get(k), text=f"{k}: {_show(self.raw[k])}"))
        return out

    @property
    def adapter(self) -> Optional[bool]:
        """True for LoRA / QLoRA, False for full fine-tuning, None when the file does not say
        (a TrainingArguments JSON holds no adapter settings)."""
        if self.fmt == "adapter_config" or self.opts.get("method") in ("lora", "qlora"):
            return True
        if self.opts.get("method") == "full":
            return False
        return None

    @property
    def checkpointing(self) -> bool:
        return bool(self.opts.get("gradient_checkpointing"))


def _show(v: Any) -> str:
    return json.dumps(v) if isinstance(v, (dict, list)) else str(v)


def _num(v: Any) -> Optional[float]:
    if isinstance(v, bool) or v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _true(v: Any) -> bool:
    return v is True or str(v).strip().lower() in ("true", "1", "yes", "on")


@lru_cache(maxsize=1)
def catalogue() -> dict[str, dict[str, Any]]:
    import yaml

    path = Path(__file__).resolve().parent.parent / "data" / "lints.yaml"
    return yaml.safe_load(path.read_text(encoding="utf-8"))  # our own package data


CHECKS: dict[str, Callable[[Cfg], Optional[tuple[list[Evidence], str, str]]]] = {}


def lint(lint_id: str) -> Callable:
    """Register a check: it returns None, or (evidence, what this config does, the fix line)."""
    def wrap(fn: Callable) -> Callable:
        CHECKS[lint_id] = fn
        return fn
    return wrap


@lint("lr-out-of-lora-range")
def _lr(c: Cfg):
    lr = _num(c.get("lr"))
    if lr is None or lr <= 0:
        return None
    k = c.key("lr")
    if c.adapter and lr < 5e-5:
        return c.ev(k), f"learning rate {lr:g} for a LoRA adapter: full fine-tuning scale; the loss will barely move", f"{k}: 2.0e-4"
    if c.adapter and lr > 1e-3:
        return c.ev(k), f"learning rate {lr:g} for a LoRA adapter: above 1e-3 training tends to diverge", f"{k}: 2.0e-4"
    if c.adapter is None and lr > 1e-3:
        return c.ev(k), f"learning rate {lr:g}: above 1e-3 LoRA tends to diverge, and full fine-tuning wants about 2e-5", f"{k}: 2.0e-4"
    if c.adapter is False and lr > 1e-4:
        return c.ev(k), f"learning rate {lr:g} for full fine-tuning: LoRA's scale; expect divergence", f"{k}: 2.0e-5"
    return None


@lint("alpha-rank-ratio")
def _alpha(c: Cfg):
    r, a = _num(c.get("rank")), _num(c.get("alpha"))
    if c.adapter is False or not r or a is None or r <= 0:
        return None
    rs = _true(c.get("rslora"))
    scale = a / math.sqrt(r) if rs else a / r
    lo, hi = (0.5, 16.0) if rs else (0.5, 4.0)
    if lo <= scale <= hi:
        return None
    what = f"alpha {a:g} / {'sqrt(r)' if rs else 'r'} {r:g} = scale {scale:.2g}"
    return c.ev(c.key("rank"), c.key("alpha")), f"{what}: outside {lo:g}-{hi:g}", f"{c.key('alpha')}: {int(2 * r) if not rs else int(4 * math.sqrt(r))}"


@lint("no-gradient-clipping")
def _clip(c: Cfg):
    k = c.key("max_grad_norm")
    if not k or k not in c.raw:
        return None
    v = c.raw[k]
    n = _num(v)
    if v is None or v is False or n == 0:
        return c.ev(k), "gradient clipping is off", f"{k}: {0.3 if c.opts.get('method') == 'qlora' else 1.0}"
    if n is not None and n > 10:
        return c.ev(k), f"max_grad_norm {n:g} never clips in practice", f"{k}: 1.0"
    return None


@lint("bf16-on-old-card")
def _bf16_card(c: Cfg):
    if not _true(c.get("bf16")) or c.gpu is None:
        return None
    try:
        cc = float(c.gpu.compute_capability or "nan")
    except ValueError:
        return None
    if cc >= 8.0 or math.isnan(cc):
        return None
    return c.ev(c.key("bf16")), f"bf16 on {c.gpu.name} (compute capability {cc:g})", f"{c.key('bf16')}: false\n{c.key('fp16')}: true"


@lint("fp16-on-bf16-model")
def _fp16_model(c: Cfg):
    if not _true(c.get("fp16")) or c.facts.get("dtype") != "bfloat16":
        return None
    where = c.facts.get("dtype_source", "its config")
    fix = f"{c.key('fp16')}: false\n{c.key('bf16')}: true"
    return c.ev(c.key("fp16")), f"fp16 for {c.model}, published in bf16 ({where})", fix


@lint("use-cache-with-checkpointing")
def _use_cache(c: Cfg):
    uc = c.raw.get("use_cache")
    if uc is None and isinstance(c.raw.get("model_init_kwargs"), dict):
        uc = c.raw["model_init_kwargs"].get("use_cache")
    if not _true(uc) or not c.checkpointing:
        return None
    key = "use_cache" if "use_cache" in c.raw else "model_init_kwargs"
    return c.ev(key, "gradient_checkpointing"), "use_cache true with gradient checkpointing", "use_cache: false"


@lint("reentrant-checkpointing-peft")
def _reentrant(c: Cfg):
    kw = c.raw.get("gradient_checkpointing_kwargs")
    if not isinstance(kw, dict) or not _true(kw.get("use_reentrant")) or not c.checkpointing:
        return None
    return (c.ev("gradient_checkpointing_kwargs"), "use_reentrant true with gradient checkpointing and a frozen base",
            'gradient_checkpointing_kwargs: {"use_reentrant": false}')


@lint("packing-without-varlen")
def _packing(c: Cfg):
    key = next((k for k in PACKING_KEYS if _true(c.raw.get(k))), None)
    if key is None:
        return None
    if c.opts.get("attn") == "flash_attention_2" or _true(c.raw.get("padding_free")):
        return None
    fix = {"axolotl": "flash_attention: true", "llamafactory": "flash_attn: fa2"}.get(c.fmt, 'attn_implementation: "flash_attention_2"\npadding_free: true')
    return c.ev(key, "sdp_attention", "flash_attn", "attn_implementation"), f"{key} without FlashAttention 2's varlen path", fix


@lint("eval-batch-above-train")
def _eval_batch(c: Cfg):
    t, e = _num(c.get("train_batch")), _num(c.get("eval_batch"))
    if t is None or e is None or e <= t:
        return None
    return c.ev(c.key("train_batch"), c.key("eval_batch")), f"eval batch {e:g} > train batch {t:g}", f"{c.key('eval_batch')}: {int(t)}"


@lint("eval-predictions-on-gpu")
def _eval_acc(c: Cfg):
    if c.fmt != "training_args":
        return None
    strat = str(c.raw.get("eval_strategy") or c.raw.get("evaluation_strategy") or "no").lower()
    if strat in ("no", "none") or "eval_accumulation_steps" in c.raw or _true(c.raw.get("prediction_loss_only")):
        return None
    key = "eval_strategy" if "eval_strategy" in c.raw else "evaluation_strategy"
    return c.ev(key), f"evaluation every {strat} with predictions gathered on the GPU", "eval_accumulation_steps: 8"


@lint("dataloader-workers")
def _workers(c: Cfg):
    k = c.key("workers")
    n = _num(c.raw.get(k)) if k else None
    if n is None or n <= 0:
        return None
    if c.local:
        cpus = os.cpu_count() or 1
        if n > cpus:
            return c.ev(k), f"{n:g} dataloader workers on {cpus} CPUs here", f"{k}: {max(1, min(4, cpus // 2))}"
        try:
            st = os.statvfs("/dev/shm")
            shm = st.f_blocks * st.f_frsize
        except OSError:
            shm = None
        if shm is not None and shm < (1 << 30):
            return c.ev(k), f"{n:g} workers with /dev/shm of {shm / 2**20:.0f} MiB here", f"{k}: 0   # or run the container with --shm-size=8g"
    elif n > 32:
        return c.ev(k), f"{n:g} dataloader workers", f"{k}: 8"
    return None


@lint("target-modules-missing")
def _targets(c: Cfg):
    arch = c.facts.get("arch")
    targets = c.opts.get("targets")
    if arch is None or not targets or c.adapter is not True:
        return None
    from loradoctor.estimate.memory import resolve_targets

    try:
        resolve_targets(arch, tuple(targets))
    except UserError as exc:
        return c.ev(c.key("targets")), str(exc).split(" (PEFT")[0], _all_linear(c)
    if arch.mlp == "gated" and not arch.fused:  # Llama / Mistral / Qwen / Gemma name their layers exactly so
        known = set(arch.linear_modules()) | {"lm_head", "all-linear", "all_linear", "all"}
        wrong = [t for t in targets if t not in known]
        if wrong:
            return (c.ev(c.key("targets")), f"{', '.join(wrong)} not in {arch.name} (its linear layers: "
                    f"{', '.join(sorted(set(arch.linear_modules()) - {'router'}))})",
                    _all_linear(c))
    return None


def _all_linear(c: Cfg) -> str:
    return {"axolotl": "lora_target_linear: true", "llamafactory": "lora_target: all"}.get(
        c.fmt, 'target_modules: "all-linear"')


@lint("dropout-off-fast-path")
def _dropout(c: Cfg):
    unsloth = _true(c.raw.get("use_unsloth")) or any(k.startswith("unsloth_") and _true(v) for k, v in c.raw.items())
    d = _num(c.get("dropout"))
    if not unsloth or not d:
        return None
    return c.ev(c.key("dropout"), "use_unsloth"), f"lora_dropout {d:g} with Unsloth", f"{c.key('dropout')}: 0"


@lint("checkpoints-fill-disk")
def _disk(c: Cfg):
    if c.adapter is True or "save_total_limit" in c.raw:
        return None
    arch = c.facts.get("arch")
    steps, every = _num(c.raw.get("max_steps")), _num(c.raw.get("save_steps"))
    if arch is None or not steps or not every or every <= 0:
        return None
    from loradoctor.estimate.memory import EstimateInputs, estimate, validate

    try:
        params = estimate(validate(EstimateInputs(arch=arch, method="full", targets=()))).total_params
    except UserError:
        return None
    per = params * (2 + 8)  # bf16 weights + AdamW's two fp32 states
    count = int(steps // every)
    need = per * count
    out_dir = str(c.raw.get("output_dir") or ".")
    try:
        st = os.statvfs(out_dir if os.path.isdir(out_dir) else ".")
        free = st.f_bavail * st.f_frsize
    except OSError:
        return None
    if need <= free:
        return None
    return (c.ev("save_steps", "max_steps"), f"{count} checkpoints of about {per / 2**30:.0f} GiB each and "
            f"{free / 2**30:.0f} GiB free", "save_total_limit: 2")


@lint("max-length-beyond-context")
def _context(c: Cfg):
    ctx = c.facts.get("context")
    n = _num(c.opts.get("seq_len")) if c.opts.get("seq_len") is not None else None
    if not ctx or n is None or n <= ctx or c.raw.get("rope_scaling"):
        return None
    k = c.key("seq_len")
    return c.ev(k), f"max length {n:g} for a model trained on {ctx} tokens", f"{k}: {ctx}   # or rope_scaling"


@lint("pad-token-is-eos")
def _pad(c: Cfg):
    st = c.raw.get("special_tokens")
    if not isinstance(st, dict) or not st.get("pad_token"):
        return None
    eos = st.get("eos_token") or c.facts.get("eos_token")
    if not eos or st["pad_token"] != eos:
        return None
    return c.ev("special_tokens"), f"pad_token {st['pad_token']} is the EOS token", "special_tokens: {pad_token: <|pad|>}"


# ------------------------------------------------------------------------------------------------

def _key_lines(text: str, data: dict[str, Any], is_json: bool) -> dict[str, int]:
    lines: dict[str, int] = {}
    if not is_json:
        try:
            import yaml

            node = yaml.compose(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
            for k, _v in getattr(node, "value", []) or []:
                if hasattr(k, "value") and isinstance(k.value, str):
                    lines.setdefault(k.value, k.start_mark.line + 1)
            return lines
        except Exception:  # noqa: BLE001 - fall back to a text search
            pass
    for i, line in enumerate(text.splitlines(), 1):
        for m in re.finditer(r'"([A-Za-z0-9_]{1,80})"\s*:', line):
            if m.group(1) in data:
                lines.setdefault(m.group(1), i)
    return lines


def _model_facts(model: Optional[str]) -> dict[str, Any]:
    """The architecture, the trained context and the published dtype, from config.json or the tables."""
    facts: dict[str, Any] = {}
    if not model:
        return facts
    try:
        from loradoctor.estimate.arch import resolve_arch

        facts["arch"] = resolve_arch(model)
    except UserError:
        return facts
    src = facts["arch"].source
    path = src.split(":", 1)[1] if src.startswith("hf-cache:") else src
    if os.path.isfile(path):
        try:
            cfg = json.loads(Path(path).read_text(encoding="utf-8"))
            facts["context"] = cfg.get("max_position_embeddings")
            facts["dtype"] = cfg.get("torch_dtype") or cfg.get("dtype")
            facts["dtype_source"] = "config.json"
            return facts
        except (OSError, ValueError):
            pass
    import yaml

    table_path = Path(__file__).resolve().parent.parent / "data" / "model_facts.yaml"
    table = yaml.safe_load(table_path.read_text(encoding="utf-8"))  # our own package data
    name = src.split(":", 1)[1] if src.startswith("preset:") else facts["arch"].name
    from loradoctor.estimate.arch import find_preset

    preset = find_preset(model) or find_preset(name) or ""
    for prefix in sorted(table, key=len, reverse=True):
        if preset.startswith(prefix):
            facts["context"], facts["dtype"] = table[prefix].get("context"), table[prefix].get("dtype")
            facts["dtype_source"] = "the published checkpoint"
            break
    return facts


def read_for_lint(path: "str | Path") -> tuple[str, dict[str, Any], dict[str, int], dict[str, Any]]:
    """(format, raw settings, key -> line, estimate options) for one config file."""
    from loradoctor.estimate.configs import read_config
    from loradoctor.safe_yaml import load_config_file, read_text

    p = Path(path)
    if not p.is_file():
        raise UserError(f"{p}: no such file")
    fmt, opts = read_config(p)  # the estimate's reader: formats, value checks, one line on bad input
    data = load_config_file(p)  # the raw settings, for the keys the estimate does not read
    text = read_text(p)
    is_json = p.suffix.lower() == ".json"
    return fmt, data, _key_lines(text, data, is_json), opts


def lint_configs(paths: list["str | Path"], model: Optional[str] = None, gpu: Any = None, local: bool = False) -> list[Finding]:
    """Every lint over every file; findings ranked errors first. UserError for unreadable files."""
    cat = catalogue()
    findings: list[Finding] = []
    for path in paths:
        fmt, raw, lines, opts = read_for_lint(path)
        m = model or opts.get("model")
        cfg = Cfg(path=str(path), fmt=fmt, raw=raw, lines=lines, opts=opts, model=m, gpu=gpu, local=local,
                  facts=_model_facts(m))
        for lint_id, check in CHECKS.items():
            try:
                hit = check(cfg)
            except Exception as exc:  # noqa: BLE001 - a lint that breaks is our bug, said as such
                findings.append(Finding(cause="internal.check_failed", rule=f"lint:{lint_id}", severity="info",
                                        confidence=1.0, title=f"could not check: {lint_id}: {type(exc).__name__}: {exc}"[:200]))
                continue
            if hit is None:
                continue
            evidence, what, fix = hit
            spec = cat[lint_id]
            leads = spec.get("leads_to")
            findings.append(Finding(
                cause=leads if leads and leads != "none" else "config.pitfall", rule=lint_id, severity=spec["severity"],
                confidence=0.9, title=spec["title"], summary=f"{what}. {spec['why']}",
                evidence=evidence or [Evidence(file=str(path), line=None, text=what)],
                facts={"lint.format": fmt, "lint.leads_to": leads or "none"},
                fixes=[Fix("Write instead", fix)], area="config"))
    from loradoctor.findings import assign_ranks

    return assign_ranks(findings)


def lint_docs() -> str:
    """docs/lint.md, generated from the catalogue (a test keeps the file current)."""
    out = ["# Config lints", "",
           "`loradoctor lint CONFIG... [--model ID] [--gpu NAME|local]` (and `preflight --config`) checks a training",
           "config before launch. Each lint has a stable id, a severity (error: the run cannot work as configured;",
           "warning: likely harm; info: worth a look), the file and line it comes from, why it matters, the fix as",
           "a config line in the file's own key names, and the cause a run with the setting tends to end in.",
           "Formats: axolotl YAML, LLaMA-Factory YAML, TrainingArguments / TRL JSON, adapter_config.json.",
           "Exit codes: 0 no error (warnings shown), 1 an error (`--strict`: a warning too), 2 unreadable input.",
           "", "Generated from `loradoctor/data/lints.yaml` by `python -m loradoctor.advise.lint --write-docs docs/lint.md`.", ""]
    for lint_id, spec in catalogue().items():
        out += [f"## `{lint_id}` ({spec['severity']})", "", f"**{spec['title']}.** {spec['why']}", "",
                f"- example: `{spec['example']}`", f"- fix: `{spec['fix']}`",
                f"- leads to: `{spec.get('leads_to') or 'none'}`", ""]
    return "\n".join(out)


if __name__ == "__main__":  # pragma: no cover
    import sys

    if len(sys.argv) == 3 and sys.argv[1] == "--write-docs":
        Path(sys.argv[2]).write_text(lint_docs(), encoding="utf-8")
    else:
        print("usage: python -m loradoctor.advise.lint --write-docs docs/lint.md", file=sys.stderr)
        sys.exit(2)
