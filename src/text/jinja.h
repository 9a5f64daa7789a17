/* A small sandboxed Jinja interpreter for chat templates, in Hugging Face's environment.
 *
 * The language is jinja2's as transformers configures it for apply_chat_template: trim_blocks, lstrip_blocks, the
 * loopcontrols extension (break/continue), an ImmutableSandboxedEnvironment (no mutating methods), tojson as
 * json.dumps(ensure_ascii=False, indent, separators, sort_keys), raise_exception(msg) and strftime_now(fmt).
 * Values are Python's: None/True/False, int vs float arithmetic, str and repr as Python prints them, dicts that keep
 * their key order. Undefined names behave as jinja2's default Undefined (falsy, print as "", an attribute of one is
 * an error). Whatever it does not implement is refused by name ("unknown filter 'xyz'"), never skipped.
 *
 * Sandbox: the output bytes, loop iterations, call depth and working memory of a render are bounded
 * (jinja_limits); exceeding one is an error naming the limit. docs/chat-templates.md lists what is supported. */
#ifndef FM_TEXT_JINJA_H
#define FM_TEXT_JINJA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "fp8moe.h"

typedef struct jinja_template jinja_template;

typedef struct jinja_limits {
    size_t max_output;      /* bytes of rendered text (0: 16 MiB) */
    int64_t max_iterations; /* loop iterations over the whole render (0: 1,000,000) */
    int32_t max_depth;      /* nested macro calls (0: 64) */
    size_t max_memory;      /* working memory of one render (0: 256 MiB) */
    time_t now;             /* the time strftime_now formats (0: the current local time) */
} jinja_limits;

/* Parses src (n bytes of UTF-8). FM_ERR_FORMAT with the line and what is wrong on a syntax error;
 * FM_ERR_UNSUPPORTED naming a statement the interpreter does not implement. */
fm_status jinja_parse(const char *src, size_t n, jinja_template **out, fm_error *err);
void jinja_free(jinja_template *t);

typedef enum jinja_fail {
    JINJA_OK,
    JINJA_RAISED, /* the template called raise_exception(msg): err holds msg, the template's own words */
    JINJA_ERROR,  /* a runtime error (undefined attribute, type error, unknown filter, a sandbox limit...) */
} jinja_fail;

/* Renders t with the variables of vars (a cJSON object, read only; NULL for none). *text is malloc'd and
 * NUL-terminated. On failure returns FM_ERR_USAGE with err filled and, when kind is not NULL, says which kind. */
fm_status jinja_render(const jinja_template *t, const cJSON *vars, const jinja_limits *limits, char **text,
                       jinja_fail *kind, fm_error *err);

#endif
