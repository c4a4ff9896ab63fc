"""Where the rules live and what shape they have: the built-in folder, rules/schema.json (its
cause and repro enums), a small JSON Schema validator for the subset the schema uses (jsonschema
is not a runtime dependency), and the developer tool that keeps the enums in step with the docs."""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional

def builtin_rules_dir() -> Path:
    """The shipped rules: the installed `loradoctor.rules` package, or `rules/` in a checkout."""
    import loradoctor

    package = Path(loradoctor.__file__).resolve().parent
    for path in (package / "rules", package.parent / "rules"):  # installed wheel; a checkout
        if (path / "schema.json").is_file():
            return path
    try:  # any other layout: ask the import system (importlib.resources costs ~10 ms of every start)
        from importlib.resources import files

        path = Path(str(files("loradoctor.rules")))
        if path.is_dir():
            return path
    except (ModuleNotFoundError, TypeError):
        pass
    return package.parent / "rules"


@lru_cache(maxsize=1)
def load_schema() -> dict:
    path = builtin_rules_dir() / "schema.json"
    with open(path, encoding="utf-8") as fh:
        schema = json.load(fh)
    props = schema["$defs"]["rule"]["properties"]  # the enums come from the cause catalogue, not the file
    props["cause"]["enum"], props["repro"]["enum"] = cause_ids(), repro_ids()
    return schema


def cause_ids() -> list[str]:
    """The root-cause ids (loradoctor/data/causes.yaml)."""
    from loradoctor import catalogue

    return catalogue.cause_ids()


def repro_ids() -> list[str]:
    from loradoctor import catalogue

    return catalogue.repro_ids()

# ---------------------------------------------------------------------------------------------
# a small JSON Schema validator (the subset rules/schema.json uses)

_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
}


def validate_schema(value: Any, schema: dict, root: Optional[dict] = None, path: str = "") -> list[tuple[str, str]]:
    """Return (path, message) pairs for every violation; [] when valid."""
    root = root or schema
    if "$ref" in schema:
        ref = schema["$ref"]
        target: Any = root
        for part in ref.lstrip("#/").split("/"):
            target = target[part]
        return validate_schema(value, target, root, path)
    errors: list[tuple[str, str]] = []
    if "anyOf" in schema:
        options = [validate_schema(value, s, root, path) for s in schema["anyOf"]]
        if all(options):
            errors.append((path, f"{value!r} is not valid here ({schema.get('description', 'see the schema')})"))
        return errors
    typ = schema.get("type")
    if typ and not _TYPES[typ](value):
        return [(path, f"must be {'an' if typ[0] in 'aeiou' else 'a'} {typ}, not {type(value).__name__} {value!r}")]
    if "enum" in schema and value not in schema["enum"]:
        shown = ", ".join(map(str, schema["enum"]))
        if len(shown) > 200:
            shown = shown[:200] + "..."
        errors.append((path, f"{value!r} is not one of: {shown}"))
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0):
            errors.append((path, "must not be empty" if schema["minLength"] == 1 else f"must be at least {schema['minLength']} characters"))
        if "pattern" in schema and not re.search(schema["pattern"], value):
            errors.append((path, f"{value!r} does not match {schema['pattern']}"))
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append((path, f"{value} is below {schema['minimum']}"))
        if "maximum" in schema and value > schema["maximum"]:
            errors.append((path, f"{value} is above {schema['maximum']}"))
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for key in schema.get("required", []):
            if key not in value:
                errors.append((f"{path}.{key}" if path else key, "is required"))
        for key, item in value.items():
            sub = f"{path}.{key}" if path else str(key)
            if key in props:
                errors.extend(validate_schema(item, props[key], root, sub))
            elif schema.get("additionalProperties") is False:
                import difflib

                close = difflib.get_close_matches(str(key).lower(), list(props), n=1, cutoff=0.75)
                hint = f" (did you mean {close[0]!r}?)" if close else f" (known: {', '.join(props)})"
                errors.append((sub, f"unknown field{hint}"))
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            errors.extend(validate_schema(item, schema["items"], root, f"{path}[{i}]"))
    return errors


# ---------------------------------------------------------------------------------------------
# keeping the schema's repro enum in step with the repro library (a developer tool)

def sync_schema_enums(repo_root: "str | Path") -> list[str]:
    """Rewrite rules/schema.json's repro enum (for editors; loading uses the repro library) from the repro
    catalog. Returns the ids added. Cause ids are not in the file: the loader fills that enum from the cause
    catalogue, so adding a cause touches no schema. Run `python -m loradoctor.logs.rules sync-schema` after
    adding a repro."""
    root = Path(repo_root)
    repros = repro_ids()
    path = root / "rules" / "schema.json"
    schema = json.loads(path.read_text(encoding="utf-8"))
    props = schema["$defs"]["rule"]["properties"]
    added = [r for r in repros if r not in props["repro"]["enum"]]
    props["repro"]["enum"] = repros
    path.write_text(json.dumps(schema, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    load_schema.cache_clear()
    return added
