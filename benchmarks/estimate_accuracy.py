"""Accuracy of `loradoctor estimate` on measured runs, and its speed.

    python benchmarks/estimate_accuracy.py [TRUTH.yaml ...] [--json] [--no-speed]

Without a TRUTH file it reads both sets: benchmarks/data/dev_truth.yaml and benchmarks/data/public_truth.yaml.
Errors are reported per group (hf, unsloth, axolotl+cce, litgpt, torchtune, cce-kernel for loss kernels
measured alone; a public point may name its own: hf-multi-gpu, peft-methods, liger). LORADOCTOR_BENCH_ROOT=/path/to/another/checkout evaluates that checkout's model on the
same points (inputs it does not know are dropped: how that version would describe the run).

TRUTH defaults to benchmarks/data/dev_truth.yaml (litgpt and torchtune tables). For each point the
configuration described in the file (framework, precision, optimizer, quantization, LoRA targets,
checkpointing, compile / chunked loss / offloading extras) becomes an EstimateInputs; the prediction
of the point's own metric (max allocated, reserved, or device in use; 'active' is read as allocated;
an unstated type as reserved) is printed in the point's unit (GB = 1e9, GiB = 2**30) next to the
measurement. Errors are (predicted - measured) / measured.

OOM points (measured_gb: null) are judged separately: a hit when the predicted device use exceeds the
card's memory (from the point's gpu name, else gpu_memory_gb), a miss otherwise. They are not in the
median / p90.

The speed check times `python -m loradoctor estimate ...` against a bare `python -c pass`.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

HERE = Path(__file__).resolve().parent.parent
ROOT = Path(os.environ.get("LORADOCTOR_BENCH_ROOT") or HERE)
sys.path.insert(0, str(ROOT))

from loradoctor.estimate.arch import Arch, find_preset, arch_from_preset  # noqa: E402
from loradoctor.estimate.fit import find_gpu, gpu_table  # noqa: E402
from loradoctor.estimate.memory import EstimateInputs, estimate  # noqa: E402

# the team's development set, vendored from the team's shared folder (the repository cites no file outside itself)
DEFAULT_TRUTH = HERE / "benchmarks" / "data" / "dev_truth.yaml"
PUBLIC_TRUTH = HERE / "benchmarks" / "data" / "public_truth.yaml"


def make_inputs(**kw: Any) -> EstimateInputs:
    """EstimateInputs from keyword arguments, dropping what the loaded model version does not know."""
    from loradoctor.estimate import memory

    known = EstimateInputs.__dataclass_fields__
    kw = {k: v for k, v in kw.items() if k in known and v is not None}
    if kw.get("framework") not in memory.FRAMEWORKS:
        kw["framework"] = "hf"
    if kw.get("precision") not in memory.PRECISIONS:
        kw["precision"] = str(kw.get("precision")).replace("-no-autocast", "")  # the closest mode it has
    return EstimateInputs(**kw)


def framework_group(inp: EstimateInputs) -> str:
    """hf | unsloth | axolotl+cce | litgpt | torchtune."""
    if inp.framework in ("litgpt", "torchtune", "unsloth"):
        return inp.framework
    return "axolotl+cce" if getattr(inp, "loss", None) == "cce" else "hf"


def arch_for(point: dict[str, Any]) -> Arch:
    """The point's own shape numbers (they are what the run used), with family traits from its id/notes."""
    m = point["model"]
    hf_id = m["hf_id"]
    low = hf_id.lower()
    note = (m.get("arch_note") or "").lower()
    vocab = m["vocab_size"]
    if "pads vocab to" in note:
        vocab = int(note.split("pads vocab to")[1].split()[0].strip(";,"))
    plain = any(k in low for k in ("phi-1_5", "phi-2", "stablelm", "falcon"))
    parallel_shared = any(k in low for k in ("phi-1_5", "phi-2", "falcon"))  # one norm feeds attention and MLP
    kw = dict(
        name=hf_id,
        hidden=m["hidden_size"],
        intermediate=m["intermediate_size"],
        layers=m["num_layers"],
        heads=m["num_attention_heads"],
        kv_heads=m["num_kv_heads"],
        vocab=vocab,
        head_dim=m.get("head_dim") or 0,
        tied=bool(m.get("tie_word_embeddings", False)),
        mlp="plain" if plain else "gated",
        norm="layer" if plain else "rms",
        norms_per_layer=1 if parallel_shared else (4 if "gemma-2" in low else 2),
        parallel_residual=parallel_shared,
        source=f"dev_truth:{point['id']}",
    )
    preset = find_preset(hf_id)
    if preset:
        p = arch_from_preset(preset)
        kw["attn_bias"] = p.attn_bias
        kw["attn_softcap"] = p.attn_softcap
        kw["final_softcap"] = p.final_softcap
    return Arch(**kw)


