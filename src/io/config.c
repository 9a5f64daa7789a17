/* config.json -> fm_config (see config.h for the accepted spellings and what is rejected). */
#include "io/config.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/json.h"
#include "model/arch.h"
#include "util/file.h"
#include "util/status.h"

typedef fm_cfg_reader cfg_reader;

static const cJSON *field(const cfg_reader *r, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(r->root, key);
    return (v && !cJSON_IsNull(v)) ? v : NULL; /* JSON null means "not set" (e.g. "head_dim": null) */
}

static const char *json_kind(const cJSON *v) {
    if (cJSON_IsString(v)) return "a string";
    if (cJSON_IsBool(v)) return "a boolean";
    if (cJSON_IsArray(v)) return "an array";
    if (cJSON_IsObject(v)) return "an object";
    if (cJSON_IsNull(v)) return "null";
    return "a number";
}

/* An integer in [lo, hi]; absent -> *out = dflt when !required. */
static fm_status read_int(const cfg_reader *r, const char *key, bool required, int64_t dflt, int64_t lo, int64_t hi,
                          int64_t *out) {
    const cJSON *v = field(r, key);
    if (!v) {
        if (required) return fm_fail(r->err, FM_ERR_FORMAT, "%s: required field '%s' is missing", r->label, key);
        *out = dflt;
        return FM_OK;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble))
        return fm_fail(r->err, FM_ERR_FORMAT, "%s: field '%s' must be an integer, got %s", r->label, key,
                       cJSON_IsNumber(v) ? "a fraction" : json_kind(v));
    if (v->valuedouble < (double)lo || v->valuedouble > (double)hi)
        return fm_fail(r->err, FM_ERR_FORMAT, "%s: field '%s' = %.17g is out of range [%lld, %lld]", r->label, key,
                       v->valuedouble, (long long)lo, (long long)hi);
    *out = (int64_t)v->valuedouble;
    return FM_OK;
}

static fm_status read_i32(const cfg_reader *r, const char *key, bool required, int64_t dflt, int64_t lo, int64_t hi,
                          int32_t *out) {
    int64_t v = 0;
    fm_status st = read_int(r, key, required, dflt, lo, hi, &v);
    if (st == FM_OK) *out = (int32_t)v;
    return st;
}

static fm_status read_number(const cfg_reader *r, const cJSON *v, const char *key, double *out) {
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return fm_fail(r->err, FM_ERR_FORMAT, "%s: field '%s' must be a finite number, got %s", r->label, key,
                       json_kind(v));
    *out = v->valuedouble;
    return FM_OK;
}

static fm_status read_bool(const cfg_reader *r, const char *key, bool dflt, bool *out) {
    const cJSON *v = field(r, key);
    if (!v) {
        *out = dflt;
        return FM_OK;
    }
    if (!cJSON_IsBool(v))
        return fm_fail(r->err, FM_ERR_FORMAT, "%s: field '%s' must be true or false, got %s", r->label, key,
                       json_kind(v));
    *out = cJSON_IsTrue(v);
    return FM_OK;
}

bool fm_cfg_has(const fm_cfg_reader *r, const char *key) { return field(r, key) != NULL; }

fm_status fm_cfg_read_i32(const fm_cfg_reader *r, const char *key, bool required, int64_t dflt, int64_t lo, int64_t hi,
                          int32_t *out) {
    return read_i32(r, key, required, dflt, lo, hi, out);
}

fm_status fm_cfg_read_bool(const fm_cfg_reader *r, const char *key, bool dflt, bool *out) {
    return read_bool(r, key, dflt, out);
}

fm_status fm_cfg_read_number(const fm_cfg_reader *r, const char *key, bool *present, double *out) {
    const cJSON *v = field(r, key);
    *present = v != NULL;
    return v ? read_number(r, v, key, out) : FM_OK;
}

