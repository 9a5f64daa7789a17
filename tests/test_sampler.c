/* The reference sampler (src/engine/sampler.c) and the stop conditions (src/engine/stop.c).
 *
 * Distributions are checked statistically: N draws at steps 0..N-1 of one seed against the probabilities computed
 * here, independently, from the definition of each filter; Pearson's chi-square must stay under its 1 - 1e-4
 * quantile, and an id a filter removes must never be drawn. The draws are a deterministic function of the seed,
 * so the test cannot flake: it fails only if the sampler's distribution is wrong (or the hash is poor). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/sampler.h"
#include "engine/stop.h"

#define V 8
static const float k_logits[V] = {2.0f, 1.5f, 1.0f, 0.5f, 0.0f, -0.5f, -1.0f, -3.0f}; /* descending already */

static void *scratch_for(int32_t vocab) {
    void *p = malloc(fm_sampler_scratch_bytes(vocab));
    assert_non_null(p);
    return p;
}

static void test_uniform(void **state) {
    (void)state;
    double sum = 0.0;
    for (uint64_t i = 0; i < 100000; i++) {
        const double u = fm_sample_uniform(42, i);
        assert_true(u >= 0.0 && u < 1.0);
        sum += u;
    }
    assert_true(fabs(sum / 100000 - 0.5) < 0.005); /* sd of the mean: 0.29 / sqrt(1e5) = 9e-4 */
    assert_true(fm_sample_uniform(42, 7) == fm_sample_uniform(42, 7));
    assert_true(fm_sample_uniform(42, 7) != fm_sample_uniform(43, 7));
    assert_true(fm_sample_uniform(42, 7) != fm_sample_uniform(42, 8));
}

static void test_greedy(void **state) {
    (void)state;
    void *sc = scratch_for(V);
    fm_sampling s;
    fm_sampling_init(&s);
    float l[V];
    memcpy(l, k_logits, sizeof l);
    l[5] = 3.0f;
    assert_int_equal(fm_sample(l, V, &s, NULL, 0, 0, 0, sc, NULL), 5);
    l[6] = 3.0f; /* a tie goes to the lower id */
    assert_int_equal(fm_sample(l, V, &s, NULL, 0, 0, 0, sc, NULL), 5);
    l[0] = NAN; /* never chosen */
    assert_int_equal(fm_sample(l, V, &s, NULL, 0, 0, 0, sc, NULL), 5);
    free(sc);
}

/* The probabilities of each id after temperature, top-k, top-p and min-p, by their definitions. */
static void expected_probs(const fm_sampling *s, double *p) {
    double z[V], w[V], total = 0.0;
    for (int i = 0; i < V; i++) z[i] = (double)k_logits[i] / s->temperature;
    for (int i = 0; i < V; i++) w[i] = (s->top_k == 0 || i < s->top_k) ? exp(z[i] - z[0]) : 0.0;
    for (int i = 0; i < V; i++) total += w[i];
    if (s->top_p < 1.0f) { /* the smallest prefix whose mass reaches top_p */
        double cum = 0.0;
        int keep = 0;
        while (keep < V && cum < s->top_p * total) cum += w[keep++];
        for (int i = keep; i < V; i++) w[i] = 0.0;
    }
    for (int i = 0; i < V; i++)
        if (w[i] < s->min_p * w[0]) w[i] = 0.0;
    total = 0.0;
    for (int i = 0; i < V; i++) total += w[i];
    for (int i = 0; i < V; i++) p[i] = w[i] / total;
}

/* chi-square 1 - 1e-4 quantiles for 1..7 degrees of freedom */
static const double k_chi2_crit[8] = {0, 15.14, 18.42, 21.11, 23.51, 25.74, 27.86, 29.88};

