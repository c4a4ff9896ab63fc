"""Importers of pasted reports: collect_env text (several eras), nvidia-smi tables, nvidia-smi -q, saved JSON."""

import json

import pytest

from conftest import FIXTURES, run_cli
from loradoctor.env.checks import run_checks
from loradoctor.env.snapshot import load_snapshot, parse_snapshot_text, redact
from loradoctor.errors import UserError
from loradoctor.units import MIB

ENV = FIXTURES / "env"


def causes(snap, severity=("error", "warning")):
    return {f.cause for f in run_checks(snap) if f.severity in severity}


def test_collect_env_2_5_two_a100s_is_healthy():
    s = load_snapshot(str(ENV / "collect_env_2.5_cu124_a100.txt"))
    assert s["meta"]["source"] == "collect_env"
    assert s["torch"] == {**s["torch"], "version": "2.5.1+cu124", "cuda_version": "12.4", "cuda_available": True, "device_count": 2}
    assert s["torch"]["cudnn_version"] == "9.1.0"
    assert [g["compute_capability"] for g in s["nvidia"]["gpus"]] == ["8.0", "8.0"]
    assert s["nvidia"]["driver_version"] == "550.90.07"
    assert s["packages"]["trl"] == "0.12.1" and s["packages"]["nvidia-cudnn-cu12"] == "9.1.0.70"
    assert "could" not in s["packages"]
    assert causes(s) == set()


def test_collect_env_1_13_t4_old_era():
    s = load_snapshot(str(ENV / "collect_env_1.13_t4.txt"))
    assert s["torch"]["version"] == "1.13.1+cu117" and s["torch"]["cuda_version"] == "11.7"
    assert s["nvidia"]["gpus"][0]["name"] == "Tesla T4" and s["nvidia"]["gpus"][0]["compute_capability"] == "7.5"
    assert s["packages"]["bitsandbytes"] == "0.39.1"
    assert s["packages"]["torch"] == "1.13.1+cu117"
    assert causes(s) == set()
    s["requested"] = {"features": ["bf16"], "source": "--want"}
    assert causes(s) == {"env.bf16_unsupported"}


def test_collect_env_cpu_wheel_with_a_gpu():
    s = load_snapshot(str(ENV / "collect_env_2.1_cpu_wheel_rtx3090.txt"))
    assert s["torch"]["cuda_version"] is None and s["torch"]["cuda_available"] is False
    assert s["torch"]["devices"] == []  # the GPU came from nvidia-smi -L, not from torch
    assert s["nvidia"]["gpus"][0]["name"] == "NVIDIA GeForce RTX 3090"
    findings = run_checks(s)
    f = next(f for f in findings if f.cause == "env.torch_cpu_only")
    assert f.severity == "error"
    # driver 545.23.08 (no CUDA ceiling in collect_env): derived 12.3 -> torch 2.1 has cu121
    assert f.fixes[0].command == "pip install --force-reinstall torch==2.1.2 --index-url https://download.pytorch.org/whl/cu121"


def test_collect_env_rtx5090_cu126_under_wsl():
    s = load_snapshot(str(ENV / "collect_env_2.7_cu126_rtx5090_wsl.txt"))
    assert s["system"]["wsl"] is True
    assert causes(s) == {"env.arch_unsupported"}


def test_collect_env_without_torch():
    s = load_snapshot(str(ENV / "collect_env_no_torch.txt"))
    assert s["torch"]["installed"] is False
    assert s["nvidia"]["error"].startswith("could not check")
    # issue 12: no GPU and no torch is not "no problems": the report leads with why GPU training cannot work
    first = run_checks(s)[0]
    assert (first.cause, first.severity, first.rank) == ("env.no_gpu_visible", "warning", 1)
    assert first.title == ("GPU fine-tuning is not possible here: no NVIDIA GPU or driver was found "
                           "(collect_env shows no NVIDIA driver or GPU) and torch is not installed")


