#!/usr/bin/env python3
"""Golden tiny checkpoints made by Hugging Face transformers itself, with transformers' fp32 logits.

Run on the GPU machine (its python has torch and transformers 5.x); CPU is enough:
    python3 tools/make_golden.py tests/models
Each model directory gets config.json, safetensors weights (save_pretrained), and
    golden_ids.i32     little-endian int32 token ids (fixed sequence, odd length)
    golden_logits.f32  transformers' logits [T, vocab], fp32 forward, eager attention
    golden.json        versions, shapes, the smallest top-k routing margin seen (how decisive routing is)
Weights are redrawn so that routing is decisive (router logits of std ~4) and a few residual channels are
large (outlier embedding columns), unlike the near-zero default init.
"""
import json
import math
import os
import shutil
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers import MixtralConfig, MixtralForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

SEQ_LEN = 37


def redraw(model, seed, outlier_channels):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                w = torch.randn(p.shape, generator=g)
                w[:, outlier_channels] *= 12.0
                p.copy_(w)
            elif name.endswith("mlp.gate.weight") or "block_sparse_moe.gate" in name or name.endswith("router.weight"):
                p.copy_(4.0 * torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))
            else:
                # fan-in is the last dimension for [out, in] linears and fused [E, out, in] expert banks
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))


def routing_margin(model, ids):
    """Smallest gap between the k-th and (k+1)-th router probability over all tokens and MoE layers."""
    margins = []

    def hook(mod, inp, out):
        logits = out[0] if isinstance(out, tuple) else out
        if logits.dim() != 2:
            return
        p = torch.softmax(logits.float(), dim=-1)
        top = torch.topk(p, k=model.config.num_experts_per_tok + 1, dim=-1).values
        margins.append(float((top[:, -2] - top[:, -1]).min()))

    hooks = []
    for name, mod in model.named_modules():
        if name.endswith("mlp.gate") or name.endswith("block_sparse_moe.gate"):
            if isinstance(mod, torch.nn.Linear):
                hooks.append(mod.register_forward_hook(hook))
            else:  # v5 router module: hook its linear computation through the weight
                def pre(mod, inp):
                    x = inp[0].reshape(-1, inp[0].shape[-1])
                    hook(mod, None, torch.nn.functional.linear(x.float(), mod.weight.float()))
                hooks.append(mod.register_forward_pre_hook(pre))
    with torch.no_grad():
        model(ids)
    for h in hooks:
        h.remove()
    return min(margins) if margins else None


def logits_of(model, ids):
    with torch.no_grad():
        return model(ids).logits[0].float().contiguous()


def write_golden(path, model, ids, logits, extra):
    ids.to(torch.int32).numpy().tofile(os.path.join(path, "golden_ids.i32"))
    logits.numpy().astype("<f4").tofile(os.path.join(path, "golden_logits.f32"))
    meta = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "tokens": int(ids.shape[1]),
        "vocab": int(logits.shape[1]),
        "max_abs_logit": float(logits.abs().max()),
        "min_routing_margin": routing_margin(model, ids),
        "attn_implementation": "eager",
    }
    meta.update(extra)
    with open(os.path.join(path, "golden.json"), "w") as f:
        json.dump(meta, f, indent=2)
    print(path, json.dumps(meta))


MIN_MARGIN = 1e-3


