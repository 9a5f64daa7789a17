#include "util/progress.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <unistd.h>

static int on_terminal = -1; /* isatty(stderr), asked once */
static bool line_open;

void fm_progress(const char *fmt, ...) {
    if (on_terminal < 0) on_terminal = isatty(STDERR_FILENO);
    if (!on_terminal) return;
    va_list ap;
    va_start(ap, fmt);
    fputc('\r', stderr);
    vfprintf(stderr, fmt, ap);
    fputs("\033[K", stderr); /* the rest of a longer previous line */
    va_end(ap);
    fflush(stderr);
    line_open = true;
}

void fm_progress_end(void) {
    if (!line_open) return;
    fputs("\r\033[K", stderr);
    fflush(stderr);
    line_open = false;
}
