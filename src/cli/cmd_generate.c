/* fp8moe generate: new token ids after one prompt or a batch of prompts (fm_context_generate), with the run's
 * prefill and decode speed; with --prompt TEXT (and --chat) the prompt is text and the new text streams to stdout.
 * The load is planned from the prompts: the KV cache holds --max-seqs sequences of (longest prompt + --max-tokens)
 * tokens unless --ctx says otherwise, and one prefill step takes at most --prefill-chunk tokens. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli/cli.h"
#include "cli/gen_text.h"
#include "util/ids.h"
#include "util/file.h"
#include "util/status.h"

static const char *HELP =
    "usage: fp8moe generate --model DIR (--ids FILE | --batch-file FILE) --max-tokens N --out FILE [options]\n"
    "       fp8moe generate --model DIR --prompt TEXT [--chat [--system TEXT] [--no-think]] [options]\n"
    "\n"
    "Generates up to N new tokens after each prompt and writes their ids, the prompt excluded, to --out as\n"
    "little-endian int32; with several prompts, every sequence in prompt order, one after the other (--json says\n"
    "where each begins). An eos or --stop-id id that ends a sequence is not written. The summary (prompt and new\n"
    "tokens, prefill and decode tokens/s, time to first token, finish reasons) goes to stderr; stdout carries only\n"
    "the ids of --stream. Output files appear only when complete.\n"
    "\n"
    "prompts:\n"
    "  --prompt TEXT            one prompt as text, encoded by DIR/tokenizer.json (with the special tokens its\n"
    "                           post-processor adds, such as Mistral's <s>); the new text is printed on stdout as\n"
    "                           it is generated; --max-tokens defaults to 256, --out is optional\n"
    "  --chat                   --prompt is one user turn of the model's chat template (chat_template.jinja or\n"
    "                           tokenizer_config.json, run by fp8moe's Jinja interpreter), the assistant's turn "
    "opened; its\n"
    "                           end-of-turn token (<|im_end|>) ends the sequence too. -v prints the rendered prompt\n"
    "  --system TEXT            with --chat: a system message before the user turn\n"
    "  --no-think               with --chat: pass enable_thinking=false (Qwen3: an empty think block)\n"
    "  --chat-template FILE     with --chat: render with this Jinja template file (or a .json with\n"
    "                           \"chat_template\") instead of the checkpoint's\n"
    "  --ids FILE               one prompt: token ids (little-endian int32)\n"
    "  --batch-file FILE        several prompts, generated together: a text file with one ids-file path per line\n"
    "                           (relative paths are relative to FILE's directory; blank lines are skipped).\n"
    "                           Every prompt samples with the same options, except the seed: prompt i (from 0)\n"
    "                           uses --seed + i\n"
    "sampling (--temperature 0, the default, is greedy: the most likely id, the lowest on a tie):\n"
    "  --max-tokens N           new tokens per prompt at most (required)\n"
    "  --temperature T          T >= 0 (default 0: greedy)\n"
    "  --top-k K                keep the K most likely ids (default 0: off)\n"
    "  --top-p P                keep the most likely ids that hold P of the probability, P in (0, 1]\n"
    "                           (default 1: off)\n"
    "  --min-p P                keep ids at least P times as likely as the most likely one, P in [0, 1) (default 0)\n"
    "  --repetition-penalty R   R > 0: logits of ids in the prompt or the output divided by R (> 0) or times R\n"
    "                           (< 0) (default 1: off)\n"
    "  --presence-penalty P     P in [-2, 2]: subtracted from the logit of every id generated so far (default 0)\n"
    "  --frequency-penalty F    F in [-2, 2]: F times an id's count in the output, subtracted (default 0)\n"
    "  --seed S                 S in [0, 2^64): the same seed gives the same tokens (default 0)\n"
    "  --stop-id ID             end a sequence at this id, as at an eos id (repeatable, 64 at most)\n"
    "  --stop-seq ID,ID,...     end a sequence when its output ends with these ids; they are not written\n"
    "                           (repeatable, 16 sequences of 16 ids at most)\n"
    "  --ignore-eos             go on to --max-tokens past the model's eos ids (generation_config.json, else\n"
    "                           config.json)\n"
    "output:\n"
    "  --out FILE               the new ids (required)\n"
    "  --json FILE              the run as JSON: options, figures, and per sequence its prompt file, prompt length,\n"
    "                           offset in --out, ids, finish reason (length, eos or stop) and log-probabilities\n"
    "  --stream                 print each new id on stdout as it is sampled (one prompt only). Ids that start a\n"
    "                           --stop-seq appear there, though not in --out\n"
    "planning:\n"
    "  --max-seqs B             sequences decoded together (default: the number of prompts, 64 at most); the\n"
    "                           other prompts wait for a free slot\n"
    "  --prefill-chunk N        prompt tokens per prefill step (default: the longest prompt, 2048 at "
    "most)\n" CLI_STEP_TOKENS_HELP "  --no-prefix-cache        compute every prompt whole: no KV blocks kept and "
    "shared between requests\n" CLI_KV_CACHE_HELP
    "                           (docs/prefix-caching.md)\n" CLI_STATE_SLOTS_HELP
    "  --ep N, --tp N           split the model over N ranks in this process: the routed experts (--ep), the\n"
    "                           attention heads (--tp), or both on the same ranks (cpu backend; --tp also on\n"
    "                           cuda, every rank on the one GPU; README, \"Expert and tensor parallelism\")\n"
    "  --ctx N                  tokens per sequence in the KV cache (for generate the default is the longest\n"
    "                           prompt + --max-tokens; more than the model's max_position_embeddings only when\n"
    "                           --ctx says so)\n"
    "\n" CLI_MODEL_HELP;

enum { MAX_STOP_IDS = 64, MAX_STOP_SEQS = 16, MAX_STOP_SEQ_LEN = 16, MAX_PROMPTS = 65536, DEFAULT_MAX_SEQS = 64 };

enum {
    OPT_IDS = 2000,
    OPT_BATCH,
    OPT_OUT,
    OPT_JSON,
    OPT_MAX_TOKENS,
    OPT_TEMPERATURE,
    OPT_TOP_K,
    OPT_TOP_P,
    OPT_MIN_P,
    OPT_REPETITION,
    OPT_PRESENCE,
    OPT_FREQUENCY,
    OPT_SEED,
    OPT_STOP_ID,
    OPT_STOP_SEQ,
    OPT_IGNORE_EOS,
    OPT_STREAM,
    OPT_MAX_SEQS,
    OPT_PREFILL_CHUNK,
    OPT_MAX_STEP_TOKENS,
    OPT_STEP_BUDGET,
    OPT_STEP_RATIO,
    OPT_PROMPT_WAIT,
    OPT_PROMPT,
    OPT_CHAT,
    OPT_SYSTEM,
    OPT_NO_THINK,
    OPT_CHAT_TEMPLATE,
    OPT_EP,
    OPT_TP,
    OPT_NO_PREFIX_CACHE,
    OPT_KV_CACHE,
    OPT_STATE_SLOTS
};
static const struct option own_options[] = {{"ids", required_argument, 0, OPT_IDS},
                                            {"batch-file", required_argument, 0, OPT_BATCH},
                                            {"out", required_argument, 0, OPT_OUT},
                                            {"json", required_argument, 0, OPT_JSON},
                                            {"max-tokens", required_argument, 0, OPT_MAX_TOKENS},
                                            {"temperature", required_argument, 0, OPT_TEMPERATURE},
                                            {"top-k", required_argument, 0, OPT_TOP_K},
                                            {"top-p", required_argument, 0, OPT_TOP_P},
                                            {"min-p", required_argument, 0, OPT_MIN_P},
                                            {"repetition-penalty", required_argument, 0, OPT_REPETITION},
                                            {"presence-penalty", required_argument, 0, OPT_PRESENCE},
                                            {"frequency-penalty", required_argument, 0, OPT_FREQUENCY},
                                            {"seed", required_argument, 0, OPT_SEED},
                                            {"stop-id", required_argument, 0, OPT_STOP_ID},
                                            {"stop-seq", required_argument, 0, OPT_STOP_SEQ},
                                            {"ignore-eos", no_argument, 0, OPT_IGNORE_EOS},
                                            {"stream", no_argument, 0, OPT_STREAM},
                                            {"max-seqs", required_argument, 0, OPT_MAX_SEQS},
                                            {"prefill-chunk", required_argument, 0, OPT_PREFILL_CHUNK},
                                            {"max-step-tokens", required_argument, 0, OPT_MAX_STEP_TOKENS},
                                            {"step-budget", required_argument, 0, OPT_STEP_BUDGET},
                                            {"max-step-latency-ratio", required_argument, 0, OPT_STEP_RATIO},
                                            {"max-prompt-wait-steps", required_argument, 0, OPT_PROMPT_WAIT},
                                            {"prompt", required_argument, 0, OPT_PROMPT},
                                            {"chat", no_argument, 0, OPT_CHAT},
                                            {"system", required_argument, 0, OPT_SYSTEM},
                                            {"no-think", no_argument, 0, OPT_NO_THINK},
                                            {"chat-template", required_argument, 0, OPT_CHAT_TEMPLATE},
                                            {"ep", required_argument, 0, OPT_EP},
                                            {"tp", required_argument, 0, OPT_TP},
                                            {"no-prefix-cache", no_argument, 0, OPT_NO_PREFIX_CACHE},
                                            {"kv-cache", required_argument, 0, OPT_KV_CACHE},
                                            {"state-cache-slots", required_argument, 0, OPT_STATE_SLOTS},
                                            {0, 0, 0, 0}};

typedef struct gen_args {
    const char *ids_path, *batch_path, *out_path, *json_path;
    long max_tokens, max_seqs, prefill_chunk; /* 0: not given */
    int64_t max_step_tokens;                  /* 0: the default */
    fm_step_budget_mode step_budget;          /* 0: the default */
    double step_latency_ratio;                /* 0: the default */
    int32_t prompt_wait_steps;                /* 0: the default; -1: off */
    long ep, tp;                              /* --ep, --tp: ranks of a group (0: none) */
    fm_gen_params gp;                         /* the sampling options; seed, stops set per prompt */
    int32_t stop_ids[MAX_STOP_IDS];
    int32_t n_stop_ids;
    int32_t stop_seqs[MAX_STOP_SEQS][MAX_STOP_SEQ_LEN];
    int32_t stop_seq_lens[MAX_STOP_SEQS];
    int32_t n_stop_seqs;
    bool stream;
    bool no_prefix_cache;
    fm_kv_dtype kv_cache; /* --kv-cache: 0 (auto) unless given */
    long state_slots;     /* --state-cache-slots; -1: the default */
    gen_text_opts text;   /* --prompt, --chat and theirs */
    gen_text *gt;         /* a text prompt's tokenizer and printer, while it runs */
} gen_args;

