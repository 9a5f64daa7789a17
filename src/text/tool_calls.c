/* The tool-call parser (tool_calls.h).
 *
 * The answer streams through two modes. In content, text goes out as content, except a tail that may begin the
 * format's open tag (and the whitespace before it, which only separates content from a call) is held back. In a
 * call block, the block's text is gathered and re-scanned on every piece (blocks are small): a tolerant scan of
 * the call object finds the name once its string is complete and the span of the arguments as far as it has
 * arrived, so the arguments go out in fragments while the model writes them. cJSON checks each finished object. */
#include "text/tool_calls.h"

#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "text/held_text.h"
#include "util/status.h"

enum { MODE_CONTENT, MODE_CALL, MODE_AFTER_LIST };
enum { MAX_BLOCK = 1 << 20 }; /* a call block's bytes: beyond this it is content */
enum { MAX_HOLD = 64 };

typedef struct gbuf {
    char *p;
    size_t n, cap;
} gbuf;

static void g_put(gbuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) abort(); /* a model's output text */
        b->p = p, b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

/* one call object as far as scanned */
typedef struct call_scan {
    int state;      /* -1 broken, 0 incomplete, 1 complete */
    size_t end;     /* complete: the index after its closing brace */
    char *name;     /* malloc'd once its string is complete (the caller frees it) */
    size_t args_at; /* where the arguments' value starts (0: not reached) */
    size_t args_n;  /* its bytes arrived so far (all of them when args_done) */
    bool has_args, args_done;
} call_scan;

struct fm_tool_parser {
    fm_tool_format fmt;
    fm_tool_events ev;
    int mode;
    char hold[MAX_HOLD];
    size_t n_hold;
    gbuf blk;      /* the current call block's text, after its open tag */
    size_t obj_at; /* mistral: where the current object starts in blk */
    int32_t index; /* of the current call */
    bool begun;    /* its call_begin went out */
    size_t sent;   /* its argument bytes that went out */
    int32_t n_calls;
    bool after_call; /* the whitespace that follows a call only separates it from the next */
};

fm_tool_format fm_tool_format_of_template(const char *src) {
    if (!src) return FM_TOOLS_NONE;
    if (strstr(src, "<tool_call>")) return FM_TOOLS_HERMES;
    if (strstr(src, "[TOOL_CALLS]")) return FM_TOOLS_MISTRAL;
    return FM_TOOLS_NONE;
}

fm_status fm_tool_format_parse(const char *name, fm_tool_format *out, fm_error *err) {
    if (!strcmp(name, "hermes") || !strcmp(name, "qwen3")) *out = FM_TOOLS_HERMES;
    else if (!strcmp(name, "mistral")) *out = FM_TOOLS_MISTRAL;
    else if (!strcmp(name, "none")) *out = FM_TOOLS_NONE;
    else return fm_fail(err, FM_ERR_USAGE, "--tool-parser %s: expected hermes (or qwen3), mistral or none", name);
    return FM_OK;
}

const char *fm_tool_format_name(fm_tool_format f) {
    return f == FM_TOOLS_HERMES ? "hermes" : f == FM_TOOLS_MISTRAL ? "mistral" : "none";
}

const char *fm_tool_format_open_tag(fm_tool_format f) {
    return f == FM_TOOLS_HERMES ? "<tool_call>" : f == FM_TOOLS_MISTRAL ? "[TOOL_CALLS]" : NULL;
}

static const char k_hermes_close[] = "</tool_call>";

fm_tool_parser *fm_tool_parser_create(fm_tool_format f, const fm_tool_events *ev) {
    fm_tool_parser *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->fmt = f, p->ev = *ev;
    return p;
}

void fm_tool_parser_free(fm_tool_parser *p) {
    if (!p) return;
    free(p->blk.p);
    free(p);
}

int32_t fm_tool_parser_calls(const fm_tool_parser *p) { return p->n_calls; }

/* ---- a tolerant JSON scan ---- */

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static size_t skip_ws(const char *s, size_t n, size_t i) {
    while (i < n && is_ws(s[i])) i++;
    return i;
}

/* the value at s[i]: 1 complete (*end after it), 0 runs past n, -1 not JSON */
static int skip_value(const char *s, size_t n, size_t i, size_t *end) {
    if (i >= n) return 0;
    if (s[i] == '"' || s[i] == '{' || s[i] == '[') {
        int depth = 0;
        bool in_str = false, esc = false;
        for (size_t k = i; k < n; k++) {
            const char c = s[k];
            if (in_str) {
                if (esc) esc = false;
                else if (c == '\\') esc = true;
                else if (c == '"') {
                    in_str = false;
                    if (depth == 0) return *end = k + 1, 1;
                }
            } else if (c == '"') in_str = true;
            else if (c == '{' || c == '[') depth++;
            else if (c == '}' || c == ']') {
                if (--depth == 0) return *end = k + 1, 1;
                if (depth < 0) return -1;
            }
        }
        return 0;
    }
    size_t k = i;
    while (k < n && (strchr("+-.eE", s[k]) || (s[k] >= '0' && s[k] <= '9') || (s[k] >= 'a' && s[k] <= 'z'))) k++;
    if (k == i) return -1;
    if (k == n) return 0;
    *end = k;
    return 1;
}

