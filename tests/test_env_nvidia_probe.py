"""The NVIDIA probe without a GPU: a fake pynvml module with NVML's API shapes, and a fake nvidia-smi on PATH."""

import os
import stat
import sys
import types

import pytest

from loradoctor.env.probes import nvidia
from loradoctor.units import MIB


class _NVMLError(Exception):
    pass


def fake_pynvml(fail_init: str = "", our_pid: int = 0) -> types.ModuleType:
    m = types.ModuleType("pynvml")
    consts = dict(NVML_TEMPERATURE_GPU=0, NVML_TEMPERATURE_THRESHOLD_SLOWDOWN=1, NVML_TEMPERATURE_THRESHOLD_SHUTDOWN=0,
                  NVML_MEMORY_ERROR_TYPE_UNCORRECTED=1, NVML_MEMORY_ERROR_TYPE_CORRECTED=0, NVML_VOLATILE_ECC=0,
                  NVML_AGGREGATE_ECC=1, NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS=0,
                  NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR=1)
    for k, v in consts.items():
        setattr(m, k, v)

    def init():
        if fail_init:
            raise _NVMLError(fail_init)

    def not_supported(*_):
        raise _NVMLError("Not Supported")

    m.nvmlInit = init
    m.nvmlShutdown = lambda: None
    m.nvmlSystemGetDriverVersion = lambda: b"550.54.15"  # old bindings return bytes
    m.nvmlSystemGetCudaDriverVersion_v2 = lambda: 12040
    m.nvmlDeviceGetCount = lambda: 1
    m.nvmlDeviceGetHandleByIndex = lambda i: f"h{i}"
    m.nvmlDeviceGetName = lambda h: "NVIDIA A100-SXM4-80GB"
    m.nvmlDeviceGetUUID = lambda h: "GPU-11111111-2222-3333-4444-555555555555"
    m.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=b"00000000:07:00.0")
    m.nvmlDeviceGetCudaComputeCapability = lambda h: (8, 0)
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=81920 * MIB, used=30000 * MIB, free=51920 * MIB)
    m.nvmlDeviceGetComputeRunningProcesses = lambda h: [
        types.SimpleNamespace(pid=our_pid, usedGpuMemory=500 * MIB),
        types.SimpleNamespace(pid=999999, usedGpuMemory=29000 * MIB),
        types.SimpleNamespace(pid=999998, usedGpuMemory=None),  # WDDM / no permission
    ]
    m.nvmlDeviceGetTemperature = lambda h, s: 64
    m.nvmlDeviceGetTemperatureThreshold = lambda h, t: 89 if t == 1 else 92
    m.nvmlDeviceGetCurrentClocksEventReasons = lambda h: 0x4 | 0x40
    m.nvmlDeviceGetPowerUsage = lambda h: 312450
    m.nvmlDeviceGetEnforcedPowerLimit = lambda h: 400000
    m.nvmlDeviceGetCurrPcieLinkGeneration = lambda h: 4
    m.nvmlDeviceGetMaxPcieLinkGeneration = lambda h: 4
    m.nvmlDeviceGetCurrPcieLinkWidth = lambda h: 16
    m.nvmlDeviceGetMaxPcieLinkWidth = lambda h: 16
    m.nvmlDeviceGetEccMode = lambda h: (1, 1)
    m.nvmlDeviceGetTotalEccErrors = lambda h, kind, scope: 2 if (kind, scope) == (1, 0) else 0
    m.nvmlDeviceGetRetiredPages = not_supported
    m.nvmlDeviceGetRetiredPagesPendingStatus = not_supported
    m.nvmlDeviceGetRemappedRows = lambda h: (0, 1, 1, 0)
    m.nvmlDeviceGetMigMode = lambda h: (0, 0)
    m.nvmlDeviceGetPersistenceMode = lambda h: 1
    return m