static void check_distribution(const fm_sampling *s, const char *what) {
    enum { N = 40000 };
    void *sc = scratch_for(V);
    long count[V] = {0};
    double p[V];
    expected_probs(s, p);
    for (uint64_t i = 0; i < N; i++) {
        const int32_t id = fm_sample(k_logits, V, s, NULL, 0, 0, i, sc, NULL);
        assert_true(id >= 0 && id < V);
        count[id]++;
    }
    double chi2 = 0.0;
    int kept = 0;
    for (int i = 0; i < V; i++) {
        if (p[i] == 0.0) {
            if (count[i]) fail_msg("%s: id %d is filtered out but was drawn %ld times", what, i, count[i]);
            continue;
        }
        kept++;
        const double e = p[i] * N;
        chi2 += (count[i] - e) * (count[i] - e) / e;
    }
    printf("  %-34s kept %d  chi2 %6.2f (limit %.2f)\n", what, kept, chi2, kept > 1 ? k_chi2_crit[kept - 1] : 0.0);
    if (kept > 1 && chi2 > k_chi2_crit[kept - 1]) fail_msg("%s: chi-square %.2f over %d ids", what, chi2, kept);
    if (kept == 1) /* everything on one id */
        for (int i = 0; i < V; i++) assert_true(p[i] == 0.0 || count[i] == N);
    free(sc);
}

static void test_distributions(void **state) {
    (void)state;
    fm_sampling s;
    fm_sampling_init(&s);
    s.seed = 1234;
    s.temperature = 1.0f;
    check_distribution(&s, "temperature 1");
    s.temperature = 0.5f;
    check_distribution(&s, "temperature 0.5");
    s.temperature = 2.0f;
    check_distribution(&s, "temperature 2");
    s.temperature = 1.0f, s.top_k = 3;
    check_distribution(&s, "top-k 3");
    s.top_k = 1;
    check_distribution(&s, "top-k 1");
    s.top_k = 0, s.top_p = 0.8f;
    check_distribution(&s, "top-p 0.8");
    s.top_p = 0.3f; /* below the largest id's own mass: that id alone */
    check_distribution(&s, "top-p 0.3");
    s.top_p = 1.0f, s.min_p = 0.2f;
    check_distribution(&s, "min-p 0.2");
    s.min_p = 0.0f, s.top_k = 6, s.top_p = 0.9f, s.temperature = 0.8f;
    check_distribution(&s, "T 0.8, top-k 6, top-p 0.9");
    s.top_k = 0, s.top_p = 0.95f, s.min_p = 0.1f, s.temperature = 1.3f;
    check_distribution(&s, "T 1.3, top-p 0.95, min-p 0.1");
}

static void test_seed_reproducible(void **state) {
    (void)state;
    void *sc = scratch_for(V);
    fm_sampling s;
    fm_sampling_init(&s);
    s.temperature = 1.0f, s.seed = 99;
    int32_t a[64], b[64], c[64];
    for (int i = 0; i < 64; i++) a[i] = fm_sample(k_logits, V, &s, NULL, 0, 0, (uint64_t)i, sc, NULL);
    for (int i = 0; i < 64; i++) b[i] = fm_sample(k_logits, V, &s, NULL, 0, 0, (uint64_t)i, sc, NULL);
    s.seed = 100;
    for (int i = 0; i < 64; i++) c[i] = fm_sample(k_logits, V, &s, NULL, 0, 0, (uint64_t)i, sc, NULL);
    assert_memory_equal(a, b, sizeof a);
    assert_memory_not_equal(a, c, sizeof a);
    free(sc);
}

static void test_penalties(void **state) {
    (void)state;
    void *sc = scratch_for(4);
    fm_sampling s;
    fm_sampling_init(&s);
    /* repetition: id 0 (2.0) seen in the prompt -> 2.0 / 1.5 = 1.33 < id 1 (1.5) */
    const float l[4] = {2.0f, 1.5f, -1.0f, -1.2f};
    const int32_t prompt[] = {0, 3};
    s.repetition_penalty = 1.5f;
    assert_int_equal(fm_sample(l, 4, &s, prompt, 2, 2, 0, sc, NULL), 1);
    s.repetition_penalty = 1.2f; /* 2.0 / 1.2 = 1.67 > 1.5: id 0 stays */
    assert_int_equal(fm_sample(l, 4, &s, prompt, 2, 2, 0, sc, NULL), 0);
    /* a negative logit is multiplied: -1.2 * 1.5 = -1.8 < -1.0 ... and ids 0, 1 pushed below the negative ones */
    const float neg[4] = {-2.0f, -3.0f, -1.0f, -1.2f};
    const int32_t h2[] = {2};
    s.repetition_penalty = 2.5f; /* -1.0 * 2.5 = -2.5 < -2.0 (id 0) but id 3 at -1.2 is now the largest */
    assert_int_equal(fm_sample(neg, 4, &s, h2, 1, 1, 0, sc, NULL), 3);
    /* presence and frequency apply to generated ids only: the prompt's id 0 is not penalised */
    fm_sampling_init(&s);
    s.presence_penalty = 0.6f;
    const int32_t hist[] = {0, 0, 1}; /* prompt {0, 0}, generated {1} */
    assert_int_equal(fm_sample(l, 4, &s, hist, 3, 2, 0, sc, NULL), 0);
    const int32_t gen0[] = {1, 0}; /* prompt {1}, generated {0}: 2.0 - 0.6 = 1.4 < 1.5 */
    assert_int_equal(fm_sample(l, 4, &s, gen0, 2, 1, 0, sc, NULL), 1);
    fm_sampling_init(&s);
    s.frequency_penalty = 0.2f; /* id 0 generated twice: 2.0 - 0.4 = 1.6 > 1.5; three times: 1.4 < 1.5 */
    const int32_t twice[] = {0, 0};
    const int32_t three[] = {0, 0, 0};
    assert_int_equal(fm_sample(l, 4, &s, twice, 2, 0, 0, sc, NULL), 0);
    assert_int_equal(fm_sample(l, 4, &s, three, 3, 0, 0, sc, NULL), 1);
    /* ids out of range in the history are ignored, not indexed */
    const int32_t bad[] = {-5, 400};
    assert_int_equal(fm_sample(l, 4, &s, bad, 2, 0, 0, sc, NULL), 0);
    free(sc);
}

