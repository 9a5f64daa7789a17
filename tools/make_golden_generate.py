#!/usr/bin/env python3
"""Greedy generations by transformers' own generate(do_sample=False), the oracle for fp8moe's decode loop.

Run on the GPU machine (its python has torch and transformers); CPU is enough:
    python3 tools/make_golden_generate.py
For each model below, writes DIR/golden_generate.json: the prompt ids, the 32 new ids transformers generates in
fp32 (eager attention; an eos id, when the model has one and emits it, ends the list as transformers returns it),
and the smallest margin between the top-1 and top-2 logits over the steps. A prompt whose margin is below
MIN_MARGIN (a near tie that fp32 summation order could flip) is replaced by the next candidate prompt.
"""
import json
import os
import struct
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM

NEW = 32
MIN_MARGIN = 1e-3
MODELS = [
    ("tests/models/qwen3-moe-f32", "golden_ids.i32"),
    ("tests/models/qwen3-moe-bf16", "golden_ids.i32"),
    ("tests/models/qwen3-moe-tied-f32", "golden_ids.i32"),
    ("tests/models/mixtral-f32-sharded", "golden_ids.i32"),
    ("models/tiny-code-moe", "eval_ids.i32"),
]


def read_ids(path, n, offset):
    with open(path, "rb") as f:
        data = f.read()
    ids = struct.unpack("<%di" % (len(data) // 4), data)
    return list(ids[offset:offset + n])


def main():
    torch.manual_seed(0)
    for d, ids_file in MODELS:
        model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
        best = None
        for attempt in range(12):
            n_prompt = 12 if "tests/" in d else 24
            prompt = read_ids(os.path.join(d, ids_file), n_prompt, attempt * 7)
            if len(prompt) < n_prompt:
                break
            with torch.no_grad():
                out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=NEW, min_new_tokens=0,
                                     output_scores=True, return_dict_in_generate=True, pad_token_id=0)
            new_ids = out.sequences[0, len(prompt):].tolist()
            margins = []
            for s in out.scores:
                top2 = torch.topk(s[0].float(), 2).values
                margins.append(float(top2[0] - top2[1]))
            m = min(margins)
            if best is None or m > best["min_margin"]:
                best = {"prompt": prompt, "new_ids": new_ids, "min_margin": m, "prompt_offset": attempt * 7}
            if m >= MIN_MARGIN:
                break
        best.update({"transformers": transformers.__version__, "torch": torch.__version__, "dtype": "float32",
                     "attn_implementation": "eager", "do_sample": False, "max_new_tokens": NEW,
                     "eos_token_id": model.generation_config.eos_token_id})
        with open(os.path.join(d, "golden_generate.json"), "w") as f:
            json.dump(best, f, indent=1)
        print("%-36s prompt %2d ids at %3d, %2d new ids, min top-1/top-2 margin %.4g" %
              (d, len(best["prompt"]), best["prompt_offset"], len(best["new_ids"]), best["min_margin"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
