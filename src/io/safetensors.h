/* safetensors reader: memory-mapped, validated before any use.
 *
 * File layout: u64 little-endian N, N bytes of JSON header, then the data region. Validation follows
 * the reference reader (huggingface/safetensors tensor.rs) with 64-bit overflow checks:
 *   - file >= 8 bytes; N <= FM_ST_MAX_HEADER; 8 + N <= file size
 *   - header is well-formed JSON: an object of name -> {dtype, shape, data_offsets}, plus "__metadata__"
 *     (an object of strings), nothing else
 *   - dtype is one fp8moe reads (F32 F16 BF16 F8_E4M3 I32 U8 I64); any other is rejected by name
 *   - shape entries are non-negative integers, at most FM_ST_MAX_DIMS of them
 *   - byte length = product(shape) x dtype size; offsets sorted are contiguous from 0, no gap, no
 *     overlap, and the last one ends exactly at the end of the file
 * A sharded checkpoint (model.safetensors.index.json) is a set of such files plus a weight_map that
 * must agree with them: every mapped tensor present in its shard, no tensor in two shards, shard names
 * plain file names (no directories). */
/* Details settled by the implementation (safetensors.c):
 *   - JSON text (header or index) must be strict UTF-8 with no NUL byte and no \u0000 escape (names are C
 *     strings); only JSON whitespace may follow the top-level object (space padding ok, NUL padding not).
 *   - an entry has exactly the keys dtype, shape, data_offsets (each once); a key twice anywhere (tensor,
 *     __metadata__, metadata key, weight_map entry) is an error. Integers are JSON numbers that are exact
 *     integers in [0, 2^53]; cJSON keeps only the value, so 1.0 or 1e1 are read as 1 and 10.
 *   - rank 0 ([] = one element) and empty tensors (a 0 dimension, 0 bytes) are allowed.
 *   - status codes: FM_ERR_FORMAT for malformed input; FM_ERR_UNSUPPORTED for a well-formed safetensors
 *     dtype fp8moe does not read (F64, I64, ...) and for more than FM_ST_MAX_DIMS dimensions (a string that
 *     is no safetensors dtype at all is FM_ERR_FORMAT); FM_ERR_IO for files that cannot be opened, mapped
 *     or read (a missing shard, a directory where a file is expected, neither checkpoint file present).
 *   - messages are one line: the file (label) first, then the tensor in quotes, then expected vs actual;
 *     quoted names are cut at 160 bytes and control characters shown as '?'. */
#ifndef FM_IO_SAFETENSORS_H
#define FM_IO_SAFETENSORS_H

#include <stdint.h>

#include "fp8moe.h"

#define FM_ST_MAX_HEADER (100u * 1000u * 1000u) /* bytes, as the reference reader */
#define FM_ST_MAX_DIMS 8

typedef enum fm_dtype {
    FM_DTYPE_F32,
    FM_DTYPE_F16,
    FM_DTYPE_BF16,
    FM_DTYPE_F8_E4M3,
    FM_DTYPE_I32,
    FM_DTYPE_U8,
    FM_DTYPE_I64, /* compressed-tensors weight_shape */
    FM_DTYPE_COUNT
} fm_dtype;

const char *fm_dtype_name(fm_dtype t); /* the safetensors spelling, "BF16" */
int fm_dtype_size(fm_dtype t);         /* bytes per element */

typedef struct fm_st_tensor {
    char *name;
    fm_dtype dtype;
    int32_t n_dims;
    int64_t shape[FM_ST_MAX_DIMS];
    int64_t n_elements;
    const uint8_t *data; /* points into the mapping */
    uint64_t nbytes;
    int32_t file; /* index of the file in its fm_st_set */
} fm_st_tensor;

typedef struct fm_st_file {
    char *path;
    uint8_t *map; /* whole file (mmap) or NULL for an in-memory parse */
    uint64_t size;
    fm_st_tensor *tensors;
    int64_t n_tensors;
} fm_st_file;

/* Parses and validates buf[0..size) (a whole safetensors file). label names the file in messages.
 * Tensor data pointers point into buf, which must outlive out. Used directly by the fuzzer. */
fm_status fm_st_parse(const uint8_t *buf, uint64_t size, const char *label, fm_st_file *out, fm_error *err);
/* open + fstat + read-only private mmap + fm_st_parse; on failure *out is all zero and nothing is mapped.
 * Closing (either function) twice is harmless. */
fm_status fm_st_open_file(const char *path, fm_st_file *out, fm_error *err);
void fm_st_close_file(fm_st_file *f);

/* All tensors of a checkpoint directory: model.safetensors, or model.safetensors.index.json and its shards. */
typedef struct fm_st_set {
    fm_st_file *files;
    int32_t n_files;
    const fm_st_tensor **by_name; /* all tensors, sorted by name */
    int64_t n_tensors;
} fm_st_set;

/* dir/model.safetensors.index.json when it exists (each shard opened once), else dir/model.safetensors.
 * by_name is sorted by strcmp; tensor.file indexes files. On failure *out is all zero. */
fm_status fm_st_open_dir(const char *dir, fm_st_set *out, fm_error *err);
/* Validates a shard index given as JSON text (used by fm_st_open_dir and the fuzzer): fills the list of
 * distinct shard file names, sorted by strcmp (caller frees each and the array), after checking the
 * weight_map's shape: a non-empty object of tensor name -> shard file name, each a plain name (no '/',
 * ending in .safetensors). On failure *shards is NULL and *n_shards 0. */
fm_status fm_st_parse_index(const char *json, uint64_t len, const char *label, char ***shards, int32_t *n_shards,
                            fm_error *err);
const fm_st_tensor *fm_st_find(const fm_st_set *s, const char *name);
void fm_st_close(fm_st_set *s);

/* Decodes n elements starting at element offset first of a float tensor (F32, F16, BF16, F8_E4M3) to fp32
 * (little-endian, any alignment). FM_ERR_USAGE when [first, first + n) is not inside the tensor;
 * FM_ERR_UNSUPPORTED for I32 and U8 tensors. */
fm_status fm_st_read_f32(const fm_st_tensor *t, int64_t first, int64_t n, float *out, fm_error *err);

/* Elements [first, first + n) of a float tensor (F32 F16 BF16 F8_E4M3) are finite: a NaN or infinity (a corrupt
 * checkpoint, which every later format would turn into clean-looking numbers) is FM_ERR_FORMAT naming the tensor and
 * the first bad element. Reads the stored bits only (no conversion); other dtypes pass. */
fm_status fm_st_check_finite(const fm_st_tensor *t, int64_t first, int64_t n, fm_error *err);

#endif
