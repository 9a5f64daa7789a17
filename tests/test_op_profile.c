/* The per-op profile of a decode step (fm_step_profile_ops) on the CPU backend, for the tiny Qwen3-MoE, Mixtral and
 * Qwen3-Next models: every op the forward pass issues appears once per layer that runs it (the op sequence below,
 * written from the architecture, not read back from the profile), its bytes are positive and hold at least the
 * weights it reads, and the rows add up to the step. No timing is asserted. Qwen3-Next's prompt chunk at position > 0
 * beside a decode row takes the chunked delta rule. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/routes.h"
#include "engine/engine.h"
#include "engine/kv_state.h"

typedef struct want {
    const char *kind, *op;
    int32_t count;
} want;

typedef struct want_list {
    int32_t n;
    want w[FM_OP_ROWS];
} want_list;

static void expect(want_list *l, const char *kind, const char *op) {
    for (int32_t i = 0; i < l->n; i++)
        if (!strcmp(l->w[i].kind, kind) && !strcmp(l->w[i].op, op)) {
            l->w[i].count++;
            return;
        }
    assert_true(l->n < FM_OP_ROWS);
    l->w[l->n++] = (want){kind, op, 1};
}

/* the ops a one-token decode step issues, layer by layer */
static void expected_ops(const fm_model *m, want_list *l) {
    const fm_config *c = &m->cfg;
    const fm_backend_ops *ops = m->be->ops;
    const bool fused = ops->linear_add_rmsnorm && fm_routes_fused_o_proj(&m->routes);
    memset(l, 0, sizeof *l);
    expect(l, "step", "embed");
    for (int32_t i = 0; i < m->n_layers; i++) {
        const fm_layer_weights *L = &m->layers[i];
        const bool gdn = fm_layer_kind_is_gdn(L->kind);
        const char *mixer = gdn ? "deltanet" : "attention", *ffn = L->is_moe ? "moe" : "dense";
        if (i == 0) expect(l, mixer, "attn_norm");
        if (gdn) {
            const bool gdn_fused = ops->gdn_decode_fused && fm_routes_fused_gdn(&m->routes);
            const bool ba_in_op = gdn_fused && fm_routes_gdn_decode_ba(&m->routes); /* route gdn.decode_ba */
            expect(l, mixer, ba_in_op ? "in_proj (qkvz)" : "in_proj (qkvz, ba)");
            if (gdn_fused) expect(l, mixer, ba_in_op ? "ba+conv+rule+gated norm" : "conv+rule+gated norm");
            else expect(l, mixer, "conv"), expect(l, mixer, "delta rule"), expect(l, mixer, "gated norm");
            expect(l, mixer, "out_proj");
            expect(l, mixer, "add_norm");
        } else {
            expect(l, mixer, "qkv_proj");
            if (c->attn_output_gate) expect(l, mixer, "qk_norm_rope (gated)"), expect(l, mixer, "kv_store");
            else if (ops->qk_norm_rope_store && fm_routes_rope_store(&m->routes))
                expect(l, mixer, "qk_norm_rope+kv_store");
            else expect(l, mixer, "qk_norm_rope"), expect(l, mixer, "kv_store");
            /* dense.quant=producer (the default): the attention and the o projection as one op (attention_paged_o),
               with the add and norm under decode.fused */
            const bool with_o =
                !c->attn_output_gate && ops->attention_paged_o && fm_routes_dense_quant_producer(&m->routes);
            if (with_o) expect(l, mixer, fused ? "attention+o_proj+add_norm" : "attention+o_proj");
            else expect(l, mixer, "attention");
            if (c->attn_output_gate) expect(l, mixer, "output gate");
            if (!fused && !with_o) expect(l, mixer, "o_proj");
            if (!(fused && with_o)) expect(l, mixer, fused ? "o_proj+add_norm" : "add_norm");
        }
        const bool last = i + 1 == m->n_layers;
        const bool fuse_tail =
            L->is_moe && !L->shared_gate_up && !last && ops->moe_add_rmsnorm && fm_routes_fused_moe_tail(&m->routes, 1);
        if (L->is_moe) {
            const bool beside = L->shared_gate_up && fm_routes_shared_stream(&m->routes, 1);
            expect(l, ffn, beside ? "router, shared_expert" : "router");
            expect(l, ffn, fuse_tail ? "experts+add_norm" : "experts");
            if (L->shared_gate_up && !beside) expect(l, ffn, "shared_expert");
            if (L->shared_gate_up) expect(l, ffn, "shared gate");
        } else {
            expect(l, ffn, "gate_up");
            expect(l, ffn, "swiglu");
            expect(l, ffn, "down");
        }
        if (last) expect(l, ffn, "add");
        else if (!fuse_tail) expect(l, ffn, "add_norm");
    }
    expect(l, "step", "final_norm+lm_head");
}

