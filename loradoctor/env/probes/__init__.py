"""Probes: the edges that touch the machine. Each source has its own module and its own timeout;
`collect` runs them concurrently and records a failure as "could not check: reason" in that
section while the others still finish.

torch, bitsandbytes and flash-attn are never imported here: they run in child processes of the
user's interpreter (child_torch.py, child_ext.py).
"""

from __future__ import annotations

import importlib.metadata as md
import threading
import time
from typing import Any, Callable, Optional

DEFAULT_TIMEOUT_S = 60.0  # a cold `import torch` on a slow disk can take tens of seconds
QUICK_TIMEOUT_S = 15.0
FAST_PROBE_TIMEOUT_S = 10.0  # in-process probes (NVML, /proc, metadata) answer in milliseconds when healthy


def _dist_installed(*names: str) -> Optional[str]:
    for name in names:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            continue
    return None


class _ThreadProbe:
    """Run fn in a daemon thread; a hung call (a wedged NVML) is abandoned at the timeout, not waited for."""

    def __init__(self, name: str, fn: Callable[[], Any], timeout_s: float) -> None:
        self.name, self.timeout_s = name, timeout_s
        self.value: Any = None
        self.error: Optional[str] = None
        self.elapsed_s: Optional[float] = None
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._run, args=(fn,), name=f"probe-{name}", daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self.value = fn()
        except Exception as exc:  # noqa: BLE001 - any probe failure becomes "could not check"
            self.error = f"{type(exc).__name__}: {exc}"
        self.elapsed_s = round(time.monotonic() - self._started, 3)

    def result(self) -> Any:
        self._thread.join(max(0.0, self.timeout_s - (time.monotonic() - self._started)))
        if self._thread.is_alive():
            return {"error": f"could not check: {self.name} probe did not answer within {self.timeout_s:g} s"}
        if self.error is not None:
            return {"error": f"could not check: {self.error}"}
        return self.value


def _packages_in(python: str, timeout_s: float) -> dict[str, str]:
    """The packages probe run by another interpreter (its own site-packages)."""
    import json
    import subprocess
    from pathlib import Path

    source = (Path(__file__).resolve().parent / "packages.py").read_text(encoding="utf-8")
    res = subprocess.run([python, "-c", source], capture_output=True, text=True, timeout=timeout_s)
    if res.returncode != 0:
        tail = (res.stderr.strip().splitlines() or [f"exit code {res.returncode}"])[-1]
        raise RuntimeError(f"{python}: {tail}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def collect(deep: bool = False, quick: bool = False, timeout_s: Optional[float] = None,
            python: Optional[str] = None, fresh: bool = False) -> dict[str, Any]:
    """Run every probe concurrently and assemble the snapshot sections (without meta).

    `python`: probe another interpreter (its torch, extensions and packages) instead of this one.
    `fresh`: run the child probes even when a healthy result for this install is remembered.
    """
    from loradoctor.env.probes import child, envvars, nvidia, packages, remember, system

    child_timeout = timeout_s if timeout_s is not None else (QUICK_TIMEOUT_S if quick else DEFAULT_TIMEOUT_S)
    fast_timeout = min(FAST_PROBE_TIMEOUT_S, child_timeout) if timeout_s is not None else FAST_PROBE_TIMEOUT_S
    started = time.monotonic()

    def child_probe(script: str, args: list[str], module: str, reuse: bool) -> "remember.CachedProbe":
        # a healthy result remembered for this exact install is reused (remember.py says what the key holds)
        key = remember.probe_key(child.source(script), args, module) if reuse and python is None else None
        return remember.CachedProbe(key, module, lambda: child.ChildProbe(script, args, child_timeout, python=python))

    # Children first: `import torch` is the slowest thing we do, everything else overlaps with it.
    torch_child = child_probe("child_torch.py", ["--deep"] if deep else [], "torch", reuse=not (deep or fresh))
    ext_children = {}
    if not quick:
        for key, module, dists in (("bitsandbytes", "bitsandbytes", ("bitsandbytes",)),
                                   ("flash_attn", "flash_attn", ("flash-attn", "flash_attn"))):
            # Another interpreter: we cannot read its metadata from here, so its child decides (find_spec, cheap).
            version = _dist_installed(*dists) if python is None else None
            if version is not None or python is not None:
                ext_children[key] = (version, child_probe("child_ext.py", [module], module, reuse=not fresh))
            else:
                ext_children[key] = (None, None)
    packages_fn = packages.probe if python is None else (lambda: _packages_in(python, fast_timeout))
    threads = {
        "system": _ThreadProbe("system", system.probe, fast_timeout),
        "nvidia": _ThreadProbe("nvidia", lambda: nvidia.probe(fast_timeout), fast_timeout),
        "packages": _ThreadProbe("packages", packages_fn, fast_timeout),
        "env_vars": _ThreadProbe("env_vars", envvars.probe, fast_timeout),
    }
    snap: dict[str, Any] = {name: t.result() for name, t in threads.items()}
    times = {name: t.elapsed_s for name, t in threads.items()}

    torch_section = torch_child.result()
    for key in ("python", "python_executable"):  # the interpreter actually probed
        value = torch_section.pop(key, None)
        if value and isinstance(snap.get("system"), dict) and "error" not in snap["system"]:
            snap["system"][key] = value
    pk = snap.get("packages") if isinstance(snap.get("packages"), dict) else {}
    torch_dist = _dist_installed("torch") if python is None else pk.get("torch")
    if "installed" not in torch_section:
        torch_section["installed"] = torch_dist is not None
    if torch_section.get("installed") and not torch_section.get("version") and torch_dist:
        torch_section["version"] = torch_dist  # from metadata: the import itself failed
    snap["torch"] = torch_section
    times["torch"] = torch_section.get("probe", {}).get("elapsed_s")
    for key, (version, probe) in ext_children.items():
        if probe is None:
            snap[key] = {"installed": False}
            continue
        section = probe.result()
        if version is not None:
            section.setdefault("version", version)
        section.setdefault("installed", True)
        snap[key] = section
        times[key] = section.get("probe", {}).get("elapsed_s")
    if quick:
        for key, dists in (("bitsandbytes", ("bitsandbytes",)), ("flash_attn", ("flash-attn", "flash_attn"))):
            version = _dist_installed(*dists) if python is None else pk.get(dists[0])
            snap[key] = ({"installed": True, "version": version, "error": "could not check: skipped in quick mode"}
                         if version is not None else {"installed": False})
    snap["_probe_times_s"] = times
    snap["_elapsed_s"] = round(time.monotonic() - started, 3)
    return snap
