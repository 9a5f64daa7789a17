/* A tiny pre-quantized checkpoint of tests/data/quant and its fp32 twin (its dequant/ directory, the packer's own
 * dequantization of the same weights), opened and bound side by side for the CPU tests. */
#ifndef FM_TESTS_QUANT_FIXTURE_H
#define FM_TESTS_QUANT_FIXTURE_H

#include "model/model_src.h"

typedef struct quant_fixture {
    char dir[256];
    fm_config qcfg, dcfg;
    fm_st_set qset, dset;
    fm_model_src qs, ds; /* the quantized checkpoint and its twin */
} quant_fixture;

/* Opens data_dir/name and data_dir/name/dequant; any failure fails the test (cmocka). */
void quant_fixture_open(quant_fixture *f, const char *data_dir, const char *name);
void quant_fixture_close(quant_fixture *f);

/* Whether module is in a quantization config's ignore list; a failing lookup fails the test. */
bool quant_ignores(const fm_quant_config *q, const char *module);

#endif