/* A number for opt: finite, above lo (or at it when lo_incl), below hi (or at it when hi_incl). */
static bool parse_real(const char *cmd, const char *opt, const char *text, double lo, bool lo_incl, double hi,
                       bool hi_incl, const char *range, float *out) {
    char *end = NULL;
    errno = 0;
    double v = strtod(text, &end);
    bool ok =
        !errno && end != text && !*end && isfinite(v) && (lo_incl ? v >= lo : v > lo) && (hi_incl ? v <= hi : v < hi);
    if (!ok) {
        cli_usage(cmd, "%s expects a number %s, got '%s'", opt, range, text);
        return false;
    }
    *out = (float)v;
    return true;
}

static bool parse_seed(const char *cmd, const char *text, uint64_t *out) {
    char *end = NULL;
    errno = 0;
    const unsigned long long v = strtoull(text, &end, 10);
    if (!(text[0] >= '0' && text[0] <= '9') || errno || *end) {
        cli_usage(cmd, "--seed expects an integer in [0, 2^64), got '%s'", text);
        return false;
    }
    *out = (uint64_t)v;
    return true;
}

/* "ID,ID,..." into one stop sequence */
static bool parse_stop_seq(const char *cmd, const char *text, gen_args *a) {
    if (a->n_stop_seqs == MAX_STOP_SEQS) {
        cli_usage(cmd, "--stop-seq: %d sequences at most", MAX_STOP_SEQS);
        return false;
    }
    int32_t *seq = a->stop_seqs[a->n_stop_seqs];
    int32_t n = 0;
    const char *p = text;
    for (;;) {
        char *end = NULL;
        errno = 0;
        const long v = strtol(p, &end, 10);
        if (!(*p >= '0' && *p <= '9') || errno || v > INT32_MAX || (*end && *end != ',') || n == MAX_STOP_SEQ_LEN) {
            cli_usage(cmd, "--stop-seq expects 1 to %d token ids separated by commas (such as 13,198), got '%s'",
                      MAX_STOP_SEQ_LEN, text);
            return false;
        }
        seq[n++] = (int32_t)v;
        if (!*end) break;
        p = end + 1;
    }
    a->stop_seq_lens[a->n_stop_seqs++] = n;
    return true;
}

