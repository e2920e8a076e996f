#!/usr/bin/env bash
# FSDP step time against one rank doing the same per-rank work (CPU, Gloo on loopback).
# Alternates, per round: 1 rank with local batch 4 (1 thread), FSDP over 2 ranks with local
# batch 4 each (1 thread each, global batch 8) and DDP over 2 ranks (the same), each for STEPS
# steps, and prints the median step time over steps 3..STEPS of each run and the ratios.
# Usage: tools/bench_fsdp.sh [ROUNDS=3] [STEPS=20] [FLAVOR=debugmodel]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LOOM="$ROOT/build/bin/loom"
PY="$ROOT/.venv/bin/python"
ROUNDS="${1:-3}"
STEPS="${2:-20}"
FLAVOR="${3:-debugmodel}"
OUT="$(mktemp -d)"
COMMON=(train --config "$ROOT/configs/llama3_debug.toml" --model.flavor "$FLAVOR"
  --training.steps "$STEPS" --training.seq_len 256 --training.local_batch_size 4
  --validation.enable false --metrics.log_freq 1 --debug.seed 7)
median() {
  "$PY" - "$1" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"step_time_s"' in l]
print(statistics.median(r["step_time_s"] for r in rows if r["step"] >= 3))
PY
}
for r in $(seq 1 "$ROUNDS"); do
  OMP_NUM_THREADS=1 "$LOOM" "${COMMON[@]}" --job.dump_folder "$OUT/one" > "$OUT/one.log" 2>&1
  OMP_NUM_THREADS=1 "$LOOM" launch --nproc-per-node 2 -- "${COMMON[@]}" \
    --job.dump_folder "$OUT/fsdp" > "$OUT/fsdp.log" 2>&1
  OMP_NUM_THREADS=1 "$LOOM" launch --nproc-per-node 2 -- "${COMMON[@]}" \
    --parallelism.data_parallel_replicate_degree 2 --job.dump_folder "$OUT/ddp" > "$OUT/ddp.log" 2>&1
  one=$(median "$OUT/one/metrics.jsonl")
  fsdp=$(median "$OUT/fsdp/metrics.jsonl")
  ddp=$(median "$OUT/ddp/metrics.jsonl")
  sent=$(grep -o '[0-9.]* MB sent' "$OUT/fsdp.log" | head -1)
  "$PY" -c "print(f'round $r: 1 rank {$one:.3f} s, FSDP x2 {$fsdp:.3f} s ({$fsdp/$one:.2f}x), DDP x2 {$ddp:.3f} s ({$ddp/$one:.2f}x); FSDP rank: $sent in $STEPS steps')"
done
rm -rf "$OUT"
