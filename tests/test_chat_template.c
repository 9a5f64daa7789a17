/* Chat templates and the Jinja interpreter (src/text/chat_template.c, src/text/jinja_*.c).
 *
 * The oracle is jinja2 itself: tests/chat_templates/render_jinja2.py renders in transformers' environment, run by
 * a python3 that imports jinja2 (Debian's python3-jinja2), and every case must be byte-identical (or raise the same
 * raise_exception message, or fail in both). Two sets of cases: the real templates under tests/chat_templates/
 * times the conversations of conversations.json, the generation prompt and enable_thinking; and small templates
 * for every construct of the language. golden.json (made by transformers) must still match; the sandbox limits and
 * the refusals are checked here directly. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "text/chat_template.h"
#include "text/jinja.h"

#define FIXTURES "tests/chat_templates"
#define QWEN3_DIR FIXTURES "/qwen3-30b-a3b"
#define MIXTRAL_DIR FIXTURES "/mixtral-8x7b-instruct-v0.1"
#define MIXTRAL_2023_DIR FIXTURES "/mixtral-8x7b-instruct-v0.1-2023"
#define CHATML_DIR FIXTURES "/chatml"
#define CHATML_FILE CHATML_DIR "/chat_template.jinja"
#define FIXED_NOW 1753920000 /* render_jinja2.py's strftime_now time */

static char g_case[512]; /* the case being checked, named when it fails */
static char g_dir[64];

static fm_chat_template *load(const char *dir, const char *file) {
    fm_chat_template *t = NULL;
    fm_error err = {{0}};
    fm_status st = fm_chat_template_load(dir, file, &t, &err);
    if (st) fprintf(stderr, "load %s: %s\n", file ? file : dir, err.msg);
    assert_int_equal(st, FM_OK);
    assert_non_null(t);
    return t;
}

static char *read_all(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) fprintf(stderr, "cannot open %s\n", path);
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    const long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    assert_non_null(s);
    assert_int_equal(fread(s, 1, (size_t)n, f), (size_t)n);
    s[n] = 0;
    fclose(f);
    return s;
}

static void write_file(const char *name, const char *text) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static const char *const k_tmp_files[] = {
    "chat_template.jinja", "chat_template.json", "tokenizer_config.json", "t.json", "jobs.json", "out.json", NULL};

static void remove_files(void) {
    char path[256];
    for (const char *const *f = k_tmp_files; *f; f++) {
        snprintf(path, sizeof path, "%s/%s", g_dir, *f);
        unlink(path);
    }
}

static int make_dir(void **state) {
    (void)state;
    setenv("TZ", "UTC", 1); /* strftime_now: the same local time in C and in Python */
    tzset();
    snprintf(g_dir, sizeof g_dir, "/tmp/fp8moe_chat_XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int remove_dir(void **state) {
    (void)state;
    remove_files();
    return rmdir(g_dir);
}

/* ---- the oracle ---- */

/* A python3 that imports jinja2: $FP8MOE_PYTHON, /usr/bin/python3 (Debian's python3-jinja2), python3. */
static const char *python_with_jinja2(void) {
    static const char *found;
    if (found) return found;
    const char *cands[] = {getenv("FP8MOE_PYTHON"), "/usr/bin/python3", "python3"};
    for (size_t i = 0; i < sizeof cands / sizeof cands[0]; i++) {
        if (!cands[i]) continue;
        char cmd[512];
        snprintf(cmd, sizeof cmd, "%s -c 'import jinja2' >/dev/null 2>&1", cands[i]);
        if (system(cmd) == 0) return found = cands[i];
    }
    fail_msg("no python3 with jinja2 (the oracle of these tests): install python3-jinja2 (tools/install-deps.sh) "
             "or set FP8MOE_PYTHON");
    return NULL;
}

/* Renders jobs ([{template, vars}]) with jinja2; the results, one per job. */
static cJSON *oracle(const cJSON *jobs) {
    char *text = cJSON_PrintUnformatted(jobs);
    write_file("jobs.json", text);
    free(text);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s " FIXTURES "/render_jinja2.py < %s/jobs.json > %s/out.json", python_with_jinja2(),
             g_dir, g_dir);
    assert_int_equal(system(cmd), 0);
    char path[256];
    snprintf(path, sizeof path, "%s/out.json", g_dir);
    char *out = read_all(path);
    cJSON *r = cJSON_Parse(out);
    free(out);
    assert_true(cJSON_IsArray(r) && cJSON_GetArraySize(r) == cJSON_GetArraySize(jobs));
    return r;
}

typedef struct tally {
    int text, raised, error;
} tally;

/* One case: the C result (st, text, err) against jinja2's (want). raised_exact: a raise_exception message is err's
 * whole text (fm_chat_template_apply); else it is compared as jinja_render gives it. */