/* the weight bytes an op reads at least (the projections' whole banks; the experts' share is not checked here) */
static double weights_of(const fm_model *m, const char *kind, const char *op) {
    const fm_backend_ops *ops = m->be->ops;
    double w = 0;
    for (int32_t i = 0; i < m->n_layers; i++) {
        const fm_layer_weights *L = &m->layers[i];
        const bool gdn = fm_layer_kind_is_gdn(L->kind);
        if (!strcmp(op, "qkv_proj") && !gdn) w += (double)ops->bank_bytes(L->qkv);
        if ((!strcmp(op, "o_proj") || !strncmp(op, "attention+o_proj", 16)) && !gdn) w += (double)ops->bank_bytes(L->o);
        if (!strcmp(op, "out_proj") && gdn) w += (double)ops->bank_bytes(L->gdn_out);
        if (!strcmp(op, "router") && L->is_moe) w += (double)ops->bank_bytes(L->router);
        if (!strcmp(op, "down") && !L->is_moe && !strcmp(kind, "dense")) w += (double)ops->bank_bytes(L->down);
    }
    if (!strcmp(op, "final_norm+lm_head")) w += (double)ops->bank_bytes(m->lm_head);
    return w;
}

static void profile_model(const char *dir, const char *routes) {
    fm_options opt;
    fm_options_init(&opt);
    opt.max_seqs = 1, opt.ctx = 16, opt.max_tokens = 8, opt.routes = routes;
    fm_model *m = NULL;
    fm_error err = {{0}};
    if (fm_model_load(dir, &opt, &m, &err)) fail_msg("load %s: %s", dir, err.msg);
    fm_context *ctx = m->context;
    /* a sequence of 5 tokens in the cache, then the profiled decode step of its sixth */
    const int32_t ids[6] = {1, 2, 3, 4, 5, 6};
    int32_t seq, seqs[6], pos[6];
    for (int32_t t = 0; t < 6; t++) pos[t] = t;
    fm_sampling sp;
    fm_sampling_init(&sp);
    assert_int_equal(fm_kv_seq_begin(ctx, ids, 5, &sp, &seq, &err), FM_OK);
    for (int32_t t = 0; t < 6; t++) seqs[t] = seq;
    assert_int_equal(fm_kv_seq_append(&ctx->kv->pool, seq, 5, &err), FM_OK);
    ctx->kv->tables_dirty = true;
    assert_int_equal(fm_step_stage(ctx, ids, seqs, pos, 5, &err), FM_OK);
    fm_step_device(ctx, 5, true, FM_ATTN_FRESH);
    assert_int_equal(fm_kv_seq_append(&ctx->kv->pool, seq, 1, &err), FM_OK);
    assert_int_equal(fm_step_stage(ctx, ids + 5, seqs, pos + 5, 1, &err), FM_OK);
    fm_profile prof;
    fm_op_profile *op = calloc(1, sizeof *op);
    assert_non_null(op);
    assert_int_equal(fm_step_profile_ops(ctx, 1, false, FM_ATTN_DECODE, &prof, op, &err), FM_OK);

    want_list want;
    expected_ops(m, &want);
    assert_int_equal(op->n, want.n); /* no op missing, none unexpected */
    double bytes = 0;
    for (int32_t i = 0; i < want.n; i++) {
        const fm_op_row *r = &op->rows[i];
        /* in the order the pass first ran them, each as often as the layers that run it */
        assert_string_equal(r->kind, want.w[i].kind);
        assert_string_equal(r->op, want.w[i].op);
        assert_int_equal(r->count, want.w[i].count);
        assert_true(r->bytes > 0);
        assert_true(r->bytes >= weights_of(m, r->kind, r->op));
        assert_true(r->ms >= 0);
        bytes += r->bytes;
    }
    assert_true(fabs(bytes - op->step_bytes) <= 1e-9 * op->step_bytes);
    assert_true(op->step_bytes > (double)m->be->ops->bank_bytes(m->lm_head));
    /* the stage profile of the same marks spans the same step */
    assert_true(prof.total_ms == op->step_ms);

    /* the stage profile alone (no per-op marks) still runs */
    assert_int_equal(fm_kv_seq_append(&ctx->kv->pool, seq, 1, &err), FM_OK);
    const int32_t p6 = 6;
    assert_int_equal(fm_step_stage(ctx, ids, seqs, &p6, 1, &err), FM_OK);
    assert_int_equal(fm_step_profile(ctx, 1, false, FM_ATTN_PAGED, &prof, &err), FM_OK);
    assert_true(prof.total_ms >= 0);
    free(op);
    fm_kv_seq_end(ctx, seq);
    fm_model_free(m);
}

static void test_qwen3_moe(void **state) {
    (void)state;
    profile_model("tests/models/qwen3-moe-f32", NULL);
}

