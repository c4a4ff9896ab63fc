"""The snapshot as data: schema tag, loading saved or pasted reports, redaction for sharing.

A snapshot is a plain dict (see docs/snapshot.md). `load_snapshot` accepts what people paste into
bug reports: a saved `loradoctor env --format json`, a bare snapshot JSON, the text of
`python -m torch.utils.collect_env`, or `nvidia-smi` / `nvidia-smi -q` output. The importers fill
the fields the text shows and leave the rest out, so the same pure checks run on them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Optional

from loradoctor.errors import UserError
from loradoctor.units import MIB, parse_size_or_none

SNAPSHOT_SCHEMA = "loradoctor.snapshot/1"
REPORT_SCHEMA = "loradoctor.env/1"
MAX_INPUT_BYTES = 20 * MIB


def could_not_check(reason: str) -> dict[str, str]:
    """The shape of a section whose probe failed, timed out or does not apply."""
    return {"error": f"could not check: {reason}"}


def load_snapshot(path: str) -> dict:
    """Read a snapshot from a file ('-' for stdin) in any supported format; UserError if unreadable or unknown."""
    import sys

    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            p = Path(path)
            if p.is_dir():
                raise UserError(f"{path} is a folder; give a snapshot file")
            if p.stat().st_size > MAX_INPUT_BYTES:
                raise UserError(f"{path} is larger than {MAX_INPUT_BYTES // MIB} MiB; not a snapshot")
            text = p.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        raise UserError(f"no such file: {path}") from None
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None
    snap = parse_snapshot_text(text, name=path)
    snap.setdefault("meta", {})["from_file"] = "stdin" if path == "-" else Path(path).name
    return snap


def parse_snapshot_text(text: str, name: str = "input") -> dict:
    """Detect the format of `text` and import it. Pasted text is cleaned first (clean_paste): what a web page,
    a mail quote or a terminal adds around the report is not part of it."""
    raw = text.lstrip("\ufeff")
    stripped = raw.strip()
    if not stripped:
        raise UserError(f"{name} is empty")
    if stripped.startswith("{"):
        return decode_snapshot_json(stripped, name)
    stripped = clean_paste(raw).strip()
    if not stripped:
        raise UserError(f"{name} holds only quoting, prompts or fences")
    if stripped.startswith("{"):
        return decode_snapshot_json(stripped, name)
    if re.search(r"^PyTorch version:", stripped, re.M | re.I) and re.search(r"^(Is CUDA available|OS):", stripped, re.M | re.I):
        return import_collect_env(stripped)
    if re.search(r"^\s*(==+\s*)?NVSMI LOG", stripped, re.M | re.I) or re.search(r"^Attached GPUs\s*:", stripped, re.M | re.I):
        return import_nvidia_smi_q(stripped)
    if re.search(r"NVIDIA-SMI \d", stripped, re.I) or re.search(r"^(NVIDIA-SMI has failed|Failed to initialize NVML)", stripped, re.M | re.I):
        return import_nvidia_smi_table(stripped)
    raise UserError(
        f"{name}: unknown format; give a `loradoctor env --format json` file, `python -m torch.utils.collect_env` "
        "output, or `nvidia-smi` / `nvidia-smi -q` output"
    )


# ------------------------------------------------------------- saved JSON, read with bounds

MAX_NUMBER = 10**18  # bytes, counts, temperatures: anything larger is not a measurement
_NUM, _INT, _STR, _BOOL, _LIST, _DICT = "number", "integer", "string", "boolean", "list", "object"
# The fields the checks and the report read, and their JSON types (docs/snapshot.md). Other keys pass unread.
_FIELDS: dict[str, dict[str, tuple[str, ...]]] = {
    "meta": {"source": (_STR,), "from_file": (_STR,), "elapsed_s": (_NUM,)},
    "system": {
        **dict.fromkeys(("os", "kernel", "python", "python_executable", "platform", "hostname", "container_kind",
                         "path_cwd", "path_hf_cache"), (_STR,)),
        **dict.fromkeys(("cpu_count", "ram_total_bytes", "ram_available_bytes", "swap_total_bytes", "shm_bytes",
                         "disk_free_cwd_bytes", "disk_free_hf_cache_bytes"), (_NUM,)),
        "wsl": (_BOOL,), "wsl_libcuda": (_BOOL,), "container": (_BOOL, _STR), "dev_nvidia": (_LIST,),
        "ld_library_path_cuda_dirs": (_LIST,), "error": (_STR,),
    },
    "nvidia": {**dict.fromkeys(("source", "driver_version", "cuda_driver_version", "kernel_module_version",
                                "library_version", "nvml_error", "error"), (_STR,)), "gpus": (_LIST,)},
    "gpu": {
        "index": (_INT,), **dict.fromkeys(("name", "uuid", "bus_id", "ecc_mode", "mig_mode", "persistence_mode"), (_STR,)),
        "compute_capability": (_STR, _NUM), "minor_number": (_STR, _INT),
        **dict.fromkeys(("memory_total_bytes", "memory_used_bytes", "memory_free_bytes", "temperature_c", "slowdown_temp_c",
                         "shutdown_temp_c", "power_draw_w", "power_limit_w", "pcie_gen_current", "pcie_gen_max",
                         "pcie_width_current", "pcie_width_max", "ecc_uncorrected_volatile", "ecc_uncorrected_aggregate",
                         "ecc_corrected_volatile", "ecc_corrected_aggregate", "retired_pages_sbe", "retired_pages_dbe",
                         "remapped_rows_correctable", "remapped_rows_uncorrectable"), (_NUM,)),
        **dict.fromkeys(("retired_pages_pending", "remapped_rows_pending", "remapped_rows_failure"), (_BOOL,)),
        "throttle_reasons": (_LIST,), "processes": (_LIST,),
    },
    "process": {"pid": (_INT,), "ppid": (_INT,), "name": (_STR,), "used_bytes": (_NUM,), "ours": (_BOOL,),
                "alive": (_BOOL,), "status": (_STR,), "type": (_STR,)},
    "torch": {"installed": (_BOOL,), **dict.fromkeys(("version", "cuda_version", "hip_version", "error", "origin"), (_STR,)),
              "cudnn_version": (_INT, _STR), "cuda_available": (_BOOL,), "device_count": (_INT,),
              "arch_list": (_LIST,), "devices": (_LIST,), "deep": (_LIST,), "probe": (_DICT,), "warnings": (_LIST,)},
    "extension": {"installed": (_BOOL,), "version": (_STR,), "cuda": (_BOOL,), "error": (_STR,), "detail": (_STR,),
                  "probe": (_DICT,)},
    "probe": {**dict.fromkeys(("status", "reason", "stderr_tail"), (_STR,)), "returncode": (_INT,), "remembered": (_DICT,)},
    "requested": {"features": (_LIST,), "source": (_STR,), "gpu": (_DICT,)},
    "device": {"index": (_INT,), "name": (_STR,), "capability": (_STR, _NUM, _LIST), "total_memory_bytes": (_NUM,)},
    "deep": {"index": (_INT,), "bf16": (_DICT,), "fp16": (_DICT,), "error": (_STR,)},
    "card": {"name": (_STR,), "compute_capability": (_STR, _NUM)},
    "ld_dir": {"dir": (_STR,), "libs": (_LIST,)},
}
# torch.version.cuda = None is what a CPU build reports: there null is a fact, not "unknown".
_NULL_SAYS_SOMETHING = {"cuda_version", "hip_version", "wsl_libcuda", "cudnn_version"}
_KIND_WORDS = {_NUM: "a number (at most 1e18)", _INT: "an integer (at most 1e18)", _STR: "a string",
               _BOOL: "true or false", _LIST: "a list", _DICT: "an object"}
_SECTION_KIND = {"meta": "meta", "system": "system", "nvidia": "nvidia", "torch": "torch", "bitsandbytes": "extension",
                 "flash_attn": "extension", "requested": "requested", "packages": None, "env_vars": None}


def _type_ok(value: Any, kinds: tuple[str, ...]) -> bool:
    for kind in kinds:
        if kind == _STR and isinstance(value, str):
            return True
        if kind == _BOOL and isinstance(value, bool):
            return True
        if kind in (_NUM, _INT) and isinstance(value, (int, float)) and not isinstance(value, bool):
            if kind == _INT and not isinstance(value, int):
                continue
            return abs(value) <= MAX_NUMBER
        if kind == _LIST and isinstance(value, list):
            return True
        if kind == _DICT and isinstance(value, dict):
            return True
    return False


def _shown(value: Any) -> str:
    text = json.dumps(value)[:40] if not isinstance(value, str) else repr(value[:40])
    return text + ("..." if len(text) >= 40 else "")


def _check_fields(obj: Any, kind: str, where: str) -> None:
    if not isinstance(obj, dict):
        raise UserError(f"snapshot field {where}: expected an object, not {_shown(obj)}")
    for key in [k for k, v in obj.items() if v is None and k in _FIELDS[kind] and k not in _NULL_SAYS_SOMETHING]:
        del obj[key]  # null means unknown, which is what a missing key says to the checks
    for key, kinds in _FIELDS[kind].items():
        if key in obj and obj[key] is not None and not _type_ok(obj[key], kinds):
            what = " or ".join(_KIND_WORDS[k] for k in kinds)
            raise UserError(f"snapshot field {where}.{key}: expected {what}, not {_shown(obj[key])}")
    for key, item_kind in (("gpus", "gpu"), ("processes", "process")):
        for i, item in enumerate(obj.get(key) or [] if isinstance(obj.get(key), list) else []):
            _check_fields(item, item_kind, f"{where}.{key}[{i}]")
    if isinstance(obj.get("probe"), dict):
        _check_fields(obj["probe"], "probe", f"{where}.probe")
    for key in ("arch_list", "throttle_reasons", "dev_nvidia", "features"):
        for i, item in enumerate(obj.get(key) or [] if isinstance(obj.get(key), list) else []):
            if not isinstance(item, str):
                raise UserError(f"snapshot field {where}.{key}[{i}]: expected a string, not {_shown(item)}")
    for key, item_kind in (("devices", "device"), ("deep", "deep"), ("ld_library_path_cuda_dirs", "ld_dir")):
        for i, item in enumerate(obj.get(key) or [] if isinstance(obj.get(key), list) else []):
            _check_fields(item, item_kind, f"{where}.{key}[{i}]")
    if isinstance(obj.get("gpu"), dict) and kind == "requested":
        _check_fields(obj["gpu"], "card", f"{where}.gpu")
    for key in ("libs",):
        for i, item in enumerate(obj.get(key) or [] if isinstance(obj.get(key), list) else []):
            if not isinstance(item, str):
                raise UserError(f"snapshot field {where}.{key}[{i}]: expected a string, not {_shown(item)}")


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > 19:
        raise ValueError(f"a {len(text)}-digit number")
    return int(text)


def _finite_float(text: str) -> float:
    value = float(text)
    if not (abs(value) <= MAX_NUMBER):  # also false for inf and nan
        raise ValueError(f"the number {text[:20]}{'...' if len(text) > 20 else ''} is out of range")
    return value


def _no_constant(text: str) -> Any:
    raise ValueError(f"{text} is not a number a snapshot can hold")


def decode_snapshot_json(text: str, name: str = "input") -> dict:
    """A saved `env --format json` report or a bare snapshot -> the snapshot dict. Numbers are bounded (no NaN,
    no Infinity, nothing beyond 1e18), and every field the checks read must have its documented type:
    anything else is one UserError line naming the field (exit 2), never a traceback later."""
    try:
        data = json.loads(text, parse_int=_bounded_int, parse_float=_finite_float, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise UserError(f"{name} looks like JSON but does not parse: {exc.msg} at line {exc.lineno}") from None
    except (ValueError, RecursionError) as exc:
        raise UserError(f"{name}: JSON with {str(exc) or 'nesting too deep'}; not a snapshot") from None
    if isinstance(data, dict) and isinstance(data.get("snapshot"), dict):
        data = data["snapshot"]
    elif not (isinstance(data, dict) and (str(data.get("schema", "")).startswith("loradoctor.snapshot") or
                                          {"nvidia", "torch"} & set(data))):
        raise UserError(f"{name} is JSON but not a loradoctor snapshot (no 'snapshot' or 'schema' key)")
    for section, kind in _SECTION_KIND.items():
        if section not in data or data[section] is None:
            continue
        if kind is None:
            if not isinstance(data[section], dict) or not all(isinstance(v, (str, int, float)) and not isinstance(v, bool)
                                                              for v in data[section].values()):
                raise UserError(f"{name}: snapshot field {section}: expected an object of names and version strings")
            data[section] = {str(k): str(v) for k, v in data[section].items()}
            continue
        _check_fields(data[section], kind, section)
    return data


# ------------------------------------------------------------- what the web adds to a paste

_FENCE = re.compile(r"^\s*(```|~~~)[\w+-]*\s*$")
_QUOTE = re.compile(r"^[ \t]*>[ \t]?")
# A shell / notebook prompt line: the command that printed the report, not the report.
_PROMPT = re.compile(
    r"^\s*(?:\([^)]*\)\s*)?(?:[\w.-]+@[\w.-]+(?::\S*)?\s*)?(?:[$%#]|PS [^>]*>|>>>|In \[\d*\]:)\s*!?"
    r"(?:sudo\s+)?(?:python\d?(?:\.\d+)?\s+-m\s+torch\.utils\.collect_env|(?:/\S*/)?nvidia-smi\b|wget\b|curl\b|"
    r"python\d?(?:\.\d+)?\s+collect_env\.py|loradoctor\b).*$", re.I)
_TAG = re.compile(r"</?(?:pre|code|br|p|div|span|details|summary)\b[^>]*>", re.I)
_ENTITY = re.compile(r"&(?:gt|lt|amp|quot|apos|nbsp|#\d+|#x[0-9a-fA-F]+);")


def clean_paste(text: str) -> str:
    """Undo what forums, mail and terminals add around a pasted report: HTML escapes (&gt;, &amp;, &nbsp;),
    Markdown fences, `> ` quoting (nested too), the prompt line with the command, and the indentation
    common to every line (a report pasted inside a list or a code block)."""
    if _ENTITY.search(text):
        import html

        text = html.unescape(text).replace("\u00a0", " ")
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    lines = [_TAG.sub("", ln) for ln in lines if not _FENCE.match(ln)]
    for _ in range(4):  # nested quoting: "> > text"
        body = [ln for ln in lines if ln.strip()]
        if body and all(_QUOTE.match(ln) for ln in body):
            lines = [_QUOTE.sub("", ln, count=1) for ln in lines]
        else:
            break
    lines = [ln for ln in lines if not _PROMPT.match(ln)]
    body = [ln.expandtabs(8) for ln in lines if ln.strip()]
    indent = min((len(ln) - len(ln.lstrip(" ")) for ln in body), default=0)
    lines = [ln.expandtabs(8)[indent:] if ln.strip() else "" for ln in lines]
    return "\n".join(_dedent_report(lines)).strip("\n")


# The first line of a report: collect_env's, nvidia-smi -q's, nvidia-smi's table (its border or header)
_REPORT_START = re.compile(r"^( +)(?:Collecting environment information|PyTorch version:|(?:==+\s*)?NVSMI LOG|"
                           r"Attached GPUs\s*:|\+-{10,}|\|\s*NVIDIA-SMI \d|NVIDIA-SMI has failed|"
                           r"Failed to initialize NVML)", re.I)


def _dedent_report(lines: list[str]) -> list[str]:
    """A report pasted as an indented block inside prose (a forum post, an issue: `I get this, output below:`
    then the block indented by four): the prose keeps column 0, so the common indentation is none. Take the
    indentation of the report's first line off every line indented at least as deep (the report's own nesting,
    as in nvidia-smi -q, stays); the prose around it stays as it is."""
    for ln in lines:
        m = _REPORT_START.match(ln)
        if m:
            k = len(m.group(1))
            return [ln[k:] if ln[:k].isspace() and len(ln) >= k else ln for ln in lines]
    return lines


def _not_understood(snap: dict, what: str) -> None:
    """Record a part of a paste that was seen but could not be read (shown in the report; never read as absence)."""
    snap.setdefault("meta", {}).setdefault("not_understood", []).append(what)


def _empty(source: str) -> dict:
    return {"schema": SNAPSHOT_SCHEMA, "meta": {"source": source}}


# ------------------------------------------------------------- collect_env


def _field(text: str, label: str) -> Optional[str]:
    m = re.search(rf"^{re.escape(label)}:[ \t]*(.*)$", text, re.M | re.I)
    if not m:
        return None
    value = m.group(1).strip()
    return None if value.lower() in ("", "n/a", "could not collect", "none", "no cuda") else value


def import_collect_env(text: str) -> dict:
    """`python -m torch.utils.collect_env` output (torch 1.x to 2.x eras) -> snapshot."""
    snap = _empty("collect_env")
    os_line = _field(text, "OS") or ""
    py = _field(text, "Python version") or ""
    platform = _field(text, "Python platform") or ""
    snap["system"] = {
        "os": os_line,
        "python": py.split(" ")[0] if py else None,
        "platform": platform or None,
        "wsl": "microsoft" in platform.lower() or "wsl" in platform.lower(),
    }
    version = _field(text, "PyTorch version")
    cuda = _field(text, "CUDA used to build PyTorch")
    available = _field(text, "Is CUDA available")
    torch: dict[str, Any] = {"installed": version is not None, "version": version}
    if version is not None:
        torch["cuda_version"] = cuda
    hip = _field(text, "ROCM used to build PyTorch")
    if hip:
        torch["hip_version"] = hip
    if available is not None:
        torch["cuda_available"] = available.lower() == "true"
    elif version is not None and re.search(r"^Is CUDA available:", text, re.M | re.I):
        _not_understood(snap, "collect_env: the 'Is CUDA available' line")
    gpu_names = _collect_env_gpus(text)
    if torch.get("cuda_available") is not None:
        torch["device_count"] = len(gpu_names) if torch["cuda_available"] else 0
    # Without CUDA, collect_env lists GPUs from `nvidia-smi -L`: those are the driver's, not torch's.
    torch["devices"] = [{"index": i, "name": n} for i, n in enumerate(gpu_names)] if torch.get("cuda_available") else []
    cudnn = _collect_env_cudnn(text)
    if cudnn:
        torch["cudnn_version"] = cudnn
    snap["torch"] = torch

    driver = _field(text, "Nvidia driver version")
    from loradoctor.env.checks import gpu_cc_from_name

    nv: dict[str, Any] = {"source": "collect_env"}
    if driver:
        nv["driver_version"] = driver
    if gpu_names:
        nv["gpus"] = [{"index": i, "name": n, "compute_capability": gpu_cc_from_name(n)} for i, n in enumerate(gpu_names)]
    elif not driver:
        nv = could_not_check("collect_env shows no NVIDIA driver or GPU")
    snap["nvidia"] = nv
    snap["packages"] = _collect_env_packages(text)
    if version and "torch" not in snap["packages"]:
        snap["packages"]["torch"] = version
    return snap


def _collect_env_gpus(text: str) -> list[str]:
    m = re.search(r"^GPU models and configuration:[ \t]*(.*)$", text, re.M | re.I)
    if not m:
        return []
    names = []
    first = m.group(1).strip()
    lines = [first] if first else []
    # Multi-GPU reports continue on the next lines ("GPU 1: ..."); stop at the next "Label:" line.
    for line in text[m.end():].splitlines()[1:]:
        if re.match(r"^GPU \d+:", line.strip(), re.I):
            lines.append(line.strip())
        else:
            break
    for line in lines:
        gm = re.match(r"^GPU \d+:\s*(.+?)(?:\s*\(UUID:.*\))?$", line, re.I)
        if gm:
            names.append(gm.group(1).strip())
        elif line and line.lower() not in ("could not collect", "n/a") and not line.lower().startswith("gpu"):
            names.append(line)  # single-GPU style of old releases: just the name
    return names


def _collect_env_cudnn(text: str) -> Optional[str]:
    m = re.search(r"^cuDNN version:[ \t]*(.*)$", text, re.M | re.I)
    if not m:
        return None
    value = m.group(1).strip()
    if value.startswith("Probably one of the following"):
        tail = text[m.end():].splitlines()[1:4]
        versions = [re.search(r"\.so\.(\d+(?:\.\d+)*)", ln) for ln in tail]
        found = [v.group(1) for v in versions if v]
        return found[-1] if found else None
    if value in ("", "Could not collect", "N/A", "No CUDA"):
        return None
    v = re.search(r"(\d+\.\d+(?:\.\d+)?)", value)
    return v.group(1) if v else value


def _collect_env_packages(text: str) -> dict[str, str]:
    """`[pip3] name==version` lines first (they carry the +cuXXX tag), then `[conda] name version build`."""
    pkgs: dict[str, str] = {}
    for m in re.finditer(r"^\[pip\d?\][ \t]+(\S+)==(\S+)[ \t]*$", text, re.M | re.I):
        pkgs.setdefault(_norm(m.group(1)), m.group(2))
    for m in re.finditer(r"^\[conda\][ \t]+(\S+)[ \t]+(\S+)", text, re.M | re.I):
        if m.group(1).lower() != "could":
            pkgs.setdefault(_norm(m.group(1)), m.group(2))
    return pkgs


def _norm(name: str) -> str:
    name = re.sub(r"[-_.]+", "-", name.lower())
    return {"pytorch": "torch", "flash-attn": "flash-attn"}.get(name, name)


# ------------------------------------------------------------- nvidia-smi (table)

SMI_ROW_MAX_CHARS = 400  # far past any real row of the nvidia-smi table (R470 to R580: 79 to 91 characters)
_SMI_HEADER = re.compile(r"NVIDIA-SMI\s+([\d.]+)\s+Driver Version:\s*([\d.]+)\s+CUDA Version:\s*([\d.]+|N/A)", re.I)
# R525-R535 tables close the Persistence-M cell with no blank before the bar (`... A100-SXM4-80GB   Off| 0000...`)
_BUS_ID = r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]"  # `00000000:07:00.0`
_SMI_GPU_ROW = re.compile(r"^\|\s+(\d+)\s+(.+?)\s+(On|Off)\s*\|\s+(" + _BUS_ID + r")\s+(?:On|Off)\s+\|\s*(\S.*?)\s*\|", re.I)
# a GPU section of `nvidia-smi -q` opens with its bus id; prose around a pasted block (`GPU is not usable`) does not
_SMI_Q_GPU_HEAD = re.compile(r"GPU " + _BUS_ID)
_SMI_USE_ROW = re.compile(
    r"^\|\s*(\S+)\s+(\d+)C\s+(P\d+|\S+)\s+(?:(\d+)W\s*/\s*(\d+)W|N/A\s*/\s*N/A|\S+\s*/\s*\S+)?\s*\|\s*(\d+)MiB\s*/\s*(\d+)MiB\s*\|", re.I)
_SMI_PROC = re.compile(r"^\|\s+(\d+)\s+(?:(\S+)\s+(\S+)\s+)?(\d+)\s+(C|G|C\+G|M|M\+C)\s+(.+?)\s+(\d+|N/A)(?:MiB)?\s*\|", re.I)
_SMI_MEMORY = re.compile(r"\d+MiB\s*/\s*\d+MiB", re.I)


def import_nvidia_smi_table(text: str) -> dict:
    """The default `nvidia-smi` table (R470 to R580 layouts) -> snapshot (nvidia section only)."""
    snap = _empty("nvidia-smi")
    nv: dict[str, Any] = {"source": "nvidia-smi"}
    err = re.search(r"^(NVIDIA-SMI has failed.*|Failed to initialize NVML:.*)$", text, re.M | re.I)
    if err:
        snap["nvidia"] = could_not_check(err.group(1).strip())
        lib = re.search(r"^NVML library version:\s*([\d.]+)", text, re.M | re.I)
        if lib:
            snap["nvidia"]["library_version"] = lib.group(1)
        return snap
    h = _SMI_HEADER.search(text)
    if h:
        nv["driver_version"] = h.group(2)
        if h.group(3) != "N/A":
            nv["cuda_driver_version"] = h.group(3)
    from loradoctor.env.checks import gpu_cc_from_name

    gpus: list[dict] = []
    # a row of the table is ~90 characters; a longer line is no row, and the row regexes (lazy name, runs
    # of blanks) would backtrack over it: a 3,000-tab GPU row took 13 s. Such lines are left out.
    lines = [line if len(line) <= SMI_ROW_MAX_CHARS else "" for line in text.splitlines()]
    for n, line in enumerate(lines):
        m = _SMI_GPU_ROW.match(line)
        if m:
            name = m.group(2).strip()
            g: dict[str, Any] = {
                "index": int(m.group(1)), "name": name, "bus_id": m.group(4),
                "persistence_mode": "Enabled" if m.group(3).lower() == "on" else "Disabled",
                "compute_capability": gpu_cc_from_name(name),
            }
            ecc = m.group(5).strip()
            if re.fullmatch(r"\d+", ecc):
                g["ecc_uncorrected_volatile"] = int(ecc)
            if n + 1 < len(lines):
                u = _SMI_USE_ROW.match(lines[n + 1])
                if not u:
                    _not_understood(snap, f"nvidia-smi: the memory / temperature row of GPU {m.group(1)}: {lines[n + 1].strip()[:100]!r}")
                if u:
                    if u.group(2):
                        g["temperature_c"] = int(u.group(2))
                    if u.group(4):
                        g["power_draw_w"], g["power_limit_w"] = float(u.group(4)), float(u.group(5))
                    g["memory_used_bytes"] = int(u.group(6)) * MIB
                    g["memory_total_bytes"] = int(u.group(7)) * MIB
                    g["memory_free_bytes"] = g["memory_total_bytes"] - g["memory_used_bytes"]
                mig = re.search(r"\|\s+(Enabled|Disabled)\s*\|\s*$", lines[n + 2], re.I) if n + 2 < len(lines) else None
                if mig:
                    g["mig_mode"] = mig.group(1).capitalize()
            gpus.append(g)
    in_procs = False
    for line in lines:
        if re.search(r"\|\s*Processes:", line, re.I):
            in_procs = True
            for g in gpus:  # the listing is shown: a GPU without a row has no process (a table cut before
                g["processes"] = []  # its Processes section says nothing about them)
            continue
        if in_procs:
            p = _SMI_PROC.match(line)
            if not p and re.match(r"^\|\s+\d+\s+.*\b\d+\s+(C|G|C\+G|M|M\+C)\s", line, re.I):
                _not_understood(snap, f"nvidia-smi: a process row: {line.strip()[:100]!r}")
            if p:
                idx = int(p.group(1))
                used = p.group(7)
                for g in gpus:
                    if g["index"] == idx:
                        g.setdefault("processes", []).append({
                            "pid": int(p.group(4)), "name": p.group(6).strip(), "type": p.group(5),
                            "used_bytes": int(used) * MIB if used.isdigit() else None, "ours": False,
                        })
    nv["gpus"] = gpus
    seen = len([ln for ln in lines if _SMI_MEMORY.search(ln)])  # one memory-usage cell per GPU
    if seen > len(gpus):
        _not_understood(snap, f"nvidia-smi: {seen - len(gpus)} of {seen} GPU rows")
        if not gpus:  # never report "no GPU" for a table whose rows we could not read
            snap["nvidia"] = {**could_not_check(f"the GPU rows of this nvidia-smi table were not understood "
                                                 f"({seen} memory cell{'' if seen == 1 else 's'} seen)"), **{k: v for k, v in nv.items() if k != "gpus"}}
            return snap
    if not gpus and not re.search(r"No devices were found", text, re.I) and not h:
        _not_understood(snap, "nvidia-smi: the header and GPU rows")
    snap["nvidia"] = nv
    return snap


# ------------------------------------------------------------- nvidia-smi -q


_Q_KEYS = (
    "Driver Version", "CUDA Version", "Attached GPUs", "Product Name", "GPU UUID", "Persistence Mode", "Minor Number",
    "Compute Capability", "GPU Compute Capability", "MIG Mode", "Current", "Pending", "FB Memory Usage", "Total",
    "Used", "Free", "Reserved", "Clocks Event Reasons", "Clocks Throttle Reasons", "Temperature", "GPU Current Temp",
    "GPU Slowdown Temp", "GPU Shutdown Temp", "Power Readings", "GPU Power Readings", "Power Draw",
    "Average Power Draw", "Power Limit", "Current Power Limit", "Enforced Power Limit", "PCI", "PCIe Generation",
    "Device Current", "Max", "Device Max", "Link Width", "ECC Mode", "ECC Errors", "Volatile", "Aggregate",
    "Single Bit", "Double Bit", "DRAM Uncorrectable", "SRAM Uncorrectable", "SRAM Uncorrectable Parity",
    "SRAM Uncorrectable SEC-DED", "DRAM Correctable", "SRAM Correctable", "Retired Pages",
    "Single Bit ECC", "Double Bit ECC", "Pending Page Blacklist", "Pending Page Retirement", "Remapped Rows",
    "Correctable Error", "Uncorrectable Error", "Remapping Failure Occurred", "Processes", "Process ID", "Name",
    "Type", "Used GPU Memory", "Timestamp", "Idle", "Applications Clocks Setting", "SW Power Cap", "HW Slowdown",
    "HW Thermal Slowdown", "HW Power Brake Slowdown", "Sync Boost", "SW Thermal Slowdown", "Display Clock Setting",
)
_Q_CANON = {k.lower(): k for k in _Q_KEYS}
_Q_VALUES = {v.lower(): v for v in ("Active", "Not Active", "Yes", "No", "Enabled", "Disabled", "N/A")}


def _q_tree(text: str) -> list[tuple[int, str, Optional[str]]]:
    """Flatten `nvidia-smi -q` into (indent, key, value-or-None) rows; sections have value None. Keys and the
    usual values are put back in nvidia-smi's own case (a lower-cased paste reads the same)."""
    rows = []
    for line in text.splitlines():
        if not line.strip() or line.strip().startswith("==") or line.strip().lower().startswith("timestamp"):
            continue
        indent = len(line) - len(line.lstrip(" "))
        if " : " in line or line.rstrip().endswith(":"):
            key, _, value = line.strip().partition(":")
            key, value = key.strip(), value.strip()
            key = _Q_CANON.get(key.lower(), key)
            value = _Q_VALUES.get(value.lower(), value)
            rows.append((indent, key, value))
        else:
            key = line.strip()
            if re.fullmatch(r"gpu [0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.\d", key.lower()):
                key = "GPU " + key[4:]
            rows.append((indent, _Q_CANON.get(key.lower(), key), None))
    return rows


