#!/usr/bin/env bash
# Builds loom's libFuzzer harnesses (tests/fuzz) with clang and runs each for SECONDS (default
# 30), starting from seed corpora made of the repository's own files. Exits non-zero when a
# harness crashes (its input is kept under build-fuzz/crashes/) or cannot be built.
#
#   tools/fuzz.sh [SECONDS] [HARNESS...]      e.g. tools/fuzz.sh 600 fuzz_hf_tokenizer
#
# Needs clang and libclang-rt-dev (Debian), and the setup venv (LibTorch, for the chunk reader).
# The corpora grow in build-fuzz/corpus/<harness> and are reused by the next run.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
SECONDS_EACH="${1:-30}"
shift || true
BUILD="${LOOM_FUZZ_BUILD_DIR:-build-fuzz}"
ALL=(fuzz_config fuzz_safetensors_header fuzz_checkpoint_index fuzz_checkpoint_reader
     fuzz_tiktoken fuzz_hf_tokenizer fuzz_documents fuzz_prompts fuzz_choice_items
     fuzz_metrics_rows fuzz_schedule_csv fuzz_hf_config)
HARNESSES=("${@:-${ALL[@]}}")
[ $# -eq 0 ] && HARNESSES=("${ALL[@]}")

say() { printf '\033[1m[fuzz]\033[0m %s\n' "$*"; }
die() { printf '\033[1;31m[fuzz] error:\033[0m %s\n' "$*" >&2; exit 1; }

command -v clang++ >/dev/null || die "clang++ not found: apt-get install clang libclang-rt-dev"
echo 'extern "C" int LLVMFuzzerTestOneInput(const char*, unsigned long) { return 0; }' > /tmp/loom_fuzz_probe.cpp
clang++ -fsanitize=fuzzer /tmp/loom_fuzz_probe.cpp -o /tmp/loom_fuzz_probe 2>/dev/null ||
  die "clang cannot link -fsanitize=fuzzer: apt-get install libclang-rt-dev"

FLAGS="-g -O1 -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined"
FLAGS="$FLAGS -fno-omit-frame-pointer"
if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  say "configuring $BUILD (clang, $FLAGS)"
  CC=clang CXX=clang++ cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DLOOM_FUZZ=ON -DLOOM_BUILD_TESTS=OFF -DLOOM_USE_PCH=OFF \
    -DCMAKE_CXX_FLAGS="$FLAGS" -DCMAKE_C_FLAGS="$FLAGS" >/dev/null || die "cmake failed"
fi
say "building ${HARNESSES[*]}"
cmake --build "$BUILD" -j "$(nproc)" --target "${HARNESSES[@]}" >/dev/null || {
  cmake --build "$BUILD" -j 1 --target "${HARNESSES[@]}" 2>&1 | tail -40
  die "build failed"
}

# Seed corpora: the repository's own files (copied once; the corpus then grows).
CORPUS="$BUILD/corpus"
SEEDS="$BUILD/seeds"
mkdir -p "$CORPUS" "$SEEDS" "$BUILD/crashes"
if [ ! -f "$SEEDS/.done" ]; then
  mkdir -p "$SEEDS"/{config,safetensors,index,tiktoken,hf,documents}
  cp configs/*.toml tests/data/configs/*.toml "$SEEDS/config/"
  for f in configs/*.toml; do  # the JSON form of each config
    python3 -c 'import json,sys,tomllib; print(json.dumps(tomllib.load(open(sys.argv[1],"rb"))))' \
      "$f" > "$SEEDS/config/$(basename "$f" .toml).json"
  done
  LOOM_FUZZ_SEED_OUT="$SEEDS/checkpoint" ASAN_OPTIONS=detect_leaks=0 \
    "$BUILD/bin/fuzz_checkpoint_reader" -runs=0 >/dev/null 2>&1 || true
  cp "$SEEDS"/checkpoint/*.safetensors "$SEEDS/safetensors/" 2>/dev/null || true
  cp "$SEEDS"/checkpoint/seed-index.json "$SEEDS/index/" 2>/dev/null || true
  for f in tests/data/tokenizers/*.tiktoken; do
    [ -f "$f" ] && head -n 64 "$f" > "$SEEDS/tiktoken/$(basename "$f")"
  done
  cp tests/data/tokenizers/cl100k_base.json tests/data/tokenizers/gpt2.json "$SEEDS/tiktoken/" 2>/dev/null || true
  cp tests/data/tokenizers/hf_*_style.json assets/tokenizer/*.json "$SEEDS/hf/"
  # Small documents of the Brown corpus, plain and gzip (whole files stay under -max_len).
  zcat assets/brown/validation.jsonl.gz | python3 -c '
import json, sys
for line in list(sys.stdin)[:8]:
    print(json.dumps({"text": json.loads(line)["text"][:400]}))' > "$SEEDS/documents/small.jsonl"
  gzip -c "$SEEDS/documents/small.jsonl" > "$SEEDS/documents/small.jsonl.gz"
  touch "$SEEDS/.done"
fi
# Seeds of the second round's readers (their own marker, so older seed folders gain them).
if [ ! -f "$SEEDS/.done2" ]; then
  mkdir -p "$SEEDS"/{prompts,choices,metrics,schedule,hf_config}
  python3 - "$SEEDS" <<'PY'
import json, os, sys
seeds = sys.argv[1]
def write(folder, name, text):
    with open(os.path.join(seeds, folder, name), "w") as f:
        f.write(text)
write("prompts", "prompts.jsonl", "\n".join(json.dumps(p) for p in [
    {"prompt": "The cat", "id": 1}, {"text": "Once upon a time", "id": "b"},
    {"prompt": "caf\u00e9 \u2603 12345"}]) + "\n\n")
write("choices", "task.jsonl", "\n".join(json.dumps(p) for p in [
    {"context": "The sky is", "choices": [" blue", " green"], "answer": 0},
    {"context": "2 + 2 =", "choices": [" 3", " 4", " 5"], "answer": 1}]) + "\n")
rows = [{"step": s, "loss": 10.0 / s, "lr": 1e-3, "tps": 1000.0 + s, "tokens_seen": 512 * s,
         "step_time_s": 0.5, "mfu_pct": 12.5} for s in range(1, 6)]
rows.append({"step": 5, "val_loss": 2.5})
write("metrics", "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
# 1F1B on 2 ranks, 2 microbatches, compute only (the loader inserts communication) and with it.
write("schedule", "1f1b.csv", "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n")
write("schedule", "comm.csv", "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1\n"
      "1RECV_F0,1F0,1B0,1SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1\n")
PY
  cp tests/data/hf_llama/transformers4/config.json "$SEEDS/hf_config/llama4.json"
  for f in tests/data/hf_llama/transformers5/config.json tests/data/hf_qwen3/transformers5/*/config.json; do
    [ -f "$f" ] && cp "$f" "$SEEDS/hf_config/$(echo "$f" | tr / _)"
  done
  touch "$SEEDS/.done2"
fi
seed_dir() {
  case "$1" in
    fuzz_config) echo config ;; fuzz_safetensors_header) echo safetensors ;;
    fuzz_checkpoint_index|fuzz_checkpoint_reader) echo index ;;
    fuzz_tiktoken) echo tiktoken ;; fuzz_hf_tokenizer) echo hf ;; fuzz_documents) echo documents ;;
    fuzz_prompts) echo prompts ;; fuzz_choice_items) echo choices ;; fuzz_metrics_rows) echo metrics ;;
    fuzz_schedule_csv) echo schedule ;; fuzz_hf_config) echo hf_config ;;
  esac
}