static bool own_option(const char *cmd, int id, const char *arg, void *ctx) {
    gen_args *a = ctx;
    long v = 0;
    switch (id) {
    case OPT_IDS: a->ids_path = arg; return true;
    case OPT_BATCH: a->batch_path = arg; return true;
    case OPT_OUT: a->out_path = arg; return true;
    case OPT_JSON: a->json_path = arg; return true;
    case OPT_MAX_TOKENS: return cli_parse_int(cmd, "--max-tokens", arg, 1, 1L << 30, &a->max_tokens);
    case OPT_MAX_SEQS: return cli_parse_int(cmd, "--max-seqs", arg, 1, 4096, &a->max_seqs);
    case OPT_PREFILL_CHUNK: return cli_parse_int(cmd, "--prefill-chunk", arg, 1, 1L << 30, &a->prefill_chunk);
    case OPT_MAX_STEP_TOKENS: return cli_parse_step_tokens(cmd, arg, &a->max_step_tokens);
    case OPT_STEP_BUDGET: return cli_parse_step_budget(cmd, arg, &a->step_budget);
    case OPT_STEP_RATIO: return cli_parse_step_ratio(cmd, arg, &a->step_latency_ratio);
    case OPT_PROMPT_WAIT: return cli_parse_prompt_wait(cmd, arg, &a->prompt_wait_steps);
    case OPT_TEMPERATURE:
        if (!parse_real(cmd, "--temperature", arg, 0, true, INFINITY, false, ">= 0 (0: greedy)", &a->gp.temperature))
            return false;
        a->gp.temperature = fm_sampler_temperature(a->gp.temperature);
        return true;
    case OPT_TOP_K:
        if (!cli_parse_int(cmd, "--top-k", arg, 0, INT32_MAX, &v)) return false;
        a->gp.top_k = (int32_t)v;
        return true;
    case OPT_TOP_P:
        if (!parse_real(cmd, "--top-p", arg, 0, false, 1, true, "in (0, 1] (1: off)", &a->gp.top_p)) return false;
        a->gp.top_p = fm_sampler_top_p(a->gp.top_p > 0 ? a->gp.top_p : FLT_MIN); /* 1e-50 became 0 in fp32 */
        return true;
    case OPT_MIN_P: return parse_real(cmd, "--min-p", arg, 0, true, 1, false, "in [0, 1) (0: off)", &a->gp.min_p);
    case OPT_REPETITION:
        return parse_real(cmd, "--repetition-penalty", arg, 0, false, INFINITY, false, "> 0 (1: off)",
                          &a->gp.repetition_penalty);
    case OPT_PRESENCE:
        return parse_real(cmd, "--presence-penalty", arg, -2, true, 2, true, "in [-2, 2]", &a->gp.presence_penalty);
    case OPT_FREQUENCY:
        return parse_real(cmd, "--frequency-penalty", arg, -2, true, 2, true, "in [-2, 2]", &a->gp.frequency_penalty);
    case OPT_SEED: return parse_seed(cmd, arg, &a->gp.seed);
    case OPT_STOP_ID:
        if (a->n_stop_ids == MAX_STOP_IDS) {
            cli_usage(cmd, "--stop-id: %d ids at most", MAX_STOP_IDS);
            return false;
        }
        if (!cli_parse_int(cmd, "--stop-id", arg, 0, INT32_MAX, &v)) return false;
        a->stop_ids[a->n_stop_ids++] = (int32_t)v;
        return true;
    case OPT_STOP_SEQ: return parse_stop_seq(cmd, arg, a);
    case OPT_IGNORE_EOS: a->gp.ignore_eos = true; return true;
    case OPT_STREAM: a->stream = true; return true;
    case OPT_PROMPT: a->text.prompt = arg; return true;
    case OPT_CHAT: a->text.chat = true; return true;
    case OPT_SYSTEM: a->text.system = arg; return true;
    case OPT_NO_THINK: a->text.no_think = true; return true;
    case OPT_CHAT_TEMPLATE: a->text.template_file = arg; return true;
    case OPT_EP: return cli_parse_int(cmd, "--ep", arg, 1, FM_MAX_RANKS, &a->ep);
    case OPT_TP: return cli_parse_int(cmd, "--tp", arg, 1, FM_MAX_RANKS, &a->tp);
    case OPT_NO_PREFIX_CACHE: a->no_prefix_cache = true; return true;
    case OPT_KV_CACHE: return cli_parse_kv_cache(cmd, arg, &a->kv_cache);
    case OPT_STATE_SLOTS: return cli_parse_int(cmd, "--state-cache-slots", arg, 0, 1L << 20, &a->state_slots);
    }
    return true;
}

