"""Loading the rule library: YAML files -> validated, compiled Rules; the built-in library kept
parsed on disk (loradoctor/cache.py) and in memory; user folders added on top."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from loradoctor.errors import UserError
from loradoctor.logs.rules.condition import Condition
from loradoctor.logs.rules.model import Rule, build_rule
from loradoctor.logs.rules.schema import builtin_rules_dir, load_schema, validate_schema

def _load_file(path: Path, eager: bool = True) -> tuple[list[Rule], list[str]]:
    """Rules of one YAML file and its problems, each problem a full one-line message."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present: 10x faster
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.load(fh, Loader=loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        reason = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        return [], [f"{path}{where}: YAML syntax error: {reason}"]
    except (OSError, UnicodeDecodeError) as exc:
        return [], [f"{path}: cannot read: {exc}"]
    if data is None:
        return [], []
    schema = load_schema()
    problems: list[str] = []
    rules: list[Rule] = []
    if not isinstance(data, dict) or not isinstance(data.get("rules"), list):
        return [], [f"{path}: expected a mapping with a `rules:` list at the top"]
    errors = validate_schema(data, schema)
    bad_indexes: set[int] = set()
    for where, message in errors:
        m = re.match(r"rules\[(\d+)\]\.?(.*)", where)
        if m:
            idx = int(m.group(1))
            bad_indexes.add(idx)
            rid = data["rules"][idx].get("id", f"#{idx + 1}") if isinstance(data["rules"][idx], dict) else f"#{idx + 1}"
            problems.append(f"{path}: rule {rid}: {m.group(2) or 'rule'}: {message}")
        else:
            problems.append(f"{path}: {where or 'file'}: {message}")
    for idx, item in enumerate(data["rules"]):
        if idx in bad_indexes or not isinstance(item, dict):
            continue
        rule, found = build_rule(item, str(path), eager=eager)
        problems.extend(f"{path}: rule {item['id']}: {p}" for p in found)
        if rule is not None and not found:
            rules.append(rule)
    return rules, problems


def link_outranks(rules: list[Rule]) -> list[str]:
    """Check every rule's `outranks` against the rules loaded with it (unknown ids, a generic
    catch-all over a specific rule, cycles) and, when all is well, give each rule its
    `outranks_closure` (every id it outranks, directly or through others -> the first hop), which
    the ranking reads. Problems are full one-line messages."""
    by_id = {r.id: r for r in rules}
    problems: list[str] = []
    for r in rules:
        for other in r.outranks:
            o = by_id.get(other)
            if o is None:
                problems.append(f"{r.source}: rule {r.id}: outranks: unknown rule id {other!r}")
            elif r.generic and not o.generic:
                problems.append(f"{r.source}: rule {r.id}: outranks: a generic catch-all cannot outrank "
                                f"the specific rule {other} (catch-alls rank last)")
    closure: dict[str, dict[str, str]] = {}
    on_path: list[str] = []
    reported: set[frozenset] = set()

    def visit(rid: str) -> dict[str, str]:
        done = closure.get(rid)
        if done is not None:
            return done
        if rid in on_path:  # a cycle: report it once, from the rule that closes it
            cycle = on_path[on_path.index(rid):] + [rid]
            if frozenset(cycle) not in reported:
                reported.add(frozenset(cycle))
                r = by_id[on_path[-1]]
                problems.append(f"{r.source}: rule {r.id}: outranks: cycle {' -> '.join(cycle)} "
                                "(an order between rules must not loop)")
            return {}
        on_path.append(rid)
        found: dict[str, str] = {o: o for o in by_id[rid].outranks if o in by_id}  # direct ones first
        for other in by_id[rid].outranks:
            if other in by_id:
                for far in visit(other):
                    found.setdefault(far, other)
        on_path.pop()
        closure[rid] = found
        return found

    for r in rules:
        visit(r.id)
    if not problems:
        for r in rules:
            r.outranks_closure = closure[r.id]
    return problems


def _rule_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())


