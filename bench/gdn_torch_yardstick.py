#!/usr/bin/env python3
"""The Gated DeltaNet's chunked rule in transformers' own torch implementation, timed on the GPU: the yardstick for
our tensor-core kernels (src/backend/cuda/gdn_chunked_tc.cu). One-off, run on the GPU machine (it has torch and
transformers); never a dependency of the engine.

Shapes are one Qwen3-Next-80B-A3B GDN layer: 32 value heads of 128 (the 16 key heads repeated to 32, as the model
does before the rule), q and k of 128, bf16 inputs, one sequence of T tokens. Times the rule alone (l2-normalised q/k
inside it, as the model calls it), CUDA events, the median of the repeats after warm-up.

    python3 bench/gdn_torch_yardstick.py [--tokens 2048,8192] [--repeat 10]

Prints one line per T: ms per layer. Compare with `fp8moe bench prefill --synthetic qwen3-next-80b-a3b --layers 4
--tokens T`, whose 'gated deltanet' stage holds 3 GDN layers (conv and gated norm included)."""
import argparse
import inspect
import statistics

import torch


def find_rule():
    from transformers.models.qwen3_next import modeling_qwen3_next as m

    for name in ("torch_chunk_gated_delta_rule", "chunk_gated_delta_rule"):
        fn = getattr(m, name, None)
        if fn is not None:
            return name, fn
    raise SystemExit("transformers has no torch_chunk_gated_delta_rule in modeling_qwen3_next")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="2048,8192")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--dim", type=int, default=128)
    a = ap.parse_args()
    name, rule = find_rule()
    params = inspect.signature(rule).parameters
    print(f"transformers {__import__('transformers').__version__}, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name()}: {name}{inspect.signature(rule)}")
    torch.manual_seed(0)
    H, D = a.heads, a.dim
    for T in (int(t) for t in a.tokens.split(",")):
        dev, bf = "cuda", torch.bfloat16
        q = torch.randn(1, T, H, D, device=dev, dtype=bf)
        k = torch.randn(1, T, H, D, device=dev, dtype=bf)
        v = torch.randn(1, T, H, D, device=dev, dtype=bf)
        beta = torch.rand(1, T, H, device=dev, dtype=bf)
        g = -torch.rand(1, T, H, device=dev, dtype=torch.float32) * 0.5  # log-decays, as the model's g
        kw = {}
        if "use_qk_l2norm_in_kernel" in params:
            kw["use_qk_l2norm_in_kernel"] = True
        if "output_final_state" in params:
            kw["output_final_state"] = True

        def run():
            return rule(q, k, v, g=g, beta=beta, **kw)

        for _ in range(2):
            run()
        torch.cuda.synchronize()
        times = []
        for _ in range(a.repeat):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            run()
            e.record()
            torch.cuda.synchronize()
            times.append(s.elapsed_time(e))
        print(f"T = {T}: {statistics.median(times):.3f} ms per GDN layer (median of {a.repeat}; min {min(times):.3f})")


if __name__ == "__main__":
    main()
