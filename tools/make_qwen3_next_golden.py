#!/usr/bin/env python3
"""Golden tiny Qwen3-Next checkpoints made by Hugging Face transformers itself (Qwen3NextForCausalLM), with
transformers' fp32 logits and greedy generations: the oracle of the CPU reference for model_type qwen3_next.

Run on the GPU machine (its python has torch and transformers 5.x, no network); CPU is enough:
    python3 tools/make_qwen3_next_golden.py tests/models [DEBUG_DIR]
Writes three model directories (the same files as tools/make_golden.py and tools/make_golden_generate.py write
for the other tiny models):
    qwen3-next-f32       4 layers: linear, full, linear, linear attention; layer 1 a dense MLP (mlp_only_layers),
                         the others MoE (8 experts top-2, shared expert); GDN 2 key heads / 4 value heads;
                         partial_rotary_factor 0.25; fp32
    qwen3-next-bf16      the same model saved in bf16; golden = transformers' fp32 forward of the bf16 file
    qwen3-next-tied-f32  3 layers from full_attention_interval = 3 (linear, linear, full); tied embeddings;
                         GDN 2 / 2 heads, conv kernel 3; partial_rotary_factor 0.5; norm_topk_prob false
each with config.json, generation_config.json, model.safetensors and
    golden_ids.i32         little-endian int32 token ids (77: odd, and past the 64-token chunk of the GDN rule)
    golden_logits.f32      transformers' logits [T, vocab], fp32 forward, eager attention
    golden.json            versions, shapes, the smallest top-k routing margin seen, layer-0/1 tensor names
    golden_generate.json   a 12-id prompt and the 32 ids generate(do_sample=False) returns (prefill with the
                           chunked delta rule, then cached steps with the recurrent one)
Everything runs on the CPU, where transformers takes its torch implementations of the gated delta rule, the
causal conv1d and the gated RMSNorm (the optional fla / causal-conv1d kernels are for CUDA tensors).
DEBUG_DIR (optional) receives each layer's token-mixer and MLP outputs of qwen3-next-f32 (debug.f32 + debug.json)
and a copy of the installed modeling file; nothing there is committed.
"""
import json
import math
import os
import shutil
import struct
import sys

import torch
import transformers
import transformers.models.qwen3_next.modeling_qwen3_next as mq
from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

SEQ_LEN = 77
NEW = 32
MIN_GEN_MARGIN = 1e-3

# which GDN paths run: on the CPU the torch implementations (the optional fla / causal-conv1d kernels need CUDA)
FLA_PRESENT = bool(getattr(mq, "is_fast_path_available", False))


