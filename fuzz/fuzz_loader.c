/* libFuzzer target for the checkpoint parsers (`make fuzz-run`).
 *
 * The first input byte selects the parser, the rest is its input:
 *   byte % 3 == 0: a safetensors file (fm_st_parse), then every float tensor read back through fm_st_read_f32,
 *                  plus a few out-of-range reads that must fail;
 *   byte % 3 == 1: a shard index, model.safetensors.index.json (fm_st_parse_index);
 *   byte % 3 == 2: config.json (fm_config_parse), then its quantization_config.ignore list on a module name.
 * Seeds in fuzz/seeds/ carry that leading byte (0x00 / 0x01 / 0x02). Every result is freed, so the leak
 * checker sees any path that forgets to. A parser that accepts input must leave consistent results: the
 * checks below abort (a finding) when they do not. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/config.h"
#include "io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "fuzz_loader: invariant broken: %s\n", what);
        abort();
    }
}

/* A message must be set, one line, and NUL-terminated inside the buffer. */
static void check_msg(const fm_error *err) {
    size_t n = strnlen(err->msg, sizeof err->msg);
    check(n > 0 && n < sizeof err->msg, "error message empty or unterminated");
    check(memchr(err->msg, '\n', n) == NULL, "error message has a newline");
}

static void fuzz_safetensors(const uint8_t *buf, size_t size) {
    fm_st_file f;
    fm_error err = {{0}};
    if (fm_st_parse(buf, size, "fuzz.safetensors", &f, &err) != FM_OK) {
        check_msg(&err);
        check(f.tensors == NULL && f.path == NULL, "failed parse left results");
        return;
    }
    float *out = NULL;
    uint64_t covered = 0;
    for (int64_t i = 0; i < f.n_tensors; i++) {
        const fm_st_tensor *t = &f.tensors[i];
        check(t->data >= buf && t->data + t->nbytes <= buf + size, "tensor data outside the buffer");
        check(t->nbytes == (uint64_t)t->n_elements * (uint64_t)fm_dtype_size(t->dtype), "nbytes != elements x size");
        check(t->n_dims >= 0 && t->n_dims <= FM_ST_MAX_DIMS, "n_dims out of range");
        covered += t->nbytes;
        int is_float = t->dtype == FM_DTYPE_F32 || t->dtype == FM_DTYPE_F16 || t->dtype == FM_DTYPE_BF16 ||
                       t->dtype == FM_DTYPE_F8_E4M3;
        if (is_float && t->n_elements > 0) {
            float *o = realloc(out, (size_t)t->n_elements * sizeof *o);
            check(o != NULL, "out of memory");
            out = o;
            check(fm_st_read_f32(t, 0, t->n_elements, out, &err) == FM_OK, "read of a whole float tensor failed");
            int64_t first_bad = -1; /* the finiteness check on the stored bits agrees with the decoded values */
            for (int64_t j = 0; j < t->n_elements && first_bad < 0; j++)
                if (!isfinite(out[j])) first_bad = j;
            check((fm_st_check_finite(t, 0, t->n_elements, &err) == FM_OK) == (first_bad < 0),
                  "finiteness check disagrees with the decoded values");
            if (t->n_elements > 1) {
                check(fm_st_read_f32(t, t->n_elements - 1, 1, out, &err) == FM_OK, "read of the last element failed");
            }
        } else if (!is_float) {
            check(fm_st_read_f32(t, 0, t->n_elements, out, &err) == FM_ERR_UNSUPPORTED,
                  "read of an integer tensor accepted");
        }
        check(fm_st_read_f32(t, t->n_elements, 1, out, &err) != FM_OK, "read past the end accepted");
        check(fm_st_read_f32(t, -1, 1, out, &err) != FM_OK, "read before the start accepted");
        check(fm_st_read_f32(t, 1, INT64_MAX, out, &err) != FM_OK, "overflowing read accepted");
    }
    /* contiguity: the tensors cover the data region exactly, so their sizes add up to it */
    if (f.n_tensors > 0) {
        uint64_t hlen = 0;
        for (int k = 7; k >= 0; k--) hlen = (hlen << 8) | buf[k];
        check(covered == size - 8 - hlen, "tensors do not cover the data region");
    }
    free(out);
    fm_st_close_file(&f);
}

static void fuzz_index(const uint8_t *buf, size_t size) {
    char **shards = NULL;
    int32_t n = 0;
    fm_error err = {{0}};
    if (fm_st_parse_index((const char *)buf, size, "fuzz.index.json", &shards, &n, &err) != FM_OK) {
        check_msg(&err);
        check(shards == NULL && n == 0, "failed index parse left results");
        return;
    }
    check(n > 0, "accepted index has no shards");
    for (int32_t i = 0; i < n; i++) {
        check(strchr(shards[i], '/') == NULL, "shard name with '/' accepted");
        if (i > 0) check(strcmp(shards[i - 1], shards[i]) < 0, "shard names not sorted and distinct");
    }
    for (int32_t i = 0; i < n; i++) free(shards[i]);
    free(shards);
}

static void fuzz_config(const uint8_t *buf, size_t size) {
    static fm_config cfg; /* large (per-layer flags): not on the stack */
    static int warned;
    fm_error err = {{0}};
    if (fm_config_parse((const char *)buf, size, "fuzz.config.json", &cfg, &err) == FM_OK) {
        bool hit = false; /* the ignore list's regexes, on a module name: bounded, whatever the pattern */
        fm_quant_config_ignores(&cfg.quant, "model.layers.0.mlp.experts.0.gate_proj", &hit, &err);
        return;
    }
    size_t n = strnlen(err.msg, sizeof err.msg);
    check(n > 0 && n < sizeof err.msg, "config: error message empty or unterminated");
    /* A multi-line message is a defect (messages are one line) but not a memory error: reported once per run
     * so that fuzzing goes on looking for crashes. FUZZ_STRICT_MESSAGES=1 makes it a finding. */
    if (memchr(err.msg, '\n', n)) {
        if (getenv("FUZZ_STRICT_MESSAGES")) check(0, "config: error message has a newline");
        if (!warned) fprintf(stderr, "fuzz_loader: note: fm_config_parse message with a newline: %s\n", err.msg);
        warned = 1;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const uint8_t *rest = data + 1;
    size_t n = size - 1;
    switch (data[0] % 3) {
    case 0: fuzz_safetensors(rest, n); break;
    case 1: fuzz_index(rest, n); break;
    default: fuzz_config(rest, n); break;
    }
    return 0;
}