def test_nvidia_smi_550_table_with_a_busy_gpu():
    s = load_snapshot(str(ENV / "nvidia_smi_550_rtx4090_busy.txt"))
    nv = s["nvidia"]
    assert (nv["driver_version"], nv["cuda_driver_version"]) == ("550.54.15", "12.4")
    g = nv["gpus"][0]
    assert g["name"] == "NVIDIA GeForce RTX 4090" and g["compute_capability"] == "8.9"
    assert g["memory_total_bytes"] == 24564 * MIB and g["memory_used_bytes"] == 22871 * MIB
    assert g["temperature_c"] == 47 and g["power_limit_w"] == 450.0
    assert [(p["pid"], p["used_bytes"]) for p in g["processes"]] == [(1873, 412 * MIB), (2290, 27 * MIB), (20417, 22430 * MIB)]
    f = next(f for f in run_checks(s) if f.cause == "oom.other_process")
    assert f.facts["pid"] == 20417 and f.severity == "error"  # 1.6 GiB left of 24
    assert f.fixes[0].command.startswith("kill 20417")


def test_nvidia_smi_470_table_two_v100s_with_ecc_errors():
    s = load_snapshot(str(ENV / "nvidia_smi_470_v100x2.txt"))
    gpus = s["nvidia"]["gpus"]
    assert [g["index"] for g in gpus] == [0, 1]
    assert gpus[0]["compute_capability"] == "7.0"  # from the truncated name "Tesla V100-SXM2..."
    assert gpus[1]["ecc_uncorrected_volatile"] == 2
    assert causes(s) == {"hw.memory_errors"}


def test_nvidia_smi_580_table():
    s = load_snapshot(str(ENV / "nvidia_smi_580_h100x2.txt"))
    nv = s["nvidia"]
    assert nv["cuda_driver_version"] == "13.0"
    assert [g["mig_mode"] for g in nv["gpus"]] == ["Disabled", "Disabled"]
    assert nv["gpus"][1]["processes"][0]["pid"] == 3055121
    assert causes(s) == {"oom.other_process"}


