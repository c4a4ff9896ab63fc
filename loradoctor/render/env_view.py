"""Views of an env report: the one-line verdict, a short summary of the snapshot by area, and the
findings (printed with the shared renderers in terminal.py / markdown.py / json.py)."""

from __future__ import annotations

from typing import Any, Iterable

from loradoctor.findings import Finding
from loradoctor.units import format_bytes

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
    """'1 process', '3 processes', '2 GPUs'."""
    if n == 1:
        return f"{n} {word}"
    return f"{n} {word}{'es' if word.endswith(('s', 'sh', 'ch', 'x')) else 's'}"


def _short(text: str, limit: int = 140) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def verdict(snapshot: dict, findings: list[Finding]) -> str:
    """'1 error, 2 warnings: torch is a CPU-only build ...' or 'No problems found: ...'."""
    c = counts(findings)
    worst = [f for f in findings if f.severity in ("error", "warning")]
    if worst:
        parts = [_plural(c["error"], "error")] if c["error"] else []
        if c["warning"]:
            parts.append(_plural(c["warning"], "warning"))
        return f"{', '.join(parts)}: {worst[0].title}{_card_note(snapshot)}"
    partly = " in what could be read" if not_understood(snapshot) else ""
    return f"No problems found{partly}: {_machine_line(snapshot)}{_card_note(snapshot)}"


def not_understood(snapshot: dict) -> list[str]:
    """Parts of a pasted report that were seen but could not be read (snapshot.py records them)."""
    meta = snapshot.get("meta") if isinstance(snapshot.get("meta"), dict) else {}
    notes = meta.get("not_understood")
    return [str(n) for n in notes] if isinstance(notes, list) else []


def _named_card(snapshot: dict) -> dict:
    req = snapshot.get("requested") if isinstance(snapshot.get("requested"), dict) else {}
    card = req.get("gpu")
    return card if isinstance(card, dict) and card.get("name") else {}


def _card_note(snapshot: dict) -> str:
    card = _named_card(snapshot)
    return f" (features also judged against the {card['name']} named with --gpu)" if card else ""


def _machine_line(snapshot: dict) -> str:
    nv = snapshot.get("nvidia") if isinstance(snapshot.get("nvidia"), dict) else {}
    gpus = nv.get("gpus") or []
    t = snapshot.get("torch") if isinstance(snapshot.get("torch"), dict) else {}
    gpus = [g for g in gpus if isinstance(g, dict)]
    name = gpus[0].get("name") if gpus else None
    if gpus:
        gpu_text = f"{_plural(len(gpus), 'GPU')} ({name})" if name else _plural(len(gpus), "GPU")
    elif isinstance(snapshot.get("nvidia"), dict) and snapshot["nvidia"].get("error"):
        gpu_text = "NVIDIA GPUs not checked"
    elif "nvidia" in snapshot:
        gpu_text = "no NVIDIA GPU"
    else:
        gpu_text = "GPUs not shown in this report"
    if t.get("version"):
        torch_text = f"torch {t.get('version')}"
    elif t.get("installed") is False:
        torch_text = "torch not installed"
    else:
        torch_text = "torch not shown in this report" if (snapshot.get("meta") or {}).get("source") != "live" else "torch unknown"
    return f"{gpu_text}, {torch_text}"


def could_not_check(snapshot: dict) -> list[tuple[str, str]]:
    """(section, reason) for every probe that failed, timed out or was skipped."""
    out = []
    for key in ("system", "nvidia", "torch", "packages", "env_vars", "bitsandbytes", "flash_attn"):
        sec = snapshot.get(key)
        if key in ("torch", "bitsandbytes", "flash_attn") and isinstance(sec, dict) and sec.get("installed"):
            continue  # installed but broken: its own row says BROKEN and why
        if isinstance(sec, dict) and sec.get("error"):
            out.append((key, str(sec["error"]).replace("could not check: ", "")))
    return out


