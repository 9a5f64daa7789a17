/* fp8moe bench mask: the host cost of constrained decoding's allowed-token mask (src/text/token_matcher.h) at a
 * real vocabulary's size, step by step along a valid JSON text. */
#include <cjson/cJSON.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_common.h"
#include "bench_constrain.h"
#include "cli/cli.h"
#include "text/grammar.h"
#include "text/token_matcher.h"
#include "text/tokenizer.h"
#include "util/status.h"

static const char *HELP =
    "usage: fp8moe bench mask [--model DIR] [--vocab N] [--repeat R] [--batch B] [--json FILE]\n"
    "\n"
    "Times fm_matcher_fill_mask (the ids a JSON Schema allows next) and fm_matcher_accept at every token of a valid\n"
    "JSON text, in the thread's CPU time (other processes' preemption stays out). The vocabulary is DIR's tokenizer\n"
    "(byte-level BPE) grown to N ids by synthetic tokens shaped like Qwen3's 151936: concatenations of 2-4 real\n"
    "tokens, CJK characters (15%), partial UTF-8 bytes (3%).\n"
    "Prints the median / 90th percentile / max per step, inside strings and elsewhere, for a schema and for\n"
    "json_object mode: first every mask computed (no masks shared between matchers), then with the vocabulary's\n"
    "shared masks (text/mask_cache.h: the passes after the first copy the masks of the states they revisit).\n"
    "\n"
    "  --model DIR        the tokenizer.json's directory (default models/tiny-code-moe)\n"
    "  --vocab N          ids in all (default 151936)\n"
    "  --repeat R         passes over the text (default 5)\n"
    "  --batch B          also B json_object matchers stepped together, as a decode step's rows: each walks\n"
    "                     seeded random allowed tokens (half of them with a byte that closes or separates:\n"
    "                     strings end, objects end and start again), the B fills of a step in parallel\n"
    "                     (OpenMP); per step the wall time and the rows' CPU time summed, every mask computed\n"
    "                     and then with the shared masks (default 64; 0: off)\n"
    "  --steps N          steps of --batch (default 64)\n"
    "  --json FILE        also write the results as JSON\n";

static const char *SCHEMA =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"city\":{\"type\":\"string\","
    "\"maxLength\":40},\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":150},\"tags\":{\"type\":\"array\","
    "\"items\":{\"enum\":[\"admin\",\"user\",\"guest\"]},\"maxItems\":5},\"address\":{\"type\":\"object\","
    "\"properties\":{\"street\":{\"type\":\"string\"},\"zip\":{\"type\":[\"string\",\"null\"]}},\"required\":["
    "\"street\",\"zip\"],\"additionalProperties\":false},\"score\":{\"type\":\"number\"}},\"required\":[\"name\","
    "\"city\",\"age\",\"tags\",\"address\",\"score\"],\"additionalProperties\":false}";

static const char *TEXT = "{\"name\": \"Ada Lovelace, the first programmer of the Analytical Engine\", \"city\": "
                          "\"London\", \"age\": 36, \"tags\": [\"admin\", \"user\"], \"address\": {\"street\": "
                          "\"12 St James's Square\", \"zip\": null}, \"score\": 97.25}";

/* The calling thread's CPU time: a shared machine's preemption stays out of the figures. */
static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct mask_stats {
    double med, p90, max, str_med, other_med, accept_med;
    int64_t steps;
} mask_stats;

