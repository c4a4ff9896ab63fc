"""Views of an env report: the one-line verdict, a short summary of the snapshot by area, and the
findings (printed with the shared renderers in terminal.py / markdown.py / json.py)."""

from __future__ import annotations

from typing import Any, Iterable

from loradoctor.findings import Finding
from loradoctor.units import format_bytes

AREA_ORDER = ("driver", "gpu", "torch", "packages", "settings", "health", "system")
AREA_TITLES = {"driver": "NVIDIA driver", "gpu": "GPUs", "torch": "torch", "packages": "packages",
               "settings": "settings", "health": "GPU health", "system": "host"}


def counts(findings: Iterable[Finding]) -> dict[str, int]:
    out = {"error": 0, "warning": 0, "info": 0}
    for f in findings:
        out[f.severity] += 1
    return out


def _remembered(section: dict) -> str:
    """' [remembered ...]' when a healthy probe result was reused (env/probes/remember.py)."""
    rec = (section.get("probe") or {}).get("remembered") if isinstance(section.get("probe"), dict) else None
    if not isinstance(rec, dict):
        return ""
    age_s = int(rec.get("age_s") or 0)
    age = f"{age_s // 3600} h" if age_s >= 3600 else (f"{age_s // 60} min" if age_s >= 60 else f"{age_s} s")
    return f" [probe result remembered {age} ago, install unchanged; --fresh re-probes]"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def verdict(snapshot: dict, findings: list[Finding]) -> str:
    """'1 error, 2 warnings: torch is a CPU-only build ...' or 'No problems found: ...'."""
    c = counts(findings)
    worst = [f for f in findings if f.severity in ("error", "warning")]
    if worst:
        parts = [_plural(c["error"], "error")] if c["error"] else []
        if c["warning"]:
            parts.append(_plural(c["warning"], "warning"))
        return f"{', '.join(parts)}: {worst[0].title}"
    return f"No problems found: {_machine_line(snapshot)}"


def _machine_line(snapshot: dict) -> str:
    nv = snapshot.get("nvidia") if isinstance(snapshot.get("nvidia"), dict) else {}
    gpus = nv.get("gpus") or []
    t = snapshot.get("torch") if isinstance(snapshot.get("torch"), dict) else {}
    gpu_text = f"{_plural(len(gpus), 'GPU')} ({gpus[0].get('name')})" if gpus else "no NVIDIA GPU"
    torch_text = f"torch {t.get('version')}" if t.get("version") else "no torch"
    return f"{gpu_text}, {torch_text}"


def could_not_check(snapshot: dict) -> list[tuple[str, str]]:
    """(section, reason) for every probe that failed, timed out or was skipped."""
    out = []
    for key in ("system", "nvidia", "torch", "packages", "env_vars", "bitsandbytes", "flash_attn"):
        sec = snapshot.get(key)
        if isinstance(sec, dict) and sec.get("error"):
            out.append((key, str(sec["error"]).replace("could not check: ", "")))
    return out


def summary_lines(snapshot: dict) -> list[tuple[str, str]]:
    """(label, text) lines describing the machine, for the terminal and Markdown views."""
    lines: list[tuple[str, str]] = []
    s = snapshot.get("system") if isinstance(snapshot.get("system"), dict) else {}
    if s and "error" not in s:
        bits = [s.get("os") or "?", f"Python {s.get('python', '?')}"]
        if s.get("wsl"):
            bits.append("WSL2")
        if s.get("container"):
            bits.append(f"container ({s.get('container_kind') or '?'})")
        if s.get("ram_total_bytes"):
            bits.append(f"RAM {format_bytes(s['ram_total_bytes'])}")
        if s.get("shm_bytes") is not None:
            bits.append(f"/dev/shm {format_bytes(s['shm_bytes'])}")
        if s.get("disk_free_cwd_bytes") is not None:
            bits.append(f"disk free {format_bytes(s['disk_free_cwd_bytes'])}")
        lines.append(("host", ", ".join(bits)))
    nv = snapshot.get("nvidia") if isinstance(snapshot.get("nvidia"), dict) else {}
    if nv.get("driver_version"):
        via = nv.get("source", "?")
        lines.append(("driver", f"{nv['driver_version']} (supports CUDA {nv.get('cuda_driver_version', '?')}), via {via}"))
    for g in nv.get("gpus") or []:
        mem = ""
        if g.get("memory_total_bytes"):
            mem = f", {format_bytes(g.get('memory_used_bytes'))} of {format_bytes(g['memory_total_bytes'])} used"
        temp = f", {g['temperature_c']} C" if g.get("temperature_c") is not None else ""
        procs = g.get("processes") or []
        ptext = f", {_plural(len(procs), 'process')}" if procs else ""
        lines.append((f"GPU {g.get('index', '?')}", f"{g.get('name', '?')} (compute capability {g.get('compute_capability') or '?'}){mem}{temp}{ptext}"))
    t = snapshot.get("torch") if isinstance(snapshot.get("torch"), dict) else {}
    if t.get("installed") is False:
        lines.append(("torch", "not installed"))
    elif t:
        if t.get("error"):
            lines.append(("torch", f"{t.get('version', '?')}: BROKEN ({t['error'].replace('could not check: ', '')})"))
        else:
            build = f"CUDA {t['cuda_version']}" if t.get("cuda_version") else ("ROCm " + t["hip_version"] if t.get("hip_version") else "CPU-only")
            cudnn = f", cuDNN {t['cudnn_version']}" if t.get("cudnn_version") else ""
            avail = ""
            if "cuda_available" in t:
                avail = f", {_plural(t.get('device_count') or 0, 'device')} visible" if t.get("cuda_available") else ", CUDA not available"
            arch = t.get("arch_list") or []
            arch_text = f", arch {' '.join(arch)}" if arch else ""
            lines.append(("torch", f"{t.get('version', '?')} ({build}{cudnn}){avail}{arch_text}{_remembered(t)}"))
        for d in t.get("deep") or []:
            res = ", ".join(f"{k} {'ok' if v.get('ok') else 'FAILED'}" for k, v in d.items() if isinstance(v, dict))
            lines.append((f"matmul GPU {d.get('index')}", res or d.get("error", "?")))
    for key, label in (("bitsandbytes", "bitsandbytes"), ("flash_attn", "flash-attn")):
        sec = snapshot.get(key) if isinstance(snapshot.get(key), dict) else {}
        if sec.get("installed"):
            state = "BROKEN" if sec.get("error") else ("loads" + (", CUDA library found" if sec.get("cuda") else "") if key == "bitsandbytes" else "loads")
            if key == "bitsandbytes" and sec.get("cuda") is False and not sec.get("error"):
                state = "loads, no CUDA library"
            lines.append((label, f"{sec.get('version', '?')} {state}"))
    pk = snapshot.get("packages") if isinstance(snapshot.get("packages"), dict) else {}
    probed = {"bitsandbytes": "bitsandbytes", "flash-attn": "flash_attn"}
    shown = [f"{k} {v}" for k, v in pk.items()
             if k not in ("torch", "numpy", "error") and not k.startswith("nvidia-")
             and not (isinstance(snapshot.get(probed.get(k, "")), dict) and snapshot[probed[k]].get("installed"))]
    if shown:
        lines.append(("packages", ", ".join(shown)))
    ev = snapshot.get("env_vars") if isinstance(snapshot.get("env_vars"), dict) else {}
    if ev and "error" not in ev:
        lines.append(("env", ", ".join(f"{k}={v}" for k, v in ev.items() if k != "LD_LIBRARY_PATH") or "LD_LIBRARY_PATH set"))
    req = snapshot.get("requested") if isinstance(snapshot.get("requested"), dict) else {}
    if req.get("features"):
        lines.append(("requested", ", ".join(req["features"])))
    return lines


