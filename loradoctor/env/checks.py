"""Env checks: pure functions snapshot -> findings. Nothing here touches the machine.

Each check reads what it needs from the snapshot (any key may be missing: pasted reports carry
less than a live probe), and returns zero or more Findings with a cause id from docs/causes.md,
evidence pointing into the snapshot (`snapshot:nvidia.gpus[0]`) or a probe's stderr, and a fix a
person can paste. Facts (driver floors, wheel arch lists, version floors) live in
loradoctor/data/env_facts.json.
"""

from __future__ import annotations

import json
import re
from loradoctor.record import record
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from loradoctor.env.facts import unlisted_bytes, unlisted_is_large
from loradoctor.findings import Evidence, Finding, Fix, assign_ranks
from loradoctor.units import GIB, MIB, format_bytes

_DATA = Path(__file__).resolve().parent.parent / "data" / "env_facts.json"
TORCH_INDEX = "https://download.pytorch.org/whl"

# Features a person can ask for with `--want` (or that an env var implies); see docs/env.md.
WANT_FEATURES = ("bf16", "fp16", "flash-attn", "bnb")


@lru_cache(maxsize=1)
def facts() -> dict[str, Any]:
    """The shipped fact tables (driver floors, wheel arch lists, version rules)."""
    return json.loads(_DATA.read_text(encoding="utf-8"))


# ---------------------------------------------------------------- small readers


def version_tuple(text: Any) -> tuple[int, ...]:
    """'550.54.15' -> (550, 54, 15); '12.4' -> (12, 4); junk -> ()."""
    if not isinstance(text, str):
        return ()
    parts = re.findall(r"\d+", text.split("+")[0])
    return tuple(int(p) for p in parts[:4])


def cc_tuple(text: Any) -> Optional[tuple[int, int]]:
    """'8.6' -> (8, 6); None when unknown."""
    v = version_tuple(str(text)) if text is not None else ()
    return (v[0], v[1] if len(v) > 1 else 0) if v else None


def arch_tuple(entry: str) -> Optional[tuple[str, int, int]]:
    """'sm_86' -> ('sm', 8, 6); 'sm_120' -> ('sm', 12, 0); 'compute_90' -> ('compute', 9, 0); 'sm_90a' -> ('sm', 9, 0)."""
    m = re.match(r"^(sm|compute)_(\d+)(\d)[a-z]?$", entry.strip())
    if not m:
        return None
    return m.group(1), int(m.group(2)), int(m.group(3))


def arch_supports(arch_list: Iterable[str], cc: tuple[int, int]) -> bool:
    """A cubin runs on the same major with an equal-or-higher minor; PTX JITs on any newer device (nvidia.md §4)."""
    for entry in arch_list:
        a = arch_tuple(entry)
        if a is None:
            continue
        kind, major, minor = a
        if kind == "sm" and major == cc[0] and minor <= cc[1]:
            return True
        if kind == "compute" and (major, minor) <= cc:
            return True
    return False


def gpu_cc_from_name(name: str) -> Optional[str]:
    """Compute capability for a GPU model name (pasted reports carry only the name)."""
    low = name.lower()
    for needle, cc in facts()["gpu_compute_capability"]:
        if re.search(r"(?<![a-z0-9])" + re.escape(needle.lower()) + r"(?![0-9])", low):
            return cc
    return None


def _section(snapshot: dict, key: str) -> dict:
    value = snapshot.get(key)
    return value if isinstance(value, dict) else {}


def gpus(snapshot: dict) -> list[dict]:
    """NVIDIA GPUs the driver reports (all of them, before CUDA_VISIBLE_DEVICES)."""
    return [g for g in _section(snapshot, "nvidia").get("gpus", []) or [] if isinstance(g, dict)]


def gpu_cc(g: dict) -> Optional[tuple[int, int]]:
    cc = cc_tuple(g.get("compute_capability"))
    if cc is None and g.get("name"):
        cc = cc_tuple(gpu_cc_from_name(g["name"]))
    return cc


def env_vars(snapshot: dict) -> dict[str, str]:
    return {k: str(v) for k, v in _section(snapshot, "env_vars").items()}


def is_windows(snapshot: dict) -> bool:
    return "windows" in str(_section(snapshot, "system").get("os", "")).lower()


def torch_info(snapshot: dict) -> dict:
    return _section(snapshot, "torch")


def torch_ok(snapshot: dict) -> bool:
    """torch imported cleanly in the child probe (or the pasted report shows it did)."""
    t = torch_info(snapshot)
    return bool(t.get("installed")) and "error" not in t and t.get("version") is not None


def torch_is_cuda_build(snapshot: dict) -> Optional[bool]:
    t = torch_info(snapshot)
    if not t.get("installed"):
        return None
    if t.get("cuda_version"):
        return True
    version = str(t.get("version") or _section(snapshot, "packages").get("torch") or "")
    if "+cu" in version:
        return True
    if t.get("hip_version") or "+rocm" in version or "+xpu" in version:
        return False
    if "error" in t and "+cpu" not in version:
        return None  # the probe failed; a PyPI wheel carries no local tag, so we cannot tell
    if "cuda_version" in t or "+cpu" in version:
        return False  # the probe (or report) says torch.version.cuda is None
    return None


def requested(snapshot: dict) -> dict[str, str]:
    """Features the person asked for -> where we learned it (`--want`, or an env var)."""
    out: dict[str, str] = {}
    req = _section(snapshot, "requested")
    for feat in req.get("features", []) or []:
        out[str(feat)] = str(req.get("source", "--want"))
    ev = env_vars(snapshot)
    mp = ev.get("ACCELERATE_MIXED_PRECISION", "").strip().lower()
    if mp in ("bf16", "fp16"):
        out.setdefault(mp, f"ACCELERATE_MIXED_PRECISION={mp}")
    if ev.get("ACCELERATE_USE_FLASH_ATTENTION", "").strip().lower() in ("1", "true"):
        out.setdefault("flash-attn", "ACCELERATE_USE_FLASH_ATTENTION")
    return out


def visible_gpus(snapshot: dict) -> list[tuple[int, dict]]:
    """(position in nvidia.gpus, gpu) for the GPUs CUDA_VISIBLE_DEVICES lets a process see."""
    all_gpus = gpus(snapshot)
    cvd = env_vars(snapshot).get("CUDA_VISIBLE_DEVICES")
    if cvd is None:
        return list(enumerate(all_gpus))
    picked = []
    for token in [t.strip() for t in cvd.split(",") if t.strip()]:
        match = _match_cvd_token(token, all_gpus)
        if match is None:
            break  # CUDA stops at the first invalid entry
        picked.append(match)
    return picked


def _match_cvd_token(token: str, all_gpus: list[dict]) -> Optional[tuple[int, dict]]:
    if re.fullmatch(r"\d+", token):
        for i, g in enumerate(all_gpus):
            if int(g.get("index", i)) == int(token):
                return i, g
        return None
    if token.upper().startswith(("GPU-", "MIG-")):
        for i, g in enumerate(all_gpus):
            uuid = str(g.get("uuid") or "")
            if uuid and uuid.lower().startswith(token.lower()):
                return i, g
    return None


def driver_floor(cuda: str, windows: bool) -> Optional[str]:
    v = version_tuple(cuda)
    if len(v) < 2:
        return None
    table = facts()["driver_floor_windows" if windows else "driver_floor_linux"]
    for row in table:
        if row["cuda_major"] == v[0] and row["cuda_minor_min"] <= v[1] <= row["cuda_minor_max"]:
            return row["driver_min"]
    return None


