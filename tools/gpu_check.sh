#!/usr/bin/env bash
# The one prepared script for a lent GPU machine (see README "GPU check"). It builds loom there
# against that machine's own PyTorch, with the header packages carried in .gpu_carry/
# (tools/prepare_gpu_carry.sh), runs the CUDA-labelled tests, the rest of the suite and the
# benchmarks that exist, and writes everything under $OUT.
#
# Device tool call (from the repository root):
#   tools/prepare_gpu_carry.sh            # here, once
#   run(command="tools/gpu_check.sh", carry=[".gpu_carry"], timeout_s=540)
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-$ROOT/gpu_out}"
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_check.log") 2>&1
CARRY="$ROOT/.gpu_carry"
BUILD="$ROOT/build-gpu"
JOBS="$(nproc)"
status=0
step() { printf '\n=== %s (%s)\n' "$*" "$(date -u +%H:%M:%S)"; }
fail() { echo "FAILED: $*"; status=1; }

step "machine"
nvidia-smi | tee "$OUT/nvidia-smi.txt" || fail "nvidia-smi"
PYTHON="${PYTHON:-python3}"
"$PYTHON" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())' \
  || { fail "python3 cannot import torch"; exit 1; }
TORCH_PREFIX="$("$PYTHON" -c 'import torch; print(torch.utils.cmake_prefix_path)')"

step "build tools"
if ! command -v cmake >/dev/null || ! command -v ninja >/dev/null; then
  "$PYTHON" -m pip install --quiet --no-index --find-links "$CARRY/wheels" --target "$CARRY/pytools" cmake ninja \
    || fail "installing carried cmake/ninja wheels"
  export PATH="$CARRY/pytools/bin:$PATH"
  export PYTHONPATH="$CARRY/pytools${PYTHONPATH:+:$PYTHONPATH}"
fi
if ! "$PYTHON" -c 'import safetensors' 2>/dev/null; then
  "$PYTHON" -m pip install --quiet --no-index --find-links "$CARRY/wheels" --target "$CARRY/pylibs" safetensors \
    || fail "installing the carried safetensors wheel"
  export PYTHONPATH="$CARRY/pylibs${PYTHONPATH:+:$PYTHONPATH}"
fi
cmake --version | head -1; ninja --version; c++ --version | head -1
# Torch's CMake config needs a CUDA toolkit; without nvcc on PATH, try the usual places and the
# toolkit that PyPI's nvidia packages put next to torch.
if ! command -v nvcc >/dev/null; then
  for candidate in /usr/local/cuda /usr/local/cuda-13.0 \
      "$("$PYTHON" -c 'import nvidia, os; print(os.path.join(os.path.dirname(nvidia.__file__), "cu13"))' 2>/dev/null)"; do
    if [[ -n "$candidate" && -x "$candidate/bin/nvcc" ]]; then
      export CUDAToolkit_ROOT="$candidate" CUDA_HOME="$candidate" PATH="$candidate/bin:$PATH"
      break
    fi
  done
fi
command -v nvcc >/dev/null && nvcc --version | tail -1 || echo "warning: no nvcc found; Torch's CMake config may fail"
[[ -d "$CARRY/root/usr/include" ]] || { fail "no carried headers in $CARRY (run tools/prepare_gpu_carry.sh)"; exit 1; }

step "configure + build"
start=$(date +%s)
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOOM_USE_CCACHE=OFF \
  -DCMAKE_PREFIX_PATH="$TORCH_PREFIX;$CARRY/root/usr" -DGTEST_ROOT="$CARRY/root/usr" \
  -DLOOM_PYTHON="$(command -v "$PYTHON")" \
  > "$OUT/configure.log" 2>&1 || { tail -50 "$OUT/configure.log"; fail "configure"; exit 1; }
cmake --build "$BUILD" -j "$JOBS" > "$OUT/build.log" 2>&1 || { tail -80 "$OUT/build.log"; fail "build"; exit 1; }
echo "build took $(($(date +%s) - start)) s"
export LD_LIBRARY_PATH="$CARRY/root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
"$BUILD/bin/loom" --version | tee "$OUT/version.txt" || fail "loom --version"

