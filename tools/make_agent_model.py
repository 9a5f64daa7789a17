#!/usr/bin/env python3
"""tests/models/tiny-agent: a tiny Qwen3-MoE agent model trained by transformers, and its golden generations.

Run on the GPU machine (its python has torch, transformers and tokenizers; no network needed), from a folder
that holds this script and the Qwen3 chat template:

    python3 make_agent_model.py --template chat_template.jinja --out DIR [--train-seconds 95]

It writes into DIR what tests/models/tiny-agent/ holds:
  tokenizer.json         byte-level BPE (1,024 tokens, Qwen2/Qwen3's exact pre-tokenizer configuration) trained by
                         `tokenizers` on the rendered conversations, then Qwen3's special tokens as added tokens
                         (<|endoftext|> <|im_start|> <|im_end|> special; <tool_call> </tool_call> <tool_response>
                         </tool_response> <think> </think> not special, as Qwen3 has them)
  tokenizer_config.json  Qwen3's: eos <|im_end|>, pad <|endoftext|>, no bos, chat_template = the template's exact text
  config.json, generation_config.json, model.safetensors (bf16)   a Qwen3MoeForCausalLM of ~1.9 M parameters
  golden_chat.json       greedy generations by transformers (fp32 compute from the bf16 checkpoint, eager attention)
                         for a few conversations: the rendered prompt, its ids, the new ids and their text; each
                         checked against the model's own step-by-step forward argmax
  train_report.json      data, steps, loss, held-out tool-call accuracy

The data: synthetic conversations rendered by transformers' apply_chat_template with tools (get_weather(city),
add(a, b), convert_units(value, from_unit, to_unit)): the user asks a question that names the argument, the
assistant thinks briefly, calls the tool with the argument copied from the question, the tool's result comes back,
and the assistant answers from it. Also plain conversations (with and without tools in the prompt), the same with
enable_thinking false, and requests to answer in JSON (short objects, some with no think block, as constrained
decoding of a JSON schema would force). Every sample is one assistant turn: the prompt as the template renders it
with add_generation_prompt, and the completion that the template renders for that turn, ended by <|im_end|>;
the loss is on the completion only. Prompt and completion are tokenized apart, as a server sees them.
"""
import argparse
import json
import math
import os
import random
import re
import shutil
import sys
import tempfile
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers  # noqa: E402
from transformers import AutoTokenizer, Qwen3MoeConfig, Qwen3MoeForCausalLM  # noqa: E402

QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]
BPE_VOCAB = 1024

CITIES = [
    ("Paris", "France"), ("London", "United Kingdom"), ("Berlin", "Germany"), ("Madrid", "Spain"),
    ("Rome", "Italy"), ("Lisbon", "Portugal"), ("Vienna", "Austria"), ("Prague", "Czechia"), ("Warsaw", "Poland"),
    ("Oslo", "Norway"), ("Stockholm", "Sweden"), ("Helsinki", "Finland"), ("Dublin", "Ireland"),
    ("Amsterdam", "Netherlands"), ("Brussels", "Belgium"), ("Athens", "Greece"), ("Budapest", "Hungary"),
    ("Zürich", "Switzerland"), ("Geneva", "Switzerland"), ("Munich", "Germany"), ("Barcelona", "Spain"),
    ("Milan", "Italy"), ("Tokyo", "Japan"), ("Osaka", "Japan"), ("Seoul", "South Korea"), ("Beijing", "China"),
    ("Shanghai", "China"), ("Delhi", "India"), ("Mumbai", "India"), ("Bangkok", "Thailand"), ("Hanoi", "Vietnam"),
    ("Jakarta", "Indonesia"), ("Manila", "Philippines"), ("Sydney", "Australia"), ("Melbourne", "Australia"),
    ("Auckland", "New Zealand"), ("Cairo", "Egypt"), ("Nairobi", "Kenya"), ("Lagos", "Nigeria"),
    ("Cape Town", "South Africa"), ("Casablanca", "Morocco"), ("Istanbul", "Turkey"), ("Dubai", "United Arab Emirates"),
    ("Toronto", "Canada"), ("Montréal", "Canada"), ("Vancouver", "Canada"), ("New York", "United States"),
    ("Chicago", "United States"), ("Boston", "United States"), ("Seattle", "United States"),
    ("San Francisco", "United States"), ("Los Angeles", "United States"), ("Mexico City", "Mexico"),
    ("Bogotá", "Colombia"), ("Lima", "Peru"), ("Santiago", "Chile"), ("Buenos Aires", "Argentina"),
    ("São Paulo", "Brazil"), ("Reykjavík", "Iceland"), ("Kraków", "Poland"),
]
# never asked about in training: the held-out accuracy is also reported on these alone
UNSEEN_CITIES = {"Kraków", "Reykjavík", "Lima", "Hanoi", "Chicago"}
CONDITIONS = ["sunny", "cloudy", "rainy", "windy", "snowy", "foggy"]
NAMES = ["Ana", "Ben", "Chloé", "David", "Emma", "Farid", "Grace", "Hugo", "Ines", "Jonas", "Kenji", "Lena", "Mateo",
         "Nora", "Omar", "Priya", "Quinn", "Rosa", "Sven", "Tara", "Umar", "Vera", "Wei", "Yara", "Zoe"]