def test_nvml_probe_reads_every_field(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(our_pid=os.getpid()))
    nv = nvidia.probe(5)
    assert nv["source"] == "nvml" and nv["driver_version"] == "550.54.15" and nv["cuda_driver_version"] == "12.4"
    g = nv["gpus"][0]
    assert g["compute_capability"] == "8.0" and g["bus_id"] == "00000000:07:00.0"
    assert g["memory_free_bytes"] == 51920 * MIB
    assert g["throttle_reasons"] == ["sw_power_cap", "hw_thermal_slowdown"]
    assert (g["temperature_c"], g["slowdown_temp_c"], g["shutdown_temp_c"]) == (64, 89, 92)
    assert (g["power_draw_w"], g["power_limit_w"]) == (round(312.45, 1), 400.0)  # NVML reports milliwatts
    assert g["ecc_uncorrected_volatile"] == 2 and g["ecc_mode"] == "Enabled"
    assert "retired_pages_dbe" not in g  # Not Supported -> absent, not 0
    assert g["remapped_rows_pending"] is True and g["remapped_rows_uncorrectable"] == 1
    assert g["mig_mode"] == "Disabled" and g["persistence_mode"] == "Enabled"
    ours, other, unknown = g["processes"]
    assert ours["ours"] is True and ours["alive"] is True
    assert other["ours"] is False and other["used_bytes"] == 29000 * MIB and other["alive"] is None  # no such pid here
    assert unknown["used_bytes"] is None


def test_nvml_failure_is_could_not_check(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(fail_init="Driver/library version mismatch"))
    monkeypatch.setenv("PATH", "/nonexistent")
    nv = nvidia.probe(5)
    assert nv["error"].startswith("could not check: NVML: Driver/library version mismatch")


def _fake_smi(tmp_path, compute_cap_ok: bool = True) -> str:
    script = tmp_path / "nvidia-smi"
    script.write_text(f"""#!/bin/sh
case "$1" in
  --query-gpu=*)
    case "$1" in *compute_cap*) if [ "{int(compute_cap_ok)}" = 0 ]; then echo 'Field "compute_cap" is not a valid field to query.'; exit 2; fi;; esac
    if [ "{int(compute_cap_ok)}" = 1 ]; then
      echo "0, Tesla T4, GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee, 00000000:00:04.0, 7.5, 15360, 14000, 1360, 58, 31.20, 70.00, 3, 3, 16, 16, 0x0000000000000001, 0, 0, [N/A], Enabled, 535.104.05"
    else
      echo "0, Tesla T4, GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee, 00000000:00:04.0, 15360, 14000, 1360, 58, 31.20, 70.00, 3, 3, 16, 16, 0x0000000000000001, 0, 0, [N/A], Enabled, 470.199.02"
    fi;;
  --query-compute-apps=*) echo "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee, 4321, python, 13990";;
  *) echo "| NVIDIA-SMI 535.104.05   Driver Version: 535.104.05   CUDA Version: 12.2     |";;
esac
""")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(tmp_path)


@pytest.mark.parametrize("compute_cap_ok", [True, False])
def test_nvidia_smi_fallback(monkeypatch, tmp_path, compute_cap_ok):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(fail_init="NVML Shared Library Not Found"))
    monkeypatch.setenv("PATH", _fake_smi(tmp_path, compute_cap_ok) + os.pathsep + os.environ["PATH"])
    nv = nvidia.probe(5)
    assert nv["source"] == "nvidia-smi" and nv["nvml_error"].startswith("NVML:")
    assert nv["cuda_driver_version"] == "12.2"
    g = nv["gpus"][0]
    assert g["name"] == "Tesla T4" and g["memory_total_bytes"] == 15360 * MIB and g["memory_free_bytes"] == 1360 * MIB
    assert g.get("compute_capability") == ("7.5" if compute_cap_ok else None)
    assert g["throttle_reasons"] == ["gpu_idle"] and "mig_mode" not in g
    assert g["processes"][0]["pid"] == 4321 and g["processes"][0]["used_bytes"] == 13990 * MIB


def test_kernel_module_version_regex(monkeypatch, tmp_path):
    closed = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.161.07  Sat Feb 17 22:55:48 UTC 2024\nGCC version:  gcc version 12.3.0\n"
    opened = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build  (dvs-builder@U16-T02-35-3)\n"
    import builtins

    real_open = builtins.open
    for text, want in ((closed, "535.161.07"), (opened, "550.54.15")):
        path = tmp_path / "version"
        path.write_text(text)
        monkeypatch.setattr(builtins, "open", lambda p, *a, **k: real_open(path if p == "/proc/driver/nvidia/version" else p, *a, **k))
        assert nvidia.kernel_module_version() == want
