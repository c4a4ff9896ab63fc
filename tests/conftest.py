import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Remembered probe results and the parsed rule library (loradoctor/cache.py) go to a folder of this
# test session, never to the user's ~/.cache; children started by run_cli inherit it.
if "LORADOCTOR_CACHE_DIR" not in os.environ:
    import tempfile

    os.environ["LORADOCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="loradoctor-test-cache-")
# hypothesis keeps its example database and constants cache in ./.hypothesis by default: tests
# write only under temporary folders, never into the checkout.
if "HYPOTHESIS_STORAGE_DIRECTORY" not in os.environ:
    import tempfile

    os.environ["HYPOTHESIS_STORAGE_DIRECTORY"] = tempfile.mkdtemp(prefix="loradoctor-test-hypothesis-")
FIXTURES = ROOT / "fixtures"


def _has_cuda_gpu() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        out = subprocess.run(
            [sys.executable, "-c", "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)"],
            capture_output=True, timeout=60,
        )
    except Exception:
        return False
    return out.returncode == 0


def pytest_collection_modifyitems(config, items):
    if any("gpu" in item.keywords for item in items) and not _has_cuda_gpu():
        skip = pytest.mark.skip(reason="needs an NVIDIA GPU and a CUDA build of torch")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES


def run_cli(*args: str, input: str = None, env: dict = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run `python -m loradoctor ...` in a child, as a user would."""
    full_env = dict(os.environ)
    full_env.setdefault("NO_COLOR", "1")
    full_env["COLUMNS"] = "200"
    if env:
        full_env.update(env)
    return subprocess.run(
        [sys.executable, "-m", "loradoctor", *args],
        input=input, capture_output=True, text=True, env=full_env, timeout=timeout, cwd=str(ROOT),
    )


def explain_text(tmp_path: Path, text: str, name: str = "run.log"):
    """`loradoctor explain` (in-process) on `text` saved as a log file; the ExplainReport."""
    from loradoctor.logs.engine import explain

    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return explain([str(path)])


def describe(report, n: int = 3) -> str:
    """The top n findings of a report, readable in a failing assertion."""
    if not report.findings:
        tail = "\n".join(f"      {e.where()}: {e.text}" for e in report.unrecognised_tail[-5:])
        return "  no findings at all; last error-looking lines:\n" + (tail or "      (none)")
    out = []
    for f in report.findings[:n]:
        out.append(f"  {f.rank}. {f.cause} [{f.rule}] {f.severity}, confidence {f.confidence:.2f}, "
                   f"consequence_of={f.consequence_of}: {f.title}")
        if f.why_rank:
            out.append(f"       why: {f.why_rank}")
        for e in f.evidence[:2]:
            out.append(f"       {e.where()}: {e.text[:160]}")
    more = len(report.findings) - n
    if more > 0:
        out.append(f"  ... and {more} more")
    return "\n".join(out)


# A minimal valid user rule (`loradoctor explain --rules DIR` / `rules lint DIR` tests): fill rid and pattern.
USER_RULE = """\
rules:
  - id: {rid}
    cause: oom.capacity
    title: A test rule
    severity: error
    confidence: high
    patterns: ['{pattern}']
    summary: test
    fixes:
      - text: do something
    docs: test
"""
