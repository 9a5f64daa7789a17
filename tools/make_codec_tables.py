#!/usr/bin/env python3
"""Reference tables for the scalar codecs, produced by an independent implementation (ml_dtypes, numpy).

Run on the GPU machine (its python has ml_dtypes): python3 tools/make_codec_tables.py tests/data/codec
Writes text files, one record a line, floats as the 8 hex digits of their fp32 bits (exact):
  e4m3_decode.txt   "<code> <f32 hex>"     all 256 codes (ml_dtypes float8_e4m3fn)
  e4m3_encode.txt   "<f32 hex> <code>"     inputs -> code; saturating: ml_dtypes of clip(x, -448, 448)
  e2m1_decode.txt   "<code> <f32 hex>"     all 16 codes (ml_dtypes float4_e2m1fn)
  e2m1_encode.txt   "<f32 hex> <code>"     inputs -> code (ml_dtypes, RNE, saturates to +-6)
  e8m0_decode.txt   "<code> <f32 hex>"     all 256 codes (ml_dtypes float8_e8m0fnu)
  bf16_encode.txt   "<f32 hex> <bf16 hex>" (ml_dtypes bfloat16, RNE)
  f16_encode.txt    "<f32 hex> <f16 hex>"  (numpy float16, RNE)
"""
import os
import sys

import ml_dtypes
import numpy as np


def hexf(v):
    return "%08x" % int(np.float32(v).view(np.uint32))


def inputs(rng, max_mag, grid):
    """Random values over many binades, every midpoint between neighbours of `grid` and its neighbours."""
    xs = [0.0, -0.0, np.inf, -np.inf, np.nan]
    mids = (grid[:-1] + grid[1:]) / 2
    for m in np.concatenate([grid, mids]):
        m = np.float32(m)
        for v in (m, np.nextafter(m, np.float32(np.inf)), np.nextafter(m, np.float32(-np.inf))):
            xs += [v, -v]
    e = rng.uniform(np.log2(max_mag) - 30, np.log2(max_mag) + 4, size=4000)
    xs += list((rng.choice([-1.0, 1.0], size=e.size) * 2.0 ** e))
    xs += list(rng.standard_normal(2000) * max_mag / 4)
    return np.array(xs, dtype=np.float32)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(20261129)
    codes = np.arange(256, dtype=np.uint8)

    e4m3 = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    with open(os.path.join(out, "e4m3_decode.txt"), "w") as f:
        for c, v in zip(codes, e4m3):
            f.write("%d %s\n" % (c, hexf(v)))
    grid = np.unique(np.abs(e4m3[np.isfinite(e4m3)]))
    x = inputs(rng, 448.0, grid)
    clipped = np.where(np.isnan(x), x, np.clip(x, -448.0, 448.0)).astype(np.float32)
    enc = clipped.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    with open(os.path.join(out, "e4m3_encode.txt"), "w") as f:
        for v, c in zip(x, enc):
            f.write("%s %d\n" % (hexf(v), c))

    c16 = np.arange(16, dtype=np.uint8)
    e2m1 = c16.view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    with open(os.path.join(out, "e2m1_decode.txt"), "w") as f:
        for c, v in zip(c16, e2m1):
            f.write("%d %s\n" % (c, hexf(v)))
    grid = np.unique(np.abs(e2m1))
    x = inputs(rng, 6.0, grid)
    x = x[~np.isnan(x)]  # NaN has no E2M1 code; our policy for it is tested separately
    enc = x.astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0xF
    with open(os.path.join(out, "e2m1_encode.txt"), "w") as f:
        for v, c in zip(x, enc):
            f.write("%s %d\n" % (hexf(v), c))

    e8m0 = codes.view(ml_dtypes.float8_e8m0fnu).astype(np.float32)
    with open(os.path.join(out, "e8m0_decode.txt"), "w") as f:
        for c, v in zip(codes, e8m0):
            f.write("%d %s\n" % (c, hexf(v)))

    x = np.concatenate([inputs(rng, 1.0, np.array([1.0, 1.0078125], dtype=np.float32)),
                        rng.standard_normal(4000).astype(np.float32) * 100,
                        (rng.integers(0, 2**32, size=4000, dtype=np.uint64).astype(np.uint32)).view(np.float32)])
    x = x[~np.isnan(x)]
    bf = x.astype(ml_dtypes.bfloat16).view(np.uint16)
    with open(os.path.join(out, "bf16_encode.txt"), "w") as f:
        for v, c in zip(x, bf):
            f.write("%s %04x\n" % (hexf(v), c))
    with np.errstate(over="ignore"):
        h = x.astype(np.float16).view(np.uint16)
    with open(os.path.join(out, "f16_encode.txt"), "w") as f:
        for v, c in zip(x, h):
            f.write("%s %04x\n" % (hexf(v), c))
    print("ml_dtypes", ml_dtypes.__version__, "numpy", np.__version__, "->", out)


if __name__ == "__main__":
    main()
