// The Gated DeltaNet (Qwen3-Next's linear attention) on the GPU: backend.h states each op (gdn_conv, gdn_chunked,
// gdn_recurrent, gdn_norm_gate); the CPU reference is src/backend/cpu/cpu_gdn.c. Activations bf16, or fp32 under
// the ref32 oracle (f32 true); weights (conv [C][ld], A_log, dt_bias, norm) banks of the activation type; the
// recurrent and conv states fp32 per sequence; arithmetic fp32, one rounding per store.
//
// The states with a step (tok_seq, tok_pos: int32 [T] in device memory, read by the device only): a sequence's tokens
// in one step are consecutive rows at consecutive positions (what fm_step_stage's callers give: a prefill chunk, or
// one token per sequence at decode). Padding rows, which a decode step replayed as a CUDA graph appends as copies of
// row 0 (generate.c): a row t > 0 with row 0's sequence and position; they change no state, and their outputs are
// finite but meaningless.
#ifndef FM_CUDA_GDN_CUH
#define FM_CUDA_GDN_CUH

extern "C" {
#include "backend/backend.h"
}
#include "backend/cuda/cuda_common.cuh"

// pdl (the decode ops): launched with programmatic dependent launch (pdl.cuh; fm_routes_pdl of the caller's routes).
// conv: [C][conv_ld] weights, tap kernel - 1 on the current token; states NULL: one sequence from position 0
extern "C" void fm_cuda_gdn_conv(bool f32, const void *qkvz, const void *conv, int64_t conv_ld, int64_t T,
                                 fm_gdn_shape g, float *states, const int32_t *tok_seq, const int32_t *tok_pos,
                                 void *out, bool pdl, cudaStream_t s);
// the rule over one run of T tokens of sequence tok_seq[0] from position tok_pos[0] (tok_pos NULL: 0): from its state
// in states (zero at position 0), the final state back there; states NULL: from position 0, nothing kept
extern "C" void fm_cuda_gdn_chunked(bool f32, const void *qkv, const void *ba, const void *a_log, const void *dt_bias,
                                    int64_t T, fm_gdn_shape g, float *states, const int32_t *tok_seq,
                                    const int32_t *tok_pos, void *out, cudaStream_t s);
// the same on tensor cores (gdn_chunked_tc.cu) for dk = dv = 128 over bf16 activations (fm_gdn_tc_takes); ws: the
// backend's scratch of fm_gdn_tc_ws_bytes(T, nv) bytes (backend/gdn_workspace.h)
extern "C" void fm_cuda_gdn_chunked_tc(const void *qkv, const void *ba, const void *a_log, const void *dt_bias,
                                       int64_t T, fm_gdn_shape g, float *states, const int32_t *tok_seq,
                                       const int32_t *tok_pos, void *ws, void *out, cudaStream_t s);
// the rule token by token on the per-sequence states (zeroed at position 0)
extern "C" void fm_cuda_gdn_recurrent(bool f32, const void *qkv, const void *ba, const void *a_log, const void *dt_bias,
                                      int64_t T, fm_gdn_shape g, float *states, const int32_t *tok_seq,
                                      const int32_t *tok_pos, void *out, bool pdl, cudaStream_t s);
// out[t, h] = w * rmsnorm(core[t, h]) * silu(z[t, h]), z from qkvz's grouped columns; q8 (NULL: none; bf16 only):
// out's rows also quantized for the out projection as fm_cuda_quantize_e4m3_rows(out, T, nv dv, q8, qs, NULL, T) would
extern "C" void fm_cuda_gdn_norm_gate(bool f32, const void *core, const void *qkvz, const void *w, int64_t T,
                                      fm_gdn_shape g, float eps, void *out, uint8_t *q8, float *qs, bool pdl,
                                      cudaStream_t s);
// A decode step's conv, rule and gated norm in one kernel (gdn_decode.cu; backend.h gdn_decode_fused): rows each of
// their own sequence, or padding rows. False, launching nothing, for a shape it does not take (dk above 128, a conv of
// more than 8 taps, odd dk or dv, T above 65535, T x nk above arrival_words): the caller runs the three ops. qkv: the
// buffer the chain's conv would have written, never touched, only for the chain's own kernel choice (its alignment);
// core [T][nv dv]: the rule's outputs, written as the chain writes them (the norm reads them back). arrivals: the
// backend's device words, zero before the launch and left zero (the key heads' last-block counters). q8, qs: as
// fm_cuda_gdn_norm_gate's.
// in_ba (NULL: ba holds the rows' b | a values; route gdn.decode_ba): the kernel computes them itself, before its PDL
// wait, from the in_proj_ba matrix w [2 nv][ld] and the normed rows h [T][H] (the activation type), in the order
// gdn_decode.cu's ba_dots states; it takes them where fm_cuda_gdn_ba_fits (H a multiple of 8, 16-byte rows), else the
// call returns false. early_state (route gdn.early_state): the recurrent state loads before the PDL wait.
typedef struct fm_gdn_ba {
    const void *w, *h;
    int64_t ld, H;
} fm_gdn_ba;
extern "C" bool fm_cuda_gdn_ba_fits(bool f32, const fm_gdn_ba *in_ba);
extern "C" bool fm_cuda_gdn_decode_fused(bool f32, const void *qkvz, const void *ba, const fm_gdn_ba *in_ba,
                                         bool early_state, const void *conv_w, int64_t conv_ld, const void *a_log,
                                         const void *dt_bias, const void *norm_w, int64_t T, fm_gdn_shape g, float eps,
                                         float *conv_states, float *rec_states, const int32_t *tok_seq,
                                         const int32_t *tok_pos, const void *qkv, void *core, unsigned *arrivals,
                                         int64_t arrival_words, void *out, uint8_t *q8, float *qs, bool pdl,
                                         cudaStream_t s);

#endif
