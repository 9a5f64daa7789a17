/* fp8moe serve: the OpenAI-compatible HTTP server (src/serve/serve.h) over a model loaded for --max-seqs
 * sequences. */
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "serve/serve.h"

enum { DEFAULT_MAX_SEQS = 16 }; /* the cpu backend's, and cuda's when the card cannot be asked */

static const char *HELP =
    "usage: fp8moe serve (--model DIR | --synthetic NAME) [--host 127.0.0.1] [--port 8080] [--api-key KEY] [--max-seqs "
    "B] [--ctx N]\n"
    "                    [--chat-template FILE] [options]\n"
    "\n"
    "An HTTP server with the OpenAI API: POST /v1/chat/completions and /v1/completions (streamed as server-sent\n"
    "events with \"stream\": true), POST /tokenize and /detokenize, GET /v1/models, /health, /metrics (Prometheus)\n"
    "and a chat page at /. Requests are batched continuously: up to --max-seqs decode together, prompts are\n"
    "prefilled in chunks between decode steps, a client that disconnects has its sequence cancelled. SIGINT or\n"
    "SIGTERM drains: new requests get 503, running ones get --drain-timeout seconds, the rest are cut.\n"
    "One log line per request on stderr. docs/serving.md has the fields, endpoints, metrics and security notes.\n"
    "\n"
    "server:\n"
    "  --host ADDR              IPv4 or IPv6 address to listen on (default 127.0.0.1: this machine only)\n"
    "  --port N                 TCP port (default 8080; 0: any free port, printed at start)\n"
    "  --api-key KEY            require 'Authorization: Bearer KEY' on /v1/, /tokenize, /detokenize and /metrics\n"
    "                           (401 otherwise); without a key, a server on a loopback address answers only\n"
    "                           Host localhost, 127.0.0.1 or [::1] (DNS rebinding guard)\n"
    "  --cors-origin ORIGIN     let browser pages from ORIGIN (such as https://app.example, or *) call the API\n"
    "  --strict-fields          refuse request fields this server does not know with a 400 (default: named in\n"
    "                           the log); --fields-markdown prints the table of fields and exits\n"
    "  --drain-timeout S        seconds running requests get to finish after SIGTERM (default 30)\n"
    "  --idle-timeout S         close a connection that sends nothing for S seconds (default 60)\n"
    "  --max-conns N            open connections at most (default 512)\n"
    "  --max-conns-per-client N open connections from one address at most (default 256)\n"
    "  --model-name NAME        the model id clients name (default: the directory's last component)\n"
    "  --chat-template FILE     a Jinja chat template file (or a .json with \"chat_template\") instead of the\n"
    "                           checkpoint's, e.g. when it has none\n"
    "  --tool-parser NAME       how tool calls are read from the model's text: hermes (Qwen3's <tool_call>),\n"
    "                           mistral ([TOOL_CALLS]) or none (default: from the chat template's text)\n"
    "  --reasoning-parser NAME  qwen3 or deepseek_r1 (<think> blocks into reasoning_content) or none\n"
    "                           (default: from the chat template's text)\n"
    "  --default-chat-template-kwargs JSON\n"
    "                           template variables every request starts from, e.g. '{\"enable_thinking\": false}'\n"
    "                           (a request's chat_template_kwargs override them)\n"
    "  --max-seqs B             sequences decoded together (default: cpu 16; cuda as many as fit in 90% of the\n"
    "                           card's free memory with --ctx tokens each, at most 256)\n"
    "  --max-queue N            requests waiting beyond the running ones before 429 (default 256)\n"
    "  --max-body BYTES         request body size limit (default 1Mi; 413 beyond)\n"
    "  --prefill-chunk N        prompt tokens per prefill step (default 2048, or the context when "
    "smaller)\n" CLI_STEP_TOKENS_HELP "  --no-prefix-cache        compute every prompt whole: no KV blocks kept and "
    "shared between requests\n" CLI_KV_CACHE_HELP
    "                           (docs/prefix-caching.md)\n" CLI_STATE_SLOTS_HELP
    "  --no-warmup              listen at once: without it the server first runs a prefill chunk and every\n"
    "                           decode batch size (capturing their CUDA graphs) so that the first request is as\n"
    "                           fast as later ones, and prints the time it took (docs/loading.md)\n"
    "  --port-file FILE         write the port there once listening\n"
    "  --synthetic NAME         serve synthetic weights at the shapes of a real checkpoint (qwen3-30b-a3b,\n"
    "                           mixtral-8x7b, toy-moe; qwen3-next-80b-a3b, toy-next on the cpu backend) instead\n"
    "                           of --model: no tokenizer, so prompts are token ids\n"
    "                           (/v1/completions); for benchmarks. --ctx defaults to 4096 there\n"
    "\n" CLI_MODEL_HELP;