def import_nvidia_smi_q(text: str) -> dict:
    """`nvidia-smi -q` (R450 to R580 layouts) -> snapshot (nvidia section only)."""
    from loradoctor.env.checks import gpu_cc_from_name

    snap = _empty("nvidia-smi -q")
    nv: dict[str, Any] = {"source": "nvidia-smi -q", "gpus": []}
    rows = _q_tree(text)
    gpu: Optional[dict] = None
    path: list[tuple[int, str]] = []  # stack of (indent, section name)
    proc: Optional[dict] = None
    for indent, key, value in rows:
        while path and path[-1][0] >= indent:
            path.pop()
        if indent == 0 and value is None and _SMI_Q_GPU_HEAD.fullmatch(key.strip()):
            gpu = {"index": len(nv["gpus"]), "bus_id": key[4:].strip(), "processes": [], "throttle_reasons": []}
            nv["gpus"].append(gpu)
            path = []
            continue
        if value is None or value == "":
            path.append((indent, key))
            if gpu is not None and key == "Process ID" and value == "":
                pass
            continue
        sect = " / ".join(name for _, name in path)
        if gpu is None:
            if key == "Driver Version":
                nv["driver_version"] = value
            elif key == "CUDA Version" and value != "N/A":
                nv["cuda_driver_version"] = value
            continue
        _q_gpu_field(gpu, sect, key, value)
        if "Processes" in sect:
            if key == "Process ID":
                proc = {"pid": int(value) if value.isdigit() else None, "ours": False}
                gpu["processes"].append(proc)
            elif proc is not None and key == "Name":
                proc["name"] = value
            elif proc is not None and key == "Type":
                proc["type"] = value
            elif proc is not None and key == "Used GPU Memory":
                proc["used_bytes"] = parse_size_or_none(value)
    attached = next((v for _, k, v in rows if k == "Attached GPUs" and v), None)
    if attached and attached.isdigit() and int(attached) > len(nv["gpus"]):
        _not_understood(snap, f"nvidia-smi -q: {int(attached) - len(nv['gpus'])} of {attached} attached GPUs")
        if not nv["gpus"]:
            nv = {**could_not_check(f"the GPU sections of this nvidia-smi -q report were not understood "
                                    f"({attached} attached)"), **{k: v for k, v in nv.items() if k != "gpus"}}
    for g in nv.get("gpus", []):
        if g.get("name") and not g.get("compute_capability"):
            g["compute_capability"] = gpu_cc_from_name(g["name"])
        if g.get("memory_total_bytes") is not None and g.get("memory_used_bytes") is not None and g.get("memory_free_bytes") is None:
            g["memory_free_bytes"] = g["memory_total_bytes"] - g["memory_used_bytes"]
    snap["nvidia"] = nv
    return snap


