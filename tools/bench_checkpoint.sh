#!/usr/bin/env bash
# Checkpoint benchmark: training-thread time blocked per save (sync vs async) and save/load
# bandwidth, on the 100M Llama (97.5M parameters: model + AdamW moments = 1.17 GB per save).
# Usage: tools/bench_checkpoint.sh [OUT_DIR]   (results: grep the "wrote" and "resumed" lines)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LOOM="$ROOT/build/bin/loom"
OUT="${1:-/tmp/loom_bench_checkpoint}"
rm -rf "$OUT"
common=(train --model.flavor 100M --training.dataset synthetic --training.seq_len 32
  --training.local_batch_size 1 --training.device cpu --activation_checkpoint.mode none
  --metrics.log_freq 1 --metrics.peak_tflops 1 --debug.seed 1 --checkpoint.enable true
  --checkpoint.interval 2 --checkpoint.keep_latest_k 2 --checkpoint.last_save_model_only false)
for mode in disabled async; do
  echo "== async_mode = $mode"
  OMP_NUM_THREADS=2 "$LOOM" "${common[@]}" --job.dump_folder "$OUT/$mode" --training.steps 8 \
    --checkpoint.async_mode "$mode" 2>&1 | grep -E "wrote|step: "
done
echo "== load (resume the async run's step 8, train 1 more step)"
OMP_NUM_THREADS=2 "$LOOM" "${common[@]}" --job.dump_folder "$OUT/async" --training.steps 9 \
  2>&1 | grep -E "resumed"
rm -rf "$OUT"