def _collect(folders: Iterable[Path], lazy: Iterable[Path] = ()) -> tuple[list[Rule], list[str]]:
    """Rules of the folders; those in `lazy` compile their regexes on first use."""
    lazy = {Path(f).resolve() for f in lazy}
    rules: list[Rule] = []
    problems: list[str] = []
    seen: dict[str, str] = {}
    for folder in folders:
        if not folder.is_dir():
            problems.append(f"{folder}: rules folder does not exist")
            continue
        for path in _rule_files(folder):
            found, errs = _load_file(path, eager=folder.resolve() not in lazy)
            problems.extend(errs)
            for rule in found:
                if rule.id in seen:
                    problems.append(f"{path}: rule {rule.id}: id: duplicate id, also defined in {seen[rule.id]}")
                    continue
                seen[rule.id] = str(path)
                rules.append(rule)
    return rules, problems


_CACHE: dict[tuple, list[Rule]] = {}


def _builtin_rules(folder: Path) -> tuple[list[Rule], list[str]]:
    """The built-in rules, parsed once and kept on disk (loradoctor/cache.py) as plain JSON data while
    the rule files and the code that builds them are unchanged: YAML parsing, schema validation and
    literal derivation cost ~0.15 s, reading the JSON back ~0.02 s. Nothing read back is executed
    (no pickle): an entry that is not the expected data is ignored and rebuilt. Rules with problems
    are never kept (the next run reports them again)."""
    import sys

    from loradoctor import __version__, cache

    here = Path(__file__).resolve().parent  # this package, and the log modules beside it (fact names)
    stamp = [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(folder.iterdir()) if p.is_file()]
    code = [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in sorted([*here.glob("*.py"), *here.parent.glob("*.py")])]
    catalogue = here.parent.parent / "data" / "causes.yaml"  # the cause and repro ids rules are checked against
    ids = [(catalogue.stat().st_size, catalogue.stat().st_mtime_ns)] if catalogue.is_file() else []
    key = cache.digest([__version__, sys.version, str(folder), stamp, code, ids, CACHE_FORMAT])
    data = cache.read_json("rules", key)
    if data is not None:
        rules = _rules_from_data(data)
        if rules is not None and not link_outranks(rules):
            return rules, []
    rules, problems = _collect([folder], lazy=[folder])
    problems += link_outranks(rules) if not problems else []
    if not problems:
        cache.write_json("rules", key, [_rule_data(r) for r in rules])
    return rules, problems


CACHE_FORMAT = 6  # bump when _rule_data changes shape (2: outranks; 3: pattern_literals; 4: a fix may carry when / unless;
# 5: when_facts / when_needs_a_fact; 6: exclude_prefilter)


def _rule_data(rule: Rule) -> dict:
    """A built rule as plain data: its fields and the prefilter literals derived from its regexes."""
    data = rule.to_dict()
    data["literals"] = rule.literals
    data["require_literals"] = rule.require_literals
    data["exclude_literals"] = rule.exclude_literals
    # per pattern, the literals one of which each of its matches holds (the engine searches a pattern
    # only in lines holding one): derived here once rather than at every start
    from loradoctor.logs.rules.literals import derive_literals

    data["pattern_literals"] = [derive_literals(p) for p in rule.patterns]
    # a condition reads only the facts it names: one that is false when none of them is there need
    # not even be parsed for an input that has none of them (_ParsedOnUse.evaluate)
    data["when_facts"] = list(rule.condition.facts) if rule.condition is not None else []
    data["when_needs_a_fact"] = rule.condition is not None and not rule.condition.evaluate({})
    return data


def _str_list(items: object) -> list[str]:
    if not isinstance(items, list) or not all(isinstance(x, str) for x in items):
        raise TypeError("a list of fact names")
    return items


def _literal_list(items: list) -> list[tuple[str, bool]]:
    out = []
    for text, ignore_case in items:
        if not isinstance(text, str) or not isinstance(ignore_case, bool):
            raise TypeError("a literal is (text, ignore_case)")
        out.append((text, ignore_case))
    return out


class _ParsedOnUse(Condition):
    """A cached rule's `when`, parsed on first use: it was checked when the cache entry was written,
    and `explain` on a short log evaluates few of them (parsing all cost ~10 ms of every start).
    `gate_facts` are the facts it names and `needs_a_fact` says it is false when none of them is
    there (both worked out when the entry was written): such a condition is answered False without a
    parse for an input that has none of them (most when-only rules on a short log)."""

    def __init__(self, expr: str, gate_facts: Sequence[str] = (), needs_a_fact: bool = False) -> None:
        self.expr = expr  # the parse is deferred to the first attribute it makes
        self.__dict__["_gate"] = tuple(gate_facts) if needs_a_fact and gate_facts else None

    def evaluate(self, facts: Mapping[str, Any]) -> bool:
        gate = self.__dict__["_gate"]
        if gate is not None and not any(name in facts for name in gate):
            return False
        return Condition.evaluate(self, facts)

    def __getattr__(self, name: str):
        if name.startswith("__") or "_parsing" in self.__dict__:
            raise AttributeError(name)
        self.__dict__["_parsing"] = True
        Condition.__init__(self, self.expr)
        return getattr(self, name)


