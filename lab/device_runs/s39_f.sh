#!/bin/bash
# the thirty-sixth session's last call (as run, inline; carry build/lab/w4a8_ws built by `make -C lab w4a8_ws`): the
# warp-specialised W4A8 lab kernel's first run, validation then timing
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 60 ./build/lab/w4a8_ws --small 2>&1 | tail -15; echo "== small rc ${PIPESTATUS[0]}"
timeout 140 ./build/lab/w4a8_ws 2>&1 | tail -25; echo "== full rc ${PIPESTATUS[0]}"
