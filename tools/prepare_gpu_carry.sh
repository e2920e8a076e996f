#!/usr/bin/env bash
# Prepares .gpu_carry/ (git-ignored) for a lent GPU machine, which has PyTorch but no package
# registries: the Debian header/library packages loom builds with, unpacked, plus the PyPI
# cmake and ninja wheels in case that machine lacks them, and safetensors for the golden tests. Pass it to the device tool as
# carry: [".gpu_carry"], then run tools/gpu_check.sh there.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CARRY="$ROOT/.gpu_carry"
PACKAGES=(nlohmann-json3-dev libtomlplusplus-dev libtomlplusplus3 libspdlog-dev libspdlog1.10
          libfmt-dev libfmt9 libcli11-dev libgtest-dev libpcre2-dev libpcre2-8-0 zlib1g-dev)

say() { printf '\033[1m[gpu-carry]\033[0m %s\n' "$*"; }
rm -rf "$CARRY"
mkdir -p "$CARRY/debs" "$CARRY/root" "$CARRY/wheels"
say "downloading Debian packages: ${PACKAGES[*]}"
(cd "$CARRY/debs" && apt-get download "${PACKAGES[@]}" >/dev/null) \
  || { echo "apt-get download failed (run apt-get update first?)" >&2; exit 1; }
for deb in "$CARRY"/debs/*.deb; do
  dpkg-deb -x "$deb" "$CARRY/root"
done
rm -rf "$CARRY/debs" "$CARRY/root/usr/share/doc" "$CARRY/root/usr/share/man"
say "downloading cmake and ninja wheels"
python3 -m pip download --quiet --only-binary=:all: --no-deps -d "$CARRY/wheels" cmake ninja \
  safetensors==0.6.2 || { echo "pip download of cmake/ninja/safetensors failed" >&2; exit 1; }
say "ready: $(du -sh "$CARRY" | cut -f1) in $CARRY"
