/* One rank's memory (fm_memory_plan_rank, src/engine/memory_rank.c) against what a rank of a group really holds, on
 * the CPU backend, which runs ranks: at --ep 2 (and --tp 2, and both) each rank's weight banks equal the plan's rank
 * weights family by family (its experts only, its heads' attention rows and columns), and the activation and
 * exchange buffers the forward pass reserves equal the plan's activations plus its exchange buffers, allocation for
 * allocation (the backend's alloc counted). The load's pre-load check and the CUDA backend's scratch for the received
 * blocks use the same function; their device side is tests/gpu/test_cuda_memory.c's. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "engine/engine.h"
#include "engine/memory_plan.h"

#define MODEL "models/tiny-code-moe"

/* the loaded model's banks, by the plan's families */
static void loaded_bytes(const fm_model *m, size_t *bytes) {
    memset(bytes, 0, FM_MEM_FAMILY_COUNT * sizeof *bytes);
    const fm_backend_ops *o = m->be->ops;
    bytes[FM_MEM_EMBED] += o->bank_bytes(m->embed);
    if (m->lm_head != m->embed) bytes[FM_MEM_LM_HEAD] += o->bank_bytes(m->lm_head);
    bytes[FM_MEM_NORMS] += o->bank_bytes(m->final_norm);
    for (int l = 0; l < m->n_layers; l++) {
        const fm_layer_weights *L = &m->layers[l];
        const fm_bank *norms[] = {L->attn_norm, L->ffn_norm, L->q_norm, L->k_norm};
        for (int i = 0; i < 4; i++)
            if (norms[i]) bytes[FM_MEM_NORMS] += o->bank_bytes(norms[i]);
        bytes[FM_MEM_ATTN] += o->bank_bytes(L->qkv) + o->bank_bytes(L->o);
        if (L->router) bytes[FM_MEM_ROUTER] += o->bank_bytes(L->router);
        const fm_mem_family f = L->is_moe ? FM_MEM_EXPERTS : FM_MEM_DENSE_MLP;
        bytes[f] += o->bank_bytes(L->gate_up) + o->bank_bytes(L->down);
    }
}

/* a backend's alloc, counted */
static const fm_backend_ops *real_ops;
static size_t allocated;
static void *counting_alloc(fm_backend *be, size_t bytes) {
    allocated += bytes;
    return real_ops->alloc(be, bytes);
}

static void rank_plan(const fm_model *m, int64_t T, int32_t ep, int32_t tp, int32_t rank, fm_memory_plan *p) {
    fm_config cfg = m->cfg;
    cfg.tie_word_embeddings = m->lm_head == m->embed;
    fm_error err = {{0}};
    if (fm_memory_plan_compute_routes(&cfg, &m->plan, "cpu", &m->routes, m->n_layers, T, p, &err) ||
        fm_memory_plan_rank(p, &cfg, &m->plan, ep, tp, rank, &err))
        fail_msg("rank plan: %s", err.msg);
}

static void one_split(fm_preset preset, int32_t ep, int32_t tp) {
    const int32_t N = ep > tp ? ep : tp;
    const int64_t T = 48;
    fm_memory_plan whole;
    for (int32_t r = 0; r < N; r++) {
        fm_options opt;
        fm_options_init(&opt);
        opt.preset = preset, opt.max_tokens = T;
        opt.ep_ranks = ep, opt.ep_rank = ep > 1 ? r : 0, opt.tp_ranks = tp, opt.tp_rank = tp > 1 ? r : 0;
        fm_model *m = NULL;
        fm_error err = {{0}};
        if (fm_model_load(MODEL, &opt, &m, &err)) fail_msg("load rank %d: %s", r, err.msg);
        if (r == 0) rank_plan(m, T, 1, 1, 0, &whole);
        fm_memory_plan p;
        rank_plan(m, T, ep, tp, r, &p);
        size_t got[FM_MEM_FAMILY_COUNT];
        loaded_bytes(m, got);
        for (int f = 0; f < FM_MEM_FAMILY_COUNT; f++)
            if (got[f] != p.weights[f])
                fail_msg("%s --ep %d --tp %d rank %d: %s holds %zu bytes, the rank's plan says %zu",
                         fm_preset_name(preset), ep, tp, r, fm_mem_family_name((fm_mem_family)f), got[f], p.weights[f]);
        assert_int_equal(m->weight_bytes, p.weight_total);
        if (ep > 1) { /* the rank's experts only, and the exchange on top of the one model's run */
            assert_int_equal(p.weights[FM_MEM_EXPERTS] * (size_t)ep, whole.weights[FM_MEM_EXPERTS]);
            assert_true(p.ep_exchange > 0);
        } else {
            assert_int_equal(p.ep_exchange, 0);
        }
        if (tp > 1) assert_true(p.weights[FM_MEM_ATTN] < whole.weights[FM_MEM_ATTN]);
        assert_true(p.peak < whole.peak + p.ep_exchange);
        assert_int_equal(p.total, p.weight_total + p.activations + p.workspace + p.ep_exchange);
        /* the forward pass's reservation again, its allocations counted: the plan's activations and exchange */
        fm_forward_buffers_free(m->context);
        fm_backend_ops counting = *m->be->ops;
        real_ops = m->be->ops, counting.alloc = counting_alloc, allocated = 0;
        m->be->ops = &counting;
        if (fm_forward_reserve(m->context, T, &err)) fail_msg("reserve: %s", err.msg);
        m->be->ops = real_ops;
        assert_int_equal(allocated, p.activations + p.ep_exchange);
        fm_model_free(m);
    }
}

static void expert_parallel_ranks(void **s) {
    (void)s;
    one_split(FM_PRESET_REF, 2, 1);
    one_split(FM_PRESET_INT4, 2, 1);
    one_split(FM_PRESET_FP8, 2, 1);
}

static void tensor_parallel_ranks(void **s) {
    (void)s;
    one_split(FM_PRESET_REF, 1, 2);
    one_split(FM_PRESET_REF, 2, 2);
}

/* what the rank function refuses */
static void rank_refusals(void **s) {
    (void)s;
    fm_options opt;
    fm_options_init(&opt);
    fm_model *m = NULL;
    fm_error err = {{0}};
    assert_int_equal(fm_model_load(MODEL, &opt, &m, &err), FM_OK);
    fm_memory_plan p;
    rank_plan(m, 16, 1, 1, 0, &p);
    fm_memory_plan q = p;
    assert_int_equal(fm_memory_plan_rank(&q, &m->cfg, &m->plan, 3, 1, 0, &err), FM_ERR_USAGE); /* 16 experts / 3 */
    assert_non_null(strstr(err.msg, "3 ranks"));
    q = p;
    assert_int_equal(fm_memory_plan_rank(&q, &m->cfg, &m->plan, 2, 1, 2, &err), FM_ERR_USAGE);
    assert_non_null(strstr(err.msg, "rank 2"));
    q = p;
    assert_int_equal(fm_memory_plan_rank(&q, &m->cfg, &m->plan, 2, 1, 0, &err), FM_OK);
    assert_int_equal(fm_memory_plan_rank(&q, &m->cfg, &m->plan, 2, 1, 0, &err), FM_ERR_USAGE); /* twice */
    fm_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(expert_parallel_ranks),
        cmocka_unit_test(tensor_parallel_ranks),
        cmocka_unit_test(rank_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