def redraw(model, seed, outlier_channels):
    """Weights of a trained-looking scale: zero-centred norms (Qwen3NextRMSNorm multiplies by 1 + w) drawn around 0,
    the gated norm around 1, decisive routers, GDN decays between ~0.3 and ~0.97 per token, outlier embedding
    columns."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("linear_attn.norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("norm.weight") or "layernorm" in name:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("A_log"):
                p.copy_(torch.log(0.05 + 0.5 * torch.rand(p.shape, generator=g)))
            elif name.endswith("dt_bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                w = torch.randn(p.shape, generator=g)
                w[:, outlier_channels] *= 12.0
                p.copy_(w)
            elif name.endswith("mlp.gate.weight"):
                p.copy_(4.0 * torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))
            else:
                # fan-in is the last dimension ([out, in] linears, [E, out, in] banks, conv1d [C, 1, K])
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))


def routing_margin(model, ids):
    """Smallest gap between the k-th and (k+1)-th router probability over all tokens and MoE layers."""
    margins = []

    def pre(mod, inp):
        x = inp[0].reshape(-1, inp[0].shape[-1])
        p = torch.softmax(torch.nn.functional.linear(x.float(), mod.weight.float()), dim=-1)
        top = torch.topk(p, k=model.config.num_experts_per_tok + 1, dim=-1).values
        margins.append(float((top[:, -2] - top[:, -1]).min()))

    hooks = [mod.register_forward_pre_hook(pre) for name, mod in model.named_modules() if name.endswith("mlp.gate")]
    with torch.no_grad():
        model(ids)
    for h in hooks:
        h.remove()
    return min(margins) if margins else None


def logits_of(model, ids):
    with torch.no_grad():
        return model(ids).logits[0].float().contiguous()


def check_rotary(model):
    cfg = model.config
    rp = getattr(cfg, "rope_parameters", None) or {}
    prf = rp.get("partial_rotary_factor", getattr(cfg, "partial_rotary_factor", None))
    n = model.model.rotary_emb.inv_freq.numel()
    want = int(cfg.head_dim * prf) // 2
    print("partial_rotary_factor", prf, "inv_freq", n, "want", want)
    assert n == want, "rotary dims do not follow partial_rotary_factor"
    return prf


def write_golden(path, model, ids, logits, extra):
    ids.to(torch.int32).numpy().tofile(os.path.join(path, "golden_ids.i32"))
    logits.numpy().astype("<f4").tofile(os.path.join(path, "golden_logits.f32"))
    sd = model.state_dict()
    meta = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "fast_path_available": FLA_PRESENT,
        "tokens": int(ids.shape[1]),
        "vocab": int(logits.shape[1]),
        "max_abs_logit": float(logits.abs().max()),
        "min_routing_margin": routing_margin(model, ids),
        "attn_implementation": "eager",
        "layer_types": list(model.config.layer_types),
        "partial_rotary_factor": check_rotary(model),
        "keys": {k: list(v.shape) for k, v in sd.items() if ".layers.0." in k or ".layers.1." in k},
    }
    meta.update(extra)
    with open(os.path.join(path, "golden.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(path, json.dumps({k: v for k, v in meta.items() if k != "keys"}))


def write_generate(path, model, ids):
    """golden_generate.json as tools/make_golden_generate.py writes it (the first near-tie-free 12-id prompt)."""
    best = None
    flat = ids[0].tolist()
    for attempt in range(8):
        prompt = flat[attempt * 7:attempt * 7 + 12]
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=NEW, min_new_tokens=0,
                                 output_scores=True, return_dict_in_generate=True, pad_token_id=0)
        new_ids = out.sequences[0, len(prompt):].tolist()
        m = min(float(torch.topk(s[0].float(), 2).values[0] - torch.topk(s[0].float(), 2).values[1])
                for s in out.scores)
        if best is None or m > best["min_margin"]:
            best = {"prompt": prompt, "new_ids": new_ids, "min_margin": m, "prompt_offset": attempt * 7}
        if m >= MIN_GEN_MARGIN:
            break
    best.update({"transformers": transformers.__version__, "torch": torch.__version__, "dtype": "float32",
                 "attn_implementation": "eager", "do_sample": False, "max_new_tokens": NEW,
                 "eos_token_id": model.generation_config.eos_token_id})
    with open(os.path.join(path, "golden_generate.json"), "w") as f:
        json.dump(best, f, indent=1)
    print(path, "generate: margin %.4g, %d new ids" % (best["min_margin"], len(best["new_ids"])))


def build(cfg, seed, outliers, ids, min_margin=1e-4):
    """Draws weights, retrying seeds until every top-k choice on ids beats the next expert by min_margin in
    probability (77 tokens over 3 MoE layers: 1e-4, still ~100x the difference between two fp32 readers); the
    best seed of 200 otherwise."""
    best = None
    for attempt in range(200):
        s = seed + 1000 * attempt
        torch.manual_seed(s)
        model = Qwen3NextForCausalLM(cfg).float().eval()
        redraw(model, s, outliers)
        if cfg.tie_word_embeddings:
            model.tie_weights()
        margin = routing_margin(model, ids)
        if best is None or margin > best[0]:
            best = (margin, s)
        if margin >= min_margin:
            print("seed", s, "margin", margin)
            return model
    print("no seed gave a routing margin >= %g: best %g at seed %d" % (min_margin, best[0], best[1]))
    torch.manual_seed(best[1])
    model = Qwen3NextForCausalLM(cfg).float().eval()
    redraw(model, best[1], outliers)
    if cfg.tie_word_embeddings:
        model.tie_weights()
    return model


def make_config(**kw):
    """Qwen3NextConfig with partial_rotary_factor given both ways (the legacy keyword and rope_parameters)."""
    prf = kw.pop("partial_rotary_factor")
    theta = kw.pop("rope_theta")
    rope = {"rope_type": "default", "rope_theta": theta, "partial_rotary_factor": prf}
    try:
        return Qwen3NextConfig(rope_parameters=rope, partial_rotary_factor=prf, **kw)
    except TypeError as e:
        print("config without the partial_rotary_factor keyword:", e)
        return Qwen3NextConfig(rope_parameters=rope, **kw)


def dump_debug(model, ids, out):
    """Each layer's token mixer and MLP output, [T, H] fp32 each, in layer order."""
    os.makedirs(out, exist_ok=True)
    shutil.copy(mq.__file__, os.path.join(out, "modeling_qwen3_next.py"))
    recs = []
    hooks = []
    for l, layer in enumerate(model.model.layers):
        mixer = layer.linear_attn if hasattr(layer, "linear_attn") else layer.self_attn
        for what, mod in (("mixer", mixer), ("mlp", layer.mlp)):
            def hook(mod, inp, outp, l=l, what=what):
                o = outp[0] if isinstance(outp, tuple) else outp
                recs.append(("L%d.%s" % (l, what), o[0].float().contiguous()))
            hooks.append(mod.register_forward_hook(hook))
    with torch.no_grad():
        model(ids)
    for h in hooks:
        h.remove()
    index = []
    with open(os.path.join(out, "debug.f32"), "wb") as f:
        for name, t in recs:
            index.append({"name": name, "shape": list(t.shape)})
            f.write(t.numpy().astype("<f4").tobytes())
    with open(os.path.join(out, "debug.json"), "w") as f:
        json.dump(index, f, indent=1)