static int cmp_d(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median_of(double *v, int64_t n) {
    if (n == 0) return 0.0;
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return v[n / 2];
}

/* Every step of ids through g, repeat times. */
static fm_status run(const fm_grammar *g, const fm_token_vocab *v, const int32_t *ids, int64_t n, int32_t end,
                     long repeat, mask_stats *s, fm_error *err) {
    const int64_t total = n * repeat;
    double *all = malloc((size_t)total * sizeof *all), *str = malloc((size_t)total * sizeof *str);
    double *other = malloc((size_t)total * sizeof *other), *acc = malloc((size_t)total * sizeof *acc);
    uint32_t *words = malloc((size_t)(fm_token_vocab_size(v) + 31) / 32 * sizeof *words);
    fm_status st = all && str && other && acc && words ? FM_OK : fm_fail(err, FM_ERR_NOMEM, "out of memory");
    int64_t k = 0, ks = 0, ko = 0;
    for (long r = 0; !st && r < repeat; r++) {
        fm_matcher *m;
        if ((st = fm_matcher_create(g, v, &end, 1, &m, err))) break;
        bool in_string = false;
        for (int64_t i = 0; i < n && !st; i++) {
            double t0 = cpu_now();
            fm_matcher_fill_mask(m, words);
            const double dt = cpu_now() - t0;
            all[k++] = dt;
            if (in_string) str[ks++] = dt;
            else other[ko++] = dt;
            if (!((words[ids[i] >> 5] >> (ids[i] & 31)) & 1u))
                st =
                    fm_fail(err, FM_ERR_USAGE, "the mask refuses token %lld of the text (id %d)", (long long)i, ids[i]);
            t0 = cpu_now();
            if (!st && !fm_matcher_accept(m, ids[i])) st = fm_fail(err, FM_ERR_USAGE, "accept refused id %d", ids[i]);
            acc[k - 1] = cpu_now() - t0;
            uint32_t len;
            const uint8_t *b = fm_token_vocab_bytes(v, ids[i], &len);
            for (uint32_t j = 0; j < len; j++) /* the next step starts inside a string (escapes aside) */
                if (b[j] == '"' && (j == 0 || b[j - 1] != '\\')) in_string = !in_string;
        }
        fm_matcher_free(m);
    }
    if (!st) {
        s->steps = k;
        s->str_med = median_of(str, ks), s->other_med = median_of(other, ko), s->accept_med = median_of(acc, k);
        qsort(all, (size_t)k, sizeof *all, cmp_d);
        s->med = all[k / 2], s->p90 = all[(k * 9) / 10], s->max = all[k - 1];
    }
    free(all), free(str), free(other), free(acc), free(words);
    return st;
}

static void print_stats(const char *what, const mask_stats *s) {
    printf("%-19s %6lld steps  mask median %8.1f us  p90 %8.1f us  max %8.1f us  | in strings %8.1f us  "
           "elsewhere %8.1f us | accept %6.1f us\n",
           what, (long long)s->steps, 1e6 * s->med, 1e6 * s->p90, 1e6 * s->max, 1e6 * s->str_med, 1e6 * s->other_med,
           1e6 * s->accept_med);
}

static cJSON *stats_json(const mask_stats *s) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "steps", (double)s->steps);
    cJSON_AddNumberToObject(o, "median_us", 1e6 * s->med);
    cJSON_AddNumberToObject(o, "p90_us", 1e6 * s->p90);
    cJSON_AddNumberToObject(o, "max_us", 1e6 * s->max);
    cJSON_AddNumberToObject(o, "string_median_us", 1e6 * s->str_med);
    cJSON_AddNumberToObject(o, "other_median_us", 1e6 * s->other_med);
    cJSON_AddNumberToObject(o, "accept_median_us", 1e6 * s->accept_med);
    return o;
}

typedef struct batch_stats {
    double med_ms, p90_ms, max_ms, mean_ms;
    double cpu_ms; /* the rows' fills' CPU time per step, summed over the rows (mean) */
    int64_t ended, hits, misses;
} batch_stats;

static uint64_t walk_rng = 0x9E3779B97F4A7C15ull;
static uint32_t walk_rnd(uint32_t n) {
    walk_rng ^= walk_rng << 13, walk_rng ^= walk_rng >> 7, walk_rng ^= walk_rng << 17;
    return (uint32_t)((walk_rng >> 11) % n);
}