UNITS = [("km", "miles", 0.621371), ("miles", "km", 1.609344), ("kg", "pounds", 2.204623),
         ("pounds", "kg", 0.453592), ("meters", "feet", 3.280840), ("feet", "meters", 0.3048),
         ("liters", "gallons", 0.264172), ("gallons", "liters", 3.785412)]
SCHEMA_URL = "http://json-schema.org/draft-07/schema#"


# ---------------------------------------------------------------- tools as clients send them

def param(kind, desc, sdk):
    """One property: plain clients write type then description; the Vercel AI SDK (zod) description first."""
    if desc is None:
        return {"type": kind}
    return {"description": desc, "type": kind} if sdk else {"type": kind, "description": desc}


def tool(name, desc, props, sdk):
    params = {"type": "object", "properties": props, "required": list(props)}
    if sdk:  # the AI SDK's zod conversion
        params = {"$schema": SCHEMA_URL, "type": "object", "properties": props, "required": list(props),
                  "additionalProperties": False}
    return {"type": "function", "function": {"name": name, "description": desc, "parameters": params}}


def make_tools(rng, need):
    """A random tool list that holds `need` (a name or None), in random order, in one client's style."""
    sdk = rng.random() < 0.4
    short = rng.random() < 0.3
    catalog = {
        "get_weather": lambda: tool("get_weather", "Get the current weather in a city.",
                                    {"city": param("string", None if short else "The city name.", sdk)}, sdk),
        "add": lambda: tool("add", "Add two integers.",
                            {"a": param("integer", None if short else "The first number.", sdk),
                             "b": param("integer", None if short else "The second number.", sdk)}, sdk),
        "convert_units": lambda: tool("convert_units", "Convert a value from one unit to another.",
                                      {"value": param("number", None if short else "The value to convert.", sdk),
                                       "from_unit": param("string", None if short else "The unit of the value.", sdk),
                                       "to_unit": param("string", None if short else "The unit to convert to.", sdk)},
                                      sdk),
    }
    names = [n for n in catalog if n != need and rng.random() < 0.6]
    if need:
        names.append(need)
    rng.shuffle(names)
    return [catalog[n]() for n in names]


def dumps_result(rng, obj):
    """Tool results as clients send them: Python-style spaces or JavaScript's JSON.stringify."""
    return json.dumps(obj, ensure_ascii=False) if rng.random() < 0.5 else json.dumps(obj, ensure_ascii=False,
                                                                                     separators=(",", ":"))


# ---------------------------------------------------------------- tasks

def fmt_num(x):
    return str(int(x)) if float(x).is_integer() else ("%.2f" % x).rstrip("0").rstrip(".")


def task_weather(rng, cities):
    city = rng.choice(cities)[0]
    q = rng.choice(["What is the weather in {c}?", "How is the weather in {c} today?", "Is it raining in {c}?",
                    "weather in {c}?", "Tell me the weather for {c}.", "What's the temperature in {c} right now?",
                    "Can you check the weather in {c}?", "I am going to {c}. What is the weather like there?"])
    t, cond = rng.randint(-10, 35), rng.choice(CONDITIONS)
    return {"q": q.format(c=city), "name": "get_weather", "args": {"city": city},
            "think": "The user asks about the weather in %s. I should call get_weather." % city,
            "result": {"city": city, "temperature": t, "condition": cond},
            "answer": rng.choice(["It is %s in %s, %d degrees.", "The weather in %s: %s, %d degrees."]),
            "fill": None, "expect": [cond, str(t)], "cond": cond, "t": t, "city": city}


