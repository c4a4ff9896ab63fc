"""`loradoctor env` as a user runs it: formats, exit codes, --strict, --check, --list-checks, --want, bad usage."""

import json
from pathlib import Path

import pytest

from conftest import FIXTURES, run_cli

SNAPS = FIXTURES / "snapshots"


def snap_path(name: str) -> str:
    return str(SNAPS / f"{name}.json")


def test_healthy_snapshot_exits_0_with_a_verdict():
    res = run_cli("env", "--from", snap_path("healthy_ampere_32gb"))
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.splitlines()[0] == "No problems found: 1 GPU (NVIDIA GeForce RTX 3090), torch 2.5.1+cu124"
    assert "GPU 0" in res.stdout and "compute capability 8.6" in res.stdout


def test_error_verdict_first_and_grouped_by_area():
    res = run_cli("env", "--from", snap_path("bad_settings"))
    assert res.returncode == 1
    lines = res.stdout.splitlines()
    assert lines[0].startswith("2 errors, 3 warnings: PYTORCH_CUDA_ALLOC_CONF is not valid")
    assert "settings" in lines and "host" in lines  # area headings
    assert "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in res.stdout


def test_json_document_shape():
    res = run_cli("env", "--from", snap_path("cpu_only_wheel"), "--format", "json")
    assert res.returncode == 1
    doc = json.loads(res.stdout)
    assert list(doc) == ["schema", "verdict", "snapshot", "findings"]
    assert doc["verdict"].startswith("1 error: torch 2.5.1+cpu is a CPU-only build")
    assert doc["schema"] == "loradoctor.env/1"
    assert doc["snapshot"]["schema"] == "loradoctor.snapshot/1"
    f = doc["findings"][0]
    assert f["cause"] == "env.torch_cpu_only" and f["rank"] == 1
    assert f["evidence"][0]["file"].startswith("snapshot:")


def test_markdown_is_redacted():
    res = run_cli("env", "--from", snap_path("zombie_process"), "--format", "md")
    assert res.returncode == 1
    assert res.stdout.startswith("## loradoctor env")
    assert "GPU-9c1d2e3f" not in res.stdout and "gpu-box-07" not in res.stdout and "/home/ana" not in res.stdout
    assert "kill $(ps -o ppid= -p 48213)" in res.stdout


def test_strict_turns_warnings_into_exit_1(tmp_path):
    snap = json.loads((SNAPS / "healthy_ampere_32gb.json").read_text())
    snap["env_vars"]["CUDA_LAUNCH_BLOCKING"] = "1"
    path = tmp_path / "env_strict.json"  # written under tmp_path, never into the checkout
    path.write_text(json.dumps(snap))
    assert run_cli("env", "--from", str(path)).returncode == 0
    assert run_cli("env", "--from", str(path), "--strict").returncode == 1


def test_single_check_and_list():
    res = run_cli("env", "--from", snap_path("hw_unhealthy"), "--check", "thermal_power", "--format", "json")
    doc = json.loads(res.stdout)
    assert {f["rule"] for f in doc["findings"]} == {"env.thermal_power"}
    assert res.returncode == 0  # thermal findings are warnings; the memory errors were not checked
    listing = run_cli("env", "--list-checks")
    assert listing.returncode == 0
    assert len(listing.stdout.splitlines()) >= 19 and listing.stdout.startswith("nvml_mismatch")


def test_want_flag_requests_features():
    res = run_cli("env", "--from", snap_path("t4_flash_attn_requested"), "--want", "bf16", "--format", "json")
    doc = json.loads(res.stdout)
    assert doc["snapshot"]["requested"]["features"] == ["bf16"]
    assert {f["cause"] for f in doc["findings"] if f["severity"] == "error"} == {"env.bf16_unsupported"}


@pytest.mark.parametrize("args,message", [
    (("--format", "xml"), "--format must be"),
    (("--want", "tf32"), "unknown feature"),
    (("--check", "nope"), "unknown check"),
    (("--timeout", "-1"), "--timeout"),
])
def test_bad_usage_exits_2(args, message):
    res = run_cli("env", "--from", snap_path("healthy_ampere_32gb"), *args)
    assert res.returncode == 2
    assert message in res.stderr and "Traceback" not in res.stderr


def test_help_is_fast_and_lists_env():
    import time

    started = time.monotonic()
    res = run_cli("env", "--help")
    assert res.returncode == 0 and "--from" in res.stdout and "--want" in res.stdout
    assert time.monotonic() - started < 5


# ---- issue 12: gates mean what they say

NO_GPU_NO_TORCH = str(FIXTURES / "env" / "collect_env_no_torch.txt")


