/* GET /metrics: the Prometheus text exposition format (version 0.0.4). Every name is listed with its meaning in
 * docs/serving.md. */
#include "serve/serve_internal.h"

/* seconds: from 5 ms to 60 s, roughly x2.5 apart (time to first token spans a queue wait; per-token latency sits at
 * the low end) */
static const double k_bounds[HIST_BUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                              0.25,  0.5,    1.0,   2.5,  5.0,   10.0, 60.0};

/* a scheduler step: 2 ms to 1 s, finer where a GPU's decode steps (3-15 ms) and mixed steps (x 1-5) fall */
static const double k_step_bounds[HIST_BUCKETS] = {0.002, 0.004, 0.006, 0.008, 0.010, 0.012, 0.016,
                                                   0.020, 0.025, 0.032, 0.050, 0.100, 0.250, 1.0};

static void observe(histogram *h, const double *bounds, double seconds) {
    int b = 0;
    while (b < HIST_BUCKETS && seconds > bounds[b]) b++;
    h->counts[b]++;
    h->sum += seconds;
    h->n++;
}

void hist_observe(histogram *h, double seconds) { observe(h, k_bounds, seconds); }

void metrics_observe_step(metrics *m, const fm_sched_stats *st) {
    if (st->steps == m->steps_seen) return;
    m->steps_seen = st->steps;
    histogram *h = st->last_prefill_rows == 0 ? &m->decode_step
                   : st->last_decode_rows > 0 ? &m->mixed_step
                                              : &m->prefill_step;
    observe(h, k_step_bounds, st->last_step_ms * 1e-3);
}

static void hist_write(sbuf *o, const char *name, const char *help, const histogram *h, const double *bounds) {
    sb_printf(o, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int b = 0; b < HIST_BUCKETS; b++) {
        cum += h->counts[b];
        sb_printf(o, "%s_bucket{le=\"%g\"} %llu\n", name, bounds[b], (unsigned long long)cum);
    }
    cum += h->counts[HIST_BUCKETS];
    sb_printf(o, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name, (unsigned long long)cum, name,
              h->sum, name, (unsigned long long)h->n);
}

static void counter(sbuf *o, const char *name, const char *help, uint64_t v) {
    sb_printf(o, "# HELP %s %s\n# TYPE %s counter\n%s %llu\n", name, help, name, name, (unsigned long long)v);
}

static void gauge(sbuf *o, const char *name, const char *help, long long v) {
    sb_printf(o, "# HELP %s %s\n# TYPE %s gauge\n%s %lld\n", name, help, name, name, v);
}

static void gauge_real(sbuf *o, const char *name, const char *help, double v) {
    sb_printf(o, "# HELP %s %s\n# TYPE %s gauge\n%s %.6f\n", name, help, name, name, v);
}