def finish_weather(task):
    a = task["answer"]
    if a.startswith("It is"):
        return a % (task["cond"], task["city"], task["t"])
    return a % (task["city"], task["cond"], task["t"])


def task_add(rng):
    a, b = rng.randint(0, 999), rng.randint(0, 999)
    q = rng.choice(["What is {a} plus {b}?", "Add {a} and {b}.", "What is {a} + {b}?", "Compute the sum of {a} and {b}.",
                    "Please add {a} to {b}.", "{a} + {b} = ?", "What do {a} and {b} add up to?"])
    return {"q": q.format(a=a, b=b), "name": "add", "args": {"a": a, "b": b},
            "think": "The user wants %d plus %d. I should call add." % (a, b), "result": {"result": a + b},
            "final": "%d plus %d is %d." % (a, b, a + b), "expect": [str(a + b)]}


def task_convert(rng):
    src, dst, k = rng.choice(UNITS)
    v = rng.randint(1, 500)
    out = round(v * k, 2)
    q = rng.choice(["Convert {v} {s} to {d}.", "How many {d} is {v} {s}?", "What is {v} {s} in {d}?",
                    "Please convert {v} {s} into {d}."])
    return {"q": q.format(v=v, s=src, d=dst), "name": "convert_units",
            "args": {"value": v, "from_unit": src, "to_unit": dst},
            "think": "The user wants %d %s in %s. I should call convert_units." % (v, src, dst),
            "result": {"value": out, "unit": dst}, "final": "%d %s is %s %s." % (v, src, fmt_num(out), dst),
            "expect": [fmt_num(out)]}


def tool_task(rng, cities):
    r = rng.random()
    if r < 0.45:
        t = task_weather(rng, cities)
        t["final"] = finish_weather(t)
        return t
    return task_add(rng) if r < 0.75 else task_convert(rng)


def plain_task(rng, cities):
    """A question answered without a tool: (question, thought, answer)."""
    r = rng.random()
    if r < 0.2:
        return (rng.choice(["Hello!", "Hi!", "Hello", "Hi there!", "Good morning!", "Hey"]),
                "The user greets me. I should greet them back.", "Hello! How can I help you today?")
    if r < 0.35:
        return (rng.choice(["Who are you?", "What are you?", "What can you do?"]), "The user asks who I am.",
                "I am a small assistant. I can answer questions and call tools.")
    if r < 0.6:
        city, country = rng.choice(cities)
        return ("Which country is %s in?" % city, "The user asks where %s is." % city, "%s is in %s." % (city, country))
    if r < 0.8:
        n = rng.choice(NAMES)
        return (rng.choice(["Say hello to %s.", "Please greet %s."]) % n, "The user wants me to greet %s." % n,
                "Hello, %s!" % n)
    w = " ".join(rng.choice(["red", "blue", "green", "cat", "dog", "sun", "moon", "tree", "river", "stone", "bird"])
                 for _ in range(rng.randint(1, 4)))
    return ("Repeat after me: %s" % w, "The user wants me to repeat some words.", w)


def json_task(rng, cities):
    """A request for a short JSON object: (question, thought, object)."""
    r = rng.random()
    city, country = rng.choice(cities)
    if r < 0.35:
        q = rng.choice(["Give the city {c} and its country as JSON.", "Answer in JSON: which country is {c} in?",
                        "Return a JSON object with the city {c} and its country."]).format(c=city)
        return q, "The user wants JSON with a city and a country.", {"city": city, "country": country}
    if r < 0.6:
        n, age = rng.choice(NAMES), rng.randint(1, 99)
        q = rng.choice(["Make a JSON object for {n}, age {a}.", "Answer in JSON: {n} is {a} years old.",
                        "Return JSON with the name {n} and the age {a}."]).format(n=n, a=age)
        return q, "The user wants JSON with a name and an age.", {"name": n, "age": age}
    if r < 0.8:
        w = rng.choice(["yes", "no", "hello", "done", "ok"])
        q = rng.choice(["Answer in JSON with the key answer and the value {w}.", "Reply in JSON: {w}"]).format(w=w)
        return q, "The user wants a JSON answer.", {"answer": w}
    t, cond = rng.randint(-10, 35), rng.choice(CONDITIONS)
    q = "Answer in JSON: it is %s and %d degrees in %s." % (cond, t, city)
    return q, "The user wants the weather as JSON.", {"city": city, "temperature": t, "condition": cond}


