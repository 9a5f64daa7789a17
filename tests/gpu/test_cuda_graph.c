/* The GPU forward pass is graph-safe: its device part (fm_forward_device: no host synchronisation, no allocation,
 * every buffer from the load-time plan) captured into a CUDA graph on the backend's stream and replayed gives the
 * logits of a plain forward pass bit for bit. For two small models and the presets the CUDA backend runs (ref,
 * int4, fp8, fp8 with --dense w8a8, ref32):
 *   1. A = fm_forward(ids), the plain pass;
 *   2. the ids staged, the device part captured (cudaStreamCaptureModeGlobal: any unsafe CUDA call inside, a sync
 *      or a cudaMalloc, fails the capture and stops at that call) and instantiated;
 *   3. a plain pass over other ids overwrites every buffer (its logits must differ from A);
 *   4. the ids staged again, the graph replayed twice, each time collected: the logits equal A bitwise.
 * Also: a prompt longer than the model was loaded for is refused with both numbers (the CPU side of this is in
 * tests/test_memory_plan.c). Runs only where a GPU is present (make test-gpu). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "engine/engine.h"
#include "util/ids.h"

#define CK(call)                                                                                                       \
    do {                                                                                                               \
        cudaError_t e_ = (call);                                                                                       \
        if (e_ != cudaSuccess) fail_msg("%s:%d: %s: %s", __FILE__, __LINE__, #call, cudaGetErrorString(e_));           \
    } while (0)

#define MAX_T 64 /* tokens of each prompt: enough for several tiles of every kernel, quick to run */

typedef struct plan_case {
    fm_preset preset;
    fm_dense dense;
    const char *name;
} plan_case;

static const plan_case CASES[] = {
    {FM_PRESET_REF, FM_DENSE_PRESET, "ref"},     {FM_PRESET_INT4, FM_DENSE_PRESET, "int4"},
    {FM_PRESET_FP8, FM_DENSE_PRESET, "fp8"},     {FM_PRESET_FP8, FM_DENSE_W8A8, "fp8 --dense w8a8"},
    {FM_PRESET_REF32, FM_DENSE_PRESET, "ref32"},
};

static fm_model *load(const char *dir, const plan_case *c, int64_t max_tokens) {
    fm_options opt;
    fm_options_init(&opt);
    opt.backend = "cuda", opt.preset = c->preset, opt.dense = c->dense, opt.max_tokens = max_tokens;
    fm_model *m = NULL;
    fm_error err = {{0}};
    if (fm_model_load(dir, &opt, &m, &err)) fail_msg("load %s (%s) on cuda: %s", dir, c->name, err.msg);
    return m;
}

/* the first differing logit, or -1 */
static int64_t first_difference(const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof *a) != 0) return i;
    return -1;
}

