#!/usr/bin/env bash
# Setup (idempotent), build, then the whole test suite through ctest.
# Tests labelled "cuda" need a GPU; on a machine without one they are excluded, and this script
# says so (tools/gpu_check.sh runs them on a GPU machine). Tests labelled "fuzz" (tools/fuzz.sh)
# are always excluded: run them with ctest -L fuzz; so are tests labelled "slow" (the longer
# layouts and resumes, docs/dev/state_and_next_steps.md): ctest -L slow.
#
# Extra arguments go to ctest, e.g. scripts/test.sh -R Config
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BUILD_DIR="${LOOM_BUILD_DIR:-build}"

say() { printf '\033[1m[test]\033[0m %s\n' "$*"; }

start=$(date +%s)
scripts/setup.sh
built=$(date +%s)

# The "fuzz" label (tools/fuzz.sh, minutes) and the "slow" label are never part of the default
# suite: ctest -L fuzz, ctest -L slow.
label_args=(-LE 'fuzz|slow')
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  say "GPU found: running every test but the fuzz label, the cuda label included"
else
  say "no GPU on this machine: excluding tests labelled 'cuda' (run tools/gpu_check.sh on a GPU machine)"
  label_args=(-LE 'cuda|fuzz|slow')
fi

# A fresh build folder holds no record of how long each test took, so ctest would start them in
# the order they were registered and a long one could start last; tests/ctest_costs.txt seeds
# that record (tools/update_ctest_costs.sh refreshes it; ctest keeps its own from then on).
costs="$BUILD_DIR/Testing/Temporary/CTestCostData.txt"
if [[ ! -f "$costs" ]]; then
  mkdir -p "$(dirname "$costs")"
  cp tests/ctest_costs.txt "$costs"
fi

# One test more than cores: about a third of the default suite's time is spent waiting
# (heartbeats, timeouts, process start-ups), and the extra test fills it. On 2 cores: 364 s at
# -j3, 410 s at -j2, 377 s at -j4 (2026-12-06, where a wall-clock test also failed).
jobs=$(( $(nproc) + 1 ))
say "running ctest in $BUILD_DIR ($jobs tests at a time)"
# No --repeat or retry flags: a flaky test must fail here, not pass on a second try.
ctest --test-dir "$BUILD_DIR" --output-on-failure --no-tests=error -j "$jobs" \
  "${label_args[@]}" "$@"
done=$(date +%s)
say "setup+build $((built - start)) s, tests $((done - built)) s"