def targets_for(point: dict[str, Any], arch: Arch) -> tuple[str, ...]:
    out: list[str] = []
    for t in (point.get("lora") or {}).get("target_modules") or []:
        t = t.lower()
        if "lm_head" in t or t.startswith("output (") or t == "output":
            out.append("lm_head")
        elif "mlp" in t or "w1" in t:
            out += ["gate_proj", "up_proj", "down_proj"] if arch.mlp == "gated" else ["up_proj", "down_proj"]
        elif "output_proj" in t or t.startswith("o_proj"):
            out.append("o_proj")
        elif t.startswith("q"):
            out.append("q_proj")
        elif t.startswith("k"):
            out.append("k_proj")
        elif t.startswith("v"):
            out.append("v_proj")
        else:
            raise ValueError(f"{point['id']}: unknown target {t!r}")
    return tuple(dict.fromkeys(out))


def inputs_for(point: dict[str, Any]) -> EstimateInputs:
    arch = arch_for(point)
    fw_text = point["framework"].lower()
    framework = "torchtune" if "torchtune" in fw_text else "litgpt" if "lit" in fw_text else "hf"
    prec_text = point["precision"].lower()
    if "true" in prec_text or "pure" in prec_text:
        precision = "bf16-true"
    elif "mixed" in prec_text:
        precision = "bf16"
    else:
        precision = "bf16"
    opt_text = point["optimizer"].lower()
    if "8-bit" in opt_text or "8bit" in opt_text:
        optim = "paged_adamw_8bit" if "paged" in opt_text else "adamw_8bit"
    elif "paged" in opt_text:
        optim = "paged_adamw_32bit"
    elif framework == "torchtune":
        optim = "adamw_torch_fused"  # torchtune's recipe configs set `fused: True` on torch.optim.AdamW
    else:
        optim = "adamw_torch"
    q_text = str(point.get("quantization") or "none").lower()
    quant = "nf4" if "nf4" in q_text else "8bit" if "int8" in q_text else "none"
    # torchao NF4 quantizes its block scalers too (double-quant-like)
    double_quant = "double" in q_text or "torchao" in q_text
    lora = point.get("lora") or {}
    extras = point.get("extras") or {}
    method = point["method"]
    return EstimateInputs(
        arch=arch,
        method=method,
        quant=quant,
        double_quant=double_quant,
        rank=int(lora.get("rank") or 8),
        alpha=int(lora.get("alpha") or 16),
        dropout=float(lora.get("dropout") or 0.0),
        targets=targets_for(point, arch) if method != "full" else (),
        batch=int(point["batch_size"]),
        seq_len=int(point["seq_len"]),
        gradient_checkpointing=bool(point.get("gradient_checkpointing")),
        attn="eager" if "eager" in str(point.get("attention_impl")).lower() else "sdpa",
        optim=optim,
        precision=precision,
        framework=framework,
        torch_compile=bool(extras.get("torch_compile", False)),
        chunked_ce=("chunked" in str(extras.get("loss", "")).lower()) if "loss" in extras else None,
        activation_offloading=bool(extras.get("activation_offloading", False)),
        optimizer_in_backward=bool(extras.get("optimizer_in_backward", False))
        or "optimizer_in_bwd=true" in opt_text.replace(" ", ""),
    )


