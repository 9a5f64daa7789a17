/* fp8moe chat: an interactive conversation in the terminal. User turns are read line by line from stdin, the
 * assistant's answer streams to stdout as it is generated.
 *
 * Each turn renders the whole conversation through the chat template and submits it to the scheduler as a request
 * that continues the previous turn's kept KV cache (fm_sched_request.reuse): the scheduler finds the common prefix
 * of the new prompt and what the cache holds, so only the new text is prefilled. Assistant turns are stored as the
 * text they were generated as; the template applies its own rules to them (Qwen3 drops old reasoning blocks).
 * With the prefix cache on (every model but a hybrid one), nothing needs keeping: the previous turn's blocks are
 * cached and the next prompt maps them like any request's; a hybrid model keeps its cache (and its Gated DeltaNet
 * states) from turn to turn instead. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "fp8moe_sched.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "util/status.h"

static const char *HELP =
    "usage: fp8moe chat --model DIR [--chat-template FILE] [--system TEXT] [--no-think] [options]\n"
    "\n"
    "An interactive chat: each line read from stdin is a user turn; the assistant's answer streams to stdout as it\n"
    "is generated (a prompt '> ' goes to stderr when stdin is a terminal). The conversation and its KV cache are\n"
    "kept between turns: each turn renders the whole conversation through the chat template and prefills only\n"
    "the text the cache does not hold yet. After each answer stderr gets the turn's figures: prompt tokens, how\n"
    "many came from the cache, new tokens, tokens/s, time to first token.\n"
    "\n"
    "commands (a line of its own):\n"
    "  /reset                   a new conversation (the cache is released; --system stays)\n"
    "  /exit                    the end (as is the end of stdin)\n"
    "\n"
    "chat:\n"
    "  --chat-template FILE     a Jinja template file (or a .json with \"chat_template\") instead of the\n"
    "                           checkpoint's (chat_template.jinja, chat_template.json or tokenizer_config.json)\n"
    "  --system TEXT            a system message at the start of every conversation\n"
    "  --no-think               pass enable_thinking=false to the template (Qwen3: an empty think block)\n"
    "  --max-tokens N           new tokens per answer at most (default 512; fewer when the context is nearly full)\n"
    "  --no-reuse               prefill every turn's whole prompt afresh (no cache kept between turns, no prefix\n"
    "                           cache)\n"
    "  --prefill-chunk N        prompt tokens per prefill step (default 2048, or --ctx when "
    "smaller)\n" CLI_STEP_TOKENS_HELP "  --no-prefix-cache        compute every prompt whole: no KV blocks kept and "
    "shared between requests\n" CLI_KV_CACHE_HELP
    "                           (docs/prefix-caching.md)\n" CLI_STATE_SLOTS_HELP "sampling (default greedy):\n"
    "  --temperature T          T >= 0 (0: greedy)\n"
    "  --top-p P                P in (0, 1] (1: off)\n"
    "  --top-k K                K >= 0 (0: off)\n"
    "  --seed S                 the first turn's seed; turn i uses S + i\n"
    "\n" CLI_MODEL_HELP;

enum { DEFAULT_MAX_TOKENS = 512, MAX_STOP = 8 };

enum {
    OPT_TEMPLATE = 2000,
    OPT_SYSTEM,
    OPT_NO_THINK,
    OPT_TEMPERATURE,
    OPT_TOP_P,
    OPT_TOP_K,
    OPT_SEED,
    OPT_MAX_TOKENS,
    OPT_NO_REUSE,
    OPT_PREFILL_CHUNK,
    OPT_MAX_STEP_TOKENS,
    OPT_STEP_BUDGET,
    OPT_STEP_RATIO,
    OPT_PROMPT_WAIT,
    OPT_NO_PREFIX_CACHE,
    OPT_KV_CACHE,
    OPT_STATE_SLOTS
};
static const struct option own_options[] = {{"chat-template", required_argument, 0, OPT_TEMPLATE},
                                            {"system", required_argument, 0, OPT_SYSTEM},
                                            {"no-think", no_argument, 0, OPT_NO_THINK},
                                            {"temperature", required_argument, 0, OPT_TEMPERATURE},
                                            {"top-p", required_argument, 0, OPT_TOP_P},
                                            {"top-k", required_argument, 0, OPT_TOP_K},
                                            {"seed", required_argument, 0, OPT_SEED},
                                            {"max-tokens", required_argument, 0, OPT_MAX_TOKENS},
                                            {"no-reuse", no_argument, 0, OPT_NO_REUSE},
                                            {"no-prefix-cache", no_argument, 0, OPT_NO_PREFIX_CACHE},
                                            {"kv-cache", required_argument, 0, OPT_KV_CACHE},
                                            {"state-cache-slots", required_argument, 0, OPT_STATE_SLOTS},
                                            {"prefill-chunk", required_argument, 0, OPT_PREFILL_CHUNK},
                                            {"max-step-tokens", required_argument, 0, OPT_MAX_STEP_TOKENS},
                                            {"step-budget", required_argument, 0, OPT_STEP_BUDGET},
                                            {"max-step-latency-ratio", required_argument, 0, OPT_STEP_RATIO},
                                            {"max-prompt-wait-steps", required_argument, 0, OPT_PROMPT_WAIT},
                                            {0, 0, 0, 0}};

typedef struct chat_args {
    const char *template_file, *system;
    bool no_think, no_reuse, no_prefix_cache;
    fm_kv_dtype kv_cache; /* --kv-cache: 0 (auto) unless given */
    long max_tokens, prefill_chunk;
    int64_t max_step_tokens;         /* 0: the default */
    fm_step_budget_mode step_budget; /* 0: the default */
    double step_latency_ratio;       /* 0: the default */
    int32_t prompt_wait_steps;       /* 0: the default; -1: off */
    long state_slots;                /* --state-cache-slots; -1: the default */
    fm_gen_params gp;
} chat_args;

