#!/bin/bash
# Forty-ninth session, tests (first of two scripts on one warm machine; s54_b.sh measures): test_cuda_fold_gemv (its
# emulation now takes the route's form of h above the GEMVs' pairs), test_cuda_fold, test_moe_persistent (moe.block_norm's
# pre step bit for bit), test_gdn_decode_fused (with out_q), test_cuda_pdl's same-bits route pairs, test_cuda_generate
# (Qwen3-Next's cached decode with the qkvz and out projections from their producers' rows), test_cuda_qnext.
# Packs: `OUT=.carry/gpu-s54a.tar.xz tools/gpu-pack-ab.sh fp8moe-bench tests/gpu/test_cuda_ops_fused
# tests/gpu/test_cuda_fold_gemv tests/gpu/test_cuda_fold` at f7526e8 (fp8moe-bench: the session's base),
# `OUT=.carry/gpu-s54c.tar.xz tools/gpu-pack-ab.sh fp8moe-bench tests/gpu/test_cuda_ops_fused tests/gpu/test_cuda_pdl
# tests/gpu/test_cuda_generate tests/gpu/test_cuda_qnext` at 270846b. Carry .carry/env.sh, .carry/debs, both packs.
set -u
source .carry/env.sh
[ -d s54c ] || { mkdir -p s54a s54c && tar -xJf .carry/gpu-s54a.tar.xz -C s54a && tar -xJf .carry/gpu-s54cm.tar.xz -C s54c; } ||
  exit 1
LIM=${LIM:-300} # each test's limit (s54_all.sh gives what its call has left)
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
L=$OUT/logs; mkdir -p $L
A=s54a/build/new; N=s54c/build/new
t() { # name, limit, command...: in the background, all at once (correctness only; the GPU has room)
  local name=$1 lim=$2; shift 2
  (timeout $lim "$@" > $L/$name.log 2>&1; echo $? > $L/$name.rc) &
}
t fold_gemv $LIM $A/test_cuda_fold_gemv
t fold $LIM $A/test_cuda_fold
FM_TEST_FILTER=test_moe_persistent t persistent $LIM $N/test_cuda_ops_fused
FM_TEST_FILTER=test_gdn_decode_fused t gdn_fused $LIM $N/test_cuda_ops_fused
FM_TEST_FILTER=test_same_bits_routes t same_bits $LIM $N/test_cuda_pdl
t generate $LIM $N/test_cuda_generate
t qnext $LIM $N/test_cuda_qnext
wait
for n in fold_gemv fold persistent gdn_fused same_bits generate qnext; do
  echo "== $n rc $(cat $L/$n.rc): $(grep -cE 'bit for bit' $L/$n.log) bit-for-bit lines"
  grep -E "FAIL|PASSED|rror" $L/$n.log | head -4
done
(cd $OUT && tar -cJf tests.tar.xz logs && rm -rf logs)
echo "== all $SECONDS s"
