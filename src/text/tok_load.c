/* tokenizer.json's components read into the pipeline of tok_internal.h. What `tokenizers` can express but fp8moe
 * does not implement is refused by name (FM_ERR_UNSUPPORTED), never half-used. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/json.h"
#include "text/tok_internal.h"
#include "util/status.h"

/* ---- JSON field helpers: a wrong type is FM_ERR_FORMAT naming the field ---- */
typedef struct ctx {
    fm_tokenizer *t;
    const char *label; /* the file, for messages */
    fm_error *err;
} ctx;

static fm_status bad(ctx *c, const char *where, const char *key, const char *want) {
    return fm_fail(c->err, FM_ERR_FORMAT, "%s: %s.%s must be %s", c->label, where, key, want);
}

/* A string field: *out NULL when absent or null (allowed when optional). */
static fm_status get_str(ctx *c, const cJSON *o, const char *where, const char *key, bool optional, const char **out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    *out = NULL;
    if ((!v || cJSON_IsNull(v)) && optional) return FM_OK;
    if (!cJSON_IsString(v)) return bad(c, where, key, optional ? "a string or null" : "a string");
    *out = v->valuestring;
    return FM_OK;
}

static fm_status get_bool(ctx *c, const cJSON *o, const char *where, const char *key, bool dflt, bool *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    *out = dflt;
    if (!v || cJSON_IsNull(v)) return FM_OK;
    if (!cJSON_IsBool(v)) return bad(c, where, key, "true or false");
    *out = cJSON_IsTrue(v);
    return FM_OK;
}

static fm_status get_int(ctx *c, const cJSON *o, const char *where, const char *key, int64_t lo, int64_t hi,
                         int64_t dflt, int64_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    *out = dflt;
    if (!v || cJSON_IsNull(v)) return FM_OK;
    if (!cJSON_IsNumber(v) || v->valuedouble != (double)(int64_t)v->valuedouble || v->valuedouble < (double)lo ||
        v->valuedouble > (double)hi)
        return fm_fail(c->err, FM_ERR_FORMAT, "%s: %s.%s must be an integer in [%lld, %lld]", c->label, where, key,
                       (long long)lo, (long long)hi);
    *out = (int64_t)v->valuedouble;
    return FM_OK;
}

static const char *type_of(const cJSON *o) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "type");
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static char *dup(ctx *c, const char *s) {
    char *d = strdup(s);
    if (!d) fm_fail(c->err, FM_ERR_NOMEM, "out of memory");
    return d;
}

/* A {"String": s} or {"Regex": r} pattern: *literal, *re (compiled regex) or *lit (a copy of the literal). */
static fm_status get_pattern(ctx *c, const cJSON *o, const char *where, bool compile_literal, pcre2_code **re,
                             char **lit) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(o, "pattern");
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(p, "String"), *r = cJSON_GetObjectItemCaseSensitive(p, "Regex");
    *re = NULL;
    if (lit) *lit = NULL;
    if (!cJSON_IsObject(p) || (cJSON_IsString(s) == cJSON_IsString(r)))
        return bad(c, where, "pattern", "{\"String\": ...} or {\"Regex\": ...}");
    char what[96];
    snprintf(what, sizeof what, "%s.pattern", where);
    if (cJSON_IsString(r)) return tok_regex_compile(r->valuestring, false, what, re, c->err);
    if (compile_literal) return tok_regex_compile(s->valuestring, true, what, re, c->err);
    if (!s->valuestring[0]) return bad(c, where, "pattern.String", "a non-empty string");
    return (*lit = dup(c, s->valuestring)) ? FM_OK : FM_ERR_NOMEM;
}

/* One character as a string ("▁"); *cp its code point. */
static fm_status get_char(ctx *c, const cJSON *o, const char *where, const char *key, char out[8], uint32_t *cp) {
    const char *s = NULL;
    fm_status st = get_str(c, o, where, key, false, &s);
    if (st) return st;
    const size_t n = strlen(s);
    const int len = n ? tok_utf8_len((const uint8_t *)s, n) : 0;
    if (!len || (size_t)len != n) return bad(c, where, key, "one character");
    memcpy(out, s, n + 1);
    if (cp) *cp = tok_utf8_decode((const uint8_t *)s, len);
    return FM_OK;
}