static void compare(const cJSON *want, fm_status st, const char *text, const char *err, tally *n) {
    const cJSON *wt = cJSON_GetObjectItemCaseSensitive(want, "text");
    const cJSON *wr = cJSON_GetObjectItemCaseSensitive(want, "raised");
    if (cJSON_IsString(wt)) {
        if (st) fprintf(stderr, "%s\njinja2 rendered it; fp8moe failed: %s\n", g_case, err);
        assert_int_equal(st, FM_OK);
        if (strcmp(text, wt->valuestring))
            fprintf(stderr, "%s\nfp8moe:\n[%s]\njinja2:\n[%s]\n", g_case, text, wt->valuestring);
        assert_string_equal(text, wt->valuestring);
        n->text++;
    } else if (cJSON_IsString(wr)) {
        for (char *c = wr->valuestring; *c; c++) /* fp8moe's messages are one line: control characters as spaces */
            if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = ' ';
        if (!st || strcmp(err, wr->valuestring))
            fprintf(stderr, "%s\njinja2 raised [%s]; fp8moe: %s [%s]\n", g_case, wr->valuestring, st ? "failed" : "ok",
                    st ? err : text);
        assert_int_not_equal(st, FM_OK);
        assert_string_equal(err, wr->valuestring);
        n->raised++;
    } else {
        const cJSON *we = cJSON_GetObjectItemCaseSensitive(want, "error");
        if (!st) fprintf(stderr, "%s\njinja2 failed (%s); fp8moe rendered:\n[%s]\n", g_case, we->valuestring, text);
        assert_int_not_equal(st, FM_OK);
        n->error++;
    }
}

/* ---- the real templates against jinja2 ---- */

static bool is_fixture(const char *name) {
    char path[512];
    struct stat sb;
    snprintf(path, sizeof path, FIXTURES "/%s", name);
    return name[0] != '.' && stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void test_real_templates_against_jinja2(void **state) {
    (void)state;
    char *conv_text = read_all(FIXTURES "/conversations.json");
    cJSON *convs = cJSON_Parse(conv_text);
    free(conv_text);
    assert_true(cJSON_IsArray(convs));
    DIR *d = opendir(FIXTURES);
    assert_non_null(d);
    char *names[64];
    int nn = 0;
    for (struct dirent *e; (e = readdir(d)) && nn < 64;)
        if (is_fixture(e->d_name)) names[nn++] = strdup(e->d_name);
    closedir(d);
    qsort(names, (size_t)nn, sizeof *names, cmp_str);
    assert_true(nn >= 10);

    cJSON *jobs = cJSON_CreateArray();
    int n_cases = 0;
    fm_chat_template *tmpl[64];
    for (int i = 0; i < nn; i++) {
        char dir[512];
        snprintf(dir, sizeof dir, FIXTURES "/%s", names[i]);
        tmpl[i] = load(dir, NULL);
        const cJSON *c;
        cJSON_ArrayForEach(c, convs) {
            for (int gen = 1; gen >= 0; gen--)
                for (int think = 0; think < 3; think++) { /* absent, true, false */
                    cJSON *vars = cJSON_CreateObject();
                    cJSON_AddItemToObject(vars, "messages",
                                          cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(c, "messages"), true));
                    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(c, "tools");
                    if (tools) cJSON_AddItemToObject(vars, "tools", cJSON_Duplicate(tools, true));
                    cJSON_AddBoolToObject(vars, "add_generation_prompt", gen);
                    if (think) cJSON_AddBoolToObject(vars, "enable_thinking", think == 1);
                    cJSON *job = cJSON_CreateObject();
                    cJSON_AddStringToObject(job, "template", fm_chat_template_source(tmpl[i]));
                    cJSON_AddItemToObject(job, "vars", fm_chat_template_context(tmpl[i], vars));
                    cJSON_AddItemToObject(job, "c_vars", vars); /* what fm_chat_template_apply is given */
                    cJSON_AddNumberToObject(job, "fixture", i);
                    cJSON_AddItemToArray(jobs, job);
                    n_cases++;
                }
        }
    }
    cJSON *want = oracle(jobs);
    tally n = {0};
    int k = 0;
    const cJSON *job;
    cJSON_ArrayForEach(job, jobs) {
        const int i = (int)cJSON_GetObjectItemCaseSensitive(job, "fixture")->valuedouble;
        const cJSON *vars = cJSON_GetObjectItemCaseSensitive(job, "c_vars");
        char *shown = cJSON_PrintUnformatted(vars);
        snprintf(g_case, sizeof g_case, "template %s, case %d: %.300s", names[i], k, shown);
        free(shown);
        char *text = NULL;
        fm_error err = {{0}};
        const fm_status st = fm_chat_template_apply(tmpl[i], vars, &text, &err);
        compare(cJSON_GetArrayItem(want, k++), st, text, err.msg, &n);
        free(text);
    }
    fprintf(stderr,
            "jinja2 oracle: %d templates x %d conversation cases: %d renderings byte-identical, %d "
            "raise_exception messages equal, %d failures in both\n",
            nn, n_cases / nn, n.text, n.raised, n.error);
    assert_true(n.text > n_cases * 3 / 4);
    g_case[0] = 0;
    for (int i = 0; i < nn; i++) fm_chat_template_free(tmpl[i]), free(names[i]);
    cJSON_Delete(want), cJSON_Delete(jobs), cJSON_Delete(convs);
}

/* ---- the language against jinja2 ---- */

