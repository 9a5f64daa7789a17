/* The device sampler (src/backend/cuda/sampler.cu) against the reference (src/engine/sampler.c, fm_sample_row).
 *
 * Rows of random logits (normal, scale 3, so that top-p and min-p cut somewhere inside the vocabulary) at vocab 7,
 * 1000 and 151936 (Qwen3's), fp32 and bf16 (the reference reads the same bf16-rounded values), each row with its own
 * parameters: greedy, temperatures, top-k (1, 40, ties), top-p, min-p, their combinations, repetition / presence /
 * frequency penalties over a random penalty state, 0..20 log-probabilities, its own seed. Eight steps in a row: the
 * kernel advances each row's step and penalty state itself, the reference does the same on the host.
 * Expected: the same id in every row at every step (the uniform, the filters and the masses are the same
 * computation; only the summation order of the double-precision masses differs, which moves an id only when u x
 * total falls within ~1e-15 of a boundary), the same top-N ids, log-probabilities within 2e-5, and the device's
 * penalty state equal to the host's. With constraints: every third row masked (a random allowed-token mask of ~30%
 * density, some rows allowing one id only) and every fourth row with a logit bias (up to 40 distinct ids, -100..100,
 * some at the ends), the rest as above: masked and biased rows equal the reference too, and masked rows draw only
 * allowed ids. Every case runs twice: one CTA a row, and with the split workspace (a row's first pass over several
 * CTAs, the last one finishing the row; Qwen3's vocabulary splits at these batches): the same ids, log-probabilities
 * within the same bound. Runs only where a GPU is present (make test-gpu). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/sampler.cuh"
#include "engine/sampler.h"
#include "quant/bf16.h"

#define CK(call)                                                                                                       \
    do {                                                                                                               \
        cudaError_t e_ = (call);                                                                                       \
        if (e_ != cudaSuccess) fail_msg("%s: %s", #call, cudaGetErrorString(e_));                                      \
    } while (0)

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static double urand(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (double)(rng >> 11) * (1.0 / 9007199254740992.0);
}
static float nrand(void) { return (float)(sqrt(-2.0 * log(urand() + 1e-300)) * cos(6.283185307179586 * urand())); }

static void *dev(size_t bytes) {
    void *p = NULL;
    CK(cudaMalloc(&p, bytes ? bytes : 1));
    return p;
}

/* the parameters of row r: a cycle through the cases, its own seed */
static fm_sampling params_for(int r, int32_t vocab) {
    fm_sampling s;
    fm_sampling_init(&s);
    s.seed = 1000003ull * (uint64_t)r + 17;
    s.n_logprobs = r % 21;
    switch (r % 12) {
    case 0: break; /* greedy */
    case 1: s.temperature = 1.0f; break;
    case 2: s.temperature = 0.7f, s.top_k = 40; break;
    case 3: s.temperature = 1.0f, s.top_k = 1; break;
    case 4: s.temperature = 1.0f, s.top_p = 0.9f; break;
    case 5: s.temperature = 1.3f, s.min_p = 0.05f; break;
    case 6: s.temperature = 0.8f, s.top_k = 50, s.top_p = 0.95f, s.min_p = 0.02f; break;
    case 7: s.temperature = 1.0f, s.repetition_penalty = 1.3f; break;
    case 8: s.temperature = 0.9f, s.presence_penalty = 0.5f, s.frequency_penalty = 0.3f; break;
    case 9: s.repetition_penalty = 1.2f, s.frequency_penalty = -0.4f; break; /* greedy with penalties */
    case 10: s.temperature = 2.0f, s.top_p = 0.5f; break;
    case 11: s.temperature = 0.05f, s.top_k = vocab > 3 ? 3 : 0; break;
    }
    return s;
}

/* split: the launch gets the split workspace (fm_cuda_sample_splits CTAs a row where the batch and the vocabulary
   allow it: Qwen3's vocabulary here), else one CTA a row */
