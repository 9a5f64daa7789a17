/* quantization_config -> fm_quant_config (see quant_config.h for what is accepted). */
#include "io/quant_config.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "io/ckpt_regex.h"
#include "util/status.h"

#define MAX_GROUP (1 << 20)

typedef struct qreader {
    const char *label;
    const char *where; /* "quantization_config" or "quantization_config.config_groups.group_0.weights" */
    fm_error *err;
} qreader;

const char *fm_quant_method_name(fm_quant_method m) {
    switch (m) {
    case FM_QUANT_NONE: return "none";
    case FM_QUANT_GPTQ: return "gptq";
    case FM_QUANT_AWQ: return "awq";
    case FM_QUANT_CT_PACKED: return "compressed-tensors pack-quantized";
    case FM_QUANT_FP8_BLOCK: return "fp8 block";
    }
    return "?";
}

static const cJSON *get(const cJSON *obj, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

static fm_status get_int(const qreader *r, const cJSON *obj, const char *key, int64_t dflt, int64_t *out) {
    const cJSON *v = get(obj, key);
    if (!v) {
        *out = dflt;
        return FM_OK;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || fabs(v->valuedouble) > 1e9)
        return fm_fail(r->err, FM_ERR_FORMAT, "%s: %s.%s must be an integer", r->label, r->where, key);
    *out = (int64_t)v->valuedouble;
    return FM_OK;
}

static fm_status get_bool(const qreader *r, const cJSON *obj, const char *key, bool dflt, bool *out) {
    const cJSON *v = get(obj, key);
    if (!v) {
        *out = dflt;
        return FM_OK;
    }
    if (!cJSON_IsBool(v))
        return fm_fail(r->err, FM_ERR_FORMAT, "%s: %s.%s must be true or false", r->label, r->where, key);
    *out = cJSON_IsTrue(v);
    return FM_OK;
}

/* A string field, or dflt when absent; a non-string is FM_ERR_FORMAT. */
static fm_status get_str(const qreader *r, const cJSON *obj, const char *key, const char *dflt, const char **out) {
    const cJSON *v = get(obj, key);
    if (!v) {
        *out = dflt;
        return FM_OK;
    }
    if (!cJSON_IsString(v))
        return fm_fail(r->err, FM_ERR_FORMAT, "%s: %s.%s must be a string", r->label, r->where, key);
    *out = v->valuestring;
    return FM_OK;
}

static fm_status check_bits(const qreader *r, int64_t bits, const char *key) {
    if (bits != 4)
        return fm_fail(r->err, FM_ERR_UNSUPPORTED, "%s: %s.%s = %lld: only 4-bit weights are supported", r->label,
                       r->where, key, (long long)bits);
    return FM_OK;
}

static fm_status check_group(const qreader *r, int64_t g, const char *key, fm_quant_config *q) {
    if (g != -1 && (g < 1 || g > MAX_GROUP))
        return fm_fail(r->err, FM_ERR_FORMAT, "%s: %s.%s = %lld must be -1 (per channel) or in [1, %d]", r->label,
                       r->where, key, (long long)g, MAX_GROUP);
    q->group_size = (int32_t)g;
    return FM_OK;
}

static fm_status parse_gptq(const qreader *r, const cJSON *qc, fm_quant_config *q) {
    fm_status st;
    int64_t bits = 0, g = 0;
    const char *fmt = NULL;
    if ((st = get_int(r, qc, "bits", 4, &bits)) || (st = check_bits(r, bits, "bits")) ||
        (st = get_int(r, qc, "group_size", 128, &g)) || (st = check_group(r, g, "group_size", q)) ||
        (st = get_bool(r, qc, "sym", true, &q->sym)) || (st = get_bool(r, qc, "desc_act", false, &q->act_order)) ||
        (st = get_str(r, qc, "checkpoint_format", "gptq", &fmt)))
        return st;
    if (strcmp(fmt, "gptq") == 0) q->zero_minus_one = true;
    else if (strcmp(fmt, "gptq_v2") != 0)
        return fm_fail(r->err, FM_ERR_UNSUPPORTED,
                       "%s: %s.checkpoint_format = \"%.32s\" is not supported (gptq or gptq_v2)", r->label, r->where,
                       fmt);
    q->bits = 4;
    q->method = FM_QUANT_GPTQ;
    return FM_OK;
}

static fm_status parse_awq(const qreader *r, const cJSON *qc, fm_quant_config *q) {
    fm_status st;
    int64_t bits = 0, g = 0;
    bool zp = true;
    const char *version = NULL;
    const char *bits_key = get(qc, "w_bit") ? "w_bit" : "bits",
               *group_key = get(qc, "q_group_size") ? "q_group_size" : "group_size";
    if ((st = get_int(r, qc, bits_key, 4, &bits)) || (st = check_bits(r, bits, bits_key)) ||
        (st = get_int(r, qc, group_key, 128, &g)) || (st = check_group(r, g, group_key, q)) ||
        (st = get_bool(r, qc, "zero_point", true, &zp)) || (st = get_str(r, qc, "version", "gemm", &version)))
        return st;
    if (strcasecmp(version, "gemm") != 0)
        return fm_fail(r->err, FM_ERR_UNSUPPORTED,
                       "%s: %s.version = \"%.32s\" is not supported (only the GEMM packing)", r->label, r->where,
                       version);
    if (!zp)
        return fm_fail(r->err, FM_ERR_UNSUPPORTED,
                       "%s: %s.zero_point = false is not supported (AWQ GEMM has zero points)", r->label, r->where);
    q->bits = 4;
    q->sym = false;
    q->method = FM_QUANT_AWQ;
    return FM_OK;
}

/* Block-wise FP8 (DeepSeek-V3 / Qwen3-FP8 style): e4m3 weights with one fp32 dequantization scale per block. */
static fm_status parse_fp8(const qreader *r, const cJSON *qc, fm_quant_config *q) {
    fm_status st;
    const char *fmt = NULL, *act = NULL;
    if ((st = get_str(r, qc, "fmt", "e4m3", &fmt)) || (st = get_str(r, qc, "activation_scheme", "dynamic", &act)))
        return st;
    if (strcmp(fmt, "e4m3") != 0)
        return fm_fail(r->err, FM_ERR_UNSUPPORTED, "%s: %s.fmt = \"%.32s\" is not supported (e4m3)", r->label, r->where,
                       fmt);
    if (strcmp(act, "dynamic") != 0)
        return fm_fail(r->err, FM_ERR_UNSUPPORTED,
                       "%s: %s.activation_scheme = \"%.32s\" is not supported (dynamic: no stored activation scales)",
                       r->label, r->where, act);
    const cJSON *bs = get(qc, "weight_block_size");
    if (!bs)
        return fm_fail(r->err, FM_ERR_UNSUPPORTED,
                       "%s: %s.weight_block_size is missing: only block-wise FP8 is supported", r->label, r->where);
    if (!cJSON_IsArray(bs) || cJSON_GetArraySize(bs) != 2 || !cJSON_IsNumber(bs->child) ||
        !cJSON_IsNumber(bs->child->next))
        return fm_fail(r->err, FM_ERR_FORMAT, "%s: %s.weight_block_size must be an array of two integers", r->label,
                       r->where);
    const double bn = bs->child->valuedouble, bk = bs->child->next->valuedouble;
    if (bn != floor(bn) || bk != floor(bk) || bn < 1 || bk < 1 || bn > MAX_GROUP || bk > MAX_GROUP)
        return fm_fail(r->err, FM_ERR_FORMAT, "%s: %s.weight_block_size = [%g, %g] must hold integers in [1, %d]",
                       r->label, r->where, bn, bk, MAX_GROUP);
    q->block_n = (int32_t)bn;
    q->group_size = (int32_t)bk;
    q->bits = 8;
    q->sym = true;
    q->method = FM_QUANT_FP8_BLOCK;
    return FM_OK;
}

/* The ignore list: strings copied back to back; regexes ("re:...") compiled once here to reject bad ones. */
static fm_status parse_ignore(const qreader *r, const cJSON *list, fm_quant_config *q) {
    if (!list) return FM_OK;
    if (!cJSON_IsArray(list))
        return fm_fail(r->err, FM_ERR_FORMAT, "%s: quantization_config.ignore must be an array of strings", r->label);
    size_t used = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, list) {
        if (!cJSON_IsString(e))
            return fm_fail(r->err, FM_ERR_FORMAT, "%s: quantization_config.ignore entries must be strings", r->label);
        const size_t len = strlen(e->valuestring);
        if (used + len + 1 > sizeof q->ignore)
            return fm_fail(r->err, FM_ERR_UNSUPPORTED, "%s: quantization_config.ignore is longer than %d bytes",
                           r->label, FM_QUANT_IGNORE_BYTES);
        if (strncmp(e->valuestring, "re:", 3) == 0) {
            bool hit = false;
            fm_status st = fm_regex_match(e->valuestring + 3, NULL, &hit, r->err);
            if (st) {
                fm_error_prefix(r->err, "%s: quantization_config.ignore", r->label);
                return st;
            }
        }
        memcpy(q->ignore + used, e->valuestring, len + 1);
        used += len + 1;
        q->n_ignore++;
    }
    return FM_OK;
}

