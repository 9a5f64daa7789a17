/* The reasoning split of an output stream (reasoning.h). */
#include "text/reasoning.h"

#include <stdlib.h>
#include <string.h>

#include "text/held_text.h"
#include "util/status.h"

enum { ST_START, ST_REASONING, ST_ANSWER };

static const char k_open[] = "<think>", k_close[] = "</think>";

fm_reasoning_format fm_reasoning_format_of_template(const char *src) {
    return src && strstr(src, k_open) ? FM_REASONING_THINK_TAGS : FM_REASONING_NONE;
}

fm_status fm_reasoning_format_parse(const char *name, fm_reasoning_format *out, fm_error *err) {
    if (!strcmp(name, "qwen3") || !strcmp(name, "deepseek_r1")) *out = FM_REASONING_THINK_TAGS;
    else if (!strcmp(name, "none")) *out = FM_REASONING_NONE;
    else return fm_fail(err, FM_ERR_USAGE, "--reasoning-parser %s: expected qwen3, deepseek_r1 or none", name);
    return FM_OK;
}

bool fm_reasoning_prompt_opens(fm_reasoning_format f, const char *prompt) {
    if (f != FM_REASONING_THINK_TAGS || !prompt) return false;
    size_t n = strlen(prompt);
    while (n && (prompt[n - 1] == '\n' || prompt[n - 1] == ' ')) n--;
    const size_t L = sizeof k_open - 1;
    return n >= L && !memcmp(prompt + n - L, k_open, L);
}

void fm_reasoning_init(fm_reasoning_split *r, fm_reasoning_format f, bool open, fm_text_sink on_reasoning,
                       fm_text_sink on_answer, void *user) {
    memset(r, 0, sizeof *r);
    r->fmt = f;
    r->state = f == FM_REASONING_NONE ? ST_ANSWER : open ? ST_REASONING : ST_START;
    r->answer_begun = f == FM_REASONING_NONE || !open; /* an opened block: its answer's newlines are trimmed */
    r->on_reasoning = on_reasoning, r->on_answer = on_answer, r->user = user;
}

static void answer(fm_reasoning_split *r, const char *s, size_t n) {
    if (!r->answer_begun) { /* the newlines that separate </think> from the answer */
        while (n && (*s == '\n' || *s == '\r')) s++, n--;
        if (!n) return;
        r->answer_begun = true;
    }
    if (n) r->on_answer(r->user, s, n);
}

static void keep(fm_reasoning_split *r, const char *s, size_t n) {
    memcpy(r->hold, s, n);
    r->n_hold = n;
}

/* buf[0..n): the held bytes and the new piece, in the reasoning */
static void in_reasoning(fm_reasoning_split *r, const char *buf, size_t n) {
    if (r->skip_newline && n) {
        r->skip_newline = false;
        if (*buf == '\n') buf++, n--;
    }
    const char *end = NULL;
    for (size_t i = 0; i + sizeof k_close - 1 <= n && !end; i++)
        if (!memcmp(buf + i, k_close, sizeof k_close - 1)) end = buf + i;
    if (end) {
        size_t m = (size_t)(end - buf);
        while (m && buf[m - 1] == '\n') m--; /* the newlines before </think> */
        if (m) r->on_reasoning(r->user, buf, m);
        r->state = ST_ANSWER, r->answer_begun = false;
        const char *rest = end + sizeof k_close - 1;
        answer(r, rest, (size_t)(buf + n - rest));
        return;
    }
    size_t hold = fm_text_partial_tag(buf, n, k_close);
    while (hold < n && hold < sizeof r->hold && buf[n - hold - 1] == '\n') hold++;
    if (hold > sizeof r->hold) hold = sizeof r->hold;
    if (n - hold) r->on_reasoning(r->user, buf, n - hold);
    keep(r, buf + n - hold, hold);
}

void fm_reasoning_push(fm_reasoning_split *r, const char *s, size_t n) {
    if (!n) return;
    if (r->state == ST_ANSWER) {
        answer(r, s, n);
        return;
    }
    char stack[256];
    const size_t total = r->n_hold + n;
    char *buf = fm_text_join(stack, sizeof stack, r->hold, r->n_hold, s, n);
    r->n_hold = 0;
    const char *p = buf;
    size_t m = total;
    if (r->state == ST_START) {
        const size_t L = sizeof k_open - 1;
        if (m < L && !memcmp(p, k_open, m)) { /* may still become <think> */
            keep(r, p, m);
            goto done;
        }
        if (m >= L && !memcmp(p, k_open, L)) {
            r->state = ST_REASONING, r->skip_newline = true;
            p += L, m -= L;
        } else {
            r->state = ST_ANSWER;
            answer(r, p, m);
            goto done;
        }
    }
    in_reasoning(r, p, m);
done:
    if (buf != stack) free(buf);
}

void fm_reasoning_finish(fm_reasoning_split *r) {
    if (!r->n_hold) return;
    const size_t n = r->n_hold;
    r->n_hold = 0;
    if (r->state == ST_START) {
        r->state = ST_ANSWER;
        answer(r, r->hold, n);
    } else if (r->state == ST_REASONING) r->on_reasoning(r->user, r->hold, n);
}
