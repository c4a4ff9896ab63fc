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

    from loradoctor.env.probes import child

    code, out, err, timed_out = child.run_capped([python, "-c", child.source("packages.py")], timeout_s)
    if timed_out:
        raise RuntimeError(f"{python}: no answer within {timeout_s:g} s")
    if code != 0:
        tail = (err.strip().splitlines() or [f"exit code {code}"])[-1]
        raise RuntimeError(f"{python}: {tail[:300]}")
    return json.loads(out.strip().splitlines()[-1])


class _StatusLine:
    """On a terminal, one line on stderr redrawn while probes run: which one is awaited and for how long.
    Nothing when stderr is not a terminal (piped, captured, CI)."""

    def __init__(self, waiting: "list[tuple[str, Any]]") -> None:
        self._waiting = waiting  # (label, object with running()) in the order they are awaited
        self._stop = threading.Event()
        self._started = time.monotonic()
        self._drawn = False
        self._thread: Optional[threading.Thread] = None
        if _stderr_is_terminal():
            self._thread = threading.Thread(target=self._run, name="env-status", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        import sys

        while not self._stop.wait(0.5):
            names = [label for label, probe in self._waiting if _is_running(probe)]
            if not names:
                continue
            more = f" (+{len(names) - 1} more)" if len(names) > 1 else ""
            text = f"loradoctor env: waiting for the {names[0]} probe{more}, {time.monotonic() - self._started:.0f} s"
            try:
                sys.stderr.write("\r\033[K" + text)
                sys.stderr.flush()
                self._drawn = True
            except (OSError, ValueError):
                return

    def close(self) -> None:
        import sys

        self._stop.set()
        if self._thread is not None:
            self._thread.join(2)
        if self._drawn:
            try:
                sys.stderr.write("\r\033[K")
                sys.stderr.flush()
            except (OSError, ValueError):
                pass


def _stderr_is_terminal() -> bool:
    import os
    import sys

    try:
        return sys.stderr.isatty() and os.environ.get("TERM") != "dumb"
    except (AttributeError, ValueError):
        return False


def _is_running(probe: Any) -> bool:
    try:
        return bool(probe.running())
    except Exception:  # noqa: BLE001 - the status line must never break a probe
        return False


def collect(deep: bool = False, quick: bool = False, timeout_s: Optional[float] = None,
            python: Optional[str] = None, fresh: bool = False) -> dict[str, Any]:
    """Run every probe concurrently and assemble the snapshot sections (without meta).

    `python`: probe another interpreter (its torch, extensions and packages) instead of this one.
    `fresh`: run the child probes even when a healthy result for this install is remembered.
    """
    from loradoctor.env.probes import child

    if python is not None:
        problem = child.interpreter_problem(python)
        if problem is not None:
            from loradoctor.errors import UserError

            raise UserError(f"--python {python}: {problem}")
    with child.reaping():  # SIGINT / SIGTERM kill the probe children and their descendants first
        return _collect(deep, quick, timeout_s, python, fresh)


def _collect(deep: bool, quick: bool, timeout_s: Optional[float], python: Optional[str],
             fresh: bool) -> dict[str, Any]:
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
    awaited = [("torch", torch_child)] + [(k, probe) for k, (_, probe) in ext_children.items() if probe is not None]
    awaited += [(name, _ThreadRunning(t)) for name, t in threads.items()]
    status = _StatusLine(awaited)
    try:
        return _gather(threads, torch_child, ext_children, python, quick, started)
    finally:
        status.close()


class _ThreadRunning:
    def __init__(self, probe: _ThreadProbe) -> None:
        self._probe = probe

    def running(self) -> bool:
        return self._probe.elapsed_s is None and time.monotonic() - self._probe._started < self._probe.timeout_s


def _gather(threads: dict, torch_child: Any, ext_children: dict, python: Optional[str], quick: bool,
            started: float) -> dict[str, Any]:
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
