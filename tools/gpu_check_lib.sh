# Functions of tools/gpu_check.sh (sourced; it sets ROOT, CARRY, OUT, WORK, BUILD, PYTHON, JOBS,
# TRAIN_TIMEOUT and DRY_RUN first).

# ------------------------------------------------------------------------------ what it runs
# The targets the check builds and the tests its phases select, defined once: gpu_check.sh uses
# them, and tests/scripts/gpu_check_guard.sh (in the default suite) checks that a build tree
# holding only these targets registers those tests, so a change to the build or to the test
# registration cannot leave the check with nothing to run unseen.
gpu_check_targets() {  # BUILD_DIR: the targets, one a line, for a configured build tree
  echo loom
  grep -q "^LOOM_WITH_CUDA:BOOL=ON" "$1/CMakeCache.txt" && echo loom_cuda_tests
  return 0
}
GPU_CHECK_PYTHON_TESTS='^(reference_safetensors_io|reference_self_test)$'  # 2 tests, CPU
GPU_CHECK_CUDA_LABEL=cuda

# ------------------------------------------------------------------------------ phases, results
CHECK_START=$(date +%s.%N)
PHASE=""
PHASE_OPEN=0
PHASE_STATUS_LAST=""
OVERALL=0
seconds_since() { awk -v s="$1" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }'; }

phase() {
  PHASE="$1" PHASE_OPEN=1 PHASE_START=$(date +%s.%N) PHASE_NOTES=() PHASE_FAILURES=()
  PHASE_SKIPPED=0
  printf '\n=== %s (%s)\n' "$PHASE" "$(date -u +%T)"
}
note() { echo "  $*"; PHASE_NOTES+=("$*"); }
phase_fails() { echo "  FAILED: ${1:-see the log above}"; PHASE_FAILURES+=("${1:-failed}"); }

