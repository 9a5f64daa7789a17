/* Pre-quantized fixtures and their fp32 twins (quant_fixture.h). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "quant_fixture.h"

void quant_fixture_open(quant_fixture *f, const char *data_dir, const char *name) {
    memset(f, 0, sizeof *f);
    char ddir[300];
    snprintf(f->dir, sizeof f->dir, "%s/%s", data_dir, name);
    snprintf(ddir, sizeof ddir, "%s/dequant", f->dir);
    fm_error err = {{0}};
    if (fm_config_load(f->dir, &f->qcfg, &err) || fm_config_load(ddir, &f->dcfg, &err) ||
        fm_st_open_dir(f->dir, &f->qset, &err) || fm_st_open_dir(ddir, &f->dset, &err))
        fail_msg("open %s: %s", f->dir, err.msg);
    if (fm_model_src_bind(&f->qcfg, &f->qset, &f->qs, &err)) fail_msg("bind %s: %s", f->dir, err.msg);
    if (fm_model_src_bind(&f->dcfg, &f->dset, &f->ds, &err)) fail_msg("bind %s: %s", ddir, err.msg);
}

void quant_fixture_close(quant_fixture *f) {
    fm_model_src_free(&f->qs);
    fm_model_src_free(&f->ds);
    fm_st_close(&f->qset);
    fm_st_close(&f->dset);
}

bool quant_ignores(const fm_quant_config *q, const char *module) {
    bool hit = false;
    fm_error err = {{0}};
    fm_status st = fm_quant_config_ignores(q, module, &hit, &err);
    if (st) fail_msg("fm_quant_config_ignores('%s'): %s", module, err.msg);
    return hit;
}
