/* Regular expressions that come from checkpoints (compressed-tensors' "re:" ignore entries), matched as Python's
 * re.match does: anchored at the start of the subject, not at its end. The engine is PCRE2 with bounds, because a
 * pattern is untrusted input: at most FM_REGEX_MAX_PATTERN bytes, and a match that exceeds PCRE2's match, depth or
 * heap limits (catastrophic backtracking) is refused rather than left to run. */
#ifndef FM_IO_CKPT_REGEX_H
#define FM_IO_CKPT_REGEX_H

#include <stdbool.h>

#include "fp8moe.h"

#define FM_REGEX_MAX_PATTERN 1024

/* Compiles pattern and, when subject is not NULL, matches it: *hit says whether it matched. A pattern that is too long
 * or does not compile, or a match past the limits, is FM_ERR_UNSUPPORTED with a message naming the pattern (the
 * caller prefixes the file and field). */
fm_status fm_regex_match(const char *pattern, const char *subject, bool *hit, fm_error *err);

#endif
