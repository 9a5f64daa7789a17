#!/bin/bash
# the session after the fortieth: s44_a (split blocks, threshold tests, n256c2l1) then s44_b (16-row activation box)
# on one warm machine. Carry .carry/env.sh, .carry/debs, .carry/gpu-s44a.tar.xz and .carry/gpu-s44b.tar.xz.
mkdir -p $OUT/a $OUT/b; timeout 390 env OUT=$OUT/a LIMIT=370 bash lab/device_runs/s44_a.sh; echo "== s44_a rc $?"
timeout 190 env OUT=$OUT/b LIMIT=175 bash lab/device_runs/s44_b.sh; echo "== s44_b rc $?"
