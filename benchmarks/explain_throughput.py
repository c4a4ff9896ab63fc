"""Throughput of `loradoctor explain` on a big training log, against `grep -E -c` with the rules' patterns.

    python benchmarks/explain_throughput.py                 # 1 GB log (generated once, then reused)
    python benchmarks/explain_throughput.py --size 200MB
    python benchmarks/explain_throughput.py --size 200MB --profile   # + where loradoctor spends its time

The log is written to benchmarks/out/ (git-ignored): Trainer dict lines, tqdm bars with `\\r`
redraws, eval records, harmless warnings, NCCL INFO lines, and a CUDA OOM traceback near the end.
loradoctor runs as a child process, as a user runs it (`explain FILE --format json`); its peak RSS
comes from os.wait4 on that child. grep runs once with the union of every rule pattern that GNU
`grep -E` can express (`-f` with one pattern per line); the script says which patterns it
translated and which it skipped. Both run with LC_ALL=C, page cache warm, best of --runs (3) runs;
the ratio is by CPU time (user+sys of the child, steadier than wall time on a shared machine) and
wall time is printed too. Targets (issue 10): within 1.5x of grep, peak RSS under 100 MB, OOM found.
loradoctor runs with bytecode as an installed package has it: PYTHONDONTWRITEBYTECODE (set in some
shells) is unset for the child and its bytecode goes to a folder of this run (PYTHONPYCACHEPREFIX),
written by a warm-up run; otherwise every run would include compiling the sources (~0.2 s CPU).
The load average is printed with the figures (a busy machine slows both sides unevenly).
Nothing here is asserted in the test suite (timings vary by machine).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "benchmarks" / "out"
GENERATOR_VERSION = 3  # 3: the bar total fits the log (v2 ran past 100% with negative ETAs)
TARGET_RATIO = 1.5
TARGET_RSS_BYTES = 100 * 1000 * 1000

sys.path.insert(0, str(ROOT))


# ---------------------------------------------------------------------------------------------- the log


def _bar(n: int, total: int, s_per_it: float) -> str:
    frac = n / total
    full = int(frac * 10)
    cells = "█" * full + ("▌" if full < 10 and frac * 10 - full >= 0.5 else " " if full < 10 else "")
    cells = cells.ljust(10)
    el, rem = int(n * s_per_it), int((total - n) * s_per_it)
    return (f"{int(frac * 100):3d}%|{cells}| {n}/{total} "
            f"[{el // 3600}:{el // 60 % 60:02d}:{el % 60:02d}<{rem // 3600}:{rem // 60 % 60:02d}:{rem % 60:02d}, "
            f"{s_per_it:.2f}s/it]")


_WARNINGS = [
    "`use_cache=True` is incompatible with gradient checkpointing. Setting `use_cache=False`.",
    "/opt/venv/lib/python3.11/site-packages/torch/utils/checkpoint.py:86: UserWarning: torch.utils.checkpoint: "
    "the use_reentrant parameter should be passed explicitly. In version 2.5 we will raise an exception if "
    "use_reentrant is not passed. use_reentrant=False is recommended, but if you need to preserve the current "
    "default behavior, you can pass use_reentrant=True. Refer to docs for more details on the differences between "
    "the two variants.\n  return fn(*args, **kwargs)",
    "/opt/venv/lib/python3.11/site-packages/transformers/trainer.py:3801: FutureWarning: `Trainer.tokenizer` is now "
    "deprecated. You should use `Trainer.processing_class = processing_class` instead.",
    "gpu-node03:41207:41890 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via P2P/CUMEM",
    "gpu-node03:41207:41890 [0] NCCL INFO Connected all rings, use ring PXN 0 GDR 0",
    "wandb: WARNING Step must only increase in log calls.  Step 1210 < 1211; dropping {'train/loss': 1.02}.",
    "[2026-03-04 11:02:31,553] [INFO] [axolotl.callbacks.on_step_end:131] [PID:991] [RANK:0] cuda memory usage "
    "while training: 9.871GB (+2.410GB cache, +0.474GB misc)",
]

_OOM_TAIL = """Traceback (most recent call last):
  File "/home/ml/ft/train.py", line 212, in <module>
    trainer.train()
  File "/opt/venv/lib/python3.11/site-packages/transformers/trainer.py", line 2245, in train
    return inner_training_loop(
  File "/opt/venv/lib/python3.11/site-packages/transformers/trainer.py", line 2560, in _inner_training_loop
    tr_loss_step = self.training_step(model, inputs, num_items_in_batch)
  File "/opt/venv/lib/python3.11/site-packages/transformers/trainer.py", line 3782, in training_step
    self.accelerator.backward(loss, **kwargs)
  File "/opt/venv/lib/python3.11/site-packages/accelerate/accelerator.py", line 2454, in backward
    loss.backward(**kwargs)
  File "/opt/venv/lib/python3.11/site-packages/torch/_tensor.py", line 626, in backward
    torch.autograd.backward(
  File "/opt/venv/lib/python3.11/site-packages/torch/autograd/__init__.py", line 347, in backward
    _engine_run_backward(
  File "/opt/venv/lib/python3.11/site-packages/torch/autograd/graph.py", line 823, in _engine_run_backward
    return Variable._execution_engine.run_backward(  # Calls into the C++ engine to run the backward pass
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.96 GiB. GPU 0 has a total capacity of 23.54 GiB of which 1.12 GiB is free. Including non-PyTorch memory, this process has 22.41 GiB memory in use. Of the allocated memory 21.87 GiB is allocated by PyTorch, and 88.35 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)
"""


def _steps_block(rng: random.Random, first_step: int, n_steps: int, total: int, redraws_per_step: int) -> str:
    """Text for n_steps training steps: bar redraws glued with \\r, a log dict every 10 steps."""
    out: list[str] = []
    line: list[str] = []
    for step in range(first_step, first_step + n_steps):
        for _ in range(redraws_per_step):
            line.append(_bar(step, total, 2.0 + rng.random()))
        if step % 10 == 0:
            t = min(1.0, step / total)
            loss = 0.9 + 1.3 * (1 - t) ** 2 + rng.uniform(-0.06, 0.06)
            out.append("\r".join(line))
            out.append("\n" + str({"loss": round(loss, 4), "grad_norm": round(rng.uniform(0.2, 0.9), 6),
                                   "learning_rate": 2e-4 * (1 - t), "epoch": round(3 * t, 2)}) + "\n")
            line = [_bar(step, total, 2.2)]
        if step % 500 == 0:
            out.append("\r".join(line) + "\n" + str({"eval_loss": round(1.0 + rng.random() / 3, 4),
                       "eval_runtime": 41.2, "eval_samples_per_second": 24.3, "eval_steps_per_second": 3.04,
                       "epoch": round(3 * step / total, 2)}) + "\n")
            line = [_bar(step, total, 2.2)]
        if rng.random() < 0.02:
            out.append("\r".join(line) + "\n" + rng.choice(_WARNINGS) + "\n")
            line = [_bar(step, total, 2.2)]
    out.append("\r".join(line))
    return "".join(out)


def parse_size(text: str) -> int:
    from loradoctor.units import parse_size as parse

    return parse(text)


def make_log(size_bytes: int, out_dir: Path) -> Path:
    """Write (or reuse) a synthetic training log of about size_bytes, ending in a CUDA OOM."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"train-{size_bytes}-v{GENERATOR_VERSION}.log"
    if path.exists() and path.stat().st_size >= size_bytes:
        return path
    rng = random.Random(1234)
    steps_per_block = 2000
    # size the run so that the bar ends near 100% at the end of the file, as a real run does
    trial = len(_steps_block(random.Random(1), 1, steps_per_block, 10 ** 6, redraws_per_step=3).encode())
    total_steps = max(steps_per_block, int(size_bytes / (trial / steps_per_block)))
    head = (
        "Loading checkpoint shards: 100%|██████████| 4/4 [00:07<00:00,  1.81s/it]\n"
        "trainable params: 41,943,040 || all params: 8,072,204,288 || trainable%: 0.5196\n"
    ).encode()
    tail = ("\n" + _OOM_TAIL).encode()
    tmp = path.with_suffix(".tmp")
    written = 0
    with open(tmp, "wb") as fh:
        fh.write(head)
        written += len(head)
        step = 1
        while written + len(tail) < size_bytes:
            block = _steps_block(rng, step, steps_per_block, total_steps, redraws_per_step=3).encode()
            fh.write(block)
            written += len(block)
            step += steps_per_block
        fh.write(tail)
    tmp.replace(path)
    return path


# ---------------------------------------------------------------------------------------------- grep


def to_ere(pattern: str) -> tuple[Optional[str], str]:
    """Translate a Python (`regex`) pattern to GNU `grep -E`. Returns (ere or None, note)."""
    for marker, why in (("(?=", "lookahead"), ("(?!", "negative lookahead"), ("(?<=", "lookbehind"),
                        ("(?<!", "negative lookbehind"), ("(?>", "atomic group"), ("\\p{", "unicode property"),
                        ("\\P{", "unicode property")):
        if marker in pattern:
            return None, why
    out: list[str] = []
    notes: set[str] = set()
    ignore_case = pattern.startswith("(?i)")
    if ignore_case:  # a leading (?i): spell each letter as [aA]
        if "[" in pattern.replace("\\[", ""):
            return None, "(?i) with a bracket class"
        pattern = pattern[4:]
        notes.add("(?i) as [aA] classes")
    i, n, in_class = 0, len(pattern), False
    while i < n:
        c = pattern[i]
        if c == "\\" and i + 1 < n:
            d = pattern[i + 1]
            i += 2
            if d == "d":
                out.append("0-9" if in_class else "[0-9]")
                notes.add("\\d")
            elif d == "D":
                if in_class:
                    return None, "\\D in a class"
                out.append("[^0-9]")
            elif d in "sSwW" and in_class:
                out.append({"s": "[:space:]", "w": "[:alnum:]_"}.get(d) or "")
                if d in "SW":
                    return None, f"\\{d} in a class"
            elif d in "sSwWbB":
                out.append("\\" + d)  # GNU extensions grep -E understands
            elif d == "t":
                out.append("\t")
            elif d == "A":
                out.append("^")
            elif d in "Zz":
                out.append("$")
            elif d == "x" and i + 2 <= n:
                out.append(chr(int(pattern[i:i + 2], 16)))
                i += 2
            elif d.isalnum():
                return None, f"escape \\{d}"
            elif in_class:
                out.append("\\\\" if d == "\\" else d)
            else:
                out.append("\\" + d)  # an escaped metacharacter: \. \( \[ \| ...
            continue
        if in_class:
            if c == "]" and out[-1] not in ("[", "^"):
                in_class = False
            out.append(c)
            i += 1
            continue
        if c == "[":
            in_class = True
            out.append(c)
            i += 1
            if i < n and pattern[i] == "^":
                out.append("^")
                i += 1
            if i < n and pattern[i] == "]":
                out.append("]")
                i += 1
            continue
        if c == "(" and pattern.startswith("(?", i):
            if pattern.startswith("(?:", i):
                out.append("(")
                i += 3
                notes.add("(?:")
                continue
            if pattern.startswith("(?P<", i):
                j = pattern.index(">", i)
                out.append("(")
                i = j + 1
                notes.add("named group")
                continue
            return None, "inline flags or other (?...) syntax"
        if c in "*+?}" and i + 1 < n and pattern[i + 1] in "?+":
            out.append(c)  # lazy/possessive quantifier: same lines match
            i += 2
            notes.add("lazy quantifier")
            continue
        out.append(f"[{c.lower()}{c.upper()}]" if ignore_case and c.isascii() and c.isalpha() else c)
        i += 1
    return "".join(out), ", ".join(sorted(notes)) or "as is"


def grep_patterns(rules: list) -> tuple[list[str], list[tuple[str, str]], list[tuple[str, str, str]]]:
    """(ERE patterns, skipped (rule id, why), translated (rule id, original, note))."""
    eres: list[str] = []
    skipped: list[tuple[str, str]] = []
    translated: list[tuple[str, str, str]] = []
    for rule in rules:
        for pattern in list(getattr(rule, "patterns", []) or []):
            ere, note = to_ere(pattern)
            if ere is None:
                skipped.append((rule.id, note))
                continue
            check = subprocess.run(["grep", "-E", "-c", "-e", ere, "/dev/null"], capture_output=True, text=True)
            if check.returncode == 2:  # grep rejects it
                skipped.append((rule.id, "grep -E rejects: " + check.stderr.strip().splitlines()[-1][:80]))
                continue
            if note != "as is":
                translated.append((rule.id, pattern, note))
            eres.append(ere)
    return eres, skipped, translated


# ---------------------------------------------------------------------------------------------- timing


def best_of(runs: int, cmd: list[str], stdout_path: Path, env: dict) -> tuple[float, int, int, float, list[float]]:
    """Run cmd `runs` times; (best wall s, exit code, peak RSS, best CPU s, every CPU s). Best of N,
    because other work on a shared machine only ever adds time."""
    results = [run_child(cmd, stdout_path, env) for _ in range(runs)]
    return (min(r[0] for r in results), results[-1][1], max(r[2] for r in results), min(r[3] for r in results),
            [r[3] for r in results])


# A child's ru_maxrss counts the memory it had at fork, before exec: forked from this process (which
# has loaded the rules, ~85 MB) every child, grep included, "peaked" at least that high. The children
# are therefore started by a small launcher process, whose own ~10 MB is the floor.
_LAUNCHER = ("import json, os, subprocess, sys, time\n"
             "start = time.perf_counter()\n"
             "proc = subprocess.Popen(sys.argv[2:])\n"
             "_, status, usage = os.wait4(proc.pid, 0)\n"
             "with open(sys.argv[1], 'w') as fh:\n"
             "    json.dump([time.perf_counter() - start, os.waitstatus_to_exitcode(status), usage.ru_maxrss,\n"
             "               usage.ru_utime + usage.ru_stime], fh)\n")


def run_child(cmd: list[str], stdout_path: Path, env: Optional[dict] = None) -> tuple[float, int, int, float]:
    """Run cmd; return (wall s, exit code, peak RSS bytes, CPU s (user + sys)) of that child, from wait4
    in a launcher process (see _LAUNCHER)."""
    result_path = stdout_path.with_suffix(".usage.json")
    with open(stdout_path, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", _LAUNCHER, str(result_path), *cmd], stdout=out,
                                stderr=subprocess.PIPE, env=env, cwd=str(ROOT))
        _, err_bytes = proc.communicate()
    wall_s, returncode, maxrss_kib, cpu_s = json.loads(result_path.read_text(encoding="utf-8"))
    err = err_bytes.decode(errors="replace") if err_bytes else ""
    if returncode not in (0, 1):
        print(f"  {cmd[0]} ... exited {returncode}: {err.strip()[-800:]}")
    return wall_s, returncode, maxrss_kib * 1024, cpu_s  # ru_maxrss: KiB


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="1GB", help="log size, e.g. 200MB, 1GB (default 1GB)")
    ap.add_argument("--out", default=str(OUT_DIR), help="where to write the log (default benchmarks/out/)")
    ap.add_argument("--tmp", action="store_true", help="write the log to a temp dir and delete it afterwards")
    ap.add_argument("--profile", action="store_true", help="also run loradoctor under cProfile and print the top")
    ap.add_argument("--runs", type=int, default=3, help="runs of each side; the best counts (default 3)")
    args = ap.parse_args()

    from loradoctor.logs.rules import load_rules
    from loradoctor.units import format_bytes

    size_bytes = parse_size(args.size)
    tmp_dir = tempfile.TemporaryDirectory() if args.tmp else None
    out_dir = Path(tmp_dir.name) if tmp_dir else Path(args.out)
    t0 = time.perf_counter()
    log = make_log(size_bytes, out_dir)
    print(f"log: {log} ({format_bytes(log.stat().st_size)}, ready in {time.perf_counter() - t0:.1f}s)")

    rules = load_rules()
    eres, skipped, translated = grep_patterns(rules)
    n_patterns = sum(len(list(getattr(r, "patterns", []) or [])) for r in rules)
    print(f"rules: {len(rules)}, patterns: {n_patterns}; grep -E gets {len(eres)} "
          f"({len(translated)} translated, {len(skipped)} skipped)")
    for rule_id, why in skipped:
        print(f"  skipped  {rule_id}: {why}")
    for rule_id, original, note in translated[:10]:
        print(f"  translated {rule_id}: {note}")
    if len(translated) > 10:
        print(f"  ... {len(translated) - 10} more translated")

    with open(log, "rb") as fh:  # warm the page cache so neither side pays for the disk
        while fh.read(64 << 20):
            pass

    work = Path(tempfile.mkdtemp(prefix="ld-bench-"))
    pattern_file = work / "patterns.ere"
    pattern_file.write_text("\n".join(eres) + "\n", encoding="utf-8")
    # the same locale for both sides: LC_ALL=C (grep's fast byte matching; Python reads bytes anyway)
    env = dict(os.environ, LC_ALL="C", NO_COLOR="1", PYTHONPYCACHEPREFIX=str(work / "pycache"))
    if env.pop("PYTHONDONTWRITEBYTECODE", None) is not None:
        print("note: PYTHONDONTWRITEBYTECODE is set in this shell; loradoctor runs without it (bytecode under "
              f"{work / 'pycache'}), as an installed package runs")
    runs = max(1, args.runs)
    grep_cmd = ["grep", "-E", "-c", "-f", str(pattern_file), str(log)]
    ld_cmd = [sys.executable, "-m", "loradoctor", "explain", str(log), "--format", "json"]
    print(f"\nmeasuring: best of {runs} runs each, page cache warm, LC_ALL=C for both, CPU = user+sys of the "
          f"child (os.wait4), peak RSS = the child's ru_maxrss; loradoctor's time includes start-up")
    print(f"  grep:       {' '.join(grep_cmd)}")
    print(f"  loradoctor: {' '.join(ld_cmd)}")
    tiny = work / "tiny.log"
    # not all lower-case: a lower-cased paste would add the Recaser (~0.2 s) to the start-up figure
    tiny.write_text("Hello\n", encoding="utf-8")
    # warm-up: writes the bytecode and the rule cache, as an installed loradoctor has them
    subprocess.run([sys.executable, "-m", "loradoctor", "explain", str(tiny)], capture_output=True, env=env, cwd=str(ROOT))
    grep_s, _, grep_rss, grep_cpu_s, grep_all = best_of(runs, grep_cmd, work / "grep.out", env)
    grep_count = (work / "grep.out").read_text().strip()
    ld_s, ld_rc, ld_rss, ld_cpu_s, ld_all = best_of(runs, ld_cmd, work / "explain.json", env)
    # the fixed cost (interpreter, imports, compiling the rules) on a one-line log, to tell start-up
    # from throughput
    _, _, _, start_cpu_s, _ = best_of(runs, [sys.executable, "-m", "loradoctor", "explain", str(tiny), "--format",
                                             "json"], work / "tiny.json", env)
    size_mb = log.stat().st_size / 1e6
    print()
    print(f"grep -E -c ({len(eres)} patterns): wall {grep_s:6.2f} s ({size_mb / grep_s:6.1f} MB/s), CPU {grep_cpu_s:6.2f} s "
          f"(runs: {', '.join(f'{x:.2f}' for x in grep_all)}), {grep_count} matching lines, peak RSS {format_bytes(grep_rss)}")
    print(f"loradoctor explain:           wall {ld_s:6.2f} s ({size_mb / ld_s:6.1f} MB/s), CPU {ld_cpu_s:6.2f} s "
          f"(runs: {', '.join(f'{x:.2f}' for x in ld_all)}), exit {ld_rc}, peak RSS {format_bytes(ld_rss)}")
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    if load is not None:
        print(f"load average after the runs: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} "
              f"({os.cpu_count()} CPUs; figures are steadier when it is below the CPU count)")
    ratio = ld_s / grep_s if grep_s > 0 else float("inf")
    cpu_ratio = ld_cpu_s / grep_cpu_s if grep_cpu_s > 0 else float("inf")
    print(f"RATIO loradoctor / grep: {cpu_ratio:.2f}x CPU, {ratio:.2f}x wall (target <= {TARGET_RATIO:.1f}x): "
          f"{'OK' if cpu_ratio <= TARGET_RATIO else 'OFF TARGET'} by CPU time (the steadier number on a busy machine)")
    scan_cpu_s = max(0.0, ld_cpu_s - start_cpu_s)
    print(f"  of which start-up (explain on a one-line log): CPU {start_cpu_s:.2f} s; the rest, {scan_cpu_s:.2f} s, "
          f"is {scan_cpu_s / grep_cpu_s if grep_cpu_s > 0 else float('inf'):.2f}x grep's CPU "
          f"({size_mb / scan_cpu_s if scan_cpu_s > 0 else float('inf'):.0f} MB/s of CPU)")
    print(f"PEAK RSS: {format_bytes(ld_rss)} (target < {TARGET_RSS_BYTES // 1000 // 1000} MB): "
          f"{'OK' if ld_rss < TARGET_RSS_BYTES else 'OFF TARGET'}")

    ok = True
    try:
        doc = json.loads((work / "explain.json").read_text(encoding="utf-8"))
        findings = doc.get("findings", [])
    except ValueError as exc:
        print(f"explain output is not JSON: {exc}")
        findings, ok = [], False
    if findings:
        first = findings[0]
        print(f"first finding: {first.get('cause')} ({first.get('rule')}), evidence "
              f"{[e.get('line') for e in first.get('evidence', [])][:3]}")
    oom_found = bool(findings) and str(findings[0].get("cause", "")).startswith("oom.")
    print(f"OOM found as the first finding: {'yes' if oom_found else 'NO'}")
    ok = ok and oom_found

    if args.profile:
        prof = work / "explain.prof"
        print("\nprofiling (cProfile, cumulative time, top 30):")
        # cli.main, not the console entry: the entry ends with os._exit, before cProfile writes its file
        runner = work / "run_main.py"
        runner.write_text("import sys\nfrom loradoctor.cli import main\nmain(sys.argv[1:])\n", encoding="utf-8")
        subprocess.run([sys.executable, "-m", "cProfile", "-o", str(prof), str(runner), "explain", str(log),
                        "--format", "json"], stdout=subprocess.DEVNULL, cwd=str(ROOT), env=env)
        import pstats

        stats = pstats.Stats(str(prof))
        stats.sort_stats("cumulative").print_stats(30)
        stats.sort_stats("tottime").print_stats(20)
    if tmp_dir:
        tmp_dir.cleanup()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
