#!/usr/bin/env bash
# The one prepared check for a lent GPU machine (docs/build.md, "GPU check"): builds loom there
# against that machine's PyTorch with the packages carried in .gpu_carry/, runs the CUDA tests,
# the version-sensitive Python tools, a device-count check and timed trainings on the GPU, and
# leaves a compact report in $OUT. Every phase prints a timing line.
#
#   tools/prepare_gpu_carry.sh         here, once: .gpu_carry (Debian headers and libraries)
#   tools/gpu_check.sh --dry-run       here: every phase that can run without a GPU (see below)
#   device run: command="tools/gpu_check.sh", carry=[".gpu_carry"], timeout_s=540
#
# Options:
#   --dry-run    no GPU: hides this machine's copies of the carried packages and the CUDA
#                toolkit's nccl.h (a private mount namespace; needs root and unshare), clears
#                CPATH & co., sets CUDA_VISIBLE_DEVICES=, builds the same targets the same way,
#                validates every GPU training's exact config and runs it shrunk on the CPU.
#   --cpu-suite  also run the CPU test suite (with CUDA hidden); minutes, so off by default:
#                CI covers it.
# Environment: OUT (results; the device tool sets it; default gpu_out/, git-ignored),
#   PYTHON (python3 there; the dry run uses .venv/bin/python), LOOM_GPU_WORK (dump folders;
#   default a new folder in /tmp), LOOM_GPU_JOBS (default nproc), LOOM_GPU_TRAIN_TIMEOUT (120 s),
#   LOOM_GPU_RUNS (an extended regex: only the trainings whose names match, e.g. a rerun of
#   those that failed or were skipped), LOOM_GPU_BUDGET (seconds from the start within which the
#   trainings must end; default 500, none in the dry run: a run gets what is left, one with under
#   20 s left is skipped), LOOM_GPU_CMAKE_ARGS (extra configure arguments; default
#   -DLOOM_JEMALLOC=OFF: the lent machine's compiler links a static libstdc++ whose operator new
#   clashes with jemalloc's at link time, seen 2026-12-04).
#
# $OUT receives 7 flat files (the device tool returns at most 8): results.md (each phase's status
# and seconds, the training figures), gpu_check.log (everything printed), configure.log,
# build.log, tests.log, train.log and metrics.jsonl (every logged step of every training).
set -uo pipefail

DRY_RUN=0
CPU_SUITE=0
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY_RUN=1 ;;
    --cpu-suite) CPU_SUITE=1 ;;
    -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument '$arg' (see --help)" >&2; exit 2 ;;
  esac
done

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# The dry run hides this machine's extras inside a private mount namespace (run again in one).
if ((DRY_RUN)) && [[ -z "${LOOM_GPU_CHECK_NAMESPACE:-}" ]] && [[ "$(id -u)" == 0 ]] &&
  unshare -m --propagation private true 2>/dev/null; then
  LOOM_GPU_CHECK_NAMESPACE=1 exec unshare -m --propagation private "$0" "$@"
fi

source "$ROOT/tools/gpu_check_lib.sh"

CARRY="${LOOM_GPU_CARRY:-$ROOT/.gpu_carry}"
OUT="${OUT:-$ROOT/gpu_out}"
WORK="${LOOM_GPU_WORK:-$(mktemp -d /tmp/loom-gpu-check.XXXXXX)}"
JOBS="${LOOM_GPU_JOBS:-$(nproc)}"
export LOOM_GPU_CMAKE_ARGS="${LOOM_GPU_CMAKE_ARGS--DLOOM_JEMALLOC=OFF}"
TRAIN_TIMEOUT="${LOOM_GPU_TRAIN_TIMEOUT:-120}"
if ((DRY_RUN)); then
  BUILD="$ROOT/build-gpu-dry"
  PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
  export CUDA_VISIBLE_DEVICES=
else
  BUILD="$ROOT/build-gpu"
  PYTHON="${PYTHON:-python3}"
