/* Can a layer's routing predict the next layer's? The prefetch question of experts in host memory: a miss's copy
 * could start before the next layer's router runs (overlapping the link with this layer's compute) if the experts it
 * will need were known. Teacher-forced decode of a token file on the CPU (a real model's routing), every fetch's
 * routed ids recorded (the backend's expert_fetch, wrapped); then, on the second half of the tokens, with statistics
 * from the first half, for each token and layer l + 1 (l + 1 >= 1):
 *   - the experts it routes to, A(t, l + 1), against six predictions of k experts made before its router runs:
 *       co-occurrence  the k experts of layer l + 1 most often routed together with A(t, l) (counted on the first half)
 *       frequency      layer l + 1's k most used experts (first half)
 *       previous token A(t - 1, l + 1)
 *       router on the residual entering layer l + 1 (pre-gating): layer l + 1's router on its ffn_norm of the
 *                      residual stream before layer l + 1's mixer (known while layer l + 1's attention runs)
 *       router on the residual after layer l's mixer: the same on the stream before layer l's experts (known a
 *                      layer earlier: while layer l's experts and layer l + 1's mixer run)
 *       random         k of E (expected overlap k / E)
 *     (the residual stream recorded from the add + RMSNorm op, wrapped like the fetch: its accumulator after the
 *     add is the stream after each mixer and after each layer);
 *     recall = |prediction & A| / k;
 *   - with the expert cache of S slots (LFU, the reference of backend/expert_residency.h) replaying the recorded
 *     fetches: how many of the fetch's misses the co-occurrence prediction held (copies that could have started a
 *     layer early) and how many predicted experts were neither needed nor resident (copies a prefetch would waste);
 *   - the same cache replayed with the pre-gating prefetches made (a fetch of the predicted experts before the layer's
 *     mixer (a), or before the previous layer's router (b)): the copies left in each layer's own fetch, which its
 *     GEMMs wait for, and the copies made early, whose time could hide under compute.
 *
 *   make -C lab expert_prefetch && ./build/lab/expert_prefetch [--model DIR] [--ids FILE] [--tokens N] [--slots S] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/expert_residency.h"
#include "engine/engine.h"
#include "engine/kv_state.h"
#include "util/ids.h"

/* the recording: ids of every fetch, in order (layer of each fetch, its P ids) */
typedef struct recording {
    int32_t *layer, *n, *ids; /* [fetches], [fetches], [fetches * max_p] */
    int64_t fetches, cap, max_p;
} recording;

static recording rec;
static void (*real_fetch)(fm_backend *, fm_expert_cache *, int32_t, const void *, int64_t);

/* the residual stream of the current step, one row per add + RMSNorm call in call order: after layer 0's mixer,
   entering layer 1, after layer 1's mixer, ... (cpu backend: its buffers are host floats) */
static float *stream_rows;
static int32_t stream_calls, stream_cap, stream_H;
static void (*real_add_rmsnorm)(fm_backend *, void *, const void *, const fm_bank *, int64_t, int64_t, float, void *);

static void recording_add_rmsnorm(fm_backend *be, void *acc, const void *x, const fm_bank *w, int64_t rows, int64_t dim,
                                  float eps, void *out) {
    real_add_rmsnorm(be, acc, x, w, rows, dim, eps, out);
    if (rows == 1 && dim == stream_H && stream_calls < stream_cap)
        memcpy(stream_rows + (size_t)stream_calls * stream_H, acc, (size_t)dim * sizeof(float));
    stream_calls++;
}

static void recording_fetch(fm_backend *be, fm_expert_cache *c, int32_t layer, const void *ids, int64_t P) {
    if (rec.fetches < rec.cap && P <= rec.max_p) {
        rec.layer[rec.fetches] = layer, rec.n[rec.fetches] = (int32_t)P;
        memcpy(rec.ids + rec.fetches * rec.max_p, ids, (size_t)P * sizeof(int32_t));
        rec.fetches++;
    }
    real_fetch(be, c, layer, ids, P);
}

