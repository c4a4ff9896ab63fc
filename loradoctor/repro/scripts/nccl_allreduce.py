"""Repro nccl-allreduce: does a two-process all-reduce work on this machine?

Two worker processes (this script, started twice with a free TCP port on 127.0.0.1) join a
process group and all-reduce a tensor; each must see 1 + 2 = 3. Backend: NCCL on two local GPUs
when there are two or more, else gloo on the CPU (which checks the launcher path: spawning,
rendezvous, torch.distributed; not NCCL). Option backend = auto | nccl | gloo.
PASS: both workers see the right sum. FAIL: a worker raises, hangs (killed at the timeout) or sees
a wrong value; the evidence has each worker's error and NCCL's warnings.
SKIP: backend nccl asked for without two GPUs, or torch.distributed is not available.
"""

# The shared harness (_harness.py beside this file): OPTIONS, RID, emit, run_main, import_torch, ...
#     python SCRIPT.py ['{"option": value}']   -> one JSON line, schema loradoctor.repro/1
from _harness import *  # noqa: F401,F403


import socket
import subprocess


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(torch):
    """One rank: join, all-reduce, report through the harness."""
    import datetime

    import torch.distributed as dist

    rank, world, backend = int(OPTIONS["rank"]), int(OPTIONS["world"]), OPTIONS["backend"]
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{OPTIONS['port']}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=float(OPTIONS.get("pg_timeout_s", 60))))
    try:
        t = torch.full((1024,), float(rank + 1), device=device)
        t0 = time.monotonic()
        dist.all_reduce(t)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        value = t[0].item()
        elapsed = time.monotonic() - t0
    finally:
        dist.destroy_process_group()
    expected = world * (world + 1) / 2
    emit("PASS" if abs(value - expected) < 1e-6 else "FAIL", f"rank {rank} saw {value}",
         [], {"rank": rank, "value": value, "expected": expected, "allreduce_s": round(elapsed, 4)})


def main():
    backend = str(OPTIONS.get("backend") or "auto").lower()
    if OPTIONS.get("role") == "worker" or backend != "gloo":
        torch = import_torch()
        if OPTIONS.get("role") == "worker":
            worker(torch)
        import torch.distributed as dist

        if not dist.is_available():
            emit("SKIP", f"torch {torch.__version__} was built without torch.distributed")
        gpus = torch.cuda.device_count() if getattr(torch.version, "cuda", None) and torch.cuda.is_available() else 0
    else:  # gloo asked for: the workers import torch; the launcher need not (saves seconds)
        import importlib.util

        if importlib.util.find_spec("torch") is None:
            emit("SKIP", f"torch is not installed for {sys.executable}")
        gpus = 0
    if backend == "auto":
        backend = "nccl" if gpus >= 2 else "gloo"
    if backend == "nccl":
        if gpus < 2:
            emit("SKIP", f"NCCL all-reduce needs two GPUs; torch sees {gpus} (try backend=gloo for the launcher path)")
        if not dist.is_nccl_available():
            emit("FAIL", f"torch {torch.__version__} has no NCCL backend although {gpus} GPUs are visible")
    elif backend != "gloo":
        emit("ERROR", f"unknown backend {backend!r}; use auto, nccl or gloo")
    world = 2
    budget_s = float(OPTIONS.get("timeout_s", 120)) * 0.8
    port = free_port()
    env = dict(os.environ)
    env.setdefault("NCCL_DEBUG", "WARN")
    procs = []
    for rank in range(world):
        payload = json.dumps({"role": "worker", "rank": rank, "world": world, "backend": backend, "port": port,
                              "pg_timeout_s": max(10.0, budget_s - 10)})
        procs.append(subprocess.Popen([sys.executable, __file__, payload], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, env=env))
    numbers = {"backend": backend, "world_size": world, "gpus": gpus, "port": port, "ranks": []}
    evidence, problems = [], []
    deadline = time.monotonic() + budget_s
    for rank, proc in enumerate(procs):
        try:
            out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            out, err = proc.communicate()
            problems.append(f"rank {rank} hung: no result within {budget_s:.0f} s (a stuck rendezvous or collective)")
        data = None
        for line in reversed(out.splitlines()):
            if line.startswith("{"):
                data = json.loads(line)
                break
        if data is None:
            problems.append(f"rank {rank} exited with code {proc.returncode} without a result")
        elif data["status"] != "PASS":
            problems.append(f"rank {rank}: {data['summary']}")
            evidence += data.get("evidence", [])
        else:
            numbers["ranks"].append(data["numbers"])
            numbers["worker_torch"] = data.get("torch")
        noise = [line for line in err.splitlines() if "NCCL WARN" in line or "Error" in line or "error" in line]
        evidence += [f"rank {rank}: {line.strip()}" for line in noise[-4:]]
    if problems:
        emit("FAIL", f"{backend} all-reduce failed: {problems[0]}", problems + evidence, numbers)
    what = ("NCCL on two GPUs" if backend == "nccl" else
            "gloo on the CPU (launcher path; NCCL not tested: " + ("needs two GPUs)" if gpus < 2 else "gloo asked for)"))
    emit("PASS", f"two-process all-reduce works with {what}", evidence, numbers)


run_main(main)
