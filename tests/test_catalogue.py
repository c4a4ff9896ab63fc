"""The cause catalogue (loradoctor/data/causes.yaml): the docs page is generated from it, the rule schema's
enums read it, and its templates never leave a placeholder in a sentence."""

import fnmatch
import json
import re

import pytest
import yaml

from conftest import ROOT
from loradoctor import catalogue
from loradoctor.catalogue import CatalogueError, _parse


def test_the_causes_page_is_rendered_from_the_catalogue(capsys):
    # `loradoctor docs causes` renders the catalogue each time (a new cause edits no page); the checkout's
    # docs/causes.md only says where the page comes from
    from loradoctor.cli import main

    assert main(["docs", "causes"]) == 0
    page = capsys.readouterr().out
    assert page == catalogue.render_docs()
    assert all(f"| {cid} |" in page for cid in catalogue.cause_ids())
    stub = (ROOT / "docs" / "causes.md").read_text(encoding="utf-8")
    assert "loradoctor docs causes" in stub and "loradoctor/data/causes.yaml" in stub


def test_check_docs_reports_drift(tmp_path):
    page = tmp_path / "causes.md"
    assert catalogue.main(["--write-docs", str(page)]) == 0
    assert catalogue.main(["--check-docs", str(page)]) == 0
    page.write_text(page.read_text().replace("| oom.leak |", "| oom.leaks |"))
    assert catalogue.main(["--check-docs", str(page)]) == 1


def test_rule_schema_and_rules_read_the_catalogue():
    from loradoctor.logs import rules

    assert rules.cause_ids() == catalogue.cause_ids()
    assert rules.repro_ids() == catalogue.repro_ids()
    props = rules.load_schema()["$defs"]["rule"]["properties"]
    assert props["cause"]["enum"] == catalogue.cause_ids()  # filled by the loader: rules/schema.json lists no causes
    assert "enum" not in json.loads((ROOT / "rules" / "schema.json").read_text())["$defs"]["rule"]["properties"]["cause"]
    assert "internal.check_failed" in catalogue.internal_cause_ids()
    assert "internal.check_failed" not in props["cause"]["enum"]


def test_every_cause_is_complete():
    for c in catalogue.causes().values():
        assert c.title and c.what and c.evidence, c.id
        assert c.fixes, f"{c.id} has no next step"
        if not c.internal:
            assert any(f.command for f in c.fixes), f"{c.id} has no paste-able command"
        assert c.repro is None or c.repro in catalogue.repro_ids()


def test_package_data_ships_the_catalogue():
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    block = text.split("[tool.setuptools.package-data]", 1)[1].split("\n[", 1)[0]
    patterns = re.findall(r'^"loradoctor" = \[(.*)\]$', block, re.M)[0]
    assert any(fnmatch.fnmatch("data/causes.yaml", p.strip().strip('"')) for p in patterns.split(","))


@pytest.mark.parametrize("mutation,message", [
    (lambda d: d["causes"]["oom.leak"].update(category="env"), "family"),
    (lambda d: d["causes"]["oom.leak"].update(severity="fatal"), "severity"),
    (lambda d: d["causes"]["oom.leak"].update(repro="no-such-repro"), "unknown repro"),
    (lambda d: d["causes"]["oom.leak"].pop("what"), "missing what"),
    (lambda d: d["causes"].update({"Bad Id": d["causes"]["oom.leak"]}), "lower case"),
])
def test_a_malformed_catalogue_is_refused(mutation, message):
    data = yaml.safe_load(catalogue.CATALOGUE_PATH.read_text(encoding="utf-8"))
    mutation(data)
    with pytest.raises(CatalogueError, match=message):
        _parse(data, catalogue.repro_ids())


def test_templates_fill_or_drop_never_print_a_placeholder():
    full = catalogue.fixes_for("env.driver_too_old", {
        "wheel_tag": "cu128", "wheel_note": "", "wheel_command": "pip install x", "driver_needed": "570.26",
        "torch_cuda": "12.8", "driver_min": "525.60.13"})
    assert [t for t, _ in full][:2] == ["Keep the driver and install the cu128 build",
                                        "Or update the NVIDIA driver to 570.26 or newer (CUDA 12.8 needs at least 525.60.13)"]
    no_wheel = catalogue.fixes_for("env.driver_too_old", {"driver_needed": "570.26", "torch_cuda": "12.8",
                                                          "driver_min": "525.60.13", "wheel_tag": None})
    assert no_wheel[0][0].startswith("Update the NVIDIA driver")  # the leading "Or " goes with the missing step
    assert catalogue.summary("env.nvml_mismatch", {"kernel_module_version": None, "library_version": None}).startswith(
        "NVML reports")
    from loradoctor.logs.rules.templates import template_placeholders

    for c in catalogue.causes().values():
        steps = catalogue.fixes_for(c.id, {}, "explain") + catalogue.fixes_for(c.id, {}, "env")
        for variant in c.variants:
            steps += catalogue.fixes_for(c.id, {}, "env", variant)
            assert "{" not in catalogue.headline(c.id, {}, variant), (c.id, variant)
            assert "{" not in catalogue.summary(c.id, {}, variant), (c.id, variant)
        for text, cmd in steps:
            assert not template_placeholders(text) and not template_placeholders(cmd or ""), (c.id, text, cmd)


