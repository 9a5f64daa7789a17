#!/usr/bin/env bash
# The measurements the open issues wait on, in few device calls (companion of tools/gpu-check.sh, which builds and
# tests): decode and prefill of the synthetic Qwen3-30B-A3B against a baseline binary in the same run, the server
# under four workloads, and the time to ready of a 48-layer checkpoint. docs/gpu.md "Measuring on the GPU" lists the
# device calls. Every program runs under `timeout`; the logs go into one archive under $OUT (the device tool brings
# back 8 files at most) and a short markdown table is printed last.
#
#   PART=decode|prefill|serve|load|all  what to run (default all: more than one 10-minute call on the H200);
#                 serve-cache (the prefix cache's two servers) and serve-steps (mixed steps, the baseline) split serve;
#                 serve-tiled: serve-steps' arrivals and 64-client rows with --route paged.tiled=on (not in all);
#                 serve-budget: the arrivals row (and the 64-client one) under --step-budget fixed and latency,
#                 alternating, two rounds (not in all); serve-kv: the 64-client row with --kv-cache auto and
#                 e4m3, alternating, two rounds (not in all)
#   BASE=DIR      the baseline: DIR/fp8moe (commit 6b1cdda: its bench is inside fp8moe; a newer pair has
#                 fp8moe-bench beside it). BASE_SRC=TARBALL builds DIR first when DIR/fp8moe is missing
#                 (`git archive 6b1cdda -- src include bench Makefile | xz >.carry/base-src.tar.xz`)
#   NEW=DIR       the build measured (default build)
#   PACK=1        also write the binaries, xz-compressed, to $OUT (base-fp8moe.xz, new-fp8moe.xz,
#                 new-fp8moe-bench.xz): carried as BINS=DIR in the next calls, they spare each fresh machine the builds
#   BINS=DIR      unpack those files into BASE and NEW where these hold no fp8moe yet
#   BACKEND=cuda  (default) or cpu; SMOKE=1 runs every part at tiny scale (toy-moe shapes, seconds per run), so
#                 that an option missing from either binary shows here on the CPU before it costs device time
#   DRY=1         print every command, run nothing
#   DECODE_SET=main|extra|all  decode's runs: main (base, new, fused; the per-op table), extra (the JSON-object
#                 mask, Qwen3-Next), all (default)
#   ROUNDS=N      rounds of the alternating base/new comparisons (default: decode 1, prefill 2)
#   ALSO=L=DIR[,L=DIR]  decode: more binaries (DIR/fp8moe) timed in each round after new, their rows labelled L; the
#                 Qwen3-Next rows too (DECODE_SET extra)
#   Needs python3 (the serving client; no Node) and, for bench/serve_bench.sh, curl.
#   SERVE_S=S     seconds per serving-benchmark row (default 45); LOAD_LAYERS (48), CKPT_DIR (/tmp/fm-ckpt)
set -uo pipefail
out=${OUT:-/tmp}
part=${PART:-all}
base=${BASE:-build/base}
new=${NEW:-build}
backend=${BACKEND:-cuda}
smoke=${SMOKE:-0}
dry=${DRY:-0}
here=$(cd "$(dirname "$0")/.." && pwd)
case "$part" in decode | prefill | serve | serve-cache | serve-steps | serve-tiled | serve-budget | serve-kv | load | all) ;;
*) echo "gpu-measure: PART=$part is not decode, prefill, serve, serve-cache, serve-steps, serve-tiled, serve-budget, serve-kv, load or all" >&2; exit 2 ;;
esac
work=$(mktemp -d /tmp/gpu-measure.XXXXXX)
logs=$work/logs-$part
mkdir -p "$logs" "$out"
table=$logs/table.md
: >"$table"

# The sizes: the issues' shapes, or a toy at SMOKE=1 (the same options, so that each one is checked)
if [ "$smoke" = 1 ]; then
    synth=toy-moe qnext=toy-next batches=1,2 context=16 steps="--steps 2 --warmup 1" qbatches=1,2
    pf_layers=1 pf_tokens=64 pf_repeat="--repeat 2 --warmup 1"
    serve_model=(--synthetic toy-moe) seqs=8 ctx=512 serve_s=${SERVE_S:-3}
    prefix=128 question=32 new_tok=16 mt_prompt=128 mt_turn=16 arr_clients=2 arr_prompt=16 probe=64 arr_new=64
    load_clients=4 load_prompt=64 load_new=16 load_layers=${LOAD_LAYERS:-1} ttft_prompt=32 vocab=256 load_ctx=512