static fm_status prepend_scheme(ctx *c, const cJSON *o, const char *where, tok_prepend_scheme *out) {
    const char *s = NULL;
    fm_status st = get_str(c, o, where, "prepend_scheme", true, &s);
    if (st) return st;
    if (!s) { /* files before tokenizers 0.14: add_prepend_space */
        bool add = true;
        st = get_bool(c, o, where, "add_prefix_space", true, &add);
        *out = add ? PREPEND_ALWAYS : PREPEND_NEVER;
        return st;
    }
    if (!strcmp(s, "always")) *out = PREPEND_ALWAYS;
    else if (!strcmp(s, "first")) *out = PREPEND_FIRST;
    else if (!strcmp(s, "never")) *out = PREPEND_NEVER;
    else return bad(c, where, "prepend_scheme", "\"always\", \"first\" or \"never\"");
    return FM_OK;
}

static fm_status too_many(ctx *c, const char *what) {
    return fm_fail(c->err, FM_ERR_UNSUPPORTED, "%s: more than %d %s steps", c->label, TOK_MAX_STEPS, what);
}

/* ---- normalizer ---- */
static fm_status load_normalizer(ctx *c, const cJSON *o, int depth) {
    fm_tokenizer *t = c->t;
    const char *type = type_of(o);
    if (!cJSON_IsObject(o) || !type) return bad(c, "normalizer", "type", "a string (the normalizer is an object)");
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(o, "normalizers"), *e;
        if (!cJSON_IsArray(list) || depth > 4) return bad(c, "normalizer", "normalizers", "an array");
        cJSON_ArrayForEach(e, list) {
            fm_status st = load_normalizer(c, e, depth + 1);
            if (st) return st;
        }
        return FM_OK;
    }
    if (t->n_norm == TOK_MAX_STEPS) return too_many(c, "normalizer");
    tok_norm *n = &t->norm[t->n_norm];
    memset(n, 0, sizeof *n);
    fm_status st = FM_OK;
    if (!strcmp(type, "NFC")) n->kind = NORM_NFC;
    else if (!strcmp(type, "NFD")) n->kind = NORM_NFD;
    else if (!strcmp(type, "NFKC")) n->kind = NORM_NFKC;
    else if (!strcmp(type, "NFKD")) n->kind = NORM_NFKD;
    else if (!strcmp(type, "Prepend")) {
        const char *p = NULL;
        n->kind = NORM_PREPEND;
        st = get_str(c, o, "normalizer Prepend", "prepend", false, &p);
        if (!st && !(n->a = dup(c, p))) st = FM_ERR_NOMEM;
    } else if (!strcmp(type, "Replace")) {
        const char *content = NULL;
        n->kind = NORM_REPLACE;
        st = get_str(c, o, "normalizer Replace", "content", false, &content);
        if (!st && !(n->b = dup(c, content))) st = FM_ERR_NOMEM;
        if (!st) st = get_pattern(c, o, "normalizer Replace", false, &n->re, &n->a);
    } else
        return fm_fail(c->err, FM_ERR_UNSUPPORTED,
                       "%s: normalizer type '%.80s' is not supported (fp8moe implements NFC, NFD, NFKC, NFKD, Prepend, "
                       "Replace and Sequence)",
                       c->label, type);
    t->n_norm++; /* counted even on failure, so tok_free_steps frees what was set */
    return st;
}