def test_a_variant_words_one_situation_of_a_cause():
    facts = {"cvd_repr": "'7'", "gpu_count": "2 GPUs"}
    assert catalogue.headline("env.no_gpu_visible", facts, "cvd_hides") == "CUDA_VISIBLE_DEVICES='7' hides all 2 GPUs"
    assert catalogue.fixes_for("env.no_gpu_visible", facts, "env", "cvd_hides")[0][1].startswith("unset CUDA_VISIBLE_DEVICES")
    # no fixes of its own -> the cause's; `fixes: []` -> none; an unknown variant is a KeyError (a check bug)
    assert catalogue.fixes_for("env.no_gpu_visible", {}, "env", "mig") == []
    with pytest.raises(KeyError, match="no wording variant"):
        catalogue.headline("env.no_gpu_visible", {}, "no_such_variant")


def test_a_fix_with_when_is_offered_only_when_the_check_found_it():
    gate = {"reason": "torch is not installed", "needs_torch": True}
    texts = [t for t, _ in catalogue.fixes_for("env.no_gpu_visible", gate, "env", "gpu_training")]
    assert not any(t.startswith("See why no GPU") for t in texts) and any("install a CUDA build" in t for t in texts)
    texts = [t for t, _ in catalogue.fixes_for("env.no_gpu_visible", {**gate, "no_gpu": True}, "env", "gpu_training")]
    assert texts[0].startswith("See why no GPU")


def test_templates_are_the_rules_template_language():
    # optional [[ ... ]] parts vanish whole when a value is missing; a required placeholder drops the sentence
    pcie = {"gpu": "GPU 0 (A100)", "width_current": 8, "width_max": 16}
    assert catalogue.headline("hw.thermal_power", pcie, "pcie_narrow") == "GPU 0 (A100) PCIe link runs x8 of x16"
    assert catalogue.headline("hw.thermal_power", {**pcie, "gen_current": 3, "gen_max": 4}, "pcie_narrow") == (
        "GPU 0 (A100) PCIe link runs x8 of x16 (gen 3 of 4)")
    assert catalogue.fill("{a} and {b}", {"a": 1}) is None and catalogue.fill("{a}[[ and {b}]]", {"a": 1}) == "1"
    assert catalogue.fill("kill {pid|or:PID}", {}) == "kill PID"


@pytest.mark.parametrize("mutation,message", [
    (lambda d: d["causes"]["oom.leak"].update(variants=["x"]), "variants must be a mapping"),
    (lambda d: d["causes"]["oom.leak"].update(variants={"Bad-Name": {}}), "lower_case name"),
    (lambda d: d["causes"]["oom.leak"].update(variants={"x": {"title": "t"}}), "unknown keys title"),
    (lambda d: d["causes"]["oom.leak"].update(variants={"x": {"fixes": [{"text": "t", "if": "y"}]}}), "unknown keys if"),
])
def test_a_malformed_variant_is_refused(mutation, message):
    data = yaml.safe_load(catalogue.CATALOGUE_PATH.read_text(encoding="utf-8"))
    mutation(data)
    with pytest.raises(CatalogueError, match=message):
        _parse(data, catalogue.repro_ids())


def test_a_rule_words_its_own_finding_and_takes_the_catalogues_fixes_when_it_has_none(tmp_path):
    # issue 9: wording and fixes come from the catalogue; a YAML rule overrides them (title and summary are the
    # rule's own, always; its fixes when it has some)
    from conftest import USER_RULE
    from loradoctor.logs.engine import explain

    log = tmp_path / "run.log"
    log.write_text("step 3\nFROBNICATOR OVERFLOW 42\n", encoding="utf-8")
    for name, fixes in (("own", True), ("none", False)):
        folder = tmp_path / name
        folder.mkdir()
        rule = USER_RULE.format(rid=f"test-{name}", pattern="FROBNICATOR OVERFLOW")
        if not fixes:
            rule = rule.replace("    fixes:\n      - text: do something\n", "")
        (folder / "r.yaml").write_text(rule, encoding="utf-8")
        found = next(f for f in explain([str(log)], extra_rule_dirs=[str(folder)]).findings if f.rule == f"test-{name}")
        assert (found.title, found.summary) == ("A test rule", "test")  # the rule's, not the catalogue's title
        got = [(fx.text, fx.command) for fx in found.fixes]
        assert got == ([("do something", None)] if fixes else catalogue.fixes_for("oom.capacity", {}, "explain")), got