# ---------------------------------------------------------------- rendering

class Renderer:
    def __init__(self, tok):
        self.tok = tok

    def __call__(self, msgs, tools, gen, **kw):
        text = self.tok.apply_chat_template(msgs, tools=tools or None, add_generation_prompt=gen, tokenize=False,
                                            **kw)
        if not isinstance(text, str):
            raise RuntimeError("apply_chat_template(tokenize=False) returned %s" % type(text))
        return text

    def sample(self, msgs, tools, thinking, raw_completion=None):
        """The prompt for the last message (an assistant turn) and its completion as the template renders it."""
        kw = {} if thinking else {"enable_thinking": False}
        prompt = self(msgs[:-1], tools, True, **kw)
        if raw_completion is not None:
            return prompt, raw_completion + "<|im_end|>"
        full = self(msgs, tools, False, **kw)
        if not full.startswith(prompt) or not full.endswith("<|im_end|>\n"):
            raise RuntimeError("the template's rendering of a turn does not extend its prompt:\n%r\n%r" % (prompt, full))
        return prompt, full[len(prompt):-1]


def tool_call_msg(task, thinking, keep_reasoning=True):
    m = {"role": "assistant", "content": "",
         "tool_calls": [{"id": "call_0", "type": "function",
                         "function": {"name": task["name"], "arguments": task["args"]}}]}
    if thinking and keep_reasoning:
        m["reasoning_content"] = task["think"]
    elif not thinking:
        m["reasoning_content"] = ""
    return m


def conversation_samples(rng, render, cities, kind):
    """One conversation of a kind, as (prompt, completion) samples (one per assistant turn trained on)."""
    thinking = rng.random() < 0.65
    system = [{"role": "system", "content": rng.choice(["You are a helpful assistant.", "You are a helpful assistant "
                                                        "with tools.", "Be brief."])}] if rng.random() < 0.3 else []
    think = (lambda t: t) if thinking else (lambda t: "")
    if kind == "tool":
        task = tool_task(rng, cities)
        tools = make_tools(rng, task["name"])
        user = system + [{"role": "user", "content": task["q"]}]
        call = tool_call_msg(task, thinking)
        out = [render.sample(user + [call], tools, thinking)]
        # the client sends the call back with or without the reasoning it got, and the tool's result
        hist = user + [tool_call_msg(task, thinking, keep_reasoning=rng.random() < 0.5),
                       {"role": "tool", "tool_call_id": "call_0", "content": dumps_result(rng, task["result"])}]
        final = {"role": "assistant", "content": task["final"],
                 "reasoning_content": think("The tool returned the result. I can answer now.")}
        out.append(render.sample(hist + [final], tools, thinking))
        return out
    if kind == "plain":
        q, thought, answer = plain_task(rng, cities)
        tools = make_tools(rng, None) if rng.random() < 0.5 else None
        msgs = system + [{"role": "user", "content": q},
                         {"role": "assistant", "content": answer, "reasoning_content": think(thought)}]
        return [render.sample(msgs, tools, thinking)]
    if kind == "json":
        q, thought, obj = json_task(rng, cities)
        text = json.dumps(obj, ensure_ascii=False)
        msgs = system + [{"role": "user", "content": q}]
        if rng.random() < 0.25:  # the object alone, as a grammar that starts at the first token forces it
            return [render.sample(msgs + [{"role": "assistant", "content": ""}], None, thinking, raw_completion=text)]
        msgs.append({"role": "assistant", "content": text, "reasoning_content": think(thought)})
        return [render.sample(msgs, None, thinking)]
    raise ValueError(kind)


def make_samples(render, n, seed, cities):
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        r = rng.random()
        kind = "tool" if r < 0.6 else ("plain" if r < 0.82 else "json")
        out.extend(conversation_samples(rng, render, cities, kind))
    return out[:n]


# ---------------------------------------------------------------- tokenizer

def base_tokenizer():
    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    return tok


