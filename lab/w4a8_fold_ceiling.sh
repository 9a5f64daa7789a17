#!/bin/sh
# The ceiling of a folded weight format in the grouped W4A8 GEMM, by timing alone (bench/NOTES.md, 2026-12-04):
# lab/w4a8_fold_ceiling.patch adds to a COPY of the tree a template value FOLD of w4a8_wgmma_kernel (int4-tc banks,
# e4m3 activations), chosen by FP8MOE_FOLD_EXP in that copy only:
#   0  today's kernel (the same PTX as the tree's: the control)
#   1  the group scale in the operand: per row an 8-entry e4m3 table (2 IMAD per row and group), the codes through
#      PRMT (8 instructions per 8 codes, today's 3), and one FFMA per element and group (the activation's 1x128
#      scale): what int4-p2 weights with today's activations would cost
#   2  the same table and a plain FADD every 4 groups (activations with one scale per token): the format's best case
#   3  today's conversion and a FADD every 4 groups: the promotion's whole share, the bound no format can beat
# The values are wrong on purpose (the codes keep today's layout, the tables read the bf16 scale bits): timing only,
# never tests. Build here, carry both binaries, time them in one device run:
#   sh lab/w4a8_fold_ceiling.sh build      # -> /tmp/foldexp/build/fp8moe (stripped into .carry/kernel by the caller)
#   sh lab/w4a8_fold_ceiling.sh run BASE FOLD   # on the GPU machine: alternating, two rounds, then the prefill
set -e
case "$1" in
build)
    rm -rf /tmp/foldexp && mkdir -p /tmp/foldexp
    # the tree the patch was written against: w4a8_gemm.cu whole, the bench commands inside fp8moe (the kernel's
    # files were split and the bench commands became fp8moe-bench after it)
    git archive 6b1cdda | tar -x -C /tmp/foldexp
    (cd /tmp/foldexp && patch -p1 <lab/w4a8_fold_ceiling.patch && make build/fp8moe -j2)
    ;;
run)
    base=$2 fold=$3
    B="bench moe --shape qwen3 --tokens 512,2048,8192 --routes fp8-grouped --repeat 10"
    for r in 1 2; do
        for v in base 0 1 2 3; do
            bin=$fold
            [ $v = base ] && bin=$base
            echo "== round $r variant $v"
            FP8MOE_FOLD_EXP=$v $bin $B 2>&1 | grep -E "^\| fp8-grouped|rror" || true
        done
    done
    P="bench prefill --synthetic qwen3-30b-a3b --backend cuda --layers 48 --preset fp8 --dense w8a8 --tokens 2048"
    for v in base 2 base 2; do
        bin=$fold
        [ $v = base ] && bin=$base
        echo "== prefill variant $v"
        FP8MOE_FOLD_EXP=$v $bin $P --repeat 5 --warmup 2 2>&1 | tail -4
    done
    ;;
*)
    echo "usage: sh lab/w4a8_fold_ceiling.sh build | run BASE_BIN FOLD_BIN" >&2
    exit 2
    ;;
esac
