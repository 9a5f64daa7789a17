/* Copying a tensor's bytes out of the mapping on every core, checking them finite on the way: the float path of the
 * load (the CUDA backend's pinned staging) reads each weight once instead of a check pass and a copy pass on one
 * core. */
#ifndef FM_IO_SAFETENSORS_COPY_H
#define FM_IO_SAFETENSORS_COPY_H

#include "io/safetensors.h"

/* Copies elements [first, first + n) of t (in its dtype) to dst; FM_ERR_FORMAT (fm_st_check_finite's message, for
 * the lowest non-finite element) when one of them is NaN or infinite. */
fm_status fm_st_copy_finite(const fm_st_tensor *t, int64_t first, int64_t n, void *dst, fm_error *err);

#endif
