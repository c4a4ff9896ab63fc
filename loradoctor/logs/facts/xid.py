"""xid: the kernel's NVRM Xid lines (and the device plugin's / dcgm-exporter's Xid reports),
and GPUs that fell off the bus."""

from __future__ import annotations

from loradoctor.record import record
from typing import Any, Optional

from loradoctor.lazyre import lazy_re
from loradoctor.logs.facts.common import MAX_ID, Extractor, Sink, _bounded_int

@record
class XidEvent:
    xid: Optional[int]  # None for "fallen off the bus" lines without an Xid number
    pci: Optional[str] = None
    pid: Optional[int] = None
    process: Optional[str] = None
    text: str = ""
    fell_off_bus: bool = False


_XID_MONITOR_RE = lazy_re(r"XidCriticalError: Xid=(\d+)|DCGM_FI_DEV_XID_ERRORS\{[^}]*\}\s+(\d+)\b")
_XID_RE = lazy_re(r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.\d)?)[^)]*\):\s*(\d+)"
                     r"(?:,\s*pid=('<unknown>'|<unknown>|\d+))?(?:,\s*name=([^,]*))?(?:,\s*(.*))?")
_BUS_RE = lazy_re(r"NVRM: (?:GPU |The NVIDIA GPU )(?:at (?:PCI:)?)?([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.\d)?)"
                     r".*fallen off the bus")
# the driver's three-line form: `NVRM: The NVIDIA GPU 0000:b3:00.0` / `NVRM: (PCI ID: 10de:2335) installed
# in this system has` / `NVRM: fallen off the bus and is not responding to commands.`
_BUS_TAIL_RE = lazy_re(r"NVRM:.*\bfallen off the bus")


def parse_xid(text: str) -> Optional[XidEvent]:
    """`NVRM: Xid (PCI:0000:05:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.`
    and the older / MIG / pid-only shapes (docs/reference/nvidia.md §1.1), plus `GPU ... has
    fallen off the bus` lines without an Xid. None for other text."""
    m = _XID_RE.search(text)
    if m and _bounded_int(m.group(2), MAX_ID) is not None:
        pid = m.group(3)
        name = (m.group(4) or "").strip()
        rest = (m.group(5) or "").strip()
        xid = int(m.group(2))
        return XidEvent(xid=xid, pci=m.group(1).lower(), pid=_bounded_int(pid, MAX_ID) if pid and pid.isdigit() else None,
                        process=name if name and name != "<unknown>" else None, text=rest,
                        fell_off_bus=xid == 79 or "fallen off the bus" in text)
    m = _XID_MONITOR_RE.search(text)
    if m and (_bounded_int(m.group(1) or m.group(2), MAX_ID) or 0) > 0:
        # the Kubernetes device plugin and dcgm-exporter report the driver's Xid without the NVRM line
        xid = int(m.group(1) or m.group(2))
        return XidEvent(xid=xid, text=text.strip(), fell_off_bus=xid == 79)
    b = _BUS_RE.search(text)
    if b:
        return XidEvent(xid=None, pci=b.group(1).lower(), text=text.strip(), fell_off_bus=True)
    if _BUS_TAIL_RE.search(text):
        return XidEvent(xid=None, text=text.strip(), fell_off_bus=True)
    return None



class XidExtractor(Extractor):
    TRIGGERS = (("NVRM", False), ("fallen off the bus", False), ("Xid=", False), ("XID_ERRORS", False))

    def __init__(self, sink: Sink) -> None:
        super().__init__(sink)
        self._xid_count = 0
        self._xid_numbers: list[int] = []

    def feed(self, line: Any) -> bool:
        return self._xid(line)

    def _xid(self, line: Any) -> bool:
        """True when the line is an Xid or fallen-off-the-bus line (each one counts)."""
        event = parse_xid(line.text)
        if event is None:
            return False
        self.sink._evidence("xid", line)
        if event.fell_off_bus:
            self.sink.values["xid.fell_off_bus"] = True
        if event.xid is None:
            return True
        self._xid_count += 1
        if event.xid not in self._xid_numbers:
            self._xid_numbers.append(event.xid)
        self.sink._set_first({"xid.first": event.xid, "xid.pci": event.pci, "xid.pid": event.pid,
                         "xid.process": event.process})
        return True


    def publish(self, values: dict[str, Any]) -> None:
        if self._xid_count:
            values["xid.count"] = self._xid_count
            values["xid.numbers"] = list(self._xid_numbers)