else
    synth=qwen3-30b-a3b qnext=qwen3-next-80b-a3b batches=1,8,64 context=2048 steps="" qbatches=1,64
    pf_layers=48 pf_tokens=2048 pf_repeat=""
    serve_model=(--synthetic qwen3-30b-a3b) seqs=64 ctx=8192 serve_s=${SERVE_S:-45}
    prefix=2048 question=256 new_tok=256 mt_prompt=3584 mt_turn=128 arr_clients=8 arr_prompt=128 probe=1800
    arr_new=1024 load_clients=64 load_prompt=1800 load_new=256 load_layers=${LOAD_LAYERS:-48} ttft_prompt=512 vocab=4096 load_ctx=4096
fi
presets=${DECODE_PRESETS:-fp8,fp8+w8a8}
qpresets=${QNEXT_PRESETS:-fp8}
serve_preset=(--backend "$backend" --preset fp8 --dense w8a8)

# run LABEL SECONDS CMD...: one program under timeout, its output in $logs/LABEL.log, the command in commands.txt
run() {
    local label=$1 limit=$2
    shift 2
    echo "timeout $limit $*" >>"$logs/commands.txt"
    if [ "$dry" = 1 ]; then
        echo "[$label] timeout $limit $*"
        return 0
    fi
    echo "== $label: $*" >&2
    local t0=$SECONDS
    timeout "$limit" "$@" >"$logs/$label.log" 2>&1
    local rc=$?
    echo "   rc $rc, $((SECONDS - t0)) s" >&2
    [ $rc = 0 ] || { tail -5 "$logs/$label.log" >&2; echo "| $label | FAILED rc $rc |" >>"$logs/failures.md"; }
    return $rc
}

# rows LABEL: the first table of a bench log (decode: preset, batch, median ms, tokens/s), prefixed by LABEL
decode_rows() {
    [ "$dry" = 1 ] && return 0
    awk -v l="$1" '/^\| preset \| batch \| median/ {on=1; next} on && /^\|---/ {next}
        on && /^\|/ {split($0, c, "|"); printf "| %s | %s | %s | %s | %s |\n", l, c[2], c[3], c[4], c[7]; next}
        on {exit}' "$logs/$1.log" >>"$logs/decode_rows.md"
}

build_base() {
    [ -x "$base/fp8moe" ] && return 0
    if [ -z "${BASE_SRC:-}" ]; then
        echo "gpu-measure: $base/fp8moe is missing: set BASE=DIR, or BASE_SRC=TARBALL to build it" >&2
        [ "$dry" = 1 ] && return 0
        exit 2
    fi
    local src
    src=$(dirname "$base")/base-src
    run base_untar 120 bash -c "rm -rf '$src' && mkdir -p '$src' && tar -xJf '$BASE_SRC' -C '$src'" || exit 1
    # the baseline's own Makefile; its build/ becomes $base
    run base_build 540 make -C "$src" -j"$(nproc)" ${CUDA_ARCHS:+CUDA_ARCHS="$CUDA_ARCHS"} ${BASE_MAKE:-} all || exit 1
    [ "$dry" = 1 ] || ln -sfn "$(cd "$src" && pwd)/build" "$base"
}

