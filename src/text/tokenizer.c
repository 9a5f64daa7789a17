/* fm_tokenizer: loading a model directory's tokenizer.json (and tokenizer_config.json) and the lookups of
 * tokenizer.h. The pipeline lives in the other files of src/text/ (see tok_internal.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/json.h"
#include "text/tok_internal.h"
#include "util/file.h"
#include "util/status.h"

#define TOKENIZER_MAX_BYTES ((size_t)1 << 30)

/* tokenizer_config.json's "bos_token": a string or {"content": ...}. */
static const char *token_name(const cJSON *v) {
    if (cJSON_IsString(v)) return v->valuestring;
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(v, "content");
    return cJSON_IsString(c) ? c->valuestring : NULL;
}

/* Without a post_processor in tokenizer.json, transformers adds bos/eos when tokenizer_config.json says
 * add_bos_token / add_eos_token; the same here. With one, tokenizer.json is what counts (as in `tokenizers`). */
static fm_status load_config(fm_tokenizer *t, const char *dir, bool has_post, fm_error *err) {
    fm_path_buf pb;
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    int fd = -1;
    bool missing = false;
    fm_status st = fm_open_regular(path, "tokenizer_config.json", &fd, &missing, err);
    if (st || missing) return st;
    close(fd);
    char *text = NULL;
    size_t len = 0;
    st = fm_read_regular(path, "tokenizer_config.json", TOKENIZER_MAX_BYTES, &text, &len, err);
    cJSON *root = NULL;
    if (!st) st = fm_json_parse_object(text, len, fm_path_show(&pb, path), "tokenizer_config.json", &root, err);
    free(text);
    if (st || has_post) {
        cJSON_Delete(root);
        return st;
    }
    static const char *flags[] = {"add_bos_token", "add_eos_token"}, *names[] = {"bos_token", "eos_token"};
    for (int i = 0; !st && i < 2; i++) {
        if (!cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, flags[i]))) continue;
        const char *name = token_name(cJSON_GetObjectItemCaseSensitive(root, names[i]));
        const int32_t id = name ? fm_tokenizer_token_id(t, name) : -1;
        if (id < 0) {
            st = fm_fail(err, FM_ERR_FORMAT, "%s: %s is true but %s ('%.80s') is not a token", fm_path_show(&pb, path),
                         flags[i], names[i], name ? name : "missing");
            break;
        }
        int32_t **dst = i == 0 ? &t->bos_ids : &t->eos_ids;
        int32_t *n = i == 0 ? &t->n_bos : &t->n_eos;
        free(*dst);
        if (!(*dst = malloc(sizeof **dst))) st = fm_fail(err, FM_ERR_NOMEM, "out of memory");
        else (*dst)[0] = id, *n = 1;
    }
    cJSON_Delete(root);
    return st;
}

fm_status fm_tokenizer_load(const char *dir, fm_tokenizer **out, fm_error *err) {
    *out = NULL;
    if (!dir || !dir[0]) return fm_fail(err, FM_ERR_USAGE, "no model directory given for the tokenizer");
    fm_path_buf pb;
    char path[4096];
    if (snprintf(path, sizeof path, "%s/tokenizer.json", dir) >= (int)sizeof path)
        return fm_fail(err, FM_ERR_USAGE, "%s: path too long", fm_path_show(&pb, dir));
    int fd = -1;
    bool missing = false;
    fm_status st = fm_open_regular(path, "tokenizer.json", &fd, &missing, err);
    if (st) return st;
    if (missing)
        return fm_fail(err, FM_ERR_IO,
                       "%s: no tokenizer.json (fp8moe reads the Hugging Face tokenizers format; copy it from the "
                       "model's repository)",
                       fm_path_show(&pb, path));
    close(fd);
    char *text = NULL;
    size_t len = 0;
    st = fm_read_regular(path, "tokenizer.json", TOKENIZER_MAX_BYTES, &text, &len, err);
    if (st) return st;
    fm_tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        free(text);
        return fm_fail(err, FM_ERR_NOMEM, "out of memory");
    }
    char label[FM_PATH_SHOWN + 8];
    snprintf(label, sizeof label, "%s", fm_path_show(&pb, path));
    st = tok_load_json(t, text, len, label, err);
    free(text);
    if (!st) st = load_config(t, dir, t->n_bos + t->n_eos > 0 || t->has_post, err);
    if (st) {
        fm_tokenizer_free(t);
        return st;
    }
    *out = t;
    return FM_OK;
}

void fm_tokenizer_free(fm_tokenizer *t) {
    if (!t) return;
    tok_free_steps(t);
    tok_strmap_free(&t->vocab);
    tok_pairmap_free(&t->merges);
    free(t->id_str), free(t->id_len), free(t->id_special), free(t->id_added), free(t->arena);
    free(t->added), free(t->added_by_byte), free(t->bos_ids), free(t->eos_ids);
    free(t);
}

int32_t fm_tokenizer_vocab_size(const fm_tokenizer *t) { return t ? t->n_ids : 0; }

int32_t fm_tokenizer_token_id(const fm_tokenizer *t, const char *token) {
    if (!t || !token) return -1;
    for (int i = 0; i < t->n_added; i++) /* added tokens first, as `tokenizers`' token_to_id */
        if (!strcmp(t->added[i].content, token)) return t->added[i].id;
    return tok_strmap_get(&t->vocab, token, (uint32_t)strlen(token));
}

bool fm_tokenizer_is_special(const fm_tokenizer *t, int32_t id) {
    return t && id >= 0 && id < t->n_ids && t->id_special[id];
}