static bool parse_float(const char *cmd, const char *opt, const char *text, double lo, double hi, bool lo_open,
                        float *out) {
    char *end = NULL;
    errno = 0;
    const double v = strtod(text, &end);
    if (errno || end == text || *end || !isfinite(v) || v < lo || v > hi || (lo_open && v == lo)) {
        cli_usage(cmd, "%s expects a number in %s%g, %g], got '%s'", opt, lo_open ? "(" : "[", lo, hi, text);
        return false;
    }
    *out = (float)v;
    return true;
}

static bool own_option(const char *cmd, int id, const char *arg, void *ctx) {
    chat_args *a = ctx;
    long v = 0;
    switch (id) {
    case OPT_TEMPLATE: a->template_file = arg; return true;
    case OPT_SYSTEM: a->system = arg; return true;
    case OPT_NO_THINK: a->no_think = true; return true;
    case OPT_NO_REUSE: a->no_reuse = true; return true;
    case OPT_TEMPERATURE:
        if (!parse_float(cmd, "--temperature", arg, 0, 1e6, false, &a->gp.temperature)) return false;
        a->gp.temperature = fm_sampler_temperature(a->gp.temperature);
        return true;
    case OPT_TOP_P:
        if (!parse_float(cmd, "--top-p", arg, 0, 1, true, &a->gp.top_p)) return false;
        a->gp.top_p = fm_sampler_top_p(a->gp.top_p > 0 ? a->gp.top_p : FLT_MIN); /* 1e-50 became 0 in fp32 */
        return true;
    case OPT_NO_PREFIX_CACHE: a->no_prefix_cache = true; return true;
    case OPT_KV_CACHE: return cli_parse_kv_cache(cmd, arg, &a->kv_cache);
    case OPT_STATE_SLOTS: return cli_parse_int(cmd, "--state-cache-slots", arg, 0, 1L << 20, &a->state_slots);
    case OPT_TOP_K:
        if (!cli_parse_int(cmd, "--top-k", arg, 0, 1L << 30, &v)) return false;
        a->gp.top_k = (int32_t)v;
        return true;
    case OPT_SEED: {
        char *end = NULL;
        errno = 0;
        const unsigned long long s = strtoull(arg, &end, 10);
        if (errno || end == arg || *end || arg[0] == '-') {
            cli_usage(cmd, "--seed expects an integer in [0, 2^64), got '%s'", arg);
            return false;
        }
        a->gp.seed = (uint64_t)s;
        return true;
    }
    case OPT_MAX_TOKENS: return cli_parse_int(cmd, "--max-tokens", arg, 1, 1L << 30, &a->max_tokens);
    case OPT_PREFILL_CHUNK: return cli_parse_int(cmd, "--prefill-chunk", arg, 1, 1L << 30, &a->prefill_chunk);
    case OPT_MAX_STEP_TOKENS: return cli_parse_step_tokens(cmd, arg, &a->max_step_tokens);
    case OPT_STEP_BUDGET: return cli_parse_step_budget(cmd, arg, &a->step_budget);
    case OPT_STEP_RATIO: return cli_parse_step_ratio(cmd, arg, &a->step_latency_ratio);
    case OPT_PROMPT_WAIT: return cli_parse_prompt_wait(cmd, arg, &a->prompt_wait_steps);
    default: return false;
    }
}

