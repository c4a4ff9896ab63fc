"""The cause catalogue (loradoctor/data/causes.yaml): the docs page is generated from it, the rule schema's
enums read it, and its templates never leave a placeholder in a sentence."""

import fnmatch
import re

import pytest
import yaml

from conftest import ROOT
from loradoctor import catalogue
from loradoctor.catalogue import CatalogueError, _parse


def test_docs_page_is_generated_from_the_catalogue():
    current = (ROOT / "docs" / "causes.md").read_text(encoding="utf-8")
    assert current == catalogue.render_docs(), "run: python -m loradoctor.catalogue --write-docs docs/causes.md"


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
    assert props["cause"]["enum"] == catalogue.cause_ids()
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
    for c in catalogue.causes().values():
        for text, cmd in catalogue.fixes_for(c.id, {}, "explain") + catalogue.fixes_for(c.id, {}, "env"):
            assert "{" not in text and "{" not in (cmd or "").replace("${", ""), (c.id, text, cmd)