/* Each line is a template of its own. */
static const char *const k_lines[] = {
    "{{ 1 + 2 }}|{{ 1 / 2 }}|{{ 7 // 2 }}|{{ -7 // 2 }}|{{ -7 % 3 }}|{{ 2 ** 10 }}|{{ 0.1 + 0.2 }}|{{ 1e20 }}",
    "{{ 3 * 'ab' }}|{{ [1] * 2 }}|{{ 10 / 4 }}|{{ 4 / 2 }}|{{ 2.5 * 2 }}|{{ 1e-5 }}|{{ 1.5e300 * 1e10 }}|{{ -0.0 }}",
    "{{ s[1:3] }}|{{ s[::-1] }}|{{ s|length }}|{{ l[-1] }}|{{ l[1:] }}|{{ l[::2] }}|{{ s[0] }}|{{ l[:-1] }}",
    "{{ s.upper() }}|{{ s|title }}|{{ s|capitalize }}|{{ 'ABC'|lower }}|{{ s|upper }}|{{ 'x'|reverse }}",
    "{% for x in l %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}"
    "{{ loop.revindex }}{{ loop.revindex0 }}{% if not loop.first %}{{ loop.previtem }}{% endif %}"
    "{% if not loop.last %}{{ loop.nextitem }}{% endif %}{{ loop.cycle('a', 'b') }};{% endfor %}",
    "{% for x in l if x > 1 %}{{ x }}{{ loop.length }}{% else %}none{% endfor %}|{% for x in e %}a{% else %}empty"
    "{% endfor %}",
    "{% set ns = namespace(k=0, s='') %}{% for x in l %}{% set ns.k = ns.k + x %}{% set ns.s = ns.s ~ x %}"
    "{% endfor %}{{ ns.k }}{{ ns.s }}",
    "{% set x = 1 %}{% for i in l %}{{ x }}{% set x = i %}{{ x }}{% endfor %}{{ x }}",
    "{% for i in l %}{% if loop.first %}{% set y = 5 %}{% endif %}[{{ y }}]{% endfor %}",
    "{% macro m(a, b='B') %}<{{ a }}{{ b }}>{% endmacro %}{{ m(1) }}{{ m(1, 2) }}{{ m(b=3, a=4) }}{{ m() }}",
    "{% macro outer(x) %}{% macro inner(y) %}[{{ y }}]{% endmacro %}{{ inner(x) }}{{ inner(x ~ x) }}{% endmacro %}"
    "{{ outer('q') }}",
    "{{ d }}|{{ l }}|{{ (1, 'a') }}|{{ (1,) }}|{{ none }}|{{ true }}|{{ d.n }}|{{ d['a'] }}|{{ d.get('zz', 'x') }}",
    "{{ d.items() | list }}|{{ d|items|list }}|{{ d.keys()|list }}|{{ d.values()|list }}|{{ d|length }}",
    "{{ ['a\\'b', \"c\\\"d\", 'e\\nf', '\\u00e9\\x01', '\\u200b'] }}",
    "{{ d|tojson }}|{{ d|tojson(indent=2) }}|{{ s|tojson }}|{{ s|tojson(ensure_ascii=true) }}",
    "{{ msgs|tojson(separators=(',', ':')) }}|{{ {'b': 1, 'a': [2, 3.5, none, true]}|tojson(sort_keys=true) }}",
    "{{ {'x': {}, 'y': []}|tojson(indent=4) }}|{{ 'a\\tb\"\\\\c\\u0001'|tojson }}|{{ '🎉'|tojson(ensure_ascii=true) }}",
    "{{ 'a' in 'cat' }}{{ 2 in l }}{{ 'a' in d }}{{ 'z' not in d }}{{ 1 < 2 < 3 }}{{ 3 > 2 > 2 }}{{ 'x' ~ 1 ~ none }}",
    "{{ u is defined }}{{ d is mapping }}{{ s is string }}{{ l is iterable }}{{ 1 is number }}{{ 1.5 is float }}"
    "{{ 1 is integer }}{{ none is none }}{{ true is true }}{{ l is sequence }}{{ 3 is odd }}{{ 4 is even }}"
    "{{ 9 is divisibleby 3 }}{{ true is boolean }}{{ u is undefined }}{{ 'a' is lower }}{{ 1 is not string }}",
    "{{ 1 is eq 1 }}{{ 1 is ne 2 }}{{ 1 is lt 2 }}{{ 'a' is in 'abc' }}{{ none is sameas none }}",
    "{{ l|join(', ') }}|{{ msgs|map(attribute='role')|join(',') }}|{{ msgs|selectattr('role', 'equalto', 'user')"
    "|list|length }}|{{ msgs|rejectattr('role', 'eq', 'user')|map(attribute='content')|first }}",
    "{{ msgs|selectattr('name', 'undefined')|list|length }}|{{ l|select('odd')|list }}|{{ l|reject('odd')|list }}"
    "|{{ msgs|selectattr('tool_calls')|list }}|{{ l|map('string')|join }}",
    "{{ l|first }}{{ l|last }}{{ u|default('D') }}{{ ''|default('E', true) }}{{ none|default('F') }}{{ u|d('G') }}",
    "{{ l|reverse|list }}{{ [3, 1, 2]|sort }}{{ ['b', 'A', 'a']|sort }}{{ [3, 1, 2]|sort(reverse=true) }}"
    "{{ msgs|sort(attribute='role')|map(attribute='role')|list }}{{ [1, 2, 1]|unique|list }}",
    "{{ '  x  '|trim }}|{{ 'xxaxx'.strip('x') }}|{{ '\\n\\nab\\n'.lstrip('\\n') }}|{{ 'ab\\n\\n'.rstrip() }}|{{ "
    "'a,b'.split(',') }}|{{ 'a b  c '.split() }}|{{ 'a.b.c'.rsplit('.', 1) }}|{{ 'a.b.c'.split('.', 1) }}",
    "{{ 'aXbX'.replace('X', '-') }}|{{ 'aXbX'|replace('X', '') }}|{{ 'abc'.startswith('ab') }}"
    "{{ 'abc'.endswith(('x', 'c')) }}{{ 'hello'.find('l') }}{{ 'hello'.rfind('l') }}{{ 'hello'.count('l') }}",
    "{{ 'Hello World'.lower() }}|{{ 'hello world'.capitalize() }}|{{ 'hello world'.title() }}|{{ '-'.join(['a', "
    "'b']) }}|{{ '{}+{}={x}'.format(1, 'y', x=2) }}|{{ 'ab12'.isalnum() }}{{ '12'.isdigit() }}",
    "{{ '42'|int + 1 }}|{{ '3.5'|float }}|{{ 3.7|int }}|{{ 'x'|int }}|{{ 2.5|round }}|{{ 3.14159|round(2) }}"
    "|{{ 2.675|round(2) }}|{{ -3|abs }}|{{ 'x'|string }}|{{ 5|string }}|{{ 7|round }}",
    "{{ 'a\\nb\\nc'|indent(2) }}|{{ 'a\\n\\nb'|indent(2, true) }}|{{ 'a\\n\\nb\\n'|indent(first=true, blank=true) }}",
    "{{ 'a b c'|wordcount }}|{{ '%s-%d-%.2f' % ('a', 3, 1.5) }}|{{ '%s' % 'x' }}|{{ l|sum }}{{ l|max }}{{ l|min }}",
    "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% for k, v in d.items() %}{{ k }}={{ v }},{% endfor %}",
    "{% set blk %}in{{ 1 }}block{% endset %}{{ blk }}|{% filter upper %}up{{ 'x' }}{% endfilter %}"
    "|{% with q = 5 %}{{ q }}{% endwith %}",
    "{% for x in l %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 3 %}{% break %}{% endif %}{{ x }}{% endfor %}",
    "{{ 1 if true else 2 }}{{ 1 if false }}{{ none or 'z' }}{{ 0 and 1 }}{{ not none }}{{ -l[0] }}{{ +1 }}",
    "{% if u %}a{% elif l %}b{% else %}c{% endif %}{% if not e %}d{% endif %}",
    "{% raw %}{{ not rendered }}{% endraw %}|{{ strftime_now('%Y-%m-%d %d %b %H') }}",
    "{{ range(3)|list }}{{ range(1, 7, 2)|list }}{{ dict(a=1, b=2) }}{{ namespace(a=1).a }}",
    "{{ s.split('ö') }}{{ s[2:4] }}{{ s|reverse }}{{ s.find('w') }}{{ 'x' < 'y' }}{{ [1, 2] < [1, 3] }}",
    "{% generation %}gen{{ 1 }}{% endgeneration %}",
    /* scoping, nested loops, more filters and arithmetic */
    "{% macro f() %}{{ g }}{% endmacro %}{% set g = 5 %}{{ f() }}",
    "{% macro f() %}{% set inner = 1 %}{{ inner }}{% endmacro %}{{ f() }}[{{ inner }}]",
    "{% for a in l %}{% for b in l %}{{ loop.index }}{% endfor %}:{{ loop.index }};{% endfor %}",
    "{% for a in l if a > 5 %}x{% else %}none{{ loop is defined }}{% endfor %}",
    "{% set ns = namespace(items=[]) %}{% for x in l %}{% set ns.items = ns.items + [x * 2] %}{% endfor %}{{ ns.items "
    "}}",
    "{% for k, v in d|items %}{{ k }}{{ v }}{% endfor %}{% for x in d %}{{ x }}{% endfor %}{% for c in s %}{{ c }}-{% "
    "endfor %}",
    "{{ msgs|map(attribute='role')|list }}{{ msgs|selectattr('role','in',['user','system'])|list|length }}",
    "{% if msgs[0].role == 'user' %}{% set first = msgs[0] %}{% endif %}{{ first.content }}",
    "{{ l[5] is defined }}{{ d.missing is defined }}{{ d['k'] is string }}{{ (l|length) > 2 }}",
    "{{ 'a' if l else 'b' }}{{ l|length if l }}{{ [] or 'empty' }}",
    "{% set x = [1, 2] + [3] %}{{ x }}{{ x|length }}{{ x[-1] }}{{ (x|first) + (x|last) }}",
    "{{ {'a': 1}|tojson }}{{ [1, 'x', none]|tojson }}{{ 'é'|tojson }}{{ 1.5|tojson }}{{ true|tojson }}",
    "{{ l|join }}{{ l|join('-') }}{{ s|list }}{{ s|first }}{{ s|last }}",
    "{%- for message in msgs %}\n  {%- if message.role == 'assistant' %}\n    {{- '<tool>' + message.content }}\n  {%- "
    "endif "
    "%}\n{%- endfor %}",
    "{{ '%d items' % (l|length) }}{{ '%-5s|' % 'ab' }}{{ '%05.1f' % 3.14159 }}{{ '%x' % 255 }}",
    "{{ l|sum(start=10) }}{{ [1.5, 2]|sum }}{{ ['b','a']|max }}{{ range(10)|select('even')|list }}",
    "{{ 'Hello'[1:] }}{{ 'Hello'[-3:] }}{{ 'Hello'[:-1] }}{{ 'Hello'[::2] }}{{ l[::-1] }}{{ l[10:] }}",
    "{{ 2 ** 0.5 }}{{ 10 // 3.0 }}{{ -1 ** 2 }}{{ 7 % -3 }}{{ 1 / 3 }}{{ 2 * 3.0 }}{{ 1e3 }}{{ 123456789.123 }}",
    "{{ 'a\\tb'|wordcount }}{{ 'Hello World'|title }}{{ 'hELLO'|capitalize }}{{ 'é'|upper }}",
    /* whitespace: trim_blocks, lstrip_blocks, the - and + controls, comments */
    "{% if true %}\n  x\n{% endif %}\n  y",
    "a  {%- if true -%}  b  {%- endif -%}  c",
    "  {% if true %}\n  {{ 1 }}\n  {% endif %}\n",
    "{# c #}\n  {# d #}\nx\n\n",
    "a\r\nb\r\n{% if 1 %}\r\nc{% endif %}\n",
    "{%+ if true %}x{% endif +%}\ny",
    "{{- ' a ' -}}  \n {{ 'b' }}  ",
    "x {{ 1 }}\n  {% set y = 1 %}\n  z",
    "{% for m in msgs %}\n  {{ m.role }}\n{% endfor %}\n",
    "\t{% for i in l %}\n\t\t{{- i }}\n\t{%- endfor %}\n",
    /* failures: the same outcome in both */
    "{{ u.x }}",
    "{{ raise_exception('boom: ' ~ 1) }}",
    "{{ raise_exception('two\\nlines') }}",
    "{{ 1 + 'a' }}",
    "{{ d.zz.y }}",
    "{{ l.append(1) }}",
    "{{ d.update({}) }}",
    "{% for %}",
    "{{ x|nofilter }}",
    "{{ 1 / 0 }}",
    "[{{ none.x }}]",
    "{% if u %}{{ u.x }}{% endif %}ok",
    "{{ 'a' < 1 }}",
    "{% for x in none %}{% endfor %}",
    "{{ u|tojson }}",
    "{% endfor %}",
    "{{ (1, 2",
    "{{ 'unterminated }}",
    "{{ none is none 1 }}",
    "{{ none|selectattr('a')|list }}{{ none|map('upper')|list }}{{ 0|select|list }}",
    "{{ 0x1F + 0o17 + 0b101 }}",
};