/* One turn in flight: the scheduler's events stream its text and record its figures. */
typedef struct turn {
    fm_detok *detok;
    char *text; /* the answer so far (malloc'd) */
    size_t len, cap;
    bool ended, oom;
    fm_sched_end end;
    char msg[256];
    int64_t n_prompt, n_cached, n_new;
    double t_submit, t_first, t_end;
} turn;

static void turn_append(turn *t, const char *s) {
    const size_t n = strlen(s);
    if (!n || t->oom) return;
    if (t->len + n + 1 > t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 256;
        while (cap < t->len + n + 1) cap *= 2;
        char *p = realloc(t->text, cap);
        if (!p) {
            t->oom = true;
            return;
        }
        t->text = p, t->cap = cap;
    }
    memcpy(t->text + t->len, s, n + 1);
    t->len += n;
    fputs(s, stdout);
    fflush(stdout);
}

static void on_event(void *user, const fm_sched_event *ev) {
    turn *t = user;
    if (ev->id >= 0) {
        if (t->n_new++ == 0) t->t_first = cli_now();
        turn_append(t, fm_detok_push(t->detok, ev->id));
    }
    if (ev->end == FM_SCHED_RUNNING) return;
    turn_append(t, fm_detok_flush(t->detok));
    t->ended = true, t->end = ev->end, t->t_end = cli_now();
    t->n_prompt = ev->n_prompt, t->n_cached = ev->n_cached, t->n_new = ev->n_generated;
    if (ev->msg) snprintf(t->msg, sizeof t->msg, "%s", ev->msg);
}

/* The conversation: messages with their own copies of the text. */
typedef struct convo {
    fm_chat_msg *msgs;
    int32_t n, cap;
} convo;

static bool convo_add(convo *c, const char *role, const char *content) {
    if (c->n == c->cap) {
        const int32_t cap = c->cap ? 2 * c->cap : 16;
        fm_chat_msg *p = realloc(c->msgs, (size_t)cap * sizeof *p);
        if (!p) return false;
        c->msgs = p, c->cap = cap;
    }
    char *s = strdup(content);
    if (!s) return false;
    c->msgs[c->n++] = (fm_chat_msg){role, s};
    return true;
}

static void convo_pop(convo *c) {
    if (c->n > 0) free((char *)c->msgs[--c->n].content);
}

static void convo_clear(convo *c, int32_t keep) {
    while (c->n > keep) convo_pop(c);
}

/* Everything a chat session holds. */
typedef struct chat {
    const char *cmd;
    const chat_args *a;
    fm_model *m;
    fm_context *context;
    fm_sched *s;
    fm_tokenizer *tok;
    fm_chat_template *tmpl;
    int32_t stop_ids[MAX_STOP];
    int32_t n_stop_ids;
    int64_t ctx;
    bool keep;    /* keep each turn's cache for the next (the prefix cache is off) */
    int64_t kept; /* the previous turn's request, its cache kept; -1: none */
    int32_t n_turns;
    convo c;
} chat;

static void release_kept(chat *ch) {
    if (ch->kept >= 0) fm_sched_release(ch->s, ch->kept);
    ch->kept = -1;
}

/* Steps the scheduler until the turn's request has ended. */
static fm_status run_turn(chat *ch, turn *t, fm_error *err) {
    while (!t->ended) {
        bool busy = false;
        fm_status st = fm_sched_step(ch->s, &busy, err);
        if (st) return st;
        if (!busy && !t->ended) return fm_fail(err, FM_ERR_USAGE, "the scheduler stopped with the answer unfinished");
    }
    return FM_OK;
}

static void print_figures(const chat *ch, const turn *t) {
    const double gen_s = t->t_end - t->t_first;
    const double tps = t->n_new > 1 && gen_s > 0 ? (double)(t->n_new - 1) / gen_s : 0.0;
    fprintf(stderr,
            "[turn %d] prompt %lld tokens (reused %lld from the cache, prefilled %lld)  new %lld tokens  "
            "%.1f tokens/s  first token %.1f ms  (%s)\n",
            ch->n_turns, (long long)t->n_prompt, (long long)t->n_cached, (long long)(t->n_prompt - t->n_cached),
            (long long)t->n_new, tps, 1e3 * ((t->n_new ? t->t_first : t->t_end) - t->t_submit),
            t->end == FM_SCHED_LENGTH ? "max tokens reached"
            : t->end == FM_SCHED_EOS  ? "end of text"
                                      : "end of turn");
}