def train_tokenizer(texts, vocab):
    tok = base_tokenizer()
    trainer = trainers.BpeTrainer(vocab_size=vocab, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    split = re.compile("|".join(re.escape(s) for s in SPECIAL + ADDED))
    tok.train_from_iterator((piece for t in texts for piece in split.split(t) if piece), trainer)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIAL])
    tok.add_tokens([AddedToken(s, special=False, normalized=False) for s in ADDED])
    return tok


def write_tokenizer_dir(d, tok, template):
    tok.save(os.path.join(d, "tokenizer.json"))
    decoder = {}
    for s in SPECIAL + ADDED:
        decoder[str(tok.token_to_id(s))] = {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                                            "single_word": False, "special": s in SPECIAL}
    cfg = {"add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": decoder,
           "additional_special_tokens": ["<|im_start|>", "<|im_end|>"], "bos_token": None,
           "chat_template": template, "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>",
           "errors": "replace", "model_max_length": 2048, "pad_token": "<|endoftext|>", "split_special_tokens": False,
           "tokenizer_class": "Qwen2Tokenizer", "unk_token": None}
    with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2, ensure_ascii=False)
        f.write("\n")


def load_hf_tokenizer(d, template):
    """transformers' tokenizer of directory d (the class Qwen3 names), else the generic fast one."""
    try:
        return AutoTokenizer.from_pretrained(d)
    except Exception as e:  # noqa: BLE001 (a one-shot run on the GPU machine: say it and go on)
        print("AutoTokenizer failed (%s); using PreTrainedTokenizerFast" % e, flush=True)
        return transformers.PreTrainedTokenizerFast(tokenizer_file=os.path.join(d, "tokenizer.json"),
                                                    chat_template=template, eos_token="<|im_end|>",
                                                    pad_token="<|endoftext|>")


# ---------------------------------------------------------------- model, training

def make_config(tok):
    eot, im_end = tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|im_end|>")
    return Qwen3MoeConfig(vocab_size=tok.get_vocab_size(), hidden_size=128, intermediate_size=256,
                          moe_intermediate_size=96, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                          head_dim=32, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
                          mlp_only_layers=[], rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=2048,
                          tie_word_embeddings=False, bos_token_id=eot, eos_token_id=im_end, pad_token_id=None,
                          router_aux_loss_coef=0.01, output_router_logits=False, use_cache=True)


def encode_samples(tok, samples):
    enc_p = tok.encode_batch([p for p, _ in samples], add_special_tokens=False)
    enc_c = tok.encode_batch([c for _, c in samples], add_special_tokens=False)
    return [(p.ids, c.ids) for p, c in zip(enc_p, enc_c)]


def batches(rng, data, bs):
    idx = list(range(len(data)))
    while True:
        rng.shuffle(idx)
        for i in range(0, len(idx) - bs * 8 + 1, bs * 8):  # length buckets of 8 batches: less padding
            chunk = sorted(idx[i:i + bs * 8], key=lambda j: len(data[j][0]) + len(data[j][1]))
            group = [chunk[k:k + bs] for k in range(0, len(chunk), bs)]
            rng.shuffle(group)
            yield from group


def collate(data, rows, pad, dev):
    n = max(len(data[j][0]) + len(data[j][1]) for j in rows)
    ids = torch.full((len(rows), n), pad, dtype=torch.long)
    labels = torch.full((len(rows), n), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), n), dtype=torch.long)
    for r, j in enumerate(rows):
        p, c = data[j]
        seq = p + c
        ids[r, :len(seq)] = torch.tensor(seq)
        labels[r, len(p):len(seq)] = torch.tensor(c)
        mask[r, :len(seq)] = 1
    return ids.to(dev), labels.to(dev), mask.to(dev)


