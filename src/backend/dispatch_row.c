/* The dispatch format of one routed row (dispatch_row.h). */
#include <stdlib.h>
#include <string.h>

#include "backend/dispatch_row.h"
#include "quant/bf16.h"
#include "quant/e2m1.h"
#include "quant/e4m3.h"

#define GROUP 128

size_t fm_dispatch_row_bytes(fm_afmt f, bool act_bf16, int64_t H) {
    const size_t h = (size_t)H;
    switch (f) {
    case FM_A_NATIVE: return h * (act_bf16 ? 2 : 4);
    case FM_A_E4M3_G128: return h + (h + GROUP - 1) / GROUP * sizeof(float);
    case FM_A_MXFP4: return (h + 1) / 2 + (h + FM_MX_BLOCK - 1) / FM_MX_BLOCK;
    case FM_A_NVFP4: return (h + 1) / 2 + (h + FM_NV_BLOCK - 1) / FM_NV_BLOCK;
    case FM_A_E4M3_PT:
    case FM_A_E4M3_ROW: return 0;
    }
    return 0;
}

void fm_dispatch_row_encode(const float *x, int64_t H, fm_afmt f, bool act_bf16, float tensor_scale, uint8_t *out) {
    switch (f) {
    case FM_A_NATIVE:
        if (!act_bf16) memcpy(out, x, (size_t)H * sizeof *x);
        else
            for (int64_t i = 0; i < H; i++) {
                const uint16_t b = fm_f32_to_bf16(x[i]);
                memcpy(out + 2 * i, &b, 2);
            }
        return;
    case FM_A_E4M3_G128: { /* the scales go through an aligned buffer: out + H need not be */
        const int64_t groups = (H + GROUP - 1) / GROUP;
        float stack[64], *sc = groups <= 64 ? stack : malloc((size_t)groups * sizeof *sc);
        if (!sc) abort();
        fm_e4m3_quantize_groups(x, H, GROUP, out, sc);
        memcpy(out + H, sc, (size_t)groups * sizeof *sc);
        if (sc != stack) free(sc);
        return;
    }
    case FM_A_MXFP4: fm_mxfp4_quantize(x, H, FM_MX_RCEIL, out, out + (H + 1) / 2); return;
    case FM_A_NVFP4: fm_nvfp4_quantize(x, H, tensor_scale, out, out + (H + 1) / 2); return;
    case FM_A_E4M3_PT:
    case FM_A_E4M3_ROW: return;
    }
}

void fm_dispatch_row_decode_native(const uint8_t *row, int64_t H, bool act_bf16, float *x) {
    if (!act_bf16) {
        memcpy(x, row, (size_t)H * sizeof *x);
        return;
    }
    for (int64_t i = 0; i < H; i++) {
        uint16_t b;
        memcpy(&b, row + 2 * i, 2);
        x[i] = fm_bf16_to_f32(b);
    }
}