static bool structural(const fm_token_vocab *v, int32_t id) {
    uint32_t len;
    const uint8_t *b = fm_token_vocab_bytes(v, id, &len);
    for (uint32_t i = 0; i < len; i++)
        if (b[i] && strchr("\"}],:0123456789-", b[i])) return true;
    return false;
}

/* An allowed id of words: half the time one with a JSON byte that closes or separates (when there is one), so that
 * strings end and objects stay shallow, as a model's do. */
static int32_t pick(const fm_token_vocab *v, const uint32_t *words) {
    const int32_t n_ids = fm_token_vocab_size(v);
    int32_t n = 0, n_struct = 0;
    for (int32_t i = 0; i < n_ids; i++)
        if ((words[i >> 5] >> (i & 31)) & 1u) n++, n_struct += structural(v, i);
    const bool want = n_struct > 0 && walk_rnd(2);
    int32_t k = n ? (int32_t)walk_rnd((uint32_t)(want ? n_struct : n)) : 0;
    for (int32_t i = 0; i < n_ids; i++)
        if ((words[i >> 5] >> (i & 31)) & 1u && (!want || structural(v, i)) && k-- == 0) return i;
    return -1;
}

/* B json_object matchers stepped together: per step the B fills in parallel (timed, wall), then one seeded random
 * allowed id each; an object that ends starts again. The same walks whatever the shared masks (the same seed). */
static fm_status run_batch(const fm_grammar *g, fm_token_vocab *v, int32_t end, int32_t B, long steps, batch_stats *s,
                           fm_error *err) {
    walk_rng = 0x9E3779B97F4A7C15ull;
    const size_t W = (size_t)(fm_token_vocab_size(v) + 31) / 32;
    fm_matcher **m = calloc((size_t)B, sizeof *m);
    uint32_t *words = malloc((size_t)B * W * sizeof *words);
    double *ms = malloc((size_t)steps * sizeof *ms);
    fm_status st = m && words && ms ? FM_OK : fm_fail(err, FM_ERR_NOMEM, "out of memory");
    for (int32_t i = 0; !st && i < B; i++) st = fm_matcher_create(g, v, &end, 1, &m[i], err);
    int64_t h0, m0, h1, m1;
    fm_token_vocab_mask_cache_stats(v, &h0, &m0);
    double sum = 0;
    for (long k = 0; !st && k < steps; k++) {
        const double t0 = cli_now();
        double cpu = 0;
#pragma omp parallel for schedule(dynamic, 1) reduction(+ : cpu)
        for (int32_t i = 0; i < B; i++) {
            const double c0 = cpu_now();
            fm_matcher_fill_mask(m[i], words + (size_t)i * W);
            cpu += cpu_now() - c0;
        }
        ms[k] = 1e3 * (cli_now() - t0), sum += ms[k], s->cpu_ms += 1e3 * cpu / (double)steps;
        for (int32_t i = 0; !st && i < B; i++) {
            const int32_t id = pick(v, words + (size_t)i * W);
            if (id < 0 || !fm_matcher_accept(m[i], id)) st = fm_fail(err, FM_ERR_USAGE, "row %d: no id to take", i);
            else if (fm_matcher_finished(m[i])) {
                fm_matcher_free(m[i]), m[i] = NULL, s->ended++;
                st = fm_matcher_create(g, v, &end, 1, &m[i], err);
            }
        }
    }
    fm_token_vocab_mask_cache_stats(v, &h1, &m1);
    if (!st) {
        qsort(ms, (size_t)steps, sizeof *ms, cmp_d);
        s->med_ms = ms[steps / 2], s->p90_ms = ms[(steps * 9) / 10], s->max_ms = ms[steps - 1];
        s->mean_ms = sum / (double)steps, s->hits = h1 - h0, s->misses = m1 - m0;
    }
    for (int32_t i = 0; m && i < B; i++) fm_matcher_free(m[i]);
    free(m), free(words), free(ms);
    return st;
}

