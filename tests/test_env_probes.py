"""Probes against a real child process: fake torch packages that fail, crash or hang must become
`env.torch_broken` findings within the timeout, and the rest of the report must still arrive."""

import json
import time
from pathlib import Path

import pytest

from conftest import run_cli
from loradoctor.env.probes import child, envvars, system
from loradoctor.env.probes.nvidia import throttle_names

FAKE_TORCH = {
    "import_error": 'raise ImportError("libcudnn.so.9: cannot open shared object file: No such file or directory")\n',
    "segfault": "import ctypes\nctypes.string_at(0)\n",
    "abort": "import os\nos.abort()\n",
    "hang": "import time\ntime.sleep(3600)\n",
}


def _fake_torch(tmp_path: Path, body: str) -> Path:
    pkg = tmp_path / "torch"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(body)
    return tmp_path


@pytest.mark.parametrize("kind", sorted(FAKE_TORCH))
def test_broken_torch_becomes_a_finding_within_the_timeout(tmp_path, kind):
    path = _fake_torch(tmp_path, FAKE_TORCH[kind])
    started = time.monotonic()
    res = run_cli("env", "--format", "json", "--timeout", "4", env={"PYTHONPATH": str(path)}, timeout=60)
    elapsed = time.monotonic() - started
    assert res.returncode == 1, res.stderr
    assert elapsed < 20, f"took {elapsed:.1f} s with a 4 s timeout"
    doc = json.loads(res.stdout)
    assert doc["schema"] == "loradoctor.env/1"
    broken = [f for f in doc["findings"] if f["cause"] == "env.torch_broken"]
    assert len(broken) == 1 and broken[0]["severity"] == "error"
    probe = doc["snapshot"]["torch"]["probe"]
    expected_status = {"import_error": "failed", "segfault": "crashed", "abort": "crashed", "hang": "timeout"}[kind]
    assert probe["status"] == expected_status
    assert doc["snapshot"]["torch"]["error"].startswith("could not check:")
    # the other probes still ran
    assert "error" not in doc["snapshot"]["system"]
    assert isinstance(doc["snapshot"]["packages"], dict)
    if kind == "import_error":
        assert any("libcudnn.so.9" in e["text"] for e in broken[0]["evidence"])
    if kind == "segfault":
        assert "SIGSEGV" in probe["reason"]
    if kind == "abort":
        assert "SIGABRT" in probe["reason"]


def test_broken_torch_text_report_names_the_problem(tmp_path):
    path = _fake_torch(tmp_path, FAKE_TORCH["import_error"])
    res = run_cli("env", "--timeout", "10", env={"PYTHONPATH": str(path)}, timeout=60)
    assert res.returncode == 1
    first = res.stdout.splitlines()[0]
    assert first.startswith("1 error") and "import" in first
    assert "env.torch_broken" in res.stdout
    assert "fix 1" in res.stdout


def test_child_probe_without_torch_reports_missing_not_broken():
    # -S: no site-packages, so this interpreter has no torch at all (like CI without torch)
    res = child.ChildProbe("child_torch.py", [], 30, python_flags=["-S"]).result()
    assert res["installed"] is False
    assert res["probe"]["status"] == "missing"
    assert "error" not in res


def test_child_probe_times_out_and_kills_the_child(tmp_path):
    script_dir = _fake_torch(tmp_path, FAKE_TORCH["hang"])
    import os

    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(script_dir)
    try:
        started = time.monotonic()
        probe = child.ChildProbe("child_torch.py", [], 1.5)
        res = probe.result()
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH")
        else:
            os.environ["PYTHONPATH"] = old
    assert time.monotonic() - started < 10
    assert res["probe"]["status"] == "timeout"
    assert probe.proc.poll() is not None  # killed, not left behind


def test_interpret_keeps_the_last_record_and_classifies():
    out = 'noise\nLORADOCTOR_PROBE {"stage": "found", "installed": true}\nLORADOCTOR_PROBE {"stage": "imported", "version": "2.5.1"}\n'
    res = child.interpret(out, "Fatal Python error: Segmentation fault\n", -11, False, 30, 1.0)
    assert res["version"] == "2.5.1" and res["installed"] is True
    assert res["probe"]["status"] == "crashed" and "SIGSEGV" in res["probe"]["reason"]
    ok = child.interpret('LORADOCTOR_PROBE {"stage": "done", "installed": true, "version": "2.5.1"}\n', "", 0, False, 30, 1.0)
    assert ok["probe"]["status"] == "ok" and "error" not in ok
    failed = child.interpret('LORADOCTOR_PROBE {"stage": "found", "installed": true}\n',
                             "Traceback (most recent call last):\n  File \"x\", line 1\nOSError: libtorch_cuda.so: undefined symbol: foo\n",
                             1, False, 30, 1.0)
    assert failed["probe"]["status"] == "failed" and "undefined symbol" in failed["probe"]["reason"]


