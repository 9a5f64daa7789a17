/* The streaming detokenizer, `tokenizers`' DecodeStream: the ids since the last emitted boundary are decoded
 * whole, and what they add beyond the text already emitted for the earlier ones is emitted, unless it ends in
 * U+FFFD (an incomplete character that a later byte token may still complete). Decoding a window of ids rather
 * than the single new one keeps what the decoders do at token boundaries (Strip, Metaspace's first token, byte
 * runs) the same as in a full decode, so the emitted pieces concatenate to the full decode. */
#include <stdlib.h>
#include <string.h>

#include "text/tok_internal.h"
#include "util/status.h"

struct fm_detok {
    const fm_tokenizer *t;
    bool skip_special;
    tok_ids ids;       /* the window: ids from the last boundary on */
    int64_t prefix_at; /* ids[0..prefix_at) decode to prefix, already emitted */
    char *prefix;
    size_t prefix_len;
    char *out; /* the last returned text */
};

fm_status fm_detok_create(const fm_tokenizer *t, bool skip_special, fm_detok **out, fm_error *err) {
    *out = NULL;
    if (!t) return fm_fail(err, FM_ERR_USAGE, "fm_detok_create: no tokenizer");
    fm_detok *d = calloc(1, sizeof *d);
    if (!d) return fm_fail(err, FM_ERR_NOMEM, "out of memory");
    d->t = t, d->skip_special = skip_special;
    *out = d;
    return FM_OK;
}

void fm_detok_free(fm_detok *d) {
    if (!d) return;
    free(d->ids.p), free(d->prefix), free(d->out);
    free(d);
}

static bool ends_incomplete(const char *s, size_t n) { return n >= 3 && memcmp(s + n - 3, "\xEF\xBF\xBD", 3) == 0; }

static const char *give(fm_detok *d, const char *s, size_t n) {
    free(d->out);
    d->out = malloc(n + 1);
    if (!d->out) return "";
    memcpy(d->out, s, n);
    d->out[n] = '\0';
    return d->out;
}

const char *fm_detok_push(fm_detok *d, int32_t id) {
    fm_error err;
    if (!d) return "";
    if (id < 0 || id >= d->t->n_ids || !d->t->id_str[id]) return ""; /* not a token: nothing to show */
    if (!tok_ids_push(&d->ids, id)) return "";
    char *text = NULL;
    size_t len = 0;
    if (fm_tokenizer_decode(d->t, d->ids.p, d->ids.n, d->skip_special, &text, &len, &err)) return "";
    if (len <= d->prefix_len || ends_incomplete(text, len) ||
        (d->prefix_len && memcmp(text, d->prefix, d->prefix_len) != 0)) {
        free(text);
        return "";
    }
    const char *res = give(d, text + d->prefix_len, len - d->prefix_len);
    /* the window now starts at the previous boundary: the ids after it decode to the new prefix */
    const int64_t keep = d->ids.n - d->prefix_at;
    memmove(d->ids.p, d->ids.p + d->prefix_at, (size_t)keep * sizeof *d->ids.p);
    d->ids.n = keep;
    d->prefix_at = keep;
    free(text);
    free(d->prefix);
    d->prefix = NULL, d->prefix_len = 0;
    if (fm_tokenizer_decode(d->t, d->ids.p, d->ids.n, d->skip_special, &d->prefix, &d->prefix_len, &err))
        d->prefix = NULL, d->prefix_len = 0;
    return res;
}

const char *fm_detok_flush(fm_detok *d) {
    fm_error err;
    if (!d) return "";
    char *text = NULL;
    size_t len = 0;
    const char *res = "";
    if (!fm_tokenizer_decode(d->t, d->ids.p, d->ids.n, d->skip_special, &text, &len, &err) && len > d->prefix_len &&
        (!d->prefix_len || memcmp(text, d->prefix, d->prefix_len) == 0))
        res = give(d, text + d->prefix_len, len - d->prefix_len);
    free(text);
    d->ids.n = 0, d->prefix_at = 0;
    free(d->prefix);
    d->prefix = NULL, d->prefix_len = 0;
    return res;
}
