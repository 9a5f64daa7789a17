/* One line per request on stderr, when it is over (answered, streamed to its end, or the client gone):
 *   fp8moe serve: request id=chatcmpl-... POST /v1/chat/completions status=200 prompt_tokens=12 cached_tokens=0
 *     completion_tokens=10 ttft_ms=12.3 total_ms=153.0 finish=length
 * (one line). The path is written with anything but printable ASCII as %XX, at most 120 bytes of it. */
#include <stdio.h>

#include "serve/serve_internal.h"

void access_log_format(sbuf *o, const access_entry *a) {
    sb_printf(o, "fp8moe serve: request id=%s %s ", a->id && a->id[0] ? a->id : "-", a->method ? a->method : "-");
    const char *p = a->path ? a->path : "-";
    for (int i = 0; p[i] && i < 120; i++) {
        const unsigned char c = (unsigned char)p[i];
        if (c > 0x20 && c < 0x7F && c != '%') sb_put(o, p + i, 1);
        else sb_printf(o, "%%%02X", c);
    }
    sb_printf(o, " status=%d", a->status);
    if (a->generation)
        sb_printf(o, " prompt_tokens=%lld cached_tokens=%lld completion_tokens=%lld", (long long)a->prompt_tokens,
                  (long long)a->cached_tokens, (long long)a->completion_tokens);
    if (a->ttft_s >= 0) sb_printf(o, " ttft_ms=%.1f", 1e3 * a->ttft_s);
    sb_printf(o, " total_ms=%.1f", 1e3 * a->total_s);
    if (a->finish) sb_printf(o, " finish=%s", a->finish);
    sb_puts(o, "\n");
}

void access_log_write(const access_entry *a) {
    sbuf o = {0};
    access_log_format(&o, a);
    fputs(o.p, stderr); /* one write of the whole line: lines of concurrent requests do not interleave */
    sb_free(&o);
}
