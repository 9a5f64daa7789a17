"""Qwen3-MoE in plain PyTorch, with transformers' tensor names and arithmetic, for machines without transformers.

What transformers' Qwen3MoeForCausalLM computes (eager attention): RMSNorm in fp32; q and k RMS-normed per head,
then rotary embeddings (rotate-half layout, default rope); grouped-query causal attention scaled by head_dim^-0.5;
a softmax router over the experts, top-k, renormalised when norm_topk_prob; SiLU-gated experts; untied lm_head.
state_dict() keys are the checkpoint's tensor names (model.layers.N.mlp.experts.E.gate_proj.weight, ...), so
save_safetensors() writes a directory that transformers and fp8moe load as a Qwen3-MoE checkpoint.
"""
import json
import struct

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        dt = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dt)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.nh, self.nkv, self.hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        h = c["hidden_size"]
        self.q_proj = nn.Linear(h, self.nh * self.hd, bias=False)
        self.k_proj = nn.Linear(h, self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(h, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, h, bias=False)
        self.q_norm = RMSNorm(self.hd, c["rms_norm_eps"])
        self.k_norm = RMSNorm(self.hd, c["rms_norm_eps"])

    def forward(self, x, cos, sin, past):
        b, t, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, t, self.nh, self.hd)).transpose(1, 2)  # (B, nh, T, hd)
        k = self.k_norm(self.k_proj(x).view(b, t, self.nkv, self.hd)).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.nkv, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if past is not None:
            k, v = torch.cat([past[0], k], 2), torch.cat([past[1], v], 2)
        rep = self.nh // self.nkv
        kk, vv = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        s = q @ kk.transpose(-1, -2) * self.hd ** -0.5  # (B, nh, T, S)
        n = kk.shape[2]
        mask = torch.ones(t, n, dtype=torch.bool, device=x.device).tril(n - t)
        s = s.masked_fill(~mask, float("-inf"))
        o = (F.softmax(s.float(), dim=-1).to(q.dtype) @ vv).transpose(1, 2).reshape(b, t, -1)
        return self.o_proj(o), (k, v)


class Expert(nn.Module):
    def __init__(self, h, i):
        super().__init__()
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class SparseMoe(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.k, self.norm_topk = c["num_experts_per_tok"], c["norm_topk_prob"]
        self.gate = nn.Linear(c["hidden_size"], c["num_experts"], bias=False)
        self.experts = nn.ModuleList(Expert(c["hidden_size"], c["moe_intermediate_size"])
                                     for _ in range(c["num_experts"]))

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        logits = self.gate(x)
        p = F.softmax(logits, dim=-1, dtype=torch.float)
        w, sel = torch.topk(p, self.k, dim=-1)
        if self.norm_topk:
            w = w / w.sum(-1, keepdim=True)
        w = w.to(x.dtype)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            rows, slot = torch.where(sel == e)
            if rows.numel():
                out.index_add_(0, rows, expert(x[rows]) * w[rows, slot, None])
        return out.reshape(shape), logits


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.mlp = SparseMoe(c)

    def forward(self, x, cos, sin, past):
        a, kv = self.self_attn(self.input_layernorm(x), cos, sin, past)
        x = x + a
        m, logits = self.mlp(self.post_attention_layernorm(x))
        return x + m, kv, logits


class Body(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList(Layer(c) for _ in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])


class Qwen3Moe(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.model = Body(c)
        self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
        hd = c["head_dim"]
        self.register_buffer("inv_freq", 1.0 / (c["rope_parameters"]["rope_theta"] **
                                                 (torch.arange(0, hd, 2, dtype=torch.float) / hd)), persistent=False)
        for m in self.modules():  # transformers' initialisation: normal(0, initializer_range), norms at one
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=c["initializer_range"])

    def hidden(self, ids, past=None):
        """Final-norm hidden states (B, T, H), the new cache, and each layer's router logits."""
        start = 0 if past is None else past[0][0].shape[2]
        pos = torch.arange(start, start + ids.shape[1], dtype=torch.float, device=ids.device)
        ang = torch.outer(pos, self.inv_freq)
        ang = torch.cat([ang, ang], -1)
        cos, sin = ang.cos(), ang.sin()
        x = self.model.embed_tokens(ids)
        cache, routers = [], []
        for i, layer in enumerate(self.model.layers):
            x, kv, logits = layer(x, cos.to(x.dtype), sin.to(x.dtype), None if past is None else past[i])
            cache.append(kv)
            routers.append(logits)
        return self.model.norm(x), cache, routers

    def forward(self, ids, past=None):
        h, cache, _ = self.hidden(ids, past)
        return self.lm_head(h), cache


def load_balancing_loss(routers, k):
    """Switch-style auxiliary loss over all layers' router logits (as transformers adds it for Qwen3-MoE)."""
    logits = torch.cat(routers, 0)
    p = F.softmax(logits, dim=-1, dtype=torch.float)
    e = p.shape[-1]
    sel = torch.topk(p, k, dim=-1).indices
    frac = F.one_hot(sel, e).float().mean(0)  # (k, E): share of tokens routed to each expert per slot
    return e * (frac * p.mean(0)).sum()


def round_bf16_(model):
    """Rounds every parameter to bf16 (kept as fp32): what a bf16 checkpoint holds."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())


def save_safetensors(model, path):
    """model.safetensors in bf16, tensors sorted by name, as transformers' save_pretrained writes them."""
    sd = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(sd):
        t = sd[name]
        raw = t.view(torch.int16).numpy().tobytes()
        header[name] = {"dtype": "BF16", "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def load_safetensors(model, path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    sd = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        raw = bytearray(data[8 + n + a:8 + n + b])
        sd[name] = torch.frombuffer(raw, dtype=torch.int16).view(torch.bfloat16).float().reshape(info["shape"])
    model.load_state_dict(sd)
    return model
