#!/usr/bin/env bash
# Checks that every C, header and CUDA source follows .clang-format (clang-format --dry-run --Werror); with --fix,
# rewrites them in place. CI runs the check; `make format` fixes.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || { echo "check-format: clang-format not found (apt-get install clang-format)" >&2; exit 1; }
mapfile -t files < <(git ls-files '*.c' '*.h' '*.cu' '*.cuh')
if [ "${1:-}" = "--fix" ]; then
    clang-format -i "${files[@]}"
    echo "check-format: formatted ${#files[@]} files"
    exit 0
fi
if ! clang-format --dry-run --Werror "${files[@]}" 2>/tmp/check-format.$$; then
    grep -oE '^[^:]+\.(c|h|cu|cuh)' /tmp/check-format.$$ | sort -u | sed 's/^/  /' >&2
    rm -f /tmp/check-format.$$
    echo "check-format: the files above differ from .clang-format ($(clang-format --version)); run make format" >&2
    exit 1
fi
rm -f /tmp/check-format.$$
echo "check-format: ${#files[@]} files follow .clang-format"
