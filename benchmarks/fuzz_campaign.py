"""A longer fuzzing campaign against the command line, for releases (the CI suite is tests/test_fuzz_*.py).

Runs `python -m loradoctor ...` as a user would, on generated hostile inputs, and counts what went wrong:

  crash     exit code other than 0 / 1 / 2, or a Python traceback on stderr
  timeout   no answer within --timeout seconds (default 10: issue 11's bound for inputs under 1 MB)
  memory    a peak RSS above --max-rss-mb (default 500)
  planted   a payload planted in a cache folder another user could write ran (a marker file appeared)

Kinds of input: mutated real logs (fixtures/logs, fixtures/goodlogs) with hostile tokens spliced in, random
bytes, compressed and truncated logs, mutated `env --from` pastes and snapshot JSON, mutated training
configs for `estimate --config`, planted caches (a pickle that would create a marker, in a folder owned by
`nobody` or world-writable, a FIFO entry, a link to /dev/zero), and concurrent runs sharing one cache.

    python benchmarks/fuzz_campaign.py --runs 300 --seed 1 --out /tmp/fuzz-out

Every failing input is kept under --out with the command that failed (a reproducer). Prints one line per
kind and a summary; exit 1 when anything failed.
"""

from __future__ import annotations

import argparse
import bz2
import gzip
import lzma
import os
import pickle
import random
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
HOSTILE = ["9" * 5000, "1" * 4400, "1e999", "999999999999999999999.00 GiB", "-1", "nan", "inf", "\x00", "\ufffd",
           "\u202e", "\t" * 3000, " " * 20000, "{'loss': 1, " * 2000, "\\", "%s%n", "&lt;module&gt;", "\r" * 50,
           "\x1b[" * 100, "😀" * 100, "0x" + "f" * 400, "a" * 100000, "(a|a)+$", ":" * 5000, "." * 5000,
           "显存不足，" * 2000, "\u00b5" * 3000, "\u00ff" * 3000]


class Outcome:
    def __init__(self) -> None:
        self.runs = 0
        self.crash = 0
        self.timeout = 0
        self.memory = 0
        self.planted = 0
        self.peak_rss_kb = 0
        self.slowest_s = 0.0


def run_cli(args: list, env: dict, timeout_s: float, stdin: Optional[bytes] = None) -> tuple:
    """(exit code or None on timeout, stderr text, seconds, peak RSS kB of the loradoctor process)."""
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "loradoctor", *args], cwd=str(ROOT), env=env,
                            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    if stdin is not None:
        try:
            proc.stdin.write(stdin)
            proc.stdin.close()
        except OSError:
            pass
    err = b""
    code, rss_kb = None, 0
    deadline = started + timeout_s
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            code = os.waitstatus_to_exitcode(status)
            rss_kb = usage.ru_maxrss
            proc.returncode = code
            break
        if time.monotonic() > deadline:
            try:
                os.killpg(proc.pid, 9)
            except OSError:
                pass
            os.wait4(proc.pid, 0)
            proc.returncode = -9
            break
        time.sleep(0.02)
    try:
        err = proc.stderr.read(1 << 20)
    except OSError:
        pass
    return code, err.decode("utf-8", "replace"), time.monotonic() - started, rss_kb


def mutate_text(rng: random.Random, text: str) -> str:
    lines = text.splitlines() or [""]
    for _ in range(rng.randint(1, 6)):
        i = rng.randrange(len(lines))
        op = rng.random()
        if op < 0.5:
            cut = rng.randint(0, len(lines[i]))
            lines[i] = lines[i][:cut] + rng.choice(HOSTILE) + lines[i][cut:]
        elif op < 0.7:
            lines.insert(i, lines[i] * rng.randint(2, 50))
        elif op < 0.85:
            del lines[i]
            lines = lines or [""]
        else:
            lines[i] = "".join(chr(rng.randint(0, 0x2FFF)) for _ in range(rng.randint(1, 200)))
    return "\n".join(lines)


