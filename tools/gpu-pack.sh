#!/usr/bin/env bash
# Builds the GPU machine's binaries here (nvcc, no GPU needed) and packs them for the device tool, so that device time
# goes to tests and measurements, not to builds: fp8moe, fp8moe-bench and every GPU test program, for sm_90a (the
# H200) unless CUDA_ARCHS says otherwise, debug info stripped, in one xz archive (the test programs share most of their
# bytes: ~650 MB of programs become ~18 MB). BASE=REV also builds that commit's fp8moe as build/base/fp8moe (the
# baseline of tools/gpu-measure.sh). Then, on the device (carry .carry/env.sh .carry/debs and the archive):
#   source .carry/env.sh; tar -xJf .carry/gpu-bins.tar.xz; SKIP_BUILD=1 tools/gpu-check.sh
#   source .carry/env.sh; tar -xJf .carry/gpu-bins.tar.xz; PART=decode BASE=build/base NEW=build tools/gpu-measure.sh
#   OUT_TAR=FILE (default .carry/gpu-bins.tar.xz), BUILD_DIR (default build/gpu-pack), TESTS=0 leaves the tests out.
set -euo pipefail
cd "$(dirname "$0")/.."
archs=${CUDA_ARCHS:--gencode=arch=compute_90a,code=sm_90a}
bdir=${BUILD_DIR:-build/gpu-pack}
out=${OUT_TAR:-.carry/gpu-bins.tar.xz}
jobs=$(nproc)
tests=()
[ "${TESTS:-1}" = 1 ] && mapfile -t tests < <(ls tests/gpu/test_*.c | sed "s|^tests|$bdir/tests|; s|\.c$||")
echo "gpu-pack: building in $bdir for $archs" >&2
make -j"$jobs" BUILD="$bdir" CUDA_ARCHS="$archs" all "${tests[@]}" >"$bdir.log" 2>&1 || { tail -20 "$bdir.log"; exit 1; }
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/build/tests/gpu"
strip --strip-debug -o "$stage/build/fp8moe" "$bdir/fp8moe"
strip --strip-debug -o "$stage/build/fp8moe-bench" "$bdir/fp8moe-bench"
for t in "${tests[@]}"; do strip --strip-debug -o "$stage/build/tests/gpu/$(basename "$t")" "$t"; done
if [ -n "${BASE:-}" ]; then
    # the baseline from its own sources and Makefile (tools/gpu-measure.sh runs build/base/fp8moe)
    src=$stage/base-src
    mkdir -p "$src" "$stage/build/base"
    git archive "$BASE" -- src include bench Makefile | tar -x -C "$src"
    make -C "$src" -j"$jobs" CUDA_ARCHS="$archs" all >"$bdir-base.log" 2>&1 || { tail -20 "$bdir-base.log"; exit 1; }
    strip --strip-debug -o "$stage/build/base/fp8moe" "$src/build/fp8moe"
    [ -x "$src/build/fp8moe-bench" ] && strip --strip-debug -o "$stage/build/base/fp8moe-bench" "$src/build/fp8moe-bench"
    rm -rf "$src"
fi
mkdir -p "$(dirname "$out")"
out=$(cd "$(dirname "$out")" && pwd)/$(basename "$out")
# the programs next to each other in one stream, so that xz's window finds what they share
# one xz thread: a single stream shares the programs' common bytes (29 programs: 10 MB at -9e -T1, 30 MB at -9 -T2)
(cd "$stage" && find build -type f | sort | tar -cf - -T - | xz -9e -T1 >"$out")
echo "gpu-pack: $out, $(du -h "$out" | cut -f1) ($(cd "$stage" && find build -type f | wc -l) programs; the device tool carries 64 MiB with the working tree)"
