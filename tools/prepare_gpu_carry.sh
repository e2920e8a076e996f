#!/usr/bin/env bash
# Prepares .gpu_carry/ (git-ignored) for a lent GPU machine, which has PyTorch, CMake, ninja, nvcc
# and a C++ compiler but no package registries and none of the Debian -dev packages loom builds
# with: those are downloaded here and unpacked under .gpu_carry/root. Pass it to the device tool
# as carry: [".gpu_carry"] and run tools/gpu_check.sh there (docs/build.md, "GPU check").
#
# .gpu_carry/manifest records what tools/gpu_check.sh needs to know, explicitly:
#   prefix=root/usr                        the CMake prefix holding the packages' config files
#   libdir=root/usr/lib/x86_64-linux-gnu   the folder of the carried libraries (CMake, loader)
#   zlib=root/usr/lib/.../libz.a           zlib is linked statically: its runtime is not carried
#   package=NAME VERSION                   one line per carried Debian package
#   wheels=wheels                          the Python wheels of the torchtitan runs (below)
# Symbolic links inside the packages that would dangle there (e.g. libz.so -> /lib/.../libz.so.1)
# are made relative when their target is carried, and removed otherwise.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CARRY="${LOOM_GPU_CARRY:-$ROOT/.gpu_carry}"
# Headers and libraries of loom's dependencies (scripts/setup.sh APT_PACKAGES), with the runtime
# packages of those that are shared libraries. zlib1g-dev's libz.a is linked statically.
PACKAGES=(nlohmann-json3-dev libtomlplusplus-dev libtomlplusplus3 libspdlog-dev libspdlog1.10
          libfmt-dev libfmt9 libcli11-dev libgtest-dev libpcre2-dev libpcre2-8-0 zlib1g-dev
          libzstd-dev libzstd1 libsentencepiece-dev libsentencepiece0 libicu-dev libicu72)
# Arrow and Parquet come from the GPU machine's own pyarrow (cmake/LoomArrow.cmake asks
# LOOM_PYTHON), as LibTorch comes from its torch. jemalloc is not carried: the check builds with
# -DLOOM_JEMALLOC=OFF (gpu_check.sh, LOOM_GPU_CMAKE_ARGS).
# torchtitan for the side-by-side runs (tools/reference/torchtitan_bench.py): 0.2.2, the newest
# release that runs on PyTorch 2.11 (0.3.0 imports torch.distributed.fsdp.DataParallelMeshDims,
# newer than 2.11), and the packages it imports that the GPU image lacks (KINDS.md). multiprocess
# is built per Python: the GPU machine's 3.12 and this machine's (the dry run).
WHEELS=(torchtitan==0.2.2 torchdata==0.11.0 tyro==1.0.17 docstring-parser==0.18.0
        typeguard==4.6.1 datasets==4.7.0 dill==0.4.0 multiprocess==0.70.18)
GPU_PYTHON=3.12
# The device tool carries the working tree and the carry together, 64 MiB at most.
CARRY_LIMIT_BYTES=$((64 * 1024 * 1024))

say() { printf '\033[1m[gpu-carry]\033[0m %s\n' "$*"; }
die() { printf '\033[1;31m[gpu-carry] error:\033[0m %s\n' "$*" >&2; exit 1; }

multiarch="$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)"
[[ "$multiarch" == x86_64-linux-gnu ]] || die "the GPU machine is x86-64; this machine is $multiarch"

rm -rf "$CARRY"
mkdir -p "$CARRY/debs" "$CARRY/root"
say "downloading Debian packages: ${PACKAGES[*]}"
(cd "$CARRY/debs" && apt-get download "${PACKAGES[@]}" >/dev/null) \
  || die "apt-get download failed (run apt-get update first?)"
manifest=("prefix=root/usr" "libdir=root/usr/lib/$multiarch" "zlib=root/usr/lib/$multiarch/libz.a")
for deb in "$CARRY"/debs/*.deb; do
  dpkg-deb -x "$deb" "$CARRY/root"
  manifest+=("package=$(dpkg-deb -f "$deb" Package) $(dpkg-deb -f "$deb" Version)")
done
rm -rf "$CARRY/debs" "$CARRY/root/usr/share/doc" "$CARRY/root/usr/share/man"
# Never linked, and the carry has 64 MiB in all: ICU's static archives (40 MB; its 30 MB data
# library stays), sentencepiece's trainer, zstd's archive, the 16/32-bit and POSIX PCRE2
# archives.
rm -f "$CARRY/root/usr/lib/$multiarch"/libicu*.a "$CARRY/root/usr/lib/$multiarch"/libsentencepiece_train* \
  "$CARRY/root/usr/lib/$multiarch"/libzstd.a "$CARRY/root/usr/lib/$multiarch"/libpcre2-{16,32,posix}.a

# Absolute links point into this machine's /; inside the carry they must stay inside it. Links
# to what is not carried (libz.so's runtime, pcre2's 16/32-bit libraries, googletest's sources)
# would dangle there and are removed.
while IFS= read -r link; do
  target="$(readlink "$link")"
  if [[ "$target" == /* && -e "$CARRY/root$target" ]]; then
    ln -sfn "$(realpath --relative-to="$(dirname "$link")" "$CARRY/root$target")" "$link"
  elif [[ "$target" == /* || ! -e "$link" ]]; then
    say "removing ${link#"$CARRY"/} -> $target (not carried)"
    rm "$link"
  fi
done < <(find "$CARRY/root" -type l)
[[ -z "$(find "$CARRY/root" -xtype l -o -lname '/*')" ]] || die "dangling or absolute links left"

libdir="$CARRY/root/usr/lib/$multiarch"
for needed in libz.a libspdlog.so libfmt.so libtomlplusplus.so libpcre2-8.so libgtest.a \
              libzstd.so libsentencepiece.so libicuuc.so libicui18n.so; do
  [[ -e "$libdir/$needed" ]] || die "$needed missing from $libdir"
done
[[ -e "$CARRY/root/usr/include/nlohmann/json.hpp" ]] || die "nlohmann/json.hpp missing"

PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
here_python="$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')" \
  || die "no Python at $PYTHON (scripts/setup.sh makes .venv)"
mkdir -p "$CARRY/wheels"
for version in $(printf '%s\n' "$GPU_PYTHON" "$here_python" | sort -u); do
  say "downloading wheels for Python $version: ${WHEELS[*]}"
  "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version "$version" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
    -d "$CARRY/wheels" "${WHEELS[@]}" || die "pip download failed (PyPI unreachable?)"
done
manifest+=("wheels=wheels")
printf '%s\n' "${manifest[@]}" > "$CARRY/manifest"

tree_bytes="$(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard \
  | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)"
carry_bytes="$(du -sb "$CARRY" | cut -f1)"
total=$((tree_bytes + carry_bytes))
say "ready: $((carry_bytes / 1048576)) MiB in $CARRY (manifest: $CARRY/manifest); with the working" \
  "tree $((total / 1048576)) MiB of the device tool's 64"
((total <= CARRY_LIMIT_BYTES)) || die "the working tree and the carry exceed the 64 MiB a call carries"