/* ---- pre-tokenizer ---- */
/* The GPT-2 pattern of `tokenizers`' ByteLevel (use_regex). */
static const char *GPT2_PATTERN = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static fm_status load_pre(ctx *c, const cJSON *o, int depth) {
    fm_tokenizer *t = c->t;
    const char *type = type_of(o);
    if (!cJSON_IsObject(o) || !type)
        return bad(c, "pre_tokenizer", "type", "a string (the pre_tokenizer is an object)");
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(o, "pretokenizers"), *e;
        if (!cJSON_IsArray(list) || depth > 4) return bad(c, "pre_tokenizer", "pretokenizers", "an array");
        cJSON_ArrayForEach(e, list) {
            fm_status st = load_pre(c, e, depth + 1);
            if (st) return st;
        }
        return FM_OK;
    }
    if (t->byte_level)
        return fm_fail(c->err, FM_ERR_UNSUPPORTED,
                       "%s: pre_tokenizer '%.80s' after ByteLevel is not supported (ByteLevel must come last)",
                       c->label, type);
    if (t->n_pre == TOK_MAX_STEPS) return too_many(c, "pre_tokenizer");
    tok_pre *p = &t->pre[t->n_pre];
    memset(p, 0, sizeof *p);
    t->n_pre++;
    if (!strcmp(type, "Split")) {
        const char *beh = NULL;
        p->kind = PRE_SPLIT;
        fm_status st = get_pattern(c, o, "pre_tokenizer Split", true, &p->re, NULL);
        if (!st) st = get_bool(c, o, "pre_tokenizer Split", "invert", false, &p->invert);
        if (!st) st = get_str(c, o, "pre_tokenizer Split", "behavior", false, &beh);
        if (st) return st;
        static const char *names[] = {"Isolated", "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
        static const tok_split_mode modes[] = {SPLIT_ISOLATED, SPLIT_REMOVED, SPLIT_MERGED_PREV, SPLIT_MERGED_NEXT,
                                               SPLIT_CONTIGUOUS};
        for (int i = 0; i < 5; i++)
            if (!strcmp(beh, names[i])) return p->mode = modes[i], FM_OK;
        return bad(c, "pre_tokenizer Split", "behavior",
                   "Isolated, Removed, MergedWithPrevious, MergedWithNext or Contiguous");
    }
    if (!strcmp(type, "ByteLevel")) {
        bool use_regex = true;
        p->kind = PRE_BYTE_LEVEL;
        t->byte_level = true;
        fm_status st = get_bool(c, o, "pre_tokenizer ByteLevel", "add_prefix_space", true, &p->add_prefix_space);
        if (!st) st = get_bool(c, o, "pre_tokenizer ByteLevel", "use_regex", true, &use_regex);
        if (!st && use_regex) st = tok_regex_compile(GPT2_PATTERN, false, "ByteLevel regex", &p->re, c->err);
        return st;
    }
    if (!strcmp(type, "Metaspace")) {
        p->kind = PRE_METASPACE;
        fm_status st = get_char(c, o, "pre_tokenizer Metaspace", "replacement", p->repl, NULL);
        if (!st) st = prepend_scheme(c, o, "pre_tokenizer Metaspace", &p->scheme);
        if (!st) st = get_bool(c, o, "pre_tokenizer Metaspace", "split", true, &p->split);
        return st;
    }
    return fm_fail(c->err, FM_ERR_UNSUPPORTED,
                   "%s: pre_tokenizer type '%.80s' is not supported (fp8moe implements Split, ByteLevel, Metaspace and "
                   "Sequence)",
                   c->label, type);
}

/* ---- decoder ---- */
static fm_status load_decoder(ctx *c, const cJSON *o, int depth) {
    fm_tokenizer *t = c->t;
    const char *type = type_of(o);
    if (!cJSON_IsObject(o) || !type) return bad(c, "decoder", "type", "a string (the decoder is an object)");
    t->has_decoder = true;
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(o, "decoders"), *e;
        if (!cJSON_IsArray(list) || depth > 4) return bad(c, "decoder", "decoders", "an array");
        cJSON_ArrayForEach(e, list) {
            fm_status st = load_decoder(c, e, depth + 1);
            if (st) return st;
        }
        return FM_OK;
    }
    if (t->n_dec == TOK_MAX_STEPS) return too_many(c, "decoder");
    tok_dec *d = &t->dec[t->n_dec];
    memset(d, 0, sizeof *d);
    t->n_dec++;
    fm_status st = FM_OK;
    int64_t v = 0;
    if (!strcmp(type, "ByteLevel")) d->kind = DEC_BYTE_LEVEL;
    else if (!strcmp(type, "ByteFallback")) d->kind = DEC_BYTE_FALLBACK;
    else if (!strcmp(type, "Fuse")) d->kind = DEC_FUSE;
    else if (!strcmp(type, "Replace")) {
        const char *content = NULL;
        d->kind = DEC_REPLACE;
        st = get_str(c, o, "decoder Replace", "content", false, &content);
        if (!st && !(d->b = dup(c, content))) st = FM_ERR_NOMEM;
        if (!st) st = get_pattern(c, o, "decoder Replace", false, &d->re, &d->a);
        if (!st && d->re)
            st = fm_fail(c->err, FM_ERR_UNSUPPORTED, "%s: decoder Replace with a Regex pattern is not supported",
                         c->label);
    } else if (!strcmp(type, "Strip")) {
        d->kind = DEC_STRIP;
        st = get_char(c, o, "decoder Strip", "content", d->repl, &d->strip_cp);
        if (!st) st = get_int(c, o, "decoder Strip", "start", 0, 1 << 20, 0, &v), d->strip_start = (int32_t)v;
        if (!st) st = get_int(c, o, "decoder Strip", "stop", 0, 1 << 20, 0, &v), d->strip_stop = (int32_t)v;
    } else if (!strcmp(type, "Metaspace")) {
        d->kind = DEC_METASPACE;
        st = get_char(c, o, "decoder Metaspace", "replacement", d->repl, NULL);
        if (!st) st = prepend_scheme(c, o, "decoder Metaspace", &d->scheme);
    } else
        st = fm_fail(c->err, FM_ERR_UNSUPPORTED,
                     "%s: decoder type '%.80s' is not supported (fp8moe implements ByteLevel, ByteFallback, Fuse, "
                     "Replace, Strip, Metaspace and Sequence)",
                     c->label, type);
    return st;
}