static char *json_string(const char *s, size_t n) {
    char *t = strndup(s, n);
    cJSON *v = t ? cJSON_Parse(t) : NULL;
    free(t);
    char *out = cJSON_IsString(v) ? strdup(v->valuestring) : NULL;
    cJSON_Delete(v);
    return out;
}

/* scans the call object at s[i] (offsets in c are into s) */
static void scan_call(const char *s, size_t n, size_t i, call_scan *c) {
    c->state = 0, c->has_args = c->args_done = false, c->args_at = c->args_n = 0;
    i = skip_ws(s, n, i);
    if (i >= n) return;
    if (s[i] != '{') {
        c->state = -1;
        return;
    }
    for (i++;;) {
        i = skip_ws(s, n, i);
        if (i >= n) return;
        if (s[i] == '}') {
            c->state = 1, c->end = i + 1;
            return;
        }
        size_t kend;
        const int kr = skip_value(s, n, i, &kend);
        if (kr <= 0 || s[i] != '"') {
            c->state = kr < 0 || s[i] != '"' ? -1 : 0;
            return;
        }
        const size_t key = i + 1, key_n = kend - i - 2;
        i = skip_ws(s, n, kend);
        if (i >= n) return;
        if (s[i] != ':') {
            c->state = -1;
            return;
        }
        i = skip_ws(s, n, i + 1);
        if (i >= n) return;
        size_t vend = 0;
        const int vr = skip_value(s, n, i, &vend);
        if (vr < 0) {
            c->state = -1;
            return;
        }
        const bool is_name = key_n == 4 && !memcmp(s + key, "name", 4);
        const bool is_args =
            (key_n == 9 && !memcmp(s + key, "arguments", 9)) || (key_n == 10 && !memcmp(s + key, "parameters", 10));
        if (is_args) c->has_args = true, c->args_at = i, c->args_n = (vr ? vend : n) - i, c->args_done = vr == 1;
        if (vr == 0) return;
        if (is_name && !c->name && s[i] == '"') c->name = json_string(s + i, vend - i);
        i = skip_ws(s, n, vend);
        if (i >= n) return;
        if (s[i] == ',') i++;
        else if (s[i] != '}') {
            c->state = -1;
            return;
        }
    }
}

/* ---- events ---- */

static void content(fm_tool_parser *p, const char *s, size_t n) {
    if (n) p->ev.content(p->ev.user, s, n);
}

/* sends what the scan c allows of the current call: its start, new argument bytes, and its end when done */
static void advance_call(fm_tool_parser *p, const char *obj, call_scan *c, bool finished) {
    if (!p->begun && c->name) {
        p->ev.call_begin(p->ev.user, p->index, c->name);
        p->begun = true;
    }
    if (p->begun && c->has_args && c->args_n > p->sent) {
        p->ev.call_arguments(p->ev.user, p->index, obj + c->args_at + p->sent, c->args_n - p->sent);
        p->sent = c->args_n;
    }
    if (finished) {
        if (p->begun && !c->has_args) p->ev.call_arguments(p->ev.user, p->index, "{}", 2);
        if (p->begun) p->ev.call_end(p->ev.user, p->index), p->n_calls++;
        p->index += p->begun;
        p->begun = false, p->sent = 0;
    }
}

/* is s[0..n) one JSON object with a string name (cJSON's check of a finished call) */
static bool valid_call(const char *s, size_t n) {
    char *t = strndup(s, n);
    cJSON *v = t ? cJSON_Parse(t) : NULL;
    free(t);
    const bool ok = cJSON_IsObject(v) && cJSON_IsString(cJSON_GetObjectItemCaseSensitive(v, "name"));
    cJSON_Delete(v);
    return ok;
}

static void to_content(fm_tool_parser *p, const char *text, size_t n); /* content mode */

/* hermes: the block holds the text after <tool_call>; returns true when the block ended (its rest handled) */
static bool hermes_block(fm_tool_parser *p, bool at_end) {
    call_scan c = {0};
    scan_call(p->blk.p, p->blk.n, 0, &c);
    const char *close = strstr(p->blk.p, k_hermes_close);
    if (!close && !at_end && p->blk.n < MAX_BLOCK) { /* the block goes on: stream what the scan allows */
        if (c.state >= 0) advance_call(p, p->blk.p, &c, false);
        free(c.name);
        return false;
    }
    /* the block ends here: at its close tag, at the end of the output, or at the size bound */
    const size_t body = close ? (size_t)(close - p->blk.p) : p->blk.n;
    const bool ok = c.state == 1 && valid_call(p->blk.p, c.end) && skip_ws(p->blk.p, body, c.end) == body;
    if (ok || p->begun) { /* a started call ends even when broken */
        advance_call(p, p->blk.p, &c, true);
        p->after_call = true;
    } else {
        content(p, "<tool_call>", 11);
        content(p, p->blk.p, body);
        if (close) content(p, k_hermes_close, sizeof k_hermes_close - 1);
    }
    free(c.name);
    char *rest = close ? strdup(close + sizeof k_hermes_close - 1) : NULL;
    p->blk.n = 0, p->mode = MODE_CONTENT;
    if (rest) {
        to_content(p, rest, strlen(rest));
        free(rest);
    }
    return true;
}