def driver_cuda_ceiling(snapshot: dict) -> Optional[str]:
    """Newest CUDA the driver supports ('12.4'), from NVML / nvidia-smi, else derived from the driver version."""
    nv = _section(snapshot, "nvidia")
    if nv.get("cuda_driver_version"):
        return str(nv["cuda_driver_version"])
    drv = version_tuple(nv.get("driver_version"))
    if not drv:
        return None
    best = None
    for cuda, need in facts()["driver_for_cuda_linux"].items():
        if drv >= version_tuple(need) and (best is None or version_tuple(cuda) > version_tuple(best)):
            best = cuda
    return best


def best_wheel(driver_cuda: Optional[str], ccs: list[tuple[int, int]]) -> Optional[dict]:
    """The newest torch wheel whose CUDA the driver runs and whose arch list covers every GPU."""
    wheels = facts()["torch_wheels"]
    ceiling = version_tuple(driver_cuda) if driver_cuda else None
    fits = [
        w for w in wheels
        if (ceiling is None or version_tuple(w["cuda"]) <= ceiling) and all(arch_supports(w["arch"], cc) for cc in ccs)
    ]
    return fits[-1] if fits else None


def pick_wheel(snapshot: dict, ccs: list[tuple[int, int]]) -> tuple[Optional[dict], Optional[str], str]:
    """(wheel, torch version to pin or None, note) for a reinstall on this machine.

    Prefer the newest tag published for the installed torch release whose CUDA the driver supports
    (nvidia-smi's "CUDA Version"); else the newest tag of that release the driver runs by CUDA
    minor-version compatibility (same major, family floor met); else the newest wheel the driver
    supports without pinning the release.
    """
    ceiling = driver_cuda_ceiling(snapshot)
    version = _torch_base_version(snapshot)
    release = ".".join(version.split(".")[:2]) if version else None
    tags = facts()["torch_release_tags"].get(release or "", [])
    wheels = [w for w in facts()["torch_wheels"] if w["tag"] in tags and all(arch_supports(w["arch"], cc) for cc in ccs)]
    if ceiling:
        fits = [w for w in wheels if version_tuple(w["cuda"]) <= version_tuple(ceiling)]
        if fits:
            return fits[-1], version, ""
        drv = _section(snapshot, "nvidia").get("driver_version")
        compat = [w for w in wheels if version_tuple(w["cuda"])[:1] == version_tuple(ceiling)[:1] and drv
                  and version_tuple(drv) >= version_tuple(driver_floor(w["cuda"], is_windows(snapshot)) or "999")]
        if compat:
            return compat[-1], version, (f" (runs on your CUDA {ceiling} driver by minor-version compatibility; "
                                         f"torch {version} has no wheel for CUDA {ceiling} or older)")
    return best_wheel(ceiling, ccs), None, ""


def wheel_for_arch(ccs: list[tuple[int, int]]) -> Optional[dict]:
    """The oldest-CUDA wheel that covers every GPU (asks the least of the driver)."""
    for w in facts()["torch_wheels"]:
        if all(arch_supports(w["arch"], cc) for cc in ccs):
            return w
    return None


def torch_arch_list(snapshot: dict) -> tuple[list[str], str]:
    """Arch list the torch build carries, and where it came from ('probe' or 'wheel table')."""
    t = torch_info(snapshot)
    if t.get("arch_list"):
        return list(t["arch_list"]), "probe"
    tag = re.search(r"\+(cu\d+)", str(t.get("version") or ""))
    cuda = t.get("cuda_version")
    for w in facts()["torch_wheels"]:
        if (tag and w["tag"] == tag.group(1)) or (not tag and cuda and w["cuda"] == ".".join(str(cuda).split(".")[:2])):
            return list(w["arch"]), f"wheel table ({w['tag']})"
    return [], ""


def pip_torch_line(wheel: dict, version: Optional[str] = None) -> str:
    pkg = f"torch=={version}" if version else "torch"
    return f"pip install --force-reinstall {pkg} --index-url {TORCH_INDEX}/{wheel['tag']}"


def _torch_base_version(snapshot: dict) -> Optional[str]:
    v = str(torch_info(snapshot).get("version") or _section(snapshot, "packages").get("torch") or "")
    return v.split("+")[0] or None