/* ---- post-processor: the special ids add_special puts before and after the sequence ---- */
static fm_status append_ids(ctx *c, int32_t **dst, int32_t *n, const int32_t *src, int32_t k, bool front) {
    int32_t *p = realloc(*dst, (size_t)(*n + k + 1) * sizeof *p);
    if (!p) return fm_fail(c->err, FM_ERR_NOMEM, "out of memory");
    *dst = p;
    if (k == 0) return FM_OK;
    if (front) {
        memmove(p + k, p, (size_t)*n * sizeof *p);
        memcpy(p, src, (size_t)k * sizeof *p);
    } else memcpy(p + *n, src, (size_t)k * sizeof *p);
    *n += k;
    return FM_OK;
}

static fm_status load_template(ctx *c, const cJSON *o) {
    const char *where = "post_processor TemplateProcessing";
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(o, "single"),
                *specials = cJSON_GetObjectItemCaseSensitive(o, "special_tokens"), *piece;
    if (!cJSON_IsArray(single)) return bad(c, where, "single", "an array");
    if (specials && !cJSON_IsObject(specials)) return bad(c, where, "special_tokens", "an object");
    int32_t *bos = NULL, *eos = NULL, nb = 0, ne = 0;
    bool seen_seq = false;
    fm_status st = FM_OK;
    cJSON_ArrayForEach(piece, single) {
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(piece, "SpecialToken");
        const cJSON *sq = cJSON_GetObjectItemCaseSensitive(piece, "Sequence");
        if (sq) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(sq, "id");
            if (!cJSON_IsString(id) || strcmp(id->valuestring, "A") != 0)
                st = bad(c, where, "single", "pieces of Sequence A and SpecialToken");
            seen_seq = true;
        } else if (sp) {
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(sp, "id");
            const cJSON *tok =
                cJSON_IsString(name) ? cJSON_GetObjectItemCaseSensitive(specials, name->valuestring) : NULL;
            const cJSON *ids = cJSON_GetObjectItemCaseSensitive(tok, "ids"), *e;
            if (!cJSON_IsArray(ids)) {
                st = fm_fail(c->err, FM_ERR_FORMAT, "%s: %s: special token '%.80s' has no ids in special_tokens",
                             c->label, where, cJSON_IsString(name) ? name->valuestring : "?");
                break;
            }
            cJSON_ArrayForEach(e, ids) {
                if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble >= c->t->n_ids ||
                    e->valuedouble != (double)(int32_t)e->valuedouble) {
                    st =
                        fm_fail(c->err, FM_ERR_FORMAT, "%s: %s: special token ids must be ids of the vocabulary (< %d)",
                                c->label, where, c->t->n_ids);
                    break;
                }
                const int32_t id = (int32_t)e->valuedouble;
                st = seen_seq ? append_ids(c, &eos, &ne, &id, 1, false) : append_ids(c, &bos, &nb, &id, 1, false);
                if (st) break;
            }
        } else st = bad(c, where, "single", "pieces of Sequence A and SpecialToken");
        if (st) break;
    }
    if (!st && !seen_seq) st = bad(c, where, "single", "a template with the sequence $A");
    /* a processor wraps what the ones before it made */
    if (!st) st = append_ids(c, &c->t->bos_ids, &c->t->n_bos, bos, nb, true);
    if (!st) st = append_ids(c, &c->t->eos_ids, &c->t->n_eos, eos, ne, false);
    free(bos), free(eos);
    return st;
}