static void test_language_against_jinja2(void **state) {
    (void)state;
    const char *vars_json = "{\"d\": {\"a\": 1, \"items\": 2, \"n\": null}, \"l\": [1, 2, 3], \"s\": \"héllo wörld\","
                            " \"e\": [], \"msgs\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": "
                            "\"assistant\", \"content\": \"yo\", \"tool_calls\": [1]}]}";
    cJSON *vars = cJSON_Parse(vars_json);
    assert_non_null(vars);
    const int n = (int)(sizeof k_lines / sizeof k_lines[0]);
    cJSON *jobs = cJSON_CreateArray();
    for (int i = 0; i < n; i++) {
        cJSON *job = cJSON_CreateObject();
        cJSON_AddStringToObject(job, "template", k_lines[i]);
        cJSON_AddItemToObject(job, "vars", cJSON_Duplicate(vars, true));
        cJSON_AddItemToArray(jobs, job);
    }
    cJSON *want = oracle(jobs);
    tally t = {0};
    const jinja_limits lim = {.now = FIXED_NOW};
    for (int i = 0; i < n; i++) {
        snprintf(g_case, sizeof g_case, "template %d: %s", i, k_lines[i]);
        jinja_template *jt = NULL;
        char *text = NULL;
        fm_error err = {{0}};
        fm_status st = jinja_parse(k_lines[i], strlen(k_lines[i]), &jt, &err);
        if (!st) st = jinja_render(jt, vars, &lim, &text, NULL, &err);
        compare(cJSON_GetArrayItem(want, i), st, text, err.msg, &t);
        free(text);
        jinja_free(jt);
    }
    fprintf(stderr, "jinja2 oracle: %d language cases: %d renderings, %d raised, %d failures in both\n", n, t.text,
            t.raised, t.error);
    g_case[0] = 0;
    cJSON_Delete(want), cJSON_Delete(jobs), cJSON_Delete(vars);
}

