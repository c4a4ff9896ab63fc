"""The cause catalogue: every root-cause id, its wording and its next steps, read from one file
(loradoctor/data/causes.yaml). Rules, env checks, the rule schema's enums and docs/causes.md all
read it; nothing else spells a cause id list.

    cause_ids()              the user-facing cause ids, in catalogue order (a rule's `cause` is one of these)
    repro_ids()              the repro ids a cause or a rule may name (the repro library's registry)
    get(cause_id)            one Cause
    fixes_for(cause_id, facts, audience, variant)   the cause's next steps with {placeholders} filled
    headline / summary       the cause's templated wording for a finding (of one variant)

An env check returns a cause, its facts and evidence, and names a `variant` when the cause has several
wordings (`variants:` in the YAML: a headline, a summary and fixes per situation, e.g. env.no_gpu_visible's
`cvd_hides` and `container`). Templates are the rules' (loradoctor/logs/rules/templates.py): `{name}`,
`{name|filter}`, `[[ optional part ]]`, `{name|or:WORD}`. A headline or summary is the first of its
alternatives whose placeholders the facts fill; a fix whose placeholders they cannot fill is left out. A fix
may carry `when:` / `unless:` in the rules' condition language (loradoctor/logs/rules/condition.py) over the
check's facts and wording values, named `check.<name>` (the names of factnames.CHECK_FACTS): checked when the
catalogue loads, and the fixes that apply are picked by the rules' own `fixes_that_apply`.

`loradoctor docs causes` renders the docs page from it each time (docs/causes.md in the checkout only
points there, so a new cause edits no page); `python -m loradoctor.catalogue --write-docs FILE` writes a
copy, `--check-docs FILE` exits 1 when a copy has drifted.
"""

from __future__ import annotations

import re
import sys
from loradoctor.record import field, record
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

CATALOGUE_PATH = Path(__file__).resolve().parent / "data" / "causes.yaml"
SEVERITIES = ("error", "warning", "info")
AUDIENCES = ("explain", "env")
_ID = re.compile(r"^[a-z0-9_]+\.[a-z0-9_]+$")
_VARIANT = re.compile(r"^[a-z0-9_]+$")


@record(frozen=True)
class CatalogueFix:
    text: str
    command: Optional[str] = None
    only: Optional[str] = None  # "explain" or "env": a step that makes sense for one kind of finding only
    when: Optional[str] = None  # a condition over the check's facts (`check.*`) that must hold for the step
    unless: Optional[str] = None  # a condition that drops the step when it holds
    conditions: tuple = field(default=(None, None), compare=False, repr=False)  # (when, unless) compiled


@record(frozen=True)
class Wording:
    """One variant of a cause's wording: what an env check says in one situation. Empty headline or summary
    fall back to the cause's; fixes None means the cause's own fixes, () means none."""
    headline: tuple[str, ...] = ()
    summary: tuple[str, ...] = ()
    fixes: Optional[tuple[CatalogueFix, ...]] = None


@record(frozen=True)
class Cause:
    id: str
    title: str
    what: str
    evidence: str
    category: str
    severity: str
    repro: Optional[str]
    fixes: tuple[CatalogueFix, ...]
    references: tuple[str, ...]
    headline: tuple[str, ...] = ()
    summary: tuple[str, ...] = ()
    internal: bool = False
    variants: Mapping[str, Wording] = field(default_factory=dict)


class CatalogueError(ValueError):
    """The catalogue file is malformed (a developer error: the file ships with the package)."""