enum {
    OPT_HOST = 2000,
    OPT_PORT,
    OPT_API_KEY,
    OPT_MODEL_NAME,
    OPT_TEMPLATE,
    OPT_MAX_SEQS,
    OPT_MAX_QUEUE,
    OPT_MAX_BODY,
    OPT_PREFILL_CHUNK,
    OPT_MAX_STEP_TOKENS,
    OPT_STEP_BUDGET,
    OPT_STEP_RATIO,
    OPT_PROMPT_WAIT,
    OPT_PORT_FILE,
    OPT_SYNTHETIC,
    OPT_TOOL_PARSER,
    OPT_REASONING_PARSER,
    OPT_DEFAULT_KWARGS,
    OPT_CORS,
    OPT_STRICT,
    OPT_FIELDS_MD,
    OPT_DRAIN,
    OPT_IDLE,
    OPT_MAX_CONNS,
    OPT_MAX_CONNS_CLIENT,
    OPT_NO_PREFIX_CACHE,
    OPT_KV_CACHE,
    OPT_STATE_SLOTS,
    OPT_NO_WARMUP
};
static const struct option own_options[] = {{"host", required_argument, 0, OPT_HOST},
                                            {"port", required_argument, 0, OPT_PORT},
                                            {"api-key", required_argument, 0, OPT_API_KEY},
                                            {"model-name", required_argument, 0, OPT_MODEL_NAME},
                                            {"chat-template", required_argument, 0, OPT_TEMPLATE},
                                            {"max-seqs", required_argument, 0, OPT_MAX_SEQS},
                                            {"max-queue", required_argument, 0, OPT_MAX_QUEUE},
                                            {"max-body", required_argument, 0, OPT_MAX_BODY},
                                            {"no-prefix-cache", no_argument, 0, OPT_NO_PREFIX_CACHE},
                                            {"kv-cache", required_argument, 0, OPT_KV_CACHE},
                                            {"state-cache-slots", required_argument, 0, OPT_STATE_SLOTS},
                                            {"no-warmup", no_argument, 0, OPT_NO_WARMUP},
                                            {"prefill-chunk", required_argument, 0, OPT_PREFILL_CHUNK},
                                            {"max-step-tokens", required_argument, 0, OPT_MAX_STEP_TOKENS},
                                            {"step-budget", required_argument, 0, OPT_STEP_BUDGET},
                                            {"max-step-latency-ratio", required_argument, 0, OPT_STEP_RATIO},
                                            {"max-prompt-wait-steps", required_argument, 0, OPT_PROMPT_WAIT},
                                            {"port-file", required_argument, 0, OPT_PORT_FILE},
                                            {"synthetic", required_argument, 0, OPT_SYNTHETIC},
                                            {"tool-parser", required_argument, 0, OPT_TOOL_PARSER},
                                            {"reasoning-parser", required_argument, 0, OPT_REASONING_PARSER},
                                            {"default-chat-template-kwargs", required_argument, 0, OPT_DEFAULT_KWARGS},
                                            {"cors-origin", required_argument, 0, OPT_CORS},
                                            {"strict-fields", no_argument, 0, OPT_STRICT},
                                            {"fields-markdown", no_argument, 0, OPT_FIELDS_MD},
                                            {"drain-timeout", required_argument, 0, OPT_DRAIN},
                                            {"idle-timeout", required_argument, 0, OPT_IDLE},
                                            {"max-conns", required_argument, 0, OPT_MAX_CONNS},
                                            {"max-conns-per-client", required_argument, 0, OPT_MAX_CONNS_CLIENT},
                                            {0, 0, 0, 0}};