static void print_batch(const char *what, const batch_stats *s) {
    printf("%-20s step median %8.3f ms  p90 %8.3f ms  max %8.3f ms  mean %8.3f ms | CPU %8.3f ms per step | shared: "
           "%lld copied, %lld computed\n",
           what, s->med_ms, s->p90_ms, s->max_ms, s->mean_ms, s->cpu_ms, (long long)s->hits, (long long)s->misses);
}

static cJSON *batch_json(const batch_stats *s) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "median_ms", s->med_ms);
    cJSON_AddNumberToObject(o, "p90_ms", s->p90_ms);
    cJSON_AddNumberToObject(o, "max_ms", s->max_ms);
    cJSON_AddNumberToObject(o, "mean_ms", s->mean_ms);
    cJSON_AddNumberToObject(o, "cpu_ms_per_step", s->cpu_ms);
    cJSON_AddNumberToObject(o, "shared_hits", (double)s->hits);
    cJSON_AddNumberToObject(o, "shared_misses", (double)s->misses);
    return o;
}

int cmd_bench_mask(int argc, char **argv) {
    const char *cmd = "bench mask";
    enum { OPT_MODEL = 3000, OPT_VOCAB, OPT_REPEAT, OPT_JSON, OPT_BATCH, OPT_STEPS };
    static const struct option opts[] = {{"model", required_argument, 0, OPT_MODEL},
                                         {"vocab", required_argument, 0, OPT_VOCAB},
                                         {"repeat", required_argument, 0, OPT_REPEAT},
                                         {"json", required_argument, 0, OPT_JSON},
                                         {"batch", required_argument, 0, OPT_BATCH},
                                         {"steps", required_argument, 0, OPT_STEPS},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *model = "models/tiny-code-moe", *json = NULL;
    long vocab = 151936, repeat = 5, batch = 64, steps = 64;
    int c;
    optind = 1, opterr = 0;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'h': return fputs(HELP, stdout), CLI_OK;
        case OPT_MODEL: model = optarg; break;
        case OPT_JSON: json = optarg; break;
        case OPT_VOCAB:
            if (!cli_parse_int(cmd, "--vocab", optarg, 1, 1 << 22, &vocab)) return CLI_USAGE;
            break;
        case OPT_BATCH:
            if (!cli_parse_int(cmd, "--batch", optarg, 0, 4096, &batch)) return CLI_USAGE;
            break;
        case OPT_STEPS:
            if (!cli_parse_int(cmd, "--steps", optarg, 1, 100000, &steps)) return CLI_USAGE;
            break;
        case OPT_REPEAT:
            if (!cli_parse_int(cmd, "--repeat", optarg, 1, 10000, &repeat)) return CLI_USAGE;
            break;
        default: return cli_usage(cmd, "unknown option or missing value: '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc) return cli_usage(cmd, "unexpected argument '%s'", argv[optind]);
    fm_error err = {{0}};
    fm_tokenizer *t = NULL;
    fm_token_vocab *v = NULL;
    fm_grammar *gs = NULL, *go = NULL;
    int32_t *ids = NULL;
    int64_t n = 0;
    cJSON *schema = cJSON_Parse(SCHEMA);
    mask_stats ss = {0}, so = {0}, cs = {0}, co = {0};
    int64_t hits = 0, misses = 0;
    const double t0 = cli_now();
    fm_status st = fm_tokenizer_load(model, &t, &err);
    if (!st) st = bench_vocab_grown(t, (int32_t)vocab, &v, &err);
    const double build_s = cli_now() - t0;
    if (!st) st = fm_grammar_from_json_schema(schema, &gs, &err);
    if (!st) st = fm_grammar_json_object(&go, &err);
    if (!st) st = fm_tokenizer_encode(t, TEXT, strlen(TEXT), false, false, &ids, &n, &err);
    const int32_t end = fm_token_vocab_size(v ? v : NULL) - 1;
    if (!st) st = fm_token_vocab_set_mask_cache(v, 0, &err);
    if (!st) st = run(gs, v, ids, n, end, repeat, &ss, &err);
    if (!st) st = run(go, v, ids, n, end, repeat, &so, &err);
    if (!st) st = fm_token_vocab_set_mask_cache(v, FM_MASK_CACHE_DEFAULT, &err);
    if (!st) st = run(gs, v, ids, n, end, repeat, &cs, &err);
    if (!st) st = run(go, v, ids, n, end, repeat, &co, &err);
    if (!st) fm_token_vocab_mask_cache_stats(v, &hits, &misses);
    batch_stats bs = {0}, bc = {0};
    if (!st && batch) st = fm_token_vocab_set_mask_cache(v, 0, &err);
    if (!st && batch) st = run_batch(go, v, end, (int32_t)batch, steps, &bs, &err);
    if (!st && batch) st = fm_token_vocab_set_mask_cache(v, FM_MASK_CACHE_DEFAULT, &err);
    if (!st && batch) st = run_batch(go, v, end, (int32_t)batch, steps, &bc, &err);
    if (!st) {
        printf("bench mask: %s tokenizer grown to %d ids (built in %.2f s), a %zu-byte JSON text in %lld tokens, %ld "
               "passes, 1 thread\n",
               model, fm_token_vocab_size(v), build_s, strlen(TEXT), (long long)n, repeat);
        print_stats("json_schema", &ss);
        print_stats("json_object", &so);
        print_stats("json_schema, shared", &cs);
        print_stats("json_object, shared", &co);
        printf("shared masks: %lld fills copied one, %lld computed one (%d kept at most)\n", (long long)hits,
               (long long)misses, FM_MASK_CACHE_DEFAULT);
        if (batch) {
            printf("\n%ld json_object rows stepped together on %d threads, %ld steps of random walks (%lld objects "
                   "ended), wall time per step's fills:\n",
                   batch, omp_get_max_threads(), steps, (long long)bs.ended);
            print_batch("every mask computed", &bs);
            print_batch("shared masks", &bc);
        }
        if (json) {
            cJSON *root = cJSON_CreateObject();
            cJSON_AddStringToObject(root, "bench", "mask");
            cJSON_AddStringToObject(root, "model", model);
            cJSON_AddNumberToObject(root, "vocab", fm_token_vocab_size(v));
            cJSON_AddNumberToObject(root, "vocab_build_s", build_s);
            cJSON_AddItemToObject(root, "json_schema", stats_json(&ss));
            cJSON_AddItemToObject(root, "json_object", stats_json(&so));
            cJSON_AddItemToObject(root, "json_schema_shared", stats_json(&cs));
            cJSON_AddItemToObject(root, "json_object_shared", stats_json(&co));
            cJSON_AddNumberToObject(root, "shared_hits", (double)hits);
            cJSON_AddNumberToObject(root, "shared_misses", (double)misses);
            if (batch) {
                cJSON *b = cJSON_AddObjectToObject(root, "batch");
                cJSON_AddNumberToObject(b, "rows", (double)batch);
                cJSON_AddNumberToObject(b, "threads", omp_get_max_threads());
                cJSON_AddNumberToObject(b, "steps", (double)steps);
                cJSON_AddItemToObject(b, "computed", batch_json(&bs));
                cJSON_AddItemToObject(b, "shared", batch_json(&bc));
            }
            st = bench_json_write(root, json, &err);
        }
    }
    free(ids);
    cJSON_Delete(schema);
    fm_grammar_free(gs), fm_grammar_free(go);
    fm_token_vocab_free(v);
    fm_tokenizer_free(t);
    return st ? cli_fail(cmd, st, &err) : CLI_OK;
}