def log_input(rng: random.Random, folder: Path, sources: list) -> Path:
    kind = rng.random()
    if kind < 0.1:
        data = os.urandom(rng.randint(0, 200000))
    else:
        base = rng.choice(sources).read_text(encoding="utf-8", errors="replace")
        data = mutate_text(rng, base).encode("utf-8", "surrogatepass")
    suffix = rng.choice(["", "", ".gz", ".bz2", ".xz"])
    packed = {"": lambda b: b, ".gz": gzip.compress, ".bz2": bz2.compress, ".xz": lzma.compress}[suffix](data)
    if suffix and rng.random() < 0.2:
        packed = packed[: rng.randint(0, len(packed))]
    path = folder / f"run.log{suffix}"
    path.write_bytes(packed)
    return path


def keep(out: Optional[Path], what: str, args: list, files: list, why: str) -> None:
    if out is None:
        return
    case = out / f"{what}-{len(list(out.glob(what + '-*')))}"
    case.mkdir(parents=True, exist_ok=True)
    for f in files:
        if Path(f).exists():
            shutil.copy(f, case / Path(f).name)
    (case / "README.txt").write_text(f"{why}\nloradoctor {' '.join(map(str, args))}\n", encoding="utf-8")


def judge(o: Outcome, result: tuple, timeout_s: float, max_rss_kb: int, out: Optional[Path], what: str,
          args: list, files: list) -> None:
    code, err, elapsed, rss = result
    o.runs += 1
    o.peak_rss_kb = max(o.peak_rss_kb, rss)
    o.slowest_s = max(o.slowest_s, elapsed)
    if code is None:
        o.timeout += 1
        keep(out, what, args, files, f"timeout after {timeout_s} s")
    elif code not in (0, 1, 2) or "Traceback (most recent call last)" in err:
        o.crash += 1
        keep(out, what, args, files, f"exit {code}\n{err[-4000:]}")
    elif rss > max_rss_kb:
        o.memory += 1
        keep(out, what, args, files, f"peak RSS {rss} kB")


