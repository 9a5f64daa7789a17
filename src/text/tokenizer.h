/* Text to token ids and back, from a model's tokenizer.json (the Hugging Face `tokenizers` format).
 *
 * Families: byte-level BPE (Qwen2/Qwen3, GPT-2: NFC normalizer, Split + ByteLevel pre-tokenizers, ByteLevel decoder)
 * and Llama/Mistral-style BPE (Prepend/Replace normalizers or Metaspace, byte_fallback, Replace/ByteFallback/Fuse/
 * Strip decoders). Added and special tokens are matched before BPE; merges apply by rank. Anything else in a
 * tokenizer.json is refused by name (FM_ERR_UNSUPPORTED). */
#ifndef FM_TEXT_TOKENIZER_H
#define FM_TEXT_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fp8moe.h"

typedef struct fm_tokenizer fm_tokenizer;

/* Loads DIR/tokenizer.json (and DIR/tokenizer_config.json when present, for bos/eos names and add_bos_token). */
fm_status fm_tokenizer_load(const char *dir, fm_tokenizer **out, fm_error *err);
void fm_tokenizer_free(fm_tokenizer *t);

/* Encodes len bytes of text (need not be valid UTF-8: invalid bytes are encoded as the tokenizer does, U+FFFD or
 * byte tokens). add_special: the post-processor's special tokens (a Llama/Mistral <s>), as `tokenizers`'
 * encode(text, add_special_tokens=True) does. parse_special: added/special tokens written in the text become their
 * ids (as `tokenizers` does); false treats them as plain text (user content that must not inject control tokens).
 * *ids is malloc'd (free with free()). */
fm_status fm_tokenizer_encode(const fm_tokenizer *t, const char *text, size_t len, bool add_special, bool parse_special,
                              int32_t **ids, int64_t *n, fm_error *err);

/* Decodes ids to text as `tokenizers`' decode(ids, skip_special_tokens=skip_special); *text is malloc'd and
 * NUL-terminated, *len its bytes. An id outside the vocabulary is FM_ERR_FORMAT. */
fm_status fm_tokenizer_decode(const fm_tokenizer *t, const int32_t *ids, int64_t n, bool skip_special, char **text,
                              size_t *len, fm_error *err);

int32_t fm_tokenizer_vocab_size(const fm_tokenizer *t);
/* The id of a token's exact string (an added token such as "<|im_end|>", or a vocabulary entry); -1 when none. */
int32_t fm_tokenizer_token_id(const fm_tokenizer *t, const char *token);
/* True for added tokens marked special. */
bool fm_tokenizer_is_special(const fm_tokenizer *t, int32_t id);

/* Streaming detokenizer: ids in one at a time, text out as soon as it is complete UTF-8 (never half a character;
 * what a later id may still change is held back). */
typedef struct fm_detok fm_detok;
fm_status fm_detok_create(const fm_tokenizer *t, bool skip_special, fm_detok **out, fm_error *err);
void fm_detok_free(fm_detok *d);
/* Appends id; returns the newly completed text (NUL-terminated, valid until the next call on d; "" when none). */
const char *fm_detok_push(fm_detok *d, int32_t id);
/* The text still held back at the end of the stream (incomplete UTF-8 becomes U+FFFD, as `tokenizers` decodes). */
const char *fm_detok_flush(fm_detok *d);

#endif