static void test_logprobs(void **state) {
    (void)state;
    void *sc = scratch_for(V);
    fm_sampling s;
    fm_sampling_init(&s);
    s.n_logprobs = 3;
    s.repetition_penalty = 3.0f; /* changes the choice, not the reported (raw) log-probabilities */
    const int32_t hist[] = {0};
    fm_sample_info info;
    const int32_t id = fm_sample(k_logits, V, &s, hist, 1, 1, 0, sc, &info);
    assert_int_equal(id, 1);
    double sum = 0.0;
    for (int i = 0; i < V; i++) sum += exp((double)k_logits[i]);
    assert_float_equal(info.logprob, (float)(1.5 - log(sum)), 1e-6);
    assert_int_equal(info.n_top, 3);
    for (int j = 0; j < 3; j++) {
        assert_int_equal(info.top[j].id, j);
        assert_float_equal(info.top[j].logprob, (float)((double)k_logits[j] - log(sum)), 1e-6);
    }
    s.n_logprobs = FM_MAX_LOGPROBS; /* more than the vocabulary: all of it */
    fm_sample(k_logits, V, &s, hist, 1, 1, 0, sc, &info);
    assert_int_equal(info.n_top, V);
    free(sc);
}

static void test_infinite_logits(void **state) {
    (void)state;
    void *sc = scratch_for(4);
    fm_sampling s;
    fm_sampling_init(&s);
    s.temperature = 1.0f;
    const float a[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    assert_int_equal(fm_sample(a, 4, &s, NULL, 0, 0, 3, sc, NULL), 0);
    const float b[4] = {0.0f, INFINITY, 1.0f, INFINITY};
    assert_int_equal(fm_sample(b, 4, &s, NULL, 0, 0, 3, sc, NULL), 1);
    const float c[4] = {-INFINITY, 0.0f, -INFINITY, NAN}; /* one finite id: always it */
    for (uint64_t i = 0; i < 50; i++) assert_int_equal(fm_sample(c, 4, &s, NULL, 0, 0, i, sc, NULL), 1);
    free(sc);
}

/* top-k keeps every id tied with the k-th largest (Hugging Face's rule); the draw walks ids in order */
static void test_ties(void **state) {
    (void)state;
    void *sc = scratch_for(5);
    fm_sampling s;
    fm_sampling_init(&s);
    s.temperature = 1.0f, s.top_k = 2;
    const float l[5] = {0.0f, 1.0f, 1.0f, 1.0f, -1.0f};
    long n[5] = {0};
    for (uint64_t i = 0; i < 3000; i++) n[fm_sample(l, 5, &s, NULL, 0, 0, i, sc, NULL)]++;
    assert_int_equal(n[0] + n[4], 0);
    for (int i = 1; i <= 3; i++) assert_true(n[i] > 850 && n[i] < 1150); /* 1000 each; sd 26 */
    /* u just below the first kept id's share picks it, just above picks the next one (id order) */
    s.top_k = 0;
    const float two[2] = {0.0f, 0.0f};
    for (uint64_t i = 0; i < 200; i++) {
        const int32_t id = fm_sample(two, 2, &s, NULL, 0, 0, i, sc, NULL);
        assert_int_equal(id, fm_sample_uniform(s.seed, i) < 0.5 ? 0 : 1);
    }
    free(sc);
}

static void test_check(void **state) {
    (void)state;
    fm_sampling s;
    fm_error err;
    fm_sampling_init(&s);
    assert_int_equal(fm_sampling_check(&s, &err), FM_OK);
    const struct {
        size_t off;
        float v;
        const char *name;
    } bad[] = {
        {offsetof(fm_sampling, temperature), -0.1f, "temperature"},
        {offsetof(fm_sampling, temperature), NAN, "temperature"},
        {offsetof(fm_sampling, top_p), 0.0f, "top_p"},
        {offsetof(fm_sampling, top_p), 1.5f, "top_p"},
        {offsetof(fm_sampling, min_p), 1.0f, "min_p"},
        {offsetof(fm_sampling, repetition_penalty), 0.0f, "repetition_penalty"},
        {offsetof(fm_sampling, presence_penalty), 2.5f, "presence_penalty"},
        {offsetof(fm_sampling, frequency_penalty), -3.0f, "frequency_penalty"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        fm_sampling t = s;
        memcpy((char *)&t + bad[i].off, &bad[i].v, sizeof(float));
        assert_int_equal(fm_sampling_check(&t, &err), FM_ERR_USAGE);
        assert_non_null(strstr(err.msg, bad[i].name));
    }
    fm_sampling t = s;
    t.top_k = -1;
    assert_int_equal(fm_sampling_check(&t, &err), FM_ERR_USAGE);
    t = s;
    t.n_logprobs = FM_MAX_LOGPROBS + 1;
    assert_int_equal(fm_sampling_check(&t, &err), FM_ERR_USAGE);
}

static void test_stop(void **state) {
    (void)state;
    const int32_t eos[] = {2, 7};
    const int32_t s1[] = {5, 6};
    const int32_t s2[] = {9};
    const int32_t *seqs[] = {s1, s2};
    const int32_t lens[] = {2, 1};
    fm_stop st = {eos, 2, seqs, lens, 2, 6};
    int64_t keep = -1;
    const int32_t run[] = {1, 3, 4};
    assert_int_equal(fm_stop_check(&st, run, 3, &keep), FM_STOP_NONE);
    assert_int_equal(keep, 3);
    const int32_t e[] = {1, 3, 7};
    assert_int_equal(fm_stop_check(&st, e, 3, &keep), FM_STOP_EOS);
    assert_int_equal(keep, 2);
    const int32_t q[] = {1, 5, 6};
    assert_int_equal(fm_stop_check(&st, q, 3, &keep), FM_STOP_SEQUENCE);
    assert_int_equal(keep, 1);
    const int32_t half[] = {6}; /* the sequence's first id would be in the prompt: not a match */
    assert_int_equal(fm_stop_check(&st, half, 1, &keep), FM_STOP_NONE);
    const int32_t one[] = {4, 9};
    assert_int_equal(fm_stop_check(&st, one, 2, &keep), FM_STOP_SEQUENCE);
    assert_int_equal(keep, 1);
    const int32_t full[] = {1, 1, 1, 1, 1, 1};
    assert_int_equal(fm_stop_check(&st, full, 6, &keep), FM_STOP_LENGTH);
    assert_int_equal(keep, 6);
    const int32_t full_eos[] = {1, 1, 1, 1, 1, 2}; /* the budget and an eos at once: eos */
    assert_int_equal(fm_stop_check(&st, full_eos, 6, &keep), FM_STOP_EOS);
    assert_int_equal(keep, 5);
    assert_int_equal(fm_stop_check(&st, full, 0, &keep), FM_STOP_NONE);
    assert_string_equal(fm_stop_reason_name(FM_STOP_LENGTH), "length");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_uniform),
        cmocka_unit_test(test_greedy),
        cmocka_unit_test(test_distributions),
        cmocka_unit_test(test_seed_reproducible),
        cmocka_unit_test(test_penalties),
        cmocka_unit_test(test_logprobs),
        cmocka_unit_test(test_infinite_logits),
        cmocka_unit_test(test_check),
        cmocka_unit_test(test_ties),
        cmocka_unit_test(test_stop),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
