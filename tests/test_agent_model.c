/* tests/models/tiny-agent, the Qwen3-MoE trained to call tools (tools/make_agent_model.py), against its golden
 * generations (golden_chat.json: conversations rendered by the Qwen3 chat template with and without tools and
 * thinking, the prompt ids, and the reference's greedy new ids and text):
 *   - fp8moe's tokenizer encodes each rendered prompt (special tokens in the text parsed) to the golden ids, and
 *     decodes the golden new ids to the golden text (special tokens kept);
 *   - greedy generation on the CPU backend (ref, fp32) gives the golden new ids token for token, the eos
 *     (<|im_end|>) where the reference stopped on it. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "text/tokenizer.h"

static const char *k_dir = "tests/models/tiny-agent";

static cJSON *read_golden(void) {
    char path[256];
    snprintf(path, sizeof path, "%s/golden_chat.json", k_dir);
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("%s: missing (tools/make_agent_model.py makes it)", path);
    fseek(f, 0, SEEK_END);
    const long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)n + 1);
    assert_non_null(text);
    assert_int_equal(fread(text, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    text[n] = '\0';
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!root || !cJSON_IsArray(cJSON_GetObjectItem(root, "cases"))) fail_msg("%s: no cases array", path);
    return root;
}

/* a JSON array of ints into a malloc'd array */
static int32_t *int_array(const cJSON *a, int *n) {
    *n = cJSON_GetArraySize(a);
    int32_t *v = malloc(((size_t)*n + 1) * sizeof *v);
    assert_non_null(v);
    for (int i = 0; i < *n; i++) v[i] = cJSON_GetArrayItem(a, i)->valueint;
    return v;
}

static void tokenizer_matches_golden(void **state) {
    (void)state;
    cJSON *root = read_golden();
    fm_tokenizer *t = NULL;
    fm_error err;
    if (fm_tokenizer_load(k_dir, &t, &err)) fail_msg("%s", err.msg);
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(root, "cases")) {
        const char *name = cJSON_GetObjectItem(c, "name")->valuestring;
        const char *prompt = cJSON_GetObjectItem(c, "prompt")->valuestring;
        int np, nw;
        int32_t *want = int_array(cJSON_GetObjectItem(c, "prompt_ids"), &np);
        int32_t *ids = NULL;
        int64_t n = 0;
        if (fm_tokenizer_encode(t, prompt, strlen(prompt), false, true, &ids, &n, &err)) fail_msg("%s", err.msg);
        if (n != np || memcmp(ids, want, (size_t)n * sizeof *ids))
            fail_msg("%s: the prompt encodes to %lld ids, the golden has %d (or they differ)", name, (long long)n, np);
        int32_t *new_ids = int_array(cJSON_GetObjectItem(c, "new_ids"), &nw);
        char *text = NULL;
        size_t len = 0;
        if (fm_tokenizer_decode(t, new_ids, nw, false, &text, &len, &err)) fail_msg("%s", err.msg);
        assert_string_equal(text, cJSON_GetObjectItem(c, "text")->valuestring);
        printf("  %-26s prompt of %3d ids and the %2d new ids' text as the golden\n", name, np, nw);
        free(text), free(new_ids), free(ids), free(want);
    }
    fm_tokenizer_free(t);
    cJSON_Delete(root);
}

static void greedy_matches_golden(void **state) {
    (void)state;
    cJSON *root = read_golden();
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(root, "cases")) {
        const char *name = cJSON_GetObjectItem(c, "name")->valuestring;
        int np, nw;
        int32_t *prompt = int_array(cJSON_GetObjectItem(c, "prompt_ids"), &np);
        int32_t *want = int_array(cJSON_GetObjectItem(c, "new_ids"), &nw);
        fm_options opt;
        fm_options_init(&opt);
        opt.max_seqs = 1, opt.ctx = np + nw, opt.max_tokens = np;
        fm_model *m = NULL;
        fm_error err;
        if (fm_model_load(k_dir, &opt, &m, &err)) fail_msg("%s: %s", k_dir, err.msg);
        fm_gen_params gp;
        fm_gen_params_init(&gp);
        gp.max_tokens = nw;
        const int32_t *prompts[1] = {prompt};
        const int64_t lens[1] = {np};
        fm_gen_output o;
        if (fm_context_generate(m->context, prompts, lens, &gp, 1, 0, NULL, NULL, &o, NULL, &err))
            fail_msg("%s", err.msg);
        /* the reference's list ends with the eos it stopped on; ours ends before it */
        int64_t got = o.n;
        if (o.finish == FM_FINISH_EOS) {
            assert_true(got < nw);
            bool is_eos = false;
            for (int i = 0; i < m->cfg.n_eos; i++) is_eos |= want[got] == m->cfg.eos_ids[i];
            if (!is_eos)
                fail_msg("%s: stopped at new id %lld on an eos the golden does not have", name, (long long)got);
            got++;
        }
        for (int64_t i = 0; i < o.n && i < nw; i++)
            if (o.ids[i] != want[i])
                fail_msg("%s: new id %lld is %d, the golden's %d", name, (long long)i, o.ids[i], want[i]);
        assert_int_equal(got, nw);
        printf("  %-26s %2d new ids as the golden (smallest top-1/top-2 margin %.4f)\n", name, nw,
               cJSON_GetObjectItem(c, "min_margin")->valuedouble);
        free(o.ids), free(o.logprobs), free(prompt), free(want);
        fm_model_free(m);
    }
    cJSON_Delete(root);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(tokenizer_matches_golden),
        cmocka_unit_test(greedy_matches_golden),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
