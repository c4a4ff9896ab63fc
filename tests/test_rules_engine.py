"""Rule loading, validation, conditions, templates, and the engine's ranking."""

import json
import re
from pathlib import Path

import pytest

from loradoctor.errors import UserError
from loradoctor.logs import rules as rules_mod
from loradoctor.env.facts import snapshot_facts
from loradoctor.logs.engine import explain
from loradoctor.logs.rules import (
    Condition, ConditionError, builtin_rules_dir, cause_ids, derive_literals, lint_rules, load_rules,
    render_template, repro_ids,
)

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "engine"
GIB = 1 << 30


@pytest.fixture(scope="module")
def tiny_rules():
    return load_rules([DATA / "ranking"], include_builtin=False)


def explain_tiny(tiny_rules, *paths, env=None):
    return explain([str(p) for p in paths], rules=tiny_rules, env=env, differential_on=False)


# --- schema, causes, repro ids ----------------------------------------------------------------

def test_schema_enums_mirror_the_docs():
    from loradoctor import catalogue

    # cause ids come from the catalogue at load time (rules/schema.json lists none); repro ids: out of step? run:
    # python -m loradoctor.logs.rules sync-schema
    assert cause_ids() == catalogue.cause_ids() == rules_mod.load_schema()["$defs"]["rule"]["properties"]["cause"]["enum"]
    section = re.search(r"## Repro ids\n(.*?)\n\n", (ROOT / "docs" / "rules.md").read_text(), re.S).group(1)
    listed = [r for r in re.findall(r"`([a-z0-9-]+)`", section) if r != "repro"]
    assert sorted(repro_ids()) == sorted(listed)