_THROTTLE_NAMES = {
    "Idle": "gpu_idle", "Applications Clocks Setting": "applications_clocks_setting", "SW Power Cap": "sw_power_cap",
    "HW Slowdown": "hw_slowdown", "HW Thermal Slowdown": "hw_thermal_slowdown", "HW Power Brake Slowdown": "hw_power_brake_slowdown",
    "Sync Boost": "sync_boost", "SW Thermal Slowdown": "sw_thermal_slowdown", "Display Clock Setting": "display_clock_setting",
}


def _int(value: str) -> Optional[int]:
    m = re.match(r"^\s*(\d+)", value)
    return int(m.group(1)) if m else None


def _float(value: str) -> Optional[float]:
    m = re.match(r"^\s*(\d+(?:\.\d+)?)", value)
    return float(m.group(1)) if m else None


def _q_gpu_field(g: dict, sect: str, key: str, value: str) -> None:
    top = sect.split(" / ")[0] if sect else ""
    if not sect:
        simple = {"Product Name": "name", "GPU UUID": "uuid", "Persistence Mode": "persistence_mode",
                  "Minor Number": "minor_number"}
        if key in simple:
            g[simple[key]] = value
        elif key == "Compute Capability" or key == "GPU Compute Capability":
            g["compute_capability"] = value
        return
    if top == "MIG Mode" and key == "Current":
        g["mig_mode"] = value
    elif top == "FB Memory Usage":
        size = parse_size_or_none(value)
        if key in ("Total", "Used", "Free") and size is not None:
            g[f"memory_{key.lower()}_bytes"] = size
    elif top in ("Clocks Event Reasons", "Clocks Throttle Reasons") and key in _THROTTLE_NAMES and value == "Active":
        g["throttle_reasons"].append(_THROTTLE_NAMES[key])
    elif top == "Temperature":
        names = {"GPU Current Temp": "temperature_c", "GPU Slowdown Temp": "slowdown_temp_c", "GPU Shutdown Temp": "shutdown_temp_c"}
        if key in names and _int(value) is not None:
            g[names[key]] = _int(value)
    elif top in ("Power Readings", "GPU Power Readings"):
        if key in ("Power Draw", "Average Power Draw") and _float(value) is not None:
            g["power_draw_w"] = _float(value)
        elif key in ("Power Limit", "Current Power Limit", "Enforced Power Limit") and _float(value) is not None:
            g.setdefault("power_limit_w", _float(value))
    elif top == "PCI" and "PCIe Generation" in sect:
        if key in ("Current", "Device Current") and _int(value):
            g["pcie_gen_current"] = _int(value)
        elif key in ("Max", "Device Max") and _int(value):
            g.setdefault("pcie_gen_max", _int(value))
    elif top == "PCI" and "Link Width" in sect:
        if key == "Current" and _int(value):
            g["pcie_width_current"] = _int(value)
        elif key == "Max" and _int(value):
            g["pcie_width_max"] = _int(value)
    elif top == "ECC Mode" and key == "Current":
        g["ecc_mode"] = value
    elif top == "ECC Errors" and _int(value) is not None:
        # Old layout: Volatile / Double Bit / Total; new layout: Volatile / DRAM Uncorrectable etc.
        scope = "volatile" if "Volatile" in sect else "aggregate" if "Aggregate" in sect else None
        if scope is None:
            return
        unc = ("Double Bit" in sect and key == "Total") or key in ("DRAM Uncorrectable", "SRAM Uncorrectable",
                                                                    "SRAM Uncorrectable Parity", "SRAM Uncorrectable SEC-DED")
        cor = ("Single Bit" in sect and key == "Total") or key in ("DRAM Correctable", "SRAM Correctable")
        if unc:
            g[f"ecc_uncorrected_{scope}"] = g.get(f"ecc_uncorrected_{scope}", 0) + _int(value)
        elif cor:
            g[f"ecc_corrected_{scope}"] = g.get(f"ecc_corrected_{scope}", 0) + _int(value)
    elif top == "Retired Pages":
        if "Single Bit" in key and _int(value) is not None:
            g["retired_pages_sbe"] = _int(value)
        elif "Double Bit" in key and _int(value) is not None:
            g["retired_pages_dbe"] = _int(value)
        elif key.startswith("Pending") and value in ("Yes", "No"):
            g["retired_pages_pending"] = value == "Yes"
    elif top == "Remapped Rows":
        if key == "Correctable Error" and _int(value) is not None:
            g["remapped_rows_correctable"] = _int(value)
        elif key == "Uncorrectable Error" and _int(value) is not None:
            g["remapped_rows_uncorrectable"] = _int(value)
        elif key == "Pending" and value in ("Yes", "No"):
            g["remapped_rows_pending"] = value == "Yes"
        elif key == "Remapping Failure Occurred" and value in ("Yes", "No"):
            g["remapped_rows_failure"] = value == "Yes"


# ------------------------------------------------------------- redaction

_UUID = re.compile(r"\b(GPU|MIG)-[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}\b")
_HOME = re.compile(r"(/home/|/Users/|C:\\\\Users\\\\|C:\\Users\\)[^/\\\s\"']+")


def redact(snapshot: dict) -> dict:
    """A copy safe to paste publicly: GPU UUIDs, the host name and home-directory user names replaced."""
    system = snapshot.get("system") if isinstance(snapshot.get("system"), dict) else {}
    host = str(system.get("hostname") or "")
    # Whole-word matches only: a short host name ("vm", "gpu") must not eat parts of other words ("nvml").
    host_re = re.compile(r"(?<![\w.-])" + re.escape(host) + r"(?![\w-])") if host else None

    def clean(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        if isinstance(value, list):
            return [clean(v) for v in value]
        if not isinstance(value, str):
            return value
        text = _UUID.sub(lambda m: f"{m.group(1)}-<redacted>", value)
        text = _HOME.sub(lambda m: m.group(1) + "<user>", text)
        text = re.sub(r"(^|[\s'\"(=:])/root(?=/|$|[\s'\")])", r"\1/<home>", text)
        if host_re is not None:
            text = host_re.sub("<host>", text)
        return text

    return clean(snapshot)
