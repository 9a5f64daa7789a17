/* response_format and forced tool calls as a constraint on the sampled tokens (chat.h). */
#include <stdlib.h>
#include <string.h>

#include "serve/chat.h"
#include "serve/serve_internal.h"

int chat_constraints(srv *s, const cJSON *root, job *j, oa_error *e) {
    (void)s;
    const cJSON *rf = cJSON_GetObjectItemCaseSensitive(root, "response_format");
    if (rf && !cJSON_IsNull(rf)) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(rf, "type");
        if (!cJSON_IsObject(rf) || !cJSON_IsString(type))
            return oa_fail(e, 400, "invalid_request_error", NULL, "response_format",
                           "'response_format' must be {\"type\": \"text\" | \"json_object\" | \"json_schema\"}");
        if (strcmp(type->valuestring, "text"))
            return oa_fail(e, 400, "invalid_request_error", NULL, "response_format",
                           "'response_format' type '%s' is not supported", type->valuestring);
    }
    if (j->chatq->choice >= TOOL_CHOICE_REQUIRED)
        return oa_fail(e, 400, "invalid_request_error", NULL, "tool_choice",
                       "'tool_choice' required or a named function is not supported");
    return 0;
}

void chat_constraint_free(struct chat_req *q) { (void)q; }
