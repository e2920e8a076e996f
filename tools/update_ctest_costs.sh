#!/usr/bin/env bash
# Refreshes tests/ctest_costs.txt, the per-test durations scripts/test.sh seeds a fresh build
# folder with (so ctest starts the long tests first), from a build folder whose ctest ran the
# default suite and the slow label: tools/update_ctest_costs.sh [BUILD_DIR]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${1:-$ROOT/build}"
costs="$BUILD_DIR/Testing/Temporary/CTestCostData.txt"
[[ -f "$costs" ]] || { echo "no $costs: run ctest in $BUILD_DIR first" >&2; exit 1; }
# "name runs seconds" lines up to the "---" that starts the failed-test list; one run each, the
# seconds rounded, the failed list dropped (a seed must not mark tests as failed).
awk '$0 == "---" { exit } NF == 3 { printf "%s 1 %.1f\n", $1, $3 }' "$costs" | sort \
  > "$ROOT/tests/ctest_costs.txt"
echo "---" >> "$ROOT/tests/ctest_costs.txt"
echo "wrote $ROOT/tests/ctest_costs.txt ($(grep -c ' 1 ' "$ROOT/tests/ctest_costs.txt") tests)"