step "CUDA tests"
ctest --test-dir "$BUILD" -L cuda --output-on-failure --no-tests=error --output-junit "$OUT/cuda_tests.xml" \
  || fail "cuda tests"

step "all other tests"
ctest --test-dir "$BUILD" -LE cuda --output-on-failure -j "$JOBS" --output-junit "$OUT/tests.xml" \
  || fail "tests"

step "benchmarks"
# Training on the GPU: bf16 autocast (training.mixed_precision_param), tokens/s and MFU from
# metrics.jsonl. The 100M flavor with long sequences, then the debug model.
for flavor in 100M debugmodel; do
  timeout 240 "$BUILD/bin/loom" train --model.flavor "$flavor" --training.dataset synthetic \
    --training.device cuda --training.local_batch_size 16 --training.seq_len 2048 \
    --training.steps 40 --metrics.log_freq 10 --debug.seed 0 --activation_checkpoint.mode none \
    --job.dump_folder "$OUT/train_${flavor}_cuda" || fail "cuda training ($flavor)"
  tail -1 "$OUT/train_${flavor}_cuda/metrics.jsonl" 2>/dev/null
done
# FSDP's code paths on the one GPU (debug.force_fsdp: a one-rank shard group), bf16 all-gather
# and compute, float32 masters and reduce-scatter.
timeout 240 "$BUILD/bin/loom" train --model.flavor 100M --training.dataset synthetic \
  --training.device cuda --training.local_batch_size 16 --training.seq_len 2048 \
  --training.steps 40 --metrics.log_freq 10 --debug.seed 0 --debug.force_fsdp true \
  --job.dump_folder "$OUT/train_100M_cuda_fsdp" || fail "cuda FSDP training (100M)"
tail -1 "$OUT/train_100M_cuda_fsdp/metrics.jsonl" 2>/dev/null
# Generation and evaluation on the GPU (docs/generate_eval.md): a short checkpoint, greedy tokens
# and eval loss in float32 on CUDA against the CPU, bfloat16 runs, and generation speed against
# transformers on CUDA.
GEN="$OUT/generate_cuda"
timeout 120 "$BUILD/bin/loom" train --config configs/llama3_debug.toml --training.device cuda \
  --training.steps 40 --training.seq_len 256 --validation.enable false --checkpoint.enable true \
  --checkpoint.interval 40 --metrics.peak_tflops 1 --job.dump_folder "$GEN" > "$GEN.train.log" 2>&1 \
  || fail "training the generation checkpoint"
for device in cpu cuda; do
  timeout 60 "$BUILD/bin/loom" generate --checkpoint "$GEN" --device "$device" --format json \
    --prompt "The jury said" --max-new-tokens 40 > "$GEN.greedy_$device.jsonl" || fail "generate $device"
  timeout 120 "$BUILD/bin/loom" eval --checkpoint "$GEN" --device "$device" --dataset brown_validation \
    --seq-len 256 > "$GEN.eval_$device.json" || fail "eval $device"
done
cmp -s "$GEN.greedy_cpu.jsonl" "$GEN.greedy_cuda.jsonl" && echo "greedy tokens: CUDA == CPU" \
  || echo "greedy tokens differ between CUDA and CPU (float32 kernels differ; see $GEN.greedy_*.jsonl)"
cat "$GEN.eval_cpu.json" "$GEN.eval_cuda.json"
timeout 60 "$BUILD/bin/loom" generate --checkpoint "$GEN" --device cuda --dtype bfloat16 \
  --prompt "The jury said" --max-new-tokens 40 || fail "generate cuda bfloat16"
if "$PYTHON" -c 'import transformers' 2>/dev/null; then
  timeout 240 "$PYTHON" tools/bench_generate.py --loom "$BUILD/bin/loom" --device cuda --rounds 2 \
    --flavor 100M --json "$OUT/bench_generate_cuda.json" || fail "bench_generate.py (cuda)"
else
  echo "no transformers in $PYTHON: generation speed against transformers not measured"
fi
# CPU side-by-side with eager PyTorch (16 cores there).
"$PYTHON" tools/bench_train.py --loom "$BUILD/bin/loom" --python "$PYTHON" --rounds 2 --steps 6 \
  --json "$OUT/bench_train_cpu.json" || fail "bench_train.py"

step "done: status $status"
exit $status