def train(model, data, pad, dev, seconds, bs, lr, log):
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.01)
    rng = random.Random(1)
    it = batches(rng, data, bs)
    t0 = time.time()
    step, losses = 0, []
    est_steps = None
    model.config.output_router_logits = True  # the load-balancing loss joins the loss: every expert learns
    model.train()
    while True:
        el = time.time() - t0
        if el > seconds:
            break
        if step == 30:
            est_steps = int(seconds / (el / 30))
        total = est_steps or 10 ** 9
        warm = 50
        frac = min(1.0, step / max(1, total))
        scale = min(1.0, (step + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr * scale
        ids, labels, mask = collate(data, next(it), pad, dev)
        try:
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dev == "cuda"):
                out = model(input_ids=ids, attention_mask=mask, labels=labels)
        except Exception as e:  # noqa: BLE001 (a one-shot run: without the balancing loss rather than nothing)
            if step or not model.config.output_router_logits:
                raise
            log("the load-balancing loss failed (%s): training without it" % e)
            model.config.output_router_logits = False
            continue
        loss = out.loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(out.loss))
        step += 1
        if step % 100 == 0 or step == 1:
            log("step %5d  loss %.4f  lr %.2e  %.0f s" % (step, sum(losses[-100:]) / len(losses[-100:]), lr * scale,
                                                          time.time() - t0))
    model.eval()
    return step, sum(losses[-100:]) / max(1, len(losses[-100:]))


# ---------------------------------------------------------------- evaluation

TOOL_CALL = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.S)


def greedy_batch(model, tok, prompts, dev, max_new, stop_ids):
    """Greedy continuations of several prompts at once (left padding): new ids per prompt, cut after a stop id."""
    enc = [tok.encode(p, add_special_tokens=False).ids for p in prompts]
    n = max(map(len, enc))
    pad = tok.token_to_id("<|endoftext|>")
    ids = torch.tensor([[pad] * (n - len(e)) + e for e in enc], device=dev)
    mask = torch.tensor([[0] * (n - len(e)) + [1] * len(e) for e in enc], device=dev)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new,
                             eos_token_id=stop_ids, pad_token_id=pad)
    res = []
    for row in out[:, n:].tolist():
        cut = next((i for i, t in enumerate(row) if t in stop_ids), None)
        res.append(row if cut is None else row[:cut + 1])
    return res


def held_out(render, seed, n, cities):
    """First turns (the call) and second turns (the answer) of new tool conversations."""
    rng = random.Random(seed)
    calls, answers = [], []
    for _ in range(n):
        thinking = rng.random() < 0.5
        task = tool_task(rng, cities)
        tools = make_tools(rng, task["name"])
        kw = {} if thinking else {"enable_thinking": False}
        user = [{"role": "user", "content": task["q"]}]
        calls.append((render(user, tools, True, **kw), task, thinking))
        hist = user + [tool_call_msg(task, thinking, keep_reasoning=rng.random() < 0.5),
                       {"role": "tool", "tool_call_id": "call_0", "content": dumps_result(rng, task["result"])}]
        answers.append((render(hist, tools, True, **kw), task, thinking))
    return calls, answers


def evaluate(model, tok, render, dev, n, stop_ids, log):
    calls, answers = held_out(render, 12345, n, CITIES)
    ok_call = ok_unseen = n_unseen = ok_answer = 0
    bad = []
    for i in range(0, n, 64):
        outs = greedy_batch(model, tok, [c[0] for c in calls[i:i + 64]], dev, 80, stop_ids)
        for (prompt, task, thinking), new in zip(calls[i:i + 64], outs):
            text = tok.decode(new, skip_special_tokens=False)
            m = TOOL_CALL.search(text)
            good = False
            if m:
                try:
                    call = json.loads(m.group(1))
                    good = call.get("name") == task["name"] and call.get("arguments") == task["args"]
                except json.JSONDecodeError:
                    pass
            ok_call += good
            unseen = task["name"] == "get_weather" and task["args"]["city"] in UNSEEN_CITIES
            n_unseen += unseen
            ok_unseen += good and unseen
            if not good and len(bad) < 6:
                bad.append((task["q"], text))
        outs = greedy_batch(model, tok, [a[0] for a in answers[i:i + 64]], dev, 60, stop_ids)
        for (prompt, task, thinking), new in zip(answers[i:i + 64], outs):
            text = tok.decode(new, skip_special_tokens=False).split("</think>")[-1]
            ok_answer += all(e in text for e in task["expect"]) and "<tool_call>" not in text
    for q, t in bad:
        log("  wrong call for %r: %r" % (q, t))
    return {"held_out_conversations": n, "tool_call_exact": ok_call / n,
            "tool_call_exact_unseen_cities": (ok_unseen / n_unseen) if n_unseen else None,
            "unseen_city_questions": n_unseen, "answer_has_result": ok_answer / n}