static fm_status parse_ct(const qreader *r0, const cJSON *qc, fm_quant_config *q) {
    fm_status st;
    const char *fmt = NULL, *status = NULL;
    if ((st = get_str(r0, qc, "format", NULL, &fmt)) ||
        (st = get_str(r0, qc, "quantization_status", "compressed", &status)))
        return st;
    if (!fmt || strcmp(fmt, "pack-quantized") != 0)
        return fm_fail(r0->err, FM_ERR_UNSUPPORTED,
                       "%s: quantization_config.format = \"%.40s\" is not supported (only pack-quantized int4)",
                       r0->label, fmt ? fmt : "(missing)");
    if (strcmp(status, "compressed") != 0)
        return fm_fail(
            r0->err, FM_ERR_UNSUPPORTED,
            "%s: quantization_config.quantization_status = \"%.32s\": only compressed checkpoints can be read",
            r0->label, status);
    if (get(qc, "kv_cache_scheme"))
        return fm_fail(r0->err, FM_ERR_UNSUPPORTED, "%s: quantization_config.kv_cache_scheme is not supported",
                       r0->label);
    const cJSON *groups = get(qc, "config_groups");
    if (!groups || !cJSON_IsObject(groups))
        return fm_fail(r0->err, FM_ERR_FORMAT, "%s: quantization_config.config_groups must be an object", r0->label);
    if (cJSON_GetArraySize(groups) != 1)
        return fm_fail(r0->err, FM_ERR_UNSUPPORTED,
                       "%s: quantization_config.config_groups has %d groups; only one (all Linear layers alike) is "
                       "supported",
                       r0->label, cJSON_GetArraySize(groups));
    const cJSON *grp = groups->child;
    char where[160];
    snprintf(where, sizeof where, "quantization_config.config_groups.%.64s", grp->string ? grp->string : "?");
    qreader r = {r0->label, where, r0->err};
    if (!cJSON_IsObject(grp)) return fm_fail(r.err, FM_ERR_FORMAT, "%s: %s must be an object", r.label, where);
    if (get(grp, "input_activations") || get(grp, "output_activations"))
        return fm_fail(r.err, FM_ERR_UNSUPPORTED, "%s: %s quantizes activations; only weight-only int4 is supported",
                       r.label, where);
    const cJSON *targets = get(grp, "targets");
    bool linear = false;
    const cJSON *t;
    if (targets && cJSON_IsArray(targets))
        cJSON_ArrayForEach(t, targets) linear |= cJSON_IsString(t) && strcmp(t->valuestring, "Linear") == 0;
    if (!linear)
        return fm_fail(r.err, FM_ERR_UNSUPPORTED,
                       "%s: %s.targets must include \"Linear\" (other targets are not supported)", r.label, where);
    const cJSON *w = get(grp, "weights");
    if (!w || !cJSON_IsObject(w))
        return fm_fail(r.err, FM_ERR_FORMAT, "%s: %s.weights must be an object", r.label, where);
    snprintf(where, sizeof where, "quantization_config.config_groups.%.64s.weights", grp->string ? grp->string : "?");
    int64_t bits = 0, g = 0;
    const char *type = NULL, *strategy = NULL;
    bool dynamic = false;
    if ((st = get_int(&r, w, "num_bits", 0, &bits)) || (st = check_bits(&r, bits, "num_bits")) ||
        (st = get_str(&r, w, "type", "int", &type)) || (st = get_bool(&r, w, "symmetric", true, &q->sym)) ||
        (st = get_str(&r, w, "strategy", "group", &strategy)) || (st = get_bool(&r, w, "dynamic", false, &dynamic)))
        return st;
    if (strcmp(type, "int") != 0)
        return fm_fail(r.err, FM_ERR_UNSUPPORTED, "%s: %s.type = \"%.32s\" is not supported (int)", r.label, where,
                       type);
    if (dynamic) return fm_fail(r.err, FM_ERR_UNSUPPORTED, "%s: %s.dynamic = true is not supported", r.label, where);
    if (strcmp(strategy, "group") == 0) {
        if ((st = get_int(&r, w, "group_size", 0, &g))) return st;
        if (g < 1)
            return fm_fail(r.err, FM_ERR_FORMAT, "%s: %s.group_size must be a positive integer with strategy group",
                           r.label, where);
        if ((st = check_group(&r, g, "group_size", q))) return st;
    } else if (strcmp(strategy, "channel") == 0) {
        q->group_size = -1;
    } else {
        return fm_fail(r.err, FM_ERR_UNSUPPORTED, "%s: %s.strategy = \"%.32s\" is not supported (group or channel)",
                       r.label, where, strategy);
    }
    /* actorder: "group" (or true) stores weight_g_idx; "weight" / "static" only changed the quantization order */
    const cJSON *ao = get(w, "actorder");
    if (ao && cJSON_IsBool(ao)) q->act_order = cJSON_IsTrue(ao);
    else if (ao && cJSON_IsString(ao)) {
        if (strcmp(ao->valuestring, "group") == 0) q->act_order = true;
        else if (strcmp(ao->valuestring, "weight") != 0 && strcmp(ao->valuestring, "static") != 0)
            return fm_fail(r.err, FM_ERR_UNSUPPORTED, "%s: %s.actorder = \"%.32s\" is not supported", r.label, where,
                           ao->valuestring);
    } else if (ao)
        return fm_fail(r.err, FM_ERR_FORMAT, "%s: %s.actorder must be a string, a boolean or null", r.label, where);
    if ((st = parse_ignore(&r, get(qc, "ignore"), q))) return st;
    q->bits = 4;
    q->method = FM_QUANT_CT_PACKED;
    return FM_OK;
}

