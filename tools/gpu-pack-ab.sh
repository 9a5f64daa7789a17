#!/usr/bin/env bash
# Packs an A/B pair of GPU programs for one device call: the baseline's programs built from commit BASE (its own
# sources and Makefile, in a temporary worktree) under build/, and the working tree's (with PATCH applied to a copy
# of it, when given) under build/new/, for sm_90a unless CUDA_ARCHS says otherwise, debug info stripped, in one xz
# stream with a window that spans them (near-equal programs then cost little more than one: ~8 MB for two
# fp8moe-bench, a test program and the lab's w4a8_ws). Faster than tools/gpu-pack.sh, which packs every test.
#   BASE=80580b1 PATCH=lab/ws_epilogue_loads.patch OUT=.carry/gpu-ab.tar.xz \
#     tools/gpu-pack-ab.sh fp8moe-bench tests/gpu/test_cuda_fold lab/w4a8_ws
# Programs: make targets under the build directory (fp8moe, fp8moe-bench, tests/gpu/test_*), or lab/NAME (make -C
# lab NAME). BASE_PROGRAMS (default: the first program) are the ones built at BASE. On the device (carry
# .carry/env.sh, .carry/debs and the archive): source .carry/env.sh; tar -xJf .carry/gpu-ab.tar.xz.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
archs=${CUDA_ARCHS:--gencode=arch=compute_90a,code=sm_90a}
out=${OUT:-.carry/gpu-ab.tar.xz}
base_programs=${BASE_PROGRAMS:-$1}
jobs=$(nproc)
root=$PWD
work=$(mktemp -d)
trap 'git -C "$root" worktree remove --force "$work/base" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
mkdir -p "$work/stage/build/new"

# build PROGRAM in the tree at DIR, stripped into the stage at DEST. Every step returns its failure itself: the
# callers run it as `build_into ... || fail`, where set -e does not apply, and a failed make would otherwise pack
# the previous build's program.
build_into() {
    local dir=$1 prog=$2 dest=$3 bin
    if [[ $prog == lab/* ]]; then
        make -C "$dir/lab" -j"$jobs" CUDA_ARCHS="$archs" "${prog#lab/}" >>"$work/build.log" 2>&1 || return 1
        bin=$dir/build/lab/${prog#lab/}
    else
        make -C "$dir" -j"$jobs" BUILD=build/gpu-ab CUDA_ARCHS="$archs" "build/gpu-ab/$prog" >>"$work/build.log" 2>&1 ||
            return 1
        bin=$dir/build/gpu-ab/$prog
    fi
    strip --strip-debug -o "$dest/$(basename "$prog")" "$bin" || return 1
}

fail() { tail -20 "$work/build.log"; echo "gpu-pack-ab: $1" >&2; exit 1; }
if [ -n "${BASE:-}" ]; then
    git worktree add --detach "$work/base" "$BASE" >/dev/null 2>&1 || fail "no commit $BASE"
    for p in $base_programs; do build_into "$work/base" "$p" "$work/stage/build" || fail "$p at $BASE"; done
fi
new=$root
if [ -n "${PATCH:-}" ]; then # a copy of the working tree (tracked and untracked files, no build output) with it
    new=$work/new-src
    mkdir -p "$new"
    git ls-files -co --exclude-standard -z | xargs -0 cp --parents -t "$new"
    (cd "$new" && patch -s -p1 <"$root/$PATCH") || fail "$PATCH does not apply"
fi
for p in "$@"; do build_into "$new" "$p" "$work/stage/build/new" || fail "$p"; done
mkdir -p "$(dirname "$out")"
(cd "$work/stage" && find build -type f | sort | tar -cf - -T - | xz --lzma2=preset=6,dict=192MiB -T1) >"$out"
echo "gpu-pack-ab: $out, $(du -h "$out" | cut -f1): $(cd "$work/stage" && find build -type f | sort | tr '\n' ' ')"
