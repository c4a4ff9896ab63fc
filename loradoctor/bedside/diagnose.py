"""Timeline -> findings. Pure: a `Timeline` in, `Finding`s out, every number quoted with the
timeline line it comes from, so a recorded run is diagnosed the same on any machine.

Causes only a timeline can show (docs/causes.md):
- oom.leak              memory the run holds rises step after step (allocated, not only the cache)
- oom.other_process     another process took GPU memory during the run (when, how much, which PID)
- oom.host_ram          the process tree's RSS approached the host's RAM (workers named)
- slow.dataloader       the GPU waits: low utilisation while the input pipeline is saturated
- slow.host_sync        the GPU waits: low utilisation while the main process is busy and workers idle
- slow.attention_fallback  eager / math attention on a card and dtype that have a fused kernel
- slow.qlora_unneeded   4-bit QLoRA where bf16 LoRA fits with room to spare
- hw.thermal_power      clocks throttled for heat or power during the run
"""

from __future__ import annotations

import statistics
from typing import Any, Callable, Optional

from loradoctor.bedside.timeline import Timeline
from loradoctor.findings import Evidence, Finding, Fix
from loradoctor.units import GIB, MIB
from loradoctor.units import format_bytes as gib  # '310 MiB', '10.20 GiB': the project's one byte formatter

MIN_SAMPLES_SLOW = 30         # a slow-training verdict needs at least this many samples in the steady part
LOW_UTIL = 50                 # median GPU utilisation (%) below which the GPU is said to wait
BUSY_CPU = 80                 # % of one core: a process this busy is the bottleneck candidate
OTHER_PROCESS_MIN = 1 * GIB   # memory another process must hold to matter
THROTTLE_SHARE = 0.10         # share of busy samples with a heat / power slowdown that makes a finding
HOT_REASONS = ("hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")


def clock(tl: Timeline, t: Optional[float]) -> str:
    """'+1:02:03' from the start of the run."""
    start = tl.start()
    if t is None or start is None:
        return "?"
    s = max(0, int(t - start))
    return f"+{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _ev(tl: Timeline, record: dict, text: str) -> Evidence:
    return Evidence(file=tl.name, line=record.get("_line"), text=f"{clock(tl, record.get('t'))} {text}")


