"""Every env check against fixture snapshots (fixtures/snapshots/*.json): positives, negatives and the fix text."""

import copy
import json

import pytest

from conftest import FIXTURES
from loradoctor.env import checks
from loradoctor.env.checks import parse_alloc_conf, run_checks

SNAPS = FIXTURES / "snapshots"

# fixture -> the (cause, severity) pairs at warning level or above that it must produce, and nothing else
EXPECTED = {
    "healthy_ampere_32gb": set(),
    "t4_bf16_requested": {("env.bf16_unsupported", "error")},
    "t4_flash_attn_requested": {("env.flash_attn_unsupported", "error")},
    "driver_too_old": {("env.driver_too_old", "error")},
    "cpu_only_wheel": {("env.torch_cpu_only", "error")},
    "rtx5090_cu126": {("env.arch_unsupported", "error")},
    "container_no_gpu": {("env.no_gpu_visible", "error"), ("oom.shm", "warning")},
    "zombie_process": {("oom.other_process", "error")},
    "nvml_mismatch": {("env.nvml_mismatch", "error")},
    "hw_unhealthy": {("hw.memory_errors", "error"), ("hw.thermal_power", "warning"), ("oom.other_process", "warning")},
    "cvd_hides_gpus": {("env.no_gpu_visible", "error")},
    "bad_settings": {("env.bad_setting", "error"), ("env.bad_setting", "warning"), ("env.disk_space", "error"),
                     ("oom.shm", "warning"), ("env.cudnn", "warning")},
    "broken_extensions": {("env.flash_attn_broken", "error"), ("env.bnb_broken", "error"), ("env.version_conflict", "error")},
    "torch_segfault": {("env.torch_broken", "error"), ("env.cudnn", "warning")},
    "wsl_no_libcuda": {("env.no_gpu_visible", "error")},
}


def load(name: str) -> dict:
    return json.loads((SNAPS / f"{name}.json").read_text())


def test_every_fixture_is_listed():
    assert {p.stem for p in SNAPS.glob("*.json")} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_findings(name):
    findings = run_checks(load(name))
    got = {(f.cause, f.severity) for f in findings if f.severity != "info"}
    assert got == EXPECTED[name], [f.title for f in findings]
    for f in findings:
        assert f.rule.startswith("env.") and f.rule[4:] in checks.CHECK_NAMES
        assert f.evidence, f.title
        if f.severity == "error":
            assert any(fix.command for fix in f.fixes), f"{f.title} has no pasteable fix"


# A cause added end to end keeps its env check's snapshots in its rule's fixture folder, beside the logs:
# fixtures/logs/<rule-id>/snapshot-pos*.json must give a finding of the rule's cause, snapshot-neg*.json must not.
CAUSE_SNAPSHOTS = sorted((FIXTURES / "logs").glob("*/snapshot-*.json"))


def _folder_cause(path) -> str:
    from loradoctor.logs.rules import load_rules

    return next(r.cause for r in load_rules() if r.id == path.parent.name)


@pytest.mark.parametrize("path", CAUSE_SNAPSHOTS, ids=[f"{p.parent.name}/{p.name}" for p in CAUSE_SNAPSHOTS])
def test_a_cause_folder_snapshot(path):
    assert path.name.startswith(("snapshot-pos", "snapshot-neg")), path
    cause = _folder_cause(path)
    found = [f for f in run_checks(json.loads(path.read_text(encoding="utf-8"))) if f.cause == cause]
    if path.name.startswith("snapshot-pos"):
        assert found and all(f.evidence for f in found), f"{path.name}: no {cause} finding"
    else:
        assert not found, f"{path.name}: {[f.title for f in found]}"


def test_every_check_fires_on_some_fixture():
    fired = {f.rule[4:] for name in EXPECTED for f in run_checks(load(name))}
    fired |= {f.rule[4:] for p in CAUSE_SNAPSHOTS if p.name.startswith("snapshot-pos")
              for f in run_checks(json.loads(p.read_text(encoding="utf-8")))}
    assert set(checks.CHECK_NAMES) - fired <= {"torch_installed", "mig", "deep_matmul", "gpu_training"}  # tests below


def _fix_commands(findings, cause):
    return [fx.command for f in findings if f.cause == cause for fx in f.fixes if fx.command]


def test_cpu_only_fix_is_the_newest_wheel_the_driver_supports():
    cmds = _fix_commands(run_checks(load("cpu_only_wheel")), "env.torch_cpu_only")
    assert cmds[0] == "pip install --force-reinstall torch==2.5.1 --index-url https://download.pytorch.org/whl/cu124"


