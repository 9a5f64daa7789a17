/* Presets -> precision plans, and the backend factory. */
#include <string.h>

#include "backend/backend.h"
#include "backend/backend_kind.h"
#include "util/status.h"

const char *fm_wformat_name(fm_wformat f) {
    switch (f) {
    case FM_W_F32: return "f32";
    case FM_W_BF16: return "bf16";
    case FM_W_INT4_G128: return "int4-g128";
    case FM_W_INT4_G128_TC: return "int4-g128-tc";
    case FM_W_E4M3_PT: return "e4m3-tensor";
    case FM_W_INT4_ZP: return "int4-zp";
    case FM_W_INT4_ZP_TC: return "int4-zp-tc";
    case FM_W_E4M3_B128: return "e4m3-block";
    }
    return "?";
}

const char *fm_afmt_name(fm_afmt f) {
    switch (f) {
    case FM_A_NATIVE: return "native";
    case FM_A_E4M3_G128: return "e4m3-1x128";
    case FM_A_MXFP4: return "mxfp4";
    case FM_A_NVFP4: return "nvfp4";
    case FM_A_E4M3_PT: return "e4m3-tensor";
    case FM_A_E4M3_ROW: return "e4m3-row";
    }
    return "?";
}

const char *fm_dense_name(fm_dense d) { return d == FM_DENSE_W8A8 ? "w8a8" : "preset"; }

const char *fm_lm_head_name(fm_lm_head h) { return h == FM_LM_HEAD_DENSE ? "dense" : "float"; }

bool fm_lm_head_parse(const char *name, fm_lm_head *out) {
    if (strcmp(name, "float") == 0) *out = FM_LM_HEAD_FLOAT;
    else if (strcmp(name, "dense") == 0) *out = FM_LM_HEAD_DENSE;
    else return false;
    return true;
}

const char *fm_int4_scales_name(fm_int4_scales s) { return s == FM_INT4_SCALES_P2 ? "p2" : "g128"; }

bool fm_int4_scales_parse(const char *name, fm_int4_scales *out) {
    if (strcmp(name, "g128") == 0) *out = FM_INT4_SCALES_G128;
    else if (strcmp(name, "p2") == 0) *out = FM_INT4_SCALES_P2;
    else return false;
    return true;
}

static const char *const dispatch_names[] = {"preset", "bf16", "fp8", "mxfp4", "nvfp4"};

const char *fm_dispatch_name(fm_dispatch d) {
    return (unsigned)d < sizeof dispatch_names / sizeof *dispatch_names ? dispatch_names[d] : "?";
}

bool fm_dispatch_parse(const char *name, fm_dispatch *out) {
    for (int i = 0; i < (int)(sizeof dispatch_names / sizeof *dispatch_names); i++)
        if (strcmp(name, dispatch_names[i]) == 0) {
            *out = (fm_dispatch)i;
            return true;
        }
    return false;
}

bool fm_dense_parse(const char *name, fm_dense *out) {
    if (strcmp(name, "w8a8") == 0) *out = FM_DENSE_W8A8;
    else if (strcmp(name, "preset") == 0) *out = FM_DENSE_PRESET;
    else return false;
    return true;
}

static const char *const experts_in_names[] = {"device", "host", "auto"};

const char *fm_experts_in_name(fm_experts_in w) {
    return (unsigned)w < sizeof experts_in_names / sizeof *experts_in_names ? experts_in_names[w] : "?";
}

bool fm_experts_in_parse(const char *name, fm_experts_in *out) {
    for (int i = 0; i < (int)(sizeof experts_in_names / sizeof *experts_in_names); i++)
        if (strcmp(name, experts_in_names[i]) == 0) {
            *out = (fm_experts_in)i;
            return true;
        }
    return false;
}

static const char *const policy_names[] = {"lru", "lfu"};

const char *fm_expert_policy_name(fm_expert_policy p) {
    return (unsigned)p < sizeof policy_names / sizeof *policy_names ? policy_names[p] : "?";
}

bool fm_expert_policy_parse(const char *name, fm_expert_policy *out) {
    for (int i = 0; i < (int)(sizeof policy_names / sizeof *policy_names); i++)
        if (strcmp(name, policy_names[i]) == 0) {
            *out = (fm_expert_policy)i;
            return true;
        }
    return false;
}