# unpack_bins: the binaries of an earlier call (PACK=1), carried in $BINS, where BASE and NEW hold none
unpack_bins() {
    [ -n "${BINS:-}" ] || return 0
    local pair from to
    for pair in "base-fp8moe:$base/fp8moe" "new-fp8moe:$new/fp8moe" "new-fp8moe-bench:$new/fp8moe-bench"; do
        from=$BINS/${pair%%:*}.xz to=${pair#*:}
        [ -x "$to" ] && continue
        [ -e "$from" ] || [ "$dry" = 1 ] || { echo "gpu-measure: BINS=$BINS holds no ${pair%%:*}.xz" >&2; exit 2; }
        run "unpack_${pair%%:*}" 120 bash -c "mkdir -p '$(dirname "$to")' && xz -dc '$from' >'$to' && chmod +x '$to'" || exit 1
    done
}

# pack_bins: the binaries, xz-compressed, into $OUT for the next calls (PACK=1)
pack_bins() {
    [ "${PACK:-0}" = 1 ] || return 0
    local pair
    for pair in "base-fp8moe:$base/fp8moe" "new-fp8moe:$new/fp8moe" "new-fp8moe-bench:$new/fp8moe-bench"; do
        [ -x "${pair#*:}" ] || [ "$dry" = 1 ] || continue # whatever was built
        run "pack_${pair%%:*}" 300 bash -c "xz -T0 -c '${pair#*:}' >'$out/${pair%%:*}.xz'"
    done
}

part_decode() {
    local r rounds=${ROUNDS:-1} common=(--synthetic "$synth" --batch "$batches" --context "$context" --presets "$presets"
        --backend "$backend" $steps)
    for r in $(seq "$rounds"); do
        # base, new, new with the fused decode ops; then the same under the JSON-object mask
        if [ "${DECODE_SET:-all}" != extra ]; then
        run "decode_base_r$r" 300 "$base/fp8moe" bench decode "${common[@]}"
        decode_rows "decode_base_r$r"
        run "decode_new_r$r" 300 "$new/fp8moe" bench decode "${common[@]}"
        decode_rows "decode_new_r$r"
        local also label dir
        for also in ${ALSO//,/ }; do # more binaries in the same rounds (e.g. a kernel variant built from another tree)
            label=${also%%=*} dir=${also#*=}
            run "decode_${label}_r$r" 300 "$dir/fp8moe" bench decode "${common[@]}"
            decode_rows "decode_${label}_r$r"
        done
        run "decode_fused_r$r" 300 "$new/fp8moe" bench decode "${common[@]}" --route decode.fused=on
        decode_rows "decode_fused_r$r"
        run "decode_unfused_r$r" 300 "$new/fp8moe" bench decode "${common[@]}" --route decode.fused=off
        decode_rows "decode_unfused_r$r"
        # paged attention's splits merged in the split kernel (one launch fewer per attention layer)
        run "decode_combine_r$r" 300 "$new/fp8moe" bench decode "${common[@]}" --route paged.combine=fused
        decode_rows "decode_combine_r$r"
        # every decode kernel's programmatic dependent launch off (the default has it on every kernel now)
        run "decode_nopdl_r$r" 300 "$new/fp8moe" bench decode "${common[@]}" --route pdl=off
        decode_rows "decode_nopdl_r$r"
        # the MoE tail in the down GEMV (it quantizes h; its last CTA per token combines, adds and normalises)
        run "decode_moetail_r$r" 300 "$new/fp8moe" bench decode "${common[@]}" --route moe.down_quant=fused \
            --route moe.combine=fused --route decode.fused=on
        decode_rows "decode_moetail_r$r"
        # the router's last CTA dispatching the rows (one launch fewer per MoE layer at B = 1): against decode_fused
        run "decode_rdisp_r$r" 300 "$new/fp8moe" bench decode "${common[@]}" --route moe.dispatch=fused \
            --route decode.fused=on
        decode_rows "decode_rdisp_r$r"
        # paged attention's split count by the older rule (2 CTAs per SM; the default fills the last wave instead)
        run "decode_fill_r$r" 300 "$new/fp8moe" bench decode "${common[@]}" --route paged.splits=fill
        decode_rows "decode_fill_r$r"
        # the dense W4A8 GEMV quantizing its bf16 rows itself (two launches fewer per attention layer; fp8 rows only)
        run "decode_dquant_r$r" 300 "$new/fp8moe" bench decode "${common[@]}" --route dense.quant=fused
        decode_rows "decode_dquant_r$r"
        # with the down GEMV's too (three fewer)
        run "decode_quants_r$r" 300 "$new/fp8moe" bench decode "${common[@]}" --route dense.quant=fused \
            --route moe.down_quant=fused
        decode_rows "decode_quants_r$r"
        fi
        [ "${DECODE_SET:-all}" = main ] && continue
        run "decode_json_base_r$r" 300 "$base/fp8moe" bench decode "${common[@]}" --json-object
        decode_rows "decode_json_base_r$r"
        run "decode_json_new_r$r" 300 "$new/fp8moe" bench decode "${common[@]}" --json-object
        decode_rows "decode_json_new_r$r"
        run "decode_json_fused_r$r" 300 "$new/fp8moe" bench decode "${common[@]}" --json-object \
            --route decode.fused=on
        decode_rows "decode_json_fused_r$r"
        # the Qwen3-Next-80B-A3B shape where the binary has it
        local q=(--synthetic "$qnext" --batch "$qbatches" --context "$context" --presets "$qpresets" --backend "$backend"
            $steps)
        run "decode_qnext_base_r$r" 300 "$base/fp8moe" bench decode "${q[@]}"
        decode_rows "decode_qnext_base_r$r"
        run "decode_qnext_new_r$r" 300 "$new/fp8moe" bench decode "${q[@]}"
        decode_rows "decode_qnext_new_r$r"
        for also in ${ALSO//,/ }; do
            label=${also%%=*} dir=${also#*=}
            run "decode_qnext_${label}_r$r" 300 "$dir/fp8moe" bench decode "${q[@]}"
            decode_rows "decode_qnext_${label}_r$r"
        done
        # the shared expert as expert E of the routed launch (route moe.shared), and the fused GDN decode op
        run "decode_qnext_routed_r$r" 300 "$new/fp8moe" bench decode "${q[@]}" --route moe.shared=routed
        decode_rows "decode_qnext_routed_r$r"
        run "decode_qnext_fused_r$r" 300 "$new/fp8moe" bench decode "${q[@]}" --route decode.fused=on
        decode_rows "decode_qnext_fused_r$r"
        # the fold route (w4a8.kernel=fold: GEMVs at B = 1, the fold GEMM at 64) against today's kernels on the same
        # int4-p2 weights (quantized at load on the device)
        run "decode_p2_r$r" 300 "$new/fp8moe" bench decode "${common[@]}" --presets fp8 --int4-scales p2
        decode_rows "decode_p2_r$r"
        run "decode_fold_r$r" 300 "$new/fp8moe" bench decode "${common[@]}" --presets fp8 --int4-scales p2 \
            --route w4a8.kernel=fold
        decode_rows "decode_fold_r$r"
    done
    [ "${DECODE_SET:-all}" = extra ] && { decode_table; return; }
    # each op of a step against its floor (--per-op: a mark after every op of the profiled step), B = 1 and 64
    run decode_per_op 300 "$new/fp8moe" bench decode "${common[@]}" --batch 1,64 --per-op --json "$logs/decode_per_op.json"
    decode_table
}

decode_table() {
    {
        echo "### decode (per step; tokens/s)"
        echo
        echo "| run | preset | batch | median ms | tokens/s |"
        echo "|---|---|---:|---:|---:|"
        cat "$logs/decode_rows.md" 2>/dev/null
        echo
        echo "### decode per op (new binary, one step without a graph)"
        awk '/^per op,/ {on = 1} on' "$logs/decode_per_op.log" 2>/dev/null
        echo
    } >>"$table"
}

part_prefill() {
    local r rounds=${ROUNDS:-2} bin label
    local common=(--synthetic "$synth" --layers "$pf_layers" --tokens "$pf_tokens" --preset fp8 --dense w8a8
        --backend "$backend" $pf_repeat)
    {
        echo "### prefill ($synth, $pf_layers layers, $pf_tokens tokens, fp8 + w8a8)"
        echo
        echo "| run | latency |"
        echo "|---|---|"
    } >>"$table"
    for r in $(seq "$rounds"); do
        for bin in base new; do
            label=prefill_${bin}_r$r
            [ $bin = base ] && b=$base || b=$new
            run "$label" 300 "$b/fp8moe" bench prefill "${common[@]}" && [ "$dry" != 1 ] &&
                echo "| $label | $(grep -m1 '^latency:' "$logs/$label.log" | cut -c10-) |" >>"$table"
        done
    done
    echo >>"$table"
    # the experts alone: today's grouped GEMM against the fold GEMM (int4-p2 weights, route w4a8.kernel=fold) on the
    # same weights, A B in one program
    local moe_tokens=1,8,64,512,2048,8192 moe_shape=qwen3
    [ "$smoke" = 1 ] && moe_tokens=7,64 moe_shape=toy
    if [ "$backend" = cuda ] || [ "$smoke" = 1 ]; then
        run moe_fold 300 "$new/fp8moe" bench moe --shape "$moe_shape" --routes fp8-grouped,fp8-fold --tokens "$moe_tokens" \
            --backend "$backend" && [ "$dry" != 1 ] &&
            { echo "### experts (bench moe --shape $moe_shape, fp8-grouped vs fp8-fold)"; echo;
              grep -E '^\|' "$logs/moe_fold.log"; echo; } >>"$table"
    fi
}

# serve_rows LABEL: the client tables of a serve_bench.sh log, and its FAILED lines (a row with more than 1% of its
# requests failed, or none completed: the client exits 1, so `run` lists it under failures too)
serve_rows() {
    [ "$dry" = 1 ] && return 0
    { echo "#### $1"; grep -E '^(model |\||FAILED |steps |$)' "$logs/$1.log" | sed 's/^model /\nmodel /' | cat -s; echo; } >>"$table"
}

part_serve() {
    # the per-client connection cap said outright: the baseline's default is 64, and 64 clients from one address
    # against it are reset
    local opts=("${serve_model[@]}" "${serve_preset[@]}" --max-seqs "$seqs" --ctx "$ctx" --max-conns-per-client 256)
    local sb="$here/bench/serve_bench.sh" py=(env SERVE_BENCH_PY=1)
    local prefix_run=(--vocab "$vocab" --clients "$seqs" --workload shared-prefix --prefix-tokens "$prefix" --prompt-tokens "$question"
        --max-tokens "$new_tok" --duration "$serve_s")
    local turns_run=(--vocab "$vocab" --clients "$arr_clients" --workload multi-turn --turns 2 --prompt-tokens "$mt_prompt"
        --max-tokens "$new_tok" --turn-tokens "$mt_turn" --duration "$serve_s")
    local arrivals_run=(--vocab "$vocab" --clients "$arr_clients" --workload arrivals --prompt-tokens "$arr_prompt" --max-tokens "$arr_new"
        --probe-prompt-tokens "$probe" --duration "$serve_s")
    local load_run=(--vocab "$vocab" --clients "$load_clients" --prompt-tokens "$load_prompt" --max-tokens "$load_new" --duration "$serve_s")
    echo "### serve (bench/serve_bench.sh, Python client; $serve_s s a row)" >>"$table"
    echo >>"$table"
    if [ "$part" = serve-tiled ]; then # the prompt chunks' attention on the tiled kernel, against serve-steps' rows
        run serve_steps_tiled 420 "${py[@]}" FP8MOE_BIN="$new/fp8moe" "$sb" "${opts[@]}" --route paged.tiled=on \
            -- "${arrivals_run[@]}" -- "${load_run[@]}"
        serve_rows serve_steps_tiled
        return 0
    fi
    if [ "$part" = serve-kv ]; then # the KV cache in e4m3 against bf16: the 64-client load (decode at B = 64)
        local round kv
        for round in 1 2; do
            for kv in auto e4m3; do
                run "serve_kv_${kv}_$round" 240 "${py[@]}" FP8MOE_BIN="$new/fp8moe" "$sb" "${opts[@]}" --kv-cache "$kv" \
                    -- "${load_run[@]}"
                serve_rows "serve_kv_${kv}_$round"
            done
        done
        return 0
    fi
    if [ "$part" = serve-budget ]; then # the step budget: a step's prompt share fixed, or sized by step times
        local round budget
        for round in 1 2; do
            for budget in fixed latency; do
                if [ "$round" = 1 ]; then
                    run "serve_budget_${budget}_$round" 300 "${py[@]}" FP8MOE_BIN="$new/fp8moe" "$sb" "${opts[@]}" \
                        --step-budget "$budget" -- "${arrivals_run[@]}" -- "${load_run[@]}"
                else
                    run "serve_budget_${budget}_$round" 200 "${py[@]}" FP8MOE_BIN="$new/fp8moe" "$sb" "${opts[@]}" \
                        --step-budget "$budget" -- "${arrivals_run[@]}"
                fi
                serve_rows "serve_budget_${budget}_$round"
            done
        done
        return 0
    fi
    if [ "$part" != serve-steps ]; then
        # the prefix cache: shared system prompt and a second turn, with and without the cache (one load each)
        run serve_cache 420 "${py[@]}" FP8MOE_BIN="$new/fp8moe" "$sb" "${opts[@]}" -- "${prefix_run[@]}" \
            -- "${turns_run[@]}"
        serve_rows serve_cache
        run serve_nocache 420 "${py[@]}" FP8MOE_BIN="$new/fp8moe" "$sb" "${opts[@]}" --no-prefix-cache \
            -- "${prefix_run[@]}" -- "${turns_run[@]}"
        serve_rows serve_nocache
    fi
    [ "$part" != serve-cache ] || return 0
    # mixed steps: 8 streams while long prompts arrive, the default step budget against alternating steps; the
    # 64-client load on the default server, then on the baseline
    run serve_steps 420 "${py[@]}" FP8MOE_BIN="$new/fp8moe" "$sb" "${opts[@]}" -- "${arrivals_run[@]}" -- "${load_run[@]}"
    serve_rows serve_steps
    run serve_steps_off 300 "${py[@]}" FP8MOE_BIN="$new/fp8moe" "$sb" "${opts[@]}" --max-step-tokens off \
        -- "${arrivals_run[@]}"
    serve_rows serve_steps_off
    run serve_base 300 "${py[@]}" FP8MOE_BIN="$base/fp8moe" "$sb" "${opts[@]}" -- "${load_run[@]}"
    serve_rows serve_base
}

# ttft_p50 LOG: the "TTFT p50 ms" cell of a serve_bench table's one-client row, found by its header (the columns move)
ttft_p50() {
    awk -F'|' '/^\| clients \|/ {for (i = 1; i <= NF; i++) if ($i ~ /TTFT p50/) col = i}
        col && /^\| +1 \|/ {gsub(/ /, "", $col); print $col; exit}' "$1" 2>/dev/null
}

# load_one NAME DIR PRESET...: page cache warmed, then `generate --max-tokens 1` (its load line) and a server's
# time to /health, its first request's TTFT against warm ones
load_one() {
    local name=$1 dir=$2
    shift 2
    run "load_${name}_warm_cache" 300 bash -c "cat '$dir'/*.safetensors >/dev/null"
    run "load_${name}_generate" 300 "$new/fp8moe" generate --model "$dir" --backend "$backend" "$@" --ids "$work/ids.i32" \
        --max-tokens 1 --out "$work/gen.i32" --verbose
    local t=$work/serve_$name
    mkdir -p "$t"
    echo "$new/fp8moe serve --model $dir --backend $backend $* --max-seqs 8 --ctx $load_ctx --no-prefix-cache --port 0 --port-file $t/port" \
        >>"$logs/commands.txt"
    if [ "$dry" = 1 ]; then
        echo "[load_${name}_serve] $new/fp8moe serve --model $dir --backend $backend $* --max-seqs 8 --ctx $load_ctx ... " \
            "then serve_bench.py --requests 1 --warmup 0 (first) and --requests 5 (warm)"
        return 0
    fi
    local t0 ready=""
    t0=$(date +%s%N)
    timeout 300 "$new/fp8moe" serve --model "$dir" --backend "$backend" "$@" --max-seqs 8 --ctx "$load_ctx" --no-prefix-cache \
        --port 0 --port-file "$t/port" >"$logs/load_${name}_serve.log" 2>&1 &
    local pid=$!
    while kill -0 $pid 2>/dev/null; do
        if [ -s "$t/port" ] && python3 -c "import urllib.request as u, sys; u.urlopen(sys.argv[1], timeout=2)" \
            "http://127.0.0.1:$(cat "$t/port")/health" >/dev/null 2>&1; then
            ready=$((($(date +%s%N) - t0) / 1000000))
            break
        fi
        sleep 0.1
    done
    if [ -n "$ready" ]; then
        local url=http://127.0.0.1:$(cat "$t/port") c=(python3 "$here/bench/serve_bench.py" --clients 1
            --prompt-tokens "$ttft_prompt" --max-tokens 8 --prompts 1)
        # the first request after ready, then warm ones (the same prompt length, another prompt each)
        timeout 120 "${c[@]}" --url "$url" --requests 1 --warmup 0 >"$logs/load_${name}_first.log" 2>&1
        timeout 120 "${c[@]}" --url "$url" --requests 5 --warmup 1 >"$logs/load_${name}_warm.log" 2>&1
        kill -TERM $pid
    fi
    wait $pid
    local ttft1 ttftw
    ttft1=$(ttft_p50 "$logs/load_${name}_first.log")
    ttftw=$(ttft_p50 "$logs/load_${name}_warm.log")
    echo "| $name | $(grep -m1 -oE 'loaded [0-9.]+ GB in [0-9.]+ s \([0-9.]+ GB/s\)' "$logs/load_${name}_generate.log") |" \
        "${ready:-no /health} ms | $(grep -m1 -oE 'warmed up in [0-9.]+ s' "$logs/load_${name}_serve.log") |" \
        "${ttft1:-?} | ${ttftw:-?} |" >>"$table"
}

part_load() {
    local ck=${CKPT_DIR:-/tmp/fm-ckpt} int4
    # bf16 at Qwen3-30B-A3B's widths (61 GB at 48 layers: the machine's disk, or /dev/shm when the disk is short),
    # its int4 twin by `fp8moe requantize` (17 GB) where the other file system has room
    local need_gb=$((load_layers * 13 / 10 + 1))
    if [ "$dry" != 1 ] && [ "$(df -BG --output=avail "$(dirname "$ck")" | tail -1 | tr -dc 0-9)" -lt "$need_gb" ] &&
        [ "$(df -BG --output=avail /dev/shm | tail -1 | tr -dc 0-9)" -ge "$need_gb" ]; then ck=/dev/shm/fm-ckpt; fi
    int4=${INT4_DIR:-/dev/shm/fm-int4}
    if [ "$dry" != 1 ] && [ "$(df -BG --output=avail /dev/shm | tail -1 | tr -dc 0-9)" -lt $((load_layers / 3 + 2)) ]; then
        int4=$ck-int4
    fi
    run load_df 10 df -h "$(dirname "$ck")" /dev/shm
    [ "$dry" = 1 ] || python3 -c "import struct,sys; sys.stdout.buffer.write(struct.pack('<$ttft_prompt''i', *[16 + i % 4000 for i in range($ttft_prompt)]))" >"$work/ids.i32"
    {
        echo "### load ($load_layers layers at Qwen3-30B-A3B widths; page cache warm)"
        echo
        echo "| checkpoint | generate --verbose load line | serve: /health after | warm-up | first TTFT ms | warm TTFT p50 ms |"
        echo "|---|---|---:|---|---:|---:|"
    } >>"$table"
    run load_write_bf16 600 bash -c "rm -rf '$ck' '$int4' && python3 '$here/tools/timing_checkpoint.py' '$ck' $load_layers" ||
        return
    load_one bf16 "$ck" --preset fp8 --dense w8a8
    run load_requantize 600 "$new/fp8moe" requantize --model "$ck" --out "$int4" --quiet &&
        load_one int4 "$int4" --preset fp8
    echo >>"$table"
    [ "${KEEP_CKPT:-0}" = 1 ] || rm -rf "$ck" "$int4"
}

[ "$dry" = 1 ] || ! command -v nvidia-smi >/dev/null || nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$logs/gpu.txt" 2>&1
{ echo "date $(date -u +%FT%TZ), part $part, backend $backend, smoke $smoke"; echo "new $new: $(cd "$here" && git log -1 --format='%h %s' 2>/dev/null)";
  echo "base $base"; cat "$logs/gpu.txt" 2>/dev/null; } >"$logs/about.txt"
unpack_bins
case "$part" in decode | prefill | serve | serve-steps | all) build_base ;; esac
pack_bins
case "$part" in decode | all) part_decode ;; esac
case "$part" in prefill | all) part_prefill ;; esac
case "$part" in serve* | all) part_serve ;; esac
case "$part" in load | all) part_load ;; esac
cat "$logs/about.txt" >"$out/measure-$part.md"
cat "$table" >>"$out/measure-$part.md"
[ -s "$logs/failures.md" ] && { echo "### failures"; echo; echo "| run | result |"; echo "|---|---|"; cat "$logs/failures.md"; } >>"$out/measure-$part.md"
tar -czf "$out/measure-$part-logs.tar.gz" -C "$work" "logs-$part"
echo
cat "$out/measure-$part.md"
[ ! -s "$logs/failures.md" ]