def test_jsonschema_accepts_the_real_rule_files_and_our_validator_agrees():
    jsonschema = pytest.importorskip("jsonschema")
    import yaml

    schema = json.loads((ROOT / "rules" / "schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    files = sorted((ROOT / "rules").glob("*.yaml")) + [DATA / "ranking" / "rules.yaml"]
    assert files
    for path in files:
        data = yaml.safe_load(path.read_text())
        jsonschema.validate(data, schema, cls=jsonschema.Draft202012Validator)
        assert rules_mod.validate_schema(data, schema) == [], path


def test_builtin_rules_load_and_lint_clean():
    assert builtin_rules_dir() == ROOT / "rules"
    assert lint_rules() == []
    loaded = load_rules()
    assert len({r.id for r in loaded}) == len(loaded)


def test_validator_rejects_what_jsonschema_rejects():
    jsonschema = pytest.importorskip("jsonschema")
    schema = rules_mod.load_schema()  # the file plus the cause enum from the catalogue, as the loader uses it
    bad = [
        {"rules": [{"id": "Bad_Id", "cause": "oom.capacity", "title": "t", "severity": "error", "summary": "s"}]},
        {"rules": [{"id": "x", "cause": "oom.nope", "title": "t", "severity": "error", "summary": "s"}]},
        {"rules": [{"id": "x", "cause": "oom.capacity", "title": "t", "severity": "fatal", "summary": "s"}]},
        {"rules": [{"id": "x", "cause": "oom.capacity", "title": "t", "severity": "error", "summary": "s", "confidence": 2}]},
        {"rules": [{"id": "x", "cause": "oom.capacity", "title": "t", "severity": "error", "summary": "s", "paterns": []}]},
        {"rules": [{"id": "x", "cause": "oom.capacity", "title": "t", "severity": "error"}]},
        {"rules": [{"id": "x", "cause": "oom.capacity", "title": "t", "severity": "error", "summary": "s", "fixes": [{"cmd": "x"}]}]},
        {"rules": [], "extra": 1},
    ]
    for data in bad:
        assert rules_mod.validate_schema(data, schema), data
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(data, schema, cls=jsonschema.Draft202012Validator)


# --- broken rule files give one clear line --------------------------------------------------

GOOD_RULE = """  - id: {id}
    cause: oom.capacity
    title: t
    severity: error
    confidence: high
    patterns: ['CUDA out of memory']
    summary: s
"""


@pytest.mark.parametrize("body,needle", [
    (GOOD_RULE.format(id="r1").replace("severity: error", "severity: fatal"), "rule r1: severity: 'fatal' is not one of"),
    (GOOD_RULE.format(id="r1").replace("cause: oom.capacity", "cause: oom.made_up"), "rule r1: cause: 'oom.made_up' is not one of"),
    (GOOD_RULE.format(id="r1").replace("patterns:", "paterns:"), "rule r1: paterns: unknown field (did you mean 'patterns'?)"),
    (GOOD_RULE.format(id="r1").replace("'CUDA out of memory'", "'CUDA (out of memory'"), "rule r1: patterns[0]: regex"),
    (GOOD_RULE.format(id="r1") + "    when: 'oom.nope > 1'\n", "rule r1: when: unknown fact 'oom.nope'"),
    (GOOD_RULE.format(id="r1") + "    when: '__import__(\"os\").system(\"x\")'\n", "rule r1: when: call to"),
    (GOOD_RULE.format(id="r1") + "    when: 'oom.count >'\n", "rule r1: when: cannot parse"),
    (GOOD_RULE.format(id="r1").replace("summary: s", "summary: '{oom.bogus_bytes|bytes}'"), "rule r1: summary: unknown fact {oom.bogus_bytes}"),
    (GOOD_RULE.format(id="r1").replace("summary: s", "summary: '{oom.free_bytes|mb}'"), "rule r1: summary: unknown filter |mb"),
    (GOOD_RULE.format(id="r1") + "    repro: not-a-repro\n", "rule r1: repro: 'not-a-repro' is not one of"),
    (GOOD_RULE.format(id="r1") + "    facts: [oom.nothing_bytes]\n", "rule r1: facts: unknown fact 'oom.nothing_bytes'"),
    (GOOD_RULE.format(id="r1").replace("'CUDA out of memory'", "'\\d+\\s+\\w+'"), "rule r1: patterns: cannot derive a literal"),
    (GOOD_RULE.format(id="r1") + GOOD_RULE.format(id="r1"), "rule r1: id: duplicate id"),
])
def test_broken_rule_file_names_file_rule_and_field(tmp_path, body, needle):
    path = tmp_path / "bad.yaml"
    path.write_text("rules:\n" + body)
    with pytest.raises(UserError) as exc:
        load_rules([tmp_path], include_builtin=False)
    message = str(exc.value)
    assert "\n" not in message
    assert str(path) in message and needle in message, message


def test_yaml_syntax_error_and_lint_lists_all_problems(tmp_path):
    (tmp_path / "a.yaml").write_text("rules:\n  - id: [unclosed\n")
    (tmp_path / "b.yaml").write_text("rules:\n" + GOOD_RULE.format(id="ok-rule").replace("severity: error", "severity: bad")
                                     + GOOD_RULE.format(id="second").replace("cause: oom.capacity", "cause: x.y"))
    problems = lint_rules(tmp_path)
    assert len(problems) == 3, problems
    assert "a.yaml:2: YAML syntax error" in problems[0] or "a.yaml:3: YAML syntax error" in problems[0]
    assert any("rule ok-rule: severity" in p for p in problems) and any("rule second: cause" in p for p in problems)


def test_user_folder_clashing_with_builtin_id(tmp_path):
    builtin_id = load_rules()[0].id
    (tmp_path / "mine.yaml").write_text("rules:\n" + GOOD_RULE.format(id=builtin_id))
    assert any("duplicate id" in p for p in lint_rules(tmp_path))
    with pytest.raises(UserError, match="duplicate id"):
        load_rules([tmp_path])


# --- conditions ------------------------------------------------------------------------------

FACTS = {"oom.requested_bytes": 4 * GIB, "oom.reserved_unallocated_bytes": 9 * GIB, "xid.numbers": [13, 79],
         "oom.phase": "eval", "metrics.loss_nan_count": 0, "metrics.train_finished": True}


@pytest.mark.parametrize("expr,expected", [
    ("oom.reserved_unallocated_bytes >= oom.requested_bytes", True),
    ("oom.reserved_unallocated_bytes >= 10GiB", False),
    ("oom.reserved_unallocated_bytes > 1.5 * oom.requested_bytes + 512MiB", True),
    ("oom.free_bytes < 1GiB", False),  # missing fact: comparison is false
    ("not oom.free_bytes < 1GiB", True),
    ("defined(oom.free_bytes) or defined(oom.requested_bytes)", True),
    ("any_of(xid.numbers, [48, 63, 79])", True),
    ("any_of(xid.numbers, [48])", False),
    ("any_of(killed.exit_code, [137, -9])", False),
    ("oom.phase in ['eval', 'save']", True),
    ("oom.phase not in ['load']", True),
    ("metrics.loss_nan_count == 0 and metrics.train_finished", True),
    ("oom.requested_bytes / oom.free_bytes > 1", False),  # missing in arithmetic stays missing
    ("oom.requested_bytes / 0 > 1", False),
    ("oom.phase > 3", False),  # type mismatch is false, not an error
    ("1KiB == 1024 and 'GiB' == 'GiB'", True),
])
def test_condition_evaluation(expr, expected):
    assert Condition(expr).evaluate(FACTS) is expected


@pytest.mark.parametrize("expr", [
    "__import__('os')", "oom.count.__class__", "open('x')", "(lambda: 1)()", "[x for x in oom.count]",
    "oom.count[0]", "oom.count if 1 else 2", "a", "oom.count ** 2", "defined(1)", "any_of(xid.numbers)",
    "oom.count @ 1", "oom.count; 1", "getattr(oom, 'count')", "f'{oom.count}'",
])
def test_condition_rejects_unsafe_or_unknown(expr):
    with pytest.raises(ConditionError):
        Condition(expr)


def test_condition_describe_shows_values():
    text = Condition("oom.reserved_unallocated_bytes >= oom.requested_bytes").describe(FACTS)
    assert text == "reserved_unallocated_bytes 9.00 GiB >= requested_bytes 4.00 GiB"


def test_templates():
    import regex

    m = regex.search(r"rank (?P<rank>\d+) code (\d+)", "rank 3 code 137")
    out = render_template("{oom.requested_bytes|bytes} / {oom.requested_bytes|gib} / {oom.step_fraction|pct} / "
                          "{oom.free_bytes} / {match.rank} {match.2} {match.9} / {metrics.train_finished} / {xid.numbers}",
                          {**FACTS, "oom.step_fraction": 0.25}, m)
    assert out == "4.00 GiB / 4.00 GiB / 25% / ? / 3 137 ? / yes / 13, 79"


def test_derived_prefilter_literals():
    assert derive_literals(r"CUDA out of memory\. Tried") == [("CUDA out of memory. Tried", False)]
    assert derive_literals(r"(?i)watchdog caught") == [("watchdog caught", True)]
    assert derive_literals(r"Xid \(.*\): (48|63|64)") == [("Xid (", False)]
    assert sorted(derive_literals(r"element 0 of tensors|no grad_fn here")) == [
        ("element 0 of tensors", False), ("no grad_fn here", False)]
    assert derive_literals(r"\d+ \w+") is None


# --- env snapshot ------------------------------------------------------------------------------

SNAPSHOT = {
    "schema": "loradoctor.snapshot/1",
    "nvidia": {"driver_version": "550.54.15", "gpus": [
        {"index": 0, "name": "NVIDIA GeForce RTX 4090", "compute_capability": "8.9", "memory_total_bytes": 24 * GIB,
         "processes": [{"pid": 1, "name": "python", "used_bytes": 20 * GIB, "ours": True},
                       {"pid": 2, "name": "vllm", "used_bytes": 3 * GIB, "ours": False}]}]},
    "torch": {"installed": True, "cuda_available": True, "cuda_version": "12.4"},
}


def test_env_facts_mapping_and_tolerance():
    f = snapshot_facts(SNAPSHOT)
    assert f == {"env.present": True, "env.driver_version": "550.54.15", "env.gpu_name": "NVIDIA GeForce RTX 4090",
                 "env.compute_capability": 8.9, "env.gpu_total_bytes": 24 * GIB, "env.other_process_bytes": 3 * GIB,
                 "env.torch_cuda_available": True, "env.torch_cuda_version": "12.4"}
    assert snapshot_facts({"nvidia": {"error": "could not check: no driver"}, "torch": {"error": "timeout"}}) == {"env.present": True}
    assert snapshot_facts(None) == {}


# --- ranking ---------------------------------------------------------------------------------

def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


FRAG_OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.40 GiB. GPU 0 has a total capacity of "
            "79.10 GiB of which 2.31 GiB is free. Including non-PyTorch memory, this process has 76.78 GiB memory in "
            "use. Of the allocated memory 66.95 GiB is allocated by PyTorch, and 9.20 GiB is reserved by PyTorch but "
            "unallocated. If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")
OTHER_OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 172.00 MiB. GPU 0 has a total capacity of "
             "23.65 GiB of which 17.06 MiB is free. Process 4242 has 15.00 GiB memory in use. Including non-PyTorch "
             "memory, this process has 8.40 GiB memory in use. Of the allocated memory 7.80 GiB is allocated by "
             "PyTorch, and 110.00 MiB is reserved by PyTorch but unallocated.")


