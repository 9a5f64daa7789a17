#!/bin/sh
# The ceiling of a W4A8 expert GEMM with no per-group promotion and no per-group wgmma wait, by timing alone:
# lab/w4a8_pipe_ceiling.patch adds to a COPY of the tree a template value PIPE of w4a8_wgmma_kernel (int4-tc banks,
# e4m3 activations, 64- and 32-row tiles, epilogues bf16 / SwiGLU / SwiGLU with token scales), chosen by
# FP8MOE_PIPE_EXP in that copy only (read once by the launcher):
#   0  today's kernel (the same PTX as the tree's: the control)
#   1  today's loop and wait per group, no promotion: part accumulates 4 groups, acc += part every 4 and at the end
#   2  no wait per group: 2 fragment sets (loop unrolled by 2), wgmmas straight into acc, wgmma_wait<1> before a set
#      is rewritten, the stage ring one slot longer and refilled only once every warp's wgmmas on it are complete
#   3  2 with part: wgmma_wait_all + acc += part every 4 groups (an fp8 accumulation's periodic promotion)
#   4  2 with one fragment set: each group's wgmmas in 2 commit groups (k steps 0-1, 2-3), wait<1> before each half's
#      fragments are rewritten (32 fragment registers, not 64: the form that fits 128 registers at 32-row tiles)
#   5  4 with part and a wait_all + FADD every 4 groups
#   6  4 on 128-row activation tiles (wgmma m64n128k32, 128 accumulator registers, one CTA per SM, the stages in
#      dynamic shared memory): each weight fragment converted once per 128 activation rows. Runs where the caller
#      tiles by 64 rows with the codes in registers (bf16 and SwiGLU epilogues): a CTA takes an even tile of an
#      expert's run and the next one of the same expert, an odd one returns at once. At T = 512 / 2048 the bench
#      tiles by 32 unless --route w4a8.tile=64 (PIPE_TILE=64); elsewhere mode 6 runs PIPE 0
#   7  6 with each warp's codes loaded two groups ahead (two word buffers, loop unrolled by 2): is the one-group-ahead
#      code load what bounds a group at 128 rows?
#   8  4's loop with four warpgroups (512 threads, __launch_bounds__(512, 1)), each owning ONE m64 block (rows 64 wg ..
#      64 wg + 63 of the CTA's 256): half the conversion and accumulator per warp, 16 warps per SM (4 per scheduler);
#      the same tile and stage ring as 4 (warps 0-7 load, all 16 meet the barriers), an epilogue for 512 threads.
#      64-row tiles (codes in registers) and 32-row tiles (codes in the ring), bf16 (not interleaved) and SwiGLU
#      epilogues; per-token-scale rows run PIPE 0
#   9  8 with each warp's codes loaded two groups ahead (7's form; at 32-row tiles, codes in the ring: as 8)
#   10 4's loop (64-row tiles, codes in registers in the tree: bf16 and SwiGLU epilogues; elsewhere PIPE 0) fed by a
#      deep, barrier-free load pipeline: 288 threads (8 consumer warps + 1 producer warp), an 8-stage ring in dynamic
#      shared memory (24 KB a stage: the 64 x 128-byte activation tile + the CTA's 16 KB of int4 codes of the group),
#      a full and an empty mbarrier per stage, the producer filling stages with cp.async.bulk (one 128-byte copy per
#      activation row, un-swizzled within the row: wrong values, the swizzled tile's addresses; 16 x 1 KB of codes)
#      up to 8 groups ahead, the consumers reading their codes from the stage; no __syncthreads in the loop
#   11 10 with the activation rows by the producer warp's 16-byte cp.async into the exact 128-byte swizzle
#      (cp.async.mbarrier.arrive.noinc on the stage's full barrier); the codes still by bulk copies
# The values of 1..11 are wrong on purpose (no scales at all): timing only, never tests. Build here, carry both
# binaries, time them in one device run:
#   sh lab/w4a8_pipe_ceiling.sh build   # /tmp/pipeexp: the unpatched and the patched fp8moe-bench of build/gpu-pack
#   sh lab/w4a8_pipe_ceiling.sh pack    # both, stripped, into .carry/gpu-pipe4.tar.xz (build/pipebase, build/pipe;
#                                       # PIPE_PACK=path for another)
#   sh lab/w4a8_pipe_ceiling.sh run BASE_BIN PIPE_BIN   # on the GPU machine, from the repository root
#       PIPE_VARIANTS="base 4 7 10" (default; base: BASE_BIN, a number: PIPE_BIN with FP8MOE_PIPE_EXP=number)
#       PIPE_TILE="auto 64" (default; the qwen3 rows, each with --route w4a8.tile=N unless auto), PIPE_ROUNDS=2,
#       PIPE_TILE_TOKENS=2048 (default: the T of the rows with a forced tile; auto rows: 512,2048,8192),
#       PIPE_TOKEN=1 adds qwen3 rows with --route moe.act_scale=token (no PIPE 6 instance: they run PIPE 0 there)
set -e
case "$1" in
build)
    repo=$(pwd)
    rm -rf /tmp/pipeexp && mkdir -p /tmp/pipeexp/build
    git archive HEAD | tar -x -C /tmp/pipeexp
    # git archive stamps every file with the commit's time, later than build/gpu-pack's objects: back-date the
    # sources so that make rebuilds only what the patch touches (the objects are at about HEAD)
    find /tmp/pipeexp -type f -exec touch -d '2000-01-01' {} +
    cp -a build/gpu-pack /tmp/pipeexp/build/gpu-pack
    cd /tmp/pipeexp
    # -compress-mode=none: nvcc compresses a large object's fatbin (the patched one's), which xz then cannot shrink nor
    # match against the base's identical cubins; both kernel objects uncompressed keep the tarball under 9 MB
    A="BUILD=build/gpu-pack CUDA_ARCHS=-gencode=arch=compute_90a,code=sm_90a CUDA_HOME=/usr/local/cuda"
    N="NVCC=/usr/local/cuda/bin/nvcc -compress-mode=none"
    # the base: the same objects, the kernel's file recompiled unpatched by the same command as the patched one
    # below (build/gpu-pack's own object may come from other flags), so that the two binaries differ by the patch
    touch src/backend/cuda/w4a8_gemm_wgmma.cu
    make -j2 $A "$N" build/gpu-pack/fp8moe-bench
    cp -a build/gpu-pack/fp8moe-bench fp8moe-bench.base
    patch -p1 <"$repo/lab/w4a8_pipe_ceiling.patch"
    make -j2 $A "$N" build/gpu-pack/fp8moe-bench
    ;;
