#!/usr/bin/env bash
# Regenerates the key tables of docs/config.md from the schema (everything after "## Keys"),
# keeping the hand-written introduction. Run after adding or changing a config key.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LOOM="${1:-$ROOT/build/bin/loom}"
DOC="$ROOT/docs/config.md"
intro="$(sed '/^## Keys$/q' "$DOC")"
{ printf '%s\n' "$intro"; "$LOOM" config docs; } > "$DOC.tmp"
mv "$DOC.tmp" "$DOC"
echo "updated $DOC"