def test_numbers_rank_fragmentation_over_keyword_capacity(tmp_path, tiny_rules):
    path = write(tmp_path, "train.log", "step 1\nTraceback (most recent call last):\n" + FRAG_OOM + "\n")
    report = explain_tiny(tiny_rules, path)
    assert [f.rule for f in report.findings] == ["t-oom-fragmentation", "t-oom-capacity"]
    first = report.findings[0]
    assert first.rank == 1 and first.cause == "oom.fragmentation"
    assert "9.20 GiB reserved but unallocated" in first.summary
    assert "support this more than keyword-only finding #2 (t-oom-capacity)" in first.why_rank
    assert "9.20 GiB >= requested_bytes 4.40 GiB" in first.why_rank
    assert first.facts["oom.reserved_unallocated_bytes"] == 9878424781
    assert any(e.line == 3 for e in first.evidence)
    assert report.findings[1].why_rank.startswith("ranks below #1 (t-oom-fragmentation)")


def test_other_process_ranks_first_when_the_message_lists_one(tmp_path, tiny_rules):
    path = write(tmp_path, "train.log", OTHER_OOM + "\n")
    report = explain_tiny(tiny_rules, path)
    assert report.findings[0].cause == "oom.other_process"
    assert report.findings[0].facts == {"oom.other_process_bytes": 15 * GIB}
    assert report.findings[0].evidence[0].line == 1  # the OOM line, from the fact group