def metric_for(point: dict[str, Any]) -> str:
    text = str(point.get("measured_metric") or "").lower()
    if "allocated" in text or "active" in text:
        return "allocated"
    if "nvidia-smi" in text or "device" in text:
        return "device"
    return "reserved"  # 'reserved', or a type not stated (torchtune tables quote reserved)


def unit_bytes(point: dict[str, Any]) -> float:
    text = str(point.get("unit") or "").lower()
    if text.startswith("gb") or "likely gb" in text:
        return 1e9
    if "gib" in text:
        return float(1 << 30)
    return 1e9


def card_bytes(point: dict[str, Any]) -> Optional[int]:
    card = find_gpu(str(point.get("gpu") or ""))
    if card:
        return int(gpu_table()[card]["memory_mib"]) << 20
    if point.get("gpu_memory_gb"):
        return int(point["gpu_memory_gb"] * 1e9)
    return None


def _summary(errs: list[float]) -> dict[str, Any]:
    errs_sorted = sorted(errs)
    if not errs_sorted:
        return {"n": 0}
    p90 = errs_sorted[min(len(errs_sorted) - 1, int(round(0.9 * (len(errs_sorted) - 1))))]
    return {"n": len(errs_sorted), "median": statistics.median(errs_sorted), "p90": p90}


def public_inputs(point: dict[str, Any], seq_len: int = 2048) -> EstimateInputs:
    from loradoctor.estimate.arch import resolve_arch

    # a model id (config in the HF cache, or a preset), or the shape numbers written into the point (arch_for)
    arch = arch_for(point) if isinstance(point["model"], dict) else resolve_arch(point["model"])
    return make_inputs(arch=arch, framework=point.get("framework", "hf"),
                       method=point.get("method", "lora"), quant=point.get("quant", "none"),
                       rank=int(point.get("rank", 8)), targets=tuple(point.get("targets") or ("q_proj", "v_proj")),
                       batch=int(point.get("batch", 1)), seq_len=seq_len,
                       gradient_checkpointing=bool(point.get("gradient_checkpointing")),
                       offload_checkpoints=point.get("offload_checkpoints"), loss=point.get("loss"),
                       attn=point.get("attn", "sdpa"), optim=point.get("optim", "adamw_torch"),
                       precision=point.get("precision", "bf16"), peft=point.get("peft"),
                       alpha=point.get("alpha"), dropout=point.get("dropout"),
                       gpus=point.get("gpus"), strategy=point.get("strategy"), offload=point.get("offload"),
                       modules_to_save=tuple(point.get("modules_to_save") or ()),
                       reduce_bucket_size=point.get("reduce_bucket_size"), overlap_comm=point.get("overlap_comm"),
                       liger_kernels=point.get("liger"), keep_logits=point.get("keep_logits"),
                       double_quant=point.get("double_quant"), upcast_non_quantized=point.get("upcast_non_quantized"),
                       ia3_feedforward=tuple(point["ia3_feedforward"]) if point.get("ia3_feedforward") else None)


def evaluate_max_context(point: dict[str, Any]) -> dict[str, Any]:
    """The longest sequence (steps of 64) the model says fits the card vs the published longest."""
    from loradoctor.estimate.fit import max_seq_len

    inp = public_inputs(point)
    budget = int(point["card_gib"] * 2**30)
    pred = max_seq_len(inp, budget, step=64, limit_tokens=1 << 21)
    row: dict[str, Any] = {"id": point["id"], "group": point.get("group") or framework_group(inp), "metric": "max seq",
                           "unit": "tok", "predicted": pred, "measured": point.get("published_max_seq_len"),
                           "confidence": point.get("confidence")}
    if point.get("published_max_seq_len") is None:
        # published as out of memory: a hit when no useful length (512 tokens) fits
        row["card_bytes"] = budget
        row["oom_hit"] = pred is None or pred < 512
        row["predicted_device_gib"] = round(estimate(replace(inp, seq_len=512)).device_used_bytes / 2**30, 2)
    else:
        row["error"] = ((pred or 0) - point["published_max_seq_len"]) / point["published_max_seq_len"]
    return row