/* One prompt: its ids and the file they came from (as opened). */
typedef struct gen_prompt {
    char *path;
    int32_t *ids;
    int64_t n;
} gen_prompt;

static fm_status read_prompt(const char *path, gen_prompt *p, fm_error *err) {
    if (!(p->path = strdup(path))) return fm_fail(err, FM_ERR_NOMEM, "out of memory");
    return fm_ids_read(path, &p->ids, &p->n, err);
}

/* The prompts listed by a batch file: one ids-file path per line, relative to the batch file's directory. */
static fm_status read_batch(const char *batch, gen_prompt **out, int32_t *n_out, fm_error *err) {
    fm_path_buf pb;
    const char *B = fm_path_show(&pb, batch);
    char *text = NULL;
    size_t len = 0;
    fm_status st = fm_read_regular(batch, "a batch file (one ids-file path per line)", 16u << 20, &text, &len, err);
    if (st) return st;
    if (strlen(text) != len) {
        free(text);
        return fm_fail(err, FM_ERR_FORMAT, "%s: a NUL byte in a batch file: expected text, one ids-file path per line",
                       B);
    }
    const char *slash = strrchr(batch, '/');
    const size_t dir_len = slash ? (size_t)(slash - batch) + 1 : 0; /* with the slash */
    gen_prompt *p = NULL;
    int32_t n = 0, cap = 0, line_no = 0;
    for (char *line = text, *next; !st && line; line = next) {
        line_no++;
        next = strchr(line, '\n');
        if (next) *next++ = '\0';
        size_t l = strlen(line);
        while (l > 0 && (line[l - 1] == '\r' || line[l - 1] == ' ' || line[l - 1] == '\t')) line[--l] = '\0';
        while (*line == ' ' || *line == '\t') line++, l--;
        if (l == 0) continue;
        if (n == MAX_PROMPTS) {
            st = fm_fail(err, FM_ERR_FORMAT, "%s: more than %d prompts", B, MAX_PROMPTS);
            break;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            gen_prompt *q = realloc(p, (size_t)cap * sizeof *p);
            if (!q) {
                st = fm_fail(err, FM_ERR_NOMEM, "out of memory");
                break;
            }
            p = q;
        }
        memset(&p[n], 0, sizeof p[n]);
        const bool rel = line[0] != '/';
        char *path = malloc((rel ? dir_len : 0) + l + 1);
        if (!path) {
            st = fm_fail(err, FM_ERR_NOMEM, "out of memory");
            break;
        }
        snprintf(path, (rel ? dir_len : 0) + l + 1, "%.*s%s", rel ? (int)dir_len : 0, batch, line);
        n++;
        st = fm_ids_read(path, &p[n - 1].ids, &p[n - 1].n, err);
        p[n - 1].path = path;
        if (st) {
            fm_error inner = *err;
            fm_fail(err, st, "%s line %d: %s", B, line_no, inner.msg);
        }
    }
    free(text);
    if (!st && n == 0) st = fm_fail(err, FM_ERR_FORMAT, "%s: no prompts: expected one ids-file path per line", B);
    *out = p;
    *n_out = n;
    return st;
}

static void stream_token(void *user, int32_t i, int32_t id) {
    (void)i;
    int64_t *count = user;
    printf("%s%d", (*count)++ ? " " : "", id);
    fflush(stdout);
}

static const char *finish_name(fm_finish f) {
    return f == FM_FINISH_EOS ? "eos" : f == FM_FINISH_STOP ? "stop" : "length";
}

/* A JSON number written as text: integers exactly (seeds need all 64 bits), floats to float precision
 * (non-finite as null). */
static cJSON *raw_u64(uint64_t v) {
    char s[32];
    snprintf(s, sizeof s, "%llu", (unsigned long long)v);
    return cJSON_CreateRaw(s);
}

static cJSON *raw_float(float v) {
    char s[32];
    if (!isfinite(v)) return cJSON_CreateNull();
    snprintf(s, sizeof s, "%.7g", (double)v);
    return cJSON_CreateRaw(s);
}

