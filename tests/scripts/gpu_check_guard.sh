#!/usr/bin/env bash
# Guard of tools/gpu_check.sh in the default suite: a build tree holding only the targets the GPU
# check builds must register the tests its phases run. It configures a fresh tree (no build,
# ~10 s), puts this build's copies of those targets' files into it, and asks ctest what the
# check's phases would ask. A registration that needs another binary to be built, a target the
# check names that no longer exists, or a phase whose selection matches nothing fails here
# instead of on a lent GPU.
#
#   gpu_check_guard.sh SOURCE_DIR BUILD_DIR PYTHON
set -euo pipefail
src="$1" build="$2" python="$3"
fail() { echo "gpu_check_guard: FAILED: $*" >&2; exit 1; }
# shellcheck source=../../tools/gpu_check_lib.sh
source "$src/tools/gpu_check_lib.sh"

tree="$(mktemp -d "${TMPDIR:-/tmp}/loom-gpu-guard.XXXXXX")"
trap 'rm -rf "$tree"' EXIT
cuda="$(sed -n 's/^LOOM_WITH_CUDA:BOOL=//p' "$build/CMakeCache.txt")"
cmake -S "$src" -B "$tree" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOOM_USE_CCACHE=OFF \
  -DLOOM_PYTHON="$python" > "$tree/configure.log" 2>&1 \
  || { tail -20 "$tree/configure.log"; fail "configuring a fresh tree"; }
[[ "$(sed -n 's/^LOOM_WITH_CUDA:BOOL=//p' "$tree/CMakeCache.txt")" == "$cuda" ]] \
  || fail "the fresh tree's LOOM_WITH_CUDA differs from $build's ($cuda)"

# "Build" exactly the check's targets: the files ninja makes for them, taken from this build.
mapfile -t targets < <(gpu_check_targets "$tree")
echo "the GPU check builds: ${targets[*]}"
[[ "$cuda" != ON ]] || [[ " ${targets[*]} " == *" loom_cuda_tests "* ]] \
  || fail "CUDA is on but the check does not build loom_cuda_tests"
for target in "${targets[@]}"; do
  query="$(ninja -C "$tree" -t query "$target" 2>&1)" || fail "no target '$target': $query"
  mapfile -t files < <(awk '/^  input: phony/ { take = 1; next } /^  [a-z]/ { take = 0 }
                             take && /^    / { print $1 }' <<< "$query")
  ((${#files[@]})) || fail "target '$target' names no file: $query"
  for file in "${files[@]}"; do
    [[ -e "$build/$file" ]] || fail "$build/$file is not built"
    mkdir -p "$(dirname "$tree/$file")"
    ln -s "$build/$file" "$tree/$file"
  done
done

# What the phases ask, as they ask it (tools/gpu_check.sh "python tools" and "cuda tests").
listing() { ctest --test-dir "$tree" -N "$@" 2> "$tree/ctest.err"; }
all="$(listing)" || { cat "$tree/ctest.err"; fail "ctest cannot read the tests of the tree"; }
[[ ! -s "$tree/ctest.err" ]] || { cat "$tree/ctest.err"; fail "ctest reported errors reading the tests"; }
echo "tests registered in the tree: $(grep -c 'Test *#' <<< "$all")"
python_tests="$(listing -R "$GPU_CHECK_PYTHON_TESTS" | grep -c 'Test *#' || true)"
((python_tests == 2)) || fail "the python tools phase selects $python_tests tests, not 2"
if [[ "$cuda" == ON ]]; then
  cuda_listing="$(listing -L "$GPU_CHECK_CUDA_LABEL")"
  ! grep -E '_(NOT_BUILT|LISTS_NO_TESTS)$' <<< "$cuda_listing" \
    || fail "the cuda tests phase selects placeholders of binaries the check does not build"
  cuda_tests="$(grep -c 'Test *#' <<< "$cuda_listing" || true)"
  ((cuda_tests > 0)) || fail "the cuda tests phase finds no test labelled $GPU_CHECK_CUDA_LABEL"
  echo "cuda tests registered: $cuda_tests"
else
  echo "LOOM_WITH_CUDA is off in $build: the cuda phase is not checked here"
fi
echo "ok: a tree with only the GPU check's targets registers what its phases run"