def test_cpu_only_fix_follows_the_driver_ceiling():
    snap = load("cpu_only_wheel")
    snap["nvidia"]["cuda_driver_version"], snap["nvidia"]["driver_version"] = "12.2", "535.104.05"
    cmds = _fix_commands(run_checks(snap), "env.torch_cpu_only")
    assert cmds[0].endswith("/whl/cu121")


def test_cpu_only_without_gpu_is_only_info():
    snap = load("cpu_only_wheel")
    snap["nvidia"] = {"error": "could not check: NVML: NVML Shared Library Not Found; nvidia-smi not found"}
    findings = run_checks(snap)
    cpu = [f for f in findings if f.cause == "env.torch_cpu_only"]
    assert [f.severity for f in cpu] == ["info"]


def test_driver_too_old_offers_a_wheel_that_exists_for_that_release():
    findings = run_checks(load("driver_too_old"))
    f = next(f for f in findings if f.cause == "env.driver_too_old")
    assert f.facts["driver_min"] == "580.65.06"
    # torch 2.9 has no cu124 wheel: the fix picks cu128, which a 550 driver runs by minor-version compatibility
    assert f.fixes[0].command == "pip install --force-reinstall torch==2.9.0 --index-url https://download.pytorch.org/whl/cu128"
    assert "580.65.06" in f.fixes[1].text
    # the consequence (torch sees no GPU) is not reported separately
    assert not [x for x in findings if x.cause == "env.no_gpu_visible"]


def test_driver_new_enough_is_silent():
    snap = load("driver_too_old")
    snap["nvidia"]["driver_version"], snap["nvidia"]["cuda_driver_version"] = "580.82.07", "13.0"
    assert not [f for f in run_checks(snap) if f.cause == "env.driver_too_old"]


def test_rtx5090_fix_is_a_cu128_build():
    f = next(f for f in run_checks(load("rtx5090_cu126")) if f.cause == "env.arch_unsupported")
    assert f.fixes[0].command == "pip install --force-reinstall torch==2.7.1 --index-url https://download.pytorch.org/whl/cu128"
    assert f.facts["compute_capability"] == "12.0"


def test_rtx5090_on_a_cu128_build_is_fine():
    snap = load("rtx5090_cu126")
    snap["torch"].update(version="2.7.1+cu128", cuda_version="12.8", arch_list=["sm_70", "sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"])
    assert not [f for f in run_checks(snap) if f.severity != "info"]


def test_arch_from_the_wheel_table_when_the_probe_has_none():
    snap = load("rtx5090_cu126")
    snap["torch"]["arch_list"] = []
    f = next(f for f in run_checks(snap) if f.cause == "env.arch_unsupported")
    assert "cu126" in f.evidence[1].text


def test_pascal_on_cu128_is_too_old():
    snap = load("rtx5090_cu126")
    snap["nvidia"]["gpus"][0].update(name="Tesla P40", compute_capability="6.1")
    snap["torch"].update(version="2.7.1+cu128", cuda_version="12.8", arch_list=["sm_70", "sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"])
    f = next(f for f in run_checks(snap) if f.cause == "env.arch_unsupported")
    assert "older than the oldest arch" in f.summary
    assert f.fixes[0].command.endswith("/whl/cu126")


def test_zombie_fix_names_pid_and_command():
    f = next(f for f in run_checks(load("zombie_process")) if f.cause == "oom.other_process")
    assert f.facts["pid"] == 48213 and "python3" in f.title and "38.56 GiB" in f.title
    assert f.fixes[0].command == "kill $(ps -o ppid= -p 48213)"


def test_live_process_fix_is_kill():
    snap = load("zombie_process")
    snap["nvidia"]["gpus"][0]["processes"][0].update(status="sleeping", alive=True)
    f = next(f for f in run_checks(snap) if f.cause == "oom.other_process")
    assert f.fixes[0].command.startswith("kill 48213")


def test_our_own_process_and_small_ones_are_ignored():
    snap = load("zombie_process")
    snap["nvidia"]["gpus"][0]["processes"][0]["ours"] = True
    assert not [f for f in run_checks(snap) if f.cause == "oom.other_process"]
    snap = load("healthy_ampere_32gb")  # Xorg with 250 MiB
    assert not [f for f in run_checks(snap) if f.cause == "oom.other_process"]


