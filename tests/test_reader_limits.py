"""Input limits of the reader (issue 11, item 9): a decompressed-size limit with a clear message and a
flag to raise it, a corrupt compressed file in one line, and a folder that reports what it could not
read and reads the rest."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import pytest

from conftest import run_cli
from loradoctor.errors import UserError
from loradoctor.logs import reader

OOM = b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.64 GiB of which 1.19 GiB is free.\n"
METRIC = b"{'loss': 0.4213, 'grad_norm': 1.234, 'learning_rate': 0.0002, 'epoch': 0.12}\n"


def _corrupt_gzip(path: Path) -> Path:
    data = gzip.compress(b"RuntimeError: CUDA error: out of memory\n" * 1000)
    path.write_bytes(data[:20] + bytes(b ^ 0xFF for b in data[20:60]) + data[60:])
    return path


def _read_all(item: reader.Input) -> int:
    return sum(len(b) for b in reader.iter_blocks(item))


def test_corrupt_gzip_is_one_line_exit_2(tmp_path):
    res = run_cli("explain", str(_corrupt_gzip(tmp_path / "run.log.gz")))
    assert res.returncode == 2
    assert "Traceback" not in res.stderr
    assert res.stderr.strip().count("\n") == 0 and "corrupt" in res.stderr


def test_gzip_bomb_is_refused_with_a_clear_message(tmp_path, monkeypatch):
    monkeypatch.setattr(reader, "BOMB_FLOOR_BYTES", 1 << 20)
    bomb = tmp_path / "bomb.log.gz"
    bomb.write_bytes(gzip.compress(METRIC * 200_000, 9))  # 16 MB from about 50 kB
    [item] = reader.resolve_inputs([str(bomb)])
    with pytest.raises(UserError, match=r"more than 100 times its size.*--max-decompressed"):
        _read_all(item)
    reader.set_decompressed_limit(0)  # the flag lifts it
    try:
        [item] = reader.resolve_inputs([str(bomb)])
        assert _read_all(item) == len(METRIC) * 200_000
    finally:
        reader.set_decompressed_limit(None)


def test_max_decompressed_flag_sets_the_limit(tmp_path):
    log = tmp_path / "run.log.gz"
    log.write_bytes(gzip.compress(METRIC * 40_000 + OOM))  # 3 MB
    res = run_cli("explain", str(log), "--max-decompressed", "1MiB")
    assert res.returncode == 2 and "decompresses to more than 1.00 MiB" in res.stderr
    assert "Traceback" not in res.stderr
    res = run_cli("explain", str(log), "--max-decompressed", "8MiB")
    assert res.returncode == 0, res.stderr
    res = run_cli("explain", str(log), "--max-decompressed", "lots")
    assert res.returncode == 2 and "--max-decompressed" in res.stderr


def test_a_plain_log_is_not_limited(tmp_path, monkeypatch):
    monkeypatch.setattr(reader, "_limits", {"max": 1 << 20, "ratio": True})
    log = tmp_path / "run.log"
    log.write_bytes(METRIC * 40_000)
    [item] = reader.resolve_inputs([str(log)])
    assert _read_all(item) == len(METRIC) * 40_000


def test_folder_with_one_unreadable_file_reads_the_rest(tmp_path):
    folder = tmp_path / "logs"
    folder.mkdir()
    (folder / "rank0.log").write_bytes(OOM)
    _corrupt_gzip(folder / "rank1.log.gz")
    res = run_cli("explain", str(folder), "--format", "json")
    assert res.returncode == 0, res.stderr
    assert "rank1.log.gz" in res.stderr and "skipped" in res.stderr
    assert "oom" in res.stdout


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root reads a chmod 000 file anyway")
def test_folder_with_one_file_without_permission(tmp_path):
    folder = tmp_path / "logs"
    folder.mkdir()
    (folder / "rank0.log").write_bytes(OOM)
    locked = folder / "rank1.log"
    locked.write_bytes(OOM)
    locked.chmod(0)
    res = run_cli("explain", str(folder))
    assert res.returncode == 0 and "rank1.log: permission denied" in res.stderr


def test_unreadable_subfolder_is_reported(tmp_path, monkeypatch):
    folder = tmp_path / "logs"
    (folder / "node1").mkdir(parents=True)
    (folder / "rank0.log").write_bytes(OOM)
    (folder / "node1" / "rank1.log").write_bytes(OOM)
    real_scandir = os.scandir

    def scandir(path="."):
        if str(path).endswith("node1"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    from loradoctor import notes

    notes.take()
    inputs = reader.resolve_inputs([str(folder)])
    assert [Path(i.path).name for i in inputs] == ["rank0.log"]
    assert any("node1: folder not read (Permission denied)" in text for level, text in notes.take())


def test_folder_with_nothing_readable_says_so(tmp_path):
    folder = tmp_path / "logs"
    folder.mkdir()
    _corrupt_gzip(folder / "rank1.log.gz")
    res = run_cli("explain", str(folder))
    assert res.returncode == 2 and "no readable log files (1 could not be read)" in res.stderr
