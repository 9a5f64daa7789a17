/* JSON text as fp8moe reads it (safetensors headers, shard indexes, config.json): strict UTF-8, no NUL,
 * one object and nothing but whitespace after it, parsed by cJSON from a zero-padded copy. */
#ifndef FM_IO_JSON_H
#define FM_IO_JSON_H

#include <cjson/cJSON.h>
#include <stdint.h>

#include "fp8moe.h"

/* Parses text[0..len) (not necessarily NUL-terminated) into *root (caller deletes) when it is a single JSON
 * object in which no object (at any depth) repeats a key. label and what name the file and the part of it in messages
 * ("config.json", "header"). */
fm_status fm_json_parse_object(const char *text, uint64_t len, const char *label, const char *what, cJSON **root,
                               fm_error *err);

#endif