def _rules_from_data(data: object) -> "list[Rule] | None":
    """Rules from _rule_data's output; None when the data is not that (damaged, another version)."""
    from loradoctor.findings import Fix
    from loradoctor.logs.rules.model import LazyRegexes

    if not isinstance(data, list):
        return None
    rules = []
    try:
        for d in data:
            rule = Rule(
                id=d["id"], cause=d["cause"], title=d["title"], severity=d["severity"],
                confidence=float(d["confidence"]), summary=d["summary"], patterns=list(d["patterns"]),
                prefilter=list(d["prefilter"]), require_all=list(d["require_all"]), exclude=list(d["exclude"]),
                exclude_prefilter=list(d["exclude_prefilter"]), when=d["when"], facts=list(d["facts"]),
                fixes=[Fix(text=f["text"], command=f["command"]) for f in d["fixes"]],
                fix_when=[f.get("when") for f in d["fixes"]], fix_unless=[f.get("unless") for f in d["fixes"]],
                repro=d["repro"], consequence_of=list(d["consequence_of"]), outranks=list(d["outranks"]),
                outranks_reason=d["outranks_reason"], generic=bool(d["generic"]),
                references=list(d["references"]), falsepositives=d["falsepositives"], docs=d["docs"],
                source=d["source"],
            )
            rule.compiled_patterns = LazyRegexes(rule.patterns)
            rule.compiled_require = LazyRegexes(rule.require_all)
            rule.compiled_exclude = LazyRegexes(rule.exclude)
            rule.condition = (_ParsedOnUse(rule.when, _str_list(d["when_facts"]), d["when_needs_a_fact"] is True)
                              if rule.when else None)
            # fix conditions were checked when the entry was written; parsed on first use (fixes_for)
            rule.literals = _literal_list(d["literals"])
            rule.require_literals = [_literal_list(x) for x in d["require_literals"]]
            rule.exclude_literals = [_literal_list(x) for x in d["exclude_literals"]]
            gates = [None if x is None else _literal_list(x) for x in d["pattern_literals"]]
            if len(gates) != len(rule.patterns):
                raise ValueError("pattern_literals do not match the patterns")
            rule.pattern_literals = gates  # read by the engine (_pattern_gates)
            rules.append(rule)
    except Exception:  # noqa: BLE001 - a damaged entry is rebuilt, never fatal
        return None
    return rules


def load_rules(extra_dirs: Iterable["str | Path"] = (), include_builtin: bool = True) -> list[Rule]:
    """The built-in rules plus those in `extra_dirs`, validated and compiled. Raises UserError with
    the first problem (file, rule id, field) in one line; `lint_rules` lists them all."""
    builtin = builtin_rules_dir()
    extra = [Path(d) for d in extra_dirs]
    folders = ([builtin] if include_builtin else []) + extra
    key = tuple((str(f), tuple((p.name, p.stat().st_mtime_ns) for p in _rule_files(f)) if f.is_dir() else ())
                for f in folders)
    if key in _CACHE:
        return list(_CACHE[key])
    rules, problems = _builtin_rules(builtin) if include_builtin else ([], [])
    if extra:
        more, extra_problems = _collect(extra)
        from loradoctor.logs.rules.redos import timed_regex_problems

        problems += extra_problems + timed_regex_problems(more)  # a user regex that runs away is refused
        seen = {r.id: r.source for r in rules}
        for rule in more:
            if rule.id in seen:
                problems.append(f"{rule.source}: rule {rule.id}: id: duplicate id, also defined in {seen[rule.id]}")
                continue
            seen[rule.id] = rule.source
            rules.append(rule)
        if not problems:
            problems += link_outranks(rules)  # a user rule may outrank a built-in one
    if problems:
        more = f" (and {len(problems) - 1} more problem(s); run `loradoctor rules lint`)" if len(problems) > 1 else ""
        raise UserError(problems[0] + more)
    _CACHE.clear()
    _CACHE[key] = rules
    return list(rules)

