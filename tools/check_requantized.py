#!/usr/bin/python3
"""Independent check of `fp8moe requantize` output, numpy only (not part of CI: the C tests need no numpy).

For every module of OUT_DIR stored as compressed-tensors pack-quantized (weight_packed, weight_scale, weight_shape)
whose float weight IN_DIR has under "<module>.weight", it unpacks the codes from the format's description
(REFERENCE-FORMATS.md 2.3: word j of a row holds k = 8j + i at bits 4i, stored as q + 8), and checks, per group of
128 along K: every code in -7..7; the scale equal to amax / 7 rounded UP to bf16 (int4.h's rule, recomputed here in
float32); every element within scale / 2 of the float weight (|w - q * s| <= s / 2, the round-to-nearest bound).
Usage: /usr/bin/python3 tools/check_requantized.py IN_DIR OUT_DIR      (exit 1 on the first failure)
"""
import json
import os
import struct
import sys

import numpy as np

DT = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "I32": np.int32, "I64": np.int64, "U8": np.uint8}


def tensors(d):
    idx = os.path.join(d, "model.safetensors.index.json")
    files = sorted(set(json.load(open(idx))["weight_map"].values())) if os.path.exists(idx) else ["model.safetensors"]
    out = {}
    for f in files:
        buf = open(os.path.join(d, f), "rb").read()
        n = struct.unpack("<Q", buf[:8])[0]
        for name, e in json.loads(buf[8:8 + n]).items():
            if name == "__metadata__":
                continue
            a, b = e["data_offsets"]
            out[name] = (e["dtype"], np.frombuffer(buf[8 + n + a:8 + n + b], DT[e["dtype"]]).reshape(e["shape"]))
    return out


def as_f32(dtype, a):
    if dtype == "BF16":
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32)


def bf16_round_up(x):  # the smallest bf16 >= x (x >= 0), as int4.h rounds scales
    bits = x.astype(np.float32).view(np.uint32)
    down = bits & 0xFFFF0000
    up = np.where((bits & 0xFFFF) != 0, down + 0x10000, down)
    return up.view(np.float32)


def main(in_dir, out_dir):
    src, dst = tensors(in_dir), tensors(out_dir)
    checked = 0
    for name in sorted(dst):
        if not name.endswith(".weight_packed"):
            continue
        m = name[: -len(".weight_packed")]
        if m + ".weight" not in src:
            continue
        w = as_f32(*src[m + ".weight"])
        N, K = w.shape
        packed = dst[name][1].view(np.uint32)
        shape = dst[m + ".weight_shape"][1]
        assert list(shape) == [N, K], (m, shape)
        q = np.stack([(packed >> (4 * i)) & 15 for i in range(8)], axis=-1).reshape(N, -1)[:, :K].astype(np.int32) - 8
        s = as_f32(*dst[m + ".weight_scale"])
        G = 128
        ng = (K + G - 1) // G
        assert s.shape == (N, ng), (m, s.shape)
        assert q.min() >= -7 and q.max() <= 7, (m, q.min(), q.max())
        for g in range(ng):
            wg, qg, sg = w[:, g * G:(g + 1) * G], q[:, g * G:(g + 1) * G], s[:, g:g + 1]
            amax = np.abs(wg).max(axis=1, keepdims=True)
            assert np.array_equal(sg, bf16_round_up(amax / np.float32(7))), (m, g, "scale")
            err = np.abs(wg - qg.astype(np.float32) * sg)
            assert np.all(err <= sg / 2 * (1 + 1e-6)), (m, g, float(err.max()))
        checked += 1
    print(f"{checked} int4 linears of {out_dir} match {in_dir}: codes -7..7, scales amax/7 rounded up to bf16, "
          f"|w - q*s| <= s/2")
    return 0 if checked else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
