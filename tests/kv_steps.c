/* A prefill, then a fresh prefill and decode steps through the paged KV cache (kv_steps.h). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>

#include "engine/kv_state.h"
#include "kv_steps.h"

void kv_prefill_and_steps(fm_model *m, const int32_t *ids, int32_t n, int32_t p, float *out) {
    const int32_t V = fm_model_vocab_size(m);
    fm_error err = {{0}};
    if (fm_forward(m->context, ids, n, false, out, NULL, &err)) fail_msg("prefill: %s", err.msg);
    float *gen = out + (size_t)n * V;
    fm_sampling sp;
    fm_sampling_init(&sp);
    int32_t seq, *seqs = malloc((size_t)n * sizeof *seqs), *pos = malloc((size_t)n * sizeof *pos);
    for (int32_t t = 0; t < n; t++) pos[t] = t;
    assert_int_equal(fm_kv_seq_begin(m->context, ids, p, &sp, &seq, &err), FM_OK);
    for (int32_t t = 0; t < n; t++) seqs[t] = seq;
    assert_int_equal(fm_kv_seq_append(&m->context->kv->pool, seq, p, &err), FM_OK);
    m->context->kv->tables_dirty = true;
    assert_int_equal(fm_step_stage(m->context, ids, seqs, pos, p, &err), FM_OK);
    fm_step_device(m->context, p, false, FM_ATTN_FRESH);
    assert_int_equal(fm_step_logits(m->context, p, gen, &err), FM_OK);
    for (int32_t t = p; t < n; t++) {
        assert_int_equal(fm_kv_seq_append(&m->context->kv->pool, seq, 1, &err), FM_OK);
        m->context->kv->tables_dirty = true;
        assert_int_equal(fm_step_stage(m->context, ids + t, seqs, pos + t, 1, &err), FM_OK);
        fm_step_device(m->context, 1, false, FM_ATTN_PAGED);
        assert_int_equal(fm_step_logits(m->context, 1, gen + (size_t)t * V, &err), FM_OK);
    }
    fm_kv_seq_end(m->context, seq);
    free(seqs), free(pos);
}