/* ---- the sandbox and the refusals ---- */

static void expect_failure(const char *src, const jinja_limits *lim, fm_status parse_st, const char *words) {
    jinja_template *jt = NULL;
    fm_error err = {{0}};
    char *text = NULL;
    fm_status st = jinja_parse(src, strlen(src), &jt, &err);
    if (!st) {
        assert_int_equal(parse_st, FM_OK);
        st = jinja_render(jt, NULL, lim, &text, NULL, &err);
        assert_int_equal(st, FM_ERR_USAGE);
    } else assert_int_equal(st, parse_st);
    assert_null(text);
    if (!strstr(err.msg, words)) fprintf(stderr, "%s: got [%s], want [%s]\n", src, err.msg, words);
    assert_non_null(strstr(err.msg, words));
    jinja_free(jt);
}

static void test_sandbox_limits_and_refusals(void **state) {
    (void)state;
    const jinja_limits small = {.max_output = 1000, .max_iterations = 5000, .max_depth = 10, .max_memory = 64u << 20};
    expect_failure("{% for i in range(100) %}{% for j in range(100) %}{% endfor %}{% endfor %}", &small, FM_OK,
                   "5000 loop iterations");
    expect_failure("{% for i in range(2000) %}xx{% endfor %}", &small, FM_OK, "1000 bytes");
    expect_failure("{{ 'x' * 100000 }}", &small, FM_OK, "1000 bytes");
    expect_failure("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", &small, FM_OK,
                   "nested deeper than the 10");
    expect_failure("{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s[:100000] %}"
                   "{% endfor %}",
                   &(jinja_limits){.max_memory = 4u << 20}, FM_OK, "working memory");
    expect_failure("{{ range(1000000)|length }}", NULL, FM_OK, "MAX_RANGE");
    expect_failure("{{ [1].append(2) }}", NULL, FM_OK, "unsafe");
    expect_failure("{{ x|frobnicate }}", NULL, FM_ERR_FORMAT, "unknown filter 'frobnicate'");
    expect_failure("{{ x|groupby('a') }}", NULL, FM_ERR_FORMAT, "unknown filter 'groupby'");
    expect_failure("{{ x is frob }}", NULL, FM_ERR_FORMAT, "unknown test 'frob'");
    /* inside an if, jinja2 defers the refusal to when the test runs */
    expect_failure("{% if x is frob %}{% endif %}", NULL, FM_OK, "unknown test 'frob'");
    expect_failure("{% include 'other.jinja' %}", NULL, FM_ERR_UNSUPPORTED, "'include' tag is not supported");
    expect_failure("{% for x in l recursive %}{% endfor %}", NULL, FM_ERR_UNSUPPORTED, "recursive");
    expect_failure("{% if true %}", NULL, FM_ERR_FORMAT, "endif");
    expect_failure("{{ 'a'.zfill(3) }}", NULL, FM_OK, "'zfill' is not supported");
    expect_failure("{{ 9223372036854775807 + 1 }}", NULL, FM_OK, "overflow");
    expect_failure("{{ (-9223372036854775807 - 1) // -1 }}", NULL, FM_OK, "overflow");
    expect_failure("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}", NULL, FM_OK, "nested too deeply");
    /* a deeply nested expression is refused, not a stack overflow */
    char deep[4200];
    memset(deep, '(', 2000);
    memcpy(deep + 2000, "1", 1);
    memset(deep + 2001, ')', 2000);
    deep[4001] = 0;
    char src[4300];
    snprintf(src, sizeof src, "{{ %s }}", deep);
    expect_failure(src, NULL, FM_ERR_FORMAT, "nested too deeply");
    /* raise_exception: the template's own words, and the kind */
    jinja_template *jt = NULL;
    fm_error err = {{0}};
    const char *r = "{{ raise_exception('Only user and assistant roles are supported!') }}";
    assert_int_equal(jinja_parse(r, strlen(r), &jt, &err), FM_OK);
    char *text = NULL;
    jinja_fail kind = JINJA_OK;
    assert_int_equal(jinja_render(jt, NULL, NULL, &text, &kind, &err), FM_ERR_USAGE);
    assert_int_equal(kind, JINJA_RAISED);
    assert_string_equal(err.msg, "Only user and assistant roles are supported!");
    jinja_free(jt);
}

