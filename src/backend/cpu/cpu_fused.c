/* The fused ops of a forward pass (backend.h), each defined as the chain of reference ops it replaces, run in that
 * order: the oracle a fused GPU kernel is tested against, and what the cpu backend computes when a route asks for
 * the fused form (the same numbers as the chain, so a model's logits do not depend on the route). */
#include "backend/cpu/cpu_internal.h"

void cpu_moe_add_rmsnorm(fm_backend *be, const fm_bank *gate_up, const fm_bank *down, const void *x, int64_t T,
                         const void *ids, const void *weights, int32_t k, fm_afmt a_dispatch, fm_afmt a_down, void *y,
                         void *acc, const fm_bank *norm, float eps, void *out) {
    cpu_moe(be, gate_up, down, x, T, ids, weights, k, a_dispatch, a_down, y);
    cpu_add_rmsnorm(be, acc, y, norm, T, down->rows, eps, out);
}

void cpu_linear_add_rmsnorm(fm_backend *be, const fm_bank *w, const void *x, int64_t M, fm_afmt afmt, void *y,
                            void *acc, const fm_bank *norm, float eps, void *out) {
    cpu_linear(be, w, 0, x, M, afmt, y);
    cpu_add_rmsnorm(be, acc, y, norm, M, w->rows, eps, out);
}
