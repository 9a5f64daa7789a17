/* What the descriptions share: the lookup, the common dimensions and the name patterns (model/arch.h). */
#include "model/arch.h"

#include <stdio.h>
#include <string.h>

/* Every architecture the engine runs, in the order messages list them. */
static const fm_arch_desc *(*const all[])(void) = {fm_arch_qwen3_moe, fm_arch_mixtral, fm_arch_qwen3_next};
#define N_ARCH (sizeof all / sizeof *all)

const fm_arch_desc *fm_arch_of(const fm_config *c) {
    for (size_t i = 0; i < N_ARCH; i++)
        if (all[i]()->arch == c->arch) return all[i]();
    return all[0]();
}

const fm_arch_desc *fm_arch_find(const char *model_type) {
    for (size_t i = 0; i < N_ARCH; i++)
        if (!strcmp(all[i]()->model_type, model_type)) return all[i]();
    return NULL;
}

const char *fm_arch_supported(void) {
    static char list[256];
    if (!list[0])
        for (size_t i = 0, k = 0; i < N_ARCH && k < sizeof list; i++)
            k += (size_t)snprintf(list + k, sizeof list - k, "%s%s", i ? ", " : "", all[i]()->model_type);
    return list;
}

const fm_layer_desc *fm_arch_layer(const fm_arch_desc *a, const fm_config *c, int32_t layer) {
    return &a->kinds[a->layer_kind(c, layer)];
}

int32_t fm_spec_count(const fm_weight_spec *s, const fm_config *c) {
    return s->family == FM_WF_EXPERTS ? c->n_experts : 1;
}

int64_t fm_spec_rows(const fm_weight_spec *s, const fm_config *c) {
    int64_t rows = 0;
    for (int32_t p = 0; p < s->n_parts; p++) rows += fm_part_rows(&s->parts[p], c);
    return rows;
}

int64_t fm_spec_cols(const fm_weight_spec *s, const fm_config *c) { return s->parts[0].cols(c); }

int64_t fm_arch_widest_dense_k(const fm_config *c, int32_t n_layers) {
    const fm_arch_desc *a = fm_arch_of(c);
    int64_t k = 0;
    for (int32_t l = 0; l < n_layers; l++) {
        const fm_layer_desc *d = fm_arch_layer(a, c, l);
        for (int32_t i = 0; i < d->n_specs; i++) {
            const fm_weight_spec *s = &d->specs[i];
            if ((s->family == FM_WF_ATTN || s->family == FM_WF_DENSE_MLP) && fm_spec_present(s, c) &&
                fm_spec_cols(s, c) > k)
                k = fm_spec_cols(s, c);
        }
    }
    return k;
}

bool fm_arch_name(char *out, size_t cap, const char *pattern, int32_t layer, const char *prefix) {
    size_t k = 0;
    char num[24];
    for (const char *p = pattern; *p;) {
        const char *part = p;
        size_t n = 1;
        if (!strncmp(p, "{L}", 3)) snprintf(num, sizeof num, "%d", layer), part = num, n = strlen(num), p += 3;
        else if (!strncmp(p, "{P}", 3)) part = prefix ? prefix : "", n = strlen(part), p += 3;
        else p++;
        if (k + n >= cap) {
            if (cap) out[k < cap ? k : cap - 1] = '\0';
            return false;
        }
        memcpy(out + k, part, n);
        k += n;
    }
    if (cap) out[k] = '\0';
    return cap > 0;
}

int64_t fm_dim_hidden(const fm_config *c) { return c->hidden_size; }
int64_t fm_dim_head(const fm_config *c) { return c->head_dim; }
int64_t fm_dim_q(const fm_config *c) { return (int64_t)c->n_heads * c->head_dim; }
int64_t fm_dim_kv(const fm_config *c) { return (int64_t)c->n_kv_heads * c->head_dim; }
int64_t fm_dim_experts(const fm_config *c) { return c->n_experts; }
int64_t fm_dim_moe_inter(const fm_config *c) { return c->moe_intermediate; }
int64_t fm_dim_dense_inter(const fm_config *c) { return c->dense_intermediate; }
bool fm_when_qk_norm(const fm_config *c) { return c->qk_norm; }

int32_t fm_arch_attention_layers(const fm_config *c, int32_t n_layers) {
    const fm_arch_desc *a = fm_arch_of(c);
    int32_t n = 0;
    for (int32_t l = 0; l < n_layers; l++) n += !fm_layer_kind_is_gdn(a->layer_kind(c, l));
    return n;
}

fm_layer_kind fm_layer_kind_moe_or_mlp(const fm_config *c, int32_t layer) {
    return c->layer_is_moe[layer] ? FM_LAYER_ATTN_MOE : FM_LAYER_ATTN_MLP;
}
