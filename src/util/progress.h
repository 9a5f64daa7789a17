/* One progress line on stderr, rewritten in place, only when stderr is a terminal (never in a log or a pipe).
 * Every other message on stderr ends the line first (fm_progress_end), so nothing is glued to it. */
#ifndef FM_UTIL_PROGRESS_H
#define FM_UTIL_PROGRESS_H

#include "util/status.h"

/* Replaces the progress line with the formatted text (no newline); nothing when stderr is not a terminal. */
void fm_progress(const char *fmt, ...) FM_PRINTF(1, 2);
/* Clears the progress line, if one is shown, so that the next message starts on a clean line. */
void fm_progress_end(void);

#endif