def test_bf16_judged_by_compute_capability_and_source_of_request():
    f = next(f for f in run_checks(load("t4_bf16_requested")) if f.cause == "env.bf16_unsupported")
    assert any("ACCELERATE_MIXED_PRECISION=bf16" in e.text for e in f.evidence)
    snap = load("t4_bf16_requested")
    snap["env_vars"] = {}
    assert [f.severity for f in run_checks(snap) if f.cause == "env.bf16_unsupported"] == ["info"]
    snap["requested"] = {"features": ["bf16"], "source": "--want"}
    assert [f.severity for f in run_checks(snap) if f.cause == "env.bf16_unsupported"] == ["error"]
    healthy = load("healthy_ampere_32gb")  # bf16 requested on 8.6: fine
    assert not [f for f in run_checks(healthy) if f.cause == "env.bf16_unsupported"]


def test_cuda_visible_devices_picks_gpus():
    snap = load("t4_bf16_requested")
    snap["nvidia"]["gpus"].append(dict(snap["nvidia"]["gpus"][0], index=1, name="NVIDIA A100-SXM4-40GB", compute_capability="8.0",
                                       uuid="GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"))
    snap["env_vars"]["CUDA_VISIBLE_DEVICES"] = "1"
    assert not [f for f in run_checks(snap) if f.cause == "env.bf16_unsupported"]
    snap["env_vars"]["CUDA_VISIBLE_DEVICES"] = "GPU-aaaaaaaa"
    assert not [f for f in run_checks(snap) if f.cause == "env.bf16_unsupported"]
    snap["env_vars"]["CUDA_VISIBLE_DEVICES"] = "7"
    assert [f.severity for f in run_checks(snap) if f.cause == "env.no_gpu_visible"] == ["error"]


def test_torch_sees_no_gpu_while_driver_does():
    snap = load("healthy_ampere_32gb")
    snap["torch"].update(cuda_available=False, device_count=0, devices=[])
    f = next(f for f in run_checks(snap) if f.cause == "env.no_gpu_visible")
    assert "torch sees none" in f.title
    assert any("nvidia_uvm" in (fx.command or "") for fx in f.fixes)


def test_torch_not_installed():
    snap = load("healthy_ampere_32gb")
    snap["torch"] = {"installed": False}
    f = next(f for f in run_checks(snap) if f.rule == "env.torch_installed")
    assert f.severity == "error"  # bf16 was asked for with --want: no torch means the run cannot start
    assert f.fixes[0].command.endswith("/whl/cu124")
    del snap["requested"]
    snap["env_vars"].pop("ACCELERATE_MIXED_PRECISION", None)
    findings = run_checks(snap)
    assert [(f.rule, f.severity) for f in findings if f.severity != "info"] == [("env.torch_installed", "warning")]


def test_mig_is_reported():
    snap = load("cpu_only_wheel")
    snap["nvidia"]["gpus"][0]["mig_mode"] = "Enabled"
    assert [f.severity for f in run_checks(snap, only=["mig"])] == ["info"]


def test_flash_attn_requested_but_missing():
    snap = load("healthy_ampere_32gb")
    snap["flash_attn"] = {"installed": False}
    del snap["packages"]["flash-attn"]
    f = next(f for f in run_checks(snap) if f.cause == "env.flash_attn_broken")
    assert f.severity == "error" and "flash-attn" in f.fixes[0].command


def test_flash_attn_3_off_hopper():
    snap = load("healthy_ampere_32gb")
    snap["packages"]["flash-attn-3"] = "3.0.0b1"
    assert [f.severity for f in run_checks(snap) if f.cause == "env.flash_attn_unsupported"] == ["warning"]


def test_bnb_without_cuda_library_on_a_gpu_box():
    snap = load("healthy_ampere_32gb")
    snap["bitsandbytes"]["cuda"] = False
    assert [f.severity for f in run_checks(snap) if f.cause == "env.bnb_broken"] == ["error"]


def test_version_rules_only_fire_out_of_range():
    snap = load("broken_extensions")
    titles = [f.title for f in run_checks(snap) if f.cause == "env.version_conflict"]
    assert "trl 0.12.1 needs transformers>=4.46.0, found 4.44.2" in titles
    snap["packages"].update(transformers="4.46.3", triton="2.3.1")
    assert not [f for f in run_checks(snap) if f.cause == "env.version_conflict"]