fm_status fm_quant_config_parse(const cJSON *qc, const char *label, fm_quant_config *out, fm_error *err) {
    memset(out, 0, sizeof *out);
    if (!qc || cJSON_IsNull(qc)) return FM_OK;
    qreader r = {label, "quantization_config", err};
    if (!cJSON_IsObject(qc)) return fm_fail(err, FM_ERR_FORMAT, "%s: quantization_config must be an object", label);
    const char *method = NULL;
    fm_status st = get_str(&r, qc, "quant_method", NULL, &method);
    if (st) return st;
    if (!method) return fm_fail(err, FM_ERR_FORMAT, "%s: quantization_config.quant_method is missing", label);
    if (strcmp(method, "gptq") == 0) st = parse_gptq(&r, qc, out);
    else if (strcmp(method, "awq") == 0) st = parse_awq(&r, qc, out);
    else if (strcmp(method, "compressed-tensors") == 0) st = parse_ct(&r, qc, out);
    else if (strcmp(method, "fp8") == 0) st = parse_fp8(&r, qc, out);
    else
        st =
            fm_fail(err, FM_ERR_UNSUPPORTED,
                    "%s: quantization_config.quant_method = \"%.40s\" is not supported (gptq, awq, compressed-tensors, "
                    "fp8)",
                    label, method);
    if (st) memset(out, 0, sizeof *out);
    return st;
}