static fm_status load_post(ctx *c, const cJSON *o, int depth) {
    const char *type = type_of(o);
    if (!cJSON_IsObject(o) || !type)
        return bad(c, "post_processor", "type", "a string (the post_processor is an object)");
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(o, "processors"), *e;
        if (!cJSON_IsArray(list) || depth > 4) return bad(c, "post_processor", "processors", "an array");
        cJSON_ArrayForEach(e, list) {
            fm_status st = load_post(c, e, depth + 1);
            if (st) return st;
        }
        return FM_OK;
    }
    if (!strcmp(type, "ByteLevel")) return FM_OK; /* it only trims offsets, which fp8moe does not return */
    if (!strcmp(type, "TemplateProcessing")) return load_template(c, o);
    return fm_fail(c->err, FM_ERR_UNSUPPORTED,
                   "%s: post_processor type '%.80s' is not supported (fp8moe implements TemplateProcessing, ByteLevel "
                   "and Sequence)",
                   c->label, type);
}

/* ---- the model: BPE vocabulary and merges, and the added tokens ---- */
static fm_status check_model_options(ctx *c, const cJSON *m) {
    const char *type = type_of(m);
    if (!cJSON_IsObject(m)) return fm_fail(c->err, FM_ERR_FORMAT, "%s: 'model' must be an object", c->label);
    if (!type || strcmp(type, "BPE") != 0)
        return fm_fail(c->err, FM_ERR_UNSUPPORTED, "%s: model type '%.80s' is not supported (fp8moe implements BPE)",
                       c->label, type ? type : "(none)");
    const cJSON *drop = cJSON_GetObjectItemCaseSensitive(m, "dropout");
    if (drop && !cJSON_IsNull(drop) && !(cJSON_IsNumber(drop) && drop->valuedouble == 0))
        return fm_fail(c->err, FM_ERR_UNSUPPORTED, "%s: model.dropout (BPE dropout) is not supported", c->label);
    static const char *affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        const char *s = NULL;
        fm_status st = get_str(c, m, "model", affixes[i], true, &s);
        if (st) return st;
        if (s && s[0])
            return fm_fail(c->err, FM_ERR_UNSUPPORTED, "%s: model.%s ('%.40s') is not supported", c->label, affixes[i],
                           s);
    }
    fm_status st = get_bool(c, m, "model", "byte_fallback", false, &c->t->byte_fallback);
    if (!st) st = get_bool(c, m, "model", "fuse_unk", false, &c->t->fuse_unk);
    if (!st) st = get_bool(c, m, "model", "ignore_merges", false, &c->t->ignore_merges);
    return st;
}

/* The root's fields tokenizer.json must have, and those fp8moe refuses when set (truncation, padding). */
static fm_status check_root(ctx *c, const cJSON *root, const cJSON *model, const cJSON *vocab, const cJSON *merges,
                            const cJSON *added) {
    static const char *unused[] = {"truncation", "padding"};
    fm_status st = FM_OK;
    for (int i = 0; !st && i < 2; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, unused[i]);
        if (v && !cJSON_IsNull(v))
            st = fm_fail(c->err, FM_ERR_UNSUPPORTED, "%s: '%s' is set; fp8moe supports only null there", c->label,
                         unused[i]);
    }
    if (!st && !model) st = fm_fail(c->err, FM_ERR_FORMAT, "%s: no 'model' object", c->label);
    if (!st) st = check_model_options(c, model);
    if (!st && !cJSON_IsObject(vocab)) st = bad(c, "model", "vocab", "an object (token -> id)");
    if (!st && merges && !cJSON_IsArray(merges) && !cJSON_IsNull(merges)) st = bad(c, "model", "merges", "an array");
    if (!st && added && !cJSON_IsArray(added) && !cJSON_IsNull(added)) st = bad(c, "", "added_tokens", "an array");
    return st;
}

/* Checks every id of the vocabulary and the added tokens and sums what the tables need: the arena's bytes (each
 * token's string and its NUL) and the largest id. Ids stay below a bound proportional to the entries, so a huge id
 * is an error, not a huge allocation. */