@pytest.mark.parametrize("text,problem", [
    ("expandable_segments:True", None),
    ("expandable_segments:True,max_split_size_mb:512,garbage_collection_threshold:0.6", None),
    ("roundup_power2_divisions:[256:1,512:2,>:8],backend:native", None),
    ("expandable_segments:true", "True or False"),
    ("expandable_segments=True", "no ':'"),
    ("max_split_size_mb:12", "above 20"),
    ("max_split_size_mb:big", "integer"),
    ("garbage_collection_threshold:1.5", "fraction"),
    ("backend:cudaMallocAsync,max_split_size_mb:256", "ignores max_split_size_mb"),
    ("expandable_segment:True", "Unrecognized CachingAllocator option: expandable_segment"),
])
def test_alloc_conf_parser(text, problem):
    _, problems = parse_alloc_conf(text)
    if problem is None:
        assert problems == []
    else:
        assert problems and problem in problems[0]


def test_alloc_confs_that_disagree():
    snap = load("healthy_ampere_32gb")
    snap["env_vars"]["PYTORCH_ALLOC_CONF"] = "expandable_segments:False"
    assert [f.severity for f in run_checks(snap) if f.cause == "env.bad_setting"] == ["warning"]


def test_run_single_check_and_unknown_check():
    from loradoctor.errors import UserError

    snap = load("bad_settings")
    assert {f.rule for f in run_checks(snap, only=["settings"])} == {"env.settings"}
    with pytest.raises(UserError):
        run_checks(snap, only=["no_such_check"])


def test_a_crashing_check_does_not_hide_the_others():
    snap = load("zombie_process")
    bad = copy.deepcopy(snap)
    bad["nvidia"]["gpus"][0]["memory_total_bytes"] = "lots"  # junk a pasted file might carry
    findings = run_checks(bad)
    failed = [f for f in findings if f.rule == "env.other_process"]
    assert [f.cause for f in failed] == ["internal.check_failed"]
    assert failed[0].title.startswith("could not check: other_process: TypeError")
    assert failed[0].fixes[0].command == "loradoctor env --check other_process"
    bad["env_vars"] = {"CUDA_LAUNCH_BLOCKING": "1"}
    assert "env.bad_setting" in {f.cause for f in run_checks(bad)}  # the other checks still ran


def test_a_crashing_torch_check_is_not_reported_as_a_broken_torch(monkeypatch):
    def boom(snapshot):
        raise KeyError("arch_list")

    patched = [checks.Check(c.name, c.area, c.description, boom) if c.name == "arch_unsupported" else c
               for c in checks.CHECKS]
    monkeypatch.setattr(checks, "CHECKS", patched)
    findings = run_checks(load("healthy_ampere_32gb"))
    failed = [f for f in findings if f.rule == "env.arch_unsupported"]
    assert [(f.cause, f.severity) for f in failed] == [("internal.check_failed", "warning")]
    assert failed[0].title == "could not check: arch_unsupported: KeyError: 'arch_list'"
    assert not [f for f in findings if f.cause == "env.torch_broken"]


def test_checks_tolerate_an_empty_snapshot():
    assert run_checks({}) == []
    assert run_checks({"nvidia": {"error": "could not check: x"}, "torch": {"error": "could not check: y"}}) == []


def _deep(snap, bf16, fp16):
    snap["torch"]["deep"] = [{"index": 0, "bf16": bf16, "fp16": fp16}]
    return snap


def test_deep_matmul_results():
    ok = {"ok": True, "max_rel_err": 0.004}
    assert not run_checks(_deep(load("healthy_ampere_32gb"), ok, ok), only=["deep_matmul"])
    wrong = run_checks(_deep(load("healthy_ampere_32gb"), {"ok": False, "max_rel_err": 1.7}, ok), only=["deep_matmul"])
    assert [(f.cause, f.severity, f.repro) for f in wrong] == [("cuda.illegal_access", "error", "bf16")]
    nokernel = run_checks(_deep(load("healthy_ampere_32gb"), ok, {"ok": False, "error": "AcceleratorError: CUDA error: no kernel image is available for execution on the device"}),
                          only=["deep_matmul"])
    assert [f.cause for f in nokernel] == ["env.arch_unsupported"]
    # bf16 failing on a T4 is expected (the bf16 check covers it)
    assert not run_checks(_deep(load("t4_bf16_requested"), {"ok": False, "error": "x"}, ok), only=["deep_matmul"])


def test_findings_name_the_confirming_repro():
    f = next(f for f in run_checks(load("t4_bf16_requested")) if f.cause == "env.bf16_unsupported")
    assert f.repro == "bf16"  # from the cause catalogue (loradoctor/data/causes.yaml)


