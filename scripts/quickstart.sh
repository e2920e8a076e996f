#!/usr/bin/env bash
# Setup, then the main job: train the debug Llama 3 (configs/llama3_debug.toml) on this machine.
# Extra arguments are config overrides, e.g. scripts/quickstart.sh --training.steps 20
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
say() { printf '\033[1m[quickstart]\033[0m %s\n' "$*"; }

scripts/setup.sh
LOOM=build/bin/loom
CONFIG=configs/llama3_debug.toml
# The effective dump folder (the config file's, or an override's); read the whole output first
# so no pipe closes early under pipefail.
EFFECTIVE="$("$LOOM" config show --config "$CONFIG" --format json "$@")"
DUMP="$(printf '%s\n' "$EFFECTIVE" | sed -n 's/^ *"dump_folder": "\(.*\)",\{0,1\}$/\1/p' | head -n 1)"

say "$LOOM --version"
"$LOOM" --version
say "$LOOM train --config $CONFIG $*"
rm -f "$DUMP/metrics.jsonl"
"$LOOM" train --config "$CONFIG" "$@"
say "effective config: $DUMP/config.toml"
say "metrics, one JSON line per logged step: $DUMP/metrics.jsonl"
