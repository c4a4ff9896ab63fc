"""JSON output: a schema tag plus plain data. Each report serialises itself (ExplainReport.to_dict,
Finding.to_dict, ...); this module only writes the result."""

from __future__ import annotations

import json
from typing import Any, Iterable

from loradoctor.findings import Finding


def findings_data(findings: Iterable[Finding]) -> list[dict[str, Any]]:
    return [f.to_dict() for f in findings]


def dumps(document: dict[str, Any]) -> str:
    """Stable, readable JSON (sorted keys would scramble the schema-first order, so we keep insertion order)."""
    return json.dumps(document, indent=2, default=_default, ensure_ascii=False)


def _default(obj: Any) -> Any:
    # documents are plain data (each report serialises itself: to_dict); only sets need a hand
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    raise TypeError(f"cannot serialise {type(obj).__name__}")