# ---------------------------------------------------------------- golden generations

def golden_cases():
    weather = [tool("get_weather", "Get the current weather in a city.",
                    {"city": param("string", "The city name.", False)}, False)]
    every = weather + [tool("add", "Add two integers.", {"a": param("integer", "The first number.", False),
                                                          "b": param("integer", "The second number.", False)}, False),
                       tool("convert_units", "Convert a value from one unit to another.",
                            {"value": param("number", "The value to convert.", False),
                             "from_unit": param("string", "The unit of the value.", False),
                             "to_unit": param("string", "The unit to convert to.", False)}, False)]
    sdk = [tool("get_weather", "Get the current weather in a city.", {"city": param("string", "The city name.", True)},
                True)]
    q = {"role": "user", "content": "What is the weather in Paris?"}
    call = {"role": "assistant", "content": "", "reasoning_content": "The user asks about the weather in Paris. "
            "I should call get_weather.", "tool_calls": [{"id": "call_0", "type": "function", "function": {
                "name": "get_weather", "arguments": {"city": "Paris"}}}]}
    result = {"role": "tool", "tool_call_id": "call_0",
              "content": json.dumps({"city": "Paris", "temperature": 21, "condition": "sunny"})}
    return [
        ("tool_call", [q], every, {}),
        ("tool_answer", [q, call, result], every, {}),
        ("tool_call_no_thinking", [{"role": "user", "content": "What is 12 plus 30?"}], every,
         {"enable_thinking": False}),
        ("tool_call_sdk_schema", [{"role": "user", "content": "How is the weather in São Paulo today?"}], sdk, {}),
        ("plain", [{"role": "user", "content": "Hello!"}], None, {}),
        ("plain_system_no_thinking", [{"role": "system", "content": "You are a helpful assistant."},
                                      {"role": "user", "content": "Which country is Tokyo in?"}], None,
         {"enable_thinking": False}),
        ("json", [{"role": "user", "content": "Give the city Paris and its country as JSON."}], None, {}),
    ]


def golden(model, tok, render, stop_ids, max_new, log):
    out = []
    for name, msgs, tools, kw in golden_cases():
        prompt = render(msgs, tools, True, **kw)
        ids = tok.encode(prompt, add_special_tokens=False).ids
        with torch.no_grad():
            g = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=max_new, eos_token_id=stop_ids,
                               pad_token_id=tok.token_to_id("<|endoftext|>"), output_scores=True,
                               return_dict_in_generate=True)
        new = g.sequences[0, len(ids):].tolist()
        margins = [float(torch.topk(s[0].float(), 2).values[0] - torch.topk(s[0].float(), 2).values[1])
                   for s in g.scores]
        # the reference against itself: step-by-step forward over the whole sequence, no cache, argmax
        seq, step_ids = list(ids), []
        with torch.no_grad():
            for _ in range(len(new)):
                nxt = int(model(torch.tensor([seq]), use_cache=False).logits[0, -1].argmax())
                step_ids.append(nxt)
                seq.append(nxt)
                if nxt in stop_ids:
                    break
        text = tok.decode(new, skip_special_tokens=False)
        out.append({"name": name, "messages": msgs, "tools": tools, "chat_template_kwargs": kw,
                    "add_generation_prompt": True, "prompt": prompt, "prompt_ids": ids, "new_ids": new, "text": text,
                    "ends_with_eos": bool(new) and new[-1] in stop_ids, "min_margin": min(margins),
                    "stepwise_argmax_equal": step_ids == new})
        log("golden %-26s %3d prompt ids, %3d new, margin %.3g, stepwise %s: %r" %
            (name, len(ids), len(new), min(margins), step_ids == new, text))
    return out