static double per_s(int64_t n, double s) { return s > 0 ? (double)n / s : 0; }

typedef struct gen_run {
    const cli_model_opts *mo;
    const gen_args *a;
    const gen_prompt *prompts;
    int32_t n;
    const fm_gen_params *params;
    const fm_gen_output *out;
    const fm_gen_stats *stats;
    int64_t prompt_tokens, new_tokens;
    int32_t finish[3]; /* by fm_finish */
} gen_run;

static fm_status write_json(const gen_run *r, const char *path, fm_error *err) {
    const fm_gen_params *g = &r->a->gp;
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "model", r->mo->model_dir);
    cJSON_AddStringToObject(root, "backend", r->mo->opt.backend);
    cJSON_AddStringToObject(root, "preset", fm_preset_name(r->mo->opt.preset));
    cJSON_AddStringToObject(root, "dense", fm_dense_name(r->mo->opt.dense));
    cJSON_AddStringToObject(root, "lm_head", fm_lm_head_name(r->mo->opt.lm_head));
    cJSON_AddNumberToObject(root, "ctx", (double)r->mo->opt.ctx);
    cJSON_AddNumberToObject(root, "max_seqs", r->mo->opt.max_seqs);
    cJSON_AddNumberToObject(root, "prefill_chunk", (double)r->mo->opt.max_tokens);
    cJSON *s = cJSON_AddObjectToObject(root, "sampling");
    cJSON_AddNumberToObject(s, "max_tokens", (double)g->max_tokens);
    cJSON_AddItemToObject(s, "temperature", raw_float(g->temperature));
    cJSON_AddNumberToObject(s, "top_k", g->top_k);
    cJSON_AddItemToObject(s, "top_p", raw_float(g->top_p));
    cJSON_AddItemToObject(s, "min_p", raw_float(g->min_p));
    cJSON_AddItemToObject(s, "repetition_penalty", raw_float(g->repetition_penalty));
    cJSON_AddItemToObject(s, "presence_penalty", raw_float(g->presence_penalty));
    cJSON_AddItemToObject(s, "frequency_penalty", raw_float(g->frequency_penalty));
    cJSON_AddItemToObject(s, "seed", raw_u64(g->seed));
    cJSON *ids = cJSON_AddArrayToObject(s, "stop_ids");
    for (int32_t i = 0; i < r->a->n_stop_ids; i++) cJSON_AddItemToArray(ids, cJSON_CreateNumber(r->a->stop_ids[i]));
    cJSON *seqs = cJSON_AddArrayToObject(s, "stop_seqs");
    for (int32_t i = 0; i < r->a->n_stop_seqs; i++)
        cJSON_AddItemToArray(seqs, cJSON_CreateIntArray(r->a->stop_seqs[i], r->a->stop_seq_lens[i]));
    cJSON_AddBoolToObject(s, "ignore_eos", g->ignore_eos);
    const fm_gen_stats *st = r->stats;
    cJSON *f = cJSON_AddObjectToObject(root, "stats");
    cJSON_AddNumberToObject(f, "prompts", r->n);
    cJSON_AddNumberToObject(f, "prompt_tokens", (double)r->prompt_tokens);
    cJSON_AddNumberToObject(f, "new_tokens", (double)r->new_tokens);
    cJSON_AddNumberToObject(f, "prefill_tokens", (double)st->prefill_tokens);
    cJSON_AddNumberToObject(f, "prefill_s", st->prefill_s);
    cJSON_AddNumberToObject(f, "prefill_tokens_per_s", per_s(st->prefill_tokens, st->prefill_s));
    cJSON_AddNumberToObject(f, "decode_tokens", (double)st->decode_tokens);
    cJSON_AddNumberToObject(f, "decode_steps", (double)st->decode_steps);
    cJSON_AddNumberToObject(f, "decode_s", st->decode_s);
    cJSON_AddNumberToObject(f, "decode_tokens_per_s", per_s(st->decode_tokens, st->decode_s));
    cJSON_AddNumberToObject(f, "ttft_ms", 1e3 * st->ttft_s);
    cJSON *fin = cJSON_AddObjectToObject(f, "finish");
    for (int k = 0; k < 3; k++) cJSON_AddNumberToObject(fin, finish_name((fm_finish)k), r->finish[k]);
    cJSON *list = cJSON_AddArrayToObject(root, "sequences");
    int64_t offset = 0;
    for (int32_t i = 0; i < r->n; i++) {
        const fm_gen_output *o = &r->out[i];
        cJSON *q = cJSON_CreateObject();
        cJSON_AddStringToObject(q, "prompt_file", r->prompts[i].path);
        cJSON_AddNumberToObject(q, "n_prompt", (double)r->prompts[i].n);
        cJSON_AddItemToObject(q, "seed", raw_u64(r->params[i].seed));
        cJSON_AddNumberToObject(q, "offset", (double)offset);
        cJSON_AddNumberToObject(q, "n", (double)o->n);
        cJSON_AddStringToObject(q, "finish", finish_name(o->finish));
        cJSON *qi = cJSON_AddArrayToObject(q, "ids"), *ql = cJSON_AddArrayToObject(q, "logprobs");
        for (int64_t t = 0; t < o->n; t++) {
            cJSON_AddItemToArray(qi, cJSON_CreateNumber(o->ids[t]));
            cJSON_AddItemToArray(ql, raw_float(o->logprobs[t]));
        }
        cJSON_AddItemToArray(list, q);
        offset += o->n;
    }
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (!text) return fm_fail(err, FM_ERR_NOMEM, "out of memory for the JSON output");
    const size_t n = strlen(text);
    char *buf = malloc(n + 1);
    fm_status rc = buf ? FM_OK : fm_fail(err, FM_ERR_NOMEM, "out of memory for the JSON output");
    if (buf) {
        memcpy(buf, text, n);
        buf[n] = '\n';
        rc = cli_write_file(path, buf, n + 1, err);
    }
    free(buf);
    cJSON_free(text);
    return rc;
}

