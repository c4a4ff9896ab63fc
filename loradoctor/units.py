"""Byte sizes: the one parser and formatter every part of loradoctor uses.

Sizes are stored as integer bytes. PyTorch prints binary units (KiB/MiB/GiB); people type
'32GB' or '24G'. Decimal SI units (KB/MB/GB/TB) are 1000-based, binary ones 1024-based, and
a bare 'G' / 'GB' on the command line is treated like the datasheet number (decimal).
"""

from __future__ import annotations

import re
from typing import Optional

_MULT = {
    "b": 1, "byte": 1, "bytes": 1,
    "k": 1000, "kb": 1000, "kib": 1 << 10,
    "m": 1000**2, "mb": 1000**2, "mib": 1 << 20,
    "g": 1000**3, "gb": 1000**3, "gib": 1 << 30,
    "t": 1000**4, "tb": 1000**4, "tib": 1 << 40,
}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")

GIB = 1 << 30
MIB = 1 << 20

# A single GPU with more than 1 PiB is a parse error or driver garbage (WDDM prints such values).
MAX_PLAUSIBLE_BYTES = 1 << 50


def parse_size(text: str, default_unit: str = "b") -> int:
    """'9.20 GiB' -> 9878424780; '32GB' -> 32000000000; '512' -> 512. Raises ValueError."""
    m = _SIZE_RE.match(text.replace(",", ""))
    if not m:
        raise ValueError(f"not a size: {text!r} (try 24GiB, 32GB or 8192MiB)")
    number, unit = m.group(1), (m.group(2) or default_unit).lower()
    if unit not in _MULT:
        raise ValueError(f"unknown size unit {m.group(2)!r} in {text!r}")
    return int(round(float(number) * _MULT[unit]))


def parse_size_or_none(text: str) -> Optional[int]:
    try:
        value = parse_size(text)
    except ValueError:
        return None
    return value if 0 <= value <= MAX_PLAUSIBLE_BYTES else None


def format_bytes(n: Optional[float], precision: int = 2) -> str:
    """Binary units like PyTorch: '512 bytes', '20.00 MiB', '9.20 GiB'."""
    if n is None:
        return "?"
    n = float(n)
    sign = "-" if n < 0 else ""
    n = abs(n)
    if n < 1024:
        return f"{sign}{int(n)} bytes"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024.0
        if n < 1024 or unit == "TiB":
            return f"{sign}{n:.{precision}f} {unit}"
    return f"{sign}{n:.{precision}f} TiB"  # pragma: no cover


def gib(n: Optional[float]) -> str:
    """Always in GiB, for side-by-side numbers: '9.20 GiB'."""
    return "?" if n is None else f"{n / GIB:.2f} GiB"