def evaluate_run(point: dict[str, Any]) -> dict[str, Any]:
    """A whole run described by estimate inputs, measured in bytes (metric: allocated / reserved / device)."""
    inp = public_inputs(point, seq_len=int(point["seq_len"]))
    if point.get("method") == "full":
        inp = replace(inp, targets=())
    est = estimate(inp)
    pred = est.metric(point.get("metric", "allocated"))
    # exact bytes, or a published number in its unit (GB = 1e9, GiB = 2**30, MiB = 2**20)
    unit = {"GiB": 2**30, "MiB": 2**20}.get(str(point.get("unit")), 1e9)
    measured = point.get("measured_bytes") or point["measured_value"] * unit
    # a table that adds up the memory of every GPU of a run (summed_over_gpus: N): the per-GPU mean is compared
    measured /= int(point.get("summed_over_gpus") or 1)
    row: dict[str, Any] = {"id": point["id"], "group": point.get("group") or framework_group(inp),
                           "metric": point.get("metric", "allocated"), "unit": "GB",
                           "predicted": round(pred / 1e9, 2), "measured": round(measured / 1e9, 2),
                           "confidence": point.get("confidence"),
                           "error": (pred - measured) / measured}
    reported = point.get("trainable_params_reported")
    if reported is not None and reported != est.trainable_params:
        row["trainable_params_mismatch"] = (est.trainable_params, reported)
    return row


def evaluate_loss_op(point: dict[str, Any]) -> Optional[dict[str, Any]]:
    """One loss computation alone: the model's loss term, less the hidden states that exist before the op (the
    op's input), plus the classifier's gradient when the benchmark trains it (after the peak for the standard
    loss: logits' gradient + classifier gradient is the later moment)."""
    try:
        from loradoctor.estimate.losses import loss_peak_bytes
    except ImportError:
        return None  # a model version without loss kernels
    a = 2 if point.get("dtype", "bf16") in ("bf16", "fp16") else 4
    t, h, v = point["tokens"], point["hidden"], point["vocab"]
    kind = point["loss"]
    peak = loss_peak_bytes(kind, 8 if kind == "chunked" else 0, t, h, v, a, a, softcap=bool(point.get("softcap")))
    classifier = v * h * a if point.get("classifier_grad") else 0
    if kind == "standard":
        pred = max(peak, a * t * v + classifier)
    else:
        pred = peak - (a * h * t if kind == "cce" else 0) + classifier
    pred_mib = pred / 2**20
    return {"id": point["id"], "group": point.get("group", "cce-kernel"), "metric": "loss op", "unit": "MiB",
            "predicted": round(pred_mib, 1), "measured": point["measured_mib"], "confidence": point.get("confidence"),
            "error": (pred_mib - point["measured_mib"]) / point["measured_mib"]}