def test_env_facts_count_as_evidence(tmp_path, tiny_rules):
    path = write(tmp_path, "train.log", "torch.OutOfMemoryError: CUDA out of memory.\n")
    without = explain_tiny(tiny_rules, path)
    assert [f.cause for f in without.findings] == ["oom.capacity"]
    with_env = explain_tiny(tiny_rules, path, env=SNAPSHOT)
    assert with_env.findings[0].cause == "oom.other_process"  # env numbers beat the keyword
    assert any(e.file == "env snapshot" for e in with_env.findings[0].evidence)
    assert with_env.facts["env.gpu_name"] == "NVIDIA GeForce RTX 4090"


def test_earliest_failure_across_ranks_consequences_and_generic_last(tiny_rules):
    report = explain_tiny(tiny_rules, DATA / "rank0.log", DATA / "rank1.log", DATA / "rank2.log")
    order = [f.rule for f in report.findings]
    # rank2's OOM (10:00:02) comes before rank1's assert (10:00:05): both keyword-only, high
    assert order[0] == "t-oom-capacity" and order.index("t-device-assert") > 0
    timeout = next(f for f in report.findings if f.rule == "t-nccl-timeout")
    assert timeout.consequence_of in ("t-oom-capacity", "t-device-assert")
    parent = next(f for f in report.findings if f.rule == timeout.consequence_of)
    assert timeout.rank == parent.rank + 1
    assert "consequence of" in timeout.why_rank
    assert order[-1] == "t-exit-code" and report.findings[-1].summary == "Exit code 1."
    assert "evidence comes first" in report.findings[0].why_rank
    assert report.facts["dist.ranks"] == [0, 1, 2]
    assert {i["path"].rsplit("/", 1)[-1]: i["ranks"] for i in report.inputs} == {
        "rank0.log": [0], "rank1.log": [1], "rank2.log": [2]}


def test_generic_never_first(tmp_path, tiny_rules):
    path = write(tmp_path, "x.log", "ERROR: process exited with code 3\nsome --fp16 flag\n")
    report = explain_tiny(tiny_rules, path)
    assert [f.rule for f in report.findings] == ["t-fp16-guess", "t-exit-code"]
    assert "generic catch-all #2 (t-exit-code)" in report.findings[0].why_rank


def test_rule_without_its_numbers_is_a_guess(tmp_path, tiny_rules):
    path = write(tmp_path, "x.log", "python train.py --fp16\n")
    (finding,) = explain_tiny(tiny_rules, path).findings
    assert finding.confidence_label == "guess" and finding.summary == "fp16 with ? nan losses."
    assert finding.why_rank.startswith("the only finding")


def test_nothing_matched_gives_unrecognised_tail(tmp_path, tiny_rules):
    lines = ["info"] + [f"ERROR something odd {i}" for i in range(15)] + ["done"]
    path = write(tmp_path, "x.log", "\n".join(lines) + "\n")
    report = explain_tiny(tiny_rules, path)
    assert report.findings == []
    assert [e.line for e in report.unrecognised_tail] == list(range(7, 17))
    assert report.facts["input.lines"] == 17 and report.facts["input.files"] == 1


def test_require_all_and_exclude(tmp_path):
    folder = tmp_path / "r"
    folder.mkdir()
    (folder / "r.yaml").write_text("rules:\n" + GOOD_RULE.format(id="needs-both")
                                   + "    require_all: ['Traceback \\(most recent']\n"
                                   + GOOD_RULE.format(id="silenced").replace("oom.capacity", "oom.leak")
                                   + "    exclude: ['expandable_segments:True']\n")
    rules = load_rules([folder], include_builtin=False)
    one = write(tmp_path, "one.log", "CUDA out of memory.\n")
    two = write(tmp_path, "two.log", "Traceback (most recent call last):\nCUDA out of memory.\nexport X=expandable_segments:True\n")
    assert [f.rule for f in explain([str(one)], rules=rules, differential_on=False).findings] == ["silenced"]
    assert [f.rule for f in explain([str(two)], rules=rules, differential_on=False).findings] == ["needs-both"]


