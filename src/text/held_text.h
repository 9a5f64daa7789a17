/* What the streaming output parsers (reasoning.c, tool_calls.c) share: a tail of the text held back because it may
 * begin a tag, and that tail joined with the next piece of text. */
#ifndef FM_TEXT_HELD_TEXT_H
#define FM_TEXT_HELD_TEXT_H

#include <stddef.h>

/* The longest tail of s[0..n) that is a proper prefix of tag (0: none). */
size_t fm_text_partial_tag(const char *s, size_t n, const char *tag);
/* hold[0..n_hold) then s[0..n), in stack when cap bytes hold them, else in a malloc'd buffer (free it when it is
 * not stack); aborts when out of memory (a piece of a model's output). */
char *fm_text_join(char *stack, size_t cap, const char *hold, size_t n_hold, const char *s, size_t n);

#endif