/* Every sequence's ids, little-endian int32, one after the other. */
static fm_status write_ids(const gen_run *r, const char *path, fm_error *err) {
    uint8_t *buf = malloc((size_t)(r->new_tokens > 0 ? r->new_tokens : 1) * 4);
    if (!buf) return fm_fail(err, FM_ERR_NOMEM, "out of memory for %lld ids", (long long)r->new_tokens);
    uint8_t *p = buf;
    for (int32_t i = 0; i < r->n; i++)
        for (int64_t t = 0; t < r->out[i].n; t++, p += 4) {
            const uint32_t v = (uint32_t)r->out[i].ids[t];
            p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8), p[2] = (uint8_t)(v >> 16), p[3] = (uint8_t)(v >> 24);
        }
    fm_status st = cli_write_file(path, buf, (size_t)r->new_tokens * 4, err);
    free(buf);
    return st;
}

static void print_summary(const gen_run *r) {
    const fm_gen_stats *s = r->stats;
    fprintf(stderr, "prompts: %d (%lld tokens)   new tokens: %lld   finish: length %d, eos %d, stop %d\n", r->n,
            (long long)r->prompt_tokens, (long long)r->new_tokens, r->finish[FM_FINISH_LENGTH],
            r->finish[FM_FINISH_EOS], r->finish[FM_FINISH_STOP]);
    fprintf(stderr, "prefill: %lld tokens in %.1f ms, %.1f tokens/s   time to first token: %.1f ms\n",
            (long long)s->prefill_tokens, 1e3 * s->prefill_s, per_s(s->prefill_tokens, s->prefill_s), 1e3 * s->ttft_s);
    if (s->decode_steps > 0)
        fprintf(stderr, "decode: %lld tokens in %lld steps, %.1f ms, %.1f tokens/s\n", (long long)s->decode_tokens,
                (long long)s->decode_steps, 1e3 * s->decode_s, per_s(s->decode_tokens, s->decode_s));
    else fprintf(stderr, "decode: no steps (every sequence ended at its first token)\n");
}

/* The KV cache's context: --ctx as given, else the longest prompt + --max-tokens within the model's
 * max_position_embeddings. Returns -1 when it fits (opt->ctx set), else the exit code (message printed). */
static int plan_context(const char *cmd, cli_model_opts *mo, const gen_args *a, const gen_prompt *longest) {
    fm_path_buf pb;
    const char *P = fm_path_show(&pb, longest->path);
    const int64_t need = longest->n + a->max_tokens;
    if (mo->opt.ctx > 0) {
        if (longest->n >= mo->opt.ctx) {
            fm_error err;
            fm_fail(&err, FM_ERR_FORMAT,
                    "%s: %lld prompt tokens leave no room for a new one in the context of %lld "
                    "tokens set by --ctx",
                    P, (long long)longest->n, (long long)mo->opt.ctx);
            return cli_fail(cmd, FM_ERR_FORMAT, &err);
        }
        if (need > mo->opt.ctx)
            return cli_usage(cmd, "--max-tokens %ld: %s has %lld tokens, + %ld new ones = %lld, more than --ctx %lld",
                             a->max_tokens, P, (long long)longest->n, a->max_tokens, (long long)need,
                             (long long)mo->opt.ctx);
        return -1;
    }
    fm_error err = {{0}};
    fm_checkpoint_info ck;
    fm_status st = fm_checkpoint_probe(mo->model_dir, &ck, &err);
    const int64_t limit = st ? 0 : ck.max_position_embeddings;
    if (st) return cli_fail(cmd, st, &err);
    if (limit > 0 && longest->n >= limit) {
        fm_fail(&err, FM_ERR_FORMAT,
                "%s: %lld prompt tokens leave no room for a new one in the model's context of "
                "%lld tokens (max_position_embeddings in config.json); --ctx N allows longer sequences",
                P, (long long)longest->n, (long long)limit);
        return cli_fail(cmd, FM_ERR_FORMAT, &err);
    }
    if (limit > 0 && need > limit)
        return cli_usage(cmd,
                         "--max-tokens %ld: %s has %lld tokens, + %ld new ones = %lld, more than the model's "
                         "context of %lld tokens (max_position_embeddings in config.json); pass --ctx %lld to allow it",
                         a->max_tokens, P, (long long)longest->n, a->max_tokens, (long long)need, (long long)limit,
                         (long long)need);
    mo->opt.ctx = need;
    return -1;
}

static bool same_file(const char *x, const char *y) { return x && y && strcmp(x, y) == 0; }

