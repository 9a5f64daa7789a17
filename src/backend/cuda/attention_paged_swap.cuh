// Decode attention over the paged cache with the keys as the mma's M and the query heads as its N (route
// paged.swap; attention_paged_swap.cu): the split kernel's grid, arguments, scratch and results, for kv heads of at
// most 8 query heads and head dims 64, 128 and 256.
#ifndef FM_CUDA_ATTENTION_PAGED_SWAP_CUH
#define FM_CUDA_ATTENTION_PAGED_SWAP_CUH

#include "backend/cuda/attention_paged_split.cuh"

// whether the swapped kernel takes these shapes
extern "C" bool fm_cuda_attention_paged_swap_applies(int32_t nh, int32_t nkv, int32_t hd);
// its CTAs resident on one multiprocessor (paged.splits=waves counts them)
extern "C" int fm_cuda_attention_paged_swap_ctas_per_sm(int32_t hd, bool e4m3, int32_t tiles);
// launches it over the grid (T, nkv, a->splits) with the split kernel's arguments (a->qgroups == 1); tiles: the
// 16-key tiles a warp takes an iteration (route paged.swap: 1, or 2 for the e4m3 form to head dim 128; else 1)
extern "C" void fm_cuda_attention_paged_swap_launch(const apg_args *a, int32_t hd, int64_t T, bool e4m3, int32_t tiles,
                                                    bool pdl, cudaStream_t s);

#endif
