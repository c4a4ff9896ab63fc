"""Repro fragmentation: does the caching allocator strand reserved memory in this setup?

The pattern: many 6 MiB tensors (the allocator packs three into each 20 MiB segment), then every
tensor but one per segment is freed. A segment with one live tensor cannot be returned, so its
14 MiB of free space is reserved-but-unallocated: only requests that fit in 14 MiB can use it.
Then, under a memory cap a little above the pattern's reserve, we search the largest block the
process can still allocate. The same runs again in a second child with expandable_segments
flipped (True when this setup lacks it), which maps and unmaps pages instead.

Setup under test: this process's PYTORCH_CUDA_ALLOC_CONF (PYTORCH_ALLOC_CONF on newer torch).
FAIL: the setup under test strands more than a quarter of its reserved memory after
torch.cuda.empty_cache() (the OOM message's "reserved by PyTorch but unallocated"), with the
other arm's numbers beside it. PASS: it does not. SKIP: no CUDA GPU, or too little free memory.
"""

# The shared harness (_harness.py beside this file): OPTIONS, RID, emit, run_main, import_torch, ...
#     python SCRIPT.py ['{"option": value}']   -> one JSON line, schema loradoctor.repro/1
from _harness import *  # noqa: F401,F403


import subprocess

MIB = 1 << 20
BLOCK_BYTES = 6 * MIB
STRANDED_LIMIT = 0.25


def alloc_conf():
    return os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF") or ""


def expandable_in(conf):
    return any(part.strip().replace(" ", "").lower() == "expandable_segments:true" for part in conf.split(","))


def largest_block(torch, device, hi_bytes):
    """Binary search (1 MiB resolution) of the largest single tensor that can be allocated now."""
    lo, hi = 0, hi_bytes
    while hi - lo > MIB:
        mid = (lo + hi) // 2
        try:
            t = torch.empty(mid, dtype=torch.uint8, device=device)
            del t
            lo = mid
        except torch.cuda.OutOfMemoryError if hasattr(torch.cuda, "OutOfMemoryError") else RuntimeError:
            hi = mid
    return lo


def measure_arm(torch, segments):
    """Run the pattern in this process; return its numbers."""
    device = torch.device("cuda", 0)
    torch.zeros(1, device=device)
    free_bytes, total_bytes = torch.cuda.mem_get_info(device)
    pattern_bytes = segments * 20 * MIB
    cap_bytes = pattern_bytes + 256 * MIB
    if free_bytes < cap_bytes + 512 * MIB:
        emit("SKIP", f"needs about {(cap_bytes + 512 * MIB) / MIB:.0f} MiB free on GPU 0, has {free_bytes / MIB:.0f} MiB")
    base_reserved = torch.cuda.memory_reserved(device)
    # The cap makes "largest block" mean: what fits in the budget this pattern left, as in a full GPU.
    torch.cuda.set_per_process_memory_fraction(min(1.0, (cap_bytes + base_reserved) / total_bytes), device)
    blocks = [torch.empty(BLOCK_BYTES, dtype=torch.uint8, device=device) for _ in range(segments * 3)]
    kept = [b for i, b in enumerate(blocks) if i % 3 == 0]
    del blocks
    torch.cuda.empty_cache()  # give back everything that can be given back
    allocated = torch.cuda.memory_allocated(device)
    reserved = torch.cuda.memory_reserved(device)
    largest = largest_block(torch, device, cap_bytes)
    numbers = {
        "alloc_conf": alloc_conf() or "<default>",
        "expandable_segments": expandable_in(alloc_conf()),
        "allocated_bytes": allocated, "reserved_bytes": reserved,
        "reserved_unallocated_bytes": reserved - allocated,
        "stranded_fraction": (reserved - allocated) / reserved if reserved else 0.0,
        "cap_bytes": cap_bytes, "largest_block_bytes": largest,
    }
    del kept
    return numbers


def other_arm(segments, timeout_s):
    """The same pattern in a fresh child with expandable_segments flipped."""
    flipped = "False" if expandable_in(alloc_conf()) else "True"
    # keep the user's other allocator settings (max_split_size_mb, ...): flip only expandable_segments
    kept = [p.strip() for p in alloc_conf().split(",") if p.strip() and not p.strip().lower().startswith("expandable_segments")]
    env = dict(os.environ)
    env.pop("PYTORCH_ALLOC_CONF", None)
    env["PYTORCH_CUDA_ALLOC_CONF"] = ",".join(kept + [f"expandable_segments:{flipped}"])
    try:
        proc = subprocess.run([sys.executable, __file__, json.dumps({"arm": "child", "segments": segments})],
                              capture_output=True, text=True, env=env, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None, [f"the expandable_segments:{flipped} arm hung (no result in {timeout_s:.0f} s)"]
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            data = json.loads(line)
            if data.get("status") == "PASS":
                return data["numbers"], []
            return None, [f"the expandable_segments:{flipped} arm: {data.get('summary')}"] + data.get("evidence", [])
    return None, [f"the expandable_segments:{flipped} arm printed no result (exit {proc.returncode})"] + \
        proc.stderr.strip().splitlines()[-4:]


def describe(n):
    return (f"{'expandable' if n['expandable_segments'] else 'default'} segments: "
            f"{n['reserved_unallocated_bytes'] / MIB:.0f} MiB reserved-but-unallocated of "
            f"{n['reserved_bytes'] / MIB:.0f} MiB reserved ({n['stranded_fraction']:.0%}), "
            f"largest new block {n['largest_block_bytes'] / MIB:.0f} MiB under a {n['cap_bytes'] / MIB:.0f} MiB cap")


def main():
    need_gpu_driver()
    torch = import_torch()
    need_cuda(torch)
    segments = int(OPTIONS.get("segments") or 48)
    try:
        numbers = measure_arm(torch, segments)
    except Exception as exc:
        if OPTIONS.get("arm") == "child":
            emit("FAIL", f"the pattern failed with {alloc_conf()}: {exc_line(exc)}", traceback.format_exc().splitlines()[-4:])
        raise
    if OPTIONS.get("arm") == "child":
        emit("PASS", describe(numbers), [], numbers)
    inner_timeout = max(30.0, float(OPTIONS.get("timeout_s", 180)) * 0.4)
    other, notes = other_arm(segments, inner_timeout)
    result = {"setup": numbers, "other_arm": other}
    evidence = ["this setup, " + describe(numbers)]
    if other:
        evidence.append("other arm, " + describe(other))
    evidence += notes
    if numbers["stranded_fraction"] > STRANDED_LIMIT:
        fix = ""
        if other and other["expandable_segments"]:
            fix = (f"; with expandable_segments:True {other['reserved_unallocated_bytes'] / MIB:.0f} MiB stay stranded and "
                   f"the largest block grows to {other['largest_block_bytes'] / MIB:.0f} MiB "
                   "(export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)")
        emit("FAIL", f"fragmentation reproduces: {numbers['reserved_unallocated_bytes'] / MIB:.0f} MiB "
                     f"({numbers['stranded_fraction']:.0%}) of reserved memory is stranded, the largest new block is "
                     f"{numbers['largest_block_bytes'] / MIB:.0f} MiB{fix}", evidence, result)
    emit("PASS", f"no fragmentation with {numbers['alloc_conf']}: {numbers['stranded_fraction']:.0%} of reserved memory "
                 f"stranded, largest new block {numbers['largest_block_bytes'] / MIB:.0f} MiB", evidence, result)


run_main(main)