fm_status fm_quant_config_parse_autogptq(const cJSON *qc, const char *label, fm_quant_config *out, fm_error *err) {
    memset(out, 0, sizeof *out);
    qreader r = {label, "quantize_config", err};
    if (!cJSON_IsObject(qc)) return fm_fail(err, FM_ERR_FORMAT, "%s: must hold a JSON object", label);
    const char *method = NULL;
    fm_status st = get_str(&r, qc, "quant_method", "gptq", &method);
    if (!st && strcmp(method, "gptq") != 0)
        st = fm_fail(err, FM_ERR_UNSUPPORTED,
                     "%s: quant_method = \"%.40s\": a separate quantize_config.json is read as GPTQ only (other "
                     "methods belong in config.json's quantization_config)",
                     label, method);
    if (!st) st = parse_gptq(&r, qc, out);
    if (st) memset(out, 0, sizeof *out);
    return st;
}

fm_status fm_quant_config_ignores(const fm_quant_config *q, const char *module, bool *ignored, fm_error *err) {
    *ignored = false;
    const char *e = q->ignore;
    for (int32_t i = 0; i < q->n_ignore && !*ignored; i++, e += strlen(e) + 1) {
        if (strncmp(e, "re:", 3) != 0) {
            *ignored = strcmp(e, module) == 0;
            continue;
        }
        fm_status st = fm_regex_match(e + 3, module, ignored, err); /* re.match: anchored at the start only */
        if (st) {
            fm_error_prefix(err, "quantization_config.ignore");
            return st;
        }
    }
    return FM_OK;
}

void fm_quant_config_describe(const fm_quant_config *q, char *buf, size_t n) {
    if (q->method == FM_QUANT_NONE) {
        snprintf(buf, n, "none");
        return;
    }
    if (q->method == FM_QUANT_FP8_BLOCK) {
        snprintf(buf, n, "fp8 e4m3, blocks of %d x %d, dynamic activations", q->block_n, q->group_size);
        return;
    }
    char group[32];
    if (q->group_size < 0) snprintf(group, sizeof group, "per channel");
    else snprintf(group, sizeof group, "group %d", q->group_size);
    snprintf(buf, n, "%s%s, int%d, %s, %s%s", fm_quant_method_name(q->method),
             q->method == FM_QUANT_GPTQ ? (q->zero_minus_one ? " v1" : " v2") : "", q->bits, group,
             q->sym ? "symmetric" : "asymmetric", q->act_order ? ", act-order" : "");
}
