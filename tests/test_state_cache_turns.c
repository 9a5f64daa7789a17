/* Eight conversations at once on a hybrid model (Qwen3-Next, src/engine/state_cache.c), as a server runs them: the
 * eight first prompts queued together, prefilled in chunks within a mixed step's token budget beside the decode rows
 * of the others, each conversation's next turn submitted as soon as its answer ends, with the default snapshot pool
 * (2 x max_seqs slots). Every turn after the first must start from the state where a previous prompt or answer
 * ended, at least at the last block boundary of the previous turn's prompt:
 *   - a chat client: the next prompt is the previous one, the model's answer and a few new ids (the answer's last
 *     decoded boundary is the deepest snapshot);
 *   - bench/serve_bench.py's multi-turn workload (and a template that renders the answer again differently): the
 *     next prompt is the previous one, other ids standing for the answer, then new ids (only the previous prompt's
 *     last boundary matches);
 *   - the stand-in answers again, every conversation's first prompt beginning with the same system prompt of two
 *     blocks, where the first prompts of four of them have their last boundary too: the snapshot there is read by
 *     every first turn, and a conversation going on spends its own snapshots only, never that one nor the others'.
 * Before the snapshots of a conversation whose next turn had started were spent (evicted first), the second and third
 * mapped 2.4 % and 28.7 % of the later turns' prompt tokens instead of 64.6 %.
 * The same turns with the prefix cache off give the same ids; the KV pool's and the snapshot pool's invariants hold
 * after every step. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/kv_prefix.h"
#include "engine/kv_state.h"
#include "engine/state_cache.h"
#include "fp8moe_sched.h"

enum {
    CONV = 8,    /* conversations, and --max-seqs */
    TURNS = 4,   /* per conversation */
    FIRST = 37,  /* the first prompt of conversation c has FIRST + 3c ids: their ends fall at different steps */
    ANSWER = 24, /* ids of each answer (max_tokens, eos ignored) */
    ASKED = 8,   /* new ids a later turn adds after the answer */
    CTX = 256,
    BUDGET = 24, /* a mixed step's tokens: with eight decoding, 16 prompt tokens beside them */
    SYSTEM = 32, /* ids of the shared system prompt, when there is one */
};

typedef struct conv {
    int32_t ids[CTX]; /* the current turn's prompt */
    int64_t n;
    int32_t turn; /* 0-based, the turn submitted last */
    int64_t req;  /* its request */
    bool ended;   /* its answer is complete */
    int32_t answer[ANSWER];
    int64_t n_answer;
    int64_t prompt_len[TURNS], cached[TURNS];
    int32_t answers[TURNS][ANSWER];
} conv;

typedef struct chat {
    conv c[CONV];
    bool real_answers; /* the next prompt carries the model's answer, else other ids in its place */
    bool system;       /* the first prompts begin with the same SYSTEM ids */
    fm_sched *s;
} chat;

static void ids_from(int32_t *ids, int64_t n, int32_t vocab, uint32_t seed) {
    for (int64_t i = 0; i < n; i++) seed = seed * 1664525u + 1013904223u, ids[i] = (int32_t)((seed >> 8) % vocab);
}

static conv *conv_of(chat *ch, int64_t req) {
    for (int32_t k = 0; k < CONV; k++)
        if (ch->c[k].req == req) return &ch->c[k];
    fail_msg("an event of request %lld, which no conversation sent", (long long)req);
    return NULL;
}

static void on_event(void *user, const fm_sched_event *ev) {
    conv *c = conv_of(user, ev->req);
    if (ev->id >= 0) {
        assert_true(c->n_answer < ANSWER);
        c->answer[c->n_answer++] = ev->id;
    }
    if (ev->end == FM_SCHED_RUNNING) return;
    assert_int_equal(ev->end, FM_SCHED_LENGTH);
    assert_int_equal(c->n_answer, ANSWER);
    c->cached[c->turn] = ev->n_cached;
    memcpy(c->answers[c->turn], c->answer, sizeof c->answer);
    c->ended = true;
}

static void submit(chat *ch, int32_t k) {
    conv *c = &ch->c[k];
    fm_sched_request q;
    fm_sched_request_init(&q);
    q.prompt = c->ids, q.n_prompt = c->n, q.params.max_tokens = ANSWER, q.params.ignore_eos = true;
    q.on_event = on_event, q.user = ch;
    fm_error err;
    if (fm_sched_submit(ch->s, &q, &c->req, &err)) fail_msg("conversation %d turn %d: %s", k, c->turn + 1, err.msg);
    c->prompt_len[c->turn] = c->n, c->ended = false, c->n_answer = 0;
}

/* the conversation's next prompt: this one, the answer (or ids in its place), new ids */
static void next_turn(chat *ch, int32_t k, int32_t vocab) {
    conv *c = &ch->c[k];
    if (ch->real_answers) memcpy(c->ids + c->n, c->answer, sizeof c->answer);
    else ids_from(c->ids + c->n, ANSWER, vocab, 1000u + 10u * (uint32_t)k + (uint32_t)c->turn);
    ids_from(c->ids + c->n + ANSWER, ASKED, vocab, 2000u + 10u * (uint32_t)k + (uint32_t)c->turn);
    c->n += ANSWER + ASKED, c->turn++;
    submit(ch, k);
}