def save(model, d, dtype_name, ids, logits, layout):
    write_golden(d, model, ids, logits, {"dtype": dtype_name, "layout": layout})
    write_generate(d, model, ids)
    print("files:", sorted(os.listdir(d)), sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d)), "bytes")


def main():
    out = sys.argv[1]
    debug = sys.argv[2] if len(sys.argv) > 2 else None
    os.makedirs(out, exist_ok=True)
    torch.set_grad_enabled(False)
    print("transformers", transformers.__version__, "torch", torch.__version__, "fla present", FLA_PRESENT)

    # 1. both layer kinds, a dense mlp_only layer, GQA 4/2 with head_dim 24 (rotary dims 6), GDN 2 key / 4 value
    #    heads (key head 16, value head 12), 8 experts top-2 with a shared expert.
    cfg = make_config(vocab_size=256, hidden_size=64, num_hidden_layers=4,
                      layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention"],
                      num_attention_heads=4, num_key_value_heads=2, head_dim=24, partial_rotary_factor=0.25,
                      linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                      linear_value_head_dim=12, linear_conv_kernel_dim=4, num_experts=8, num_experts_per_tok=2,
                      moe_intermediate_size=16, shared_expert_intermediate_size=40, intermediate_size=48,
                      mlp_only_layers=[1], decoder_sparse_step=1, norm_topk_prob=True, rms_norm_eps=1e-6,
                      rope_theta=10000.0, max_position_embeddings=256, tie_word_embeddings=False,
                      attn_implementation="eager")
    ids = torch.randint(0, cfg.vocab_size, (1, SEQ_LEN), generator=torch.Generator().manual_seed(11))
    model = build(cfg, 21, [5, 40], ids)
    d = os.path.join(out, "qwen3-next-f32")
    shutil.rmtree(d, ignore_errors=True)
    model.save_pretrained(d, safe_serialization=True)
    save(model, d, "F32", ids, logits_of(model, ids), "save_pretrained")
    if debug:
        dump_debug(model, ids, debug)

    # 1b. the same model in bf16; golden = transformers' fp32 forward of the bf16 file
    d = os.path.join(out, "qwen3-next-bf16")
    shutil.rmtree(d, ignore_errors=True)
    model.to(torch.bfloat16).save_pretrained(d, safe_serialization=True)
    model = Qwen3NextForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
    save(model, d, "BF16", ids, logits_of(model, ids), "save_pretrained")

    # 2. full_attention_interval 3 (no layer_types given), tied embeddings, GDN heads 2 / 2 (key 8, value 10),
    #    conv kernel 3, head_dim 16 with partial_rotary_factor 0.5, 4 experts top-2 unnormalised.
    cfg = make_config(vocab_size=200, hidden_size=48, num_hidden_layers=3, full_attention_interval=3,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16, partial_rotary_factor=0.5,
                      linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=8,
                      linear_value_head_dim=10, linear_conv_kernel_dim=3, num_experts=4, num_experts_per_tok=2,
                      moe_intermediate_size=16, shared_expert_intermediate_size=24, intermediate_size=32,
                      norm_topk_prob=False, rms_norm_eps=1e-5, rope_theta=1000000.0, max_position_embeddings=256,
                      tie_word_embeddings=True, attn_implementation="eager")
    assert list(cfg.layer_types) == ["linear_attention", "linear_attention", "full_attention"], cfg.layer_types
    ids = torch.randint(0, cfg.vocab_size, (1, SEQ_LEN), generator=torch.Generator().manual_seed(12))
    model = build(cfg, 22, [3, 17], ids)
    d = os.path.join(out, "qwen3-next-tied-f32")
    shutil.rmtree(d, ignore_errors=True)
    model.save_pretrained(d, safe_serialization=True)
    save(model, d, "F32", ids, logits_of(model, ids), "save_pretrained, tied")


if __name__ == "__main__":
    main()
