#!/bin/sh
# The backend stays behind its ops: outside src/backend, no code calls a CUDA backend function (fm_cuda_*) or
# compares a backend's name with a string ("cpu", "cuda"); it asks the op table (backend.h) or the backend kinds
# (backend_kind.h) instead. bench/ and lab/ measure the CUDA backend directly and are allowed to. The bench commands
# still in src/cli (cmd_bench*.c, bench_*.[ch]) are allowed until they move to bench/.
# Exit status 1 with the offending lines when any is found.
cd "$(dirname "$0")/.." || exit 2
allowed='^src/backend/|^src/cli/cmd_bench|^src/cli/bench_'
found=0
calls=$(grep -rnE '\bfm_cuda_[A-Za-z0-9_]*' src include | grep -vE "$allowed")
if [ -n "$calls" ]; then
    echo "check-layers: fm_cuda_* outside src/backend (use the backend's ops or its kind, backend_kind.h):"
    echo "$calls"
    found=1
fi
compares=$(grep -rnE 'str(n)?(case)?cmp *\([^;]*"(cpu|cuda)"' src include | grep -vE "$allowed")
if [ -n "$compares" ]; then
    echo "check-layers: a backend's name compared outside src/backend (ask its kind: fm_backend_kind_find,"
    echo "fm_backend_lookup, fm_backend_on_device):"
    echo "$compares"
    found=1
fi
[ $found = 0 ] && echo "check-layers: ok (no fm_cuda_* call, no backend-name compare outside src/backend)"
exit $found