def test_live_env_runs_cleanly_on_this_machine():
    # This machine (and CI) has no NVIDIA driver; torch may be a CPU build or absent. Neither is an error.
    res = run_cli("env", "--format", "json", timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    doc = json.loads(res.stdout)
    snap = doc["snapshot"]
    assert snap["schema"] == "loradoctor.snapshot/1"
    assert not [f for f in doc["findings"] if f["severity"] == "error"]
    if not snap["nvidia"].get("gpus"):
        assert snap["nvidia"]["error"].startswith("could not check:")
    assert snap["system"]["ram_total_bytes"] > 0
    assert snap["torch"]["installed"] in (True, False)


def test_env_vars_probe_never_stores_secrets():
    env = {"HF_TOKEN": "hf_abc", "WANDB_API_KEY": "k", "NCCL_DEBUG": "INFO", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
           "AWS_SECRET_ACCESS_KEY": "s", "NCCL_SOCKET_PASSWORD": "p", "CUDA_VISIBLE_DEVICES": "0", "HOME": "/root"}
    out = envvars.probe(env)
    assert out == {"CUDA_VISIBLE_DEVICES": "0", "NCCL_DEBUG": "INFO", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


def test_ld_library_path_scan_finds_shadowing_cuda_libs(tmp_path):
    (tmp_path / "cuda").mkdir()
    (tmp_path / "cuda" / "libcudnn.so.8").write_text("")
    (tmp_path / "cuda" / "libfoo.so").write_text("")
    (tmp_path / "other").mkdir()
    found = system.ld_library_path_cuda_dirs(f"{tmp_path / 'cuda'}:{tmp_path / 'other'}:/does/not/exist")
    assert found == [{"dir": str(tmp_path / "cuda"), "libs": ["libcudnn.so.8"]}]


def test_throttle_bits_decode():
    assert throttle_names(0x1) == ["gpu_idle"]
    assert throttle_names(0x4 | 0x40) == ["sw_power_cap", "hw_thermal_slowdown"]


def test_quick_mode_skips_extension_probes():
    from loradoctor.env import collect_snapshot

    snap = collect_snapshot(quick=True, timeout_s=60)
    assert snap["meta"]["quick"] is True
    for key in ("bitsandbytes", "flash_attn"):  # not installed here: nothing to skip; installed: skipped, not probed
        assert snap[key] == {"installed": False} or snap[key]["error"] == "could not check: skipped in quick mode"
    assert "probe" in snap["torch"]


def test_env_on_an_interpreter_without_torch(tmp_path):
    # A bare venv (no site-packages of ours): no torch, no driver here. That is not an error, but the report
    # leads with a warning that GPU fine-tuning is not possible here (issue 12).
    import subprocess
    import sys as _sys

    subprocess.run([_sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True, timeout=120)
    py = tmp_path / "venv" / "bin" / "python"
    res = run_cli("env", "--python", str(py), "--format", "json", timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    doc = json.loads(res.stdout)
    snap = doc["snapshot"]
    assert snap["torch"]["installed"] is False and snap["torch"]["probe"]["status"] == "missing"
    assert "torch" not in snap["packages"]
    assert snap["system"]["python_executable"] == str(py)
    assert snap["bitsandbytes"]["installed"] is False and snap["flash_attn"]["installed"] is False
    # (env.host speaks of this machine's free disk and RAM, not of the interpreter: a full /tmp warns too)
    assert [(f["rule"], f["severity"]) for f in doc["findings"]
            if f["severity"] != "info" and f["rule"] != "env.host"] == [("env.gpu_training", "warning")]


def test_bad_python_option_exits_2(tmp_path):
    res = run_cli("env", "--python", str(tmp_path / "nope"))
    assert res.returncode == 2 and "not an executable interpreter" in res.stderr


def _fake_dist(root: Path, dist: str, module: str, version: str, body: str) -> None:
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (root / module).mkdir()
    (root / module / "__init__.py").write_text(body)


def test_broken_extensions_become_findings(tmp_path):
    _fake_dist(tmp_path, "bitsandbytes", "bitsandbytes", "0.45.0",
               "from triton.ops.matmul_perf_model import early_config_prune\n")
    # flash_attn itself imports, its compiled extension does not exist: the ABI-mismatch shape
    _fake_dist(tmp_path, "flash-attn", "flash_attn", "2.6.3", "__version__ = '2.6.3'\n")
    res = run_cli("env", "--format", "json", "--timeout", "60", env={"PYTHONPATH": str(tmp_path)}, timeout=120)
    assert res.returncode == 1, res.stdout + res.stderr
    doc = json.loads(res.stdout)
    by_cause = {f["cause"]: f for f in doc["findings"]}
    assert by_cause["env.bnb_broken"]["severity"] == "error"
    assert "triton" in by_cause["env.bnb_broken"]["title"]
    assert by_cause["env.flash_attn_broken"]["severity"] == "error"
    assert "flash_attn_2_cuda" in by_cause["env.flash_attn_broken"]["title"]
    assert doc["snapshot"]["packages"]["bitsandbytes"] == "0.45.0"
    assert doc["snapshot"]["flash_attn"]["probe"]["status"] == "failed"