fi
mkdir -p "$OUT" "$WORK"
rm -f "$OUT"/{results.md,gpu_check.log,configure.log,build.log,tests.log,train.log,metrics.jsonl}
exec > >(tee "$OUT/gpu_check.log") 2>&1
# Only what this script passes explicitly may steer the build.
unset CPATH C_INCLUDE_PATH CPLUS_INCLUDE_PATH LIBRARY_PATH CMAKE_PREFIX_PATH CMAKE_INCLUDE_PATH \
  CMAKE_LIBRARY_PATH Torch_DIR NCCL_INCLUDE_DIR TORCH_CUDA_ARCH_LIST
echo "gpu_check.sh $([[ $DRY_RUN == 1 ]] && echo "--dry-run ")on $(uname -n), $(date -u +%FT%TZ)"
echo "out: $OUT   work: $WORK   build: $BUILD   jobs: $JOBS"

# ---------------------------------------------------------------------------------------------
phase "machine"
if ((DRY_RUN)); then
  note "dry run: no GPU (CUDA_VISIBLE_DEVICES=)"
  # Like a machine without nvcc on PATH: the toolkit must be found by find_build_tools.
  PATH="$(tr ':' '\n' <<< "$PATH" | while read -r dir; do [[ -x "$dir/nvcc" ]] || echo "$dir"; done \
    | paste -sd:)"
else
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv || phase_fails
fi
PYTHON="$(command -v "$PYTHON")" || { phase_fails "no Python '$PYTHON'"; finish; }
"$PYTHON" - <<'PY' || phase_fails "python cannot import torch"
import importlib.metadata as m, platform, torch
print(f"python {platform.python_version()}  torch {torch.__version__} (CUDA {torch.version.cuda}) "
      f"sees {torch.cuda.device_count()} GPU(s)")
for name in ("safetensors", "transformers"):
    try:
        print(f"{name} {m.version(name)}")
    except m.PackageNotFoundError:
        print(f"{name} not installed")
PY
phase_end

