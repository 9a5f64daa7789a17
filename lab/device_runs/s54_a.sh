#!/bin/bash
# Forty-ninth session, tests (first of two scripts on one warm machine; s54_b.sh measures): test_cuda_fold_gemv (its
# emulation now takes the route's form of h above the GEMVs' pairs), test_cuda_fold, test_moe_persistent (moe.block_norm's
# pre step bit for bit), test_gdn_decode_fused, test_cuda_pdl (the new same-bits route pairs, then the rest),
# test_cuda_generate (Qwen3-Next's cached decode with the qkvz from the block's rows).
# Packs: `OUT=.carry/gpu-s54a.tar.xz tools/gpu-pack-ab.sh fp8moe-bench tests/gpu/test_cuda_ops_fused
# tests/gpu/test_cuda_fold_gemv tests/gpu/test_cuda_fold` at f7526e8 (fp8moe-bench: the session's base),
# `OUT=.carry/gpu-s54b.tar.xz tools/gpu-pack-ab.sh fp8moe-bench tests/gpu/test_cuda_pdl tests/gpu/test_cuda_generate`
# at 5685c77. Carry .carry/env.sh, .carry/debs, both packs.
set -u
source .carry/env.sh
mkdir -p s54a s54b && tar -xJf .carry/gpu-s54a.tar.xz -C s54a && tar -xJf .carry/gpu-s54b.tar.xz -C s54b || exit 1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
L=$OUT/logs; mkdir -p $L
A=s54a/build/new; N=s54b/build/new
t() { # name, limit, command...
  local name=$1 lim=$2; shift 2
  timeout $lim "$@" > $L/$name.log 2>&1
  echo "== $name rc $? $SECONDS s: $(grep -cE 'bit for bit' $L/$name.log) bit-for-bit lines"
  grep -E "FAIL|PASSED|rror" $L/$name.log | head -4
}
t fold_gemv 120 $A/test_cuda_fold_gemv
t fold 120 $A/test_cuda_fold
FM_TEST_FILTER=test_moe_persistent t persistent 90 $A/test_cuda_ops_fused
FM_TEST_FILTER=test_gdn_decode_fused t gdn_fused 90 $A/test_cuda_ops_fused
FM_TEST_FILTER=test_same_bits_routes t same_bits 200 $N/test_cuda_pdl
t generate 150 $N/test_cuda_generate
cd $OUT && tar -cJf tests.tar.xz logs && rm -rf logs
echo "== all $SECONDS s"