# The embedded BPE (197 kB) is the only seed above 64 kB.
max_len() { [ "$1" = fuzz_hf_tokenizer ] && echo 262144 || echo 65536; }

# LibTorch's own start-up allocations are not leaks of loom's.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0:allocator_may_return_null=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
export LOOM_FUZZ_TMPDIR="${LOOM_FUZZ_TMPDIR:-/dev/shm}"
[ -w "$LOOM_FUZZ_TMPDIR" ] || export LOOM_FUZZ_TMPDIR=/tmp
failed=()
printf '%-26s %12s %8s %8s %7s\n' harness executions exec/s cov crashes | tee "$BUILD/summary.txt"
for h in "${HARNESSES[@]}"; do
  bin="$BUILD/bin/$h"
  mkdir -p "$CORPUS/$h"
  log="$BUILD/$h.log"
  set +e
  "$bin" "$CORPUS/$h" "$SEEDS/$(seed_dir "$h")" -max_total_time="$SECONDS_EACH" \
    -rss_limit_mb=4096 -timeout=20 -max_len="$(max_len "$h")" -print_final_stats=1 \
    -artifact_prefix="$BUILD/crashes/$h-" >"$log" 2>&1
  rc=$?
  set -e
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
  speed=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*' || echo 0)
  crashes=0
  [ $rc -ne 0 ] && crashes=1 && failed+=("$h")
  printf '%-26s %12s %8s %8s %7s\n' "$h" "$runs" "$speed" "$cov" "$crashes" | tee -a "$BUILD/summary.txt"
done
if [ ${#failed[@]} -gt 0 ]; then
  for h in "${failed[@]}"; do
    say "$h failed; the end of its log ($BUILD/$h.log):"
    tail -30 "$BUILD/$h.log"
  done
  die "${#failed[@]} harness(es) crashed: ${failed[*]} (inputs in $BUILD/crashes/)"
fi
say "no crash in ${#HARNESSES[@]} harness(es), ${SECONDS_EACH} s each"