fm_status fm_cfg_read_layer_list(const fm_cfg_reader *r, const char *key, int32_t n_layers, bool *marked) {
    const cJSON *list = field(r, key);
    if (!list) return FM_OK;
    if (!cJSON_IsArray(list))
        return fm_fail(r->err, FM_ERR_FORMAT, "%s: field '%s' must be an array of layer indices", r->label, key);
    const cJSON *e;
    cJSON_ArrayForEach(e, list) {
        if (!cJSON_IsNumber(e))
            return fm_fail(r->err, FM_ERR_FORMAT, "%s: %s entries must be layer indices, got %s", r->label, key,
                           json_kind(e));
        if (e->valuedouble != floor(e->valuedouble) || e->valuedouble < 0 || e->valuedouble >= n_layers)
            return fm_fail(r->err, FM_ERR_FORMAT, "%s: %s entry %.17g is not a layer index in [0, %d)", r->label, key,
                           e->valuedouble, n_layers);
        marked[(int)e->valuedouble] = true;
    }
    return FM_OK;
}

fm_status fm_cfg_read_layer_types(const fm_cfg_reader *r, const char *key, int32_t n_layers, const char *marked_value,
                                  const char *other_value, bool *marked) {
    const cJSON *list = field(r, key);
    if (!list) return FM_OK;
    if (!cJSON_IsArray(list) || cJSON_GetArraySize(list) != n_layers)
        return fm_fail(r->err, FM_ERR_FORMAT, "%s: field '%s' must be an array of %d strings (one per layer)", r->label,
                       key, n_layers);
    int32_t i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, list) {
        const bool is_marked = cJSON_IsString(e) && !strcmp(e->valuestring, marked_value);
        if (!is_marked && !(cJSON_IsString(e) && !strcmp(e->valuestring, other_value)))
            return fm_fail(r->err, FM_ERR_UNSUPPORTED,
                           "%s: %s[%d] is %s%.64s%s; only \"%s\" and \"%s\" are implemented", r->label, key, i,
                           cJSON_IsString(e) ? "\"" : "", cJSON_IsString(e) ? e->valuestring : json_kind(e),
                           cJSON_IsString(e) ? "\"" : "", marked_value, other_value);
        marked[i++] = is_marked;
    }
    return FM_OK;
}

/* Only the default RoPE is implemented: rope_scaling null/absent or of type "default". */
static fm_status check_rope_type(const cfg_reader *r, const cJSON *obj, const char *where) {
    if (!obj || cJSON_IsNull(obj)) return FM_OK;
    if (!cJSON_IsObject(obj))
        return fm_fail(r->err, FM_ERR_FORMAT, "%s: field '%s' must be an object, got %s", r->label, where,
                       json_kind(obj));
    const char *keys[] = {"rope_type", "type"};
    for (int i = 0; i < 2; i++) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(obj, keys[i]);
        if (!t || cJSON_IsNull(t)) continue;
        if (!cJSON_IsString(t))
            return fm_fail(r->err, FM_ERR_FORMAT, "%s: field '%s.%s' must be a string", r->label, where, keys[i]);
        if (strcmp(t->valuestring, "default") != 0)
            return fm_fail(r->err, FM_ERR_UNSUPPORTED,
                           "%s: %s.%s = \"%s\" is not implemented (only default RoPE, no scaling)", r->label, where,
                           keys[i], t->valuestring);
    }
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(obj, "factor");
    if (f && !cJSON_IsNull(f) && !cJSON_IsNumber(f))
        return fm_fail(r->err, FM_ERR_FORMAT, "%s: field '%s.factor' must be a number, got %s", r->label, where,
                       json_kind(f));
    if (f && cJSON_IsNumber(f) && f->valuedouble != 1.0)
        return fm_fail(r->err, FM_ERR_UNSUPPORTED, "%s: %s.factor = %g: RoPE scaling is not implemented", r->label,
                       where, f->valuedouble);
    return FM_OK;
}