def _num(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if value == value and abs(value) != float("inf") else None


def _steady(records: list[dict]) -> list[dict]:
    """Drop the first 10% (start-up: model load, first compilation, warm-up)."""
    return records[len(records) // 10:]


def _ours(g: dict) -> Optional[int]:
    procs = g.get("procs")
    if not procs:
        return None
    return sum(int(p.get("used_bytes") or 0) for p in procs if p.get("ours"))


def _crashed(tl: Timeline) -> bool:
    end = tl.end or {}
    code = end.get("exit_code")
    return bool(end.get("signal")) or (isinstance(code, int) and code != 0) or any(
        e.get("name") == "exception" for e in tl.events)


def _killed(tl: Timeline) -> bool:
    end = tl.end or {}
    return end.get("signal") in (9, "SIGKILL") or end.get("exit_code") in (137, -9)


# ------------------------------------------------------------------------------------------
# memory

def memory_series(tl: Timeline) -> tuple[str, list[tuple[dict, float]]]:
    """The best series of the memory this run holds: the callback's allocated bytes per step, else the
    GPU memory our processes hold per sample, else (one process on the GPU) the GPU's used memory."""
    steps = [(r, _num(r.get("allocated_bytes"))) for r in tl.steps]
    steps = [(r, v) for r, v in steps if v is not None]
    if len(steps) >= 8:
        return "allocated", steps
    ours = []
    for r in tl.samples:
        for g in r.get("gpus", ())[:1]:
            v = _ours(g)
            if v is None and not g.get("procs"):
                v = _num(g.get("used_bytes"))
            if v is not None:
                ours.append((r, float(v)))
    return "gpu_used", ours


def _quartile_medians(values: list[float]) -> list[float]:
    n = len(values)
    return [statistics.median(values[i * n // 4:(i + 1) * n // 4]) for i in range(4)]


def check_leak(tl: Timeline) -> list[Finding]:
    kind, series = memory_series(tl)
    series = _steady(series)
    if len(series) < 8:
        return []
    values = [v for _, v in series]
    q = _quartile_medians(values)
    card = tl.card_bytes() or 0
    rise = q[3] - q[0]
    if not (q[0] < q[1] < q[2] < q[3]) or rise < max(256 * MIB, 0.05 * card):
        return []
    first, last = series[0], series[-1]
    per = ""
    if kind == "allocated":
        s0, s1 = _num(first[0].get("step")), _num(last[0].get("step"))
        if s0 is not None and s1 is not None and s1 > s0:
            per = f", about {gib((last[1] - first[1]) / (s1 - s0) * 100)} per 100 steps"
    crashed = _crashed(tl)
    full = card and max(values) >= 0.9 * card
    what = "allocated by PyTorch" if kind == "allocated" else "held on the GPU by this run"
    f = Finding(
        cause="oom.leak", rule="timeline-memory-rises", severity="error" if crashed and full else "warning",
        confidence=0.85 if kind == "allocated" else 0.6,
        title="Memory rises step after step: something keeps tensors alive across steps",
        summary=(f"Memory {what} went from {gib(first[1])} to {gib(last[1])} over the run{per}; every quarter of "
                 f"the run holds more than the one before"
                 + (f", and it reached {gib(max(values))} of the {gib(card)} card." if card else ".")),
        evidence=[_ev(tl, first[0], f"{gib(first[1])} {what}"), _ev(tl, last[0], f"{gib(last[1])} {what}")],
        facts={"timeline.memory_series": kind, "timeline.memory_rise_bytes": int(rise),
               "timeline.memory_first_bytes": int(first[1]), "timeline.memory_last_bytes": int(last[1])},
        fixes=[Fix("Accumulate plain numbers, not tensors: `total_loss += loss.item()` (or `loss.detach()`), never `loss` itself."),
               Fix("Keep no outputs, logits or hidden states in lists across steps; in evaluation set "
                   "`eval_accumulation_steps` so predictions move to the CPU.", "eval_accumulation_steps: 8"),
               Fix("Find what holds them: record the allocator's history and open it in https://pytorch.org/memory_viz.",
                   "torch.cuda.memory._record_memory_history(max_entries=100000)")],
        area="oom",
    )
    if kind == "gpu_used":
        f.summary += (" This is the memory NVML sees (allocated plus the allocator's cache); the cache can also grow "
                      "when sequence lengths vary. The callback's per-step allocated memory tells the two apart.")
    return [f]


def check_other_process(tl: Timeline) -> list[Finding]:
    first_seen: dict[int, dict] = {}
    biggest: dict[int, tuple[dict, int, int]] = {}
    unattributed: Optional[tuple[dict, int]] = None
    for r in tl.samples:
        for g in r.get("gpus", ()):
            procs = g.get("procs") or []
            for p in procs:
                pid, used = p.get("pid"), int(p.get("used_bytes") or 0)
                if p.get("ours") or not isinstance(pid, int) or used < OTHER_PROCESS_MIN:
                    continue
                first_seen.setdefault(pid, r)
                if used > biggest.get(pid, (None, 0, 0))[1]:
                    biggest[pid] = (r, used, int(g.get("index", 0)))
            ours = _ours(g)
            used = _num(g.get("used_bytes"))
            if procs and ours is not None and used is not None:
                listed = sum(int(p.get("used_bytes") or 0) for p in procs)
                hidden = int(used - listed)
                if hidden >= 2 * OTHER_PROCESS_MIN and (unattributed is None or hidden > unattributed[1]):
                    unattributed = (r, hidden)
    out = []
    crashed = _crashed(tl)
    start = tl.samples[0] if tl.samples else None
    for pid, (r, used, index) in sorted(biggest.items(), key=lambda kv: -kv[1][1])[:3]:
        seen = first_seen[pid]
        during = start is not None and seen is not start
        when = f"appeared at {clock(tl, seen.get('t'))}, after the run started" if during else "was there from the start"
        out.append(Finding(
            cause="oom.other_process", rule="timeline-other-process", severity="error" if crashed else "warning",
            confidence=0.85 if during else 0.75,
            title=f"Another process (PID {pid}) held {gib(used)} on GPU {index} during the run",
            summary=f"PID {pid} is not part of this run; it {when} and held up to {gib(used)}.",
            evidence=[_ev(tl, seen, f"GPU {index}: PID {pid} (not ours) holds memory"),
                      _ev(tl, r, f"GPU {index}: PID {pid} holds {gib(used)}")],
            facts={"timeline.other_pid": pid, "timeline.other_bytes": used, "timeline.other_appeared_during": during},
            fixes=[Fix(f"See what PID {pid} is, and stop it if it is an old run or a notebook kernel.",
                       f"ps -o pid,user,etime,cmd -p {pid}; kill {pid}"),
                   Fix("Give each job its own GPU.", "CUDA_VISIBLE_DEVICES=1 python train.py")],
            area="oom"))
    if not out and unattributed is not None:
        r, hidden = unattributed
        out.append(Finding(
            cause="oom.other_process", rule="timeline-unlisted-memory", severity="warning", confidence=0.4,
            title=f"{gib(hidden)} of GPU memory is in use by processes this run cannot see",
            summary=("NVML reports more memory in use than the processes it lists hold: a process in another container "
                     "or PID namespace is likely using this GPU (a guess: the driver's own reservations are usually "
                     "under 1 GiB)."),
            evidence=[_ev(tl, r, f"{gib(hidden)} in use beyond the listed processes")],
            facts={"timeline.unlisted_bytes": hidden},
            fixes=[Fix("On the host, list every process on the GPU.", "nvidia-smi --query-compute-apps=pid,used_memory --format=csv")],
            area="oom"))
    return out


def check_host_ram(tl: Timeline) -> list[Finding]:
    total = _num(tl.meta.get("host_ram_bytes"))
    rows = [(r, _num((r.get("host") or {}).get("rss_bytes"))) for r in tl.samples]
    rows = [(r, v) for r, v in rows if v]
    if not rows:
        return []
    peak_r, peak = max(rows, key=lambda rv: rv[1])
    killed = _killed(tl)
    share = peak / total if total else None
    if not (killed and share is not None and share >= 0.6) and not (share is not None and share >= 0.85):
        return []
    workers = (peak_r.get("host") or {}).get("workers") or []
    named = ", ".join(f"{w.get('name', '?')} (PID {w.get('pid')}) {gib(w.get('rss_bytes') or 0)}" for w in workers[:3])
    first = rows[0]
    return [Finding(
        cause="oom.host_ram", rule="timeline-host-ram", severity="error" if killed else "warning",
        confidence=0.85 if killed else 0.6,
        title=f"The run's processes used {gib(peak)} of {gib(total)} host RAM" + (" and were killed" if killed else ""),
        summary=(f"The process tree's resident memory grew from {gib(first[1])} to {gib(peak)} "
                 f"({share:.0%} of the host's RAM)" + (f"; the largest children: {named}." if named else ".")),
        evidence=[_ev(tl, first[0], f"process tree RSS {gib(first[1])}"),
                  _ev(tl, peak_r, f"process tree RSS {gib(peak)}" + (f"; workers: {named}" if named else ""))],
        facts={"timeline.peak_rss_bytes": int(peak), "timeline.host_ram_bytes": int(total or 0)},
        fixes=[Fix("Use fewer dataloader workers (each holds a copy of what the dataset object keeps).",
                   "dataloader_num_workers: 2"),
               Fix("Stream or memory-map the dataset instead of loading it into Python objects.",
                   "load_dataset(..., streaming=True)"),
               Fix("Load the model with low_cpu_mem_usage / a device_map so weights do not pass through RAM twice.")],
        area="oom")]


# ------------------------------------------------------------------------------------------
# slow training

def _busy_samples(tl: Timeline) -> list[dict]:
    return [r for r in _steady(tl.samples) if r.get("gpus") and r.get("host")]


def _util(r: dict) -> Optional[float]:
    vals = [_num(g.get("util_pct")) for g in r.get("gpus", ())]
    vals = [v for v in vals if v is not None]
    return max(vals) if vals else None


def check_gpu_waits(tl: Timeline) -> list[Finding]:
    rows = [r for r in _busy_samples(tl) if _util(r) is not None]
    if len(rows) < MIN_SAMPLES_SLOW or _crashed(tl) and len(rows) < 2 * MIN_SAMPLES_SLOW:
        return []
    util = statistics.median(_util(r) for r in rows)
    if util >= LOW_UTIL:
        return []
    main = statistics.median(_num(r["host"].get("main_cpu_pct")) or 0 for r in rows)
    n_workers = statistics.median(len(r["host"].get("workers") or []) for r in rows)
    worker_cpu = statistics.median(
        (sum(_num(w.get("cpu_pct")) or 0 for w in r["host"].get("workers") or []) / max(1, len(r["host"].get("workers") or [])))
        for r in rows)
    mid = rows[len(rows) // 2]
    ev = [_ev(tl, mid, f"GPU utilisation {_util(mid):.0f}%, main process CPU {mid['host'].get('main_cpu_pct', 0)}%, "
                       f"{len(mid['host'].get('workers') or [])} worker processes")]
    facts = {"timeline.median_util_pct": util, "timeline.main_cpu_pct": main, "timeline.workers": n_workers,
             "timeline.worker_cpu_pct": round(worker_cpu, 1)}
    tell = ("What tells them apart: time one step with the batch already on the GPU (reuse one batch); if the step "
            "gets fast, the input pipeline is the bottleneck.")
    if n_workers == 0 and main >= BUSY_CPU or n_workers > 0 and worker_cpu >= BUSY_CPU:
        return [Finding(
            cause="slow.dataloader", rule="timeline-gpu-waits-for-data", severity="warning", confidence=0.55,
            title=f"The GPU waits for data: median utilisation {util:.0f}% while the input pipeline is saturated",
            summary=(f"GPU utilisation stayed at a median of {util:.0f}% while "
                     + ("the main process, with no dataloader workers, used a full core" if n_workers == 0 else
                        f"{n_workers:.0f} dataloader workers each used {worker_cpu:.0f}% of a core")
                     + ". Other possible cause: host-device synchronisations in the loop (slow.host_sync). " + tell),
            evidence=ev, facts=facts,
            fixes=[Fix("Load batches in parallel and keep them pinned.", "dataloader_num_workers: 4\ndataloader_pin_memory: true"),
                   Fix("Tokenize once before training (datasets .map with batched=True), not in the collate function.")],
            area="slow")]
    if main >= BUSY_CPU:
        return [Finding(
            cause="slow.host_sync", rule="timeline-gpu-waits-for-host", severity="warning", confidence=0.45,
            title=f"The GPU waits for the main process: median utilisation {util:.0f}%, main process busy, workers idle",
            summary=(f"GPU utilisation stayed at a median of {util:.0f}% while the main process used {main:.0f}% of a core "
                     f"and the dataloader workers were nearly idle: the loop does CPU work or waits on the GPU every step "
                     "(`.item()`, `.cpu()`, printing tensors, `torch.cuda.synchronize()`, logging every step). "
                     "Other possible cause: collation in the main process (slow.dataloader). " + tell),
            evidence=ev, facts=facts,
            fixes=[Fix("Find the synchronising calls: make them warn.", "torch.cuda.set_sync_debug_mode('warn')"),
                   Fix("Log less often and keep metrics as tensors until logging.", "logging_steps: 50")],
            area="slow")]
    return []


def check_throttling(tl: Timeline) -> list[Finding]:
    rows = [r for r in _busy_samples(tl) if (_util(r) or 0) >= 30]
    if len(rows) < 10:
        return []
    hot = [r for r in rows if any(set(g.get("throttle") or ()) & set(HOT_REASONS) for g in r.get("gpus", ()))]
    if len(hot) < THROTTLE_SHARE * len(rows):
        return []
    reasons = sorted({n for r in hot for g in r.get("gpus", ()) for n in (g.get("throttle") or ()) if n in HOT_REASONS})
    temps = [_num(g.get("temp_c")) for r in hot for g in r.get("gpus", ())]
    temps = [t for t in temps if t is not None]
    r0 = hot[0]
    return [Finding(
        cause="hw.thermal_power", rule="timeline-throttling", severity="warning", confidence=0.8,
        title=f"The GPU throttled in {len(hot) / len(rows):.0%} of busy samples ({', '.join(reasons)})",
        summary=("Clocks were reduced for heat or power while the GPU was busy"
                 + (f"; temperature up to {max(temps):.0f} C." if temps else ".")
                 + " Steps take longer, and a card that keeps hitting these limits can reset."),
        evidence=[_ev(tl, r0, "throttle: " + ", ".join(n for g in r0.get("gpus", ()) for n in g.get("throttle") or ()))],
        facts={"timeline.throttled_share": round(len(hot) / len(rows), 3), "timeline.throttle_reasons": reasons},
        fixes=[Fix("Check airflow, fans and the power supply; watch clocks and reasons live.",
                   "nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER"),
               Fix("Cap the power a little to stay below the limit that throttles.", "sudo nvidia-smi -pl 300")],
        area="hw")]


def _pre(tl: Timeline) -> dict:
    return tl.preflight[-1] if tl.preflight else {}


def check_attention(tl: Timeline) -> list[Finding]:
    p = _pre(tl)
    impl = str(p.get("attn_implementation") or "").lower()
    cc = _num(p.get("gpu_cc"))
    dtype = str(p.get("compute_dtype") or "").lower()
    half = dtype in ("bfloat16", "float16", "torch.bfloat16", "torch.float16", "bf16", "fp16")
    if not impl or cc is None:
        return []
    ev = [_ev(tl, p, f"attn_implementation={impl}, compute capability {cc:.1f}, compute dtype {dtype or 'unknown'}")]
    if impl == "eager" and cc >= 7.5:
        return [Finding(
            cause="slow.attention_fallback", rule="timeline-eager-attention", severity="warning", confidence=0.8,
            title="Attention runs the eager (unfused) path on a GPU that has a fused kernel",
            summary=("The model uses eager attention: the full attention matrix is built in memory and softmaxed in "
                     "fp32, slower and quadratic in memory with the sequence length. This GPU supports sdpa"
                     + (" and FlashAttention 2." if cc >= 8.0 else ".")),
            evidence=ev, facts={"timeline.attn_implementation": impl},
            fixes=[Fix("Load the model with a fused attention.",
                       'AutoModelForCausalLM.from_pretrained(..., attn_implementation="sdpa")')],
            area="slow")]
    if impl == "sdpa" and cc >= 8.0 and not half:
        return [Finding(
            cause="slow.attention_fallback", rule="timeline-sdpa-math", severity="warning", confidence=0.6,
            title="sdpa falls back to its math path: the compute dtype is not fp16 / bf16",
            summary="PyTorch's flash and memory-efficient sdpa kernels need half precision; in fp32 sdpa runs the math path.",
            evidence=ev, facts={"timeline.attn_implementation": impl},
            fixes=[Fix("Train in bf16.", "bf16: true")], area="slow")]
    return []


def check_qlora_unneeded(tl: Timeline) -> list[Finding]:
    p = _pre(tl)
    if str(p.get("quantization") or "").lower() not in ("4bit", "nf4", "fp4", "8bit"):
        return []
    bf16 = _num(p.get("estimate_bf16_lora_bytes"))
    card = _num(p.get("gpu_total_bytes")) or tl.card_bytes()
    if not bf16 or not card or bf16 > 0.7 * card:
        return []
    return [Finding(
        cause="slow.qlora_unneeded", rule="timeline-qlora-unneeded", severity="info", confidence=0.7,
        title=f"QLoRA on a card where bf16 LoRA fits: about {gib(bf16)} of {gib(card)}",
        summary=("The base model is quantized, and every step dequantizes its weights (typically 20-40% slower), "
                 f"while the estimate for the same run in bf16 LoRA is {gib(bf16)}, leaving {gib(card - bf16)} free."),
        evidence=[_ev(tl, p, f"quantization {p.get('quantization')}; bf16 LoRA estimate {gib(bf16)}; card {gib(card)}")],
        facts={"timeline.bf16_estimate_bytes": int(bf16), "timeline.card_bytes": int(card)},
        fixes=[Fix("Load the base model in bf16 and drop the quantization config.", "load_in_4bit: false\nbf16: true")],
        area="slow")]


def check_preflight_warnings(tl: Timeline) -> list[Finding]:
    """What the callback found wrong with the real objects at train begin."""
    p = _pre(tl)
    out = []
    if p.get("trainable_params") == 0:
        out.append(Finding(
            cause="loss.flat", rule="timeline-nothing-trainable", severity="error", confidence=0.95,
            title="No parameter is trainable: the loss cannot move",
            summary=f"The model has {p.get('total_params', 0):,} parameters and none requires grad.",
            evidence=[_ev(tl, p, "trainable parameters: 0")],
            fixes=[Fix("Wrap the model with PEFT before training.", "model = get_peft_model(model, lora_config)")],
            area="loss"))
    if p.get("quantization_requested") and not p.get("quantization"):
        out.append(Finding(
            cause="oom.model_load", rule="timeline-quantization-not-applied", severity="warning", confidence=0.8,
            title="Quantization was requested but no linear layer is quantized",
            summary="The model has a quantization config, yet no 4-bit / 8-bit linear layer was found: it is in 16 bit, "
                    "using 3-4 times the memory the plan assumed.",
            evidence=[_ev(tl, p, f"quantization requested: {p.get('quantization_requested')}; quantized linear layers: 0")],
            fixes=[Fix("Check that bitsandbytes imports on this GPU.", "loradoctor env --want bnb")], area="oom"))
    return out


CHECKS: tuple[Callable[[Timeline], list[Finding]], ...] = (
    check_leak, check_other_process, check_host_ram, check_gpu_waits, check_throttling, check_attention,
    check_qlora_unneeded, check_preflight_warnings)


def timeline_findings(tl: Timeline) -> list[Finding]:
    """Every check over the timeline; a check that fails becomes an internal note, never a user cause."""
    out: list[Finding] = []
    for check in CHECKS:
        try:
            out.extend(check(tl))
        except Exception as exc:  # noqa: BLE001 - one broken check must not hide the others
            out.append(Finding(cause="internal.check_failed", rule=check.__name__, severity="info", confidence=1.0,
                               title=f"could not check: {check.__name__}: {type(exc).__name__}: {exc}"[:200], area="internal"))
    return out


# Causes that only a timeline shows (no log line names them): the rule-coverage tests accept these
# from the timeline checks, whose fixtures are fixtures/timelines/*.jsonl.
TIMELINE_ONLY_CAUSES = ("slow.qlora_unneeded",)

ROOT_OF_OOM = ("oom.leak", "oom.other_process", "oom.host_ram")


def combine(log_findings: list[Finding], tl_findings: list[Finding]) -> list[Finding]:
    """One ranked list: a timeline root cause of memory (leak, another process, host RAM) outranks the
    log's generic OOM reading, which becomes its consequence; slow-training notes follow the errors."""
    from loradoctor.findings import SEVERITY_WEIGHT

    roots = [f for f in tl_findings if f.cause in ROOT_OF_OOM and f.severity in ("error", "warning")]
    generic = {"oom.capacity", "oom.fragmentation", "oom.host_ram", "oom.other_process"}
    if roots and log_findings and log_findings[0].cause.startswith("oom."):
        top = roots[0]
        same = [f for f in log_findings if f.cause == top.cause]
        if same:  # the log already names it: the timeline adds its numbers to that finding
            same[0].evidence.extend(top.evidence)
            same[0].facts.update(top.facts)
            tl_findings = [f for f in tl_findings if f is not top]
        else:
            top.severity = "error"
            top.why_rank = f"first: the timeline shows it ({top.evidence[-1].text}); the log only shows the OOM it led to"
            for f in log_findings:
                if f.cause in generic and f.consequence_of is None:
                    f.consequence_of = top.rule
            ordered = [top] + log_findings + [f for f in tl_findings if f is not top]
            for i, f in enumerate(ordered, 1):
                f.rank = i
            return ordered
    rest = sorted(tl_findings, key=lambda f: (-SEVERITY_WEIGHT[f.severity], -f.confidence))
    errors = [f for f in rest if f.severity == "error"]
    ordered = errors + log_findings + [f for f in rest if f.severity != "error"]
    for i, f in enumerate(ordered, 1):
        f.rank = i
    return ordered