def test_every_registered_check_is_documented():
    # `env --list-checks` prints each check's docstring line (the registry is the list of checks); its cause and
    # wording are documented by the catalogue (`loradoctor docs causes`), its fixtures by its rule folder.
    assert all(c.description and c.description != c.name for c in checks.CHECKS), [c.name for c in checks.CHECKS if not c.description]


def test_the_gate_stays_silent_when_another_check_already_says_why():
    for name in ("cpu_only_wheel", "torch_segfault", "driver_too_old", "nvml_mismatch", "container_no_gpu",
                 "wsl_no_libcuda", "cvd_hides_gpus", "healthy_ampere_32gb"):
        assert not [f for f in run_checks(load(name)) if f.rule == "env.gpu_training"], name


def test_torch_that_cannot_see_the_gpu_is_a_reason_of_the_gate():
    snap = load("healthy_ampere_32gb")
    snap["torch"].update(cuda_available=False, device_count=0)
    blockers = checks.gpu_training_blockers(snap)
    assert blockers == [("torch.device_count", "torch 2.5.1+cu124 cannot see the GPU")]
    # the no_gpu_visible check explains it (the driver lists a GPU that torch does not see), so it leads alone
    assert [f.rule for f in run_checks(snap) if f.severity == "error"] == ["env.no_gpu_visible"]


def test_the_gate_without_a_gpu_says_how_to_see_why_instead_of_a_repro_that_only_skips():
    # issue 12: `loradoctor repro run cuda-init` SKIPs on a machine with no GPU; the gate there names the
    # commands that tell why (driver, device nodes, the torch build), and no finding points at a GPU repro.
    snap = {"nvidia": {"error": "could not check: NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver"},
            "torch": {"installed": True, "version": "2.5.1+cpu", "cuda_version": None}}
    found = run_checks(snap)
    gate = next(f for f in found if f.rule == "env.gpu_training")
    assert gate.repro is None and not [f for f in found if f.repro]
    commands = [fix.command for fix in gate.fixes]
    assert any("nvidia-smi" in c and "/dev/nvidia" in c for c in commands), commands
    assert any("torch.version.cuda" in c for c in commands), commands


def test_a_gpu_repro_is_offered_only_where_a_gpu_exists():
    snap = load("healthy_ampere_32gb")
    snap["torch"].update(cuda_available=False, device_count=0)
    lead = next(f for f in run_checks(snap) if f.severity == "error")
    assert (lead.rule, lead.repro) == ("env.no_gpu_visible", "cuda-init")  # the driver lists a GPU: the repro runs
    container = [f for f in run_checks(load("container_no_gpu")) if f.cause == "env.no_gpu_visible"]
    assert container and all(f.repro is None for f in container)  # no GPU in the container: it would only SKIP


def _finding_calls():
    """(line, causes, variant) of every _finding(...) call in loradoctor/env/checks.py: the cause and the variant
    as the constants the call names (an `a if x else b` names both)."""
    import ast

    def consts(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [node.value]
        if isinstance(node, ast.IfExp):
            return consts(node.body) + consts(node.orelse)
        return None

    tree = ast.parse(open(checks.__file__, encoding="utf-8").read())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "_finding":
            variant = consts(node.args[2]) if len(node.args) > 2 else [None]
            yield node.lineno, consts(node.args[0]), variant, [k.arg for k in node.keywords]


def test_checks_spell_no_wording_and_name_only_catalogue_variants():
    # issue 9: a check returns cause, facts and evidence (+ the variant); title, summary and fixes are the catalogue's
    from loradoctor import catalogue

    calls = list(_finding_calls())
    assert len(calls) >= 30, "could not read the checks' _finding calls"
    for line, causes, variants, keywords in calls:
        assert variants, f"checks.py:{line}: name the variant as a constant"
        assert not {"title", "summary", "fixes"} & set(keywords), f"checks.py:{line} words a finding itself"
        if causes is None:  # a helper that takes the cause as a parameter: some cause has each variant
            assert all(any(v in c.variants for c in catalogue.causes().values()) for v in variants), line
            continue
        for cause in causes:
            for variant in variants:
                catalogue.wording(cause, variant)  # KeyError: a wording the catalogue does not have
    source = open(checks.__file__, encoding="utf-8").read()
    assert source.count("Fix(") == 1  # the one in _finding, built from the catalogue's steps
