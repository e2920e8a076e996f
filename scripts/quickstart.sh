#!/usr/bin/env bash
# Setup, then the main job: the debug Llama 3 config.
# Until the trainer lands (see README "Status"), this shows and validates the effective config
# of the debug job and prints where a run would write its outputs.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
say() { printf '\033[1m[quickstart]\033[0m %s\n' "$*"; }

scripts/setup.sh
LOOM=build/bin/loom
CONFIG=configs/llama3_debug.toml

say "$LOOM --version"
"$LOOM" --version
say "$LOOM config validate --config $CONFIG"
"$LOOM" config validate --config "$CONFIG"
say "$LOOM config show --config $CONFIG $*"
"$LOOM" config show --config "$CONFIG" "$@"
say "the debug job writes to: $("$LOOM" config show --config "$CONFIG" --format json "$@" \
  | grep -m1 '"dump_folder"' | sed 's/.*: "\(.*\)".*/\1/')"