static fm_status size_tables(ctx *c, const cJSON *vocab, const cJSON *added, size_t *bytes, int64_t *max_id) {
    const char *label = c->label;
    const int64_t n_vocab = cJSON_GetArraySize(vocab), n_added = added ? cJSON_GetArraySize(added) : 0;
    const int64_t id_limit = 2 * (n_vocab + n_added) + 1024;
    const cJSON *e;
    *bytes = 0, *max_id = -1;
    cJSON_ArrayForEach(e, vocab) {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble >= (double)id_limit ||
            e->valuedouble != (double)(int64_t)e->valuedouble)
            return fm_fail(c->err, FM_ERR_FORMAT, "%s: model.vocab['%.80s'] must be an integer id in [0, %lld)", label,
                           e->string, (long long)id_limit);
        if (!e->string[0]) return fm_fail(c->err, FM_ERR_FORMAT, "%s: model.vocab has an empty token", label);
        *bytes += strlen(e->string) + 1;
        if ((int64_t)e->valuedouble > *max_id) *max_id = (int64_t)e->valuedouble;
    }
    cJSON_ArrayForEach(e, added) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id"),
                    *content = cJSON_GetObjectItemCaseSensitive(e, "content");
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble >= (double)id_limit ||
            id->valuedouble != (double)(int64_t)id->valuedouble)
            return fm_fail(c->err, FM_ERR_FORMAT, "%s: added_tokens: every entry needs an integer 'id' in [0, %lld)",
                           label, (long long)id_limit);
        if (!cJSON_IsString(content) || !content->valuestring[0])
            return fm_fail(c->err, FM_ERR_FORMAT,
                           "%s: added_tokens: the token of id %lld needs a non-empty 'content' string", label,
                           (long long)id->valuedouble);
        *bytes += strlen(content->valuestring) + 1;
        if ((int64_t)id->valuedouble > *max_id) *max_id = (int64_t)id->valuedouble;
    }
    if (*max_id < 0) return fm_fail(c->err, FM_ERR_FORMAT, "%s: the vocabulary is empty", label);
    return FM_OK;
}

/* The tables by id (string, length, special, added), the arena and the vocabulary's map. */
static fm_status alloc_tables(ctx *c, int64_t n_vocab, int64_t n_added, int64_t max_id, size_t bytes) {
    fm_tokenizer *t = c->t;
    t->n_ids = (int32_t)(max_id + 1);
    t->id_str = calloc((size_t)t->n_ids, sizeof *t->id_str);
    t->id_len = calloc((size_t)t->n_ids, sizeof *t->id_len);
    t->id_special = calloc((size_t)t->n_ids, sizeof *t->id_special);
    t->id_added = calloc((size_t)t->n_ids, sizeof *t->id_added);
    t->arena = malloc(bytes + 1);
    t->added = calloc((size_t)n_added + 1, sizeof *t->added);
    if (!t->id_str || !t->id_len || !t->id_special || !t->id_added || !t->arena || !t->added ||
        !tok_strmap_init(&t->vocab, (uint32_t)n_vocab))
        return fm_fail(c->err, FM_ERR_NOMEM, "%s: out of memory for %lld tokens", c->label, (long long)n_vocab);
    return FM_OK;
}

/* model.vocab into the arena (from *used on), the tables by id and the map; an id given twice is an error. */
static fm_status load_vocab(ctx *c, const cJSON *vocab, size_t *used) {
    fm_tokenizer *t = c->t;
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab) {
        const size_t n = strlen(e->string);
        char *s = memcpy(t->arena + *used, e->string, n + 1);
        *used += n + 1;
        const int32_t id = (int32_t)e->valuedouble;
        if (t->id_str[id])
            return fm_fail(c->err, FM_ERR_FORMAT, "%s: model.vocab gives id %d to both '%.60s' and '%.60s'", c->label,
                           id, t->id_str[id], s);
        t->id_str[id] = s, t->id_len[id] = (uint32_t)n;
        if (!tok_strmap_put(&t->vocab, s, (uint32_t)n, id)) return fm_fail(c->err, FM_ERR_NOMEM, "out of memory");
    }
    return FM_OK;
}

/* The added tokens (after the normalizer: a normalized one is matched by its normalized form): their content is the
 * string of their id, before the model's. */
