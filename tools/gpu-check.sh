#!/usr/bin/env bash
# Everything a GPU-machine run needs, in one call (device tool: carry .carry, begin with `source .carry/env.sh;`):
# builds with nvcc for sm_90a/sm_89, runs the whole test suite, checks what the CUDA backend reports on the
# real GPU, and prints a short table last. Logs go to $OUT (or /tmp when OUT is unset).
set -uo pipefail
out=${OUT:-/tmp}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
make -j"$(nproc)" all tests-build >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
start=$(date +%s)
make test >"$out/test.log" 2>&1; test_rc=$?
test_s=$(( $(date +%s) - start ))
./build/fp8moe logits --model tests/models/qwen3-moe-f32 --ids tests/models/qwen3-moe-f32/golden_ids.i32 \
    --out /tmp/cuda.f32 --backend cuda 2>"$out/cuda.txt"; cuda_rc=$?
cuobjdump --list-elf build/src/backend/cuda/cuda_backend.o >"$out/elf.txt" 2>&1
echo
echo "| check | result |"
echo "|---|---|"
echo "| make test | rc $test_rc, $(grep -c '^\[  PASSED' "$out/test.log") programs passed, ${test_s} s |"
echo "| cuda backend | rc $cuda_rc: $(cat "$out/cuda.txt") |"
echo "| cubins | $(grep -o 'sm_[0-9a]*' "$out/elf.txt" | sort -u | tr '\n' ' ') |"