static const char *const kv_dtype_names[] = {"auto", "e4m3"};

const char *fm_kv_dtype_name(fm_kv_dtype d) {
    return (unsigned)d < sizeof kv_dtype_names / sizeof *kv_dtype_names ? kv_dtype_names[d] : "?";
}

bool fm_kv_dtype_parse(const char *name, fm_kv_dtype *out) {
    for (int i = 0; i < (int)(sizeof kv_dtype_names / sizeof *kv_dtype_names); i++)
        if (strcmp(name, kv_dtype_names[i]) == 0) {
            *out = (fm_kv_dtype)i;
            return true;
        }
    return false;
}

static const char *const preset_names[FM_PRESET_COUNT] = {"ref", "int4", "fp8", "fp4", "ref32"};

const char *fm_preset_name(fm_preset p) { return (unsigned)p < FM_PRESET_COUNT ? preset_names[p] : "?"; }

bool fm_preset_parse(const char *name, fm_preset *out) {
    for (int i = 0; i < FM_PRESET_COUNT; i++)
        if (strcmp(name, preset_names[i]) == 0) {
            *out = (fm_preset)i;
            return true;
        }
    return false;
}

void fm_plan_from_preset(fm_preset p, fm_plan *plan) {
    memset(plan, 0, sizeof *plan);
    plan->preset = p;
    if (p == FM_PRESET_REF || p == FM_PRESET_REF32) {
        *plan = (fm_plan){p,           false,    FM_W_F32, FM_A_NATIVE, FM_W_F32, FM_A_NATIVE,
                          FM_A_NATIVE, FM_W_F32, false,    FM_KV_ACT,   false};
        return;
    }
    /* every quantized preset: int4 linear weights, bf16 activations and bf16 for the other weights */
    *plan = (fm_plan){p,           true,      FM_W_INT4_G128, FM_A_NATIVE, FM_W_INT4_G128, FM_A_NATIVE,
                      FM_A_NATIVE, FM_W_BF16, false,          FM_KV_ACT,   false};
    if (p == FM_PRESET_FP8 || p == FM_PRESET_FP4) {
        plan->a_dense = FM_A_E4M3_G128;
        plan->a_dispatch = p == FM_PRESET_FP4 ? FM_A_MXFP4 : FM_A_E4M3_G128;
        plan->a_expert = FM_A_E4M3_G128;
    }
}

void fm_plan_for_backend(fm_preset p, const char *backend, fm_plan *plan) {
    fm_plan_from_preset(p, plan);
    if (!backend || strcmp(backend, "cuda") != 0) return;
    if (p == FM_PRESET_REF) { /* ref32 keeps the fp32 plan: the CUDA backend's fp32 activations, cuda_backend.cu */
        plan->act_bf16 = true;
        plan->w_dense = plan->w_expert = plan->w_other = FM_W_BF16;
    } else if (p == FM_PRESET_FP8 || p == FM_PRESET_FP4) {
        /* W4A8: the int4 banks in the tensor-core layout, the grouped expert kernel and W4A8 dense projections (fp4:
           the same, its MXFP4 dispatch buffer expanded to e4m3 in the gate|up GEMM) */
        plan->w_dense = plan->w_expert = FM_W_INT4_G128_TC;
    }
}

fm_native_int4 fm_bank_src_native_int4(const fm_bank_src *src) {
    int least = FM_NATIVE_YES; /* each source's codes are read once: on every core */
#pragma omp parallel for schedule(dynamic, 1) reduction(min : least)
    for (int64_t i = 0; i < (int64_t)src->n * src->n_parts; i++) {
        const fm_wsrc *s = &src->srcs[i];
        const fm_native_int4 v = fm_wsrc_is_quantized(s) ? fm_qsrc_native_int4(&s->q, s->rows, s->cols) : FM_NATIVE_NO;
        if ((int)v < least) least = (int)v;
    }
    return (fm_native_int4)least;
}

bool fm_bank_src_any_quantized(const fm_bank_src *src) {
    for (int64_t i = 0; i < (int64_t)src->n * src->n_parts; i++)
        if (fm_wsrc_is_quantized(&src->srcs[i])) return true;
    return false;
}