static void run_case_as(int32_t B, int32_t vocab, bool f32, bool penalties, bool constrain, bool split) {
    const size_t n = (size_t)B * (size_t)vocab;
    float *logits = malloc(n * sizeof *logits);
    uint16_t *lb = malloc(n * sizeof *lb);
    int32_t *counts = calloc(n, sizeof *counts), *dcounts_h = calloc(n, sizeof *dcounts_h);
    uint8_t *seen = calloc(n, 1), *dseen_h = calloc(n, 1);
    fm_sampling *params = malloc((size_t)B * sizeof *params);
    uint64_t *steps = calloc((size_t)B, sizeof *steps);
    float *scratch = malloc(2 * (size_t)vocab * sizeof(float));
    fm_sample_info *info = malloc((size_t)B * sizeof *info), ref_info;
    int32_t *ids = malloc((size_t)B * sizeof *ids);
    assert_true(logits && lb && counts && dcounts_h && seen && dseen_h && params && steps && scratch && info && ids);
    const int32_t words = (vocab + 31) / 32;
    uint32_t *mask = calloc((size_t)B * words, sizeof *mask);
    fm_logit_bias *bias = calloc((size_t)B * FM_MAX_LOGIT_BIAS, sizeof *bias);
    assert_true(mask && bias);
    for (size_t i = 0; i < n; i++) {
        float v = 3.0f * nrand();
        if (i % 97 == 5) v = logits[i - 1]; /* exact ties */
        lb[i] = fm_f32_to_bf16(v);
        logits[i] = f32 ? v : fm_bf16_to_f32(lb[i]);
    }
    for (int32_t r = 0; r < B; r++) {
        params[r] = params_for(r, vocab);
        steps[r] = (uint64_t)r * 7;
        if (constrain && r % 3 == 1) { /* a mask; rows 4, 13, ... allow one id */
            params[r].masked = 1;
            uint32_t *w = mask + (size_t)r * words;
            const int32_t only = (int32_t)(urand() * vocab);
            for (int32_t i = 0; i < vocab; i++)
                if (r % 9 == 4 ? i == only : urand() < 0.3) w[i >> 5] |= 1u << (i & 31);
            w[only >> 5] |= 1u << (only & 31);
        }
        if (constrain && r % 4 == 2) { /* distinct ids: a random start and a stride */
            const int32_t nb = 1 + (int32_t)(urand() * (vocab < 40 ? vocab : 40)), first = (int32_t)(urand() * vocab);
            params[r].n_bias = nb;
            for (int32_t j = 0; j < nb; j++) {
                fm_logit_bias *e = &bias[(size_t)r * FM_MAX_LOGIT_BIAS + j];
                e->id = (first + j) % vocab;
                e->bias = j == 0 ? 100.0f : j == 1 ? -100.0f : (float)(200.0 * urand() - 100.0);
            }
        }
        if (penalties) /* a prompt of 40 ids and 10 generated ones */
            for (int j = 0; j < 50; j++)
                fm_sample_state_add(vocab, (int32_t)(urand() * vocab), j >= 40, counts + (size_t)r * vocab,
                                    seen + (size_t)r * vocab);
    }
    void *d_logits = dev(n * (f32 ? 4 : 2));
    fm_sampling *d_params = dev((size_t)B * sizeof *params);
    uint64_t *d_steps = dev((size_t)B * sizeof *steps);
    int32_t *d_counts = penalties ? dev(n * sizeof *counts) : NULL;
    uint8_t *d_seen = penalties ? dev(n) : NULL;
    float *d_z = dev(n * sizeof(float));
    int32_t *d_ids = dev((size_t)B * sizeof *ids);
    fm_sample_info *d_info = dev((size_t)B * sizeof *info);
    uint32_t *d_mask = constrain ? dev((size_t)B * words * sizeof *mask) : NULL;
    fm_logit_bias *d_bias = constrain ? dev((size_t)B * FM_MAX_LOGIT_BIAS * sizeof *bias) : NULL;
    void *d_ws = split ? dev(FM_CUDA_SAMPLE_WS_BYTES) : NULL;
    if (split) CK(cudaMemset(d_ws, 0, FM_CUDA_SAMPLE_WS_BYTES));
    if (constrain) {
        CK(cudaMemcpy(d_mask, mask, (size_t)B * words * sizeof *mask, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(d_bias, bias, (size_t)B * FM_MAX_LOGIT_BIAS * sizeof *bias, cudaMemcpyHostToDevice));
    }
    CK(cudaMemcpy(d_logits, f32 ? (const void *)logits : (const void *)lb, n * (f32 ? 4 : 2), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_params, params, (size_t)B * sizeof *params, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_steps, steps, (size_t)B * sizeof *steps, cudaMemcpyHostToDevice));
    if (penalties) {
        CK(cudaMemcpy(d_counts, counts, n * sizeof *counts, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(d_seen, seen, n, cudaMemcpyHostToDevice));
    }
    int mismatches = 0, compared = 0;
    double worst_lp = 0.0;
    for (int step = 0; step < 8; step++) {
        CK(cudaMemset(d_ids, 0xff, (size_t)B * sizeof *ids));
        fm_cuda_sample(d_logits, f32, B, vocab, NULL, d_params, d_steps, d_counts, d_seen, d_bias, d_mask, d_z, d_ids,
                       d_info, d_ws, false, 0);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(ids, d_ids, (size_t)B * sizeof *ids, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(info, d_info, (size_t)B * sizeof *info, cudaMemcpyDeviceToHost));
        for (int32_t r = 0; r < B; r++) {
            int32_t *c = penalties ? counts + (size_t)r * vocab : NULL;
            uint8_t *sn = penalties ? seen + (size_t)r * vocab : NULL;
            const int32_t want = fm_sample_row(logits + (size_t)r * vocab, vocab, &params[r], c, sn,
                                               bias + (size_t)r * FM_MAX_LOGIT_BIAS, mask + (size_t)r * words, steps[r],
                                               scratch, &ref_info);
            if (params[r].masked) assert_true((mask[(size_t)r * words + (want >> 5)] >> (want & 31)) & 1u);
            steps[r]++;
            if (penalties) fm_sample_state_add(vocab, want, true, c, sn);
            compared++;
            if (ids[r] != want) {
                if (mismatches++ < 5)
                    printf("  row %d step %d (T %g, top-k %d, top-p %g, min-p %g): device %d, reference %d\n", r, step,
                           (double)params[r].temperature, params[r].top_k, (double)params[r].top_p,
                           (double)params[r].min_p, ids[r], want);
                continue;
            }
            assert_int_equal(info[r].n_top, ref_info.n_top);
            worst_lp = fmax(worst_lp, fabs((double)info[r].logprob - ref_info.logprob));
            for (int j = 0; j < ref_info.n_top; j++) {
                assert_int_equal(info[r].top[j].id, ref_info.top[j].id);
                worst_lp = fmax(worst_lp, fabs((double)info[r].top[j].logprob - ref_info.top[j].logprob));
            }
        }
    }
    printf("  vocab %6d, %s, penalties %s, masks and biases %s, %2d CTAs a row: %d draws, %d differ, worst log-prob "
           "difference %.2e\n",
           vocab, f32 ? "fp32" : "bf16", penalties ? "on " : "off", constrain ? "on " : "off",
           fm_cuda_sample_splits(B, vocab, split), compared, mismatches, worst_lp);
    assert_int_equal(mismatches, 0);
    assert_true(worst_lp <= 2e-5);
    if (penalties) { /* the device appended its ids to the same state */
        CK(cudaMemcpy(dcounts_h, d_counts, n * sizeof *counts, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(dseen_h, d_seen, n, cudaMemcpyDeviceToHost));
        assert_memory_equal(dcounts_h, counts, n * sizeof *counts);
        assert_memory_equal(dseen_h, seen, n);
    }
    uint64_t *dsteps_h = malloc((size_t)B * sizeof *dsteps_h);
    CK(cudaMemcpy(dsteps_h, d_steps, (size_t)B * sizeof *steps, cudaMemcpyDeviceToHost));
    assert_memory_equal(dsteps_h, steps, (size_t)B * sizeof *steps);
    free(dsteps_h);
    cudaFree(d_logits), cudaFree(d_params), cudaFree(d_steps), cudaFree(d_counts), cudaFree(d_seen), cudaFree(d_z);
    cudaFree(d_ids), cudaFree(d_info), cudaFree(d_mask), cudaFree(d_bias), cudaFree(d_ws);
    free(mask), free(bias);
    free(logits), free(lb), free(counts), free(dcounts_h), free(seen), free(dseen_h), free(params), free(steps);
    free(scratch), free(info), free(ids);
}

static void run_case(int32_t B, int32_t vocab, bool f32, bool penalties, bool constrain) {
    run_case_as(B, vocab, f32, penalties, constrain, false);
    run_case_as(B, vocab, f32, penalties, constrain, true);
}

static void test_small_vocab(void **state) {
    (void)state;
    run_case(48, 7, true, false, false);
    run_case(48, 7, false, true, false);
}

static void test_medium_vocab(void **state) {
    (void)state;
    run_case(96, 1000, true, true, false);
    run_case(96, 1000, false, false, false);
}

static void test_qwen3_vocab(void **state) {
    (void)state;
    run_case(24, 151936, false, true, false);
    run_case(12, 151936, true, false, false);
}

static void test_masks_and_biases(void **state) {
    (void)state;
    run_case(48, 7, true, false, true);
    run_case(96, 1000, false, true, true);
    run_case(36, 151936, false, true, true);
    run_case(24, 151936, true, false, true);
}

int main(void) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        printf("no GPU: skipped\n");
        return 0;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_small_vocab),
        cmocka_unit_test(test_medium_vocab),
        cmocka_unit_test(test_qwen3_vocab),
        cmocka_unit_test(test_masks_and_biases),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
