/* Held text of the streaming output parsers (held_text.h). */
#include "text/held_text.h"

#include <stdlib.h>
#include <string.h>

size_t fm_text_partial_tag(const char *s, size_t n, const char *tag) {
    const size_t L = strlen(tag);
    for (size_t h = L - 1 < n ? L - 1 : n; h > 0; h--)
        if (!memcmp(s + n - h, tag, h)) return h;
    return 0;
}

char *fm_text_join(char *stack, size_t cap, const char *hold, size_t n_hold, const char *s, size_t n) {
    char *buf = n_hold + n <= cap ? stack : malloc(n_hold + n);
    if (!buf) abort();
    memcpy(buf, hold, n_hold);
    memcpy(buf + n_hold, s, n);
    return buf;
}