def test_progress_callback_and_report_dict(tmp_path, tiny_rules):
    path = write(tmp_path, "x.log", FRAG_OOM + "\n")
    calls = []
    report = explain([str(path)], rules=tiny_rules, progress=lambda *a: calls.append(a))
    assert calls and calls[-1][0] == str(path) and calls[-1][1] == path.stat().st_size
    data = report.to_dict()
    json.dumps(data)
    assert data["findings"][0]["rank"] == 1 and data["inputs"][0]["lines"] == 1


def test_oom_step_from_progress_bar(tmp_path, tiny_rules):
    bar = "".join(f"\r{i * 100 // 400:3d}%|##        | {i}/400 [00:{i % 60:02d}<01:00,  2.00it/s]" for i in range(1, 101))
    text = "Loading checkpoint shards: 100%|██████████| 2/2 [00:05<00:00,  2.60s/it]\n" + bar + "\n" + FRAG_OOM + "\n"
    report = explain_tiny(tiny_rules, write(tmp_path, "x.log", text))
    assert report.facts["oom.step"] == 100 and report.facts["oom.step_fraction"] == 0.25


# --- the fast paths agree with the line-by-line extractors --------------------------------------

def test_block_metric_path_matches_line_path(tmp_path, tiny_rules):
    from loradoctor.logs.facts import FactCollector
    from loradoctor.logs.reader import iter_lines, resolve_inputs

    records = []
    for i in range(300):
        loss = "nan" if i in (250, 251) else f"{2.0 - i / 400:.4f}"
        gn = "inf" if i == 250 else f"{0.5 + i / 100:.3f}"
        records.append(f"{{'loss': {loss}, 'grad_norm': {gn}, 'learning_rate': {2e-4 * (1 - i / 300):.6e}, 'epoch': {i / 100:.2f}}}")
    text = ""
    for i, rec in enumerate(records):
        bar = f"\r{i * 100 // 300:3d}%|#   | {i}/300 [00:{i % 60:02d}<01:00,  2.00it/s]"
        text += bar + (rec if i % 2 else "\r      \r" + rec) + "\n"  # glued after the bar, or after a clear
    text += "{'train_runtime': 151.3, 'train_samples_per_second': 5.3, 'train_loss': 1.2, 'epoch': 3.0}\n"
    path = write(tmp_path, "train.log", text)
    report = explain_tiny(tiny_rules, path)
    collector = FactCollector()
    for line in iter_lines(resolve_inputs([str(path)])):
        collector.feed(line)
    slow = {k: v for k, v in collector.finish().flat().items() if k.startswith("metrics.")}
    fast = {k: v for k, v in report.facts.items() if k.startswith("metrics.")}
    assert fast == slow
    assert fast["metrics.steps"] == 300 and fast["metrics.first_nonfinite_index"] == 251
    assert fast["metrics.train_finished"] is True
    assert report.facts["input.lines"] == 301


def test_json_log_history_records(tmp_path, tiny_rules):
    entries = ",\n".join(f'    {{\n      "epoch": {i / 10},\n      "grad_norm": {0.5 + i},\n      "learning_rate": 0.0002,\n'
                         f'      "loss": {"NaN" if i == 7 else 2.0 - i / 10},\n      "step": {i * 10}\n    }}' for i in range(1, 9))
    path = write(tmp_path, "trainer_state.json.log", '{\n  "log_history": [\n' + entries + "\n  ]\n}\n")
    facts = explain_tiny(tiny_rules, path).facts
    assert facts["metrics.steps"] == 8 and facts["metrics.loss_nan_count"] == 1
    assert facts["metrics.first_nonfinite_index"] == 7 and facts["metrics.grad_norm_max"] == 8.5


def test_rule_literal_inside_metric_dicts_still_matches(tmp_path):
    folder = tmp_path / "r"
    folder.mkdir()
    (folder / "r.yaml").write_text("rules:\n" + GOOD_RULE.format(id="mean-acc").replace(
        "'CUDA out of memory'", "'mean_token_accuracy'"))
    rules = load_rules([folder], include_builtin=False)
    lines = [f"{{'loss': 1.{i}, 'grad_norm': 0.3, 'learning_rate': 2e-05, 'mean_token_accuracy': 0.5, 'epoch': 0.1}}"
             for i in range(10)]
    report = explain([str(write(tmp_path, "x.log", "\n".join(lines) + "\n"))], rules=rules, differential_on=False)
    assert [f.rule for f in report.findings] == ["mean-acc"]
    assert report.facts["metrics.steps"] == 10