static int fail(const char *what, const fm_error *err) {
    fprintf(stderr, "expert_prefetch: %s: %s\n", what, err->msg);
    return 1;
}

/* the k largest of score[E] (ties to the lower index) into out[k] */
static void top_k(const double *score, int32_t E, int32_t k, int32_t *out) {
    for (int32_t j = 0; j < k; j++) {
        int32_t best = -1;
        for (int32_t e = 0; e < E; e++) {
            bool taken = false;
            for (int32_t i = 0; i < j; i++) taken |= out[i] == e;
            if (!taken && (best < 0 || score[e] > score[best])) best = e;
        }
        out[j] = best;
    }
}

static int32_t overlap(const int32_t *a, const int32_t *b, int32_t k) {
    int32_t n = 0;
    for (int32_t i = 0; i < k; i++)
        for (int32_t j = 0; j < k; j++) n += a[i] == b[j];
    return n;
}

int main(int argc, char **argv) {
    const char *dir = "models/tiny-code-moe", *ids_path = "models/tiny-code-moe/eval_ids.i32";
    int64_t n = 2048;
    int32_t S = 24;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--model")) dir = argv[i + 1];
        else if (!strcmp(argv[i], "--ids")) ids_path = argv[i + 1];
        else if (!strcmp(argv[i], "--tokens")) n = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--slots")) S = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: expert_prefetch [--model DIR] [--ids FILE] [--tokens N] [--slots S]\n");
            return 2;
        }
    }
    fm_error err = {{0}};
    int32_t *ids = NULL;
    int64_t n_ids = 0;
    if (fm_ids_read(ids_path, &ids, &n_ids, &err)) return fail(ids_path, &err);
    if (n < 4 || n > n_ids) {
        fprintf(stderr, "expert_prefetch: --tokens %lld: %s holds %lld\n", (long long)n, ids_path, (long long)n_ids);
        return 2;
    }
    fm_options opt;
    fm_options_init(&opt);
    opt.preset = FM_PRESET_FP8, opt.plan_backend = "cuda";
    opt.max_seqs = 1, opt.ctx = n + 1, opt.max_tokens = 1, opt.n_threads = 1;
    opt.experts_in = FM_EXPERTS_HOST; /* the cpu's cache holds every expert: only the ids matter here */
    fm_model *m = NULL;
    if (fm_model_load(dir, &opt, &m, &err)) return fail(dir, &err);
    const int32_t L = m->n_layers, E = m->cfg.n_experts, k = m->cfg.n_experts_per_tok;
    int32_t moe = 0;
    for (int32_t l = 0; l < L; l++) moe += m->layers[l].is_moe;
    rec.max_p = k, rec.cap = n * moe;
    rec.layer = malloc((size_t)rec.cap * sizeof(int32_t)), rec.n = malloc((size_t)rec.cap * sizeof(int32_t));
    rec.ids = malloc((size_t)(rec.cap * k) * sizeof(int32_t));
    /* wrap the backend's fetch (a copy of its op table: lab code, not the engine's) */
    static fm_backend_ops ops;
    ops = *m->be->ops, real_fetch = ops.expert_fetch, ops.expert_fetch = recording_fetch;
    real_add_rmsnorm = ops.add_rmsnorm, ops.add_rmsnorm = recording_add_rmsnorm, m->be->ops = &ops;
    fm_backend *be = m->be;
    const int64_t H = m->cfg.hidden_size;
    stream_H = (int32_t)H, stream_cap = 2 * L;
    stream_rows = malloc((size_t)(stream_cap * H) * sizeof(float));
    /* pre-gating predictions, per token and MoE layer: [n][moe][k], from the stream entering the layer and from the
       stream after the previous layer's mixer; the router's logits ranked (softmax keeps the order) */
    int32_t *pg_enter = malloc((size_t)(n * moe * k) * sizeof(int32_t)),
            *pg_mid = malloc((size_t)(n * moe * k) * sizeof(int32_t));
    float *xn = be->ops->alloc(be, (size_t)H * sizeof(float)), *lg = be->ops->alloc(be, (size_t)E * sizeof(float));
    double *lgd = malloc((size_t)E * sizeof *lgd);
    fm_sampling sp;
    fm_sampling_init(&sp);
    int32_t seq = -1;
    fm_status st = fm_kv_seq_begin(m->context, ids, 1, &sp, &seq, &err);
    for (int64_t t = 0; !st && t < n; t++) {
        const int32_t pos = (int32_t)t;
        st = fm_kv_seq_append(&m->context->kv->pool, seq, 1, &err);
        m->context->kv->tables_dirty = true;
        if (!st) st = fm_step_stage(m->context, ids + t, &seq, &pos, 1, &err);
        stream_calls = 0;
        if (!st) fm_step_device(m->context, 1, true, t == 0 ? FM_ATTN_FRESH : FM_ATTN_PAGED);
        if (!st && stream_calls != 2 * L - 1) {
            fprintf(stderr, "expert_prefetch: %d add + RMSNorm calls in a step, expected %d\n", stream_calls,
                    2 * L - 1);
            return 1;
        }
        /* layer l's router on its ffn_norm of the stream entering layer l (call 2 l - 1) and of the stream after layer
           l - 1's mixer (call 2 l - 2) */
        for (int32_t l = 1, j = m->layers[0].is_moe; !st && l < L; l++) {
            if (!m->layers[l].is_moe) continue;
            for (int v = 0; v < 2; v++) {
                be->ops->rmsnorm(be, stream_rows + (size_t)(2 * l - 1 - v) * H, m->layers[l].ffn_norm, 1, H,
                                 m->cfg.rms_norm_eps, xn);
                be->ops->linear(be, m->layers[l].router, 0, xn, 1, FM_A_NATIVE, lg);
                for (int32_t e = 0; e < E; e++) lgd[e] = lg[e];
                top_k(lgd, E, k, (v ? pg_mid : pg_enter) + ((size_t)t * moe + j) * k);
            }
            j++;
        }
    }
    if (st) return fail("decode", &err);
    if (rec.fetches != n * moe) {
        fprintf(stderr, "expert_prefetch: %lld fetches recorded, expected %lld\n", (long long)rec.fetches,
                (long long)(n * moe));
        return 1;
    }
    /* A(t, j): the routed experts of token t at the j-th MoE layer */
