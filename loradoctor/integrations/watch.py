"""The bedside doctor inside a training process, for a plain loop or (through DoctorCallback) a Trainer.

    with loradoctor.watch(out="doctor") as doc:
        for step, batch in enumerate(loader):
            loss = train_step(batch)
            doc.step(step=step, loss=loss)

Each `step()` writes one `step` record (loss, grad norm, learning rate, allocated / reserved / peak
GPU memory, step time, tokens per second) to OUT/timeline.jsonl. On an exception it saves
`torch.cuda.memory_summary()` (and the allocator's history when asked), writes OUT/report.md with
the diagnosis of the traceback and the timeline, and re-raises. torch is imported only when it is
already loaded by the training code (sys.modules), never by loradoctor itself.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from typing import Any, Optional

from loradoctor.bedside.timeline import TimelineWriter


def _torch() -> Any:
    return sys.modules.get("torch")


def _cuda(torch: Any) -> bool:
    try:
        return bool(torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized())
    except Exception:  # noqa: BLE001 - a broken CUDA: no memory numbers
        return False


def _float(value: Any) -> Optional[float]:
    if value is None:
        return None
    try:
        if hasattr(value, "detach"):
            value = value.detach().float().item()
        return float(value)
    except Exception:  # noqa: BLE001 - not a number: not recorded
        return None


class Bedside:
    """One watched training process: the timeline writer and what to do on a step or a crash."""

    def __init__(self, out: str = "loradoctor-run", record_memory_history: bool = False, say: Any = None) -> None:
        os.makedirs(out, exist_ok=True)
        self.out = out
        self.writer = TimelineWriter(os.path.join(out, "timeline.jsonl"))
        self.record_history = record_memory_history
        self.say = say or (lambda text: print(f"loradoctor: {text}", file=sys.stderr))
        self._last_t: Optional[float] = None
        self._last_tokens: Optional[float] = None
        self.closed = False
        torch = _torch()
        meta: dict[str, Any] = {"schema": "loradoctor.timeline/1", "pid": os.getpid(), "source": "watch",
                                "cmd": [str(a)[:200] for a in sys.argv[:32]]}
        if _cuda(torch) or (torch is not None and _available(torch)):
            try:
                props = torch.cuda.get_device_properties(torch.cuda.current_device())
                meta["gpus"] = [{"index": torch.cuda.current_device(), "name": props.name, "total_bytes": int(props.total_memory)}]
            except Exception:  # noqa: BLE001
                pass
        try:
            import psutil

            meta["host_ram_bytes"] = int(psutil.virtual_memory().total)
        except Exception:  # noqa: BLE001
            pass
        self.writer.write("meta", **meta)
        if record_memory_history and torch is not None and _available(torch):
            try:
                torch.cuda.memory._record_memory_history(max_entries=100_000)
            except Exception as exc:  # noqa: BLE001 - older torch: no history
                self.say(f"memory history not recorded: {exc}")

    def step(self, step: Optional[int] = None, loss: Any = None, grad_norm: Any = None, lr: Any = None,
             tokens: Optional[float] = None, **extra: Any) -> None:
        """Record one step. `tokens`: tokens seen so far (for tokens per second)."""
        now = time.time()
        rec: dict[str, Any] = {"t": now}
        if step is not None:
            rec["step"] = int(step)
        for name, value in (("loss", loss), ("grad_norm", grad_norm), ("lr", lr)):
            v = _float(value)
            if v is not None:
                rec[name] = v
        torch = _torch()
        if _cuda(torch):
            rec["allocated_bytes"] = int(torch.cuda.memory_allocated())
            rec["reserved_bytes"] = int(torch.cuda.memory_reserved())
            rec["peak_bytes"] = int(torch.cuda.max_memory_allocated())
        if self._last_t is not None:
            rec["step_time_s"] = round(now - self._last_t, 4)
            if tokens is not None and self._last_tokens is not None and now > self._last_t:
                rec["tokens_per_s"] = round((tokens - self._last_tokens) / (now - self._last_t), 1)
        self._last_t, self._last_tokens = now, tokens
        for k, v in extra.items():
            f = _float(v)
            if f is not None:
                rec[k] = f
        self.writer.write("step", **rec)

    def preflight(self, facts: dict[str, Any]) -> None:
        self.writer.write("preflight", **facts)
        for warning in facts.get("warnings", ()):
            self.say(warning)

    def on_exception(self, exc: BaseException) -> Optional[str]:
        """Save what a crash leaves (memory summary, history, traceback), diagnose, say where. Never raises."""
        try:
            torch = _torch()
            text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            self.writer.write("event", name="exception", type=type(exc).__name__, message=str(exc)[:2000])
            parts = [text]
            if _cuda(torch):
                try:
                    summary = torch.cuda.memory_summary()
                    parts.append(summary)
                    with open(os.path.join(self.out, "memory_summary.txt"), "w", encoding="utf-8") as fh:
                        fh.write(summary)
                except Exception:  # noqa: BLE001
                    pass
                if self.record_history:
                    try:
                        torch.cuda.memory._dump_snapshot(os.path.join(self.out, "memory_snapshot.pickle"))
                    except Exception:  # noqa: BLE001
                        pass
            log = os.path.join(self.out, "exception.log")
            with open(log, "w", encoding="utf-8") as fh:
                fh.write("\n".join(parts))
            self.close(exit_code=1)
            from loradoctor.bedside.report import write_report

            findings = write_report(self.out, log, os.path.join(self.out, "timeline.jsonl"))
            top = next((f for f in findings if f.severity in ("error", "warning")), None)
            where = os.path.join(self.out, "report.md")
            self.say(f"{top.cause}: {top.title} (report: {where})" if top else f"report: {where}")
            return where
        except Exception as inner:  # noqa: BLE001 - the doctor must not hide the patient's error
            self.say(f"could not write the report: {type(inner).__name__}: {inner}")
            return None

    def close(self, exit_code: int = 0) -> None:
        if not self.closed:
            self.writer.write("end", exit_code=exit_code)
            self.writer.close()
            self.closed = True

    def __enter__(self) -> "Bedside":
        return self

    def __exit__(self, etype: Any, exc: Any, tb: Any) -> bool:
        if exc is not None and not isinstance(exc, (KeyboardInterrupt, SystemExit, GeneratorExit)):
            self.on_exception(exc)
        self.close(exit_code=0 if exc is None else 1)
        return False  # re-raise


def _available(torch: Any) -> bool:
    try:
        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001
        return False


def watch(out: str = "loradoctor-run", record_memory_history: bool = False) -> Bedside:
    """`with loradoctor.watch(): ...` — see the module doc."""
    return Bedside(out=out, record_memory_history=record_memory_history)
