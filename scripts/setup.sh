#!/usr/bin/env bash
# Idempotent setup of a Debian 12 machine for loom: Debian packages, the project venv with the
# pinned torch wheel (LibTorch), CMake configure and a build into build/. A second run installs
# nothing and rebuilds incrementally.
#
# Environment:
#   LOOM_BUILD_TYPE   CMake build type (default Release)
#   LOOM_BUILD_DIR    build folder (default build)
#   LOOM_SKIP_BUILD=1 install only, do not configure or build
#   LOOM_CMAKE_ARGS   extra arguments for the CMake configure step
#   LOOM_PIP=1        install the Python packages with pip instead of uv
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

TORCH_VERSION="2.11.0"   # pinned: reproducible builds, and the version on the GPU machine
UV_VERSION="0.13.9"      # the installer of the Python packages (below)
# transformers: the Hugging Face export test (tests/python/test_hf_export.py).
# tools/reference speaks both safetensors serialize_file APIs (0.6's dicts, 0.8's TensorSpec, which
# the GPU machine has); CI pins 0.6.2 and the transformers that goes with it.
# pyarrow: its wheel ships Arrow/Parquet's C++ libraries and headers, which loom links for Parquet
# and Arrow datasets (as the torch wheel ships LibTorch). The data tests make their fixtures with
# pyarrow, zstandard, datasets (save_to_disk folders), sentencepiece and tokenizers; datasets
# is held to a huggingface-hub that transformers 4.57 accepts (<1.0).
PYTHON_PACKAGES=("safetensors==0.6.2" "transformers==4.57.1" "tensorboard==2.21.0"
  "pyarrow==26.0.1" "zstandard==0.25.0" "sentencepiece==0.2.3" "huggingface-hub==0.36.2"
  "datasets==5.0.1")
# tensorboard: reads loom's event files back in tests (EventAccumulator).
BUILD_TYPE="${LOOM_BUILD_TYPE:-Release}"
BUILD_DIR="${LOOM_BUILD_DIR:-build}"
APT_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git python3 python3-venv
  nlohmann-json3-dev libtomlplusplus-dev libspdlog-dev libfmt-dev libcli11-dev libgtest-dev
  zlib1g-dev libpcre2-dev libjemalloc-dev libprotobuf-dev protobuf-compiler librsvg2-bin tmux
  libzstd-dev libsentencepiece-dev libicu-dev libssl-dev
)

say() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }
die() { printf '\033[1;31m[setup] error:\033[0m %s\n' "$*" >&2; exit 1; }
trap 'die "failed at line $LINENO: $BASH_COMMAND"' ERR

# --- Debian packages ---------------------------------------------------------------------------
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done
if ((${#missing[@]})); then
  say "installing Debian packages: ${missing[*]}"
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || die "need root or sudo to install: ${missing[*]}"
    SUDO="sudo"
  fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq || die "apt-get update failed (network or apt sources?)"
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
    || die "apt-get install failed for: ${missing[*]}"
else
  say "Debian packages: all ${#APT_PACKAGES[@]} present"
fi

# --- Python venv with the pinned torch (LibTorch comes from its wheel) --------------------------
PYTHON="${LOOM_PYTHON:-python3}"
command -v "$PYTHON" >/dev/null || die "python3 not found"
if [[ ! -x .venv/bin/python ]]; then
  say "creating .venv with $($PYTHON --version 2>&1)"
  "$PYTHON" -m venv .venv || die "python3 -m venv failed (is python3-venv installed?)"
fi
# torch and the Python packages the tests and tools use next to it (golden reference,
# benchmarks), in one resolver run. uv (pinned, from PyPI) installs them: it fetches, unpacks and
# compiles the bytecode in parallel, 41 s against pip's 95 s for the same pins on 2 cores. The
# bytecode is compiled here because where PYTHONDONTWRITEBYTECODE is set (CI images), Python
# would otherwise compile torch and transformers again in every test process (~10 s each).
# LOOM_PIP=1, or a uv that cannot be installed, falls back to pip.
wanted=()
installed_torch="$(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || true)"
if [[ "${installed_torch%%+*}" != "$TORCH_VERSION" ]]; then
  say "installing torch==$TORCH_VERSION into .venv (was: ${installed_torch:-none}); a few GB on first run"
  wanted+=("torch==$TORCH_VERSION")
else
  say "torch $installed_torch present in .venv"
fi
for requirement in "${PYTHON_PACKAGES[@]}"; do
  name="${requirement%%==*}"; version="${requirement##*==}"
  have="$(.venv/bin/python -c "import importlib.metadata as m; print(m.version('$name'))" 2>/dev/null || true)"
  if [[ "$have" != "$version" ]]; then
    say "installing $requirement into .venv (was: ${have:-none})"
    wanted+=("$requirement")
  fi
done
pip_install() {
  .venv/bin/python -m pip install --quiet --disable-pip-version-check "$@"
}
if ((${#wanted[@]})); then
  installer=pip
  if [[ "${LOOM_PIP:-0}" != "1" ]]; then
    if [[ -x .venv/bin/uv && "$(.venv/bin/uv --version 2>/dev/null)" == "uv $UV_VERSION"* ]] \
       || pip_install "uv==$UV_VERSION"; then
      installer=uv
    else
      say "uv==$UV_VERSION could not be installed: installing with pip"
    fi
  fi
  if [[ "$installer" == uv ]]; then
    .venv/bin/uv pip install --quiet --compile-bytecode --python .venv/bin/python "${wanted[@]}" \
      || die "uv pip install ${wanted[*]} failed (LOOM_PIP=1 uses pip instead)"
  else
    pip_install "${wanted[@]}" || die "pip install ${wanted[*]} failed"
  fi
fi
.venv/bin/python - <<'PY' || die "the venv's torch or safetensors does not import"
import torch.utils
import safetensors
import pyarrow
PY

if [[ "${LOOM_SKIP_BUILD:-0}" == "1" ]]; then
  say "LOOM_SKIP_BUILD=1: not building"
  exit 0
fi

# --- Configure and build ------------------------------------------------------------------------
if [[ ! -f "$BUILD_DIR/build.ninja" ]] || ! grep -q "CMAKE_BUILD_TYPE:STRING=$BUILD_TYPE" "$BUILD_DIR/CMakeCache.txt"; then
  say "configuring $BUILD_DIR ($BUILD_TYPE)"
  mkdir -p "$BUILD_DIR"
  # shellcheck disable=SC2086
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE="$BUILD_TYPE" \
    -DLOOM_PYTHON="$ROOT/.venv/bin/python" ${LOOM_CMAKE_ARGS:-} >"$BUILD_DIR/configure.log" 2>&1 \
    || { tail -40 "$BUILD_DIR/configure.log" >&2; die "CMake configure failed (log: $BUILD_DIR/configure.log)"; }
fi
say "building $BUILD_DIR ($(nproc) jobs)"
start=$(date +%s)
cmake --build "$BUILD_DIR" -j "$(nproc)" || die "build failed"
say "build finished in $(($(date +%s) - start)) s: $BUILD_DIR/bin/loom"
