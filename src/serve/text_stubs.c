/* TEMPORARY (branch serve only): stand-ins for the tokenizer and the chat templates until branches tok and tmpl are
 * merged; delete this file at that merge. Every call says the part is missing. */
#include <stdlib.h>

#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "util/status.h"

fm_status fm_tokenizer_load(const char *dir, fm_tokenizer **out, fm_error *err) {
    *out = NULL;
    return fm_fail(err, FM_ERR_UNSUPPORTED, "%s/tokenizer.json: the tokenizer is not built in", dir);
}
void fm_tokenizer_free(fm_tokenizer *t) { (void)t; }
fm_status fm_tokenizer_encode(const fm_tokenizer *t, const char *text, size_t len, bool add_special, bool parse_special,
                              int32_t **ids, int64_t *n, fm_error *err) {
    (void)t, (void)text, (void)len, (void)add_special, (void)parse_special, (void)ids, (void)n;
    return fm_fail(err, FM_ERR_UNSUPPORTED, "no tokenizer");
}
fm_status fm_tokenizer_decode(const fm_tokenizer *t, const int32_t *ids, int64_t n, bool skip_special, char **text,
                              size_t *len, fm_error *err) {
    (void)t, (void)ids, (void)n, (void)skip_special, (void)text, (void)len;
    return fm_fail(err, FM_ERR_UNSUPPORTED, "no tokenizer");
}
int32_t fm_tokenizer_token_id(const fm_tokenizer *t, const char *token) {
    (void)t, (void)token;
    return -1;
}
fm_status fm_detok_create(const fm_tokenizer *t, bool skip_special, fm_detok **out, fm_error *err) {
    (void)t, (void)skip_special, (void)out;
    return fm_fail(err, FM_ERR_UNSUPPORTED, "no tokenizer");
}
void fm_detok_free(fm_detok *d) { (void)d; }
const char *fm_detok_push(fm_detok *d, int32_t id) {
    (void)d, (void)id;
    return "";
}
const char *fm_detok_flush(fm_detok *d) {
    (void)d;
    return "";
}
fm_status fm_chat_template_load(const char *dir, const char *name, fm_chat_template **out, fm_error *err) {
    (void)name;
    *out = NULL;
    return fm_fail(err, FM_ERR_UNSUPPORTED, "%s: chat templates are not built in", dir);
}
void fm_chat_template_free(fm_chat_template *t) { (void)t; }
fm_status fm_chat_render(const fm_chat_template *t, const fm_chat_msg *msgs, int32_t n, const fm_chat_opts *opts,
                         char **text, fm_error *err) {
    (void)t, (void)msgs, (void)n, (void)opts, (void)text;
    return fm_fail(err, FM_ERR_UNSUPPORTED, "no chat template");
}
const char *const *fm_chat_template_stop_tokens(const fm_chat_template *t) {
    (void)t;
    return NULL;
}
