/* TEMPORARY (branch serve only): stand-ins for the chat templates until branch tmpl is merged; delete this file at
 * that merge. Every call says the part is missing. */
#include <stdlib.h>

#include "text/chat_template.h"
#include "util/status.h"

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
