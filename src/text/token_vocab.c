/* The vocabulary of constrained decoding (token_matcher.h, token_vocab_internal.h): every id's bytes, a prefix trie
 * of them, a second trie of the ids that are not plain string characters, and the plain ones as masks by their
 * character count. */
#include <stdlib.h>
#include <string.h>

#include "text/json_lexeme.h"
#include "text/tok_internal.h"
#include "text/token_vocab_internal.h"
#include "util/status.h"

/* An id with its bytes, for sorting by bytes (qsort has no context argument). */
typedef struct tok_ref {
    const uint8_t *b;
    uint32_t len;
    int32_t id;
} tok_ref;

static int by_bytes(const void *pa, const void *pb) {
    const tok_ref *x = pa, *y = pb;
    const int c = memcmp(x->b, y->b, x->len < y->len ? x->len : y->len);
    if (c) return c;
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* ids[0..n) in place, ordered by their bytes; false when out of memory. */
static bool sort_by_bytes(const fm_token_vocab *v, int32_t *ids, int32_t n) {
    tok_ref *r = malloc(((size_t)n + 1) * sizeof *r);
    if (!r) return false;
    for (int32_t i = 0; i < n; i++)
        r[i] = (tok_ref){v->bytes + v->off[ids[i]], (uint32_t)(v->off[ids[i] + 1] - v->off[ids[i]]), ids[i]};
    qsort(r, (size_t)n, sizeof *r, by_bytes);
    for (int32_t i = 0; i < n; i++) ids[i] = r[i].id;
    free(r);
    return true;
}

/* The trie of ids[0..n) (sorted by bytes; copied): preorder, built along the sorted list with a path of nodes. */
static bool trie_build(const fm_token_vocab *v, const int32_t *sorted, int32_t n, t_trie *t) {
    size_t total = 1;
    for (int32_t i = 0; i < n; i++) total += v->off[sorted[i] + 1] - v->off[sorted[i]];
    t->nodes = malloc(total * sizeof *t->nodes);
    t->ids = malloc(((size_t)n + 1) * sizeof *t->ids);
    int32_t *last = malloc(total * sizeof *last); /* each node's last child, for appending siblings in order */
    int32_t path[1024];
    if (!t->nodes || !t->ids || !last) return free(last), false;
    t->nodes[0] = (t_node){-1, -1, 0, 0, 0};
    last[0] = -1;
    t->n_nodes = 1;
    int32_t depth = 0; /* path[0..depth] are the nodes of the previous token's bytes (path[0]: the root) */
    path[0] = 0;
    const uint8_t *prev = NULL;
    size_t prev_len = 0;
    for (int32_t i = 0; i < n; i++) {
        const int32_t id = sorted[i];
        const uint8_t *b = v->bytes + v->off[id];
        size_t len = v->off[id + 1] - v->off[id];
        if (len > 1023) len = 1023; /* longer tokens are cut: never allowed past that (vocabularies stay far below) */
        size_t lcp = 0;
        while (prev && lcp < len && lcp < prev_len && b[lcp] == prev[lcp]) lcp++;
        if ((int32_t)lcp < depth) depth = (int32_t)lcp;
        for (size_t k = (size_t)depth; k < len; k++) {
            const int32_t parent = path[k], node = t->n_nodes++;
            t->nodes[node] = (t_node){-1, -1, 0, 0, b[k]};
            last[node] = -1;
            if (last[parent] < 0) t->nodes[parent].child = node;
            else t->nodes[last[parent]].sibling = node;
            last[parent] = node;
            path[k + 1] = node;
        }
        depth = (int32_t)len;
        t_node *end = &t->nodes[path[len]];
        if (!end->n_ids) end->first_id = i;
        end->n_ids++;
        t->ids[i] = id;
        prev = b, prev_len = len;
    }
    free(last);
    return true;
}

void fm_token_vocab_free(fm_token_vocab *v) {
    if (!v) return;
    free(v->bytes), free(v->off), free(v->special), free(v->all.nodes), free(v->all.ids), free(v->impure.nodes);
    free(v->impure.ids), free(v->pure_upto);
    fm_mask_cache_free(v->cache);
    free(v);
}

fm_status fm_token_vocab_set_mask_cache(fm_token_vocab *v, int32_t capacity, fm_error *err) {
    if (capacity < 0 || capacity > 65536)
        return fm_fail(err, FM_ERR_USAGE, "a mask cache of %d entries (0..65536)", capacity);
    fm_mask_cache *c = capacity ? fm_mask_cache_create(v->words, capacity) : NULL;
    if (capacity && !c) return fm_fail(err, FM_ERR_NOMEM, "out of memory for a mask cache of %d entries", capacity);
    fm_mask_cache_free(v->cache);
    v->cache = c;
    return FM_OK;
}

void fm_token_vocab_mask_cache_stats(const fm_token_vocab *v, int64_t *hits, int64_t *misses) {
    *hits = *misses = 0;
    if (v->cache) fm_mask_cache_stats(v->cache, hits, misses);
}

int32_t fm_token_vocab_size(const fm_token_vocab *v) { return v->n_ids; }

const uint8_t *fm_token_vocab_bytes(const fm_token_vocab *v, int32_t id, uint32_t *len) {
    if (id < 0 || id >= v->n_ids) return *len = 0, NULL;
    *len = (uint32_t)(v->off[id + 1] - v->off[id]);
    return v->bytes + v->off[id];
}

fm_status fm_token_vocab_create(int32_t n_ids, const uint8_t *const *bytes, const uint32_t *lens, const bool *special,
                                fm_token_vocab **out, fm_error *err) {
    *out = NULL;
    if (n_ids < 1) return fm_fail(err, FM_ERR_USAGE, "a vocabulary of %d ids", n_ids);
    fm_token_vocab *v = calloc(1, sizeof *v);
    if (!v) return fm_fail(err, FM_ERR_NOMEM, "out of memory for the vocabulary");
    v->n_ids = n_ids, v->words = (n_ids + 31) / 32;
    size_t total = 0;
    for (int32_t i = 0; i < n_ids; i++) total += bytes[i] ? lens[i] : 0;
    v->bytes = malloc(total + 1), v->off = malloc(((size_t)n_ids + 1) * sizeof *v->off);
    v->special = calloc((size_t)n_ids, 1);
    v->pure_upto = calloc((size_t)(VOCAB_PURE_MAX + 1) * (size_t)v->words, sizeof *v->pure_upto);
    int32_t *sorted = malloc((size_t)n_ids * sizeof *sorted), *impure = malloc((size_t)n_ids * sizeof *impure);
    uint8_t *chars = calloc((size_t)n_ids, 1); /* plain-string ids: their characters (0: not plain) */
    if (!v->bytes || !v->off || !v->special || !v->pure_upto || !sorted || !impure || !chars) {
        free(sorted), free(impure), free(chars), fm_token_vocab_free(v);
        return fm_fail(err, FM_ERR_NOMEM, "out of memory for the vocabulary");
    }
    size_t o = 0;
    int32_t n_all = 0, n_impure = 0;
    for (int32_t i = 0; i < n_ids; i++) {
        v->off[i] = o;
        const uint32_t len = bytes[i] ? lens[i] : 0;
        if (len) memcpy(v->bytes + o, bytes[i], len);
        o += len;
        v->special[i] = special && special[i];
        if (!len || v->special[i]) continue;
        sorted[n_all++] = i;
        uint32_t c = 0;
        if (lex_pure_string_chars(bytes[i], len, &c) && c <= VOCAB_PURE_MAX) chars[i] = (uint8_t)c;
        else if (!lex_dead_in_strings(bytes[i], len)) impure[n_impure++] = i;
    }
    v->off[n_ids] = o;
    const bool ok = sort_by_bytes(v, sorted, n_all) && sort_by_bytes(v, impure, n_impure) &&
                    trie_build(v, sorted, n_all, &v->all) && trie_build(v, impure, n_impure, &v->impure);
    for (int32_t k = 1; k <= VOCAB_PURE_MAX; k++) { /* row k: every plain id of 1..k characters */
        uint32_t *row = v->pure_upto + (size_t)k * v->words;
        memcpy(row, row - v->words, (size_t)v->words * sizeof *row);
        for (int32_t i = 0; i < n_ids; i++)
            if (chars[i] == k) row[i >> 5] |= 1u << (i & 31);
    }
    free(sorted), free(impure), free(chars);
    if (!ok) {
        fm_token_vocab_free(v);
        return fm_fail(err, FM_ERR_NOMEM, "out of memory for the vocabulary trie");
    }
    fm_status st = fm_token_vocab_set_mask_cache(v, FM_MASK_CACHE_DEFAULT, err);
    if (st) {
        fm_token_vocab_free(v);
        return st;
    }
    *out = v;
    return FM_OK;
}

/* A token's bytes as the tokenizer's decoder would produce them, token by token. */
static size_t token_bytes(const fm_tokenizer *t, int32_t id, uint8_t *out, size_t cap) {
    const char *s = t->id_str[id];
    const size_t n = t->id_len[id];
    size_t k = 0;
    if (t->byte_level && !t->id_added[id]) { /* each code point of the GPT-2 alphabet is one byte */
        for (size_t i = 0; i < n && k < cap;) {
            const int l = tok_utf8_len((const uint8_t *)s + i, n - i);
            if (l <= 0) return 0;
            const int b = tok_cp_to_byte(tok_utf8_decode((const uint8_t *)s + i, l));
            if (b < 0) return 0;
            out[k++] = (uint8_t)b, i += (size_t)l;
        }
        return k;
    }
    if (n == 6 && !memcmp(s, "<0x", 3) && s[5] == '>') { /* a byte-fallback token */
        out[0] = (uint8_t)strtol(s + 3, NULL, 16);
        return 1;
    }
    for (size_t i = 0; i < n && k < cap; i++) { /* Metaspace: U+2581 is a space */
        if (i + 2 < n && (uint8_t)s[i] == 0xe2 && (uint8_t)s[i + 1] == 0x96 && (uint8_t)s[i + 2] == 0x81)
            out[k++] = ' ', i += 2;
        else out[k++] = (uint8_t)s[i];
    }
    return k;
}

fm_status fm_token_vocab_from_tokenizer(const fm_tokenizer *t, int32_t n_ids, fm_token_vocab **out, fm_error *err) {
    *out = NULL;
    if (n_ids <= 0) n_ids = t->n_ids;
    if (n_ids < t->n_ids)
        return fm_fail(err, FM_ERR_USAGE, "the model's vocabulary (%d) is smaller than the tokenizer's (%d)", n_ids,
                       t->n_ids);
    size_t total = 0;
    for (int32_t i = 0; i < t->n_ids; i++) total += t->id_str[i] ? t->id_len[i] : 0;
    uint8_t *buf = malloc(total + 1);
    const uint8_t **ptr = calloc((size_t)n_ids, sizeof *ptr);
    uint32_t *lens = calloc((size_t)n_ids, sizeof *lens);
    bool *special = calloc((size_t)n_ids, sizeof *special);
    if (!buf || !ptr || !lens || !special) {
        free(buf), free(ptr), free(lens), free(special);
        return fm_fail(err, FM_ERR_NOMEM, "out of memory for the vocabulary");
    }
    size_t o = 0;
    for (int32_t i = 0; i < t->n_ids; i++) {
        if (!t->id_str[i]) continue;
        special[i] = t->id_special[i];
        lens[i] = (uint32_t)token_bytes(t, i, buf + o, total - o);
        ptr[i] = buf + o;
        o += lens[i];
    }
    fm_status st = fm_token_vocab_create(n_ids, ptr, lens, special, out, err);
    free(buf), free(ptr), free(lens), free(special);
    return st;
}
