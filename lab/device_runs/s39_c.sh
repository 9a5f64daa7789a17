#!/bin/bash
# the thirty-sixth session's second call (as run, inline): the serving rows of s39_a.sh twice more, the default
# (mixed.graphs on) and --route mixed.graphs=off alternating, on the warm machine of s39_a.sh
sed -n '/^row()/,/^row -- "\${LOAD\[@\]}"/p' lab/device_runs/s39_a.sh > /tmp/rows.sh
source .carry/env.sh; L=$OUT; set -u; source /tmp/rows.sh
row -- "${ARR[@]}"; row --route mixed.graphs=off -- "${ARR[@]}"; row -- "${LOAD[@]}"; row --route mixed.graphs=off -- "${LOAD[@]}"