phase_end() {
  local status=ok secs details
  secs="$(seconds_since "$PHASE_START")"
  if ((${#PHASE_FAILURES[@]})); then status=FAILED OVERALL=1; elif ((PHASE_SKIPPED)); then status=skipped; fi
  PHASE_STATUS_LAST=$status PHASE_OPEN=0
  printf -- '--- %s: %s in %s s\n' "$PHASE" "$status" "$secs"
  details="$(printf '%s; ' "${PHASE_FAILURES[@]}" "${PHASE_NOTES[@]}")"
  details="${details%; }"
  printf '%s\t%s\t%s\t%s\n' "$PHASE" "$status" "$secs" "${details//|//}" >> "$WORK/phases.tsv"
  write_results
}

# The device call's time: a timed run gets at most what is left of LOOM_GPU_BUDGET seconds since
# the check started (default 500: the device tool's 540 s call less a margin for the report), and a
# run with under 20 s left is skipped with a note, so that a check that runs long still ends with
# its report and its outputs phase instead of being killed inside a phase. The dry run has no
# budget unless LOOM_GPU_BUDGET is set (it runs every phase on a slower machine).
# run_limit LIMIT: prints min(LIMIT, the budget left); fails with under 20 s left.
run_limit() {
  local budget="${LOOM_GPU_BUDGET:-$( ((DRY_RUN)) || echo 500)}" left
  [[ -n "$budget" ]] || { echo "$1"; return 0; }
  left="$(awk -v b="$budget" -v s="$CHECK_START" -v n="$(date +%s.%N)" \
    'BEGIN { printf "%d", b - (n - s) }')"
  ((left >= 20)) || return 1
  echo $(($1 < left ? $1 : left))
}
# phase_skips: the open phase did not run for want of time (not a failure).
phase_skips() { note "skipped: the check's time budget is spent (LOOM_GPU_BUDGET)"; PHASE_SKIPPED=1; }

# results.md, rewritten after every phase so that a run stopped at its time limit still reports.
write_results() {
  {
    printf '# loom GPU check%s\n\n' "$( ((DRY_RUN)) && echo ' (dry run: no GPU; trainings shrunk to CPU)')"
    printf '%s, %s s so far, %s. Logs: gpu_check.log (all), configure.log, build.log, tests.log, ' \
      "$(date -u +%FT%TZ)" "$(seconds_since "$CHECK_START")" \
      "$( ((OVERALL)) && echo "**some phases FAILED**" || echo "no failure so far")"
    printf 'train.log; every logged step in metrics.jsonl.\n\n| phase | status | seconds | notes |\n'
    printf '| --- | --- | --- | --- |\n'
    awk -F'\t' '{ printf "| %s | %s | %s | %s |\n", $1, $2, $3, $4 }' "$WORK/phases.tsv"
  } > "$OUT/results.md"
  if [[ -s "$OUT/metrics.jsonl" ]]; then
    "$PYTHON" "$ROOT/tools/gpu_check_report.py" summary "$OUT/metrics.jsonl" >> "$OUT/results.md" 2>&1
  fi
  # What training.sdpa_backend = fastest measured, one line per attention shape (train.log).
  if grep -qE 'attention \[[0-9]' "$OUT/train.log" 2>/dev/null; then
    printf '\n## Attention kernels measured per shape (training.sdpa_backend = fastest)\n\n'
    grep -oE 'attention \[[0-9].*' "$OUT/train.log" | sort -u | sed 's/^/- /'
  fi >> "$OUT/results.md"
}

finish() {
  ((PHASE_OPEN)) && phase_end
  check_outputs
  write_results
  printf '\n=== done in %s s: %s; %s\n' "$(seconds_since "$CHECK_START")" \
    "$( ((OVERALL)) && echo "SOME PHASES FAILED" || echo "every phase ok")$(skipped_phases)" \
    "$OUT/results.md"
  exit "$OVERALL"
}

skipped_phases() {
  local n
  n="$(awk -F'\t' '$2 == "skipped"' "$WORK/phases.tsv" 2>/dev/null | wc -l)"
  ((n == 0)) || echo " ($n skipped for want of time: LOOM_GPU_RUNS picks them for a rerun)"
}

# The device tool returns at most 8 files of $OUT, 16 MiB each, no more than 2 folders down.
check_outputs() {
  phase "outputs"
  local files
  files="$(find "$OUT" -type f | wc -l)"
  note "$files files, $(du -sh "$OUT" | cut -f1)"
  ((files <= 8)) || phase_fails "$files files in \$OUT: the device tool returns 8"
  [[ -z "$(find "$OUT" -mindepth 1 -type d)" ]] || phase_fails "folders in \$OUT"
  [[ -z "$(find "$OUT" -type f -size +15M)" ]] || phase_fails "a file in \$OUT over 15 MiB"
  phase_end
}

# ------------------------------------------------------------------------------ toolchain, carry
# cmake, ninja and a compiler are in the image; nvcc (for Torch's CMake config) is looked for on
# PATH, in the usual folders, and in the toolkit PyPI's nvidia packages put next to torch.
find_build_tools() {
  local tool missing=0 candidate
  for tool in cmake ninja c++; do
    command -v "$tool" > /dev/null || { echo "  missing: $tool"; missing=1; }
  done
  ((missing == 0)) || return 1
  echo "  $(cmake --version | head -1); ninja $(ninja --version); $(c++ --version | head -1)"
  if ! command -v nvcc > /dev/null; then
    while IFS= read -r candidate; do
      if [[ -n "$candidate" && -x "$candidate/bin/nvcc" ]]; then
        export CUDAToolkit_ROOT="$candidate" CUDA_HOME="$candidate" PATH="$candidate/bin:$PATH"
        echo "  no nvcc on PATH: using the toolkit in $candidate"
        break
      fi
    done < <(printf '%s\n' /usr/local/cuda /usr/local/cuda-13.0
             "$PYTHON" -c 'import nvidia; print("\n".join(p + "/cu13" for p in nvidia.__path__))' \
               2> /dev/null)
  fi
  command -v nvcc > /dev/null || { echo "  no nvcc: Torch's CMake config needs a CUDA toolkit"; return 1; }
  CUDA_ROOT="$(dirname "$(dirname "$(command -v nvcc)")")"
  echo "  nvcc: $(command -v nvcc) ($(nvcc --version | grep -o 'release [0-9.]*'))"
}

# .gpu_carry/manifest (tools/prepare_gpu_carry.sh) names the prefix, library folder and zlib.
read_carry_manifest() {
  local manifest="$CARRY/manifest" path
  [[ -f "$manifest" ]] || {
    echo "  no $manifest: run tools/prepare_gpu_carry.sh here and carry .gpu_carry"
    return 1
  }
  CARRY_PREFIX="$CARRY/$(sed -n 's/^prefix=//p' "$manifest")"
  CARRY_LIBDIR="$CARRY/$(sed -n 's/^libdir=//p' "$manifest")"
  CARRY_ZLIB="$CARRY/$(sed -n 's/^zlib=//p' "$manifest")"
  for path in "$CARRY_PREFIX/include" "$CARRY_LIBDIR" "$CARRY_ZLIB"; do
    [[ -e "$path" ]] || { echo "  the carry lacks $path"; return 1; }
  done
  echo "  carry: $(grep -c '^package=' "$manifest") Debian packages; libraries in $CARRY_LIBDIR"
  export LD_LIBRARY_PATH="$CARRY_LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}

# Dry run, in a private mount namespace: this machine's copies of what the carry provides (the
# -dev packages' headers, libraries and CMake packages) and the CUDA toolkit's nccl.h are hidden,
# as on the GPU machine, which has none of them.
hide_host_extras() {
  if [[ -z "${LOOM_GPU_CHECK_NAMESPACE:-}" ]]; then
    note "this machine's packages are NOT hidden (needs root and unshare -m); environment cleared"
    return
  fi
  local entry host hidden=0 error_header="$WORK/hidden_header.h"
  echo '#error "hidden by tools/gpu_check.sh --dry-run: the GPU machine lacks this header"' \
    > "$error_header"
  for entry in "$CARRY_PREFIX"/include/* "$CARRY_LIBDIR"/* "$CARRY_LIBDIR"/cmake/* \
               "$CARRY_PREFIX"/share/cmake/*; do
    host="/${entry#"$CARRY/root/"}"
    case "${host##*/}" in
      cmake | pkgconfig | libpcre2-8.so.0* | libz.so.1*) continue ;;  # folders; grep's runtime
    esac
    [[ -e "$host" ]] || continue
    if [[ -d "$host" ]]; then
      mount -t tmpfs none "$host"
    elif [[ "$host" == /usr/include/* ]]; then
      mount --bind "$error_header" "$host"
    else
      mount --bind /dev/null "$host"  # a library: "file format not recognized", "file too short"
    fi && hidden=$((hidden + 1))
  done
  note "hid $hidden of this machine's files and folders that the carry provides"
  # Proof: the compiler's default folders no longer hold them.
  local header
  for header in fmt/core.h spdlog/spdlog.h nlohmann/json.hpp toml++/toml.h CLI/CLI.hpp zlib.h; do
    if printf '#include <%s>\n' "$header" | c++ -fsyntax-only -x c++ - 2> /dev/null; then
      phase_fails "<$header> is still visible"
    fi
  done
  # nccl.h: in every folder where this machine's toolkit or compiler would find a copy.
  local folder seen=" "
  for folder in "$CUDA_ROOT/include" /usr/local/cuda*/include /usr/local/include /usr/include; do
    folder="$(realpath -q "$folder")" || continue
    [[ "$seen" != *" $folder "* ]] && compgen -G "$folder/nccl*" > /dev/null || continue
    seen+="$folder "
    hide_nccl_in "$folder"
  done
  if printf '#include <nccl.h>\n' | c++ -fsyntax-only -x c++ -isystem "$CUDA_ROOT/include" \
       -isystem /usr/local/cuda/include - 2> /dev/null; then
    phase_fails "<nccl.h> is still visible outside the torch wheel"
  fi
}

# Bind over `folder` a folder of links to everything in it but nccl*. (The real folder stays
# mounted under $WORK/hidden while the namespace lives: never delete $WORK from inside it.)
hide_nccl_in() {
  local folder="$1" file
  local real="$WORK/hidden/${1//\//_}" shadow="$WORK/shadow/${1//\//_}"
  mkdir -p "$real" "$shadow"
  mount --bind "$folder" "$real"
  for file in "$real"/*; do
    [[ "${file##*/}" == nccl* ]] || ln -s "$file" "$shadow/"
  done
  mount --bind "$shadow" "$folder" && note "hid nccl.h in $folder"
}

# ------------------------------------------------------------------------------ configure
configure_loom() {
  local torch_prefix dir package_dirs=()
  torch_prefix="$("$PYTHON" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')" || return 1
  # The carried CMake packages by name (fmt_DIR=...), not by the multiarch search layout.
  for dir in "$CARRY_LIBDIR"/cmake/* "$CARRY_PREFIX"/share/cmake/*; do
    package_dirs+=("-D${dir##*/}_DIR=$dir")
  done
  rm -f "$BUILD/CMakeCache.txt"
  set -x
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOOM_USE_CCACHE=OFF \
    -DLOOM_PYTHON="$PYTHON" -DCMAKE_PREFIX_PATH="$torch_prefix;$CARRY_PREFIX" \
    -DCMAKE_INCLUDE_PATH="$CARRY_PREFIX/include" -DCMAKE_LIBRARY_PATH="$CARRY_LIBDIR" \
    -DZLIB_INCLUDE_DIR="$CARRY_PREFIX/include" -DZLIB_LIBRARY="$CARRY_ZLIB" "${package_dirs[@]}" \
    ${LOOM_GPU_CMAKE_ARGS:-}
  { local rc=$?; set +x; } 2> /dev/null
  return $rc
}

# Where each dependency was found; all but LibTorch and NCCL must come from the carry.
report_dependencies() {
  local cache="$BUILD/CMakeCache.txt" line key value
  [[ -f "$cache" ]] || return
  while IFS= read -r line; do
    key="${line%%:*}" value="${line#*=}"
    echo "  $key = $value"
    case "$key" in
      LOOM_WITH_CUDA) [[ "$value" == ON ]] || phase_fails "LibTorch without CUDA" ;;
      LOOM_NCCL_INCLUDE_DIR) note "nccl.h from $value" ;;
      LOOM_WITH_NCCL) ;;
      *) [[ "$value" == "$CARRY"/* ]] || phase_fails "$key is not from the carry: $value" ;;
    esac
  done < <(grep -E '^((fmt|spdlog|nlohmann_json|tomlplusplus|CLI11|GTest)_DIR|ZLIB_LIBRARY|LOOM_JEMALLOC_ARCHIVE|LOOM_PCRE2_(LIBRARY|INCLUDE_DIR)|LOOM_NCCL_INCLUDE_DIR|LOOM_WITH_(CUDA|NCCL)):' "$cache")
}

# ------------------------------------------------------------------------------ checks on the GPU
# More local ranks than GPUs with training.device = cuda must be refused at start, never hang.
check_more_ranks_than_gpus() {
  local gpus ranks rc expected log="$WORK/device_check.log"
  gpus="$("$PYTHON" -c 'import torch; print(torch.cuda.device_count())')" || { phase_fails; return; }
  ranks=$((gpus + 1))
  ((ranks >= 2)) || ranks=2  # the dry run (no GPU) still starts several ranks
  expected="local ranks and sees $gpus GPU"
  ((gpus > 0)) || expected="no CUDA device is available"
  timeout 90 "$LOOM" launch --nproc-per-node "$ranks" -- train --training.device cuda \
    --training.dataset synthetic --training.steps 1 --job.dump_folder "$WORK/device_check" \
    > "$log" 2>&1
  rc=$?
  { echo "\$ loom launch --nproc-per-node $ranks -- train --training.device cuda ..."; cat "$log"; } \
    >> "$OUT/train.log"
  if ((rc == 124)); then
    phase_fails "$ranks ranks on $gpus GPU(s): no answer in 90 s (a hang)"
  elif ((rc == 0)); then
    phase_fails "$ranks ranks on $gpus GPU(s) trained instead of being refused"
  elif ! grep -q "$expected" "$log"; then
    tail -5 "$log"
    phase_fails "$ranks ranks on $gpus GPU(s): exit $rc without '$expected'"
  else
    note "$ranks ranks on $gpus GPU(s) refused at start in $(seconds_since "$PHASE_START") s (exit $rc)"
  fi
}

# run_training NAME FLAVOR BATCH SEQ STEPS [overrides...]: a timed training on the GPU. The dry
# run validates that exact config, then trains the debug model for a few CPU steps with the same
# overrides.
# Fails the phase for a timed run's exit status RC under `timeout LIMIT` (124: it ran out).
check_run_status() {
  local rc="$1" limit="$2"
  if ((rc == 124)); then
    phase_fails "stopped after $limit s"
  elif ((rc != 0)); then
    tail -5 "$OUT/train.log"
    phase_fails "exit $rc (train.log)"
  fi
}

run_training() {
  local name="$1" flavor="$2" batch="$3" seq="$4" steps="$5"
  shift 5
  # LOOM_GPU_RUNS (an extended regex) picks trainings by name: a rerun of the ones that failed.
  if [[ -n "${LOOM_GPU_RUNS:-}" ]] && ! grep -qE "$LOOM_GPU_RUNS" <<< "$name"; then return 0; fi
  local dump="$WORK/train_${name//[^A-Za-z0-9]/_}"
  local common=(--training.dataset synthetic --debug.seed 0 --activation_checkpoint.mode none
                --validation.enable false --checkpoint.enable false --job.dump_folder "$dump" "$@")
  local size=(--training.device cuda --model.flavor "$flavor" --training.local_batch_size "$batch"
              --training.seq_len "$seq" --training.steps "$steps" --metrics.log_freq 5)
  phase "train $name"
  local limit
  limit="$(run_limit "$TRAIN_TIMEOUT")" || { phase_skips; phase_end; return 0; }
  if ((DRY_RUN)); then
    "$LOOM" config validate "${size[@]}" "${common[@]}" >> "$OUT/train.log" 2>&1 \
      || phase_fails "the GPU run's config is invalid (train.log)"
    size=(--training.device cpu --model.flavor "${DRY_FLAVOR:-debugmodel}" --training.local_batch_size 2
          --training.seq_len 64 --training.steps 4 --metrics.log_freq 2)
  fi
  echo "\$ loom train ${size[*]} ${common[*]}" >> "$OUT/train.log"
  timeout "$limit" "$LOOM" train "${size[@]}" "${common[@]}" >> "$OUT/train.log" 2>&1
  check_run_status $? "$limit"
  "$PYTHON" "$ROOT/tools/gpu_check_report.py" collect "$name" "$dump/metrics.jsonl" \
    >> "$OUT/metrics.jsonl" || phase_fails "no metrics"
  tail -1 "$OUT/metrics.jsonl" | cut -c1-200
  phase_end
}

# The same model, batch and synthetic-token count through PyTorch on the same GPU, right after
# loom's run (tools/reference/llama_reference.py bench: float32 parameters, bfloat16 autocast,
# fused AdamW, clipping; `--compile` for torch.compile): its tokens/s and peak memory land in the
# report beside loom's, with the ratios (gpu_check_report.py).
run_reference() {
  local name="$1" flavor="$2" batch="$3" seq="$4" steps="$5" limit="$TRAIN_TIMEOUT"
  shift 5
  if [[ -n "${LOOM_GPU_RUNS:-}" ]] && ! grep -qE "$LOOM_GPU_RUNS" <<< "$name"; then return 0; fi
  local size=(--device cuda --bf16 --flavor "$flavor" --batch-size "$batch" --seq-len "$seq"
              --steps "$steps" --warmup 3)
  [[ " $* " == *" --compile "* ]] && limit=$((2 * TRAIN_TIMEOUT))  # compiling takes a while
  phase "reference $name"
  limit="$(run_limit "$limit")" || { phase_skips; phase_end; return 0; }
  if ((DRY_RUN)); then
    size=(--device cpu --flavor "${DRY_FLAVOR:-debugmodel}" --batch-size 2 --seq-len 64 --steps 2
          --warmup 1)
  fi
  local result="$WORK/reference_${name//[^A-Za-z0-9]/_}.json"
  echo "\$ llama_reference.py bench ${size[*]} $*" >> "$OUT/train.log"
  timeout "$limit" "$PYTHON" "$ROOT/tools/reference/llama_reference.py" bench "${size[@]}" \
    --threads "$JOBS" --json "$result" "$@" >> "$OUT/train.log" 2>&1
  check_run_status $? "$limit"
  "$PYTHON" "$ROOT/tools/gpu_check_report.py" reference "$name" "$result" >> "$OUT/metrics.jsonl" \
    || phase_fails "no result"
  tail -1 "$OUT/metrics.jsonl" | cut -c1-200
  phase_end
}

# torchtitan itself (tools/reference/torchtitan_bench.py) on the same model, batch and synthetic
# tokens, right after loom's run: its Trainer, its per-block torch.compile with --compile, AMP
# on one device, fused AdamW. torchtitan and the packages the image lacks come as wheels in the
# carry (tools/prepare_gpu_carry.sh), unpacked once into $WORK/torchtitan_site for this Python.
TORCHTITAN_SITE=""
torchtitan_site() {
  [[ -n "$TORCHTITAN_SITE" ]] && return 0
  local wheels="$CARRY/$(sed -n 's/^wheels=//p' "$CARRY/manifest" 2>/dev/null)"
  if [[ "$wheels" == "$CARRY/" || ! -d "$wheels" ]]; then
    echo "  the carry has no wheels: run tools/prepare_gpu_carry.sh again"
    return 1
  fi
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --target "$WORK/torchtitan_site" --find-links "$wheels" torchtitan torchdata tyro \
    docstring-parser typeguard datasets dill multiprocess >> "$OUT/train.log" 2>&1 || {
    tail -5 "$OUT/train.log"
    return 1
  }
  TORCHTITAN_SITE="$WORK/torchtitan_site"
}

# run_torchtitan NAME FLAVOR BATCH SEQ STEPS [--compile]
run_torchtitan() {
  local name="$1" flavor="$2" batch="$3" seq="$4" steps="$5" limit="$TRAIN_TIMEOUT"
  shift 5
  if [[ -n "${LOOM_GPU_RUNS:-}" ]] && ! grep -qE "$LOOM_GPU_RUNS" <<< "$name"; then return 0; fi
  local size=(--device cuda --flavor "$flavor" --batch-size "$batch" --seq-len "$seq"
              --steps "$steps" --warmup 3)
  [[ " $* " == *" --compile "* ]] && limit=$((2 * TRAIN_TIMEOUT))
  phase "torchtitan $name"
  limit="$(run_limit "$limit")" || { phase_skips; phase_end; return 0; }
  if ((DRY_RUN)); then
    size=(--device cpu --flavor "${DRY_FLAVOR:-debugmodel}" --batch-size 2 --seq-len 64 --steps 2
          --warmup 1)
  fi
  if ! torchtitan_site; then
    phase_fails "torchtitan is not available (train.log)"
    phase_end
    return 0
  fi
  local result="$WORK/torchtitan_${name//[^A-Za-z0-9]/_}.json"
  echo "\$ torchtitan_bench.py ${size[*]} $*" >> "$OUT/train.log"
  timeout "$limit" "$PYTHON" "$ROOT/tools/reference/torchtitan_bench.py" --site "$TORCHTITAN_SITE" \
    "${size[@]}" --json "$result" "$@" >> "$OUT/train.log" 2>&1
  check_run_status $? "$limit"
  "$PYTHON" "$ROOT/tools/gpu_check_report.py" reference "$name" "$result" >> "$OUT/metrics.jsonl" \
    || phase_fails "no result"
  tail -1 "$OUT/metrics.jsonl" | cut -c1-200
  phase_end
}

# The layouts on one GPU (issue 49): every rank of a layout on cuda:0, where NCCL takes one rank
# per GPU, so the collectives of CUDA tensors go through host memory over Gloo
# (CommOptions::cuda_through_host); each layout's float32 losses must equal the one-rank run's
# within 1e-5 relative at every step (the phase fails otherwise). Qwen3-MoE's debug model covers
# attention, MoE routing and the experts' all-to-all. The dry run runs the same commands on CPU.
ONE_GPU_BASE="one GPU: one rank"

# run_layout_on_one_gpu NAME RANKS [overrides...]
ONE_GPU_BASE_RAN=0
run_layout_on_one_gpu() {
  local name="one GPU: $1" ranks="$2" device=cuda:0
  shift 2
  if [[ -n "${LOOM_GPU_RUNS:-}" ]] && ! grep -qE "$LOOM_GPU_RUNS" <<< "$name"; then return 0; fi
  # A layout is compared with the one-rank run: run that first where the filter left it out.
  if [[ "$name" == "$ONE_GPU_BASE" ]]; then
    ONE_GPU_BASE_RAN=1
  elif ((!ONE_GPU_BASE_RAN)); then
    LOOM_GPU_RUNS= run_layout_on_one_gpu "one rank" 1
  fi
  local dump="$WORK/layout_${name//[^A-Za-z0-9]/_}"
  local layout_job=(--config "$ROOT/configs/qwen3_moe_debug.toml" --training.dataset synthetic
              --training.steps 10 --training.seq_len 64 --training.local_batch_size 4
              --training.global_batch_size 4 --parallelism.pipeline_parallel_microbatch_size 1
              --training.mixed_precision_param float32 --validation.enable false
              --checkpoint.enable false --metrics.log_freq 1 --debug.seed 13
              --comm.init_timeout_seconds 60 --comm.train_timeout_seconds 60)
  phase "$name"
  local limit
  limit="$(run_limit "$TRAIN_TIMEOUT")" || { phase_skips; phase_end; return 0; }
  if ((DRY_RUN)); then  # the GPU's exact command must be valid; then the same job on CPU
    "$LOOM" config validate "${layout_job[@]}" --training.device cuda:0 --world-size "$ranks" \
      "$@" >> "$OUT/train.log" 2>&1 || phase_fails "the GPU run's config is invalid (train.log)"
    device=cpu
  fi
  local command=(train "${layout_job[@]}" --training.device "$device" --job.dump_folder "$dump" "$@")
  ((ranks > 1)) && command=(launch --nproc-per-node "$ranks" -- "${command[@]}")
  echo "\$ loom ${command[*]}" >> "$OUT/train.log"
  timeout "$limit" "$LOOM" "${command[@]}" >> "$OUT/train.log" 2>&1
  check_run_status $? "$limit"
  "$PYTHON" "$ROOT/tools/gpu_check_report.py" collect "$name" "$dump/metrics.jsonl" \
    >> "$OUT/metrics.jsonl" || phase_fails "no metrics"
  if [[ "$name" != "$ONE_GPU_BASE" ]]; then
    "$PYTHON" "$ROOT/tools/gpu_check_report.py" same-losses "$name" "$ONE_GPU_BASE" \
      "$OUT/metrics.jsonl" 1e-5 || phase_fails "losses differ from one rank's"
  fi
  phase_end
}