def _cpu_only_without_gpu(tmp_path) -> str:
    snap = json.loads((SNAPS / "cpu_only_wheel.json").read_text())
    snap["nvidia"] = {"error": "could not check: NVML: NVML Shared Library Not Found; nvidia-smi not found"}
    path = tmp_path / "cpu_only_no_gpu.json"
    path.write_text(json.dumps(snap))
    return str(path)


def test_no_gpu_and_no_torch_leads_with_a_warning():
    res = run_cli("env", "--from", NO_GPU_NO_TORCH)
    assert res.returncode == 0, res.stdout
    assert res.stdout.splitlines()[0].startswith("1 warning: GPU fine-tuning is not possible here: no NVIDIA GPU")
    assert "No problems found" not in res.stdout


@pytest.mark.parametrize("extra", [("--want", "bf16"), ("--strict",), ("--want", "bf16", "--strict")])
def test_no_gpu_with_a_gpu_feature_or_strict_is_an_error(extra):
    res = run_cli("env", "--from", NO_GPU_NO_TORCH, *extra, "--format", "json")
    assert res.returncode == 1, res.stdout
    doc = json.loads(res.stdout)
    first = doc["findings"][0]
    assert (first["severity"], first["rank"], first["rule"]) == ("error", 1, "env.gpu_training")
    assert first["title"].startswith("GPU fine-tuning is not possible here")
    assert doc["verdict"].startswith("1 error: GPU fine-tuning is not possible here")


def test_cpu_only_torch_without_gpu_is_no_longer_hidden(tmp_path):
    path = _cpu_only_without_gpu(tmp_path)
    res = run_cli("env", "--from", path)
    assert res.returncode == 0
    assert res.stdout.splitlines()[0] == ("1 warning: GPU fine-tuning is not possible here: no NVIDIA GPU or driver was "
                                          "found (NVML: NVML Shared Library Not Found; nvidia-smi not found) and torch "
                                          "2.5.1+cpu is a CPU-only build")
    assert run_cli("env", "--from", path, "--want", "bf16").returncode == 1


def test_want_is_judged_against_a_card_named_with_gpu():
    healthy = snap_path("healthy_ampere_32gb")
    t4 = run_cli("env", "--from", healthy, "--gpu", "T4", "--want", "bf16", "--format", "json")
    assert t4.returncode == 1
    doc = json.loads(t4.stdout)
    bf16 = [f for f in doc["findings"] if f["cause"] == "env.bf16_unsupported"]
    assert [f["severity"] for f in bf16] == ["error"]
    assert bf16[0]["title"] == "bf16 requested but the T4 named with --gpu has no native bf16"
    assert bf16[0]["evidence"][0] == {"file": "snapshot:requested.gpu", "line": None,
                                      "text": "T4 compute capability 7.5 (bf16 needs 8.0, Ampere)"}
    assert "against the T4 named with --gpu" in doc["verdict"]
    ok = run_cli("env", "--from", healthy, "--gpu", "RTX 4090", "--want", "bf16,flash-attn")
    assert ok.returncode == 0, ok.stdout
    fa = run_cli("env", "--from", healthy, "--gpu", "V100 32GB", "--want", "flash-attn", "--format", "json")
    assert "env.flash_attn_unsupported" in {f["cause"] for f in json.loads(fa.stdout)["findings"] if f["severity"] == "error"}
    bad = run_cli("env", "--from", healthy, "--gpu", "Voodoo 2")
    assert bad.returncode == 2 and "unknown GPU" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.parametrize("args", [["--quick", "--deep"], ["--from", "SNAP", "--deep"], ["--from", "SNAP", "--fresh"],
                                  ["--from", "SNAP", "--python", "/usr/bin/python3"], ["--from", "SNAP", "--quick"]])
def test_option_combinations_that_mean_nothing_are_refused(args, capsys):
    from loradoctor.cli import main

    snap = str(Path(__file__).resolve().parent.parent / "fixtures" / "snapshots" / "healthy_ampere_32gb.json")
    code = main(["env", *[snap if a == "SNAP" else a for a in args]])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and err.startswith("loradoctor: error:"), err


def test_the_readme_env_row_names_every_option_of_env_help():
    # issue 12: the README's command table stays true to `loradoctor env --help` (e.g. `--gpu NAME`)
    import re

    from conftest import ROOT
    from loradoctor.cli import env_cmd

    row = next(ln for ln in (ROOT / "README.md").read_text(encoding="utf-8").splitlines() if ln.startswith("| `loradoctor env "))
    options = {a.option_strings[-1] for a in env_cmd.build_parser("env")._actions if a.option_strings and a.dest != "help"}
    missing = sorted(o for o in options if not re.search(re.escape(o) + r"(?![\w-])", row))
    assert not missing, f"README's env row does not mention {missing}"