static fm_status read_rope(const cfg_reader *r, fm_config *c) {
    fm_status st;
    const cJSON *params = field(r, "rope_parameters");
    if ((st = check_rope_type(r, params, "rope_parameters")) != FM_OK) return st;
    if ((st = check_rope_type(r, field(r, "rope_scaling"), "rope_scaling")) != FM_OK) return st;
    const cJSON *theta = field(r, "rope_theta");
    const char *where = "rope_theta";
    if (!theta && params) {
        theta = cJSON_GetObjectItemCaseSensitive(params, "rope_theta");
        where = "rope_parameters.rope_theta";
    }
    /* HF class defaults when neither spelling is present */
    c->rope_theta = fm_arch_of(c)->config.rope_theta;
    if (theta && !cJSON_IsNull(theta)) {
        if ((st = read_number(r, theta, where, &c->rope_theta)) != FM_OK) return st;
        if (c->rope_theta <= 1.0)
            return fm_fail(r->err, FM_ERR_FORMAT, "%s: %s = %g must be > 1", r->label, where, c->rope_theta);
    }
    const cJSON *prf = field(r, "partial_rotary_factor");
    if (!prf && params) prf = cJSON_GetObjectItemCaseSensitive(params, "partial_rotary_factor");
    if (prf && !cJSON_IsNull(prf) && !cJSON_IsNumber(prf))
        return fm_fail(r->err, FM_ERR_FORMAT, "%s: field 'partial_rotary_factor' must be a number, got %s", r->label,
                       json_kind(prf));
    const double dflt = fm_arch_of(c)->config.partial_rotary_factor;
    const double f = prf && cJSON_IsNumber(prf) ? prf->valuedouble : dflt > 0 ? dflt : 1.0;
    if (f != 1.0 && dflt <= 0)
        return fm_fail(r->err, FM_ERR_UNSUPPORTED,
                       "%s: partial_rotary_factor = %g is refused for model_type %s: its rotary embedding turns whole "
                       "heads (1.0); only qwen3_next rotates part of each head",
                       r->label, f, c->model_type);
    /* transformers rotates the first int(head_dim * factor) dims of each head, in rotate-half pairs */
    c->rotary_dim = (int32_t)((double)c->head_dim * f);
    if (!(f > 0 && f <= 1) || c->rotary_dim < 2 || c->rotary_dim % 2 != 0)
        return fm_fail(r->err, FM_ERR_FORMAT,
                       "%s: partial_rotary_factor = %g gives %d rotary dims of head_dim %d; they must be even and >= 2",
                       r->label, f, c->rotary_dim, c->head_dim);
    return FM_OK;
}

static fm_status read_unsupported_switches(const cfg_reader *r) {
    fm_status st;
    bool b = false;
    if ((st = read_bool(r, "attention_bias", false, &b)) != FM_OK) return st;
    if (b) return fm_fail(r->err, FM_ERR_UNSUPPORTED, "%s: attention_bias = true is not implemented", r->label);
    const cJSON *act = field(r, "hidden_act");
    if (act && (!cJSON_IsString(act) || strcmp(act->valuestring, "silu") != 0))
        return fm_fail(r->err, FM_ERR_UNSUPPORTED, "%s: hidden_act = %s%s%s is not implemented (only silu)", r->label,
                       cJSON_IsString(act) ? "\"" : "", cJSON_IsString(act) ? act->valuestring : json_kind(act),
                       cJSON_IsString(act) ? "\"" : "");
    return FM_OK;
}

