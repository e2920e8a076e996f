#!/usr/bin/env bash
# Peak memory of a debug training run at every logged step, per rank: does a layout keep memory
# from step to step? (issue #29; docs/performance.md "host memory over long runs").
#
#   tools/memory_growth.sh LAYOUT [STEPS] [DUMP_DIR]    LAYOUT: one|ddp|fsdp|hsdp|tp|pp
#
# LOOM_BINARY runs another build's loom (default: build/bin/loom), e.g. a copy of the binary
# before a change, for a side-by-side comparison.
# Prints rank 0's mem_peak_gib by step (metrics.jsonl, full precision), the growth from step 20
# to the last step, and every rank's console value at step 20 and at the last step.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
layout="${1:?usage: tools/memory_growth.sh one|ddp|fsdp|hsdp|tp|pp [STEPS] [DUMP_DIR]}"
steps="${2:-60}"
dir="${3:-$(mktemp -d)/memory_growth_$layout}"
nproc=2
extra=()
case "$layout" in
  one) nproc=1 ;;
  fsdp) ;;
  ddp) extra=(--parallelism.data_parallel_replicate_degree 2 --parallelism.data_parallel_shard_degree 1) ;;
  hsdp) nproc=4; extra=(--parallelism.data_parallel_replicate_degree 2
                        --parallelism.data_parallel_shard_degree 2 --training.global_batch_size 16) ;;
  tp) extra=(--parallelism.tensor_parallel_degree 2 --parallelism.data_parallel_shard_degree 1) ;;
  pp) extra=(--parallelism.pipeline_parallel_degree 2 --parallelism.data_parallel_shard_degree 1) ;;
  *) echo "unknown layout '$layout' (one, ddp, fsdp, hsdp, tp, pp)" >&2; exit 2 ;;
esac
((steps > 20)) || { echo "STEPS must be above 20 (growth is measured from step 20)" >&2; exit 2; }
rm -rf "$dir"; mkdir -p "$(dirname "$dir")"
log="$dir.log"
"${LOOM_BINARY:-$ROOT/build/bin/loom}" launch --standalone --local-ranks-filter all --nproc-per-node "$nproc" -- \
  train --config "$ROOT/configs/llama3_debug.toml" --training.seq_len 128 \
  --validation.seq_len 128 --training.steps "$steps" --job.dump_folder "$dir" \
  --metrics.log_freq 10 "${extra[@]}" > "$log" 2>&1 || { tail -5 "$log"; exit 1; }
"$ROOT/.venv/bin/python" - "$dir/metrics.jsonl" "$layout" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
peak = {r["step"]: r["mem_peak_gib"] * 1024 for r in rows if "loss" in r and "mem_peak_gib" in r}
last = max(peak)
print(f"{sys.argv[2]}: rank 0 mem_peak MiB by step", {s: round(v, 1) for s, v in peak.items()})
print(f"{sys.argv[2]}: rank 0 growth from step 20 to {last}: {peak[last] - peak[20]:.1f} MiB")
PY
for rank in $(seq 0 $((nproc - 1))); do
  at() { grep "\[rank$rank\].*step: *$1 " "$log" | grep -o "memory: *[0-9.]*GiB" | head -1; }
  echo "  rank $rank: step 20 $(at 20), step $steps $(at "$steps")"
done
echo "log: $log"