static void graph_replays(const char *dir, const char *ids_file) {
    int32_t *ids = NULL;
    int64_t T = 0;
    fm_error err = {{0}};
    if (fm_ids_read(ids_file, &ids, &T, &err)) fail_msg("%s", err.msg);
    if (T > MAX_T) T = MAX_T;
    assert_true(T >= 2);
    int32_t *other = malloc((size_t)T * sizeof *other);
    assert_non_null(other);
    for (int64_t t = 0; t < T; t++) other[t] = ids[T - 1 - t]; /* the same ids reversed: other logits */
    for (size_t ci = 0; ci < sizeof CASES / sizeof *CASES; ci++) {
        const plan_case *c = &CASES[ci];
        fm_model *m = load(dir, c, T);
        const int64_t n = T * m->cfg.vocab_size;
        float *a = malloc((size_t)n * sizeof *a), *b = malloc((size_t)n * sizeof *b),
              *g = malloc((size_t)n * sizeof *g);
        assert_true(a && b && g);
        if (fm_forward(m->context, ids, T, false, a, NULL, &err)) fail_msg("%s %s: forward: %s", dir, c->name, err.msg);

        cudaStream_t stream = (cudaStream_t)fm_cuda_backend_stream(m->be);
        if (!stream) fail_msg("%s %s: the backend has no CUDA stream", dir, c->name);
        if (fm_forward_stage(m->context, ids, T, &err)) fail_msg("%s %s: stage: %s", dir, c->name, err.msg);
        CK(cudaStreamSynchronize(stream)); /* the staging copy is done before the capture starts */
        cudaGraph_t graph = NULL;
        cudaGraphExec_t exec = NULL;
        CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
        fm_forward_device(m->context, T, false);
        CK(cudaStreamEndCapture(stream, &graph));
        CK(cudaGraphInstantiate(&exec, graph, 0));
        size_t n_nodes = 0;
        CK(cudaGraphGetNodes(graph, NULL, &n_nodes));

        /* every buffer overwritten by a pass over other ids */
        if (fm_forward(m->context, other, T, false, b, NULL, &err))
            fail_msg("%s %s: forward: %s", dir, c->name, err.msg);
        if (first_difference(a, b, n) < 0) fail_msg("%s %s: reversed ids gave the same logits", dir, c->name);

        for (int replay = 0; replay < 2; replay++) {
            memset(g, 0xff, (size_t)n * sizeof *g);
            if (fm_forward_stage(m->context, ids, T, &err)) fail_msg("%s %s: stage: %s", dir, c->name, err.msg);
            CK(cudaGraphLaunch(exec, stream));
            if (fm_forward_collect(m->context, T, false, g, &err))
                fail_msg("%s %s: collect: %s", dir, c->name, err.msg);
            const int64_t d = first_difference(a, g, n);
            if (d >= 0)
                fail_msg("%s %s: replay %d differs from the plain pass at logit %lld (token %lld): %.9g vs %.9g", dir,
                         c->name, replay + 1, (long long)d, (long long)(d / m->cfg.vocab_size), g[d], a[d]);
        }
        printf("%-30s %-17s T=%lld: graph of %zu nodes, 2 replays bitwise equal to the plain pass\n", dir, c->name,
               (long long)T, n_nodes);
        CK(cudaGraphExecDestroy(exec));
        CK(cudaGraphDestroy(graph));
        free(a), free(b), free(g);
        fm_model_free(m);
    }
    free(other), free(ids);
}

static void qwen3_moe_bf16(void **s) {
    (void)s;
    graph_replays("tests/models/qwen3-moe-bf16", "tests/models/qwen3-moe-bf16/golden_ids.i32");
}

static void tiny_code_moe(void **s) {
    (void)s;
    graph_replays("models/tiny-code-moe", "models/tiny-code-moe/eval_ids.i32");
}

/* a prompt one token longer than the load planned: refused with both numbers and what to pass, nothing grows */
static void longer_prompt_refused(void **s) {
    (void)s;
    int32_t *ids = NULL;
    int64_t T = 0;
    fm_error err = {{0}};
    if (fm_ids_read("tests/models/qwen3-moe-bf16/golden_ids.i32", &ids, &T, &err)) fail_msg("%s", err.msg);
    if (T > 16) T = 16;
    fm_model *m = load("tests/models/qwen3-moe-bf16", &CASES[0], T - 1);
    float *logits = malloc((size_t)(T * m->cfg.vocab_size) * sizeof *logits);
    assert_non_null(logits);
    assert_int_equal(fm_context_logits(m->context, ids, T, logits, &err), FM_ERR_USAGE);
    printf("%s\n", err.msg);
    char want[128];
    snprintf(want, sizeof want, "prompt of %lld tokens is longer than the %lld tokens", (long long)T, (long long)T - 1);
    assert_non_null(strstr(err.msg, want));
    assert_non_null(strstr(err.msg, "max_tokens"));
    /* the planned length still runs */
    assert_int_equal(fm_context_logits(m->context, ids, T - 1, logits, &err), FM_OK);
    free(logits), free(ids);
    fm_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(qwen3_moe_bf16),
        cmocka_unit_test(tiny_code_moe),
        cmocka_unit_test(longer_prompt_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