# issue 9: a catalogue fix's `when:` / `unless:` is the rules' condition language over what the env check found
# (`check.*`), compiled when the catalogue loads and picked by the rules' own fixes_that_apply

def _with_fixes(monkeypatch, fixes):
    """The catalogue with oom.leak's fixes replaced, parsed as the loader does and put in place of the real one."""
    data = yaml.safe_load(catalogue.CATALOGUE_PATH.read_text(encoding="utf-8"))
    data["causes"]["oom.leak"]["fixes"] = fixes
    parsed = _parse(data, catalogue.repro_ids())
    monkeypatch.setattr(catalogue, "causes", lambda: parsed)
    return parsed


def test_a_catalogue_fix_condition_holds_or_not(monkeypatch):
    _with_fixes(monkeypatch, [
        {"text": "always"},
        {"text": "only without a GPU", "when": "check.no_gpu"},
        {"text": "unless shadowed", "unless": "check.shadows == True"},
        {"text": "both", "when": "check.cpu_build and not check.needs_torch"},
    ])
    texts = lambda facts: [t for t, _ in catalogue.fixes_for("oom.leak", facts, "env")]  # noqa: E731
    assert texts({}) == ["always", "unless shadowed"]
    assert texts({"no_gpu": True, "shadows": True}) == ["always", "only without a GPU"]
    assert texts({"no_gpu": False, "shadows": False, "cpu_build": True}) == ["always", "unless shadowed", "both"]
    assert texts({"cpu_build": True, "needs_torch": True}) == ["always", "unless shadowed"]
    # the explain audience (a rule without fixes of its own) is picked with nothing checked
    assert [t for t, _ in catalogue.fixes_for("oom.leak", {}, "explain")] == ["always", "unless shadowed"]


@pytest.mark.parametrize("cond,message", [
    ("check.no_gpus", r"fixes\[1\]\.when: unknown fact 'check.no_gpus' \(a catalogue fix names what the env check found"),
    ("no_gpu", r"fixes\[1\]\.when: unknown name 'no_gpu'"),  # the old bare truthy name is refused
    ("config.load_in_4bit == True", r"fixes\[1\]\.when: unknown fact 'config.load_in_4bit'"),  # a log fact
    ("check.no_gpu ==", r"fixes\[1\]\.when: cannot parse"),
    ("__import__('os')", r"fixes\[1\]\.when: call to '__import__' is not allowed"),
    (["check.no_gpu"], r"fixes\[1\]\.when must be a condition"),
])
def test_a_bad_catalogue_fix_condition_is_refused_at_load(cond, message):
    data = yaml.safe_load(catalogue.CATALOGUE_PATH.read_text(encoding="utf-8"))
    data["causes"]["oom.leak"]["fixes"] = [{"text": "always"}, {"text": "t", "when": cond}]
    with pytest.raises(CatalogueError, match=r"causes.yaml: oom.leak: " + message):
        _parse(data, catalogue.repro_ids())
    data["causes"]["oom.leak"]["fixes"] = [{"text": "always"}, {"text": "t", "unless": cond}]
    with pytest.raises(CatalogueError, match=message.replace("when", "unless")):
        _parse(data, catalogue.repro_ids())


def test_a_bad_condition_in_a_variant_names_the_variant():
    data = yaml.safe_load(catalogue.CATALOGUE_PATH.read_text(encoding="utf-8"))
    data["causes"]["env.torch_cpu_only"]["variants"]["gpu_training"]["fixes"][0]["when"] = "check.no_gpus"
    with pytest.raises(CatalogueError, match=r"env.torch_cpu_only: variants.gpu_training: fixes\[0\]\.when: unknown fact"):
        _parse(data, catalogue.repro_ids())


def test_every_check_fact_is_set_by_a_check_and_every_catalogue_condition_names_one():
    from loradoctor.logs.factnames import CHECK_FACTS

    source = (ROOT / "loradoctor" / "env" / "checks.py").read_text(encoding="utf-8")
    for name in CHECK_FACTS:
        short = name.split(".", 1)[1]
        assert re.search(rf"""["']{short}["']\s*(?::|\]\s*=)""", source), f"no check sets {short!r} ({name})"
    used = {f for c in catalogue.causes().values()
            for fx in [*c.fixes, *(fx for w in c.variants.values() for fx in (w.fixes or ()))]
            for cond in fx.conditions if cond is not None for f in cond.facts}
    assert used == set(CHECK_FACTS)  # a name no fix uses is dropped from the list
