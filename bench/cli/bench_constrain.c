/* Constrained decoding in the benchmarks (bench_constrain.h). */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_constrain.h"
#include "cli/cli.h"
#include "engine/kv_state.h"
#include "util/status.h"

static uint64_t rng = 0x243F6A8885A308D3ull;
static uint32_t rnd(uint32_t n) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)((rng >> 11) % n);
}

fm_status bench_vocab_grown(const fm_tokenizer *t, int32_t n, fm_token_vocab **out, fm_error *err) {
    rng = 0x243F6A8885A308D3ull;
    fm_token_vocab *real;
    fm_status st = fm_token_vocab_from_tokenizer(t, 0, &real, err);
    if (st) return st;
    int32_t nr = fm_token_vocab_size(real);
    if (n < nr) nr = n; /* a small model: the tokenizer's first n ids (the bytes come first in byte-level BPE) */
    uint8_t *buf = malloc((size_t)n * 64);
    const uint8_t **ptr = calloc((size_t)n, sizeof *ptr);
    uint32_t *lens = calloc((size_t)n, sizeof *lens);
    if (!buf || !ptr || !lens) {
        free(buf), free(ptr), free(lens), fm_token_vocab_free(real);
        return fm_fail(err, FM_ERR_NOMEM, "out of memory");
    }
    size_t o = 0;
    for (int32_t i = 0; i < n; i++) {
        uint8_t *p = buf + o;
        uint32_t len = 0;
        if (i < nr) {
            const uint8_t *b = fm_token_vocab_bytes(real, i, &len);
            if (len > 64) len = 64;
            if (len) memcpy(p, b, len);
        } else if (rnd(100) < 15) { /* 1-3 CJK characters */
            for (uint32_t k = 1 + rnd(3); k > 0; k--) {
                const uint32_t cp = 0x4e00 + rnd(0x5200);
                p[len++] = (uint8_t)(0xe0 | (cp >> 12)), p[len++] = (uint8_t)(0x80 | ((cp >> 6) & 63));
                p[len++] = (uint8_t)(0x80 | (cp & 63));
            }
        } else if (rnd(100) < 4) { /* a partial character: a lead byte and maybe one continuation */
            p[len++] = (uint8_t)(0xe4 + rnd(5));
            if (rnd(2)) p[len++] = (uint8_t)(0x80 + rnd(64));
        } else
            for (uint32_t k = 2 + rnd(3); k > 0; k--) {
                uint32_t l;
                const uint8_t *b = fm_token_vocab_bytes(real, (int32_t)rnd((uint32_t)nr), &l);
                if (len + l > 24) break;
                memcpy(p + len, b, l), len += l;
            }
        ptr[i] = p, lens[i] = len, o += len;
    }
    bool *special = calloc((size_t)n, sizeof *special);
    for (int32_t i = 0; special && i < nr; i++) special[i] = fm_tokenizer_is_special(t, i);
    st = special ? fm_token_vocab_create(n, ptr, lens, special, out, err) : fm_fail(err, FM_ERR_NOMEM, "out of memory");
    free(buf), free(ptr), free(lens), free(special);
    fm_token_vocab_free(real);
    return st;
}

fm_status bench_constraint_begin(fm_model *m, const char *tokenizer_dir, const int32_t *seq, int32_t B,
                                 int32_t shared_masks, bench_constraint *c, fm_error *err) {
    memset(c, 0, sizeof *c);
    c->B = B, c->end = fm_model_vocab_size(m) - 1;
    c->h_mask = m->context->kv->h_mask, c->words = (size_t)((fm_model_vocab_size(m) + 31) / 32);
    fm_status st = fm_tokenizer_load(tokenizer_dir, &c->tok, err);
    if (!st) st = bench_vocab_grown(c->tok, fm_model_vocab_size(m), &c->vocab, err);
    if (!st) st = fm_token_vocab_set_mask_cache(c->vocab, shared_masks, err);
    if (!st) st = fm_grammar_json_object(&c->g, err);
    if (!st && !(c->m = calloc((size_t)B, sizeof *c->m))) st = fm_fail(err, FM_ERR_NOMEM, "out of memory");
    fm_sampling sp;
    fm_sampling_init(&sp);
    sp.masked = 1;
    for (int32_t i = 0; !st && i < B; i++) {
        st = fm_matcher_create(c->g, c->vocab, &c->end, 1, &c->m[i], err);
        if (!st) st = fm_kv_seq_sampler_reset(m->context, seq[i], NULL, 0, &sp, err);
    }
    if (st) bench_constraint_end(c);
    return st;
}

/* the calling thread's CPU time: the fills' own work, whatever else the machine runs */
static double thread_cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int32_t bench_constraint_fill(void *user) {
    bench_constraint *c = user;
    const double t0 = cli_now();
    double cpu = 0;
#pragma omp parallel for schedule(dynamic, 1) reduction(+ : cpu)
    for (int32_t i = 0; i < c->B; i++) {
        const double c0 = thread_cpu_now();
        fm_matcher_fill_mask(c->m[i], c->h_mask + (size_t)i * c->words);
        cpu += thread_cpu_now() - c0;
    }
    c->fill_s = cli_now() - t0, c->fill_cpu_s = cpu;
    return c->B;
}

void bench_constraint_masks(fm_model *m, bench_constraint *c) {
    bench_constraint_fill(c);
    m->be->ops->upload_raw(m->be, c->h_mask, (size_t)c->B * c->words * sizeof(uint32_t), m->context->kv->mask);
}

fm_status bench_constraint_accept(bench_constraint *c, const int32_t *ids, fm_error *err) {
    for (int32_t i = 0; i < c->B; i++) {
        if (!fm_matcher_accept(c->m[i], ids[i]))
            return fm_fail(err, FM_ERR_USAGE, "bench: sequence %d sampled id %d outside its mask", i, ids[i]);
        if (fm_matcher_finished(c->m[i])) { /* a complete object: the next one */
            fm_matcher_free(c->m[i]), c->m[i] = NULL;
            fm_status st = fm_matcher_create(c->g, c->vocab, &c->end, 1, &c->m[i], err);
            if (st) return st;
        }
    }
    return FM_OK;
}

void bench_constraint_end(bench_constraint *c) {
    for (int32_t i = 0; c->m && i < c->B; i++) fm_matcher_free(c->m[i]);
    free(c->m);
    fm_grammar_free(c->g);
    fm_token_vocab_free(c->vocab);
    fm_tokenizer_free(c->tok);
    memset(c, 0, sizeof *c);
}
