#!/bin/bash
# thirty-ninth session, second call: why the engine's ws kernel is ~7 us an item slower than the lab's q256c2l1 on the
# same data (s42_a: 0.54 against 0.345 ms at Qwen3 T = 2048, bit-equal outputs). The SASS of both (cuobjdump), and
# ncu of one T = 2048 gate|up launch of each (the 21st of its name: after the 11 validation launches and 5 warm-ups)
# with per-instruction stall sampling (SourceCounters), printed as the source page. Pack: .carry/gpu-s42a.tar.xz.
set -u
source .carry/env.sh
tar -xJf .carry/gpu-s42a.tar.xz || exit 1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
L=$OUT/logs; mkdir -p $L
cuobjdump -sass build/lab/w4a8_ws > /tmp/lab.sass 2>&1; echo "== sass rc $? $(wc -l < /tmp/lab.sass) lines"
grep -n "Function :" /tmp/lab.sass | grep -E "w4a8_fold_ws_kernel|w4a8_ws_kernelILi1ELi2ELi2ELi2ELi0ELi1ELi1ELi0ELi0ELi1E" | cut -c1-150
for f in $(grep "Function :" /tmp/lab.sass | grep -E "w4a8_fold_ws_kernelILi0|w4a8_ws_kernelILi1ELi2ELi2ELi2ELi0ELi1ELi1ELi0ELi0ELi1E" | awk '{print $3}'); do
  awk -v f="$f" '$0 ~ "Function : "f"$" {on=1} on && /Function :/ && $0 !~ f {on=0} on' /tmp/lab.sass > $L/$(echo $f | cut -c1-40).sass
done
ls -la $L
for k in w4a8_fold_ws_kernel w4a8_ws_kernel; do
  timeout 150 ncu --clock-control none --kernel-name regex:$k --launch-skip 20 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section InstructionStats --section SourceCounters \
    --section LaunchStats -o $L/$k ./build/lab/w4a8_ws --variants q256c2l1,engine > $L/ncu_run_$k.log 2>&1
  echo "== ncu $k rc $? $SECONDS s"
  ncu --import $L/$k.ncu-rep --print-details all > $L/$k.details.txt 2>&1
  ncu --import $L/$k.ncu-rep --page source --csv --print-source sass > $L/$k.source.csv 2>&1
  grep -E "Duration|Executed Instructions |Issue Slots Busy|Warp Cycles Per Issued|Grid Size|Block Size" $L/$k.details.txt | head -8
  wc -l $L/$k.source.csv
done
gzip -9 $L/*.csv $L/*.sass 2>/dev/null; rm -f $L/*.ncu-rep
echo "== $SECONDS s"
