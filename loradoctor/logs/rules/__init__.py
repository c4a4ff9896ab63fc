"""The rule library: load, validate and compile YAML rules (docs/rules.md), one module per job.

- `model`: the `Rule`, its lazily compiled regexes, `build_rule` (one YAML mapping -> a Rule).
- `condition`: the safe condition language of `when:` (`Condition`).
- `templates`: summary and title templates (`render_template`, `format_value`).
- `literals`: prefilter literals derived from regexes (`derive_literals`).
- `schema`: where the rules live, rules/schema.json and its validator, cause and repro ids.
- `load`: `load_rules` (built-in library cached, user folders on top).  `lint`: `lint_rules`.

Rules are validated against `rules/schema.json`, then checked further: cause ids (the schema's
enum, which mirrors docs/causes.md), repro ids, unique ids across folders, regexes that compile,
`when` expressions that parse and use known fact names, template placeholders that exist.
Problems become one-line `UserError`s naming the file, the rule id and the field.
"""

from loradoctor.logs.rules.condition import MISSING, Condition, ConditionError
from loradoctor.logs.rules.literals import MIN_DERIVED_LITERAL, derive_literals, paste_tolerant
from loradoctor.logs.rules.load import load_rules
from loradoctor.logs.rules.model import LazyRegexes, Rule, build_rule
from loradoctor.logs.rules.schema import (builtin_rules_dir, cause_ids, load_schema, repro_ids, sync_schema_enums,
                                          validate_schema)
from loradoctor.logs.rules.templates import (FILTERS, check_template, format_value, render_template,
                                             template_placeholders)



def __getattr__(name: str):
    """`lint_rules` on first use: the lint (and its ReDoS timing) is for `rules lint` and the tests, not
    for every `explain` start."""
    if name == "lint_rules":
        from loradoctor.logs.rules.lint import lint_rules

        return lint_rules
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "MISSING", "Condition", "ConditionError", "lint_rules", "MIN_DERIVED_LITERAL", "derive_literals", "paste_tolerant", "load_rules",
    "LazyRegexes", "Rule", "build_rule", "builtin_rules_dir", "cause_ids", "load_schema", "repro_ids",
    "sync_schema_enums", "validate_schema", "FILTERS", "check_template", "format_value", "render_template",
    "template_placeholders",
]