static fm_status load_added(ctx *c, const cJSON *added, size_t *used) {
    fm_tokenizer *t = c->t;
    const cJSON *e;
    cJSON_ArrayForEach(e, added) {
        tok_added *a = &t->added[t->n_added];
        const char *content = cJSON_GetObjectItemCaseSensitive(e, "content")->valuestring;
        const size_t n = strlen(content);
        a->content = memcpy(t->arena + *used, content, n + 1);
        *used += n + 1;
        a->id = (int32_t)cJSON_GetObjectItemCaseSensitive(e, "id")->valuedouble;
        fm_status st = get_bool(c, e, "added_tokens[]", "special", false, &a->special);
        if (!st) st = get_bool(c, e, "added_tokens[]", "lstrip", false, &a->lstrip);
        if (!st) st = get_bool(c, e, "added_tokens[]", "rstrip", false, &a->rstrip);
        if (!st) st = get_bool(c, e, "added_tokens[]", "single_word", false, &a->single_word);
        if (!st) st = get_bool(c, e, "added_tokens[]", "normalized", !a->special, &a->normalized);
        if (st) return st;
        t->n_added++;
        t->id_str[a->id] = a->content, t->id_len[a->id] = (uint32_t)n;
        t->id_special[a->id] = a->special, t->id_added[a->id] = true;
        a->match = a->content, a->match_len = (uint32_t)n;
        if (a->normalized && t->n_norm) { /* matched in normalized text: its normalized form */
            tok_buf nb = {0};
            st = tok_normalize(t, a->content, n, &nb, c->err);
            a->match = nb.p, a->match_len = (uint32_t)nb.n;
            if (!st && !nb.n)
                st = fm_fail(c->err, FM_ERR_FORMAT, "%s: added token '%.80s' normalizes to nothing", c->label,
                             a->content);
            if (st) return st;
        }
        t->any_normalized_added |= a->normalized;
    }
    return FM_OK;
}

/* The added tokens by first byte, longest first: the leftmost-longest search looks only at those. */
static fm_status index_added(ctx *c) {
    fm_tokenizer *t = c->t;
    t->added_by_byte = malloc(((size_t)t->n_added + 1) * sizeof *t->added_by_byte);
    if (!t->added_by_byte) return fm_fail(c->err, FM_ERR_NOMEM, "out of memory");
    int32_t k = 0;
    for (int b = 0; b < 256; b++) {
        t->first_added[b][0] = k;
        for (int i = 0; i < t->n_added; i++)
            if ((uint8_t)t->added[i].match[0] == b) t->added_by_byte[k++] = i;
        t->first_added[b][1] = k;
        for (int32_t i = t->first_added[b][0] + 1; i < k; i++) /* insertion sort by length, descending */
            for (int32_t j = i; j > t->first_added[b][0] &&
                                t->added[t->added_by_byte[j]].match_len > t->added[t->added_by_byte[j - 1]].match_len;
                 j--) {
                const int32_t tmp = t->added_by_byte[j];
                t->added_by_byte[j] = t->added_by_byte[j - 1], t->added_by_byte[j - 1] = tmp;
            }
    }
    return FM_OK;
}

/* model.merges: "a b" strings or [a, b] pairs; rank = position; both parts and the merged token in the vocabulary. */
static fm_status load_merges(ctx *c, const cJSON *merges) {
    fm_tokenizer *t = c->t;
    const int64_t n_merges = cJSON_IsArray(merges) ? cJSON_GetArraySize(merges) : 0;
    if (!tok_pairmap_init(&t->merges, (uint32_t)n_merges)) return fm_fail(c->err, FM_ERR_NOMEM, "out of memory");
    int64_t rank = 0;
    const cJSON *merge_list = cJSON_IsArray(merges) ? merges : NULL, *e;
    cJSON_ArrayForEach(e, merge_list) {
        const char *a = NULL, *b = NULL;
        size_t na = 0, nb = 0;
        if (cJSON_IsString(e)) {
            const char *sp = strchr(e->valuestring, ' ');
            if (sp && !strchr(sp + 1, ' ')) a = e->valuestring, na = (size_t)(sp - a), b = sp + 1, nb = strlen(b);
        } else if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2 && cJSON_IsString(e->child) &&
                   cJSON_IsString(e->child->next))
            a = e->child->valuestring, na = strlen(a), b = e->child->next->valuestring, nb = strlen(b);
        if (!a)
            return fm_fail(c->err, FM_ERR_FORMAT,
                           "%s: model.merges[%lld] must be \"left right\" or [\"left\", \"right\"]", c->label,
                           (long long)rank);
        const int32_t ia = tok_strmap_get(&t->vocab, a, (uint32_t)na), ib = tok_strmap_get(&t->vocab, b, (uint32_t)nb);
        char joined[1024];
        int32_t ij = -1;
        if (na + nb < sizeof joined) {
            memcpy(joined, a, na), memcpy(joined + na, b, nb);
            ij = tok_strmap_get(&t->vocab, joined, (uint32_t)(na + nb));
        }
        if (ia < 0 || ib < 0 || ij < 0)
            return fm_fail(c->err, FM_ERR_FORMAT, "%s: model.merges[%lld] ('%.*s' + '%.*s'): %s is not in model.vocab",
                           c->label, (long long)rank, (int)(na < 60 ? na : 60), a, (int)(nb < 60 ? nb : 60), b,
                           ia < 0   ? "the left part"
                           : ib < 0 ? "the right part"
                                    : "the merged token");
        if (!tok_pairmap_put(&t->merges, ia, ib, (int32_t)rank, ij))
            return fm_fail(c->err, FM_ERR_NOMEM, "out of memory");
        rank++;
    }
    return FM_OK;
}