def print_env_report(con: Any, snapshot: dict, findings: list[Finding], verbose: bool = False) -> None:
    """Terminal view: verdict, machine summary, 'could not check' lines, then findings grouped by area."""
    from rich.markup import escape

    from loradoctor.render.terminal import print_finding

    c = counts(findings)
    style = "bold red" if c["error"] else "yellow" if c["warning"] else "bold green"
    con.print(f"[{style}]{escape(verdict(snapshot, findings))}[/]")
    con.print()
    width = max([len(label) for label, _ in summary_lines(snapshot)] + [len(k) for k, _ in could_not_check(snapshot)], default=0)
    for label, text in summary_lines(snapshot):
        con.print(f"  [bold]{escape(label.ljust(width))}[/]  {escape(text)}")
    for section, reason in could_not_check(snapshot):
        con.print(f"  [yellow]{escape(section.ljust(width))}[/]  could not check: {escape(reason)}")
    src = (snapshot.get("meta") or {}).get("source")
    if src and src != "live":
        con.print(f"  [dim]read from {escape(str(src))} text: only what it shows was checked[/]")
    shown = [f for f in findings if verbose or f.severity != "info"]
    hidden = len(findings) - len(shown)
    groups = []
    for area in AREA_ORDER + ("",):
        group = [f for f in shown if (f.area or "") == area or (area == "" and f.area not in AREA_ORDER)]
        if group:
            groups.append((area, group))
    groups.sort(key=lambda ag: min(f.rank or 10**6 for f in ag[1]))  # the area holding the top finding first
    for area, group in groups:
        con.print()
        con.print(f"[bold underline]{escape(AREA_TITLES.get(area, 'other'))}[/]")
        for f in group:
            print_finding(con, f)
    if hidden:
        con.print()
        con.print(f"[dim]{_plural(hidden, 'note')} (info) hidden; -v shows them, --format json lists everything.[/]")


def env_markdown(snapshot: dict, findings: list[Finding]) -> str:
    """Markdown for an issue: verdict, machine summary and findings, with UUIDs, host and home paths redacted."""
    from loradoctor.env.snapshot import redact
    from loradoctor.render.markdown import findings_md

    safe = redact(snapshot)
    out = [f"**{verdict(safe, findings)}**", "", "| | |", "|---|---|"]
    for label, text in summary_lines(safe):
        out.append(f"| {label} | {text.replace('|', '/')} |")
    for section, reason in could_not_check(safe):
        out.append(f"| {section} | could not check: {reason.replace('|', '/')} |")
    body = "\n".join(out)
    redacted_findings = [_redact_finding(f, snapshot) for f in findings]
    return findings_md(redacted_findings, title="loradoctor env", preamble=body)


def _redact_finding(f: Finding, snapshot: dict) -> Finding:
    from loradoctor.env.snapshot import redact

    data = redact({"system": {"hostname": (snapshot.get("system") or {}).get("hostname")}, "f": f.to_dict()})
    return Finding.from_dict(data["f"])


def checks_table(checks: Iterable[Any]) -> list[str]:
    return [f"{c.name:20s} {c.area:9s} {c.description}" for c in checks]


def report_document(snapshot: dict, findings: list[Finding], schema: str) -> dict[str, Any]:
    from loradoctor.render.json import findings_data

    return {"schema": schema, "snapshot": snapshot, "findings": findings_data(findings)}
