#!/usr/bin/python3
"""Tiny pre-quantized checkpoints (GPTQ v1/v2, AWQ GEMM, compressed-tensors pack-quantized, block-FP8) for the
import tests.

An independent packer: numpy only, written from the published format descriptions (docs: REFERENCE-FORMATS.md
section 2, checked against AutoGPTQ qlinear pack/forward, AutoAWQ packing_utils and compressed-tensors
pack_quantized), never from fp8moe's C code. It slices one of our float test models down to a tiny one
(1 layer, H 32, 2 heads of 16, 4 experts of width 16, vocabulary 48; the fp8 fixtures H = I = 128 from
models/tiny-code-moe), quantizes its linears round-to-nearest
per group (in act-order when asked: groups taken over a permuted channel order, as GPTQ's desc_act does),
packs them in the format, and writes

    OUT/<name>/config.json, model.safetensors           the pre-quantized checkpoint (+ golden_ids.i32, a prompt)
    OUT/<name>/dequant/config.json, model.safetensors   the same model with every quantized linear replaced by its
                                                        dequantized fp32 weight (the format's formula, exact in fp32)

Float tensors (embeddings, norms, router, ignored linears) are BF16 in both. Run from the repository root:
    /usr/bin/python3 tools/pack_quantized.py tests/data/quant   (numpy: apt-get install python3-numpy)
"""
import json
import os
import struct
import sys

import numpy as np

DIMS = dict(H=32, heads=2, kv=1, hd=16, E=4, topk=2, I=16, V=48)
DIMS_K128 = dict(H=128, heads=4, kv=2, hd=32, E=3, topk=2, I=128, V=48)
DIMS_K64 = dict(H=64, heads=2, kv=1, hd=32, E=2, topk=2, I=64, V=48)
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # nibble slot i of a word holds column 8c + AWQ_ORDER[i]

# ---- safetensors, by hand -------------------------------------------------------------------------------
DT = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "I32": np.int32, "I64": np.int64}


def st_read(path):
    with open(path, "rb") as f:
        buf = f.read()
    n = struct.unpack("<Q", buf[:8])[0]
    hdr = json.loads(buf[8:8 + n])
    out = {}
    for name, e in hdr.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        out[name] = np.frombuffer(buf[8 + n + b:8 + n + end], dtype=DT[e["dtype"]]).reshape(e["shape"])
    return out


def st_read_dir(d):
    idx = os.path.join(d, "model.safetensors.index.json")
    if not os.path.exists(idx):
        return st_read(os.path.join(d, "model.safetensors"))
    out = {}
    for shard in sorted(set(json.load(open(idx))["weight_map"].values())):
        out.update(st_read(os.path.join(d, shard)))
    return out