/* ---- loading ---- */

/* tokenizer_config.json's chat_template as a list of named templates: "default", and "tool_use" with tools. */
static void test_named_template_list(void **state) {
    (void)state;
    write_file("tokenizer_config.json",
               "{\"bos_token\": {\"content\": \"<B>\"}, \"eos_token\": \"<E>\", \"chat_template\": ["
               "{\"name\": \"tool_use\", \"template\": \"T{{ tools|length }}{{ bos_token }}\"},"
               "{\"name\": \"default\", \"template\": \"D{{ messages|length }}{{ eos_token }}{{ tools }}\"}]}");
    fm_chat_template *t = load(g_dir, NULL);
    cJSON *vars = cJSON_Parse("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}");
    char *text = NULL;
    fm_error err = {{0}};
    assert_int_equal(fm_chat_template_apply(t, vars, &text, &err), FM_OK);
    assert_string_equal(text, "D1<E>None");
    free(text);
    cJSON_AddItemToObject(vars, "tools", cJSON_Parse("[{\"type\": \"function\"}]"));
    assert_int_equal(fm_chat_template_apply(t, vars, &text, &err), FM_OK);
    assert_string_equal(text, "T1<B>");
    free(text);
    /* the stop strings: the eos_token, and the end-of-turn markers the text writes */
    assert_string_equal(fm_chat_template_stop_tokens(t)[0], "<E>");
    assert_null(fm_chat_template_stop_tokens(t)[1]);
    assert_non_null(strstr(fm_chat_template_path(t), "tokenizer_config.json"));
    fm_chat_template_free(t);
    cJSON_Delete(vars);

    write_file("tokenizer_config.json", "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"x\"}]}");
    t = NULL;
    assert_int_equal(fm_chat_template_load(g_dir, NULL, &t, &err), FM_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "'default'"));
    assert_non_null(strstr(err.msg, "--chat-template"));
    remove_files();
}