/* Loads the model planned for the prompts, generates, writes the outputs. Returns the exit code. */
static int run(const char *cmd, cli_model_opts *mo, const gen_args *a, gen_prompt *prompts, int32_t n) {
    int32_t longest = 0;
    for (int32_t i = 1; i < n; i++)
        if (prompts[i].n > prompts[longest].n) longest = i;
    int rc = plan_context(cmd, mo, a, &prompts[longest]);
    if (rc >= 0) return rc;
    const int64_t chunk = a->prefill_chunk > 0 ? a->prefill_chunk : FM_DEFAULT_MAX_TOKENS;
    mo->opt.max_tokens = prompts[longest].n < chunk ? prompts[longest].n : chunk;
    mo->opt.max_seqs = (int32_t)(a->max_seqs > 0 ? a->max_seqs : n < DEFAULT_MAX_SEQS ? n : DEFAULT_MAX_SEQS);
    mo->opt.prefix_cache = !a->no_prefix_cache;
    mo->opt.kv_cache = a->kv_cache;
    mo->opt.state_cache_slots = (int32_t)a->state_slots;
    mo->opt.max_step_tokens = a->max_step_tokens;
    mo->opt.step_budget = a->step_budget, mo->opt.step_latency_ratio = a->step_latency_ratio;
    mo->opt.prompt_wait_steps = a->prompt_wait_steps;

    fm_error err = {{0}};
    fm_model *m = NULL;
    fm_context *ctx = NULL;
    fm_gen_params *params = calloc((size_t)n, sizeof *params);
    fm_gen_output *out = calloc((size_t)n, sizeof *out);
    const int32_t **ids = calloc((size_t)n, sizeof *ids);
    int64_t *lens = calloc((size_t)n, sizeof *lens);
    const int32_t *seq_ptrs[MAX_STOP_SEQS];
    fm_status st = params && out && ids && lens ? FM_OK : fm_fail(&err, FM_ERR_NOMEM, "out of memory");
    fm_rank_group *group = NULL;
    mo->opt.ep_ranks = (int32_t)a->ep, mo->opt.tp_ranks = (int32_t)a->tp;
    if (!st && (a->ep > 1 || a->tp > 1)) st = fm_rank_group_load(mo->model_dir, &mo->opt, &group, &err);
    if (!st && !group) st = fm_model_load(mo->model_dir, &mo->opt, &m, &err);
    if (!st && !group) st = fm_context_create(m, NULL, &ctx, &err);
    if (!st && mo->opt.verbose) /* an error stays one line on stderr */
        cli_print_step_tokens(cmd, group ? fm_rank_group_context(group, 0) : ctx);
    const int32_t V = st ? 0 : fm_model_vocab_size(group ? fm_rank_group_model(group, 0) : m);
    for (int32_t i = 0; !st && i < n; i++)
        st = fm_ids_check_vocab(prompts[i].path, prompts[i].ids, prompts[i].n, V, &err);
    for (int32_t i = 0; !st && rc < 0 && i < a->n_stop_ids; i++)
        if (a->stop_ids[i] >= V)
            rc = cli_usage(cmd, "--stop-id %d is outside the vocabulary [0, %d)", a->stop_ids[i], V);
    for (int32_t i = 0; !st && rc < 0 && i < a->n_stop_seqs; i++)
        for (int32_t t = 0; rc < 0 && t < a->stop_seq_lens[i]; t++)
            if (a->stop_seqs[i][t] >= V)
                rc = cli_usage(cmd, "--stop-seq: id %d is outside the vocabulary [0, %d)", a->stop_seqs[i][t], V);
    gen_run r = {mo, a, prompts, n, params, out, NULL, 0, 0, {0}};
    fm_gen_stats stats = {0};
    int64_t streamed = 0;
    if (!st && rc < 0) {
        for (int32_t i = 0; i < a->n_stop_seqs; i++) seq_ptrs[i] = a->stop_seqs[i];
        for (int32_t i = 0; i < n; i++) {
            params[i] = a->gp;
            params[i].seed = a->gp.seed + (uint64_t)i;
            params[i].stop_ids = a->stop_ids, params[i].n_stop_ids = a->n_stop_ids;
            params[i].stop_seqs = seq_ptrs, params[i].stop_seq_lens = a->stop_seq_lens;
            params[i].n_stop_seqs = a->n_stop_seqs;
            ids[i] = prompts[i].ids, lens[i] = prompts[i].n;
        }
        fm_token_fn on_token = a->gt ? gen_text_on_token : a->stream ? stream_token : NULL;
        void *user = a->gt ? (void *)a->gt : &streamed;
        st = group ? fm_rank_group_generate(group, ids, lens, params, n, mo->opt.max_tokens, on_token, user, out,
                                            &stats, &err)
                   : fm_context_generate(ctx, ids, lens, params, n, mo->opt.max_tokens, on_token, user, out, &stats,
                                         &err);
        if (a->gt) gen_text_finish(a->gt);
        else if (a->stream && streamed) printf("\n");
    }
    if (!st && rc < 0) {
        r.stats = &stats;
        for (int32_t i = 0; i < n; i++) {
            r.prompt_tokens += prompts[i].n, r.new_tokens += out[i].n;
            r.finish[out[i].finish]++;
        }
        if (a->out_path) st = write_ids(&r, a->out_path, &err);
        if (!st && a->json_path) st = write_json(&r, a->json_path, &err);
        if (!st) {
            print_summary(&r);
            if (a->out_path)
                fprintf(stderr, "wrote %lld ids to %s%s%s\n", (long long)r.new_tokens, a->out_path,
                        a->json_path ? ", the details to " : "", a->json_path ? a->json_path : "");
            else if (a->json_path) fprintf(stderr, "wrote the details to %s\n", a->json_path);
        }
    }
    for (int32_t i = 0; out && i < n; i++) free(out[i].ids), free(out[i].logprobs);
    free(params), free(out), free(ids), free(lens);
    fm_context_free(ctx);
    fm_model_free(m);
    fm_rank_group_free(group);
    if (st) return cli_fail(cmd, st, &err);
    return rc >= 0 ? rc : CLI_OK;
}

