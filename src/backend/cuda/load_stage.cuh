// The load's pinned staging (cuda_backend: load_stage, load_copied): two host buffers that the host fills on every
// core while the other one's copy to the device runs, so that reading the checkpoint and the PCIe transfer overlap.
// Used by the float banks (cuda_bank.cu: bf16/f16/f32 tensors, checked finite while copied) and the native int4
// banks (cuda_bank_native_int4.cu). Freed when the backend reserves its workspace (the load is over) or is destroyed.
#ifndef FM_CUDA_LOAD_STAGE_CUH
#define FM_CUDA_LOAD_STAGE_CUH

#include "backend/cuda/cuda_internal.cuh"

// Both buffers of at least `bytes` (at least LOAD_STAGE_MIN), kept from bank to bank.
#define FM_LOAD_STAGE_MIN ((size_t)64 << 20)
fm_status fm_cuda_load_stage(cuda_backend *be, size_t bytes, fm_error *err);
// Buffer b once its last copy has landed (it may be refilled).
void *fm_cuda_load_stage_take(cuda_backend *be, int b);
// Copies `bytes` of buffer b from `offset` on to dev in stream order and marks the buffer's copy (the buffer's
// last copy: earlier copies from it in the same stream land before it).
void fm_cuda_load_stage_send(cuda_backend *be, int b, size_t offset, void *dev, size_t bytes);
void fm_cuda_load_stage_free(cuda_backend *be);

#endif