static void test_mixtral(void **state) {
    (void)state;
    profile_model("tests/models/mixtral-f32-sharded", NULL);
}

static void test_qwen3_next(void **state) {
    (void)state;
    profile_model("tests/models/qwen3-next-f32", NULL);
}

/* route decode.fused: the Gated DeltaNet's conv, rule and gated norm as one op (one row; with gdn.decode_ba its ba
 * projection too), the o projection with its add and norm, the MoE tails that have no shared expert;
 * dense.quant=kernel: the attention and o_proj apart */
static void test_fused_routes(void **state) {
    (void)state;
    profile_model("tests/models/qwen3-next-f32", "decode.fused=on");
    profile_model("tests/models/qwen3-next-f32", "decode.fused=on,gdn.decode_ba=on");
    profile_model("tests/models/qwen3-moe-f32", "decode.fused=on");
    profile_model("tests/models/qwen3-moe-f32", "dense.quant=kernel");
    profile_model("tests/models/qwen3-moe-f32", "dense.quant=kernel,decode.fused=on");
}

/* A step over the paged cache that holds a prompt chunk at position > 0 (3 rows of one sequence after its first 3)
 * and a decode row of another sequence: every Gated DeltaNet layer takes the chunk by the chunked form, from the
 * sequence's state, as a whole prompt runs ("delta rule (chunked)"; the decode row goes token by token in the same
 * op's interval), not the token-by-token rule over every row. */
static void test_qwen3_next_prompt_chunk(void **state) {
    (void)state;
    fm_options opt;
    fm_options_init(&opt);
    opt.max_seqs = 2, opt.ctx = 16, opt.max_tokens = 8;
    fm_model *m = NULL;
    fm_error err = {{0}};
    if (fm_model_load("tests/models/qwen3-next-f32", &opt, &m, &err)) fail_msg("load: %s", err.msg);
    fm_context *ctx = m->context;
    const int32_t ids[7] = {1, 2, 3, 4, 5, 6, 7}; /* a's 6 tokens; the step's 4 ids: a's last 3, b's third */
    int32_t a, b, seqs[4], pos[4] = {0, 1, 2, 3};
    fm_sampling sp;
    fm_sampling_init(&sp);
    assert_int_equal(fm_kv_seq_begin(ctx, ids, 6, &sp, &a, &err), FM_OK);
    assert_int_equal(fm_kv_seq_begin(ctx, ids, 3, &sp, &b, &err), FM_OK);
    const int32_t both[2] = {a, b};
    for (int i = 0; i < 2; i++) { /* a fresh prefill of the first 3 tokens (a) and 2 tokens (b) */
        const int32_t n = i ? 2 : 3;
        for (int32_t t = 0; t < n; t++) seqs[t] = both[i];
        assert_int_equal(fm_kv_seq_append(&ctx->kv->pool, both[i], n, &err), FM_OK);
        ctx->kv->tables_dirty = true;
        assert_int_equal(fm_step_stage(ctx, ids, seqs, pos, n, &err), FM_OK);
        fm_step_device(ctx, n, true, FM_ATTN_FRESH);
    }
    /* a's tokens 3..5 and b's third token in one step */
    assert_int_equal(fm_kv_seq_append(&ctx->kv->pool, a, 3, &err), FM_OK);
    assert_int_equal(fm_kv_seq_append(&ctx->kv->pool, b, 1, &err), FM_OK);
    ctx->kv->tables_dirty = true;
    const int32_t step_seq[4] = {a, a, a, b}, step_pos[4] = {3, 4, 5, 2};
    assert_int_equal(fm_step_stage(ctx, ids + 3, step_seq, step_pos, 4, &err), FM_OK);
    fm_profile prof;
    fm_op_profile *op = calloc(1, sizeof *op);
    assert_non_null(op);
    assert_int_equal(fm_step_profile_ops(ctx, 4, false, FM_ATTN_PAGED, &prof, op, &err), FM_OK);
    int32_t gdn_layers = 0, chunked = -1;
    for (int32_t l = 0; l < m->n_layers; l++) gdn_layers += fm_layer_kind_is_gdn(m->layers[l].kind);
    assert_true(gdn_layers > 0);
    for (int32_t i = 0; i < op->n; i++) {
        assert_string_not_equal(op->rows[i].op, "delta rule"); /* token by token over the step */
        if (!strcmp(op->rows[i].op, "delta rule (chunked)")) chunked = op->rows[i].count;
    }
    assert_int_equal(chunked, gdn_layers);
    free(op);
    fm_kv_seq_end(ctx, a), fm_kv_seq_end(ctx, b);
    fm_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen3_moe),
        cmocka_unit_test(test_mixtral),
        cmocka_unit_test(test_qwen3_next),
        cmocka_unit_test(test_fused_routes),
        cmocka_unit_test(test_qwen3_next_prompt_chunk),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