def summary_lines(snapshot: dict) -> list[tuple[str, str]]:
    """(label, text) lines describing the machine, for the terminal and Markdown views."""
    lines: list[tuple[str, str]] = []
    s = snapshot.get("system") if isinstance(snapshot.get("system"), dict) else {}
    if s and "error" not in s:
        bits = [str(s["os"])] if s.get("os") else []
        if s.get("python"):
            bits.append(f"Python {s['python']}")
        if s.get("wsl"):
            bits.append("WSL2")
        if s.get("container"):
            bits.append(f"container ({s['container_kind']})" if s.get("container_kind") else "container")
        if s.get("ram_total_bytes"):
            bits.append(f"RAM {format_bytes(s['ram_total_bytes'])}")
        if s.get("shm_bytes") is not None:
            bits.append(f"/dev/shm {format_bytes(s['shm_bytes'])}")
        if s.get("disk_free_cwd_bytes") is not None:
            bits.append(f"disk free {format_bytes(s['disk_free_cwd_bytes'])}")
        if bits:
            lines.append(("host", ", ".join(bits)))
    nv = snapshot.get("nvidia") if isinstance(snapshot.get("nvidia"), dict) else {}
    if nv.get("driver_version"):
        cuda = f" (supports CUDA {nv['cuda_driver_version']})" if nv.get("cuda_driver_version") else ""
        via = f", via {nv['source']}" if nv.get("source") else ""
        lines.append(("driver", f"{nv['driver_version']}{cuda}{via}"))
    for i, g in enumerate(g for g in nv.get("gpus") or [] if isinstance(g, dict)):
        mem = ""
        if g.get("memory_total_bytes") and g.get("memory_used_bytes") is not None:
            mem = f", {format_bytes(g['memory_used_bytes'])} of {format_bytes(g['memory_total_bytes'])} used"
        elif g.get("memory_total_bytes"):
            mem = f", {format_bytes(g['memory_total_bytes'])}"
        temp = f", {g['temperature_c']} C" if g.get("temperature_c") is not None else ""
        procs = g.get("processes") or []
        ptext = f", {_plural(len(procs), 'process')}" if procs else ""
        name = str(g.get("name") or "name not shown")
        cc = f" (compute capability {g['compute_capability']})" if g.get("compute_capability") else ""
        lines.append((f"GPU {g.get('index', i)}", f"{name}{cc}{mem}{temp}{ptext}"))
    t = snapshot.get("torch") if isinstance(snapshot.get("torch"), dict) else {}
    if t.get("installed") is False:
        lines.append(("torch", "not installed"))
    elif t:
        version = f"{t['version']}: " if t.get("version") else ""
        if t.get("error"):
            lines.append(("torch", f"{version}BROKEN ({_short(str(t['error']).replace('could not check: ', ''))})"))
        else:
            build = f"CUDA {t['cuda_version']}" if t.get("cuda_version") else ("ROCm " + t["hip_version"] if t.get("hip_version") else "CPU-only")
            cudnn = f", cuDNN {t['cudnn_version']}" if t.get("cudnn_version") else ""
            avail = ""
            if "cuda_available" in t:
                avail = f", {_plural(t.get('device_count') or 0, 'device')} visible" if t.get("cuda_available") else ", CUDA not available"
            arch = t.get("arch_list") or []
            arch_text = f", arch {' '.join(arch)}" if arch else ""
            lines.append(("torch", f"{t.get('version') or 'version not shown'} ({build}{cudnn}){avail}{arch_text}{_remembered(t)}"))
        for d in t.get("deep") or []:
            res = ", ".join(f"{k} {'ok' if v.get('ok') else 'FAILED'}" for k, v in d.items() if isinstance(v, dict))
            lines.append((f"matmul GPU {d.get('index')}", res or _short(str(d.get("error") or "no result"))))
    for key, label in (("bitsandbytes", "bitsandbytes"), ("flash_attn", "flash-attn")):
        sec = snapshot.get(key) if isinstance(snapshot.get(key), dict) else {}
        if sec.get("installed"):
            if sec.get("error"):
                state = f"BROKEN ({_short(str(sec['error']).replace('could not check: ', ''))})"
            elif key == "bitsandbytes":
                state = "loads, no CUDA library" if sec.get("cuda") is False else "loads" + (", CUDA library found" if sec.get("cuda") else "")
            else:
                state = "loads"
            version = f"{sec['version']} " if sec.get("version") else ""
            lines.append((label, f"{version}{state}"))
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
    card = _named_card(snapshot)
    if req.get("features") or card:
        features = ", ".join(str(f) for f in req.get("features") or []) or "no feature (--want)"
        target = f"judged against the GPUs here and the {card['name']} (--gpu, compute capability {card.get('compute_capability')})" if card else ""
        lines.append(("requested", f"{features}; {target}" if target else features))
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
    for note in not_understood(snapshot):
        con.print(f"  [yellow]{escape('unread'.ljust(width))}[/]  not understood: {escape(note)}")
    src = (snapshot.get("meta") or {}).get("source")
    if src and src != "live":
        con.print(f"  [dim]read from {escape(str(src))} text: only what it shows was checked[/]")
    shown = [f for f in findings if verbose or f.severity != "info"]
    hidden = len(findings) - len(shown)
    # run_checks numbers findings in the order shown (problems grouped by area, then notes): a heading
    # wherever the area changes keeps the numbers reading 1, 2, 3 down the page.
    previous = None
    for f in sorted(shown, key=lambda f: f.rank or 10**6):
        heading = AREA_TITLES.get(f.area, "other") + (" (notes)" if f.severity == "info" else "")
        if heading != previous:
            con.print()
            con.print(f"[bold underline]{escape(heading)}[/]")
            previous = heading
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
    for note in not_understood(safe):
        out.append(f"| unread | not understood: {note.replace('|', '/')} |")
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

    return {"schema": schema, "verdict": verdict(snapshot, findings), "snapshot": snapshot, "findings": findings_data(findings)}