phase "toolchain"
find_build_tools || phase_fails
read_carry_manifest || phase_fails
((DRY_RUN)) && [[ ${#PHASE_FAILURES[@]} == 0 ]] && hide_host_extras
phase_end
[[ "$PHASE_STATUS_LAST" == ok ]] || finish

phase "configure"
configure_loom > "$OUT/configure.log" 2>&1 || { tail -40 "$OUT/configure.log"; phase_fails; }
report_dependencies
phase_end
[[ "$PHASE_STATUS_LAST" == ok ]] || finish

phase "build"
mapfile -t build_targets < <(gpu_check_targets "$BUILD")
note "targets: ${build_targets[*]} on $JOBS jobs"
cmake --build "$BUILD" -j "$JOBS" --target "${build_targets[@]}" > "$OUT/build.log" 2>&1 \
  || { grep -m 20 -B2 -A8 "error" "$OUT/build.log" | tail -80; phase_fails; }
phase_end
[[ "$PHASE_STATUS_LAST" == ok ]] || finish
LOOM="$BUILD/bin/loom"
"$LOOM" --version | sed 's/^/  /'

phase "python tools (CUDA hidden)"
# The PyTorch reference of the golden tests against this machine's safetensors (seconds; the
# transformers export test is CPU work and runs with --cpu-suite).
CUDA_VISIBLE_DEVICES= ctest --test-dir "$BUILD" --timeout 120 --output-on-failure \
  --no-tests=error -R "$GPU_CHECK_PYTHON_TESTS" >> "$OUT/tests.log" 2>&1 || phase_fails
tail -3 "$OUT/tests.log"
phase_end

phase "cuda tests"
if ((DRY_RUN)); then
  # Placeholders of binaries that are not built (cmake/LoomGTestSuites.cmake) are no tests.
  listed="$(ctest --test-dir "$BUILD" -L "$GPU_CHECK_CUDA_LABEL" -N \
    | grep 'Test *#' | grep -cvE '_(NOT_BUILT|LISTS_NO_TESTS)$' || true)"
  note "$listed CUDA tests registered (they run on the GPU only)"
  ((listed > 0)) || phase_fails "no CUDA tests registered"
else
  ctest --test-dir "$BUILD" -L "$GPU_CHECK_CUDA_LABEL" --timeout 120 --no-tests=error --output-on-failure \
    >> "$OUT/tests.log" 2>&1 || phase_fails
  grep -E "tests passed|tests failed|Failed|\*\*\*" "$OUT/tests.log" | tail -8
fi
phase_end

phase "device check"
check_more_ranks_than_gpus
phase_end

# In order of what a lent GPU must answer first (a check that runs out of its time budget skips
# the rest, LOOM_GPU_BUDGET): the side-by-side at 100M, loom's CUDA kernels, the 8B shape, every
# layout on one GPU, float8, then the other families and variants.
run_training "100M bf16" 100M 16 2048 40
run_reference "100M bf16 (PyTorch eager)" 100M 16 2048 20
run_reference "100M bf16 (torch.compile)" 100M 16 2048 20 --compile
run_torchtitan "100M bf16 (torchtitan)" 100M 16 2048 20
run_torchtitan "100M bf16 (torchtitan compile)" 100M 16 2048 20 --compile
# loom's CUDA kernels (opt-in until this check passes: docs/performance.md) against the runs
# without, losses step by step and tokens/s.
run_training "100M bf16 + cuda kernels" 100M 16 2048 40 --training.cuda_kernels true
# The whole step as one CUDA graph (training.cuda_graph, opt-in until this passes): losses step
# by step against the eager run, and the tokens/s ratio.
run_training "100M bf16 + cuda graph" 100M 16 2048 40 --training.cuda_graph true
# The replayed step's skip of a non-finite update (training.skip_nonfinite_steps: the flag from
# the all-reduced norm, read on the device): losses step by step against the graph run above.
run_training "100M bf16 + cuda graph + skip nonfinite" 100M 16 2048 40 \
  --training.cuda_graph true --training.skip_nonfinite_steps 2
run_training "8B_4layers bf16" 8B_4layers 2 4096 20
run_reference "8B_4layers bf16 (PyTorch eager)" 8B_4layers 2 4096 20
run_reference "8B_4layers bf16 (torch.compile)" 8B_4layers 2 4096 20 --compile
run_torchtitan "8B_4layers bf16 (torchtitan compile)" 8B_4layers 2 4096 20 --compile
run_training "8B_4layers bf16 + cuda kernels" 8B_4layers 2 4096 20 --training.cuda_kernels true
# Qwen3-MoE with 30B-A3B's layers (128 experts of width 768, 8 per token), two of them: the
# grouped expert GEMMs beside torchtitan's own Qwen3-MoE on the same shape and tokens, eager and
# compiled (its model is plain PyTorch with torch._grouped_mm: the MoE run's PyTorch reference,
# as llama_reference.py has no MoE).
DRY_FLAVOR=debugmodel_moe run_training "qwen3_moe 30B-A3B_2layers bf16" 30B-A3B_2layers 4 4096 20 \
  --model.name qwen3_moe
DRY_FLAVOR=debugmodel_moe run_torchtitan "qwen3_moe 30B-A3B_2layers bf16 (torchtitan)" \
  30B-A3B_2layers 4 4096 20 --model qwen3_moe
DRY_FLAVOR=debugmodel_moe run_torchtitan "qwen3_moe 30B-A3B_2layers bf16 (torchtitan compile)" \
  30B-A3B_2layers 4 4096 20 --model qwen3_moe --compile
# Every layout on the one GPU against one rank (collectives through the host, over Gloo).
run_layout_on_one_gpu "one rank" 1
run_layout_on_one_gpu "FSDP 2" 2 --parallelism.data_parallel_shard_degree 2 \
  --training.local_batch_size 2
run_layout_on_one_gpu "TP 2" 2 --parallelism.tensor_parallel_degree 2
run_layout_on_one_gpu "PP 2" 2 --parallelism.pipeline_parallel_degree 2 \
  --parallelism.pipeline_parallel_schedule 1F1B
# The split backward (input, then weight pass through one graph) with loom's kernels: the
# cross-entropy writes its gradient over the logits in the first pass and must serve the second.
run_layout_on_one_gpu "PP 2 zero bubble + cuda kernels" 2 --parallelism.pipeline_parallel_degree 2 \
  --parallelism.pipeline_parallel_schedule InterleavedZeroBubble --training.cuda_kernels true
run_layout_on_one_gpu "CP 2" 2 --parallelism.context_parallel_degree 2
run_layout_on_one_gpu "EP 2" 2 --parallelism.expert_parallel_degree 2 \
  --parallelism.data_parallel_shard_degree 2 --training.local_batch_size 2
# Float8 linears (issue 35), each recipe against the bf16 run above: tokens/s, MFU and peak
# memory side by side in the report (at::_scaled_mm on sm89+; emulated in the dry run).
run_training "8B_4layers float8 tensorwise" 8B_4layers 2 4096 20 --model.converters float8
run_training "8B_4layers float8 rowwise" 8B_4layers 2 4096 20 --model.converters float8 \
  --quantize.linear.float8.recipe_name rowwise
# DeepSeek-V3's blockwise recipe: the train log says whether the block-scaled kernel passed its
# check against the emulation (a "[float8] blockwise float8 GEMM" warning when it did not).
run_training "8B_4layers float8 blockwise" 8B_4layers 2 4096 20 --model.converters float8 \
  --quantize.linear.float8.recipe_name blockwise
run_training "8B_4layers float8 rowwise_with_gw_hp" 8B_4layers 2 4096 20 \
  --model.converters float8 --quantize.linear.float8.recipe_name rowwise_with_gw_hp
# LibTorch's own attention kernel order against the measured choice (training.sdpa_backend):
# the tokens/s ratio says what measuring bought at the 8B shape's 4096 tokens.
run_training "8B_4layers bf16 + libtorch attention" 8B_4layers 2 4096 20 \
  --training.sdpa_backend libtorch
run_training "100M FSDP" 100M 16 2048 40 --debug.force_fsdp true
# FSDP's hooks, gathered storage freed and taken again, and its gradient sync inside the recorded
# step (FSDP over a one-rank shard group): losses step by step and the tokens/s ratio against
# "100M FSDP". Several ranks' graphs need a GPU per rank (NCCL): not on this machine.
run_training "100M FSDP + cuda graph" 100M 16 2048 40 --debug.force_fsdp true \
  --training.cuda_graph true
run_training "100M FSDP float8 all-gather" 100M 16 2048 40 --debug.force_fsdp true \
  --model.converters float8 --quantize.linear.float8.enable_fsdp_float8_all_gather true \
  --quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp true
# Mixture of experts: the grouped GEMM on CUDA bf16 (sm90+), routing, the balancing bias.
DRY_FLAVOR=debugmodel_moe run_training "qwen3_moe debug bf16" debugmodel_moe 16 2048 40 \
  --model.name qwen3_moe
# The experts' float8 grouped GEMMs: at::_scaled_grouped_mm on sm90 after its self-check (a
# "[float8] float8 grouped GEMM" warning in train.log when the check refused it).
DRY_FLAVOR=debugmodel_moe run_training "qwen3_moe debug float8 grouped" debugmodel_moe 16 2048 40 \
  --model.name qwen3_moe --model.converters quantize.grouped_mm.float8
# DeepSeek-V3: latent attention (SDPA with a 192-wide q.k and a 128-wide value), sigmoid group
# routing, shared experts.
DRY_FLAVOR=debugmodel run_training "deepseek_v3 debug bf16" debugmodel 16 2048 40 \
  --model.name deepseek_v3
# The second family: Qwen3 0.6B (q/k norm, head_dim 128, tied 151936-token table).
run_training "qwen3 0.6B bf16" 0.6B 4 4096 20 --model.name qwen3
run_training "100M fp32" 100M 16 2048 40 --training.mixed_precision_param float32

if ((CPU_SUITE)); then
  phase "CPU suite (CUDA hidden)"
  cmake --build "$BUILD" -j "$JOBS" >> "$OUT/build.log" 2>&1 || phase_fails "building the tests"
  CUDA_VISIBLE_DEVICES= ctest --test-dir "$BUILD" -LE cuda -j "$JOBS" --timeout 300 \
    >> "$OUT/tests.log" 2>&1 || phase_fails
  tail -3 "$OUT/tests.log"
  phase_end
fi

finish