def evaluate(truth_path: Path) -> dict[str, Any]:
    import yaml

    data = yaml.safe_load(truth_path.read_text())
    rows: list[dict[str, Any]] = []
    for point in data["points"]:
        kind = point.get("kind")
        if kind in ("max_context", "run"):
            row_pt = evaluate_max_context(point) if kind == "max_context" else evaluate_run(point)
            if point.get("not_scored"):
                # a run the inputs cannot describe (a software version the model does not cover): shown, not counted
                row_pt["not_scored"] = str(point["not_scored"])
                row_pt["error_not_scored"] = row_pt.pop("error", None)
                row_pt.pop("oom_hit", None)
            rows.append(row_pt)
            continue
        if kind == "loss_op":
            row_op = evaluate_loss_op(point)
            if row_op is not None:
                rows.append(row_op)
            continue
        inp = inputs_for(point)
        est = estimate(inp)
        metric = metric_for(point)
        unit = unit_bytes(point)
        pred = est.metric(metric) / unit
        row: dict[str, Any] = {"id": point["id"], "group": framework_group(inp), "metric": metric,
                               "unit": "GB" if unit == 1e9 else "GiB",
                               "predicted": round(pred, 2), "measured": point.get("measured_gb"),
                               "confidence": point.get("confidence")}
        if point.get("measured_gb") is None:
            card = card_bytes(point)
            row["card_bytes"] = card
            row["oom_hit"] = None if card is None else est.device_used_bytes > card
            row["predicted_device_gib"] = round(est.device_used_bytes / 2**30, 2)
        else:
            row["error"] = (pred - point["measured_gb"]) / point["measured_gb"]
        rows.append(row)
    errs = [abs(r["error"]) for r in rows if "error" in r]
    ooms = [r for r in rows if "oom_hit" in r]
    unscored = [r for r in rows if "not_scored" in r]
    by_group: dict[str, list[float]] = {}
    by_old_group: dict[str, list[float]] = {}
    for r in rows:
        if "error" in r:
            by_group.setdefault(r["group"], []).append(abs(r["error"]))
            old = r["id"].split("-")[0] + ("-qlora" if ("nf4" in r["id"] or "qlora" in r["id"]) else "")
            by_old_group.setdefault(old, []).append(abs(r["error"]))
    overall = _summary(errs)
    return {
        "truth": str(truth_path),
        "by_group": {g: _summary(v) for g, v in sorted(by_group.items())},
        "median_abs_error_by_group": {g: statistics.median(v) for g, v in sorted(by_old_group.items())},
        "points": rows,
        "n_measured": len(errs),
        "median_abs_error": overall.get("median"),
        "p90_abs_error": overall.get("p90"),
        "mean_signed_error": statistics.mean(r["error"] for r in rows if "error" in r) if errs else None,
        "oom_points": len(ooms),
        "oom_hits": sum(1 for r in ooms if r["oom_hit"]),
        "not_scored": len(unscored),
    }


def speed(repeats: int = 9) -> dict[str, float]:
    """Wall time of the estimate command (with --gpu, so the what-if search runs) and of a bare interpreter
    start. The minimum over runs is the figure that counts: on a shared machine the median carries the noise
    of whatever else runs."""
    # An installed package runs from cached bytecode; this checkout may run with PYTHONDONTWRITEBYTECODE, which
    # would recompile every module on every start. Cache bytecode outside the tree and warm it up once.
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = os.path.join(tempfile.gettempdir(), "loradoctor-bench-pycache")

    import resource

    cpu: dict[str, float] = {}

    def timed(args: list[str], name: str) -> list[float]:
        subprocess.run(args, capture_output=True, cwd=str(ROOT), check=False, env=env)  # warm-up
        times = []
        for _ in range(repeats):
            r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            subprocess.run(args, capture_output=True, cwd=str(ROOT), check=False, env=env)
            times.append(time.perf_counter() - t0)
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            used = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
            cpu[name] = min(cpu.get(name, used), used)
        return times

    # CPU time (user + system of the child) is reported too: on a loaded shared machine wall time mostly
    # measures the wait for a core
    bare = timed([sys.executable, "-c", "pass"], "bare")
    cli = timed([sys.executable, "-m", "loradoctor", "--version"], "cli")  # the CLI skeleton, no command
    cmd = timed([sys.executable, "-m", "loradoctor", "estimate", "--model", "meta-llama/Llama-3.1-8B",
                 "--method", "qlora", "--gradient-checkpointing", "--gpu", "RTX 4090", "--format", "json"], "estimate")
    return {"bare_python_min_s": min(bare), "cli_version_min_s": min(cli), "estimate_min_s": min(cmd),
            "bare_python_median_s": statistics.median(bare), "estimate_median_s": statistics.median(cmd),
            "estimate_minus_bare_s": min(cmd) - min(bare),
            "bare_python_cpu_s": cpu["bare"], "estimate_cpu_s": cpu["estimate"],
            "estimate_minus_bare_cpu_s": cpu["estimate"] - cpu["bare"]}