# ---------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--template", required=True, help="Qwen3's chat_template.jinja")
    ap.add_argument("--out", required=True)
    ap.add_argument("--train-seconds", type=float, default=95.0)
    ap.add_argument("--samples", type=int, default=16000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--eval", type=int, default=256)
    args = ap.parse_args()
    t_start = time.time()

    def log(msg):
        print("[%6.1f s] %s" % (time.time() - t_start, msg), flush=True)

    torch.manual_seed(0)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    with open(args.template, encoding="utf-8") as f:
        template = f.read()
    os.makedirs(args.out, exist_ok=True)
    log("transformers %s, torch %s, %s" % (transformers.__version__, torch.__version__,
                                         torch.cuda.get_device_name() if dev == "cuda" else "cpu"))

    # 1. render every conversation with a byte-only tokenizer (rendering needs only the template), train the BPE
    train_cities = [c for c in CITIES if c[0] not in UNSEEN_CITIES]
    with tempfile.TemporaryDirectory() as tmp:
        boot = base_tokenizer()
        boot.train_from_iterator(["x"], trainers.BpeTrainer(vocab_size=300, show_progress=False,
                                                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        boot.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIAL])
        boot.add_tokens([AddedToken(s, special=False, normalized=False) for s in ADDED])
        write_tokenizer_dir(tmp, boot, template)
        render = Renderer(load_hf_tokenizer(tmp, template))
        samples = make_samples(render, args.samples, 0, train_cities)
    log("%d samples rendered" % len(samples))
    tok = train_tokenizer([p + c for p, c in samples[:6000]], BPE_VOCAB)
    write_tokenizer_dir(args.out, tok, template)
    hf_tok = load_hf_tokenizer(args.out, template)
    render = Renderer(hf_tok)
    data = encode_samples(tok, samples)
    agree = all(hf_tok.encode(p, add_special_tokens=False) == tok.encode(p, add_special_tokens=False).ids
                for p, _ in samples[:200])
    lens = sorted(len(p) + len(c) for p, c in data)
    log("tokenizer: %d ids; AutoTokenizer agrees with tokenizer.json: %s; sample lengths median %d max %d" %
        (tok.get_vocab_size(), agree, lens[len(lens) // 2], lens[-1]))

    # 2. train
    cfg = make_config(tok)
    model = Qwen3MoeForCausalLM(cfg).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    log("model: %d parameters" % n_params)
    steps, loss = train(model, data, tok.token_to_id("<|endoftext|>"), dev, args.train_seconds, args.batch, args.lr,
                        log)
    log("trained %d steps, final loss %.4f" % (steps, loss))

    # 3. save in bf16 as Qwen3's checkpoints are; everything after this reads the saved checkpoint
    model.config.output_router_logits = False
    model.to(torch.bfloat16).save_pretrained(args.out, safe_serialization=True)
    stop_ids = [tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")]
    gen = {"bos_token_id": tok.token_to_id("<|endoftext|>"), "do_sample": True, "eos_token_id": stop_ids,
           "pad_token_id": tok.token_to_id("<|endoftext|>"), "temperature": 0.6, "top_k": 20, "top_p": 0.95,
           "transformers_version": transformers.__version__}
    with open(os.path.join(args.out, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
        f.write("\n")
    model = Qwen3MoeForCausalLM.from_pretrained(args.out, dtype=torch.float32).to(dev).eval()
    acc = evaluate(model, tok, render, dev, args.eval, stop_ids, log)
    log("held-out: %s" % json.dumps(acc))

    # 4. golden generations: fp32 on the CPU, eager attention, from the bf16 checkpoint
    ref = Qwen3MoeForCausalLM.from_pretrained(args.out, dtype=torch.float32, attn_implementation="eager").eval()
    cases = golden(ref, tok, render, stop_ids, 96, log)
    with open(os.path.join(args.out, "golden_chat.json"), "w", encoding="utf-8") as f:
        json.dump({"transformers": transformers.__version__, "torch": torch.__version__, "dtype": "float32",
                   "checkpoint_dtype": "bfloat16", "attn_implementation": "eager", "do_sample": False,
                   "max_new_tokens": 96, "stop_ids": stop_ids, "cases": cases}, f, indent=1, ensure_ascii=False)
        f.write("\n")
    report = {"samples": len(samples), "tokens": sum(lens), "steps": steps, "batch": args.batch, "lr": args.lr,
              "train_seconds": args.train_seconds, "final_loss": loss, "params": n_params,
              "autotokenizer_agrees": agree, "transformers": transformers.__version__, "torch": torch.__version__,
              "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu", **acc,
              "golden_stepwise_equal": all(c["stepwise_argmax_equal"] for c in cases)}
    with open(os.path.join(args.out, "train_report.json"), "w") as f:
        json.dump(report, f, indent=1)
        f.write("\n")
    log("done: %s" % json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