/* One user turn: rendered with the conversation, generated, streamed, stored. Returns a fatal status (the backend
 * failed); problems of this turn alone (context full) are said on stderr and the conversation goes on. */
static fm_status chat_turn(chat *ch, const char *line, fm_error *err) {
    const chat_args *a = ch->a;
    if (!convo_add(&ch->c, "user", line)) return fm_fail(err, FM_ERR_NOMEM, "out of memory");
    const fm_chat_opts co = {.add_generation_prompt = true,
                             .enable_thinking = a->no_think ? FM_THINK_OFF : FM_THINK_DEFAULT};
    char *text = NULL;
    int32_t *ids = NULL;
    int64_t n = 0;
    fm_error e = {{0}};
    fm_status st = fm_chat_render(ch->tmpl, ch->c.msgs, ch->c.n, &co, &text, &e);
    if (!st) st = fm_tokenizer_encode(ch->tok, text, strlen(text), false, true, &ids, &n, &e);
    free(text);
    if (!st && n >= ch->ctx)
        st = fm_fail(&e, FM_ERR_USAGE,
                     "the context is full: the conversation is %lld tokens and a sequence holds %lld (--ctx); "
                     "type /reset to start a new conversation, or restart with a larger --ctx",
                     (long long)n, (long long)ch->ctx);
    if (st) {
        if (st == FM_ERR_NOMEM) {
            free(ids);
            *err = e;
            return st;
        }
        fprintf(stderr, "fp8moe chat: %s\n", e.msg);
        convo_pop(&ch->c);
        free(ids);
        return FM_OK;
    }
    ch->n_turns++;
    turn t = {0};
    if ((st = fm_detok_create(ch->tok, true, &t.detok, err))) {
        free(ids);
        return st;
    }
    fm_sched_request r;
    fm_sched_request_init(&r);
    r.prompt = ids, r.n_prompt = n, r.params = a->gp;
    r.params.seed = a->gp.seed + (uint64_t)(ch->n_turns - 1);
    r.params.max_tokens = a->max_tokens < ch->ctx - n ? a->max_tokens : ch->ctx - n;
    r.params.stop_ids = ch->stop_ids, r.params.n_stop_ids = ch->n_stop_ids;
    r.keep = ch->keep, r.reuse = ch->kept;
    r.on_event = on_event, r.user = &t;
    int64_t req = -1;
    t.t_submit = cli_now();
    st = fm_sched_submit(ch->s, &r, &req, &e);
    if (st && r.reuse >= 0) { /* the kept cache is gone (it could not be kept): start afresh */
        release_kept(ch);
        r.reuse = -1;
        st = fm_sched_submit(ch->s, &r, &req, &e);
    }
    ch->kept = -1; /* claimed by this request, or released */
    free(ids);
    if (!st) st = run_turn(ch, &t, err);
    else *err = e;
    if (!st) {
        fputc('\n', stdout);
        fflush(stdout);
        if (t.end == FM_SCHED_ERROR) {
            fprintf(stderr,
                    "fp8moe chat: the answer stopped: %s; type /reset to start a new conversation, or "
                    "restart with a larger --ctx\n",
                    t.msg);
            convo_pop(&ch->c);
        } else {
            print_figures(ch, &t);
            if (t.oom || !convo_add(&ch->c, "assistant", t.text ? t.text : ""))
                st = fm_fail(err, FM_ERR_NOMEM, "out of memory");
            else if (ch->keep) ch->kept = req;
        }
    }
    fm_detok_free(t.detok);
    free(t.text);
    return st;
}

/* The template's end-of-turn tokens that the tokenizer has, as stop ids. */
static void find_stop_ids(chat *ch, const char *model_dir) {
    for (const char *const *s = fm_chat_template_stop_tokens(ch->tmpl); s && *s; s++) {
        const int32_t id = fm_tokenizer_token_id(ch->tok, *s);
        if (id < 0)
            fprintf(stderr,
                    "fp8moe chat: note: the chat template %s ends a turn with %s, which is not a token of "
                    "%s/tokenizer.json; answers end at the model's eos or --max-tokens\n",
                    fm_chat_template_path(ch->tmpl), *s, model_dir);
        else if (ch->n_stop_ids < MAX_STOP) ch->stop_ids[ch->n_stop_ids++] = id;
    }
}

