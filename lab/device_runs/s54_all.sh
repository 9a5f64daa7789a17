#!/bin/bash
# Forty-ninth session, one call (the start of a machine cost ~2 minutes a refusal this session): s54_b.sh's
# measurements, s54_c.sh's phase clocks, then s54_a.sh's tests at once with what is left of CALL_S (430 s).
# Carry .carry/env.sh, .carry/debs, .carry/gpu-s54a.tar.xz, .carry/gpu-s54cm.tar.xz.
set -u
mkdir -p s54a s54c && tar -xJf .carry/gpu-s54a.tar.xz -C s54a && tar -xJf .carry/gpu-s54cm.tar.xz -C s54c || exit 1
bash lab/device_runs/s54_b.sh
bash lab/device_runs/s54_c.sh
left=$((${CALL_S:-430} - SECONDS))
LIM=$((left > 20 ? left : 20)) bash lab/device_runs/s54_a.sh