static void test_template_files(void **state) {
    (void)state;
    /* chat_template.json in the model directory, and --chat-template FILE (.jinja or .json) over it */
    write_file("chat_template.json", "{\"chat_template\": \"J{{ bos_token }}\"}");
    write_file("tokenizer_config.json", "{\"bos_token\": \"<s>\", \"chat_template\": \"C\"}");
    fm_chat_template *t = load(g_dir, NULL);
    char *text = NULL;
    fm_error err = {{0}};
    assert_int_equal(fm_chat_template_apply(t, NULL, &text, &err), FM_OK);
    assert_string_equal(text, "J<s>");
    free(text);
    fm_chat_template_free(t);
    write_file("chat_template.jinja", "K{{ bos_token }}{% if add_generation_prompt %}+{% endif %}\n");
    t = load(g_dir, NULL);
    assert_int_equal(fm_chat_template_apply(t, NULL, &text, &err), FM_OK);
    assert_string_equal(text, "K<s>"); /* one trailing newline dropped, as jinja2 drops it */
    free(text);
    fm_chat_template_free(t);
    char file[256];
    snprintf(file, sizeof file, "%s/t.json", g_dir);
    write_file("t.json", "{\"chat_template\": \"F{{ messages[0].content }}\"}");
    t = load(g_dir, file);
    fm_chat_msg m = {"user", "u"};
    fm_chat_opts o = {.add_generation_prompt = true};
    assert_int_equal(fm_chat_render(t, &m, 1, &o, &text, &err), FM_OK);
    assert_string_equal(text, "Fu");
    free(text);
    fm_chat_template_free(t);
    t = load(NULL, CHATML_FILE); /* a file alone, no model directory */
    fm_chat_template_free(t);
    /* a syntax error names the file and the line */
    write_file("chat_template.jinja", "ok\n{% if x %}\n{{ x + }}\n{% endif %}");
    assert_int_equal(fm_chat_template_load(g_dir, NULL, &t, &err), FM_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "chat_template.jinja"));
    assert_non_null(strstr(err.msg, "line 3"));
    /* a runtime error names the file; raise_exception keeps the template's words alone */
    write_file("chat_template.jinja", "{{ messages[0].content.x.y }}");
    t = load(g_dir, NULL);
    cJSON *vars = cJSON_Parse("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}");
    assert_int_equal(fm_chat_template_apply(t, vars, &text, &err), FM_ERR_USAGE);
    assert_non_null(strstr(err.msg, "chat_template.jinja"));
    assert_non_null(strstr(err.msg, "has no attribute 'x'"));
    fm_chat_template_free(t);
    write_file("chat_template.jinja", "{{ raise_exception('No ' ~ messages[0].role ~ ' please') }}");
    t = load(g_dir, NULL);
    assert_int_equal(fm_chat_template_apply(t, vars, &text, &err), FM_ERR_USAGE);
    assert_string_equal(err.msg, "No user please");
    fm_chat_template_free(t);
    cJSON_Delete(vars);
    remove_files();
}

static void test_missing_template(void **state) {
    (void)state;
    fm_chat_template *t = NULL;
    fm_error err = {{0}};
    assert_int_equal(fm_chat_template_load("models/tiny-code-moe", NULL, &t, &err), FM_ERR_UNSUPPORTED);
    assert_null(t);
    assert_non_null(strstr(err.msg, "no chat template"));
    assert_non_null(strstr(err.msg, "--chat-template FILE"));
    write_file("tokenizer_config.json", "{\"bos_token\": null}");
    assert_int_equal(fm_chat_template_load(g_dir, NULL, &t, &err), FM_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "--chat-template"));
    remove_files();
    assert_int_equal(fm_chat_template_load(g_dir, "/nonexistent/llama9.jinja", &t, &err), FM_ERR_IO);
    assert_non_null(strstr(err.msg, "llama9.jinja"));
    t = load("models/tiny-code-moe", CHATML_FILE);
    assert_non_null(strstr(fm_chat_template_source(t), "<|im_start|>"));
    fm_chat_template_free(t);
}

static void test_stop_tokens(void **state) {
    (void)state;
    fm_chat_template *t = load(QWEN3_DIR, NULL);
    const char *const *stop = fm_chat_template_stop_tokens(t);
    assert_string_equal(stop[0], "<|im_end|>");
    assert_null(stop[1]);
    fm_chat_template_free(t);
    t = load(MIXTRAL_DIR, NULL); /* its turns end with eos */
    assert_string_equal(fm_chat_template_stop_tokens(t)[0], "</s>");
    assert_null(fm_chat_template_stop_tokens(t)[1]);
    fm_chat_template_free(t);
    t = load(FIXTURES "/llama-3.1-8b-instruct", NULL);
    stop = fm_chat_template_stop_tokens(t);
    assert_string_equal(stop[0], "<|eot_id|>");
    assert_string_equal(stop[1], "<|eom_id|>");
    assert_null(stop[2]);
    fm_chat_template_free(t);
}

/* ---- by hand and golden ---- */

static void check_render(const fm_chat_template *t, const fm_chat_msg *msgs, int32_t n, bool gen, fm_chat_think think,
                         const char *want, const char *want_error) {
    fm_chat_opts o = {gen, think};
    char *text = NULL;
    fm_error err = {{0}};
    fm_status st = fm_chat_render(t, msgs, n, &o, &text, &err);
    if (want) {
        if (st) fprintf(stderr, "%s\nrender: %s\n", g_case, err.msg);
        assert_int_equal(st, FM_OK);
        if (strcmp(text, want) != 0) fprintf(stderr, "%s\ngot:\n[%s]\nwant:\n[%s]\n", g_case, text, want);
        assert_string_equal(text, want);
    } else {
        assert_int_equal(st, FM_ERR_USAGE);
        assert_null(text);
        if (!strstr(err.msg, want_error))
            fprintf(stderr, "%s\ngot: %s\nwant the error: %s\n", g_case, err.msg, want_error);
        assert_non_null(strstr(err.msg, want_error));
    }
    free(text);
}

