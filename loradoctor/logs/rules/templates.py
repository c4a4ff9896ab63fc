"""Summary and title templates: `{fact.name|filter}`, `{match.N}`, optional `[[ ... ]]` parts."""

from __future__ import annotations

import math
import re
from typing import Any, Mapping, Optional

from loradoctor.logs.factnames import BYTES_FACTS, FRACTION_FACTS, KNOWN_FACT_SET
from loradoctor.units import format_bytes, gib

# `{fact.name}`, `{fact.name|filter}`, `{match.1|or:PID}` (`or:` prints a stand-in instead of leaving a gap)
_PLACEHOLDER_RE = re.compile(r"\{([A-Za-z_][\w.]*)(?:\|([a-z]+)(?::([^{}|\n]*))?)?\}")
FILTERS = ("bytes", "gib", "pct", "or")


def format_value(name: str, value: Any, filt: Optional[str] = None) -> str:
    """How a fact prints in summaries and explanations."""
    if value is None:
        return "?"
    if filt == "bytes" or (filt is None and name in BYTES_FACTS and isinstance(value, (int, float))):
        return format_bytes(value) if isinstance(value, (int, float)) else str(value)
    if filt == "gib":
        return gib(value) if isinstance(value, (int, float)) else str(value)
    if filt == "pct" or (filt is None and name in FRACTION_FACTS):
        return f"{100 * value:.0f}%" if isinstance(value, (int, float)) else str(value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return str(value)
        return f"{value:.4g}"
    if isinstance(value, (list, tuple, set)):
        return ", ".join(str(v) for v in value)
    return str(value)


def template_placeholders(template: str) -> list[tuple[str, Optional[str]]]:
    return [(m.group(1), m.group(2)) for m in _PLACEHOLDER_RE.finditer(template)]


def check_template(template: str) -> list[str]:
    """Problems with a summary template's placeholders."""
    problems = []
    for name, filt in template_placeholders(template):
        if filt is not None and filt not in FILTERS:
            problems.append(f"unknown filter |{filt} in {{{name}|{filt}}} (use {', '.join(FILTERS)})")
        if name.startswith("match."):
            continue
        if name not in KNOWN_FACT_SET:
            problems.append(f"unknown fact {{{name}}} (see docs/facts.md)")
    return problems


_OPTIONAL_RE = re.compile(r"\[\[(.*?)\]\]", re.S)


def render_template(template: str, facts: Mapping[str, Any], match: Any = None, keep_lines: bool = False) -> str:
    """Fill `{fact.name|filter}` and `{match.N}` / `{match.name}`; a missing value prints `?`,
    except inside `[[ ... ]]`, an optional part left out whole when any value in it is missing
    (`[[ (joined {match.1} of {match.2})]]`), and `{name|or:WORD}`, which prints WORD instead
    (`kill {oom.other_pids|or:PID}`). keep_lines keeps line breaks and indentation (fix commands);
    otherwise whitespace runs become one space."""
    missing: list[bool] = []

    def fill(m: re.Match) -> str:
        name, filt = m.group(1), m.group(2)
        if filt == "or":
            value = _lookup(name, facts, match)
            return m.group(3) or "" if value is None else format_value(name, value)
        if name.startswith("match."):
            key = name[6:]
            value = None
            if match is not None:
                try:
                    value = match.group(int(key) if key.isdigit() else key)
                except (IndexError, KeyError, ValueError):
                    value = None
            if value is None:
                missing.append(True)
                return "?"
            return value
        if facts.get(name) is None:
            missing.append(True)
        return format_value(name, facts.get(name), filt)

    def optional(m: re.Match) -> str:
        missing.clear()
        text = _PLACEHOLDER_RE.sub(fill, m.group(1))
        return "" if missing else text

    text = _OPTIONAL_RE.sub(optional, template)
    text = _PLACEHOLDER_RE.sub(fill, text)
    return text if keep_lines else " ".join(text.split())


def _lookup(name: str, facts: Mapping[str, Any], match: Any) -> Any:
    if not name.startswith("match."):
        return facts.get(name)
    if match is None:
        return None
    key = name[6:]
    try:
        return match.group(int(key) if key.isdigit() else key)
    except (IndexError, KeyError, ValueError):
        return None


def has_placeholders(template: Optional[str]) -> bool:
    return bool(template) and _PLACEHOLDER_RE.search(template) is not None

