#!/bin/sh
# The front-ends stay on the public API: a file of src/cli or src/serve includes fp8moe.h and fp8moe_sched.h, and
# headers of src/text, src/util and its own folder, never one of src/engine, src/backend, src/model, src/io,
# src/quant or src/dist (docs/ARCHITECTURE.md, "Layers"). Exit status 1 with the offending lines when one does.
cd "$(dirname "$0")/.." || exit 2
# Files still allowed, each with the reason it needs the internals:
#   the inspect command (cmd_inspect.c, inspect*.[ch]): it prints the internals themselves (the bound weight slots,
#     the memory plan line by line, the route table), beyond what the public probe and estimate say.
# (The bench commands live in bench/cli/, a program of their own that measures the internals on purpose.)
allowed='^src/cli/(cmd_inspect\.c|inspect[a-z_]*\.[ch]):'
found=$(grep -nE '^#include "(engine|backend|model|io|quant|dist)/' src/cli/*.[ch] src/serve/*.[ch] | grep -vE "$allowed")
if [ -n "$found" ]; then
    echo "check-includes: src/cli and src/serve use the public API (fp8moe.h, fp8moe_sched.h), src/text and src/util:"
    echo "$found"
    exit 1
fi
echo "check-includes: ok (src/cli and src/serve include no engine, backend, model, io, quant or dist header)"