def test_condition_may_span_lines():
    expr = "(oom.requested_bytes >= 1GiB\n or oom.free_bytes < 1GiB)\nand not oom.phase == 'load'"
    assert Condition(expr).evaluate(FACTS) is True
    with pytest.raises(ConditionError):
        Condition("oom.count > 1) or (1")


def test_older_trainer_dicts_without_grad_norm(tmp_path, tiny_rules):
    text = "".join(f"{{'loss': {2 - i / 10}, 'learning_rate': 1.1644736842105263e-05, 'epoch': 0.{i}}}\n" for i in range(8))
    text += "{'loss': 0.5, 'grad_norm': nan, 'learning_rate': 1e-05, 'epoch': 0.9}\n"
    facts = explain_tiny(tiny_rules, write(tmp_path, "old.log", text)).facts
    assert facts["metrics.steps"] == 9 and facts["metrics.lr_max"] == pytest.approx(1.1644736842105263e-05)
    assert facts["metrics.grad_norm_nan_count"] == 1 and facts["metrics.first_nonfinite_index"] == 9


# --- misreadings of real logs (QA reproducers) ----------------------------------------------

BARE_OOM = "torch.OutOfMemoryError: CUDA out of memory."


def test_bare_oom_step_counts_only_records_before_it(tmp_path, tiny_rules):
    dicts = "".join(f"{{'loss': {2.0 - i / 10}, 'grad_norm': 1.0, 'learning_rate': 1e-05, 'epoch': 0.0{i}}}\n"
                    for i in range(3))
    rerun = "".join(f"{{'loss': {1.5 - i / 100}, 'grad_norm': 1.0, 'learning_rate': 1e-05, 'epoch': 0.1}}\n"
                    for i in range(30))
    bar = "  0%|          | 3/1000 [00:12<1:06:00,  4.00s/it]\n"
    report = explain_tiny(tiny_rules, write(tmp_path, "x.log", dicts + bar + BARE_OOM + "\n" + rerun))
    assert report.facts["oom.step"] == 3 and report.facts["oom.step_fraction"] == 0.003
    assert report.facts["metrics.steps"] == 33


def test_bare_oom_step_without_bar_counts_records_before(tmp_path, tiny_rules):
    dicts = "".join(f"{{'loss': {2.0 - i / 10}, 'learning_rate': 1e-05}}\n" for i in range(3))
    report = explain_tiny(tiny_rules, write(tmp_path, "x.log", dicts + BARE_OOM + "\n" + dicts * 10))
    assert report.facts["oom.step"] == 3


def test_bare_warning_then_numbered_oom_through_the_engine(tmp_path, tiny_rules):
    text = ("2024-05-01 10:00:00 | WARNING | CUDA out of memory on batch 311, skipping batch\n"
            "Traceback (most recent call last):\n" + FRAG_OOM + "\n")
    report = explain_tiny(tiny_rules, write(tmp_path, "x.log", text))
    assert report.facts["oom.count"] == 2 and report.facts["oom.reserved_unallocated_bytes"] > 9 << 30


def test_silent_ranks_from_rank_files(tmp_path, tiny_rules):
    timeout = ("[E ProcessGroupNCCL.cpp:563] [Rank {r}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, "
               "OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600036 milliseconds before timing out.\n")
    paths = [write(tmp_path, f"rank{r}.log", timeout.format(r=r) if r != 1 else "step 99\n") for r in range(3)]
    report = explain_tiny(tiny_rules, *paths)
    assert report.facts["dist.world_size"] == 3 and report.facts["dist.silent_ranks"] == [1]


def test_why_rank_lists_only_held_numbered_parts(tmp_path):
    folder = tmp_path / "r"
    folder.mkdir()
    when = ("oom.requested_bytes >= 0 and oom.total_bytes > 1GiB and oom.free_bytes < oom.requested_bytes"
            " and oom.allocated_bytes >= 1MiB and not (oom.reserved_unallocated_bytes >= 100GiB)"
            " and (oom.other_process_bytes > 1GiB or oom.allocated_bytes < 1000GiB)"
            " and not (metrics.mem_growth_ratio >= 1.25) and (oom.phase == 'forward' or not defined(oom.phase))")
    (folder / "r.yaml").write_text("rules:\n" + GOOD_RULE.format(id="long-when") + f"    when: \"{when}\"\n")
    rules = load_rules([folder], include_builtin=False)
    report = explain([str(write(tmp_path, "x.log", FRAG_OOM + "\n"))], rules=rules, differential_on=False)
    why = report.findings[0].why_rank
    assert why.count(";") == 4 and why.endswith("; …)")  # "the only finding; " + 3 parts + …
    assert "requested_bytes 4.40 GiB >= 0" in why and "total_bytes 79.10 GiB > 1.00 GiB" in why
    assert "other_process" not in why and "reserved_unallocated" not in why and "phase" not in why


