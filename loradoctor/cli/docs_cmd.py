"""`loradoctor docs [TOPIC]` and `loradoctor gpus`: the documentation and the GPU card table, both
shipped inside the installed package, so output can point to them on any machine."""

from __future__ import annotations

from pathlib import Path

from loradoctor.errors import UserError

DOCS_HELP = """Read the documentation shipped with loradoctor (the Markdown files of docs/).

examples:
  loradoctor docs                 (list the topics)
  loradoctor docs causes
  loradoctor docs rules | less
"""

GPUS_HELP = """The GPU card table that --gpu NAME is matched against: the memory nvidia-smi reports as its
total, the compute capability, and native bf16. Names match loosely ('rtx 4090', '4090', aliases).

examples:
  loradoctor gpus
  loradoctor gpus --format json | jq -r 'keys[]'
"""


def build_parser(name: str):
    from loradoctor.cli._args import format_option, new_parser

    if name == "gpus":
        p = new_parser(name, GPUS_HELP, func=lambda o: gpus(**o))
        format_option(p, ("text", "json"))
        return p
    p = new_parser(name, DOCS_HELP, func=lambda o: docs(**o))
    p.add_argument("topic", nargs="?", metavar="TOPIC", help="a topic from `loradoctor docs` (e.g. causes, rules, env)")
    return p


def docs_dir() -> Path:
    """The shipped docs: the installed `loradoctor.docs` package, or `docs/` in a checkout."""
    try:
        from importlib.resources import files

        path = Path(str(files("loradoctor.docs")))
        if path.is_dir():
            return path
    except (ModuleNotFoundError, TypeError):
        pass
    import loradoctor

    return Path(loradoctor.__file__).resolve().parent.parent / "docs"


def topics() -> dict[str, Path]:
    """topic name -> Markdown file (sub-folders give 'folder/name')."""
    root = docs_dir()
    return {str(p.relative_to(root).with_suffix("")): p for p in sorted(root.rglob("*.md"))}


def _title(path: Path) -> str:
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            return line.lstrip("#").strip()
    return ""


def docs(topic: str = None) -> int:
    from loradoctor.render.output import write_report

    known = topics()
    if not known:
        raise UserError(f"no documentation found in {docs_dir()} (a broken install?)")
    if topic is None:
        width = max(len(t) for t in known)
        lines = ["topics (loradoctor docs TOPIC prints one):"]
        lines += [f"  {name:<{width}}  {_title(path)}" for name, path in known.items()]
        write_report("\n".join(lines))
        return 0
    key = topic.strip().lower().removesuffix(".md").removeprefix("docs/")
    if key not in known:
        import difflib

        close = difflib.get_close_matches(key, list(known), n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        raise UserError(f"docs: no topic {topic!r}; {hint}topics: {', '.join(known)}")
    if key in GENERATED:  # rendered from its data each time, so adding a cause edits no page
        write_report(GENERATED[key](), end="")
        return 0
    write_report(known[key].read_text(encoding="utf-8"), end="")
    return 0


def _causes_page() -> str:
    from loradoctor import catalogue

    return catalogue.render_docs()


# Topics rendered from data: docs/<topic>.md in the checkout only says where the page comes from.
GENERATED = {"causes": _causes_page}


def gpus(fmt: str = "text") -> int:
    from loradoctor.cli._args import check_format
    from loradoctor.estimate.fit import gpu_table
    from loradoctor.render.output import write_report

    fmt = check_format(fmt, ("text", "json"))
    table = gpu_table()
    if fmt == "json":
        from loradoctor.render.json import dumps

        write_report(dumps(table))
        return 0
    rows = [("CARD", "MEMORY", "CC", "BF16", "ALSO MATCHES")]
    for name, spec in table.items():
        memory = f"{int(spec['memory_mib']) / 1024:.2f} GiB" if spec.get("memory_mib") else "-"
        bf16 = {True: "yes", False: "no"}.get(spec.get("bf16"), "-")
        rows.append((name, memory, str(spec.get("cc") or "-"), bf16, ", ".join(str(a) for a in spec.get("aliases") or [])))
    w = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = [f"{a:<{w[0]}}  {b:>{w[1]}}  {c:<{w[2]}}  {d:<{w[3]}}  {e}".rstrip() for a, b, c, d, e in rows]
    lines += ["", "MEMORY is what nvidia-smi reports as total (a little below the datasheet size); "
              "--vram SIZE judges against any other amount."]
    write_report("\n".join(lines))
    return 0
