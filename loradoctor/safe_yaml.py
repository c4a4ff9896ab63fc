"""Reading small user files (training configs) that may be hostile: one reader for YAML and JSON.

* size: a file larger than `max_bytes` (1 MiB: training configs are a few KiB) is refused before it is
  parsed; only regular files are read (a FIFO would block, a device never ends);
* encoding: UTF-8 with or without a BOM, UTF-16 / UTF-32 with a BOM; anything else (binary, Latin-1) is
  refused with the offset of the first bad byte;
* YAML aliases: the composed node graph is measured with every alias expanded before anything is
  built, so a "billion laughs" file (a few hundred bytes that expand to 10^9 values) is refused instead
  of taking gigabytes and minutes in whatever walks the result; recursive aliases are refused too;
* depth: nesting beyond `MAX_DEPTH` is refused (deep nesting drives the parsers into RecursionError).

Every refusal is a `UserError` whose one line names the file. Public: `read_text`, `load_yaml`,
`load_json`, `load_config_file`.
"""

from __future__ import annotations

import codecs
import json
import os
import stat
from pathlib import Path
from typing import Any

from loradoctor.errors import UserError

MAX_CONFIG_BYTES = 1 << 20  # configs are small; a megabyte is already 100x a large axolotl YAML
MAX_EXPANDED_NODES = 100_000  # values after alias expansion (a 300-line config has about 1,000)
MAX_DEPTH = 200
_MESSAGE_CHARS = 160  # parser messages are cut to this, so an error never repeats a huge value

_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32-le"), (codecs.BOM_UTF32_BE, "utf-32-be"),  # before UTF-16: same first bytes
    (codecs.BOM_UTF8, "utf-8"), (codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be"),
)


def _short(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= _MESSAGE_CHARS else text[: _MESSAGE_CHARS - 3] + "..."


def read_text(path: "str | Path", max_bytes: int = MAX_CONFIG_BYTES) -> str:
    """The file's text, decoded as described in the module docstring. UserError (one line) otherwise."""
    path = Path(path)
    try:
        st = os.stat(path)
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise UserError(f"cannot read {path}: not a regular file")
    if st.st_size > max_bytes:
        raise UserError(f"{path}: {st.st_size:,} bytes is too large for a config (limit {max_bytes:,} bytes)")
    try:
        with open(path, "rb") as handle:
            raw = handle.read(max_bytes + 1)
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(raw) > max_bytes:  # grew since stat
        raise UserError(f"{path}: too large for a config (limit {max_bytes:,} bytes)")
    encoding = "utf-8"
    for bom, name in _BOMS:
        if raw.startswith(bom):
            raw, encoding = raw[len(bom):], name
            break
    try:
        text = raw.decode(encoding)
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not a text file in UTF-8 or UTF-16 (byte {raw[exc.start]:#04x} at offset {exc.start}); "
                        "save it as UTF-8") from None
    if "\x00" in text:
        raise UserError(f"{path}: not a text file (it contains NUL bytes: binary, or UTF-16 without a byte-order mark)")
    return text


def _check_graph(node: Any, path: Path) -> None:
    """Count the values the node graph holds once every alias is expanded (memoised per node, so this is
    linear in the file), and its depth. Refuses recursive aliases, too many values, too deep nesting."""
    from yaml.nodes import MappingNode, SequenceNode

    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    on_stack: set[int] = set()
    stack: list[tuple[Any, bool]] = [(node, False)]
    while stack:
        current, done = stack.pop()
        key = id(current)
        if isinstance(current, MappingNode):
            children = [n for pair in current.value for n in pair]
        elif isinstance(current, SequenceNode):
            children = list(current.value)
        else:
            children = []
        if done:
            on_stack.discard(key)
            size[key] = 1 + sum(size[id(c)] for c in children)
            depth[key] = 1 + max((depth[id(c)] for c in children), default=0)
            if size[key] > MAX_EXPANDED_NODES:
                raise UserError(f"{path}: its YAML aliases expand to more than {MAX_EXPANDED_NODES:,} values "
                                "(an alias bomb?); a training config never needs that")
            if depth[key] > MAX_DEPTH:
                raise UserError(f"{path}: nested more than {MAX_DEPTH} levels deep")
            continue
        if key in size:
            continue
        if key in on_stack:
            raise UserError(f"{path}: a YAML alias refers to itself (a recursive structure); configs cannot use that")
        on_stack.add(key)
        stack.append((current, True))
        for child in children:
            if id(child) in on_stack:
                raise UserError(f"{path}: a YAML alias refers to itself (a recursive structure); configs cannot use that")
            if id(child) not in size:
                stack.append((child, False))


def _value_problem(exc: Exception) -> str:
    if "digits" in str(exc) and "integer string conversion" in str(exc):
        return "a number longer than 4,300 digits"
    return _short(exc)


def _yaml_problem(exc: Exception) -> str:
    problem = getattr(exc, "problem", None)
    mark = getattr(exc, "problem_mark", None)
    if problem:
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        return _short(f"{problem}{where}")
    return _short(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)


def load_yaml(path: "str | Path", max_bytes: int = MAX_CONFIG_BYTES) -> Any:
    """Parse a YAML file with SafeLoader after the checks above. UserError (one line naming the file)."""
    import yaml

    path = Path(path)
    text = read_text(path, max_bytes)
    loader_cls = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    loader = loader_cls(text)
    try:
        try:
            node = loader.get_single_node()
            if node is None:
                return None
            _check_graph(node, path)
            return loader.construct_document(node)
        finally:
            loader.dispose()
    except UserError:
        raise
    except RecursionError:
        raise UserError(f"{path}: nested too deeply to read") from None
    except yaml.YAMLError as exc:
        raise UserError(f"{path}: not valid YAML: {_yaml_problem(exc)}") from None
    except (ValueError, TypeError, OverflowError) as exc:  # e.g. an integer of 5,000 digits
        raise UserError(f"{path}: a value cannot be read: {_value_problem(exc)}") from None


def load_json(path: "str | Path", max_bytes: int = MAX_CONFIG_BYTES) -> Any:
    """Parse a JSON file after the size / encoding checks. UserError (one line naming the file)."""
    path = Path(path)
    text = read_text(path, max_bytes)
    try:
        return json.loads(text)
    except RecursionError:
        raise UserError(f"{path}: nested too deeply to read") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: not valid JSON: {_short(exc.msg)} (line {exc.lineno}, column {exc.colno})") from None
    except ValueError as exc:  # an integer of 5,000 digits
        raise UserError(f"{path}: a value cannot be read: {_value_problem(exc)}") from None


def load_config_file(path: "str | Path", max_bytes: int = MAX_CONFIG_BYTES) -> Any:
    """JSON for `.json` files, YAML otherwise."""
    path = Path(path)
    if path.suffix.lower() == ".json":
        return load_json(path, max_bytes)
    return load_yaml(path, max_bytes)