def test_unrecognised_tail_kept_when_only_info_findings(tmp_path):
    folder = tmp_path / "r"
    folder.mkdir()
    (folder / "r.yaml").write_text("rules:\n" + GOOD_RULE.format(id="note-use-cache")
                                   .replace("severity: error", "severity: info")
                                   .replace("'CUDA out of memory'", "'use_cache=True` is incompatible'"))
    rules = load_rules([folder], include_builtin=False)
    trace = ("Traceback (most recent call last):\n  File \"/w/train.py\", line 9, in <module>\n"
             "KeyError: 'input_ids'\n")
    note = "`use_cache=True` is incompatible with gradient checkpointing. Setting `use_cache=False`.\n"
    with_note = explain([str(write(tmp_path, "a.log", note + trace))], rules=rules, differential_on=False)
    without = explain([str(write(tmp_path, "b.log", trace))], rules=rules, differential_on=False)
    assert [f.severity for f in with_note.findings] == ["info"] and without.findings == []
    assert [e.text for e in with_note.unrecognised_tail] == [e.text for e in without.unrecognised_tail]
    assert with_note.unrecognised_tail[-1].text == "KeyError: 'input_ids'"


def test_wrapped_and_headerless_shapes_reach_the_facts_through_the_scan(tmp_path, tiny_rules):
    """The continuation and frame lines carry none of the old trigger words: the prefilter must
    still hand them to the collector."""
    text = "\n".join([
        "step 1",
        "╭───────────────────── Traceback (most recent call last) ──────────────────────╮",
        "│ /usr/lib/python3.10/site-packages/transformers/modeling_utils.py:             │",
        "│ 698 in _load_state_dict_into_meta_model                                       │",
        "│                                                                               │",
        "│   695 │   │   │   param = param.to(dtype)                                     │",
        "╰───────────────────────────────────────────────────────────────────────────────╯",
        "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB of"
        " which 1.50 GiB is free. Including non-PyTorch memory, this process has 77.58 GiB memory in use. Of the all"
        "ocated memory 44.31 GiB is allocated by P",
        "yTorch, and 31.92 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large",
        "try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.",
    ]) + "\n"
    facts = explain_tiny(tiny_rules, write(tmp_path, "x.log", text)).facts
    assert facts["oom.phase"] == "load" and facts["trace.location"] == "load"
    assert facts["oom.reserved_unallocated_bytes"] == round(31.92 * (1 << 30))
    assert facts["oom.hint"] == "expandable_segments"


def test_kohya_model_to_through_the_scan(tmp_path, tiny_rules):
    text = "\n".join([
        "Traceback (most recent call last):",
        '  File "/k/train_network.py", line 990, in <module>',
        "    trainer.train(args)",
        '  File "/k/train_network.py", line 351, in train',
        "    model = self.prepare_model(args)",
        '  File "/k/library/train_util.py", line 4120, in prepare_model',
        "    model = model.to(self.device)",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of "
        "7.79 GiB of which 3.06 MiB is free.",
    ]) + "\n"
    assert explain_tiny(tiny_rules, write(tmp_path, "x.log", text)).facts["oom.phase"] == "load"


def test_derived_literals_need_letters_not_just_digits():
    """A literal like ' 43' would send every progress bar showing 43 to the matcher."""
    from loradoctor.logs.rules import derive_literals

    assert derive_literals(r" 43\b") is None
    assert derive_literals(r"exitcode\s*:\s*-9") == [("exitcode", False)]
    assert derive_literals(r"\(Code 43\)") == [("(Code 43)", False)]


def test_a_two_character_cjk_word_is_a_literal():
    """Literal length counts UTF-8 bytes, as the prefilter searches bytes: 显存 (GPU memory, 6 bytes) is as
    rare in a log as a six-letter word; two ASCII letters are not."""
    from loradoctor.logs.rules import derive_literals
    from loradoctor.logs.rules.literals import _literals_for

    assert derive_literals("显存") == [("显存", False)]
    assert derive_literals("ab") is None
    _, problems = _literals_for(["x"], ["ab"], "patterns")
    assert problems == ["prefilter: 'ab' is shorter than 3 bytes; give words every match contains"]
    assert _literals_for(["x"], ["显存"], "patterns")[1] == []