void fm_plan_set_dense(fm_plan *plan, fm_dense dense) {
    if (dense == FM_DENSE_W8A8) plan->w_dense = FM_W_E4M3_PT, plan->a_dense = FM_A_E4M3_PT;
}

fm_status fm_plan_set_lm_head(fm_plan *plan, fm_lm_head h, fm_error *err) {
    if (h == FM_LM_HEAD_FLOAT) return FM_OK;
    if ((unsigned)h > FM_LM_HEAD_DENSE) return fm_fail(err, FM_ERR_USAGE, "--lm-head: unknown form %d", (int)h);
    if (plan->w_dense == plan->w_other)
        return fm_fail(err, FM_ERR_USAGE,
                       "--lm-head dense: the %s preset's dense projections are %s like its lm_head, so nothing would "
                       "change; it applies to int4, fp8, fp4 and --dense w8a8",
                       fm_preset_name(plan->preset), fm_wformat_name(plan->w_dense));
    plan->lm_head_dense = true;
    return FM_OK;
}

fm_status fm_plan_set_int4_scales(fm_plan *plan, fm_int4_scales s, fm_error *err) {
    if (s == FM_INT4_SCALES_G128) return FM_OK;
    if (!fm_wformat_is_int4(plan->w_dense) && !fm_wformat_is_int4(plan->w_expert))
        return fm_fail(err, FM_ERR_USAGE,
                       "--int4-scales %s: the %s preset quantizes no weights to int4 here; it applies to int4, fp8 "
                       "and fp4",
                       fm_int4_scales_name(s), fm_preset_name(plan->preset));
    plan->int4_p2 = true;
    return FM_OK;
}

fm_status fm_plan_set_kv(fm_plan *plan, fm_kv_dtype kv, fm_error *err) {
    if (kv == FM_KV_E4M3 && !plan->act_bf16)
        return fm_fail(err, FM_ERR_USAGE,
                       "--kv-cache e4m3: the %s preset here keeps fp32 activations (the oracle); e4m3 codes stand in "
                       "for bf16 keys and values (ref on cuda, int4, fp8, fp4)",
                       fm_preset_name(plan->preset));
    if ((unsigned)kv > FM_KV_E4M3) return fm_fail(err, FM_ERR_USAGE, "--kv-cache: unknown format %d", (int)kv);
    plan->kv = kv;
    return FM_OK;
}

fm_status fm_plan_set_dispatch(fm_plan *plan, fm_dispatch d, fm_error *err) {
    if (d == FM_DISPATCH_PRESET) return FM_OK;
    if (plan->preset == FM_PRESET_REF || plan->preset == FM_PRESET_REF32)
        return fm_fail(err, FM_ERR_USAGE,
                       "--dispatch %s: the %s preset is the oracle (fp32 throughout); --dispatch applies to int4, fp8 "
                       "and fp4",
                       fm_dispatch_name(d), fm_preset_name(plan->preset));
    static const fm_afmt afmt[] = {FM_A_NATIVE, FM_A_NATIVE, FM_A_E4M3_G128, FM_A_MXFP4, FM_A_NVFP4};
    if ((unsigned)d >= sizeof afmt / sizeof *afmt)
        return fm_fail(err, FM_ERR_USAGE, "--dispatch: unknown format %d", (int)d);
    plan->a_dispatch = afmt[d];
    return FM_OK;
}

fm_status fm_backend_create(const char *name, const fm_plan *plan, int32_t n_threads, const char *routes,
                            fm_backend **out, fm_error *err) {
    *out = NULL;
    const fm_backend_kind *kind = fm_backend_kind_find(name ? name : "cpu");
    if (!kind) return fm_fail(err, FM_ERR_USAGE, "unknown backend '%s' (choose cpu or cuda)", name);
    return kind->create(plan, n_threads, routes, out, err);
}

bool fm_backend_on_device(const char *name) {
    const fm_backend_kind *kind = fm_backend_kind_find(name);
    return kind && kind->on_device;
}

fm_status fm_backend_free_memory(const char *name, size_t *free_bytes, size_t *total, fm_error *err) {
    const fm_backend_kind *kind = fm_backend_kind_find(name);
    if (!kind || !kind->free_memory)
        return fm_fail(err, FM_ERR_USAGE, "the %s backend has no device memory", name ? name : "(null)");
    return kind->free_memory(free_bytes, total, err);
}