void metrics_write(sbuf *o, const metrics *m, const fm_sched_stats *st, int32_t queued, bool draining) {
    static const char *const codes[6] = {"2xx", "400", "401", "404", "429", "other"};
    sb_puts(o, "# HELP fp8moe_requests_total HTTP requests to the API endpoints, by status\n"
               "# TYPE fp8moe_requests_total counter\n");
    for (int i = 0; i < 6; i++)
        sb_printf(o, "fp8moe_requests_total{status=\"%s\"} %llu\n", codes[i], (unsigned long long)m->requests[i]);
    counter(o, "fp8moe_prompt_tokens_total", "prompt tokens of accepted requests", m->prompt_tokens);
    counter(o, "fp8moe_prompt_tokens_cached_total", "prompt tokens taken from the prefix cache (not computed again)",
            m->cached_tokens);
    counter(o, "fp8moe_generation_tokens_total", "tokens generated", m->generation_tokens);
    counter(o, "fp8moe_requests_cancelled_total", "requests cancelled (client gone, stop string, shutdown)",
            m->cancelled);
    counter(o, "fp8moe_requests_cut_total", "requests ended by a shutdown before they finished (finish_reason abort)",
            m->cut);
    counter(o, "fp8moe_prefix_cache_queries_total", "requests that ended, each a lookup of its prompt in the KV cache",
            m->prefix_queries);
    counter(o, "fp8moe_prefix_cache_hits_total", "requests whose prompt began with tokens already in the KV cache",
            m->prefix_hits);
    gauge(o, "fp8moe_queue_depth", "requests waiting for a sequence slot", (long long)queued);
    gauge(o, "fp8moe_requests_waiting", "requests waiting for a sequence slot (as fp8moe_queue_depth)",
          (long long)queued);
    gauge(o, "fp8moe_requests_running", "requests prefilling or decoding", st->running);
    gauge(o, "fp8moe_kv_blocks_used", "KV cache blocks in use", st->kv_blocks_used);
    gauge(o, "fp8moe_kv_blocks_total", "KV cache blocks in the pool", st->kv_blocks_total);
    gauge_real(o, "fp8moe_kv_cache_usage_ratio", "KV cache blocks in use over the pool's blocks (0 to 1)",
               st->kv_blocks_total > 0 ? (double)st->kv_blocks_used / st->kv_blocks_total : 0.0);
    gauge(o, "fp8moe_draining", "1 after SIGTERM, while running requests finish and new ones get 503", draining);
    counter(o, "fp8moe_decode_steps_total", "decode steps run", (uint64_t)st->decode_steps);
    counter(o, "fp8moe_prefill_tokens_total", "prompt tokens prefilled (those found in the cache are not)",
            (uint64_t)st->prefill_tokens);
    counter(o, "fp8moe_decode_tokens_total", "tokens computed by decode steps", (uint64_t)st->decode_tokens);
    counter(o, "fp8moe_steps_total", "scheduler steps (forward passes) that ran rows", (uint64_t)st->steps);
    counter(o, "fp8moe_mixed_steps_total", "steps with decode rows and prompt rows together",
            (uint64_t)st->mixed_steps);
    counter(o, "fp8moe_mixed_step_prefill_tokens_total", "prompt tokens run beside decode rows",
            (uint64_t)st->mixed_prefill_tokens);
    gauge(o, "fp8moe_step_budget_latency", "1: a mixed step's prompt share is sized by step times; 0: fixed",
          st->step_latency);
    gauge(o, "fp8moe_step_prefill_tokens", "prompt tokens of the last step", (long long)st->last_prefill_rows);
    gauge(o, "fp8moe_step_prefill_limit_tokens", "prompt tokens the last step could take (its share of the budget)",
          (long long)st->last_prefill_limit);
    gauge_real(o, "fp8moe_step_decode_estimate_seconds",
               "the step budget's estimate of a decode-only step at the last step's batch (0: none yet)",
               st->est_decode_ms * 1e-3);
    gauge_real(o, "fp8moe_step_prefill_token_estimate_seconds",
               "the step budget's estimate of one prompt token's cost beside decode rows (0: none yet)",
               st->est_prefill_token_ms * 1e-3);
    gauge(o, "fp8moe_step_prompt_wait_steps",
          "the latency budget's prompt wait: steps before a waiting prompt's share covers all it needs (0: off)",
          st->prompt_wait_steps);
    gauge(o, "fp8moe_step_oldest_prompt_wait_steps",
          "steps the longest-waiting prompt had waited at the last mixed step (0: none waited)",
          st->oldest_prompt_wait_steps);
    gauge(o, "fp8moe_sequences_kept", "finished sequences whose KV cache is kept for a later prompt to reuse",
          st->kept);
    if (st->experts_host) { /* --experts-in host: the expert cache */
        gauge(o, "fp8moe_expert_cache_slots", "expert slots of the cache in device memory", st->expert_slots);
        counter(o, "fp8moe_expert_cache_hits_total", "expert reads (a layer's distinct routed experts) found resident",
                (uint64_t)st->expert_hits);
        counter(o, "fp8moe_expert_cache_misses_total", "expert reads copied from host memory",
                (uint64_t)st->expert_misses);
        counter(o, "fp8moe_expert_cache_copied_bytes_total", "bytes copied from host memory into the cache",
                st->expert_bytes_copied);
    }
    if (st->state_slots > 0) { /* hybrid models: the snapshots of the recurrent states beside the prefix cache */
        gauge(o, "fp8moe_state_snapshots", "recurrent-state snapshots usable now (hybrid models)", st->state_snapshots);
        gauge(o, "fp8moe_state_snapshot_slots", "recurrent-state snapshot slots (--state-cache-slots)",
              st->state_slots);
        counter(o, "fp8moe_state_snapshot_saves_total", "recurrent-state snapshots taken", (uint64_t)st->state_saves);
        counter(o, "fp8moe_state_snapshot_restores_total", "recurrent-state snapshots a request started from",
                (uint64_t)st->state_restores);
        counter(o, "fp8moe_state_snapshot_evictions_total", "recurrent-state snapshots given up for new ones",
                (uint64_t)st->state_evictions);
    }
    hist_write(o, "fp8moe_time_to_first_token_seconds", "from a request's arrival to its first token", &m->ttft,
               k_bounds);
    hist_write(o, "fp8moe_inter_token_latency_seconds", "between consecutive tokens of a request", &m->itl, k_bounds);
    hist_write(o, "fp8moe_e2e_request_latency_seconds", "from a request's arrival to its last token or its end",
               &m->e2e, k_bounds);
    hist_write(o, "fp8moe_decode_step_seconds", "wall time of a step of decode rows only", &m->decode_step,
               k_step_bounds);
    hist_write(o, "fp8moe_mixed_step_seconds", "wall time of a step of decode rows and prompt rows together",
               &m->mixed_step, k_step_bounds);
    hist_write(o, "fp8moe_prefill_step_seconds", "wall time of a step of prompt rows only", &m->prefill_step,
               k_step_bounds);
}
