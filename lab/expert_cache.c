/* The expert cache's hit rate on a real model's routing (experts in host memory, the CPU emulation): teacher-forced
 * decode of a token file, one token per step through the KV cache (as generation runs), for several cache sizes S
 * and both eviction policies. The routing does not depend on S or the policy (the logits are bit-identical to
 * device experts: tests/test_expert_offload.c), so every row sees the same sequence of routed experts.
 *
 *   make -C lab expert_cache && ./build/lab/expert_cache            (models/tiny-code-moe, its eval text)
 *   ./build/lab/expert_cache --model DIR --ids FILE --tokens 2048 --slots 16,24,32,48,64 --preset fp8
 *
 * Prints per (policy, S): expert reads (distinct (layer, expert) per step), the hit rate, misses per token and the
 * bytes they copy per token at the GPU's slot size (the plan's; the cpu stores fp32 and copies more). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/kv_state.h"
#include "engine/memory_plan.h"
#include "util/ids.h"

static int fail(const char *what, const fm_error *err) {
    fprintf(stderr, "expert_cache: %s: %s\n", what, err->msg);
    return 1;
}

/* one teacher-forced decode of ids[0..n) with the cache of S slots and policy; the counters into *out */
static fm_status run(const char *dir, fm_preset preset, const int32_t *ids, int64_t n, int32_t S, fm_expert_policy pol,
                     fm_expert_stats *out, fm_error *err) {
    fm_options opt;
    fm_options_init(&opt);
    opt.preset = preset, opt.plan_backend = "cuda"; /* the GPU's formats, emulated */
    opt.max_seqs = 1, opt.ctx = n + 1, opt.max_tokens = 1;
    opt.n_threads = 1; /* a tiny model: one thread is the fastest (and steady on a shared machine) */
    opt.experts_in = FM_EXPERTS_HOST, opt.expert_slots = S, opt.expert_policy = pol;
    fm_model *m = NULL;
    fm_status st = fm_model_load(dir, &opt, &m, err);
    if (st) return st;
    fm_sampling sp;
    fm_sampling_init(&sp);
    int32_t seq = -1;
    st = fm_kv_seq_begin(m->context, ids, 1, &sp, &seq, err);
    for (int64_t t = 0; !st && t < n; t++) {
        const int32_t pos = (int32_t)t;
        st = fm_kv_seq_append(&m->context->kv->pool, seq, 1, err);
        m->context->kv->tables_dirty = true;
        if (!st) st = fm_step_stage(m->context, ids + t, &seq, &pos, 1, err);
        if (!st) fm_step_device(m->context, 1, true, t == 0 ? FM_ATTN_FRESH : FM_ATTN_PAGED);
    }
    if (!st) st = m->be->ops->sync(m->be, err);
    if (!st) fm_context_expert_stats(m->context, out);
    fm_model_free(m);
    return st;
}

int main(int argc, char **argv) {
    const char *dir = "models/tiny-code-moe", *ids_path = "models/tiny-code-moe/eval_ids.i32",
               *slots = "16,24,32,48,64";
    fm_preset preset = FM_PRESET_FP8;
    int64_t n = 2048;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--model")) dir = argv[i + 1];
        else if (!strcmp(argv[i], "--ids")) ids_path = argv[i + 1];
        else if (!strcmp(argv[i], "--tokens")) n = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--slots")) slots = argv[i + 1];
        else if (!strcmp(argv[i], "--preset") && fm_preset_parse(argv[i + 1], &preset)) continue;
        else {
            fprintf(stderr,
                    "usage: expert_cache [--model DIR] [--ids FILE] [--tokens N] [--slots LIST] [--preset P]\n");
            return 2;
        }
    }
    fm_error err = {{0}};
    int32_t *ids = NULL;
    int64_t n_ids = 0;
    if (fm_ids_read(ids_path, &ids, &n_ids, &err)) return fail(ids_path, &err);
    if (n < 1 || n > n_ids) {
        fprintf(stderr, "expert_cache: --tokens %lld: %s holds %lld\n", (long long)n, ids_path, (long long)n_ids);
        return 2;
    }
    printf("expert cache on %s, %lld tokens of %s decoded one per step (teacher-forced), preset %s (cuda formats on "
           "the cpu)\n\n",
           dir, (long long)n, ids_path, fm_preset_name(preset));
    /* a slot's bytes on the GPU (the cpu backend stores fp32: its copies are larger) */
    fm_config cfg;
    fm_plan plan;
    fm_memory_plan mp;
    if (fm_config_load(dir, &cfg, &err)) return fail(dir, &err);
    fm_plan_for_backend(preset, "cuda", &plan);
    if (fm_memory_plan_compute(&cfg, &plan, "cuda", 0, 1, &mp, &err)) return fail(dir, &err);
    printf("a slot on the GPU: %.1f KiB (gate_up + down, %s)\n\n", (double)mp.expert_slot_bytes / 1024,
           fm_wformat_name(mp.formats[FM_MEM_EXPERTS]));
    printf("| policy | slots | of experts | expert reads | hit rate | misses / token | GPU KiB copied / token |\n");
    printf("|---|---:|---:|---:|---:|---:|---:|\n");
    for (int p = 0; p < 2; p++) {
        char buf[256];
        snprintf(buf, sizeof buf, "%s", slots);
        for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            fm_expert_stats s;
            const fm_expert_policy pol = p ? FM_EXPERT_LFU : FM_EXPERT_LRU;
            if (run(dir, preset, ids, n, atoi(tok), pol, &s, &err)) return fail(dir, &err);
            const int64_t reads = s.hits + s.misses;
            printf("| %s | %d | %d | %lld | %.2f%% | %.3f | %.1f |\n", fm_expert_policy_name(pol), s.slots, s.experts,
                   (long long)reads, 100.0 * (double)s.hits / (double)reads, (double)s.misses / (double)n,
                   (double)s.misses * (double)mp.expert_slot_bytes / 1024.0 / (double)n);
            fflush(stdout);
        }
    }
    free(ids);
    return 0;
}