def _texts(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise CatalogueError(f"{where}: expected a string or a list of strings")


def _parse(data: Any, repros: Sequence[str]) -> dict[str, Cause]:
    if not isinstance(data, dict) or not isinstance(data.get("causes"), dict):
        raise CatalogueError(f"{CATALOGUE_PATH.name}: expected a mapping with a `causes:` mapping")
    out: dict[str, Cause] = {}
    for cid, entry in data["causes"].items():
        where = f"{CATALOGUE_PATH.name}: {cid}"
        if not isinstance(cid, str) or not _ID.match(cid):
            raise CatalogueError(f"{where}: a cause id is family.name in lower case")
        if not isinstance(entry, dict):
            raise CatalogueError(f"{where}: expected a mapping")
        missing = [k for k in ("title", "what", "evidence", "category", "severity", "fixes") if k not in entry]
        if missing:
            raise CatalogueError(f"{where}: missing {', '.join(missing)}")
        if entry["category"] != cid.split(".")[0]:
            raise CatalogueError(f"{where}: category {entry['category']!r} is not the id's family")
        if entry["severity"] not in SEVERITIES:
            raise CatalogueError(f"{where}: severity must be one of {', '.join(SEVERITIES)}")
        repro = entry.get("repro")
        if repro is not None and repro not in repros:
            raise CatalogueError(f"{where}: unknown repro {repro!r}")
        fixes = _fixes(entry["fixes"], where)
        variants = {}
        raw = entry.get("variants") or {}
        if not isinstance(raw, dict):
            raise CatalogueError(f"{where}: variants must be a mapping of name -> wording")
        for name, v in raw.items():
            vwhere = f"{where}: variants.{name}"
            if not isinstance(name, str) or not _VARIANT.match(name) or not isinstance(v, dict):
                raise CatalogueError(f"{vwhere}: a variant is a lower_case name with a mapping")
            unknown = set(v) - {"headline", "summary", "fixes"}
            if unknown:
                raise CatalogueError(f"{vwhere}: unknown keys {', '.join(sorted(map(str, unknown)))}")
            variants[name] = Wording(_texts(v.get("headline"), f"{vwhere}.headline"),
                                     _texts(v.get("summary"), f"{vwhere}.summary"),
                                     tuple(_fixes(v["fixes"], vwhere)) if "fixes" in v else None)
        refs = entry.get("references") or []
        if not isinstance(refs, list) or not all(isinstance(r, str) for r in refs):
            raise CatalogueError(f"{where}: references must be a list of strings")
        out[cid] = Cause(
            id=cid, title=entry["title"], what=entry["what"], evidence=entry["evidence"], category=entry["category"],
            severity=entry["severity"], repro=repro, fixes=tuple(fixes), references=tuple(refs),
            headline=_texts(entry.get("headline"), f"{where}: headline"),
            summary=_texts(entry.get("summary"), f"{where}: summary"),
            internal=bool(entry.get("internal")), variants=variants,
        )
    return out


def _fixes(raw: Any, where: str) -> list[CatalogueFix]:
    """A cause's (or variant's) fixes; their `when:` / `unless:` are compiled here, with the rules' condition
    language over the `check.*` names, so a bad one stops the load with its place."""
    from loradoctor.logs.factnames import CHECK_FACT_SET, CHECK_FACTS
    from loradoctor.logs.rules.condition import compile_fix_conditions

    raw = raw or []
    for i, fx in enumerate(raw):
        if not isinstance(fx, dict) or not isinstance(fx.get("text"), str):
            raise CatalogueError(f"{where}: fixes[{i}] needs a text")
        if fx.get("only") not in (None, *AUDIENCES):
            raise CatalogueError(f"{where}: fixes[{i}].only must be one of {', '.join(AUDIENCES)}")
        unknown = set(fx) - {"text", "command", "only", "when", "unless"}
        if unknown:
            raise CatalogueError(f"{where}: fixes[{i}]: unknown keys {', '.join(sorted(map(str, unknown)))}")
        for key in ("when", "unless"):
            if fx.get(key) is not None and not isinstance(fx[key], str):
                raise CatalogueError(f"{where}: fixes[{i}].{key} must be a condition (a string)")
    sources = [(fx.get("when"), fx.get("unless")) for fx in raw]
    problems: list[str] = []
    if any(w or u for w, u in sources):
        conditions = compile_fix_conditions(sources, CHECK_FACT_SET, "a catalogue fix names what the env check found: "
                                            + ", ".join(CHECK_FACTS), problems)
    else:  # most fixes have no condition: nothing to compile (a catalogue load is on every explain's path)
        conditions = [(None, None)] * len(sources)
    if problems:
        raise CatalogueError(f"{where}: {problems[0]}")
    return [CatalogueFix(fx["text"], fx.get("command"), fx.get("only"), when, unless, conditions=pair)
            for fx, (when, unless), pair in zip(raw, sources, conditions)]


def check_facts(facts: Mapping[str, Any]) -> dict[str, Any]:
    """A check's facts and wording values as the catalogue's fix conditions name them: `no_gpu` -> `check.no_gpu`."""
    from loradoctor.logs.factnames import CHECK_GROUP

    return {f"{CHECK_GROUP}.{name}": value for name, value in facts.items()}


@lru_cache(maxsize=1)
def causes() -> dict[str, Cause]:
    """Every cause of the catalogue (user-facing and internal), in file order."""
    from loradoctor import cache

    return _parse(cache.yaml_data(CATALOGUE_PATH, "catalogue"), repro_ids())


def cause_ids() -> list[str]:
    """The user-facing root-cause ids (what a rule or a check may name), in catalogue order."""
    return [c.id for c in causes().values() if not c.internal]


def internal_cause_ids() -> list[str]:
    """loradoctor's own failures ("could not check"): never a rule's cause."""
    return [c.id for c in causes().values() if c.internal]


def repro_ids() -> list[str]:
    """The repro ids (the repro library, loradoctor/repro/catalog.py, is their registry)."""
    from loradoctor.repro.catalog import REPRO_IDS

    return list(REPRO_IDS)


def get(cause_id: str) -> Cause:
    try:
        return causes()[cause_id]
    except KeyError:
        raise KeyError(f"{cause_id!r} is not in the cause catalogue ({CATALOGUE_PATH.name})") from None


# ------------------------------------------------------------------ templates


def fill(template: str, facts: Mapping[str, Any], keep_lines: bool = False) -> Optional[str]:
    """`template` filled from facts with the rules' template language; None when a placeholder outside a
    `[[ optional ]]` part (and without `|or:`) has no value (never a '?' or 'None' in a sentence)."""
    from loradoctor.logs.rules.templates import _OPTIONAL_RE, render_template, template_placeholders

    for name, filt in template_placeholders(_OPTIONAL_RE.sub("", template)):
        if filt != "or" and facts.get(name) is None:
            return None
    return render_template(template, facts, keep_lines=keep_lines)


def first_filled(templates: Sequence[str], facts: Mapping[str, Any]) -> Optional[str]:
    for t in templates:
        text = fill(t, facts)
        if text is not None:
            return text
    return None


def wording(cause_id: str, variant: Optional[str] = None) -> Wording:
    """The wording of one variant of a cause (the cause's own when variant is None)."""
    c = get(cause_id)
    if variant is None:
        return Wording(c.headline, c.summary, None)
    try:
        return c.variants[variant]
    except KeyError:
        raise KeyError(f"{cause_id} has no wording variant {variant!r} in {CATALOGUE_PATH.name}") from None


def headline(cause_id: str, facts: Mapping[str, Any], variant: Optional[str] = None) -> str:
    c, w = get(cause_id), wording(cause_id, variant)
    return first_filled(w.headline, facts) or first_filled(c.headline, facts) or c.title


def summary(cause_id: str, facts: Mapping[str, Any], variant: Optional[str] = None) -> str:
    w = wording(cause_id, variant)
    return first_filled(w.summary or get(cause_id).summary, facts) or ""


def fixes_for(cause_id: str, facts: Mapping[str, Any], audience: str = "env",
              variant: Optional[str] = None) -> list[tuple[str, Optional[str]]]:
    """(text, command) next steps of a cause (or of one of its variants) for one audience, placeholders filled
    from facts; a step for the other audience, one whose `when` does not hold or whose `unless` does (over
    check_facts(facts), picked by the rules' fixes_that_apply) and one whose placeholders the facts cannot fill
    are left out, and a leading 'Or ' is dropped from the first step."""
    from loradoctor.logs.rules.condition import fixes_that_apply

    w = wording(cause_id, variant)
    fixes = [fx for fx in (get(cause_id).fixes if w.fixes is None else w.fixes) if fx.only in (None, audience)]
    out: list[tuple[str, Optional[str]]] = []
    for fx in fixes_that_apply(fixes, [fx.conditions for fx in fixes], check_facts(facts)):
        text = fill(fx.text, facts)
        command = fill(fx.command, facts, keep_lines=True) if fx.command is not None else None
        if text is None or (fx.command is not None and command is None):
            continue
        if not out and text.startswith("Or "):
            text = text[3].upper() + text[4:]
        out.append((text, command))
    return out


# ------------------------------------------------------------------ docs/causes.md


def _doc_template(text: str) -> str:
    """A template as the docs show it: {wheel_tag} -> <wheel tag>; notes appended to a sentence vanish;
    an [[ optional part ]] shows in brackets."""
    text = re.sub(r"\{\w+_note\}", "", text)
    text = re.sub(r"\[\[(.*?)\]\]", r"[\1]", text)
    return re.sub(r"\{(\w+)(?:\|[^{}]*)?\}", lambda m: "<" + m.group(1).replace("_", " ") + ">", text)


def _doc_fix(i: int, fx: CatalogueFix) -> str:
    marks = [m for m in (fx.only, fx.when and f"when `{fx.when}`", fx.unless and f"unless `{fx.unless}`") if m]
    line = f"{i}. {_doc_template(fx.text)}" + (f" ({'; '.join(marks)})" if marks else "")
    return line + (f": `{_doc_template(fx.command)}`" if fx.command else "")


def _doc_variants(c: Cause) -> list[str]:
    """The env checks' wordings of a cause, one bullet per variant with its own next steps."""
    if not c.variants:
        return []
    out = ["", "Env check wordings (`variant`: headline; its own next steps, else the ones above):", ""]
    for name, w in c.variants.items():
        head = _doc_template(w.headline[0]) if w.headline else c.title
        out.append(f"- `{name}`: {head}" + (" (no next step)" if w.fixes == () else ""))
        out += ["  " + _doc_fix(i, fx) for i, fx in enumerate(w.fixes or (), 1)]
    return out


def render_docs() -> str:
    """docs/causes.md, generated from the catalogue."""
    user = [c for c in causes().values() if not c.internal]
    internal = [c for c in causes().values() if c.internal]
    out = [
        "# Root-cause catalog",
        "",
        "<!-- Rendered from loradoctor/data/causes.yaml by `loradoctor docs causes` (or",
        "     `python -m loradoctor.catalogue --write-docs FILE`); edit the YAML. -->",
        "",
        "Every diagnosis that `loradoctor explain` and `loradoctor env` produce names one of these causes by its id.",
        "The ids are stable: tests, JSON output and the benchmark labels use them. A new cause may be added (in",
        "`loradoctor/data/causes.yaml`: this page follows by itself); an id is never renamed.",
        "",
        "| id | what went wrong | typical evidence |",
        "|---|---|---|",
    ]
    out += [f"| {c.id} | {c.what} | {c.evidence} |" for c in user]
    out += ["", "## Next steps per cause", "",
            "The default wording and fixes. A log rule says its own (its YAML title, summary and fixes override these);",
            "an env check takes its wording from here, the cause's own or one of its variants, and fills the <placeholders>",
            "with what it found. Steps marked (explain) or (env) apply to one kind of finding only; (when `...`) only when",
            "the condition over what the check found holds, (unless `...`) only when it does not.", ""]
    for c in user + internal:
        out += [f"### {c.id}", "", f"**{c.title}** · {c.category} · default severity {c.severity}"
                + (f" · confirm: `loradoctor repro run {c.repro}`" if c.repro else ""), ""]
        out += [_doc_fix(i, fx) for i, fx in enumerate(c.fixes, 1)]
        if c.references:
            out += ["", "References: " + ", ".join(c.references)]
        out += _doc_variants(c)
        out.append("")
    if internal:
        out += ["## Internal causes", "",
                "loradoctor's own failures: a finding with one of these ids says a check could not run, never that",
                "something is wrong with your machine or your run. No rule may name them.", ""]
        out += [f"- `{c.id}`: {c.what}" for c in internal]
        out.append("")
    return "\n".join(out)


def main(argv: Optional[list[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 2 and args[0] in ("--write-docs", "--check-docs"):
        path = Path(args[1])
        text = render_docs()
        if args[0] == "--write-docs":
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path} ({len(cause_ids())} causes)")
            return 0
        current = path.read_text(encoding="utf-8") if path.exists() else ""
        if current != text:
            print(f"{path} differs from the catalogue; run: python -m loradoctor.catalogue --write-docs {path}",
                  file=sys.stderr)
            return 1
        return 0
    print("usage: python -m loradoctor.catalogue --write-docs|--check-docs docs/causes.md", file=sys.stderr)
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