def _count(n: int, word: str) -> str:
    """'1 GPU', '2 GPUs'."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _ev(where: str, text: str) -> Evidence:
    return Evidence(file=f"snapshot:{where}", line=None, text=text)


def _stderr_evidence(probe: dict, label: str) -> list[Evidence]:
    tail = [ln for ln in str(probe.get("stderr_tail") or "").splitlines() if ln.strip()][-8:]
    return [Evidence(file=f"probe:{label} stderr", line=None, text=ln) for ln in tail]


def _gpu_label(i: int, g: dict) -> str:
    if g.get("label"):
        return str(g["label"])
    name = g.get("name")
    return f"GPU {g.get('index', i)} ({name})" if name else f"GPU {g.get('index', i)}"


def _gpu_where(i: int, g: dict) -> str:
    return str(g.get("where") or f"nvidia.gpus[{i}]")


def has_gpu(snapshot: dict) -> bool:
    """The snapshot shows a GPU on this machine: the driver lists one, torch's device list does, or an NVIDIA
    driver is installed (its kernel module, libraries or /dev/nvidia* nodes: an NVML mismatch hides the list
    until a reboot). Only then can a `loradoctor repro run` confirm a finding here; without one every GPU
    repro SKIPs."""
    return (bool(gpus(snapshot)) or any(isinstance(d, dict) for d in torch_info(snapshot).get("devices") or [])
            or any(_section(snapshot, "nvidia").get(k) for k in ("kernel_module_version", "library_version"))
            or bool(_section(snapshot, "system").get("dev_nvidia")))


def named_card(snapshot: dict) -> Optional[dict]:
    """The card named with `env --gpu NAME` ({"name", "compute_capability"} from the card table), if any."""
    card = _section(snapshot, "requested").get("gpu")
    return card if isinstance(card, dict) and card.get("name") else None


# ---------------------------------------------------------------- the checks


@record(frozen=True)
class Check:
    name: str
    area: str
    description: str
    fn: Callable[[dict], list[Finding]]


CHECKS: list[Check] = []  # in registration order, which is the order they run and tie-break in ranking
CHECK_NAMES: list[str] = []


def check(name: str, area: str) -> Callable[[Callable[[dict], list[Finding]]], Callable[[dict], list[Finding]]]:
    """Register an env check: `@check("nvml_mismatch", area="driver")` over a pure function snapshot ->
    findings. The name is the check's id (`--check NAME`, rule `env.NAME`); the docstring's first line is
    what `--list-checks` prints. The runner stamps rule and area on what the function returns."""

    def register(fn: Callable[[dict], list[Finding]]) -> Callable[[dict], list[Finding]]:
        if name in CHECK_NAMES:
            raise ValueError(f"env check {name!r} registered twice")
        description = (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else name
        CHECKS.append(Check(name, area, description, fn))
        CHECK_NAMES.append(name)
        return fn

    return register


def _finding(cause: str, severity: str, variant: Optional[str] = None, words: Optional[dict] = None,
             headline_limit: Optional[int] = None, **kw: Any) -> Finding:
    """A finding of `cause`: its title, summary and fixes come from the cause catalogue
    (loradoctor/data/causes.yaml; `variant` picks one of the cause's wordings), filled with the finding's
    facts and `words` (values only the wording needs). A check says what it found, never how to word it."""
    from loradoctor import catalogue

    if kw.get("facts"):
        kw["facts"] = {k: v for k, v in kw["facts"].items() if v is not None}  # unknown is absent, never "None"
    facts_ = {**(kw.get("facts") or {}), **(words or {})}
    kw.setdefault("confidence", 0.9)
    title = catalogue.headline(cause, facts_, variant)[:headline_limit]  # a long error quoted in a headline is cut
    fixes = [Fix(text, command) for text, command in catalogue.fixes_for(cause, facts_, "env", variant)]
    return Finding(cause=cause, rule="", severity=severity, title=title, summary=catalogue.summary(cause, facts_, variant),
                   fixes=fixes, **kw)


@check("nvml_mismatch", area="driver")
def check_nvml_mismatch(snapshot: dict) -> list[Finding]:
    """kernel module vs user-space driver libraries (reboot after a driver upgrade)"""
    nv = _section(snapshot, "nvidia")
    err = str(nv.get("error") or "")
    km, lib = nv.get("kernel_module_version"), nv.get("library_version")
    mismatch_text = "version mismatch" in err.lower()
    differ = bool(km and lib and km != lib)
    if not (mismatch_text or differ):
        return []
    ev = []
    if mismatch_text:
        ev.append(_ev("nvidia.error", err))
    if km:
        ev.append(_ev("nvidia.kernel_module_version", f"kernel module {km} (/proc/driver/nvidia/version)"))
    if lib:
        ev.append(_ev("nvidia.library_version", f"user-space driver libraries {lib}"))
    return [_finding("env.nvml_mismatch", "error", evidence=ev,
                     facts={"kernel_module_version": km, "library_version": lib})]


@check("torch_installed", area="torch")
def check_torch_installed(snapshot: dict) -> list[Finding]:
    """torch is installed in this interpreter"""
    t = torch_info(snapshot)
    if "installed" not in t or t.get("installed"):
        return []
    ccs = [c for c in (gpu_cc(g) for g in gpus(snapshot)) if c]
    wheel = best_wheel(driver_cuda_ceiling(snapshot), ccs) if gpus(snapshot) else None
    cmd = f"pip install torch --index-url {TORCH_INDEX}/{wheel['tag']}" if wheel else "pip install torch"
    return [_finding(
        "env.torch_cpu_only", "info" if not gpus(snapshot) else "warning",
        "not_installed_here" if _section(snapshot, "meta").get("source") == "live" else "not_installed",
        evidence=[_ev("torch", "torch not found by importlib.metadata")], words={"install_command": cmd},
    )]


@check("torch_broken", area="torch")
def check_torch_broken(snapshot: dict) -> list[Finding]:
    """`import torch` succeeds in a child process (no ImportError, crash or hang)"""
    t = torch_info(snapshot)
    probe = t.get("probe") if isinstance(t.get("probe"), dict) else {}
    if not t.get("installed") or probe.get("status") in (None, "ok", "missing", "skipped"):
        return []
    status = probe.get("status")
    reason = probe.get("reason") or {"timeout": "timeout", "crashed": "signal"}.get(status, "error")
    version = _torch_base_version(snapshot)
    ccs = [c for c in (gpu_cc(g) for g in gpus(snapshot)) if c]
    wheel, pin, note = pick_wheel(snapshot, ccs) if gpus(snapshot) else (None, None, "")
    words = {"reason": reason, "shadows": bool(_section(snapshot, "system").get("ld_library_path_cuda_dirs"))}
    if wheel:
        words.update(wheel_note=note, wheel_command=pip_torch_line(wheel, pin))
    else:
        words["torch_requirement"] = "torch==" + version if version else "torch"
    return [_finding(
        "env.torch_broken", "error", "hung" if status == "timeout" else "crashed" if status == "crashed" else "import_failed",
        words=words,
        evidence=_stderr_evidence(probe, "torch") or [_ev("torch.probe", f"{status}: {probe.get('reason', '')}")],
        facts={"probe_status": status, "returncode": probe.get("returncode")},
    )]


@check("torch_cpu_only", area="torch")
def check_torch_cpu_only(snapshot: dict) -> list[Finding]:
    """torch is a CUDA build when the machine has an NVIDIA GPU"""
    t = torch_info(snapshot)
    if not t.get("installed") or "error" in t:
        return []
    version = str(t.get("version") or "")
    cuda_build = t.get("cuda_version")
    if cuda_build or t.get("hip_version") or "+rocm" in version or "+xpu" in version:
        return []
    if "cuda_version" not in t and "+cpu" not in version:
        return []  # a pasted report that says nothing about the build
    all_gpus = gpus(snapshot)
    if not all_gpus:
        return [_finding(
            "env.torch_cpu_only", "info", "cpu_build_no_gpu", words={"version": version},
            evidence=[_ev("torch.cuda_version", f"torch {version}, torch.version.cuda = None")], confidence=0.8,
        )]
    ccs = [c for c in (gpu_cc(g) for g in all_gpus) if c]
    ceiling = driver_cuda_ceiling(snapshot)
    wheel, pin, note = pick_wheel(snapshot, ccs)
    words: dict[str, Any] = {"version": version, "gpu_count": _count(len(all_gpus), "NVIDIA GPU")}
    if wheel:
        words.update(via=f"driver CUDA {ceiling} -> {wheel['tag']}" if ceiling else wheel["tag"], wheel_note=note,
                     wheel_command=pip_torch_line(wheel, pin))
    else:
        need = wheel_for_arch(ccs)
        if need:
            words.update(need_tag=need["tag"], need_driver=facts()["driver_for_cuda_linux"].get(need["cuda"]))
    return [_finding(
        "env.torch_cpu_only", "error", "cpu_build", words=words,
        evidence=[_ev("torch.cuda_version", f"torch {version}, torch.version.cuda = None"),
                  _ev("nvidia.gpus[0]", ", ".join(filter(None, [
                      str(all_gpus[0].get("name") or "GPU 0"),
                      f"driver {_section(snapshot, 'nvidia')['driver_version']}" if _section(snapshot, "nvidia").get("driver_version") else ""])))],
        facts={"torch_version": version, "driver_cuda": ceiling},
    )]


@check("driver_too_old", area="driver")
def check_driver_too_old(snapshot: dict) -> list[Finding]:
    """the driver is new enough for torch's CUDA runtime"""
    t = torch_info(snapshot)
    nv = _section(snapshot, "nvidia")
    cuda = t.get("cuda_version")
    drv = nv.get("driver_version")
    if not cuda or not drv:
        return []
    floor = driver_floor(str(cuda), is_windows(snapshot))
    ceiling = driver_cuda_ceiling(snapshot)
    ccs = [c for c in (gpu_cc(g) for g in gpus(snapshot)) if c]
    ev = [_ev("torch.cuda_version", f"torch {t.get('version')} built with CUDA {cuda}"),
          _ev("nvidia.driver_version", f"driver {drv} (supports CUDA up to {ceiling})" if ceiling else f"driver {drv}")]
    too_old = floor is not None and version_tuple(drv) < version_tuple(floor)
    if not too_old:
        return []
    wheel, pin, note = pick_wheel(snapshot, ccs)
    need = facts()["driver_for_cuda_linux"].get(".".join(str(cuda).split(".")[:2]), floor)
    probe_err = [Evidence("probe:torch stderr", None, ln) for ln in str((t.get("probe") or {}).get("stderr_tail") or "").splitlines()
                 if "too old" in ln or "insufficient" in ln][:2]
    words = {"driver_needed": need}
    if wheel:
        words.update(wheel_tag=wheel["tag"], wheel_note=note, wheel_command=pip_torch_line(wheel, pin))
    return [_finding("env.driver_too_old", "error", evidence=ev + probe_err, words=words,
                     facts={"driver_version": drv, "driver_min": floor, "torch_cuda": cuda})]


@check("arch_unsupported", area="torch")
def check_arch_unsupported(snapshot: dict) -> list[Finding]:
    """torch's arch list has kernels for every GPU"""
    if not torch_is_cuda_build(snapshot):
        return []
    arch, source = torch_arch_list(snapshot)
    if not arch:
        return []
    out = []
    for i, g in visible_gpus(snapshot) or list(enumerate(gpus(snapshot))):
        cc = gpu_cc(g)
        if cc is None or arch_supports(arch, cc):
            continue
        wheel, pin, note = pick_wheel(snapshot, [cc])
        words: dict[str, Any] = {"torch_version": torch_info(snapshot).get("version"), "gpu": _gpu_label(i, g)}
        if wheel:
            words.update(sm=f"sm_{cc[0]}{cc[1]}", wheel_tag=wheel["tag"], wheel_note=note, wheel_command=pip_torch_line(wheel, pin))
        else:
            need = wheel_for_arch([cc])
            if need:
                words.update(need_driver=facts()["driver_for_cuda_linux"].get(need["cuda"]), need_cuda=need["cuda"],
                             need_tag=need["tag"], need_command=pip_torch_line(need))
            else:
                words["no_wheel"] = True
        too_old = all((arch_tuple(a) or ("", 99, 0))[1] > cc[0] for a in arch)
        out.append(_finding(
            "env.arch_unsupported", "error", "gpu_too_old" if too_old else "no_kernels", words=words,
            evidence=[_ev(f"nvidia.gpus[{i}]", f"{g.get('name')} compute capability {cc[0]}.{cc[1]}"),
                      _ev("torch.arch_list", f"{' '.join(arch)} (from {source})")],
            facts={"compute_capability": f"{cc[0]}.{cc[1]}", "arch_list": arch},
        ))
    return out


@check("no_gpu_visible", area="gpu")
def check_no_gpu_visible(snapshot: dict) -> list[Finding]:
    """GPUs the driver sees are visible to CUDA (CUDA_VISIBLE_DEVICES, containers, WSL2)"""
    sysinfo = _section(snapshot, "system")
    nv = _section(snapshot, "nvidia")
    t = torch_info(snapshot)
    ev_vars = env_vars(snapshot)
    all_gpus = gpus(snapshot)
    cuda_build = torch_is_cuda_build(snapshot)
    out = []
    cvd = ev_vars.get("CUDA_VISIBLE_DEVICES")
    if all_gpus and cvd is not None and not visible_gpus(snapshot):
        out.append(_finding(
            "env.no_gpu_visible", "error", "cvd_hides", words={"cvd_repr": repr(cvd), "gpu_count": _count(len(all_gpus), "GPU")},
            evidence=[_ev("env_vars.CUDA_VISIBLE_DEVICES", repr(cvd)),
                      _ev("nvidia.gpus", ", ".join(f"{g.get('index', i)}: {g.get('name')}" for i, g in enumerate(all_gpus)))],
        ))
        return out
    explained = bool(check_driver_too_old(snapshot)) or bool(check_nvml_mismatch(snapshot))
    if all_gpus and cuda_build and torch_ok(snapshot) and t.get("device_count") == 0 and "device_count" in t and not explained:
        ev = [_ev("torch.device_count", "torch.cuda.device_count() = 0, cuda.is_available() = False"),
              _ev("nvidia.gpus", f"the driver lists {_count(len(all_gpus), 'GPU')}: {all_gpus[0].get('name') or 'name not shown'}")]
        ev += [Evidence("probe:torch stderr", None, ln) for ln in str((t.get("probe") or {}).get("stderr_tail") or "").splitlines()
               if "CUDA" in ln][:3]
        out.append(_finding("env.no_gpu_visible", "error", "torch_sees_none", evidence=ev,
                            words={"gpu_count": _count(len(all_gpus), "GPU")}))
    if not all_gpus and sysinfo.get("container") and cuda_build:
        nvd = ev_vars.get("NVIDIA_VISIBLE_DEVICES")
        ev = [_ev("system.container", f"running in a container ({sysinfo.get('container_kind', 'container')})"),
              _ev("nvidia.error", str(nv.get("error") or "no NVIDIA GPU found")),
              _ev("system.dev_nvidia", f"/dev/nvidia* device nodes: {', '.join(sysinfo.get('dev_nvidia') or []) or 'none'}")]
        if nvd is not None:
            ev.append(_ev("env_vars.NVIDIA_VISIBLE_DEVICES", repr(nvd)))
        out.append(_finding("env.no_gpu_visible", "error", "container", evidence=ev, words={"torch_version": t.get("version")}))
    if sysinfo.get("wsl") and not all_gpus and sysinfo.get("wsl_libcuda") is False:
        out.append(_finding(
            "env.no_gpu_visible", "error" if cuda_build else "warning", "wsl_no_libcuda",
            evidence=[_ev("system.wsl", "WSL2 kernel"), _ev("system.wsl_libcuda", "/usr/lib/wsl/lib/libcuda.so not found")],
        ))
    return out


def _feature_gpus(snapshot: dict) -> list[tuple[int, dict, tuple[int, int]]]:
    """(index, gpu, compute capability) of the GPUs that features are judged against: the visible GPUs
    here (or torch's device list of a pasted collect_env), and the card named with --gpu."""
    out = []
    for i, g in visible_gpus(snapshot):
        cc = gpu_cc(g)
        if cc:
            out.append((i, g, cc))
    if not out:  # a pasted collect_env may carry torch's device list only
        for j, d in enumerate(torch_info(snapshot).get("devices") or []):
            if not isinstance(d, dict):
                continue
            cc = cc_tuple(d.get("capability")) or cc_tuple(gpu_cc_from_name(str(d.get("name", ""))))
            if cc:
                out.append((j, {"index": j, "name": d.get("name")}, cc))
    card = named_card(snapshot)
    cc = cc_tuple(card.get("compute_capability")) if card else None
    if card and cc:
        out.append((-1, {"name": card["name"], "label": f"the {card['name']} named with --gpu", "where": "requested.gpu"}, cc))
    return out


@check("bf16", area="gpu")
def check_bf16(snapshot: dict) -> list[Finding]:
    """bf16 only on compute capability >= 8.0"""
    want = requested(snapshot)
    old = [(i, g, cc) for i, g, cc in _feature_gpus(snapshot) if cc < (8, 0)]
    if not old:
        return []
    i, g, cc = old[0]
    ev = [_ev(_gpu_where(i, g), f"{g.get('name')} compute capability {cc[0]}.{cc[1]} (bf16 needs 8.0, Ampere)")]
    facts_, words = {"compute_capability": f"{cc[0]}.{cc[1]}"}, {"gpu": _gpu_label(i, g)}
    if "bf16" in want:
        ev.append(_ev("requested", f"bf16 requested by {want['bf16']}"))
        return [_finding("env.bf16_unsupported", "error", "requested", evidence=ev, facts=facts_, words=words)]
    return [_finding("env.bf16_unsupported", "info", "not_requested", evidence=ev, facts=facts_, words=words, confidence=0.8)]


@check("fp8", area="gpu")
def check_fp8(snapshot: dict) -> list[Finding]:
    """FP8 mixed precision (ACCELERATE_MIXED_PRECISION=fp8) only on compute capability >= 8.9 (Ada, Hopper)"""
    if env_vars(snapshot).get("ACCELERATE_MIXED_PRECISION", "").strip().lower() != "fp8":
        return []
    old = [(i, g, cc) for i, g, cc in _feature_gpus(snapshot) if cc < (8, 9)]
    if not old:
        return []
    i, g, cc = old[0]
    return [_finding(
        "env.fp8_unsupported", "error", "requested",
        evidence=[_ev(_gpu_where(i, g), f"{g.get('name')} compute capability {cc[0]}.{cc[1]} (FP8 needs 8.9: Ada, Hopper)"),
                  _ev("env_vars.ACCELERATE_MIXED_PRECISION", "fp8")],
        facts={"compute_capability": f"{cc[0]}.{cc[1]}"},
        words={"gpu": _gpu_label(i, g), "fallback": "bf16" if cc >= (8, 0) else "fp16"},
    )]


@check("flash_attn_support", area="gpu")
def check_flash_attn_support(snapshot: dict) -> list[Finding]:
    """FlashAttention 2 needs >= 8.0, FlashAttention 3 needs Hopper"""
    want = requested(snapshot)
    fa = _section(snapshot, "flash_attn")
    pk = _section(snapshot, "packages")
    installed = bool(fa.get("installed") or pk.get("flash-attn"))
    feats = _feature_gpus(snapshot)
    out = []
    old = [(i, g, cc) for i, g, cc in feats if cc < (8, 0)]
    if old and ("flash-attn" in want or installed):
        i, g, cc = old[0]
        asked = "flash-attn" in want
        ev = [_ev(_gpu_where(i, g), f"{g.get('name')} compute capability {cc[0]}.{cc[1]} (FlashAttention 2 needs 8.0)")]
        if asked:
            ev.append(_ev("requested", f"flash-attn requested by {want['flash-attn']}"))
        out.append(_finding("env.flash_attn_unsupported", "error" if asked else "warning", "fa2_old_gpu",
                            evidence=ev, words={"gpu": _gpu_label(i, g)}))
    fa3 = pk.get("flash-attn-3") or pk.get("flash_attn_3")
    if fa3 and feats and not any(cc[0] == 9 for _, _, cc in feats):
        i, g, cc = feats[0]
        out.append(_finding(
            "env.flash_attn_unsupported", "warning", "fa3_not_hopper",
            words={"fa3_version": fa3, "gpu": _gpu_label(i, g), "compute_capability": f"{cc[0]}.{cc[1]}"},
            evidence=[_ev("packages.flash-attn-3", str(fa3)), _ev(_gpu_where(i, g), str(g.get("name")))],
        ))
    return out


def _extension_broken(snapshot: dict, key: str, cause: str) -> list[Finding]:
    sec = _section(snapshot, key)
    probe = sec.get("probe") if isinstance(sec.get("probe"), dict) else {}
    if not sec.get("installed") or probe.get("status") in (None, "ok", "missing", "skipped"):
        return []
    reason = probe.get("reason") or probe.get("status")
    return [_finding(
        cause, "error", "does_not_load", words={"version": sec.get("version", ""), "reason": reason},
        evidence=_stderr_evidence(probe, key) or [_ev(f"{key}.probe", str(reason))],
        facts={"probe_status": probe.get("status"), "torch": _torch_base_version(snapshot)},
    )]


@check("flash_attn_broken", area="packages")
def check_flash_attn_broken(snapshot: dict) -> list[Finding]:
    """flash-attn loads in a child process and is new enough"""
    out = _extension_broken(snapshot, "flash_attn", "env.flash_attn_broken")
    fa = _section(snapshot, "flash_attn")
    version = fa.get("version") or _section(snapshot, "packages").get("flash-attn")
    want = requested(snapshot)
    if "flash-attn" in want and not version and ("installed" in fa or "packages" in snapshot):
        if not any(cc < (8, 0) for _, _, cc in _feature_gpus(snapshot)):
            out.append(_finding(
                "env.flash_attn_broken", "error", "requested_missing",
                evidence=[_ev("requested", f"flash-attn requested by {want['flash-attn']}"), _ev("packages", "flash-attn not found")],
            ))
    floor = facts()["minimum_versions"]["flash-attn"]
    if version and version_tuple(version) and version_tuple(version) < version_tuple(floor):
        out.append(_finding("env.flash_attn_broken", "warning", "too_old", words={"version": version, "minimum": floor},
                            evidence=[_ev("packages.flash-attn", str(version))]))
    return out


@check("bnb_broken", area="packages")
def check_bnb_broken(snapshot: dict) -> list[Finding]:
    """bitsandbytes loads with its CUDA library"""
    out = _extension_broken(snapshot, "bitsandbytes", "env.bnb_broken")
    bnb = _section(snapshot, "bitsandbytes")
    if not out and bnb.get("installed") and bnb.get("cuda") is False and gpus(snapshot) and torch_is_cuda_build(snapshot):
        out.append(_finding(
            "env.bnb_broken", "error", "no_cuda_library", words={"version": bnb.get("version", "")},
            evidence=[_ev("bitsandbytes.cuda", str(bnb.get("detail") or "no CUDA backend"))] + _stderr_evidence(bnb.get("probe") or {}, "bitsandbytes"),
        ))
    want = requested(snapshot)
    if "bnb" in want and "installed" in bnb and not bnb.get("installed"):
        out.append(_finding("env.bnb_broken", "error", "requested_missing",
                            evidence=[_ev("requested", f"bnb requested by {want['bnb']}")]))
    return out


@check("version_conflict", area="packages")
def check_version_conflict(snapshot: dict) -> list[Finding]:
    """transformers / peft / accelerate / trl / bitsandbytes / torch version floors"""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    from packaging.version import InvalidVersion, Version

    pk = _section(snapshot, "packages")
    out = []
    for rule in facts()["version_rules"]:
        have, need = pk.get(rule["when"]), pk.get(rule["needs"])
        if not have or not need:
            continue
        try:
            hv, nv = Version(str(have).split("+")[0]), Version(str(need).split("+")[0])
            if hv not in SpecifierSet(rule["when_spec"]) or nv in SpecifierSet(rule["needs_spec"]):
                continue
        except (InvalidVersion, InvalidSpecifier):
            continue
        out.append(_finding(
            "env.version_conflict", rule.get("severity", "error"), "floor",
            words={"package": rule["when"], "version": have, "needs": rule["needs"], "needs_spec": rule["needs_spec"],
                   "found": need, "source": rule["source"], "needs_package": rule["needs"] != "torch",
                   "needs_torch": rule["needs"] == "torch", "package_ceiling": rule["when_spec"].split(",")[0].lstrip(">=~=")},
            evidence=[_ev(f"packages.{rule['when']}", str(have)), _ev(f"packages.{rule['needs']}", str(need))],
            confidence=0.8,
        ))
    return out


@check("ld_library_path", area="packages")
def check_ld_library_path(snapshot: dict) -> list[Finding]:
    """LD_LIBRARY_PATH does not shadow the wheel's CUDA libraries"""
    dirs = _section(snapshot, "system").get("ld_library_path_cuda_dirs") or []
    if not dirs or not torch_info(snapshot).get("installed"):
        return []
    dirs = [d for d in dirs if isinstance(d, dict) and d.get("dir")]
    if not dirs:
        return []
    libs = sorted({lib for d in dirs for lib in d.get("libs") or []})
    cudnn = any("cudnn" in lib for lib in libs)
    return [_finding(
        "env.cudnn" if cudnn else "env.version_conflict", "warning", "ld_library_path",
        evidence=[_ev("system.ld_library_path_cuda_dirs", f"{d['dir']}: {', '.join(d.get('libs') or [])}") for d in dirs[:4]],
        words={"ld_command": _ld_fix(snapshot, dirs)}, confidence=0.6,
    )]


def _ld_fix(snapshot: dict, dirs: list[dict]) -> str:
    keep = [p for p in env_vars(snapshot).get("LD_LIBRARY_PATH", "").split(":") if p and p not in {d.get("dir") for d in dirs}]
    return f"export LD_LIBRARY_PATH={':'.join(keep)}" if keep else "unset LD_LIBRARY_PATH"


ALLOC_KEYS_BOOL = {"expandable_segments", "pinned_use_cuda_host_register", "pinned_use_hip_host_register",
                   "pinned_use_background_threads", "release_lock_on_cudamalloc", "graph_capture_record_stream_reuse"}
ALLOC_KEYS_INT = {"max_split_size_mb", "max_non_split_rounding_mb", "pinned_num_register_threads",
                  "pinned_reserve_segment_size_mb", "large_segment_size_mb"}


def parse_alloc_conf(text: str) -> tuple[dict[str, str], list[str]]:
    """Parse PYTORCH_CUDA_ALLOC_CONF ('key:value,key:value'); returns (options, problems)."""
    options: dict[str, str] = {}
    problems: list[str] = []
    # roundup_power2_divisions may carry a bracketed list with commas: split on commas outside brackets.
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    for part in (p.strip() for p in parts):
        if not part:
            continue
        if ":" not in part:
            problems.append(f"{part!r} has no ':' (the syntax is key:value, e.g. expandable_segments:True)")
            continue
        key, value = (s.strip() for s in part.split(":", 1))
        options[key] = value
        if "=" in key or "=" in value:
            problems.append(f"{part!r} uses '='; the syntax is key:value")
        elif key in ALLOC_KEYS_BOOL:
            if value not in ("True", "False"):
                problems.append(f"{key} takes True or False (capitalised), not {value!r}")
        elif key in ALLOC_KEYS_INT:
            if not re.fullmatch(r"\d+", value):
                problems.append(f"{key} takes an integer (MB), not {value!r}")
            elif key == "max_split_size_mb" and int(value) <= 20:
                problems.append(f"max_split_size_mb must be above 20, not {value}")
        elif key == "garbage_collection_threshold":
            try:
                ok = 0.0 < float(value) < 1.0
            except ValueError:
                ok = False
            if not ok:
                problems.append(f"garbage_collection_threshold takes a fraction between 0 and 1, not {value!r}")
        elif key == "roundup_power2_divisions":
            if not re.fullmatch(r"\d+|\[[\d>:,\s]+\]", value):
                problems.append(f"roundup_power2_divisions takes an integer or a list like [256:1,512:2,>:8], not {value!r}")
        elif key == "backend":
            if value not in ("native", "cudaMallocAsync"):
                problems.append(f"backend is native or cudaMallocAsync, not {value!r}")
        else:
            problems.append(f"unknown option {key!r} (torch stops with `Unrecognized CachingAllocator option: {key}`)")
    if options.get("backend") == "cudaMallocAsync":
        ignored = [k for k in ("max_split_size_mb", "roundup_power2_divisions", "garbage_collection_threshold") if k in options]
        if ignored:
            problems.append(f"backend:cudaMallocAsync ignores {', '.join(ignored)}")
    return options, problems


@check("settings", area="settings")
def check_settings(snapshot: dict) -> list[Finding]:
    """PYTORCH_CUDA_ALLOC_CONF syntax, CUDA_LAUNCH_BLOCKING, offline and NCCL flags"""
    ev_vars = env_vars(snapshot)
    out = []
    confs = {k: ev_vars[k] for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF") if k in ev_vars}
    for name, value in confs.items():
        _, problems = parse_alloc_conf(value)
        if problems:
            out.append(_finding(
                "env.bad_setting", "error", "alloc_conf_invalid", words={"name": name, "problem": problems[0]},
                evidence=[_ev(f"env_vars.{name}", value)] + [_ev(f"env_vars.{name}", p) for p in problems[1:]],
            ))
    if len(confs) == 2 and len(set(confs.values())) == 2:
        out.append(_finding("env.bad_setting", "warning", "alloc_conf_disagree",
                            evidence=[_ev(f"env_vars.{k}", v) for k, v in confs.items()]))
    if ev_vars.get("CUDA_LAUNCH_BLOCKING", "").strip() == "1":
        out.append(_finding("env.bad_setting", "warning", "launch_blocking", evidence=[_ev("env_vars.CUDA_LAUNCH_BLOCKING", "1")]))
    offline = [k for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE") if ev_vars.get(k, "").strip().lower() in ("1", "true", "yes", "on")]
    if offline:
        out.append(_finding("env.bad_setting", "info", "offline", words={"name": offline[0]},
                            evidence=[_ev(f"env_vars.{k}", ev_vars[k]) for k in offline], confidence=0.8))
    if ev_vars.get("NCCL_P2P_DISABLE") == "1" or ev_vars.get("NCCL_IB_DISABLE") == "1":
        keys = [k for k in ("NCCL_P2P_DISABLE", "NCCL_IB_DISABLE") if ev_vars.get(k) == "1"]
        out.append(_finding("env.bad_setting", "info", "nccl_disabled", words={"names": " and ".join(keys)},
                            evidence=[_ev(f"env_vars.{k}", "1") for k in keys], confidence=0.7))
    return out


@check("other_process", area="gpu")
def check_other_process(snapshot: dict) -> list[Finding]:
    """no other process holds GPU memory"""
    out = []
    for i, g in enumerate(gpus(snapshot)):
        total = g.get("memory_total_bytes") or 0
        free = g.get("memory_free_bytes")
        threshold = max(512 * MIB, int(total * 0.02))
        for p in g.get("processes") or []:
            used = p.get("used_bytes") or 0
            if p.get("ours") or used < threshold:
                continue
            pid, name = p.get("pid"), p.get("name") or "name not shown"
            if pid is None:
                pid_text, kill = "pid not shown", "nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv"
            else:
                pid_text, kill = f"pid {pid}", f"kill {pid}   # then: kill -9 {pid}"
            zombie = p.get("alive") is False or p.get("status") == "zombie"
            tight = total and free is not None and free < 0.1 * total
            words = {"used": format_bytes(used), "gpu": _gpu_label(i, g), "pid_text": pid_text, "name": name, "kill": kill,
                     "gpu_index": g.get("index", i),
                     "parent_kill": f"kill {p['ppid']}" if p.get("ppid") else f"kill $(ps -o ppid= -p {pid})"}
            if total and free is not None:
                words.update(free=format_bytes(free), total=format_bytes(total))
            if len(gpus(snapshot)) > 1:
                words["other_gpu"] = _other_gpu(snapshot, i)
            out.append(_finding(
                "oom.other_process", "error" if tight else "warning", "zombie" if zombie else "running", words=words,
                evidence=[_ev(f"nvidia.gpus[{i}].processes", f"{pid_text} {name} {format_bytes(used)}"
                              + (" (not running: zombie)" if zombie else ""))],
                facts={"pid": pid, "used_bytes": used, "memory_free_bytes": free}, confidence=0.85,
            ))
        unlisted = unlisted_bytes(g)
        if unlisted_is_large(unlisted, total):
            # memory no listed process accounts for: another container or VM, another PID namespace,
            # or a dead process whose memory the driver still holds (or, in a container, this job itself)
            tight = total and free is not None and free < 0.1 * total
            words = {"unlisted": format_bytes(unlisted), "gpu": _gpu_label(i, g), "gpu_index": g.get("index", i)}
            if total and free is not None:
                words.update(free=format_bytes(free), total=format_bytes(total))
            listed, used = len(g.get("processes") or []), g["memory_used_bytes"]
            held = (f"{format_bytes(used - unlisted)} of it by the {listed} listed process{'' if listed == 1 else 'es'}"
                    if listed else "no process listed")
            out.append(_finding(
                "oom.other_process", "error" if tight else "warning", "unlisted", words=words,
                evidence=[_ev(f"nvidia.gpus[{i}].memory_used_bytes", f"{format_bytes(used)} in use, {held}")],
                facts={"unlisted_bytes": unlisted, "memory_free_bytes": free}, confidence=0.6,
            ))
    return out


def _other_gpu(snapshot: dict, busy: int) -> str:
    for i, g in enumerate(gpus(snapshot)):
        if i != busy:
            return str(g.get("index", i))
    return str(busy)


THROTTLE_BAD = {"hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown", "hw_power_brake_slowdown"}


@check("thermal_power", area="health")
def check_thermal_power(snapshot: dict) -> list[Finding]:
    """throttle reasons, temperature, PCIe link"""
    out = []
    for i, g in enumerate(gpus(snapshot)):
        reasons = set(g.get("throttle_reasons") or [])
        bad = sorted(reasons & THROTTLE_BAD)
        temp, slow = g.get("temperature_c"), g.get("slowdown_temp_c")
        hot = temp is not None and slow is not None and temp >= slow - 5
        if bad or hot:
            ev = []
            if bad:
                ev.append(_ev(f"nvidia.gpus[{i}].throttle_reasons", ", ".join(sorted(reasons))))
            if temp is not None:
                ev.append(_ev(f"nvidia.gpus[{i}].temperature_c", f"{temp} C (slowdown at {slow} C)" if slow is not None else f"{temp} C"))
            if g.get("power_draw_w") is not None:
                limit = g.get("power_limit_w")
                ev.append(_ev(f"nvidia.gpus[{i}].power_draw_w", f"{g.get('power_draw_w')} W of {limit} W" if limit is not None else f"{g.get('power_draw_w')} W"))
            out.append(_finding(
                "hw.thermal_power", "warning", "throttling", evidence=ev, confidence=0.8,
                words={"gpu": _gpu_label(i, g), "reasons": ", ".join(bad) or "near its slowdown temperature", "gpu_index": g.get("index", i)},
            ))
        gc, gm = g.get("pcie_gen_current"), g.get("pcie_gen_max")
        wc, wm = g.get("pcie_width_current"), g.get("pcie_width_max")
        if wc and wm and wc < wm:
            out.append(_finding(
                "hw.thermal_power", "info", "pcie_narrow", confidence=0.4,
                words={"gpu": _gpu_label(i, g), "width_current": wc, "width_max": wm,
                       "gen_current": gc if gc and gm else None, "gen_max": gm if gc and gm else None},
                evidence=[_ev(f"nvidia.gpus[{i}].pcie_width_current", f"x{wc} of x{wm}")],
            ))
    return out


@check("memory_errors", area="health")
def check_memory_errors(snapshot: dict) -> list[Finding]:
    """ECC errors, retired pages, row remapping"""
    out = []
    for i, g in enumerate(gpus(snapshot)):
        ev, severity = [], None

        def flag(key: str, text: str, sev: str) -> None:
            nonlocal severity
            ev.append(_ev(f"nvidia.gpus[{i}].{key}", text))
            if severity is None or (sev == "error" and severity != "error"):
                severity = sev

        if (g.get("ecc_uncorrected_volatile") or 0) > 0:
            flag("ecc_uncorrected_volatile", f"{_count(g['ecc_uncorrected_volatile'], 'uncorrectable ECC error')} since the last reset", "error")
        if g.get("remapped_rows_failure"):
            flag("remapped_rows_failure", "row remapping failure occurred", "error")
        if g.get("remapped_rows_pending"):
            flag("remapped_rows_pending", "row remapping pending: the GPU needs a reset", "error")
        if g.get("retired_pages_pending"):
            flag("retired_pages_pending", "page retirement pending: the GPU needs a reset", "error")
        if (g.get("ecc_uncorrected_aggregate") or 0) > 0:
            flag("ecc_uncorrected_aggregate", f"{_count(g['ecc_uncorrected_aggregate'], 'uncorrectable ECC error')} over the card's life", "warning")
        if (g.get("retired_pages_dbe") or 0) > 0:
            flag("retired_pages_dbe", f"{_count(g['retired_pages_dbe'], 'page')} retired for double-bit errors", "warning")
        if (g.get("remapped_rows_uncorrectable") or 0) > 0:
            flag("remapped_rows_uncorrectable", f"{_count(g['remapped_rows_uncorrectable'], 'row')} remapped for uncorrectable errors", "warning")
        if severity:
            out.append(_finding("hw.memory_errors", severity, evidence=ev, confidence=0.85,
                                words={"gpu": _gpu_label(i, g), "gpu_index": g.get("index", i)}))
    return out


@check("host", area="system")
def check_host(snapshot: dict) -> list[Finding]:
    """/dev/shm, free disk for checkpoints and the HF cache, host RAM"""
    s = _section(snapshot, "system")
    out = []
    shm = s.get("shm_bytes")
    if shm is not None and shm < 1 * GIB:
        out.append(_finding("oom.shm", "warning" if s.get("container") else "info", confidence=0.7,
                            evidence=[_ev("system.shm_bytes", format_bytes(shm))], words={"shm_size": format_bytes(shm)}))
    for key, label in (("disk_free_cwd_bytes", "the working directory (checkpoints)"), ("disk_free_hf_cache_bytes", "the Hugging Face cache")):
        free = s.get(key)
        where = key.replace("disk_free_", "path_").replace("_bytes", "")
        if key == "disk_free_hf_cache_bytes" and free == s.get("disk_free_cwd_bytes"):
            continue  # same filesystem: one finding is enough
        if free is not None and free < 20 * GIB:
            out.append(_finding(
                "env.disk_space", "warning" if free >= 5 * GIB else "error", confidence=0.7,
                evidence=[_ev(f"system.{key}", f"{format_bytes(free)} free at {s[where]}" if s.get(where) else f"{format_bytes(free)} free")],
                words={"free": format_bytes(free), "place": label},
            ))
    ram = s.get("ram_total_bytes")
    if ram is not None and ram < 16 * GIB and gpus(snapshot):
        out.append(_finding("oom.host_ram", "info", confidence=0.5, evidence=[_ev("system.ram_total_bytes", format_bytes(ram))],
                            words={"ram": format_bytes(ram)}))
    return out


@check("mig", area="gpu")
def check_mig(snapshot: dict) -> list[Finding]:
    """MIG mode"""
    out = []
    for i, g in enumerate(gpus(snapshot)):
        if str(g.get("mig_mode") or "").lower() == "enabled":
            out.append(_finding("env.no_gpu_visible", "info", "mig", words={"gpu": _gpu_label(i, g)},
                                evidence=[_ev(f"nvidia.gpus[{i}].mig_mode", "Enabled")], confidence=0.7))
    return out


@check("deep_matmul", area="health")
def check_deep_matmul(snapshot: dict) -> list[Finding]:
    """--deep: bf16 / fp16 matmul on each GPU matches fp32"""
    out = []
    devices = {d.get("index"): d for d in torch_info(snapshot).get("devices") or [] if isinstance(d, dict)}
    for r in torch_info(snapshot).get("deep") or []:
        idx = r.get("index")
        dev = devices.get(idx, {})
        cc = cc_tuple(dev.get("capability"))
        label = f"GPU {idx} ({dev['name']})" if dev.get("name") else f"GPU {idx}"
        for dtype in ("bf16", "fp16"):
            res = r.get(dtype)
            if not isinstance(res, dict) or res.get("ok"):
                continue
            if dtype == "bf16" and cc is not None and cc < (8, 0):
                continue  # expected on pre-Ampere; the bf16 check explains it
            err = str(res.get("error") or "")
            no_kernel = "no kernel image" in err
            detail = err or f"max relative error {res.get('max_rel_err')} against fp32"
            out.append(_finding(
                "env.arch_unsupported" if no_kernel else "cuda.illegal_access", "error", "deep_matmul",
                words={"dtype": dtype, "gpu": label, "outcome": "failed" if err else "gave wrong results", "detail": detail},
                evidence=[_ev(f"torch.deep[{idx}].{dtype}", detail)], repro=dtype, confidence=0.8, headline_limit=200,
            ))
    return out


# ---------------------------------------------------------------- can this machine fine-tune on a GPU?

GATE_CHECK = "gpu_training"
# A probe error that means "there is no NVIDIA driver / GPU here" (a timeout or a mismatch means something else).
_NO_DRIVER = re.compile(r"not found|no nvidia|no devices|shows no|(?:couldn't|could not) communicate|not installed|"
                        r"no such file|has failed", re.I)
# Checks whose error or warning already says why GPU training cannot start here (the gate stays silent then).
_GATE_EXPLAINED_BY = ("nvml_mismatch", "torch_installed", "torch_broken", "torch_cpu_only", "driver_too_old", "no_gpu_visible")


def gpu_training_blockers(snapshot: dict) -> list[tuple[str, str]]:
    """(where, why) for what is known to stop GPU fine-tuning on the machine the snapshot describes: no
    NVIDIA driver or GPU, no torch, a CPU-only torch, a CUDA torch that sees no GPU. Only what the snapshot
    shows counts: an `nvidia-smi` paste says nothing about torch, so torch is not a blocker there."""
    t = torch_info(snapshot)
    if t.get("hip_version") or "+rocm" in str(t.get("version") or ""):
        return []  # an AMD machine: not ours to judge
    out: list[tuple[str, str]] = []
    nv = snapshot.get("nvidia")
    if isinstance(nv, dict):
        if nv.get("error") and _NO_DRIVER.search(str(nv["error"])):
            out.append(("nvidia.error", "no NVIDIA GPU or driver was found (" + str(nv["error"]).replace("could not check: ", "") + ")"))
        elif isinstance(nv.get("gpus"), list) and not gpus(snapshot):
            out.append(("nvidia.gpus", "the NVIDIA driver lists no GPU"))
    if t.get("installed") is False:
        out.append(("torch", "torch is not installed"))
    elif t.get("installed") and torch_ok(snapshot):
        if torch_is_cuda_build(snapshot) is False:
            out.append(("torch.cuda_version", f"torch {t.get('version')} is a CPU-only build"))
        elif torch_is_cuda_build(snapshot) and gpus(snapshot) and (t.get("cuda_available") is False or t.get("device_count") == 0):
            out.append(("torch.device_count", f"torch {t.get('version')} cannot see the GPU"))
    return out


@check(GATE_CHECK, area="gpu")
def check_gpu_training(snapshot: dict) -> list[Finding]:
    """GPU fine-tuning is possible here: an NVIDIA GPU, and a CUDA torch that sees it"""
    blockers = gpu_training_blockers(snapshot)
    if not blockers:
        return []
    for chk in CHECKS:
        try:
            explained = chk.name in _GATE_EXPLAINED_BY and any(f.severity != "info" for f in chk.fn(snapshot))
        except Exception:  # noqa: BLE001 - that check reports its own failure
            explained = False
        if explained:
            return []  # that finding leads and says why
    why = [w for _, w in blockers]
    no_gpu = any(where.startswith("nvidia") for where, _ in blockers)
    reason = why[0] if len(why) == 1 else ", ".join(why[:-1]) + " and " + why[-1]
    asked = requested(snapshot)
    evidence = [_ev(where, w) for where, w in blockers] + [_ev("requested", f"{feat} requested by {src}") for feat, src in asked.items()]
    return [_finding(
        "env.no_gpu_visible" if no_gpu else "env.torch_cpu_only", "warning", "gpu_training", evidence=evidence,
        facts={"gpu_fine_tuning_possible": False, "reasons": why}, confidence=0.95,
        # without a GPU, `repro run cuda-init` only SKIPs: the fixes say how to see why there is none
        words={"reason": reason, "no_gpu": no_gpu, "cpu_build": any(where == "torch.cuda_version" for where, _ in blockers),
               "needs_torch": any(where in ("torch", "torch.cuda_version") for where, _ in blockers)},
    )]


def _gate_severity(findings: list[Finding], snapshot: dict, strict: bool) -> None:
    """Issue 12: a machine that cannot fine-tune on a GPU is an error when a GPU feature was asked for with
    --want (here, not on a card named with --gpu), or under --strict; and that finding leads the report."""
    want = _section(snapshot, "requested")
    # `env --want` only: preflight records its run config as a request too, and decides GO / NO-GO itself.
    asked_here = bool(want.get("features")) and want.get("source", "--want") == "--want" and not named_card(snapshot)
    for f in findings:
        if f.severity == "warning" and (f.rule == f"env.{GATE_CHECK}" or (
                f.rule[4:] in _GATE_EXPLAINED_BY and f.cause in ("env.torch_cpu_only", "env.no_gpu_visible"))):
            if strict or asked_here:
                f.severity = "error"



def run_checks(snapshot: dict, only: Optional[Iterable[str]] = None, strict: bool = False) -> list[Finding]:
    """Run every check (or the named ones) on a snapshot; findings ranked errors first, then numbered
    in the order a report shows them (grouped by area).

    A check that raises becomes its own finding (`internal.check_failed`, "could not check: <check>:
    <error>"), never a cause of the user's; the other checks still run.
    """
    from loradoctor import catalogue

    wanted = set(only) if only else None
    if wanted:
        unknown = wanted - set(CHECK_NAMES)
        if unknown:
            from loradoctor.errors import UserError

            raise UserError(f"unknown check {', '.join(sorted(unknown))}; `loradoctor env --list-checks` lists them")
    findings: list[Finding] = []
    for chk in CHECKS:
        if wanted and chk.name not in wanted:
            continue
        try:
            produced = list(chk.fn(snapshot))
        except Exception as exc:  # noqa: BLE001 - a check bug must not hide the other checks
            error = f"{type(exc).__name__}: {exc}"[:300]
            produced = [_finding("internal.check_failed", "warning", facts={"check": chk.name, "error": error},
                                 evidence=[Evidence(file=f"check:{chk.name}", line=None, text=error)], confidence=0.2)]
        for f in produced:
            f.rule, f.area = f"env.{chk.name}", chk.area
        findings.extend(produced)
    _gate_severity(findings, snapshot, strict)
    gpu_here = has_gpu(snapshot)
    for f in findings:
        if gpu_here and f.repro is None and f.severity != "info" and f.cause in catalogue.causes():
            f.repro = catalogue.get(f.cause).repro  # a repro runs on a GPU: without one it only SKIPs
    return display_order(assign_ranks(findings))


def display_order(ranked: list[Finding]) -> list[Finding]:
    """Renumber ranked findings in the order a report shows them: the GPU gate first, then the problems
    (error / warning) grouped by area, areas in the order of their most important finding, then the info
    notes grouped the same way; so the numbers read 1, 2, 3 down the page and JSON lists the same order."""
    gate = [f for f in ranked if f.rule == f"env.{GATE_CHECK}"]
    rest = [f for f in ranked if f.rule != f"env.{GATE_CHECK}"]
    ordered = list(gate)
    for tier in ([f for f in rest if f.severity != "info"], [f for f in rest if f.severity == "info"]):
        areas: list[str] = []
        for f in tier:
            if f.area not in areas:
                areas.append(f.area)
        ordered += [f for area in areas for f in tier if f.area == area]
    for i, f in enumerate(ordered, 1):
        f.rank = i
    return ordered