def test_lint_finds_a_pattern_alternative_its_explicit_prefilter_misses(tmp_path):
    """A line is tried only if it holds a prefilter literal, so an alternative whose words are not among an
    explicit prefilter never fires (round 43: `<|im_end|>` lines of eos-never-generated-prose). Lint draws
    matches from the regex and names one without a literal; a prefilter that covers every alternative (or a
    gap only a tab would open) is clean. The same holds for exclude_prefilter."""
    from loradoctor.logs.rules.lint import lint_rules

    rule = """  - id: {id}
    cause: oom.capacity
    title: t
    severity: error
    confidence: low
    patterns: ['(?i)\\b(?:disk|drive)[ \\t]{{1,3}}(?:is[ \\t]{{1,3}})?full\\b']
    prefilter: {prefilter}
    exclude: ['(?i)\\b(?:plenty|lots) of space']
    exclude_prefilter: {exclude_prefilter}
    summary: s
"""
    def lint(prefilter, exclude_prefilter):
        (tmp_path / "r.yaml").write_text("rules:\n" + rule.format(id="gap-check", prefilter=prefilter,
                                                                  exclude_prefilter=exclude_prefilter))
        return [p for p in lint_rules(tmp_path) if "holds none of its literals" in p]

    gaps = lint("['disk is', 'disk full']", "['plenty of', 'lots of']")
    assert len(gaps) == 1 and "prefilter: the regex matches" in gaps[0] and "drive" in gaps[0].lower()
    gaps = lint("['disk', 'drive']", "['plenty of']")
    assert len(gaps) == 1 and "exclude_prefilter:" in gaps[0] and "lots of" in gaps[0].lower()
    assert lint("['disk', 'drive']", "['plenty of', 'lots of']") == []


def test_only_an_error_can_be_the_root_of_a_consequence(tmp_path):
    """A note or warning (the use_cache notice in every LoRA log) never becomes the parent of a
    crash, even when the crash's rule lists its cause in consequence_of."""
    from loradoctor.logs.engine import explain
    from loradoctor.logs.rules import load_rules

    folder = tmp_path / "r"
    folder.mkdir()
    (folder / "x.yaml").write_text(
        "rules:\n"
        "  - id: t-note\n    cause: train.use_cache_conflict\n    title: A note\n    severity: info\n"
        "    confidence: high\n    summary: note\n    patterns: ['ZZNOTE here']\n"
        "  - id: t-crash\n    cause: dist.nccl_timeout\n    title: A crash\n    severity: error\n"
        "    confidence: medium\n    summary: crash\n    patterns: ['ZZCRASH here']\n"
        "    consequence_of: ['train.*']\n", encoding="utf-8")
    log = tmp_path / "a.log"
    log.write_text("ZZNOTE here\nstep 1\nZZCRASH here\n", encoding="utf-8")
    rules = [r for r in load_rules([str(folder)]) if r.id.startswith("t-")]
    findings = explain([str(log)], rules=rules, differential_on=False).findings
    assert [f.rule for f in findings] == ["t-crash", "t-note"]
    assert findings[0].consequence_of is None
    # the same note as an error is a root, and the crash is placed after it
    (folder / "x.yaml").write_text((folder / "x.yaml").read_text().replace("severity: info", "severity: error"))
    from loradoctor.logs.rules import load as R
    R._CACHE.clear()
    rules = [r for r in load_rules([str(folder)]) if r.id.startswith("t-")]
    findings = explain([str(log)], rules=rules, differential_on=False).findings
    assert [f.rule for f in findings] == ["t-note", "t-crash"] and findings[1].consequence_of == "t-note"


def test_optional_template_parts_vanish_when_a_value_is_missing():
    import re

    from loradoctor.logs.rules import check_template, render_template

    tpl = "timed out[[ (joined {match.1} of {match.2})]]; grad_norm {metrics.grad_norm_max}[[, first {metrics.grad_norm_first}]]"
    assert check_template(tpl) == []
    m = re.search(r"(\d+) of (\d+)", "3 of 8")
    assert render_template(tpl, {"metrics.grad_norm_max": 9.5, "metrics.grad_norm_first": 0.5}, m) == \
        "timed out (joined 3 of 8); grad_norm 9.5, first 0.5"
    assert render_template(tpl, {}, None) == "timed out; grad_norm ?"


def test_lint_refuses_an_explicit_prefilter_of_digits_and_punctuation(tmp_path):
    from loradoctor.logs.rules import lint_rules

    (tmp_path / "r.yaml").write_text(
        "rules:\n  - id: t-digits\n    cause: hw.memory_errors\n    title: T\n    severity: error\n"
        "    summary: s\n    patterns: ['GPU (\\\\d+) ECC']\n    prefilter: ['0000:']\n", encoding="utf-8")
    problems = lint_rules(tmp_path)
    assert any("'0000:'" in p and "prefilter" in p for p in problems), problems
