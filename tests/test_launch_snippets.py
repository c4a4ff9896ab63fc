"""The launch snippets of the README and of `--help`, run as written with a training script that crashes:
explain must run on the log, and the snippet must exit with the training's own code (issue 12: with a plain
`python train.py | tee run.log || loradoctor explain ...` the status is tee's and explain never runs)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from loradoctor.cli import root_help

ROOT = Path(__file__).resolve().parent.parent
TRAIN_EXIT = 7
FAKE_TRAIN = f"""\
import sys
print("{{'loss': 1.21, 'grad_norm': 0.52, 'learning_rate': 0.0002, 'epoch': 0.1}}")
print("Traceback (most recent call last):", file=sys.stderr)
print('  File "train.py", line 88, in <module>', file=sys.stderr)
print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
      "23.55 GiB of which 1.02 GiB is free. Of the allocated memory 21.90 GiB is allocated by PyTorch, and "
      "120.00 MiB is reserved by PyTorch but unallocated.", file=sys.stderr)
sys.exit({TRAIN_EXIT})
"""
# preflight is judged by its own tests; here it says GO so that the training line runs
PREFLIGHT_GO = 'loradoctor() { if [ "$1" = preflight ]; then return 0; fi; command loradoctor "$@"; }\n'


def _readme_snippets() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    return [b for b in blocks if "tee run.log" in b]


def _help_snippets() -> list[str]:
    from loradoctor.cli.explain_cmd import EXPLAIN_HELP

    out = []
    for text, head in ((root_help(), "a launch script (bash):"), (EXPLAIN_HELP, "in a launch script")):
        lines = text.splitlines()
        start = next(i for i, line in enumerate(lines) if line.startswith(head)) + 1
        block = []
        for line in lines[start:]:
            if not line.strip():
                break
            block.append(line[2:])
        out.append("\n".join(block) + "\n")
    return out


SNIPPETS = [("README", s) for s in _readme_snippets()] + [("--help", s) for s in _help_snippets()]


def test_the_snippets_were_found():
    assert len(SNIPPETS) == 3, SNIPPETS
    assert all("pipefail" in s for _, s in SNIPPETS)


@pytest.mark.parametrize("where,snippet", SNIPPETS, ids=[f"{w}-{i}" for i, (w, _) in enumerate(SNIPPETS)])
def test_snippet_runs_explain_and_exits_with_the_trainings_code(tmp_path, where, snippet):
    (tmp_path / "train.py").write_text(FAKE_TRAIN, encoding="utf-8")
    (tmp_path / "train.yaml").write_text("base_model: meta-llama/Llama-3.1-8B\n", encoding="utf-8")
    bindir = str(Path(sys.executable).parent)  # this venv's python and loradoctor come first
    env = dict(os.environ, PATH=bindir + os.pathsep + os.environ.get("PATH", ""), NO_COLOR="1")
    res = subprocess.run(["bash", "-c", PREFLIGHT_GO + snippet], cwd=tmp_path, capture_output=True, text=True,
                         env=env, timeout=300)
    assert res.returncode == TRAIN_EXIT, (where, res.returncode, res.stdout[-2000:], res.stderr[-2000:])
    assert (tmp_path / "run.log").is_file()
    assert "Most likely: CUDA OOM" in res.stdout, (where, res.stdout[-2000:], res.stderr[-2000:])