enum { DEFAULT_TEXT_MAX_TOKENS = 256 };

/* generate --prompt TEXT [--chat ...]: one text prompt, its new text streamed to stdout. */
static int cmd_generate_text(const char *cmd, cli_model_opts *mo, gen_args *a) {
    if (!a->text.prompt) return cli_usage(cmd, "--chat, --system, --no-think and --chat-template need --prompt TEXT");
    if (!a->text.chat && (a->text.system || a->text.no_think || a->text.template_file))
        return cli_usage(cmd, "--system, --no-think and --chat-template apply to --chat");
    if (!mo->model_dir) return cli_usage(cmd, "--model is required");
    if (a->ids_path || a->batch_path) return cli_usage(cmd, "--prompt excludes --ids and --batch-file");
    if (a->stream) return cli_usage(cmd, "--stream prints ids; --prompt prints the text already");
    if ((a->out_path && !*a->out_path) || (a->json_path && !*a->json_path))
        return cli_usage(cmd, "--out and --json need a file name, got ''");
    if (same_file(a->out_path, a->json_path))
        return cli_usage(cmd, "--out and --json name the same file '%s'", a->out_path);
    if (!a->max_tokens) a->max_tokens = DEFAULT_TEXT_MAX_TOKENS;
    a->gp.max_tokens = a->max_tokens;
    a->text.verbose = mo->opt.verbose;

    fm_error err = {{0}};
    fm_status st = a->out_path ? fm_check_output_path(a->out_path, &err) : FM_OK;
    if (!st && a->json_path) st = fm_check_output_path(a->json_path, &err);
    gen_text gt;
    gen_prompt prompt = {0};
    if (!st) st = gen_text_prompt(mo->model_dir, &a->text, &gt, &prompt.ids, &prompt.n, &err);
    if (st) return cli_fail(cmd, st, &err);
    for (int32_t i = 0; i < gt.n_stop_ids && a->n_stop_ids < MAX_STOP_IDS; i++)
        a->stop_ids[a->n_stop_ids++] = gt.stop_ids[i];
    int rc = CLI_OK;
    if (!(prompt.path = strdup(a->text.chat ? "the chat prompt" : "--prompt"))) {
        fm_fail(&err, FM_ERR_NOMEM, "out of memory");
        rc = cli_fail(cmd, FM_ERR_NOMEM, &err);
    } else {
        a->gt = &gt;
        rc = run(cmd, mo, a, &prompt, 1);
        a->gt = NULL;
    }
    free(prompt.path), free(prompt.ids);
    gen_text_free(&gt);
    return rc;
}

int cmd_generate(int argc, char **argv) {
    const char *cmd = "generate";
    gen_args a;
    memset(&a, 0, sizeof a);
    a.state_slots = -1;
    fm_gen_params_init(&a.gp);
    cli_model_opts mo;
    cli_model_opts_init(&mo);
    int rc = cli_parse(cmd, argc, argv, own_options, HELP, &mo, own_option, &a);
    if (rc >= 0) return rc;
    cli_pick_preset(cmd, &mo);
    if (a.text.prompt || a.text.chat || a.text.system || a.text.no_think || a.text.template_file)
        return cmd_generate_text(cmd, &mo, &a);
    if (!mo.model_dir || !a.max_tokens || !a.out_path || !(a.ids_path || a.batch_path))
        return cli_usage(cmd, "--model, --ids (or --batch-file), --max-tokens and --out are required");
    if (a.ids_path && a.batch_path)
        return cli_usage(cmd, "--ids (one prompt) and --batch-file (several) exclude each other");
    a.gp.max_tokens = a.max_tokens;
    const char *prompt_path = a.ids_path ? a.ids_path : a.batch_path;
    if (!*prompt_path || !*a.out_path || (a.json_path && !*a.json_path))
        return cli_usage(cmd, "--ids, --batch-file, --out and --json need a file name, got ''");
    if (same_file(a.out_path, a.json_path))
        return cli_usage(cmd, "--out and --json name the same file '%s'", a.out_path);

    fm_error err = {{0}};
    gen_prompt *prompts = NULL;
    int32_t n = 0;
    fm_status st = fm_check_output_path(a.out_path, &err); /* before the run, not after it */
    if (!st && a.json_path) st = fm_check_output_path(a.json_path, &err);
    if (!st && a.ids_path) {
        prompts = calloc(1, sizeof *prompts);
        st = prompts ? read_prompt(a.ids_path, prompts, &err) : fm_fail(&err, FM_ERR_NOMEM, "out of memory");
        n = prompts ? 1 : 0;
    } else if (!st) st = read_batch(a.batch_path, &prompts, &n, &err);
    if (st) rc = cli_fail(cmd, st, &err);
    else if (a.stream && n > 1)
        rc = cli_usage(cmd, "--stream prints the ids of one prompt; %s lists %d", a.batch_path, n);
    else rc = run(cmd, &mo, &a, prompts, n);
    for (int32_t i = 0; i < n; i++) free(prompts[i].path), free(prompts[i].ids);
    free(prompts);
    return rc;
}