/* The unk token, the byte tokens (<0xAB>) and the byte-level alphabet's ids. */
static fm_status load_unk_and_bytes(ctx *c, const cJSON *model) {
    fm_tokenizer *t = c->t;
    const char *unk = NULL;
    fm_status st = get_str(c, model, "model", "unk_token", true, &unk);
    if (!st && unk && (t->unk_id = tok_strmap_get(&t->vocab, unk, (uint32_t)strlen(unk))) < 0)
        st = fm_fail(c->err, FM_ERR_FORMAT, "%s: model.unk_token '%.80s' is not in model.vocab", c->label, unk);
    for (int b = 0; !st && b < 256; b++) {
        char name[8], cp[4];
        snprintf(name, sizeof name, "<0x%02X>", b);
        t->byte_ids[b] = tok_strmap_get(&t->vocab, name, 6);
        t->byte_level_ids[b] = tok_strmap_get(&t->vocab, cp, (uint32_t)tok_utf8_encode(tok_byte_to_cp((uint8_t)b), cp));
    }
    return st;
}

/* A root object field's component (normalizer, pre_tokenizer, decoder, post_processor) when present and not null. */
static const cJSON *component(const cJSON *root, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

fm_status tok_load_json(fm_tokenizer *t, const char *text, size_t len, const char *label, fm_error *err) {
    ctx c = {t, label, err};
    cJSON *root = NULL;
    fm_status st = fm_json_parse_object(text, len, label, "tokenizer.json", &root, err);
    if (st) return st;
    t->unk_id = -1;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens"), *v;
    st = check_root(&c, root, model, vocab, merges, added);
    size_t bytes = 0, used = 0;
    int64_t max_id = -1;
    if (!st) st = size_tables(&c, vocab, added, &bytes, &max_id);
    if (!st) st = alloc_tables(&c, cJSON_GetArraySize(vocab), added ? cJSON_GetArraySize(added) : 0, max_id, bytes);
    if (!st) st = load_vocab(&c, vocab, &used);
    /* normalizer, pre-tokenizer, decoder (the added tokens need the normalizer) */
    if (!st && (v = component(root, "normalizer"))) st = load_normalizer(&c, v, 0);
    if (!st && (v = component(root, "pre_tokenizer"))) st = load_pre(&c, v, 0);
    if (!st && (v = component(root, "decoder"))) st = load_decoder(&c, v, 0);
    if (!st) st = load_added(&c, added, &used);
    if (!st) st = index_added(&c);
    if (!st) st = load_merges(&c, merges);
    if (!st) st = load_unk_and_bytes(&c, model);
    if (!st && (v = component(root, "post_processor"))) {
        t->has_post = true;
        st = load_post(&c, v, 0);
    }
    cJSON_Delete(root);
    return st;
}

void tok_free_steps(fm_tokenizer *t) {
    for (int i = 0; i < t->n_norm; i++) {
        free(t->norm[i].a), free(t->norm[i].b);
        if (t->norm[i].re) pcre2_code_free(t->norm[i].re);
    }
    for (int i = 0; i < t->n_pre; i++)
        if (t->pre[i].re) pcre2_code_free(t->pre[i].re);
    for (int i = 0; i < t->n_dec; i++) {
        free(t->dec[i].a), free(t->dec[i].b);
        if (t->dec[i].re) pcre2_code_free(t->dec[i].re);
    }
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].match != t->added[i].content) free(t->added[i].match);
}
