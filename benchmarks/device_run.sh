#!/usr/bin/env bash
# The GPU calibration run (issue 5): on a machine with an NVIDIA GPU and this repository, run
#   1. loradoctor repro run --all --format json
#   2. a small loradoctor measure matrix (Qwen2.5-0.5B and a Llama-3.1-8B shape; LoRA and, when
#      bitsandbytes is installed, QLoRA; seq 512 and 2048; gradient checkpointing off/on)
# and keep every JSON document under $OUT (the device tool's output folder) or
# benchmarks/out/device-<time>/, with summary.tsv (predicted vs measured, error per metric).
#
#   bash benchmarks/device_run.sh            # about 6 minutes on an H200
#   QUICK=1 bash benchmarks/device_run.sh    # 3 measure runs, about 2 minutes
#   PYTHON=/path/to/venv/bin/python BUDGET_S=300 bash benchmarks/device_run.sh
#
# Needs: a CUDA torch, loradoctor's own dependencies (rich, pyyaml, regex, packaging, psutil,
# nvidia-ml-py) importable by $PYTHON, and transformers + peft (+ bitsandbytes for QLoRA) for the
# measure part; what is missing is recorded and skipped. Nothing is downloaded.
# Status: written without a GPU; not yet run on one.
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DEST=${OUT:-benchmarks/out/device-$(date +%Y%m%d-%H%M%S)}
BUDGET_S=${BUDGET_S:-420}   # stop starting new measure runs after this many seconds
STEPS=${STEPS:-3}
mkdir -p "$DEST"
START=$(date +%s)
log() { echo "[$(( $(date +%s) - START ))s] $*" | tee -a "$DEST/run.log" >&2; }
have() { "$PY" -c "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('$1') else 1)" 2>/dev/null; }

# 0. what this machine is (package versions from metadata: nothing heavy is imported here)
{ nvidia-smi 2>&1 || echo "nvidia-smi: not found"; } > "$DEST/nvidia-smi.txt"
"$PY" - > "$DEST/versions.json" 2>&1 <<'PYEOF'
import json, platform, sys
from importlib import metadata
out = {"python": sys.version.split()[0], "platform": platform.platform()}
for name in ("torch", "transformers", "peft", "bitsandbytes", "flash-attn", "accelerate", "loradoctor", "rich"):
    try:
        out[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
        out[name] = None
print(json.dumps(out, indent=2))
PYEOF
if ! "$PY" -c "import loradoctor.cli" 2>"$DEST/import_error.txt"; then
    log "loradoctor cannot be imported by $PY (see import_error.txt): its dependencies are missing here; stopping"
    exit 2
fi
rm -f "$DEST/import_error.txt"

# 1. every repro (SKIP_REPRO=1 leaves it out)
if [ "${SKIP_REPRO:-0}" != 1 ]; then
log "repro run --all"
timeout 300 "$PY" -m loradoctor repro run --all --format json --timeout 90 \
    > "$DEST/repro_all.json" 2> "$DEST/repro_all.stderr"
log "repro run --all: exit $?"
"$PY" - "$DEST/repro_all.json" <<'PYEOF' >&2 || true
import json, sys
doc = json.load(open(sys.argv[1]))
for r in doc["results"]:
    print(f"  {r['status']:<5} {r['id']:<15} {r['summary'][:150]}")
PYEOF
fi

# 2. the measure matrix: model method seq_len checkpointing
MISSING=""
for pkg in transformers peft; do have "$pkg" || MISSING="$MISSING $pkg"; done
if [ -n "$MISSING" ]; then
    log "measure: skipped (not installed for $PY:$MISSING)"
    exit 0
fi
QLORA=1
have bitsandbytes || { QLORA=0; log "bitsandbytes not installed: QLoRA rows skipped"; }
QWEN=Qwen/Qwen2.5-0.5B
LLAMA=meta-llama/Llama-3.1-8B
if [ "${QUICK:-0}" = 1 ]; then
    MATRIX="$QWEN:lora:512:off $QWEN:qlora:2048:on $LLAMA:lora:2048:on"
else
    MATRIX="$QWEN:lora:512:off $QWEN:lora:512:on $QWEN:lora:2048:off $QWEN:lora:2048:on
            $QWEN:qlora:512:off $QWEN:qlora:2048:on
            $LLAMA:lora:2048:on $LLAMA:lora:512:off $LLAMA:qlora:2048:on $LLAMA:qlora:512:off $LLAMA:lora:2048:off"
fi
for row in $MATRIX; do
    IFS=: read -r model method seq gc <<< "$row"
    if [ "$method" = qlora ] && [ "$QLORA" = 0 ]; then continue; fi
    elapsed=$(( $(date +%s) - START ))
    if [ "$elapsed" -ge "$BUDGET_S" ]; then log "budget of ${BUDGET_S}s spent: not running $row"; continue; fi
    name="measure-$(basename "$model")-$method-$seq-gc$gc"
    flag=--no-gradient-checkpointing
    [ "$gc" = on ] && flag=--gradient-checkpointing
    log "$name"
    timeout 240 "$PY" -m loradoctor measure --model "$model" --method "$method" --seq-len "$seq" "$flag" \
        --steps "$STEPS" --timeout 200 --format json > "$DEST/$name.json" 2> "$DEST/$name.stderr"
    log "$name: exit $? (0 measured, 1 out of memory, 2 could not measure)"
done

# 3. one table of predicted vs measured
"$PY" - "$DEST" > "$DEST/summary.tsv" <<'PYEOF'
import glob, json, os, sys
cols = ["run", "status", "pred_alloc_gib", "meas_alloc_gib", "err_alloc", "pred_reserved_gib", "meas_reserved_gib",
        "err_reserved", "pred_device_gib", "meas_device_gib", "err_device", "reason"]
print("\t".join(cols))
gib = lambda v: "" if v is None else f"{v / 2**30:.3f}"
pct = lambda v: "" if v is None else f"{v * 100:+.1f}%"
for path in sorted(glob.glob(os.path.join(sys.argv[1], "measure-*.json"))):
    try:
        d = json.load(open(path))
    except ValueError:
        print(f"{os.path.basename(path)[:-5]}\tunreadable" + "\t" * (len(cols) - 2))
        continue
    row = [os.path.basename(path)[:-5], d["status"]]
    for k in ("allocated", "reserved", "device"):
        row += [gib(d["predicted"][k]), gib(d["measured"][k]), pct(d["error"][k])]
    row.append(d.get("reason", ""))
    print("\t".join(row))
PYEOF
column -t -s $'\t' "$DEST/summary.tsv" >&2 || cat "$DEST/summary.tsv" >&2
log "done: results in $DEST"