/* Reads lines until /exit or the end of stdin. */
static fm_status chat_loop(chat *ch, fm_error *err) {
    const bool tty = isatty(STDIN_FILENO);
    const int32_t base = ch->c.n; /* the system message */
    char *line = NULL;
    size_t cap = 0;
    fm_status st = FM_OK;
    for (;;) {
        if (tty) fputs("> ", stderr), fflush(stderr);
        const ssize_t got = getline(&line, &cap, stdin);
        if (got < 0) break;
        size_t n = (size_t)got;
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
        if (n == 0) continue;
        if (!strcmp(line, "/exit") || !strcmp(line, "/quit")) break;
        if (!strcmp(line, "/reset")) {
            release_kept(ch);
            convo_clear(&ch->c, base);
            fprintf(stderr, "(a new conversation)\n");
            continue;
        }
        if (line[0] == '/' && !strchr(line, ' ') && strlen(line) < 16) {
            fprintf(stderr, "fp8moe chat: unknown command %s: /reset starts a new conversation, /exit ends\n", line);
            continue;
        }
        if ((st = chat_turn(ch, line, err))) break;
    }
    if (tty && !st) fputc('\n', stderr);
    free(line);
    return st;
}

int cmd_chat(int argc, char **argv) {
    const char *cmd = "chat";
    chat_args a = {.max_tokens = DEFAULT_MAX_TOKENS, .prefill_chunk = 0, .state_slots = -1}; /* 0: cli_prefill_chunk */
    fm_gen_params_init(&a.gp);
    cli_model_opts mo;
    cli_model_opts_init(&mo);
    int rc = cli_parse(cmd, argc, argv, own_options, HELP, &mo, own_option, &a);
    if (rc >= 0) return rc;
    if (!mo.model_dir) return cli_usage(cmd, "--model is required");
    cli_pick_preset(cmd, &mo);

    chat ch = {.cmd = cmd, .a = &a, .kept = -1};
    fm_error err = {{0}};
    fm_status st = fm_tokenizer_load(mo.model_dir, &ch.tok, &err);
    if (!st) st = fm_chat_template_load(mo.model_dir, a.template_file, &ch.tmpl, &err);
    if (!st) {
        find_stop_ids(&ch, mo.model_dir);
        if (a.system && !convo_add(&ch.c, "system", a.system)) st = fm_fail(&err, FM_ERR_NOMEM, "out of memory");
    }
    if (!st) {
        mo.opt.max_seqs = 1;
        mo.opt.prefix_cache = !a.no_prefix_cache && !a.no_reuse;
        mo.opt.kv_cache = a.kv_cache;
        mo.opt.state_cache_slots = (int32_t)a.state_slots;
        mo.opt.max_tokens = cli_prefill_chunk(&mo, a.prefill_chunk);
        mo.opt.max_step_tokens = a.max_step_tokens;
        mo.opt.step_budget = a.step_budget, mo.opt.step_latency_ratio = a.step_latency_ratio;
        mo.opt.prompt_wait_steps = a.prompt_wait_steps;
        st = fm_model_load(mo.model_dir, &mo.opt, &ch.m, &err);
    }
    if (!st) st = fm_context_create(ch.m, NULL, &ch.context, &err);
    if (!st && mo.opt.verbose) cli_print_step_tokens(cmd, ch.context);
    if (!st) st = fm_sched_create(ch.context, mo.opt.max_tokens, &ch.s, &err);
    if (!st) {
        ch.ctx = fm_context_ctx(ch.context);
        ch.keep = !a.no_reuse && !fm_context_prefix_cache(ch.context);
        if (mo.opt.verbose)
            fprintf(stderr, "fp8moe chat: template %s, a context of %lld tokens\n", fm_chat_template_path(ch.tmpl),
                    (long long)ch.ctx);
        st = chat_loop(&ch, &err);
    }
    fm_sched_free(ch.s);
    fm_context_free(ch.context);
    fm_model_free(ch.m);
    convo_clear(&ch.c, 0);
    free(ch.c.msgs);
    if (ch.tmpl) fm_chat_template_free(ch.tmpl);
    if (ch.tok) fm_tokenizer_free(ch.tok);
    return st ? cli_fail(cmd, st, &err) : CLI_OK;
}