pack)
    s=/tmp/pipeexp/stage
    rm -rf $s && mkdir -p $s/build/pipe $s/build/pipebase .carry
    strip --strip-debug -o $s/build/pipe/fp8moe-bench /tmp/pipeexp/build/gpu-pack/fp8moe-bench
    strip --strip-debug -o $s/build/pipebase/fp8moe-bench /tmp/pipeexp/fp8moe-bench.base
    out=${PIPE_PACK:-.carry/gpu-pipe4.tar.xz}
    tar -C $s -cf - build/pipe build/pipebase | xz -9 -T2 >$out
    ls -l $out
    ;;
run)
    . .carry/env.sh # (source: the GPU machine lacks the -dev libraries)
    base=$2 pipe=$3
    hung="" # variants that timed out once (a hang in an mbarrier ring): skipped in later rows, not 60 s each
    one() { # variant, then the bench moe arguments
        v=$1
        shift
        case " $hung " in *" $v "*)
            echo "skipped: variant $v timed out before"
            return
            ;;
        esac
        bin=$pipe
        [ "$v" = base ] && bin=$base
        rc=0
        FP8MOE_PIPE_EXP=$v timeout 60 "$bin" moe "$@" >/tmp/pipe_run.txt 2>&1 || rc=$?
        grep -E "^\| fp8-grouped|rror" /tmp/pipe_run.txt || true
        [ $rc = 0 ] || echo "exit $rc (124: timeout)"
        [ $rc != 124 ] || hung="$hung $v"
    }
    t0=$(date +%s)
    vars=${PIPE_VARIANTS:-base 4 7 10}
    tiles=${PIPE_TILE:-auto 64}
    rounds=${PIPE_ROUNDS:-2}
    Q="--shape qwen3 --tokens 512,2048,8192 --routes fp8-grouped --repeat 10"
    # a forced tile's rows at PIPE_TILE_TOKENS only (8192 tiles by 64 anyway): one process each, less to run
    QT="--shape qwen3 --tokens ${PIPE_TILE_TOKENS:-2048} --routes fp8-grouped --repeat 10"
    r=1
    while [ $r -le $rounds ]; do
        for v in $vars; do
            for t in $tiles; do
                tr="" q=$Q
                [ "$t" = auto ] || tr="--route w4a8.tile=$t" q=$QT
                echo "== round $r variant $v qwen3 tile $t"
                one $v $q $tr
                if [ "${PIPE_TOKEN:-0}" = 1 ]; then
                    echo "== round $r variant $v qwen3 tile $t moe.act_scale=token"
                    one $v $q $tr --route moe.act_scale=token
                fi
            done
        done
        r=$((r + 1))
    done
    # Mixtral's automatic tile is 64 rows at T = 4096 (experts over 16 MB)
    M="--shape mixtral --tokens 4096 --routes fp8-grouped --repeat 10"
    r=1
    while [ $r -le $rounds ]; do
        for v in $vars; do
            echo "== round $r variant $v mixtral"
            one $v $M
        done
        r=$((r + 1))
    done
    echo "== run: $(($(date +%s) - t0)) s"
    ;;
*)
    echo "usage: sh lab/w4a8_pipe_ceiling.sh build | pack | run BASE_BIN PIPE_BIN" >&2
    exit 2
    ;;
esac