#define A(t, j) (rec.ids + ((int64_t)(t)*moe + (j)) * k)
    const int64_t half = n / 2;
    double *co = calloc((size_t)moe * E * E, sizeof *co), *freq = calloc((size_t)moe * E, sizeof *freq);
    for (int64_t t = 0; t < half; t++)
        for (int32_t j = 0; j < moe; j++)
            for (int32_t a = 0; a < k; a++) {
                freq[(size_t)j * E + A(t, j)[a]] += 1;
                if (j + 1 < moe)
                    for (int32_t b = 0; b < k; b++) co[((size_t)j * E + A(t, j)[a]) * E + A(t, j + 1)[b]] += 1;
            }
    /* the cache replaying every recorded fetch, the first half included (its state at the second half is real) */
    /* rpe, rpm: the same cache with the prefetches of (a) and (b) applied as fetches; rpx, rph: (a) as the engine
       prefetches (fm_residency_prefetch: no use counted, the layer's slots kept), all k predicted experts and the
       top k / 2 of them */
    fm_residency r, rpe, rpm, rpx, rph;
    if (fm_residency_init(&r, L, E, S, FM_EXPERT_LFU, &err) || fm_residency_init(&rpe, L, E, S, FM_EXPERT_LFU, &err) ||
        fm_residency_init(&rpm, L, E, S, FM_EXPERT_LFU, &err) ||
        fm_residency_init(&rpx, L, E, S, FM_EXPERT_LFU, &err) || fm_residency_init(&rph, L, E, S, FM_EXPERT_LFU, &err))
        return fail("residency", &err);
    /* per layer pass of the second half: copies the layer's own fetch makes (each stalls its GEMMs) and the
       prefetches' copies (under earlier work), for the caches with prefetch (a) and (b) */
    double stall_pe = 0, pre_pe = 0, stall_pm = 0, pre_pm = 0, passes = 0, all_misses = 0;
    double stall_px = 0, pre_px = 0, stall_ph = 0, pre_ph = 0;
    int32_t slots[64], ce[1024], cs[1024], nc;
    int32_t *moe_layer = malloc((size_t)moe * sizeof *moe_layer);
    for (int32_t l = 0, j = 0; l < L; l++)
        if (m->layers[l].is_moe) moe_layer[j++] = l;
    double rec_co = 0, rec_fr = 0, rec_prev = 0, rec_pe = 0, rec_pm = 0, n_pred = 0, misses = 0, caught = 0, wasted = 0;
    double caught_pe = 0, wasted_pe = 0, caught_pm = 0, wasted_pm = 0;
    int32_t pred[64], pf[64];
    double *score = malloc((size_t)E * sizeof *score);
    for (int64_t t = 0; t < n; t++)
        for (int32_t j = 0; j < moe; j++) {
            const int32_t *a = A(t, j);
            bool *resident = calloc((size_t)E, sizeof(bool));
            for (int32_t e = 0; e < E; e++) resident[e] = r.slot_of[(size_t)moe_layer[j] * E + e] >= 0;
            if (t >= half && j > 0) {
                /* the predictions for layer j, made from layer j - 1's routing of the same token */
                for (int32_t e = 0; e < E; e++) {
                    score[e] = 0;
                    for (int32_t b = 0; b < k; b++) score[e] += co[((size_t)(j - 1) * E + A(t, j - 1)[b]) * E + e];
                }
                top_k(score, E, k, pred);
                for (int32_t e = 0; e < E; e++) score[e] = freq[(size_t)j * E + e];
                top_k(score, E, k, pf);
                const int32_t *pe = pg_enter + ((size_t)t * moe + j) * k, *pm = pg_mid + ((size_t)t * moe + j) * k;
                rec_co += overlap(pred, a, k), rec_fr += overlap(pf, a, k), rec_prev += overlap(A(t - 1, j), a, k);
                rec_pe += overlap(pe, a, k), rec_pm += overlap(pm, a, k);
                n_pred += k;
                const int32_t *ps[3] = {pred, pe, pm};
                double *wasted_of[3] = {&wasted, &wasted_pe, &wasted_pm},
                       *caught_of[3] = {&caught, &caught_pe, &caught_pm};
                for (int q = 0; q < 3; q++)
                    for (int32_t i = 0; i < k; i++) {
                        bool needed = false;
                        for (int32_t b = 0; b < k; b++) needed |= ps[q][i] == a[b];
                        *wasted_of[q] += !needed && !resident[ps[q][i]];
                    }
                for (int32_t b = 0; b < k; b++)
                    if (!resident[a[b]]) {
                        misses++;
                        for (int q = 0; q < 3; q++)
                            for (int32_t i = 0; i < k; i++) *caught_of[q] += ps[q][i] == a[b];
                    }
            }
            free(resident);
            fm_residency_fetch(&r, moe_layer[j], a, k, slots, ce, cs, &nc);
            const bool counted = t >= half;
            passes += counted, all_misses += counted ? nc : 0;
            /* (a): before layer j's mixer, layer j's predicted experts; then its own fetch */
            if (j > 0) {
                fm_residency_fetch(&rpe, moe_layer[j], pg_enter + ((size_t)t * moe + j) * k, k, slots, ce, cs, &nc);
                pre_pe += counted ? nc : 0;
            }
            fm_residency_fetch(&rpe, moe_layer[j], a, k, slots, ce, cs, &nc);
            stall_pe += counted ? nc : 0;
            /* (a) as the engine prefetches: all k, then the top k / 2 */
            if (j > 0) {
                const int32_t *pe = pg_enter + ((size_t)t * moe + j) * k;
                fm_residency_prefetch(&rpx, moe_layer[j], pe, 1, k, k, ce, cs, &nc);
                pre_px += counted ? nc : 0;
                fm_residency_prefetch(&rph, moe_layer[j], pe, 1, k, k / 2 > 0 ? k / 2 : 1, ce, cs, &nc);
                pre_ph += counted ? nc : 0;
            }
            fm_residency_fetch(&rpx, moe_layer[j], a, k, slots, ce, cs, &nc);
            stall_px += counted ? nc : 0;
            fm_residency_fetch(&rph, moe_layer[j], a, k, slots, ce, cs, &nc);
            stall_ph += counted ? nc : 0;
            /* (b): after layer j's mixer (before its router), layer j + 1's predicted experts; then layer j's fetch */
            if (j + 1 < moe) {
                fm_residency_fetch(&rpm, moe_layer[j + 1], pg_mid + ((size_t)t * moe + j + 1) * k, k, slots, ce, cs,
                                   &nc);
                pre_pm += counted ? nc : 0;
            }
            fm_residency_fetch(&rpm, moe_layer[j], a, k, slots, ce, cs, &nc);
            stall_pm += counted ? nc : 0;
        }
    printf("expert prefetch on %s: %lld tokens of %s decoded one per step (teacher-forced), %d MoE layers x %d "
           "experts, top-%d; statistics from the first %lld tokens, figures over the other %lld, layers 2..%d\n\n",
           dir, (long long)n, ids_path, moe, E, k, (long long)half, (long long)(n - half), moe);
    printf("| prediction of layer l + 1's experts | recall (of k) |\n|---|---:|\n");
    printf("| co-occurrence with layer l's experts (same token) | %.2f%% |\n", 100.0 * rec_co / n_pred);
    printf("| layer l + 1's most used experts | %.2f%% |\n", 100.0 * rec_fr / n_pred);
    printf("| the previous token's experts at layer l + 1 | %.2f%% |\n", 100.0 * rec_prev / n_pred);
    printf("| layer l + 1's router on the residual entering layer l + 1 | %.2f%% |\n", 100.0 * rec_pe / n_pred);
    printf("| layer l + 1's router on the residual after layer l's mixer | %.2f%% |\n", 100.0 * rec_pm / n_pred);
    printf("| random (k / E) | %.2f%% |\n", 100.0 * k / E);
    printf("\nwith the expert cache (LFU, %d slots of %d): %.0f misses; the co-occurrence prediction held %.2f%% of "
           "them, and named %.2f non-resident experts per layer pass that were not needed (copies a prefetch would "
           "waste), against %.2f misses per layer pass\n",
           S, moe * E, misses, 100.0 * caught / (misses > 0 ? misses : 1), wasted / (n_pred / k),
           misses / (n_pred / k));
    printf("the router on the residual entering the layer: held %.2f%% of the misses, %.2f wasted copies per pass; "
           "after the previous layer's mixer: %.2f%%, %.2f\n",
           100.0 * caught_pe / (misses > 0 ? misses : 1), wasted_pe / (n_pred / k),
           100.0 * caught_pm / (misses > 0 ? misses : 1), wasted_pm / (n_pred / k));
    printf("\nthe cache with the prefetches applied (every layer of the second half, LFU, %d slots), copies per layer "
           "pass: without prefetch %.3f, all in the layer's own fetch; prefetch (a) %.3f in the fetch + %.3f "
           "earlier; prefetch (b) %.3f + %.3f earlier\n",
           S, all_misses / passes, stall_pe / passes, pre_pe / passes, stall_pm / passes, pre_pm / passes);
    printf("(a) as the engine prefetches (fm_residency_prefetch: no use counted, the layer's own slots kept): all k "
           "predicted %.3f in the fetch + %.3f earlier; the top k / 2 %.3f + %.3f earlier\n",
           stall_px / passes, pre_px / passes, stall_ph / passes, pre_ph / passes);
    fm_residency_free(&rpe), fm_residency_free(&rpm), fm_residency_free(&rpx), fm_residency_free(&rph);
    free(pg_enter), free(pg_mid), free(lgd), free(stream_rows);
    be->ops->free(be, xn), be->ops->free(be, lg);
    free(co), free(freq), free(score), free(moe_layer), free(rec.layer), free(rec.n), free(rec.ids), free(ids);
    fm_residency_free(&r);
    fm_model_free(m);
    return 0;
}
