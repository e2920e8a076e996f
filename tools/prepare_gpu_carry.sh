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
# Symbolic links inside the packages that would dangle there (e.g. libz.so -> /lib/.../libz.so.1)
# are made relative when their target is carried, and removed otherwise.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CARRY="${LOOM_GPU_CARRY:-$ROOT/.gpu_carry}"
# Headers and libraries of loom's dependencies (scripts/setup.sh APT_PACKAGES), with the runtime
# packages of those that are shared libraries. zlib1g-dev's libz.a is linked statically.
PACKAGES=(nlohmann-json3-dev libtomlplusplus-dev libtomlplusplus3 libspdlog-dev libspdlog1.10
          libfmt-dev libfmt9 libcli11-dev libgtest-dev libpcre2-dev libpcre2-8-0 zlib1g-dev
          libjemalloc-dev libjemalloc2 libzstd-dev libzstd1 libsentencepiece-dev libsentencepiece0
          libicu-dev libicu72)
# Arrow and Parquet come from the GPU machine's own pyarrow (cmake/LoomArrow.cmake asks
# LOOM_PYTHON), as LibTorch comes from its torch.

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
# library stays), sentencepiece's trainer, zstd's archive, jemalloc's non-PIC archive, the 16/32-
# bit and POSIX PCRE2 archives.
rm -f "$CARRY/root/usr/lib/$multiarch"/libicu*.a "$CARRY/root/usr/lib/$multiarch"/libsentencepiece_train* \
  "$CARRY/root/usr/lib/$multiarch"/libzstd.a "$CARRY/root/usr/lib/$multiarch"/libjemalloc.a \
  "$CARRY/root/usr/lib/$multiarch"/libpcre2-{16,32,posix}.a

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
              libjemalloc_pic.a libzstd.so libsentencepiece.so libicuuc.so libicui18n.so; do
  [[ -e "$libdir/$needed" ]] || die "$needed missing from $libdir"
done
[[ -e "$CARRY/root/usr/include/nlohmann/json.hpp" ]] || die "nlohmann/json.hpp missing"
printf '%s\n' "${manifest[@]}" > "$CARRY/manifest"
say "ready: $(du -sh "$CARRY" | cut -f1) in $CARRY (manifest: $CARRY/manifest)"