static void check_pools(const fm_model *m) {
    char msg[256];
    if (!fm_kv_pool_check(&m->context->kv->pool, msg, sizeof msg)) fail_msg("KV pool: %s", msg);
    if (!fm_state_cache_check(m->context, msg, sizeof msg)) fail_msg("state snapshots: %s", msg);
}

/* every conversation to its last turn; the scheduler's counters into st */
static void run_chat(fm_model *m, chat *ch, fm_sched_stats *st) {
    const int32_t V = fm_model_vocab_size(m);
    fm_error err;
    if (fm_sched_create(m->context, 16, &ch->s, &err)) fail_msg("%s", err.msg);
    for (int32_t k = 0; k < CONV; k++) {
        memset(&ch->c[k], 0, sizeof ch->c[k]);
        ch->c[k].req = -1, ch->c[k].n = FIRST + 3 * k;
        ids_from(ch->c[k].ids, ch->c[k].n, V, 100u + (uint32_t)k);
        if (ch->system) ids_from(ch->c[k].ids, SYSTEM, V, 99u);
    }
    for (int32_t k = 0; k < CONV; k++) submit(ch, k);
    int32_t done = 0;
    for (int guard = 0; guard < 100000 && done < CONV; guard++) {
        bool busy;
        if (fm_sched_step(ch->s, &busy, &err)) fail_msg("step: %s", err.msg);
        check_pools(m);
        for (int32_t k = 0; k < CONV; k++) {
            conv *c = &ch->c[k];
            if (!c->ended) continue;
            if (c->turn + 1 < TURNS) next_turn(ch, k, V);
            else c->ended = false, c->req = -1, done++;
        }
    }
    assert_int_equal(done, CONV);
    fm_sched_get_stats(ch->s, st);
    assert_int_equal(st->kv_blocks_used, 0);
    fm_sched_free(ch->s);
}

static void eight_conversations(bool real_answers, bool system) {
    fm_options opt;
    fm_options_init(&opt);
    opt.max_seqs = CONV, opt.ctx = CTX, opt.max_tokens = 128, opt.max_step_tokens = BUDGET;
    fm_model *m = NULL;
    fm_error err;
    if (fm_model_load("tests/models/qwen3-next-f32", &opt, &m, &err)) fail_msg("load: %s", err.msg);
    assert_non_null(m->context->kv->snaps);
    assert_int_equal(m->context->kv->snaps->n_slots, 2 * CONV); /* the default */
    chat *off = calloc(1, sizeof *off), *on = calloc(1, sizeof *on);
    off->real_answers = on->real_answers = real_answers, off->system = on->system = system;
    fm_sched_stats st;
    m->context->kv->pool.prefix_cache = false;
    run_chat(m, off, &st);
    m->context->kv->pool.prefix_cache = true;
    run_chat(m, on, &st);
    int64_t cached = 0, prompts = 0, later = 0, later_cached = 0;
    for (int32_t k = 0; k < CONV; k++)
        for (int32_t t = 0; t < TURNS; t++) {
            const conv *c = &on->c[k];
            assert_int_equal(c->prompt_len[t], off->c[k].prompt_len[t]);
            if (memcmp(c->answers[t], off->c[k].answers[t], sizeof c->answers[t]))
                fail_msg("conversation %d turn %d: another answer with the cache (%lld tokens cached)", k, t + 1,
                         (long long)c->cached[t]);
            assert_int_equal(off->c[k].cached[t], 0);
            cached += c->cached[t], prompts += c->prompt_len[t];
            if (t == 0) continue;
            later += c->prompt_len[t], later_cached += c->cached[t];
        }
    printf("  %s answers%s: %lld of %lld prompt tokens cached, turns >= 2: %lld of %lld; %lld snapshots taken, %lld "
           "restored, %lld evicted\n",
           real_answers ? "real" : "stand-in", system ? ", a system prompt" : "", (long long)cached, (long long)prompts,
           (long long)later_cached, (long long)later, (long long)st.state_saves, (long long)st.state_restores,
           (long long)st.state_evictions);
    for (int32_t k = 0; k < CONV; k++)
        for (int32_t t = 1; t < TURNS; t++) {
            const conv *c = &on->c[k];
            const int64_t floor_prev = c->prompt_len[t - 1] / 16 * 16;
            if (c->cached[t] < floor_prev)
                fail_msg("conversation %d turn %d: %lld of %lld prompt tokens cached, fewer than the %lld of the "
                         "previous prompt's full blocks",
                         k, t + 1, (long long)c->cached[t], (long long)c->prompt_len[t], (long long)floor_prev);
        }
    assert_int_equal(st.prefix_cached_tokens, cached);
    free(off), free(on);
    fm_model_free(m);
}

static void test_chat_answers(void **state) {
    (void)state;
    eight_conversations(true, false);
}

static void test_stand_in_answers(void **state) {
    (void)state;
    eight_conversations(false, false);
}

static void test_shared_system_prompt(void **state) {
    (void)state;
    eight_conversations(false, true);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chat_answers),
        cmocka_unit_test(test_stand_in_answers),
        cmocka_unit_test(test_shared_system_prompt),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
