#!/usr/bin/env python3
"""A bf16 checkpoint at Qwen3-30B-A3B's widths (L layers, a 4096-token vocabulary) for timing the loader where no
real checkpoint fits: values tiled from one block of random gaussians (the load does not look at them), written with
the standard library only. Usage: tools/timing_checkpoint.py OUT_DIR LAYERS; then `fp8moe requantize --model OUT_DIR
--out INT4_DIR` makes its int4 twin (bench/NOTES.md 2026-12-05)."""
import json, os, random, struct, sys
out, L = sys.argv[1], int(sys.argv[2])
H, NH, KV, HD, E, I, V = 2048, 32, 4, 128, 128, 768, 4096
os.makedirs(out, exist_ok=True)
random.seed(1)
def bf16(x): return struct.pack('<f', x)[2:]
block = b''.join(bf16(random.gauss(0, 0.02)) for _ in range(1 << 16))
ones = bf16(1.0) * 8192
tensors = []
def add(name, shape, one=False): tensors.append((name, shape, one))
add('model.embed_tokens.weight', [V, H]); add('model.norm.weight', [H], True); add('lm_head.weight', [V, H])
for l in range(L):
    p = f'model.layers.{l}.'
    add(p+'input_layernorm.weight', [H], True); add(p+'post_attention_layernorm.weight', [H], True)
    add(p+'self_attn.q_proj.weight', [NH*HD, H]); add(p+'self_attn.k_proj.weight', [KV*HD, H])
    add(p+'self_attn.v_proj.weight', [KV*HD, H]); add(p+'self_attn.o_proj.weight', [H, NH*HD])
    add(p+'self_attn.q_norm.weight', [HD], True); add(p+'self_attn.k_norm.weight', [HD], True)
    add(p+'mlp.gate.weight', [E, H])
    for e in range(E):
        add(p+f'mlp.experts.{e}.gate_proj.weight', [I, H]); add(p+f'mlp.experts.{e}.up_proj.weight', [I, H])
        add(p+f'mlp.experts.{e}.down_proj.weight', [H, I])
hdr, off = {}, 0
for name, shape, one in tensors:
    n = 2
    for d in shape: n *= d
    hdr[name] = {'dtype': 'BF16', 'shape': shape, 'data_offsets': [off, off + n]}; off += n
h = json.dumps(hdr).encode(); h += b' ' * (-len(h) % 8)
with open(os.path.join(out, 'model.safetensors'), 'wb') as f:
    f.write(struct.pack('<Q', len(h))); f.write(h)
    for name, shape, one in tensors:
        n = 2
        for d in shape: n *= d
        src = ones if one else block
        while n > 0:
            k = min(n, len(src)); f.write(src[:k]); n -= k
cfg = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": H, "num_hidden_layers": L,
       "num_attention_heads": NH, "num_key_value_heads": KV, "head_dim": HD, "num_experts": E, "num_experts_per_tok": 8,
       "moe_intermediate_size": I, "intermediate_size": 6144, "vocab_size": V, "rms_norm_eps": 1e-6, "rope_theta": 1e6,
       "max_position_embeddings": 40960, "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
       "tie_word_embeddings": False, "torch_dtype": "bfloat16", "attention_bias": False, "hidden_act": "silu"}
json.dump(cfg, open(os.path.join(out, 'config.json'), 'w'), indent=1)