def st_write(path, tensors):
    """tensors: name -> (dtype string, numpy array of the bytes' element type)."""
    hdr, blobs, off = {}, [], 0
    for name in sorted(tensors):
        dt, a = tensors[name]
        raw = np.ascontiguousarray(a).tobytes()
        hdr[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def bf16_bits(x):
    """fp32 -> bf16 bit patterns, round to nearest even (finite inputs)."""
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_value(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


# ---- the tiny float model ---------------------------------------------------------------------------------
def to_f32(a):
    """a source tensor as fp32 (BF16 sources are read as their uint16 bit patterns)"""
    return bf16_value(a) if a.dtype == np.uint16 else a


def tiny_model(arch, src, d=DIMS):
    t = {k: to_f32(v) for k, v in st_read_dir(src).items()}
    H, nq, nkv, I, V, E = d["H"], d["heads"] * d["hd"], d["kv"] * d["hd"], d["I"], d["V"], d["E"]
    w = {"model.embed_tokens.weight": t["model.embed_tokens.weight"][:V, :H],
         "model.norm.weight": t["model.norm.weight"][:H], "lm_head.weight": t["lm_head.weight"][:V, :H]}
    p = "model.layers.0."
    w[p + "input_layernorm.weight"] = t[p + "input_layernorm.weight"][:H]
    w[p + "post_attention_layernorm.weight"] = t[p + "post_attention_layernorm.weight"][:H]
    for n, rows in (("q", nq), ("k", nkv), ("v", nkv)):
        w[p + f"self_attn.{n}_proj.weight"] = t[p + f"self_attn.{n}_proj.weight"][:rows, :H]
    w[p + "self_attn.o_proj.weight"] = t[p + "self_attn.o_proj.weight"][:H, :nq]
    if arch == "qwen3_moe":
        w[p + "self_attn.q_norm.weight"] = t[p + "self_attn.q_norm.weight"][:d["hd"]]
        w[p + "self_attn.k_norm.weight"] = t[p + "self_attn.k_norm.weight"][:d["hd"]]
        moe, parts = p + "mlp.", ("gate_proj", "up_proj", "down_proj")
    else:
        moe, parts = p + "block_sparse_moe.", ("w1", "w3", "w2")
    # the router scaled up: routing decisive enough that bf16 activation rounding never flips an expert choice
    w[moe + "gate.weight"] = 3.0 * t[moe + "gate.weight"][:E, :H]
    for e in range(E):
        for part in parts[:2]:
            w[moe + f"experts.{e}.{part}.weight"] = t[moe + f"experts.{e}.{part}.weight"][:I, :H]
        w[moe + f"experts.{e}.{parts[2]}.weight"] = t[moe + f"experts.{e}.{parts[2]}.weight"][:H, :I]
    return {k: np.ascontiguousarray(v, np.float32) for k, v in w.items()}


def tiny_config(arch, src, quant, d=DIMS):
    c = json.load(open(os.path.join(src, "config.json")))
    c.update(hidden_size=d["H"], num_attention_heads=d["heads"], num_key_value_heads=d["kv"], head_dim=d["hd"],
             num_hidden_layers=1, num_experts_per_tok=d["topk"], vocab_size=d["V"], num_local_experts=d["E"])
    if arch == "qwen3_moe":
        c.update(moe_intermediate_size=d["I"], intermediate_size=2 * d["I"], mlp_only_layers=[])
    else:
        c.update(intermediate_size=d["I"], head_dim=None)
    c.pop("num_experts", None)
    if quant:
        c["quantization_config"] = quant
    return c


# ---- round-to-nearest group quantization ------------------------------------------------------------------
def quantize(W, G, sym, act_order, rng, min_zero=0):
    """W [N, K] fp32 -> unsigned codes u [N, K], zeros z [N, ng], fp32 scales s [N, ng] (values of the scale dtype
    chosen by the caller later), g_idx [K]. Group g holds the channels perm[g*G:(g+1)*G]. act_order: rng is the
    permutation itself (GPTQ sorts channels by its input statistics, so projections of one input share it)."""
    N, K = W.shape
    ng = K // G
    perm = rng if act_order else np.arange(K)
    g_idx = np.empty(K, np.int32)
    g_idx[perm] = np.arange(K) // G
    u = np.zeros((N, K), np.int64)
    z = np.zeros((N, ng), np.int64)
    s = np.zeros((N, ng), np.float64)
    for g in range(ng):
        cols = perm[g * G:(g + 1) * G]
        x = W[:, cols].astype(np.float64)
        if sym:
            sc = np.abs(x).max(axis=1) / 7.0
            zz = np.full(N, 8)
        else:
            lo, hi = np.minimum(x.min(axis=1), 0), np.maximum(x.max(axis=1), 0)
            sc = (hi - lo) / 15.0
            zz = np.clip(np.round(-lo / np.where(sc > 0, sc, 1)), min_zero, 15).astype(np.int64)
        sc = np.where(sc > 0, sc, 1e-3)
        s[:, g] = sc
        z[:, g] = zz
        u[:, cols] = np.clip(np.round(x / sc[:, None]) + zz[:, None], 0, 15)
    return u, z, s, g_idx


def dequant(u, z, s32, g_idx):
    """The formula every format shares: (u - z[g]) * s[g], g = g_idx[k], in fp32 (exact for fp16/bf16 scales)."""
    return ((u - z[:, g_idx]).astype(np.float32) * s32[:, g_idx]).astype(np.float32)


def pack_words(nib, axis):
    """8 nibbles per int32 along axis (element 8j + i at bits 4i of word j), for 2-D arrays of values 0..15."""
    a = np.moveaxis(np.asarray(nib, np.uint64), axis, 0)
    a = a.reshape(a.shape[0] // 8, 8, *a.shape[1:])
    words = np.zeros(a.shape[:1] + a.shape[2:], np.uint64)
    for i in range(8):
        words |= a[:, i] << np.uint64(4 * i)
    return np.moveaxis(words.astype(np.uint32).view(np.int32), 0, axis)


# ---- the formats ------------------------------------------------------------------------------------------
def pack_gptq(W, spec, rng):
    G = spec["group"] if spec["group"] > 0 else W.shape[1]
    v1 = spec["format"] == "gptq"
    # v1 stores zero - 1 as a nibble, so a zero point of 0 cannot be written (GPTQ's own packer corrupts it)
    u, z, s, g_idx = quantize(W, G, spec["sym"], spec["act_order"], rng, min_zero=1 if v1 else 0)
    s16 = s.astype(np.float16)
    t = {"qweight": ("I32", pack_words(u.T, 0)),                         # [K/8, N] packed along K
         "qzeros": ("I32", pack_words((z - (1 if v1 else 0)).T, 1)),     # [K/G, N/8] packed along N
         "scales": ("F16", np.ascontiguousarray(s16.T)),                 # [K/G, N]
         "g_idx": ("I32", g_idx)}
    return t, dequant(u, z, s16.astype(np.float32), g_idx)


def pack_awq(W, spec, rng):
    G = spec["group"]
    u, z, s, g_idx = quantize(W, G, False, False, rng)
    s16 = s.astype(np.float16)

    def interleave(a):  # [N, X] -> [X, N/8] words, column 8c + AWQ_ORDER[i] in nibble slot i
        N = a.shape[0]
        cols = np.concatenate([8 * c + np.array(AWQ_ORDER) for c in range(N // 8)])
        return pack_words(a[cols].T, 1)

    t = {"qweight": ("I32", interleave(u)), "qzeros": ("I32", interleave(z)), "scales": ("F16", np.ascontiguousarray(s16.T))}
    return t, dequant(u, z, s16.astype(np.float32), g_idx)


def pack_ct(W, spec, rng):
    G = spec["group"] if spec["group"] > 0 else W.shape[1]
    u, z, s, g_idx = quantize(W, G, spec["sym"], spec["act_order"], rng)
    sb = bf16_bits(s)  # compressed-tensors keeps scales in the model dtype: bf16 here
    t = {"weight_packed": ("I32", pack_words(u, 1)),                     # [N, K/8]: stored q + 8 = u
         "weight_scale": ("BF16", sb),                                   # [N, K/G]
         "weight_shape": ("I64", np.array(W.shape, np.int64))}
    if not spec["sym"]:
        t["weight_zero_point"] = ("I32", pack_words(z, 0))               # [N/8, K/G]: signed zp + 8 = z
    if spec["act_order"]:
        t["weight_g_idx"] = ("I32", g_idx)
    return t, dequant(u, z, bf16_value(sb), g_idx)


def e4m3_table():
    """The 127 non-negative finite e4m3fn values, indexed by code (0x7F is NaN): bias 7, subnormals below 2^-6."""
    v = []
    for c in range(127):
        e, m = c >> 3, c & 7
        v.append(m * 2.0 ** -9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))
    return np.array(v)


def e4m3_encode(x):
    """fp32 -> e4m3fn codes, round to nearest, ties to the even code, saturating at 448."""
    t = e4m3_table()
    a = np.minimum(np.abs(x.astype(np.float64)), 448.0)
    hi = np.clip(np.searchsorted(t, a), 1, 126)
    lo = hi - 1
    dlo, dhi = a - t[lo], t[hi] - a
    code = np.where((dhi < dlo) | ((dhi == dlo) & (hi % 2 == 0)), hi, lo)
    return (code | np.where(x < 0, 0x80, 0)).astype(np.uint8)


def pack_fp8(W, spec, rng):
    """Block-wise FP8: e4m3 weights, one fp32 weight_scale_inv (the dequantization multiplier) per bn x bk block."""
    bn, bk = spec["block"]
    N, K = W.shape
    s = np.zeros(((N + bn - 1) // bn, (K + bk - 1) // bk), np.float32)
    codes = np.zeros((N, K), np.uint8)
    for i in range(s.shape[0]):
        for j in range(s.shape[1]):
            blk = W[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk]
            sc = np.float32(np.abs(blk).max() / 448.0) or np.float32(1.0)
            s[i, j] = sc
            codes[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk] = e4m3_encode(blk / sc)
    t = e4m3_table().astype(np.float32)
    val = np.where(codes & 0x80, -1, 1).astype(np.float32) * t[codes & 0x7F]
    deq = (val * np.repeat(np.repeat(s, bn, axis=0), bk, axis=1)[:N, :K]).astype(np.float32)
    return {"weight": ("F8_E4M3", codes), "weight_scale_inv": ("F32", s)}, deq


def quant_config(spec):
    if spec["kind"] == "fp8":
        return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": spec["block"],
                "modules_to_not_convert": ["lm_head", "model.layers.0.mlp.gate"]}
    g = spec["group"]
    if spec["kind"] == "gptq":
        return {"quant_method": "gptq", "bits": 4, "group_size": g, "desc_act": bool(spec["act_order"]), "sym": spec["sym"],
                "checkpoint_format": spec["format"], "static_groups": False, "true_sequential": True,
                "lm_head": spec.get("lm_head", False)}
    if spec["kind"] == "awq":
        return {"quant_method": "awq", "bits": 4, "group_size": g, "zero_point": True, "version": "gemm"}
    w = {"num_bits": 4, "type": "int", "symmetric": spec["sym"], "strategy": "group" if g > 0 else "channel",
         "group_size": g if g > 0 else None, "actorder": "group" if spec["act_order"] else None, "dynamic": False}
    return {"quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
            "config_groups": {"group_0": {"weights": w, "input_activations": None, "output_activations": None,
                                          "targets": ["Linear"]}},
            "ignore": spec.get("ignore", ["lm_head"]), "kv_cache_scheme": None}


FIXTURES = [
    dict(name="gptq-v1-sym", arch="qwen3_moe", src="qwen3-moe-f32", kind="gptq", format="gptq", group=16, sym=True,
         act_order=False, lm_head=True),
    dict(name="gptq-v1-asym-actorder", arch="qwen3_moe", src="qwen3-moe-f32", kind="gptq", format="gptq", group=16,
         sym=False, act_order=True),
    dict(name="gptq-v2-asym-channel", arch="mixtral", src="mixtral-f32-sharded", kind="gptq", format="gptq_v2",
         group=-1, sym=False, act_order=False),
    dict(name="awq-gemm", arch="qwen3_moe", src="qwen3-moe-f32", kind="awq", group=16, sym=False, act_order=False),
    dict(name="ct-sym", arch="mixtral", src="mixtral-f32-sharded", kind="ct", group=16, sym=True, act_order=False,
         ignore=["lm_head", "re:.*block_sparse_moe\\.gate$"]),
    dict(name="ct-asym-actorder-ignore", arch="qwen3_moe", src="qwen3-moe-f32", kind="ct", group=16, sym=False,
         act_order=True, ignore=["lm_head", "re:.*mlp\\.gate$", "model.layers.0.self_attn.o_proj"]),
    # block-wise FP8 (weight_block_size [128, 128] in real checkpoints; 16 x 16 here so that a matrix has several)
    dict(name="fp8-block", arch="qwen3_moe", src="qwen3-moe-f32", kind="fp8", block=[16, 16], act_order=False),
    # the fp8 preset on pre-quantized checkpoints (W4A8 with zero points, block-FP8 with 1x128 activations): every
    # K a multiple of 128, so H = I = 128 and 4 heads of 32, sliced from the trained tiny-code-moe. desc_act
    # "identity": GPTQ's desc_act flag with g_idx = k / G (the order fp8 plans accept).
    dict(name="gptq-v1-sym-g128", arch="qwen3_moe", src="tiny-code-moe", kind="gptq", format="gptq", group=128,
         sym=True, act_order="identity", dims=DIMS_K128),
    dict(name="awq-g128", arch="qwen3_moe", src="tiny-code-moe", kind="awq", group=128, sym=False, act_order=False,
         dims=DIMS_K128),
    dict(name="gptq-v2-asym-channel-k128", arch="qwen3_moe", src="tiny-code-moe", kind="gptq", format="gptq_v2",
         group=-1, sym=False, act_order=False, dims=DIMS_K128),
    dict(name="fp8-block-b128", arch="qwen3_moe", src="tiny-code-moe", kind="fp8", block=[128, 128], act_order=False,
         dims=DIMS_K128),
    # bn = 48 divides none of the row counts (q 128, k/v 64, gate/up/down 128): partial row blocks in every part
    dict(name="fp8-block-b48", arch="qwen3_moe", src="tiny-code-moe", kind="fp8", block=[48, 128], act_order=False,
         dims=DIMS_K128),
    # groups of 32 (refused by the fp8 preset): no fp32 twin needed
    dict(name="ct-sym-g32", arch="qwen3_moe", src="tiny-code-moe", kind="ct", group=32, sym=True, act_order=False,
         dims=DIMS_K64, twin=False, ignore=["lm_head", "re:.*mlp\\.gate$"]),
]


def is_quantized(spec, module):
    if module.endswith("embed_tokens") or "norm" in module or module.endswith(".gate"):
        if not (spec["kind"] == "ct" and module.endswith(".gate")):
            return False
    if module == "lm_head":
        return spec.get("lm_head", False)
    if spec["kind"] == "ct":
        import re
        for pat in spec.get("ignore", ["lm_head"]):
            if (pat.startswith("re:") and re.match(pat[3:], module)) or pat == module:
                return False
    return module.endswith("_proj") or module.split(".")[-1] in ("w1", "w2", "w3")


def make(spec, models_dir, out_dir):
    rng = np.random.default_rng(sum(spec["name"].encode()))  # a fixed seed per fixture
    src = os.path.join(models_dir, spec["src"])
    dims = spec.get("dims", DIMS)
    w = tiny_model(spec["arch"], src, dims)
    packer = {"gptq": pack_gptq, "awq": pack_awq, "ct": pack_ct, "fp8": pack_fp8}[spec["kind"]]
    qt, dq, perms = {}, {}, {}
    for name in sorted(w):
        module = name[:-len(".weight")]
        if name.endswith(".weight") and w[name].ndim == 2 and is_quantized(spec, module):
            # one act-order permutation per input: q|k|v share theirs, an expert's gate|up theirs
            head, _, last = module.rpartition(".")
            key = head + "." + {"k_proj": "q_proj", "v_proj": "q_proj", "up_proj": "gate_proj", "w3": "w1"}.get(last, last)
            if key not in perms:
                K = w[name].shape[1]
                perms[key] = np.arange(K) if spec["act_order"] == "identity" else rng.permutation(K)
            t, deq = packer(w[name], spec, perms[key])
            for suffix, v in t.items():
                qt[f"{module}.{suffix}"] = v
            dq[name] = ("F32", deq)
        else:
            b = bf16_bits(w[name])
            qt[name] = ("BF16", b)
            dq[name] = ("BF16", b)
    d = os.path.join(out_dir, spec["name"])
    twin = spec.get("twin", True)
    subs = (d, os.path.join(d, "dequant")) if twin else (d,)
    for sub in subs:
        os.makedirs(sub, exist_ok=True)
    st_write(os.path.join(d, "model.safetensors"), qt)
    if twin:
        st_write(os.path.join(d, "dequant", "model.safetensors"), dq)
    ids = ((np.arange(29) * 17 + 5) % dims["V"]).astype("<i4")  # golden_ids.i32: the prompt `fp8moe parity` reads
    for sub in subs:
        ids.tofile(os.path.join(sub, "golden_ids.i32"))
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(tiny_config(spec["arch"], src, quant_config(spec), dims), f, indent=1)
    if twin:
        with open(os.path.join(d, "dequant", "config.json"), "w") as f:
            json.dump(tiny_config(spec["arch"], src, None, dims), f, indent=1)
    print(f"{d}: {len(qt)} tensors, {sum(1 for v in dq.values() if v[0] == 'F32')} quantized linears")


def main():
    """pack_quantized.py [OUT [NAME...]]: every fixture, or the named ones"""
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/data/quant"
    names = sys.argv[2:]
    for spec in FIXTURES:
        if not names or spec["name"] in names:
            make(spec, "models" if spec["src"] == "tiny-code-moe" else "tests/models", out)


if __name__ == "__main__":
    main()