static fm_status parse_fields(const cfg_reader *r, fm_config *c) {
    fm_status st;
    const cJSON *mt = field(r, "model_type");
    if (!mt) return fm_fail(r->err, FM_ERR_FORMAT, "%s: required field 'model_type' is missing", r->label);
    if (!cJSON_IsString(mt))
        return fm_fail(r->err, FM_ERR_FORMAT, "%s: field 'model_type' must be a string, got %s", r->label,
                       json_kind(mt));
    const fm_arch_desc *arch = fm_arch_find(mt->valuestring);
    if (!arch)
        return fm_fail(r->err, FM_ERR_UNSUPPORTED, "%s: model_type \"%.64s\" is not supported (supported: %s)",
                       r->label, mt->valuestring, fm_arch_supported());
    c->arch = arch->arch;
    snprintf(c->model_type, sizeof c->model_type, "%s", mt->valuestring);

    if ((st = read_i32(r, "vocab_size", true, 0, 1, FM_MAX_DIM, &c->vocab_size)) ||
        (st = read_i32(r, "hidden_size", true, 0, 1, FM_MAX_DIM, &c->hidden_size)) ||
        (st = read_i32(r, "num_hidden_layers", true, 0, 1, FM_MAX_LAYERS, &c->n_layers)) ||
        (st = read_i32(r, "num_attention_heads", true, 0, 1, 65536, &c->n_heads)) ||
        (st = read_i32(r, "num_key_value_heads", false, c->n_heads, 1, 65536, &c->n_kv_heads)))
        return st;
    if (c->n_heads % c->n_kv_heads != 0)
        return fm_fail(r->err, FM_ERR_FORMAT,
                       "%s: num_attention_heads (%d) is not a multiple of num_key_value_heads (%d)", r->label,
                       c->n_heads, c->n_kv_heads);
    if (!field(r, "head_dim") && c->hidden_size % c->n_heads != 0)
        return fm_fail(r->err, FM_ERR_FORMAT,
                       "%s: head_dim is absent and hidden_size (%d) is not a multiple of num_attention_heads (%d)",
                       r->label, c->hidden_size, c->n_heads);
    if ((st = read_i32(r, "head_dim", false, c->hidden_size / c->n_heads, 2, 65536, &c->head_dim))) return st;
    if (c->head_dim % 2 != 0)
        return fm_fail(r->err, FM_ERR_FORMAT, "%s: head_dim = %d must be even (RoPE pairs)", r->label, c->head_dim);

    /* experts: num_experts or num_local_experts (the same field under either name) */
    const char *ekey = field(r, "num_experts") ? "num_experts" : "num_local_experts";
    if (field(r, "num_experts") && field(r, "num_local_experts")) {
        int64_t a = 0, b = 0;
        if ((st = read_int(r, "num_experts", true, 0, 0, 65536, &a)) ||
            (st = read_int(r, "num_local_experts", true, 0, 0, 65536, &b)))
            return st;
        if (a != b)
            return fm_fail(r->err, FM_ERR_FORMAT, "%s: num_experts (%lld) and num_local_experts (%lld) disagree",
                           r->label, (long long)a, (long long)b);
    }
    if ((st = read_i32(r, ekey, true, 0, arch->config.min_experts, 65536, &c->n_experts))) return st;
    if ((st = read_i32(r, "num_experts_per_tok", c->n_experts > 0, 0, 1, 65536, &c->n_experts_per_tok))) return st;
    if (c->n_experts > 0 && c->n_experts_per_tok > c->n_experts)
        return fm_fail(r->err, FM_ERR_FORMAT, "%s: num_experts_per_tok (%d) is larger than %s (%d)", r->label,
                       c->n_experts_per_tok, ekey, c->n_experts);

    if ((st = arch->config.read_fields(r, c))) return st;
    const cJSON *eps = field(r, "rms_norm_eps");
    double e = arch->config.rms_norm_eps;
    if (eps && (st = read_number(r, eps, "rms_norm_eps", &e))) return st;
    if (!(e > 0 && e < 1) || !((float)e > 0.0f)) /* also positive once stored as fp32 */
        return fm_fail(r->err, FM_ERR_FORMAT, "%s: rms_norm_eps = %g must be in (0, 1) and representable in fp32",
                       r->label, e);
    c->rms_norm_eps = (float)e;
    if ((st = read_int(r, "max_position_embeddings", false, 0, 0, INT64_MAX / 2, &c->max_position_embeddings)))
        return st;
    if ((st = read_rope(r, c)) || (st = read_unsupported_switches(r)) || (st = arch->config.read_layers(r, c)))
        return st;
    if ((st = fm_quant_config_parse(field(r, "quantization_config"), r->label, &c->quant, r->err))) return st;

    bool any_dense = false;
    for (int i = 0; i < c->n_layers; i++) any_dense |= !c->layer_is_moe[i];
    if (any_dense && c->dense_intermediate <= 0)
        return fm_fail(r->err, FM_ERR_FORMAT, "%s: dense MLP layers need 'intermediate_size', which is missing",
                       r->label);
    return FM_OK;
}

/* eos_token_id: an id or a list of ids (Qwen3's generation_config.json lists two); absent is no eos. */
static fm_status read_eos(const cJSON *v, const char *label, fm_config *c, fm_error *err) {
    if (!v || cJSON_IsNull(v)) return FM_OK;
    const cJSON *one = v;
    const bool list = cJSON_IsArray(v);
    c->n_eos = 0;
    if (list && cJSON_GetArraySize(v) > FM_MAX_EOS)
        return fm_fail(err, FM_ERR_FORMAT, "%s: eos_token_id lists %d ids, more than %d", label, cJSON_GetArraySize(v),
                       FM_MAX_EOS);
    for (one = list ? v->child : v; one; one = list ? one->next : NULL) {
        if (!cJSON_IsNumber(one) || one->valuedouble < 0 || one->valuedouble > INT32_MAX ||
            one->valuedouble != (double)(int64_t)one->valuedouble)
            return fm_fail(err, FM_ERR_FORMAT, "%s: eos_token_id must be a token id or a list of them", label);
        c->eos_ids[c->n_eos++] = (int32_t)one->valuedouble;
    }
    return FM_OK;
}

