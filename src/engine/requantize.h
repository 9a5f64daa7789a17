/* Requantization: a float checkpoint (bf16/fp16/fp32 safetensors, single or sharded, any expert layout the binder
 * reads) written as an int4 compressed-tensors `pack-quantized` checkpoint that other engines (vLLM) read too.
 *
 * Every linear the int4 preset quantizes (attention q/k/v/o, dense MLP gate/up/down, expert gate/up/down; not the
 * embeddings, norms, router or lm_head) is quantized by our own quantizer exactly as the preset does at load
 * (fm_int4_quantize: symmetric, groups of 128 along K with a partial last group, bf16 scales rounded up, codes
 * -7..7; with p2_scales, fm_int4_p2_quantize: the same codes and groups, each row's scales one bf16 row scale times
 * powers of two) and stored per module as
 *   <m>.weight_packed I32 [N, ceil(K/8)]   q + 8 per nibble, k = 8j + i at bits 4i of word j, padding nibbles 0
 *   <m>.weight_scale  BF16 [N, ceil(K/128)]
 *   <m>.weight_shape  I64 [2] = [N, K]
 * Experts stored as 3-D banks are written per expert (<moe>.experts.E.<gate|up|down>), the names the format's
 * readers expect. Every other tensor is copied byte for byte; config.json gets a quantization_config in
 * compressed-tensors form whose ignore list names the float linears (each router, lm_head); the other files of the
 * directory (tokenizer, generation config) are copied. Loading the result binds natively (quant/int4_native.h): the
 * int4 and fp8 presets give the same logits, bit for bit, as on the float checkpoint.
 *
 * Memory: one matrix at a time in fp32, plus the bf16 scales of the output file being written (1/32 of its packed
 * bytes: the file is ordered by element size, as the reference writer does, so scales follow all packed tensors).
 * Output files are written as NAME.partial and renamed when complete; config.json is written last, so a failed run
 * never leaves a directory that loads. */
#ifndef FM_ENGINE_REQUANTIZE_H
#define FM_ENGINE_REQUANTIZE_H

#include <stdbool.h>
#include <stdint.h>

#include "fp8moe.h"

/* The quantization_config written into config.json (a cJSON object; caller deletes), ignore: n_ignore module names. */
struct cJSON *fm_requant_quant_config(const char *const *ignore, int32_t n_ignore);

#endif