def test_nvidia_smi_530_table_persistence_cell_without_blank_and_mig_on():
    # R530 closes the Persistence-M cell with no blank before the bar (`Off| 0000...`); the row is read
    s = load_snapshot(str(ENV / "nvidia_smi_530_a100_mig_no_instances.txt"))
    nv = s["nvidia"]
    assert [(g["name"], g["mig_mode"], g["memory_total_bytes"] // 2**20) for g in nv["gpus"]] == [
        ("NVIDIA A100-SXM4-80GB", "Enabled", 81920)]
    assert not (s.get("meta") or {}).get("not_understood")
    assert causes(s, severity=("error", "warning", "info")) == {"env.no_gpu_visible"}  # the MIG note


def test_nvidia_smi_mismatch_text():
    s = load_snapshot(str(ENV / "nvidia_smi_mismatch.txt"))
    assert s["nvidia"]["library_version"] == "535.183"
    assert causes(s) == {"env.nvml_mismatch"}


def test_nvidia_smi_q_a100_r535():
    s = load_snapshot(str(ENV / "nvidia_smi_q_a100_r535.txt"))
    nv = s["nvidia"]
    assert nv["driver_version"] == "535.129.03" and nv["cuda_driver_version"] == "12.2"
    g = nv["gpus"][0]
    assert g["name"] == "NVIDIA A100-SXM4-40GB" and g["compute_capability"] == "8.0"
    assert g["uuid"].startswith("GPU-")
    assert g["memory_total_bytes"] == 40960 * MIB and g["memory_used_bytes"] == 38211 * MIB
    assert g["throttle_reasons"] == ["sw_power_cap", "hw_slowdown", "hw_thermal_slowdown"]
    assert (g["temperature_c"], g["slowdown_temp_c"], g["shutdown_temp_c"]) == (86, 89, 92)
    assert (g["pcie_gen_current"], g["pcie_gen_max"], g["pcie_width_current"], g["pcie_width_max"]) == (4, 4, 16, 16)
    assert g["ecc_uncorrected_volatile"] == 0 and g["ecc_corrected_volatile"] == 3
    assert g["remapped_rows_pending"] is True and g["remapped_rows_failure"] is False
    assert g["mig_mode"] == "Disabled" and g["persistence_mode"] == "Enabled"
    assert g["power_draw_w"] == 312.45 and g["power_limit_w"] == 400.0
    assert g["processes"] == [{"pid": 91822, "ours": False, "type": "C", "name": "/usr/bin/python3", "used_bytes": 38198 * MIB}]
    assert causes(s) == {"hw.memory_errors", "hw.thermal_power", "oom.other_process"}


def test_nvidia_smi_q_v100_r470_old_layout():
    s = load_snapshot(str(ENV / "nvidia_smi_q_v100_r470.txt"))
    g = s["nvidia"]["gpus"][0]
    assert g["name"] == "Tesla V100-SXM2-16GB" and g["compute_capability"] == "7.0"
    assert g["throttle_reasons"] == ["gpu_idle"]
    assert g["ecc_uncorrected_volatile"] == 0 and g["ecc_uncorrected_aggregate"] == 1
    assert g["retired_pages_dbe"] == 1 and g["retired_pages_pending"] is False
    assert g["processes"] == []
    assert causes(s) == {"hw.memory_errors"}
    assert [f.severity for f in run_checks(s) if f.cause == "hw.memory_errors"] == ["warning"]


def test_saved_report_and_bare_snapshot_round_trip(tmp_path):
    snap = json.loads((FIXTURES / "snapshots" / "cpu_only_wheel.json").read_text())
    (tmp_path / "report.json").write_text(json.dumps({"schema": "loradoctor.env/1", "snapshot": snap, "findings": []}))
    (tmp_path / "bare.json").write_text(json.dumps(snap))
    for name in ("report.json", "bare.json"):
        loaded = load_snapshot(str(tmp_path / name))
        assert loaded["torch"]["version"] == "2.5.1+cpu"
        assert causes(loaded) == {"env.torch_cpu_only"}


@pytest.mark.parametrize("text,message", [
    ("", "empty"),
    ("{not json", "does not parse"),
    ('{"hello": 1}', "not a loradoctor snapshot"),
    ("just some log line\nanother", "unknown format"),
])
def test_unreadable_input_raises_user_error(text, message):
    with pytest.raises(UserError, match=message):
        parse_snapshot_text(text)


def test_missing_file_and_folder(tmp_path):
    with pytest.raises(UserError, match="no such file"):
        load_snapshot(str(tmp_path / "nope.json"))
    with pytest.raises(UserError, match="folder"):
        load_snapshot(str(tmp_path))


def test_redact_removes_uuids_host_and_home():
    snap = json.loads((FIXTURES / "snapshots" / "healthy_ampere_32gb.json").read_text())
    text = json.dumps(redact(snap))
    assert "GPU-5f0c1e2a" not in text and "GPU-<redacted>" in text
    assert "gpu-box-07" not in text and "/home/ana" not in text and "/home/<user>" in text


def test_cli_from_file_runs_the_same_checks():
    res = run_cli("env", "--from", str(ENV / "nvidia_smi_550_rtx4090_busy.txt"))
    assert res.returncode == 1
    assert "pid 20417" in res.stdout and "kill 20417" in res.stdout
    res = run_cli("env", "--from", str(ENV / "collect_env_1.13_t4.txt"), "--want", "bf16")
    assert res.returncode == 1 and "env.bf16_unsupported" in res.stdout
    res = run_cli("env", "--from", "-", input=(ENV / "nvidia_smi_mismatch.txt").read_text())
    assert res.returncode == 1 and "env.nvml_mismatch" in res.stdout


def test_cli_from_bad_file_exits_2(tmp_path):
    bad = tmp_path / "x.txt"
    bad.write_text("hello\n")
    res = run_cli("env", "--from", str(bad))
    assert res.returncode == 2
    assert res.stderr.startswith("loradoctor: error:") and "Traceback" not in res.stderr


def test_redact_short_host_name_keeps_other_words():
    snap = {"system": {"hostname": "vm", "python_executable": "/root/.venv/bin/python"},
            "nvidia": {"error": "could not check: NVML: NVML Shared Library Not Found (running in a vm)"}}
    out = redact(snap)
    assert out["system"]["hostname"] == "<host>"
    assert out["nvidia"]["error"] == "could not check: NVML: NVML Shared Library Not Found (running in a <host>)"
    assert out["system"]["python_executable"] == "/<home>/.venv/bin/python"
    assert snap["system"]["hostname"] == "vm"  # a copy