typedef struct serve_args {
    fm_serve_opts so;
    long max_seqs, prefill_chunk;
    int64_t max_step_tokens;         /* 0: the default */
    fm_step_budget_mode step_budget; /* 0: the default */
    double step_latency_ratio;       /* 0: the default */
    int32_t prompt_wait_steps;       /* 0: the default; -1: off */
    const char *synthetic;
    bool fields_markdown;
    bool no_prefix_cache;
    fm_kv_dtype kv_cache; /* --kv-cache: 0 (auto) unless given */
    long state_slots;     /* --state-cache-slots; -1: the default */
} serve_args;

static bool own_option(const char *cmd, int id, const char *arg, void *ctx) {
    serve_args *a = ctx;
    long v = 0;
    switch (id) {
    case OPT_HOST: a->so.host = arg; return true;
    case OPT_PORT:
        if (!cli_parse_int(cmd, "--port", arg, 0, 65535, &v)) return false;
        a->so.port = (int32_t)v;
        return true;
    case OPT_API_KEY: a->so.api_key = arg; return true;
    case OPT_MODEL_NAME: a->so.model_name = arg; return true;
    case OPT_TEMPLATE: a->so.chat_template = arg; return true;
    case OPT_TOOL_PARSER: a->so.tool_parser = arg; return true;
    case OPT_REASONING_PARSER: a->so.reasoning_parser = arg; return true;
    case OPT_DEFAULT_KWARGS: a->so.default_chat_template_kwargs = arg; return true;
    case OPT_MAX_SEQS: return cli_parse_int(cmd, "--max-seqs", arg, 1, 4096, &a->max_seqs);
    case OPT_MAX_QUEUE:
        if (!cli_parse_int(cmd, "--max-queue", arg, 0, 1L << 20, &v)) return false;
        a->so.max_queue = (int32_t)v;
        return true;
    case OPT_MAX_BODY: return cli_parse_bytes(cmd, "--max-body", arg, &a->so.max_body);
    case OPT_PREFILL_CHUNK: return cli_parse_int(cmd, "--prefill-chunk", arg, 1, 1L << 30, &a->prefill_chunk);
    case OPT_MAX_STEP_TOKENS: return cli_parse_step_tokens(cmd, arg, &a->max_step_tokens);
    case OPT_STEP_BUDGET: return cli_parse_step_budget(cmd, arg, &a->step_budget);
    case OPT_STEP_RATIO: return cli_parse_step_ratio(cmd, arg, &a->step_latency_ratio);
    case OPT_PROMPT_WAIT: return cli_parse_prompt_wait(cmd, arg, &a->prompt_wait_steps);
    case OPT_PORT_FILE: a->so.port_file = arg; return true;
    case OPT_SYNTHETIC: a->synthetic = arg; return true;
    case OPT_CORS:
        if (!arg[0])
            return cli_usage(cmd, "--cors-origin is empty: give an origin such as https://app.example, or *"), false;
        a->so.cors_origin = arg;
        return true;
    case OPT_STRICT: a->so.strict_fields = true; return true;
    case OPT_FIELDS_MD: a->fields_markdown = true; return true;
    case OPT_DRAIN:
        if (!cli_parse_int(cmd, "--drain-timeout", arg, 0, 86400, &v)) return false;
        a->so.drain_timeout = (double)v;
        return true;
    case OPT_IDLE:
        if (!cli_parse_int(cmd, "--idle-timeout", arg, 1, 86400, &v)) return false;
        a->so.idle_timeout = (int32_t)v;
        return true;
    case OPT_MAX_CONNS:
        if (!cli_parse_int(cmd, "--max-conns", arg, 1, 1L << 20, &v)) return false;
        a->so.max_conns = (int32_t)v;
        return true;
    case OPT_MAX_CONNS_CLIENT:
        if (!cli_parse_int(cmd, "--max-conns-per-client", arg, 1, 1L << 20, &v)) return false;
        a->so.max_conns_per_client = (int32_t)v;
        return true;
    case OPT_NO_PREFIX_CACHE: a->no_prefix_cache = true; return true;
    case OPT_KV_CACHE: return cli_parse_kv_cache(cmd, arg, &a->kv_cache);
    case OPT_STATE_SLOTS: return cli_parse_int(cmd, "--state-cache-slots", arg, 0, 1L << 20, &a->state_slots);
    case OPT_NO_WARMUP: a->so.no_warmup = true; return true;
    default: return false;
    }
}