def build(cls, cfg, seed, outliers, ids, min_margin=MIN_MARGIN):
    """Draws weights, retrying seeds until every top-k choice on ids beats the next expert by MIN_MARGIN
    in probability, so that rounding differences cannot flip a routing decision between fp32 readers."""
    best = None
    for attempt in range(200):
        s = seed + 1000 * attempt
        torch.manual_seed(s)
        model = cls(cfg).float().eval()
        redraw(model, s, outliers)
        if hasattr(model, "tie_weights"):
            model.tie_weights()
        margin = routing_margin(model, ids)
        if best is None or margin > best[0]:
            best = (margin, s)
        if margin >= min_margin:
            print("seed", s, "margin", margin)
            return model
    raise SystemExit("no seed gave a routing margin >= %g (best %g at seed %d)" % (min_margin, best[0], best[1]))


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    torch.set_grad_enabled(False)

    # 1. Qwen3-MoE with an explicit head_dim (q_proj out 128 != hidden 96), GQA 4/2, 8 experts top-2.
    cfg = Qwen3MoeConfig(vocab_size=320, hidden_size=96, num_hidden_layers=3, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=32, num_experts=8, num_experts_per_tok=2,
                         moe_intermediate_size=48, intermediate_size=160, norm_topk_prob=True,
                         rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=256,
                         tie_word_embeddings=False, attn_implementation="eager")
    ids = torch.randint(0, cfg.vocab_size, (1, SEQ_LEN), generator=torch.Generator().manual_seed(7))
    model = build(Qwen3MoeForCausalLM, cfg, 1, [5, 40], ids)
    d = os.path.join(out, "qwen3-moe-f32")
    shutil.rmtree(d, ignore_errors=True)
    model.save_pretrained(d, safe_serialization=True)
    write_golden(d, model, ids, logits_of(model, ids), {"dtype": "F32", "layout": "per-expert (save_pretrained)"})

    # 1b. the same model saved in bf16; golden = fp32 forward of the bf16-rounded weights (what a reader computes)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    d = os.path.join(out, "qwen3-moe-bf16")
    shutil.rmtree(d, ignore_errors=True)
    model.to(torch.bfloat16).save_pretrained(d, safe_serialization=True)
    # what a reader of the bf16 file computes in fp32: transformers itself loading it in fp32 (this also
    # recomputes the RoPE inv_freq buffer in fp32, which .to(bfloat16) had rounded)
    model = Qwen3MoeForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
    bf_logits = logits_of(model, ids)
    write_golden(d, model, ids, bf_logits, {"dtype": "BF16", "layout": "per-expert (save_pretrained)"})

    # 1c. the same bf16 weights as transformers v5 holds them in memory: fused 3-D expert tensors
    #     (mlp.experts.gate_up_proj [E, 2I, H], mlp.experts.down_proj [E, H, I]), written with save_file.
    d = os.path.join(out, "qwen3-moe-fused-bf16")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    sd = {k: v.to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    save_file(sd, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(os.path.join(out, "qwen3-moe-bf16", "config.json"), d)
    write_golden(d, model, ids, bf_logits, {"dtype": "BF16", "layout": "fused 3-D experts (v5 state_dict)",
                                            "keys": sorted(k for k in sd if ".layers.0." in k)})

    # 2. Qwen3-MoE with tied embeddings, a dense mlp_only layer, norm_topk_prob false, head_dim implied.
    cfg = Qwen3MoeConfig(vocab_size=256, hidden_size=64, num_hidden_layers=4, num_attention_heads=2,
                         num_key_value_heads=1, num_experts=16, num_experts_per_tok=4,
                         moe_intermediate_size=32, intermediate_size=128, norm_topk_prob=False,
                         mlp_only_layers=[1], decoder_sparse_step=1, rms_norm_eps=1e-5,
                         rope_theta=1000000.0, max_position_embeddings=256, tie_word_embeddings=True,
                         attn_implementation="eager")
    ids = torch.randint(0, cfg.vocab_size, (1, SEQ_LEN), generator=torch.Generator().manual_seed(8))
    # 16 experts top-4 over 3 MoE layers: 1e-4 is the best margin reachable in 200 draws (still ~100x
    # the difference between two fp32 readers)
    model = build(Qwen3MoeForCausalLM, cfg, 2, [3, 17, 50], ids, min_margin=1e-4)
    d = os.path.join(out, "qwen3-moe-tied-f32")
    shutil.rmtree(d, ignore_errors=True)
    model.save_pretrained(d, safe_serialization=True)
    write_golden(d, model, ids, logits_of(model, ids), {"dtype": "F32", "layout": "per-expert, tied, mlp_only [1]"})

    # 3. Mixtral, sharded (model.safetensors.index.json).
    cfg = MixtralConfig(vocab_size=300, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, intermediate_size=96, num_local_experts=8,
                        num_experts_per_tok=2, rms_norm_eps=1e-5, rope_theta=1000000.0,
                        max_position_embeddings=256, sliding_window=None, tie_word_embeddings=False,
                        attn_implementation="eager")
    ids = torch.randint(0, cfg.vocab_size, (1, SEQ_LEN), generator=torch.Generator().manual_seed(9))
    model = build(MixtralForCausalLM, cfg, 3, [9, 33], ids)
    d = os.path.join(out, "mixtral-f32-sharded")
    shutil.rmtree(d, ignore_errors=True)
    model.save_pretrained(d, safe_serialization=True, max_shard_size="400KB")
    write_golden(d, model, ids, logits_of(model, ids), {"dtype": "F32", "layout": "per-expert, sharded"})
    print("files:", sorted(os.listdir(d)))


if __name__ == "__main__":
    main()