/* Hand-derived from the Qwen3 template (tests/chat_templates/qwen3-30b-a3b/chat_template.jinja). */
static void test_qwen3_by_hand(void **state) {
    (void)state;
    fm_chat_template *t = load(QWEN3_DIR, NULL);
    const fm_chat_msg hi[] = {{"user", "Hi"}};
    check_render(t, hi, 1, true, FM_THINK_DEFAULT, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", NULL);
    check_render(t, hi, 1, true, FM_THINK_ON, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", NULL);
    check_render(t, hi, 1, true, FM_THINK_OFF,
                 "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n", NULL);
    const fm_chat_msg sys[] = {{"system", "S"}, {"user", "U"}};
    check_render(t, sys, 2, false, FM_THINK_DEFAULT, "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n",
                 NULL);
    const fm_chat_msg earlier[] = {{"user", "Hi"}, {"assistant", "<think>\nR\n</think>\n\nHello!"}, {"user", "Q"}};
    check_render(t, earlier, 3, true, FM_THINK_DEFAULT,
                 "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
                 "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n",
                 NULL);
    const fm_chat_msg tools[] = {{"user", "W?"}, {"assistant", "call"}, {"tool", "a"}, {"tool", "b"}};
    check_render(t, tools, 4, true, FM_THINK_DEFAULT,
                 "<|im_start|>user\nW?<|im_end|>\n<|im_start|>assistant\ncall<|im_end|>\n"
                 "<|im_start|>user\n<tool_response>\na\n</tool_response>\n<tool_response>\nb\n</tool_response>"
                 "<|im_end|>\n<|im_start|>assistant\n",
                 NULL);
    fm_chat_template_free(t);
}

static void test_mistral_and_chatml_by_hand(void **state) {
    (void)state;
    fm_chat_template *t = load(MIXTRAL_DIR, NULL);
    const fm_chat_msg conv[] = {{"system", "S"}, {"user", "U"}, {"assistant", "A"}, {"user", "V"}};
    check_render(t, conv, 4, true, FM_THINK_DEFAULT, "<s> [INST] S\n\nU [/INST] A</s> [INST] V [/INST]", NULL);
    const fm_chat_msg first_assistant[] = {{"assistant", "A"}, {"user", "U"}};
    check_render(t, first_assistant, 2, true, FM_THINK_DEFAULT, NULL,
                 "After the optional system message, conversation roles must alternate "
                 "user/assistant/user/assistant/...");
    fm_chat_template_free(t);
    t = load(MIXTRAL_2023_DIR, NULL);
    check_render(t, conv + 1, 3, true, FM_THINK_DEFAULT, "<s>[INST] U [/INST]A</s>[INST] V [/INST]", NULL);
    check_render(t, conv, 4, true, FM_THINK_DEFAULT, NULL,
                 "Conversation roles must alternate user/assistant/user/assistant/...");
    fm_chat_template_free(t);
    t = load(NULL, CHATML_FILE);
    check_render(t, conv, 2, true, FM_THINK_DEFAULT,
                 "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n", NULL);
    fm_chat_template_free(t);
}

/* Every case of golden.json (made by transformers), rendered byte for byte as transformers rendered it. */
static void test_golden(void **state) {
    (void)state;
    char *text = read_all(FIXTURES "/golden.json");
    cJSON *root = cJSON_Parse(text);
    free(text);
    assert_non_null(root);
    const cJSON *cases = cJSON_GetObjectItemCaseSensitive(root, "cases");
    assert_true(cJSON_IsArray(cases) && cJSON_GetArraySize(cases) > 0);
    int n_text = 0, n_error = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cases) {
        char dir[256];
        snprintf(dir, sizeof dir, FIXTURES "/%s", cJSON_GetObjectItemCaseSensitive(c, "fixture")->valuestring);
        fm_chat_template *t = load(dir, NULL);
        const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(c, "messages");
        const int32_t n = (int32_t)cJSON_GetArraySize(msgs);
        fm_chat_msg *m = calloc((size_t)n + 1, sizeof *m);
        assert_non_null(m);
        for (int32_t i = 0; i < n; i++) {
            const cJSON *e = cJSON_GetArrayItem(msgs, i);
            m[i].role = cJSON_GetObjectItemCaseSensitive(e, "role")->valuestring;
            m[i].content = cJSON_GetObjectItemCaseSensitive(e, "content")->valuestring;
        }
        const bool gen = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "add_generation_prompt"));
        const cJSON *th = cJSON_GetObjectItemCaseSensitive(c, "enable_thinking");
        const fm_chat_think think = cJSON_IsTrue(th)    ? FM_THINK_ON
                                    : cJSON_IsFalse(th) ? FM_THINK_OFF
                                                        : FM_THINK_DEFAULT;
        const cJSON *want = cJSON_GetObjectItemCaseSensitive(c, "text");
        const cJSON *want_error = cJSON_GetObjectItemCaseSensitive(c, "error");
        snprintf(g_case, sizeof g_case, "golden case %s: %s (generation prompt %d, thinking %d)", dir + sizeof FIXTURES,
                 cJSON_GetObjectItemCaseSensitive(c, "conversation")->valuestring, gen, (int)think);
        check_render(t, m, n, gen, think, cJSON_IsString(want) ? want->valuestring : NULL,
                     cJSON_IsString(want_error) ? want_error->valuestring : NULL);
        n_text += cJSON_IsString(want), n_error += cJSON_IsString(want_error);
        free(m);
        fm_chat_template_free(t);
    }
    g_case[0] = 0;
    fprintf(stderr, "golden: %d renderings and %d refusals equal to transformers'\n", n_text, n_error);
    cJSON_Delete(root);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_language_against_jinja2),
        cmocka_unit_test(test_real_templates_against_jinja2),
        cmocka_unit_test(test_sandbox_limits_and_refusals),
        cmocka_unit_test(test_named_template_list),
        cmocka_unit_test(test_template_files),
        cmocka_unit_test(test_missing_template),
        cmocka_unit_test(test_stop_tokens),
        cmocka_unit_test(test_qwen3_by_hand),
        cmocka_unit_test(test_mistral_and_chatml_by_hand),
        cmocka_unit_test(test_golden),
    };
    return cmocka_run_group_tests(tests, make_dir, remove_dir);
}