int cmd_serve(int argc, char **argv) {
    const char *cmd = "serve";
    serve_args a = {.max_seqs = 0, .prefill_chunk = 0, .state_slots = -1}; /* 0: not given (defaults below) */
    fm_serve_opts_init(&a.so);
    cli_model_opts mo;
    cli_model_opts_init(&mo);
    int rc = cli_parse(cmd, argc, argv, own_options, HELP, &mo, own_option, &a);
    if (rc >= 0) return rc;
    if (a.fields_markdown) {
        char *md = fm_serve_fields_markdown();
        fputs(md, stdout);
        free(md);
        return CLI_OK;
    }
    if (a.so.api_key && !a.so.api_key[0])
        return cli_usage(cmd, "--api-key is empty (an unset variable?): give a key, or leave the option out");
    if (!mo.model_dir && !a.synthetic) return cli_usage(cmd, "--model DIR (or --synthetic NAME) is required");
    if (mo.model_dir && a.synthetic) return cli_usage(cmd, "--model and --synthetic exclude each other");
    if (a.synthetic && a.so.chat_template)
        return cli_usage(cmd, "--chat-template needs --model (a synthetic model has no tokenizer)");
    enum {
        SYNTHETIC_CTX = 4096
    }; /* a synthetic model's max_position_embeddings is 2^20: too much cache per sequence */
    if (a.synthetic && mo.opt.ctx <= 0) mo.opt.ctx = SYNTHETIC_CTX;
    if (a.synthetic && !a.so.model_name) a.so.model_name = a.synthetic;
    a.so.model_dir = mo.model_dir;
    cli_pick_preset(cmd, &mo);
    mo.opt.max_tokens = cli_prefill_chunk(&mo, a.prefill_chunk);
    mo.opt.max_seqs = (int32_t)a.max_seqs;
    mo.opt.prefix_cache = !a.no_prefix_cache;
    mo.opt.kv_cache = a.kv_cache;
    mo.opt.state_cache_slots = (int32_t)a.state_slots;
    mo.opt.max_step_tokens = a.max_step_tokens;
    mo.opt.step_budget = a.step_budget, mo.opt.step_latency_ratio = a.step_latency_ratio;
    mo.opt.prompt_wait_steps = a.prompt_wait_steps;
    cli_fit_to_card(cmd, &mo, a.max_seqs > 0, mo.opt.max_tokens);
    if (mo.opt.max_seqs <= 0) mo.opt.max_seqs = DEFAULT_MAX_SEQS;
    if (!a.prefill_chunk && mo.opt.ctx > 0 && mo.opt.max_tokens > mo.opt.ctx) /* a context the card shortened */
        mo.opt.max_tokens = mo.opt.ctx;
    a.so.prefill_chunk = mo.opt.max_tokens;
    fm_error err = {{0}};
    fm_model *m = NULL;
    fm_status st = a.synthetic ? fm_model_load_synthetic(a.synthetic, mo.opt.n_layers, &mo.opt, &m, &err)
                               : fm_model_load(mo.model_dir, &mo.opt, &m, &err);
    fm_context *ctx = NULL;
    if (!st) st = fm_context_create(m, NULL, &ctx, &err);
    if (!st) cli_print_step_tokens(cmd, ctx);
    if (!st) st = fm_serve_run(ctx, &a.so, &err);
    fm_context_free(ctx);
    fm_model_free(m);
    return st ? cli_fail(cmd, st, &err) : CLI_OK;
}