fm_status fm_config_parse(const char *json, uint64_t len, const char *label, fm_config *out, fm_error *err) {
    memset(out, 0, sizeof *out);
    cJSON *root = NULL;
    fm_status st = fm_json_parse_object(json, len, label, "config", &root, err);
    if (st) return st;
    cfg_reader r = {root, label, err};
    st = parse_fields(&r, out);
    if (!st) st = read_eos(cJSON_GetObjectItemCaseSensitive(root, "eos_token_id"), label, out, err);
    cJSON_Delete(root);
    if (st != FM_OK) memset(out, 0, sizeof *out);
    return st;
}

/* Reads a whole small text file into *buf (NUL-terminated, malloc'd), its length into *len; a FIFO or a device is
 * refused without blocking. */
static fm_status read_text(const char *path, const char *what, char **buf, long *len, fm_error *err) {
    size_t n = 0;
    fm_status st = fm_read_regular(path, what, 16 * 1024 * 1024, buf, &n, err);
    if (st == FM_ERR_IO && access(path, F_OK) != 0) {
        fm_path_buf pb;
        return fm_fail(err, FM_ERR_IO, "%s: cannot open (is --model a Hugging Face checkpoint directory?)",
                       fm_path_show(&pb, path));
    }
    *len = (long)n;
    return st;
}

/* DIR/name parsed as a JSON object into *root (the caller deletes it), or *root NULL when there is no such file;
 * *label names the file in messages (pb holds it). */
static fm_status read_optional_json(const char *dir, const char *name, const char *what, cJSON **root, fm_path_buf *pb,
                                    const char **label, fm_error *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    *root = NULL;
    if (access(path, F_OK) != 0) return FM_OK;
    long n = 0;
    char *buf = NULL;
    /* the label outlives path (a local): a short path is copied into pb, as a long one is shortened there */
    if (fm_path_show(pb, path) == path) memcpy(pb->s, path, strlen(path) + 1); /* <= FM_PATH_SHOWN bytes */
    *label = pb->s;
    fm_status st = read_text(path, name, &buf, &n, err);
    if (!st) st = fm_json_parse_object(buf, (uint64_t)n, *label, what, root, err);
    free(buf);
    return st;
}

/* Older AutoGPTQ checkpoints keep their GPTQ settings in DIR/quantize_config.json, not in config.json. */
static fm_status load_autogptq(const char *dir, fm_config *out, fm_error *err) {
    cJSON *root = NULL;
    const char *label = NULL;
    fm_path_buf pb;
    fm_status st = read_optional_json(dir, "quantize_config.json", "quantize_config", &root, &pb, &label, err);
    if (!st && root) st = fm_quant_config_parse_autogptq(root, label, &out->quant, err);
    cJSON_Delete(root);
    return st;
}

/* DIR/generation_config.json, when present, says how the model ends a sequence (its eos ids replace config.json's,
 * as transformers' generate() takes them). */
static fm_status load_generation_config(const char *dir, fm_config *out, fm_error *err) {
    cJSON *root = NULL;
    const char *label = NULL;
    fm_path_buf pb;
    fm_status st = read_optional_json(dir, "generation_config.json", "generation_config", &root, &pb, &label, err);
    if (!st && root) st = read_eos(cJSON_GetObjectItemCaseSensitive(root, "eos_token_id"), label, out, err);
    cJSON_Delete(root);
    return st;
}

fm_status fm_config_load(const char *dir, fm_config *out, fm_error *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    long n = 0;
    char *buf = NULL;
    fm_path_buf pb;
    fm_status st = read_text(path, "config.json", &buf, &n, err);
    if (!st) st = fm_config_parse(buf, (uint64_t)n, fm_path_show(&pb, path), out, err);
    free(buf);
    if (!st && out->quant.method == FM_QUANT_NONE) st = load_autogptq(dir, out, err);
    if (!st) st = load_generation_config(dir, out, err);
    if (st) memset(out, 0, sizeof *out);
    return st;
}