def planted_cache(work: Path, env: dict, log: Path, timeout_s: float, o: Outcome) -> None:
    """A pickle that creates a marker, a FIFO, a link to /dev/zero: in a folder owned by nobody, a
    world-writable folder, and our own folder (entries only)."""
    marker = work / "marker"

    class Payload:
        def __reduce__(self):
            return (exec, (f"open({str(marker)!r}, 'w').write('pwned')",))

    for setup in ("nobody", "world", "fifo", "zero"):
        cache = work / f"cache-{setup}"
        shutil.rmtree(cache, ignore_errors=True)
        e = dict(env, LORADOCTOR_CACHE_DIR=str(cache))
        e.pop("LORADOCTOR_NO_CACHE", None)
        run_cli(["explain", str(log)], e, 60)  # fills it
        for entry in list(cache.iterdir()) if cache.is_dir() else []:
            entry.unlink()
            if setup in ("nobody", "world"):
                entry.write_bytes(pickle.dumps(Payload()))
            elif setup == "fifo":
                os.mkfifo(entry)
            else:
                entry.symlink_to("/dev/zero")
        try:
            if setup == "nobody":
                for p in [cache, *cache.iterdir()]:
                    os.chown(p, 65534, 65534)
            elif setup == "world":
                os.chmod(cache, 0o777)
        except OSError:
            continue
        result = run_cli(["explain", str(log)], e, timeout_s)
        judge(o, result, timeout_s, 1 << 40, None, "cache", ["explain", str(log)], [])
        if marker.exists():
            o.planted += 1
            marker.unlink()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=200, help="generated inputs per kind (default 200)")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--timeout", type=float, default=10.0)
    ap.add_argument("--max-rss-mb", type=int, default=500)
    ap.add_argument("--jobs", type=int, default=2, help="runs at once (default 2)")
    ap.add_argument("--concurrent", type=int, default=8, help="explain runs started together on one cache (default 8)")
    ap.add_argument("--out", type=Path, help="keep failing inputs (reproducers) here")
    opts = ap.parse_args()
    seed = opts.seed if opts.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    max_rss_kb = opts.max_rss_mb * 1024
    work = Path(tempfile.mkdtemp(prefix="loradoctor-fuzz-"))
    env = dict(os.environ, NO_COLOR="1", LORADOCTOR_CACHE_DIR=str(work / "cache"))
    logs = sorted(p for p in (FIXTURES / "logs").rglob("*") if p.is_file()) + \
        sorted(p for p in (FIXTURES / "goodlogs").rglob("*") if p.is_file())
    pastes = sorted((FIXTURES / "env").glob("*.txt")) + sorted((FIXTURES / "snapshots").glob("*.json"))
    configs = sorted(p for p in (FIXTURES / "configs").rglob("*") if p.suffix in (".yaml", ".yml", ".json"))
    results: dict = {k: Outcome() for k in ("explain", "env --from", "estimate --config", "cache", "concurrent")}
    print(f"seed {seed}, {opts.runs} runs per kind, timeout {opts.timeout:g} s, work folder {work}")
    started = time.monotonic()
    try:
        def one_explain(i: int) -> None:
            case = work / f"explain-{i}"
            case.mkdir()
            path = log_input(random.Random(rng.random()), case, logs)
            args = ["explain", str(path), "--format", "json"]
            judge(results["explain"], run_cli(args, env, opts.timeout), opts.timeout, max_rss_kb, opts.out,
                  "explain", args, [path])
            shutil.rmtree(case, ignore_errors=True)

        def one_env(i: int) -> None:
            r = random.Random(rng.random())
            case = work / f"env-{i}"
            case.mkdir()
            base = r.choice(pastes)
            path = case / base.name
            path.write_text(mutate_text(r, base.read_text(encoding="utf-8")), encoding="utf-8", errors="surrogatepass")
            args = ["env", "--from", str(path), "--format", r.choice(["text", "json", "md"])]
            judge(results["env --from"], run_cli(args, env, opts.timeout), opts.timeout, max_rss_kb, opts.out,
                  "env", args, [path])
            shutil.rmtree(case, ignore_errors=True)

        def one_config(i: int) -> None:
            r = random.Random(rng.random())
            case = work / f"cfg-{i}"
            case.mkdir()
            base = r.choice(configs)
            path = case / base.name
            path.write_text(mutate_text(r, base.read_text(encoding="utf-8")), encoding="utf-8", errors="surrogatepass")
            args = ["estimate", "--config", str(path), "--gpu", "A100 80GB"]
            judge(results["estimate --config"], run_cli(args, env, opts.timeout), opts.timeout, max_rss_kb,
                  opts.out, "estimate", args, [path])
            shutil.rmtree(case, ignore_errors=True)

        for name, fn, n in (("explain", one_explain, opts.runs), ("env --from", one_env, opts.runs),
                            ("estimate --config", one_config, opts.runs if configs else 0)):
            with ThreadPoolExecutor(max_workers=opts.jobs) as pool:
                list(pool.map(fn, range(n)))
            o = results[name]
            print(f"{name:18s} runs {o.runs:5d}  crashes {o.crash:4d}  timeouts {o.timeout:4d}  memory {o.memory:4d}  "
                  f"peak RSS {o.peak_rss_kb / 1024:7.1f} MB  slowest {o.slowest_s:6.2f} s")

        log = work / "oom.log"
        log.write_text("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
                       "23.64 GiB of which 1.19 GiB is free.\n")
        planted_cache(work, env, log, opts.timeout, results["cache"])
        o = results["cache"]
        print(f"{'cache':18s} runs {o.runs:5d}  crashes {o.crash:4d}  timeouts {o.timeout:4d}  planted code ran {o.planted}")

        shared = dict(env, LORADOCTOR_CACHE_DIR=str(work / "shared-cache"))
        with ThreadPoolExecutor(max_workers=opts.concurrent) as pool:
            outs = list(pool.map(lambda _: run_cli(["explain", str(log)], shared, max(opts.timeout, 60)),
                                 range(opts.concurrent)))
        for res in outs:
            judge(results["concurrent"], res, opts.timeout, max_rss_kb, None, "concurrent", [], [])
        o = results["concurrent"]
        print(f"{'concurrent':18s} runs {o.runs:5d}  crashes {o.crash:4d}  timeouts {o.timeout:4d}  "
              f"peak RSS {o.peak_rss_kb / 1024:7.1f} MB")
    finally:
        for p in work.rglob("*"):
            try:
                if p.is_dir() and not p.is_symlink():
                    os.chmod(p, 0o700)
            except OSError:
                pass
        shutil.rmtree(work, ignore_errors=True)
    bad = sum(o.crash + o.timeout + o.memory + o.planted for o in results.values())
    print(f"total: {sum(o.runs for o in results.values())} runs, {bad} failures, {time.monotonic() - started:.0f} s"
          + (f"; reproducers in {opts.out}" if bad and opts.out else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