def _print(result: dict[str, Any]) -> None:
    print(f"== {result['truth']}")
    print(f"{'point':48} {'metric':9} {'unit':4} {'pred':>9} {'meas':>9} {'error':>7}")
    for r in result["points"]:
        if "error" in r:
            pred = "none" if r["predicted"] is None else r["predicted"]
            print(f"{r['id']:48} {r['metric']:9} {r['unit']:4} {pred:>9} {r['measured']:>9} {r['error']:+7.1%}")
        elif "not_scored" in r:
            err = r.get("error_not_scored")
            shown = "" if err is None else f"{err:+7.1%}"
            print(f"{r['id']:48} {r['metric']:9} {r['unit']:4} {str(r['predicted']):>9} {str(r['measured']):>9} {shown} "
                  f"(not scored: {r['not_scored'][:60]})")
        else:
            verdict = "?" if r["oom_hit"] is None else ("OOM predicted (hit)" if r["oom_hit"] else "fit predicted (MISS)")
            card = "?" if r["card_bytes"] is None else f"{r['card_bytes'] / 2**30:.1f} GiB card"
            print(f"{r['id']:48} {'OOM':9} {'':4} {r['predicted_device_gib']:8.2f}G {'':>9} {verdict} ({card})")
    print()
    if result["n_measured"]:
        print(f"measured points: {result['n_measured']}  median |error|: {result['median_abs_error']:.1%}  "
              f"p90 |error|: {result['p90_abs_error']:.1%}  mean signed error: {result['mean_signed_error']:+.1%}")
    print(f"OOM points: {result['oom_points']}, predicted as OOM: {result['oom_hits']}")
    print("by framework group (n, median |error|, p90 |error|): " + "; ".join(
        f"{g} n={v['n']} {v['median']:.1%} / {v['p90']:.1%}" for g, v in result["by_group"].items()))
    print()


# the framework groups issue 13 asks the accuracy of, each with the truth-file groups it is made of
ISSUE_GROUPS = {"hf": ["hf", "hf-multi-gpu", "peft-methods", "liger"], "unsloth": ["unsloth"],
                "axolotl+cce": ["axolotl-cce"], "litgpt": ["litgpt"], "torchtune": ["torchtune"]}


def _print_issue_groups(results: list[dict]) -> None:
    """One line over every truth file: the issue's groups, a group without a measured point named as such."""
    parts = []
    for name, members in ISSUE_GROUPS.items():
        errors = [abs(r["error"]) for res in results for r in res["points"] if r["group"] in members and "error" in r]
        if not errors:
            parts.append(f"{name}: no measured point")
            continue
        summary = _summary(errors)
        parts.append(f"{name} n={len(errors)} {summary['median']:.1%} / {summary['p90']:.1%}")
    print("issue 13 groups, all truth files (n, median |error|, p90 |error|): " + "; ".join(parts))
    print()


def main(argv: list[str]) -> int:
    as_json = "--json" in argv
    args = [a for a in argv if not a.startswith("--")]
    truths = [Path(a) for a in args] or [DEFAULT_TRUTH, PUBLIC_TRUTH]
    results = [evaluate(t) for t in truths]
    out: dict[str, Any] = {"results": results}
    if "--no-speed" not in argv:
        out["speed"] = speed()
    if as_json:
        print(json.dumps(out, indent=2))
        return 0
    for result in results:
        _print(result)
    _print_issue_groups(results)
    if "speed" in out:
        s = out["speed"]
        print(f"speed (min of runs): estimate {s['estimate_min_s']:.3f}s, bare python {s['bare_python_min_s']:.3f}s, "
              f"difference {s['estimate_minus_bare_s']:.3f}s (target < 0.3 s); medians "
              f"{s['estimate_median_s']:.3f}s / {s['bare_python_median_s']:.3f}s; `loradoctor --version` (CLI "
              f"skeleton) {s['cli_version_min_s']:.3f}s; CPU time estimate {s['estimate_cpu_s']:.3f}s, bare "
              f"{s['bare_python_cpu_s']:.3f}s, difference {s['estimate_minus_bare_cpu_s']:.3f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
