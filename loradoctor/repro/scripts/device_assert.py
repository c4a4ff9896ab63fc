"""Repro device-assert: a token id past the embedding's rows (tokens added without resizing).

The fixed arm (rows = vocabulary + added tokens, as after model.resize_token_embeddings(len(tokenizer)))
runs first; then the lookup of id == rows on the unresized table: on a GPU a device-side assert
("CUDA error: device-side assert triggered", the kernel's "Assertion `srcIndex < srcSelectDimSize`"),
run in its own grandchild because the assert poisons the CUDA context; on the CPU an IndexError
("index out of range in self") shows the same logic.
Setup under test: options vocab_size (embedding rows, default 1001) and token_id (the largest id
fed, default 1000). FAIL: the setup under test raises. PASS: it looks up fine. Runs on CPU and GPU.
"""

# The shared harness (_harness.py beside this file): OPTIONS, RID, emit, run_main, import_torch, ...
#     python SCRIPT.py ['{"option": value}']   -> one JSON line, schema loradoctor.repro/1
from _harness import *  # noqa: F401,F403


import subprocess


def lookup(torch, device, rows, token_id):
    """Embedding lookup of [0, token_id] in a table of `rows` rows; None or the error line."""
    emb = torch.nn.Embedding(rows, 16).to(device)
    ids = torch.tensor([[0, 1, token_id]], device=device)
    try:
        out = emb(ids)
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # the assert surfaces at the next sync
        out.sum().item()
        return None
    except (RuntimeError, IndexError) as exc:
        return exc_line(exc)


def lookup_in_grandchild(rows, token_id, timeout_s):
    """Run the lookup on the GPU in a fresh process: returns (error line or None, kernel assert lines)."""
    env = dict(os.environ)
    env["CUDA_LAUNCH_BLOCKING"] = "1"  # the error names the failing kernel call, not a later one
    payload = json.dumps({"arm": "lookup", "vocab_size": rows, "token_id": token_id, "device": "cuda"})
    try:
        proc = subprocess.run([sys.executable, __file__, payload], capture_output=True, text=True,
                              env=env, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"the lookup hung for {timeout_s:.0f} s", []
    # the kernel's assert is printed by the device (printf): on stdout or stderr depending on the driver
    asserts = [line.strip() for line in (proc.stdout + "\n" + proc.stderr).splitlines() if "Assertion" in line][:3]
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            data = json.loads(line)
            return data["numbers"].get("error"), asserts
    tail = proc.stderr.strip().splitlines()[-1:] or [f"exit code {proc.returncode}"]
    return f"the lookup process died: {tail[0]}", asserts


def main():
    torch = import_torch()
    device, use_cuda = pick_device(torch)
    rows = int(OPTIONS.get("vocab_size") or 1001)
    token_id = int(OPTIONS.get("token_id") if OPTIONS.get("token_id") is not None else 1000)
    if OPTIONS.get("arm") == "lookup":  # the grandchild: one lookup, report, exit
        emit("PASS", "lookup", [], {"error": lookup(torch, device, rows, token_id)})
    timeout_s = max(20.0, float(OPTIONS.get("timeout_s", 120)) * 0.3)
    numbers = {"device": str(device), "setup": {"vocab_size": rows, "token_id": token_id}}
    evidence = []
    # the fixed arm, then the setup under test, then the unresized table (poisons a CUDA context: own process)
    fixed_error = lookup(torch, device, 1001, 1000)
    evidence.append(f"resized table (1001 rows), id 1000: {fixed_error or 'looks up fine'}")
    runs = [("setup", rows, token_id), ("unresized", 1000, 1000)]
    results = {}
    for label, r, t in runs:
        if device.type == "cuda" and t >= r:
            error, asserts = lookup_in_grandchild(r, t, timeout_s)
        else:
            error, asserts = lookup(torch, device, r, t), []
        results[label] = {"error": error, "kernel_asserts": asserts}
        evidence.append(f"{'setup under test' if label == 'setup' else 'unresized table'} ({r} rows), id {t}: "
                        f"{error or 'looks up fine'}")
        evidence += [f"  {a}" for a in asserts]
    numbers.update({"fixed_error": fixed_error, "arms": results,
                    "reproduced_unresized": results["unresized"]["error"] is not None})
    if results["setup"]["error"]:
        emit("FAIL", f"token id {token_id} with {rows} embedding rows fails: {results['setup']['error']}; fix: "
                     "model.resize_token_embeddings(len(tokenizer)) after adding tokens", evidence, numbers)
    if fixed_error:
        emit("FAIL", f"even the resized table fails: {fixed_error}", evidence, numbers)
    seen = results["unresized"]["error"] or "did not fail (unexpected)"
    emit("PASS", f"token id {token_id} with {rows} embedding rows looks up fine on {device.type}; the unresized "
                 f"table fails with: {seen}", evidence, numbers)


run_main(main)
