/* Stop conditions (stop.h). A stop sequence is matched against the tail of the generated ids only: one that
 * would begin in the prompt does not count, as in vLLM. */
#include <stdbool.h>

#include "engine/stop.h"

const char *fm_stop_reason_name(fm_stop_reason r) {
    switch (r) {
    case FM_STOP_EOS: return "eos";
    case FM_STOP_SEQUENCE: return "stop";
    case FM_STOP_LENGTH: return "length";
    default: return "none";
    }
}

static bool ends_with(const int32_t *gen, int64_t n, const int32_t *seq, int32_t len) {
    if (len <= 0 || len > n) return false;
    for (int32_t i = 0; i < len; i++)
        if (gen[n - len + i] != seq[i]) return false;
    return true;
}

fm_stop_reason fm_stop_check(const fm_stop *st, const int32_t *gen, int64_t n, int64_t *keep) {
    *keep = n;
    if (n <= 0) return FM_STOP_NONE;
    for (int32_t i = 0; i < st->n_eos; i++)
        if (gen[n - 1] == st->eos[i]) {
            *keep = n - 1;
            return FM_STOP_EOS;
        }
    for (int32_t i = 0; i < st->n_seqs; i++)
        if (ends_with(gen, n, st->seqs[i], st->seq_lens[i])) {
            *keep = n - st->seq_lens[i];
            return FM_STOP_SEQUENCE;
        }
    return st->max_tokens > 0 && n >= st->max_tokens ? FM_STOP_LENGTH : FM_STOP_NONE;
}