/* mistral: the block holds the text after [TOOL_CALLS]: a JSON array of call objects */
static bool mistral_block(fm_tool_parser *p, bool at_end) {
    const char *s = p->blk.p;
    const size_t n = p->blk.n;
    size_t i = skip_ws(s, n, 0);
    if (i >= n) {
        if (at_end) p->mode = MODE_CONTENT;
        return at_end;
    }
    bool broken = s[i] != '[';
    if (!p->obj_at && !broken) p->obj_at = i + 1;
    while (!broken) {
        i = skip_ws(s, n, p->obj_at);
        if (i < n && s[i] == ',' && p->n_calls) i = skip_ws(s, n, i + 1);
        if (i >= n) break;
        if (s[i] == ']') {
            p->mode = MODE_AFTER_LIST;
            to_content(p, s + i + 1, n - i - 1);
            return true;
        }
        call_scan c = {0};
        scan_call(s, n, i, &c);
        if (c.state < 0) {
            free(c.name);
            broken = true;
            break;
        }
        const bool done = c.state == 1 && valid_call(s + i, c.end - i);
        /* the scan's offsets are into s: advance_call reads s + args_at */
        advance_call(p, s, &c, done || (at_end && p->begun));
        free(c.name);
        if (!done) break;
        p->obj_at = c.end;
    }
    if (broken && !p->begun && p->n_calls == 0) {
        content(p, "[TOOL_CALLS]", 12);
        content(p, s, n);
        p->blk.n = 0, p->mode = MODE_CONTENT;
        return true;
    }
    if (at_end) p->mode = MODE_CONTENT;
    return at_end;
}

static bool block(fm_tool_parser *p, bool at_end) {
    return p->fmt == FM_TOOLS_HERMES ? hermes_block(p, at_end) : mistral_block(p, at_end);
}

static void to_content(fm_tool_parser *p, const char *text, size_t n) {
    if (p->after_call) {
        const size_t k = skip_ws(text, n, 0);
        text += k, n -= k;
        if (!n) return;
        p->after_call = false;
    }
    if (p->mode == MODE_AFTER_LIST) { /* mistral: nothing follows the list but text */
        content(p, text, n);
        return;
    }
    const char *tag = fm_tool_format_open_tag(p->fmt);
    const size_t L = strlen(tag);
    const char *at = NULL;
    for (size_t i = 0; i + L <= n && !at; i++)
        if (!memcmp(text + i, tag, L)) at = text + i;
    if (at) {
        size_t m = (size_t)(at - text);
        while (m && is_ws(text[m - 1])) m--; /* the whitespace before a call only separates it */
        content(p, text, m);
        p->mode = MODE_CALL, p->blk.n = 0, p->obj_at = 0;
        g_put(&p->blk, "", 0);
        const char *rest = at + L;
        g_put(&p->blk, rest, (size_t)(text + n - rest));
        block(p, false);
        return;
    }
    size_t hold = fm_text_partial_tag(text, n, tag);
    while (hold < n && hold < MAX_HOLD && is_ws(text[n - hold - 1])) hold++;
    content(p, text, n - hold);
    memcpy(p->hold, text + n - hold, hold);
    p->n_hold = hold;
}

void fm_tool_parser_push(fm_tool_parser *p, const char *s, size_t n) {
    if (!n) return;
    if (p->fmt == FM_TOOLS_NONE) {
        content(p, s, n);
        return;
    }
    if (p->mode == MODE_CALL) {
        g_put(&p->blk, s, n);
        block(p, false);
        return;
    }
    char stack[256];
    const size_t total = p->n_hold + n;
    char *buf = fm_text_join(stack, sizeof stack, p->hold, p->n_hold, s, n);
    p->n_hold = 0;
    to_content(p, buf, total);
    if (buf != stack) free(buf);
}

void fm_tool_parser_finish(fm_tool_parser *p) {
    if (p->mode == MODE_CALL) block(p, true);
    if (p->n_hold) {
        const size_t n = p->n_hold;
        p->n_hold = 0;
        if (p->n_calls == 0 || skip_ws(p->hold, n, 0) < n) content(p, p->hold, n); /* not the space after calls */
    }
}
