#!/usr/bin/env python3
"""tests/models/tiny-agent: a tiny Qwen3-MoE agent model, trained on conversations that the Qwen3 chat template
renders with tools, and its golden greedy generations.

    python3 tools/make_agent_model.py --out tests/models/tiny-agent [--train-minutes 25]
    python3 tools/make_agent_model.py --check-transformers tests/models/tiny-agent   # where transformers is

It writes into the output directory:
  tokenizer.json         byte-level BPE (1,024 tokens) with Qwen2/Qwen3's exact tokenizer configuration, trained on
                         the rendered conversations, then Qwen3's added tokens: <|endoftext|> <|im_start|>
                         <|im_end|> (special) and <tool_call> </tool_call> <tool_response> </tool_response> <think>
                         </think> (not special), as Qwen3 has them
  tokenizer_config.json  Qwen3's: eos <|im_end|>, pad <|endoftext|>, no bos, chat_template = the exact text of
                         tests/chat_templates/qwen3-30b-a3b/chat_template.jinja
  config.json, generation_config.json, model.safetensors (bf16): a Qwen3MoeForCausalLM (hidden 128, 4 layers,
                         4 query / 2 key-value heads of 32, 8 experts top-2 of 96, norm_topk_prob, untied lm_head)
  golden_chat.json       greedy generations (fp32 compute from the bf16 checkpoint) for a few conversations: the
                         rendered prompt, its ids, the new ids and their text; each checked against step-by-step
                         full-sequence forward argmax
  train_report.json      data, steps, loss, held-out accuracy of the tool call (exact name and arguments)

The data: synthetic conversations rendered by the chat template with tools (get_weather(city), add(a, b),
convert_units(value, from_unit, to_unit)) in both the plain JSON-schema style and the Vercel AI SDK's (zod)
style: the user asks a question that names the argument, the assistant thinks briefly, calls the tool with the
argument copied from the question, the tool's result comes back, and the assistant answers from it. Also plain
conversations (with and without tools in the prompt), the same with enable_thinking false, and requests to answer
in JSON (short objects; a quarter with no think block, as a grammar that starts at the first token forces).
Each sample is one assistant turn: the prompt as the template renders it with add_generation_prompt, and the
completion the template renders for that turn, ended by <|im_end|>; the loss is on the completion only; prompt
and completion are tokenized apart, as a server sees them.

Where transformers is installed, the template is rendered by its apply_chat_template; elsewhere by jinja2 in the
environment transformers sets up (trim_blocks, lstrip_blocks, loopcontrols, tojson with ensure_ascii=False,
raise_exception). The model is trained by tiny_qwen3_moe.py (Qwen3-MoE in plain PyTorch with transformers'
arithmetic and tensor names) and the tokenizer by byte_bpe.py, so that the script runs with Debian's python3-torch
alone; --check-transformers then replays golden_chat.json with transformers' own tokenizer, template and
Qwen3MoeForCausalLM (the independent oracle), and fp8moe's CPU reference checks it too (tests/test_agent_model.c).
"""
import argparse
import json
import math
import os
import random
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]
BPE_VOCAB = 1024
STOP = ["<|im_end|>", "<|endoftext|>"]  # Qwen3's generation_config eos ids

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
    names = [n for n in catalog if n != need and rng.random() < 0.35]
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
    """The chat template to text as transformers' apply_chat_template(tokenize=False) renders it: jinja2 in the
    environment transformers builds for chat templates (--check-transformers compares the two on golden_chat.json)."""

    def __init__(self, template):
        import jinja2
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(msg):
            raise jinja2.exceptions.TemplateError(msg)

        def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                              sort_keys=sort_keys)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[jinja2.ext.loopcontrols])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        self.tmpl = env.from_string(template)
        self.engine = "jinja2 %s" % jinja2.__version__

    def __call__(self, msgs, tools, gen, **kw):
        return self.tmpl.render(messages=msgs, tools=tools or None, add_generation_prompt=gen, bos_token="",
                                eos_token="<|im_end|>", **kw)

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


# ---------------------------------------------------------------- tokenizer and config files

def write_tokenizer_files(d, bpe, template):
    bpe.save(os.path.join(d, "tokenizer.json"))
    decoder = {str(bpe.token_to_id(s)): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                                          "single_word": False, "special": s in SPECIAL} for s in SPECIAL + ADDED}
    cfg = {"add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": decoder,
           "additional_special_tokens": ["<|im_start|>", "<|im_end|>"], "bos_token": None,
           "chat_template": template, "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>",
           "errors": "replace", "model_max_length": 2048, "pad_token": "<|endoftext|>", "split_special_tokens": False,
           "tokenizer_class": "Qwen2Tokenizer", "unk_token": None}
    write_json(os.path.join(d, "tokenizer_config.json"), cfg)


def model_config(bpe):
    """config.json as Qwen3-30B-A3B's is written, at a tiny size."""
    return {"architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
            "bos_token_id": bpe.token_to_id("<|endoftext|>"), "decoder_sparse_step": 1,
            "eos_token_id": bpe.token_to_id("<|im_end|>"), "head_dim": 32, "hidden_act": "silu", "hidden_size": 128,
            "initializer_range": 0.02, "intermediate_size": 256, "max_position_embeddings": 2048,
            "max_window_layers": 4, "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 96,
            "norm_topk_prob": True, "num_attention_heads": 4, "num_experts": 8, "num_experts_per_tok": 2,
            "num_hidden_layers": 4, "num_key_value_heads": 2, "output_router_logits": False, "rms_norm_eps": 1e-06,
            "rope_scaling": None, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.01, "sliding_window": None,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True, "use_sliding_window": False,
            "vocab_size": bpe.get_vocab_size()}


def generation_config(bpe):
    """Qwen3's generation_config.json: two eos ids and its recommended sampling for thinking mode."""
    eot = bpe.token_to_id("<|endoftext|>")
    return {"bos_token_id": eot, "do_sample": True, "eos_token_id": [bpe.token_to_id(s) for s in STOP],
            "pad_token_id": eot, "temperature": 0.6, "top_k": 20, "top_p": 0.95}


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


# ---------------------------------------------------------------- training

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
    import torch
    n = max(len(data[j][0]) + len(data[j][1]) for j in rows)
    ids = torch.full((len(rows), n), pad, dtype=torch.long)
    labels = torch.full((len(rows), n), -100, dtype=torch.long)
    for r, j in enumerate(rows):
        p, c = data[j]
        ids[r, :len(p) + len(c)] = torch.tensor(p + c)
        labels[r, len(p) - 1:len(p) + len(c) - 1] = torch.tensor(c)  # position t predicts token t + 1
    return ids.to(dev), labels.to(dev)


def train(model, data, pad, args, out_dir, log):
    import torch
    import torch.nn.functional as F
    from tiny_qwen3_moe import load_balancing_loss
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01)
    it = batches(random.Random(1), data, args.batch)
    seconds = args.train_minutes * 60
    t0, step, losses, total = time.time(), 0, [], None
    model.train()
    while time.time() - t0 < seconds and not os.path.exists(os.path.join(out_dir, "STOP")):
        if step == 20:
            total = int(seconds / ((time.time() - t0) / 20))
        frac = min(1.0, step / total) if total else 0.0
        scale = min(1.0, (step + 1) / 50) * (0.1 + 0.45 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = args.lr * scale
        ids, labels = collate(data, next(it), pad, args.device)
        h, _, routers = model.hidden(ids)
        sel = labels != -100
        loss = F.cross_entropy(model.lm_head(h[sel]), labels[sel])
        aux = load_balancing_loss(routers, model.c["num_experts_per_tok"])
        opt.zero_grad(set_to_none=True)
        (loss + model.c["router_aux_loss_coef"] * aux).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(loss))
        step += 1
        if step % 50 == 0 or step == 1:
            log("step %5d  loss %.4f  aux %.3f  lr %.2e  %.0f s" % (step, sum(losses[-50:]) / len(losses[-50:]),
                                                                    float(aux), args.lr * scale, time.time() - t0))
    model.eval()
    return step, sum(losses[-50:]) / max(1, len(losses[-50:]))


# ---------------------------------------------------------------- generation and evaluation

def greedy(model, ids, max_new, stop_ids):
    """Greedy decoding with the key-value cache: new ids (ending with a stop id when one came) and the smallest
    top-1/top-2 logit margin over the steps."""
    import torch
    new, margins, past = [], [], None
    dev = model.lm_head.weight.device
    x = torch.tensor([ids], device=dev)
    with torch.no_grad():
        for _ in range(max_new):
            logits, past = model(x, past)
            top = torch.topk(logits[0, -1], 2).values
            margins.append(float(top[0] - top[1]))
            nxt = int(logits[0, -1].argmax())
            new.append(nxt)
            if nxt in stop_ids:
                break
            x = torch.tensor([[nxt]], device=dev)
    return new, min(margins)


def stepwise(model, ids, n, stop_ids):
    """The same greedy decoding by full-sequence forwards without a cache, argmax of the last position."""
    import torch
    seq, new = list(ids), []
    with torch.no_grad():
        for _ in range(n):
            nxt = int(model(torch.tensor([seq], device=model.lm_head.weight.device))[0][0, -1].argmax())
            new.append(nxt)
            seq.append(nxt)
            if nxt in stop_ids:
                break
    return new


TOOL_CALL = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.S)


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
        calls.append((render(user, tools, True, **kw), task))
        hist = user + [tool_call_msg(task, thinking, keep_reasoning=rng.random() < 0.5),
                       {"role": "tool", "tool_call_id": "call_0", "content": dumps_result(rng, task["result"])}]
        answers.append((render(hist, tools, True, **kw), task))
    return calls, answers


def evaluate(model, bpe, render, n, log, seed=12345):
    stop_ids = [bpe.token_to_id(s) for s in STOP]
    calls, answers = held_out(render, seed, n, CITIES)
    ok_call = ok_unseen = n_unseen = ok_answer = 0
    shown = 0
    for (prompt, task), (prompt2, _) in zip(calls, answers):
        text = bpe.decode(greedy(model, bpe.encode(prompt), 80, stop_ids)[0])
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
        if not good and shown < 5:
            shown += 1
            log("  wrong call for %r: %r" % (task["q"], text))
        text = bpe.decode(greedy(model, bpe.encode(prompt2), 60, stop_ids)[0]).split("</think>")[-1]
        ok_answer += all(e in text for e in task["expect"]) and "<tool_call>" not in text
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


def golden(model, bpe, render, max_new, log):
    stop_ids = [bpe.token_to_id(s) for s in STOP]
    out = []
    for name, msgs, tools, kw in golden_cases():
        prompt = render(msgs, tools, True, **kw)
        ids = bpe.encode(prompt)
        new, margin = greedy(model, ids, max_new, stop_ids)
        same = stepwise(model, ids, len(new), stop_ids) == new
        text = bpe.decode(new)
        out.append({"name": name, "messages": msgs, "tools": tools, "chat_template_kwargs": kw,
                    "add_generation_prompt": True, "prompt": prompt, "prompt_ids": ids, "new_ids": new, "text": text,
                    "ends_with_eos": bool(new) and new[-1] in stop_ids, "min_margin": margin,
                    "stepwise_argmax_equal": same})
        log("golden %-26s %3d prompt ids, %3d new, margin %.3g, stepwise %s: %r" % (name, len(ids), len(new), margin,
                                                                                    same, text))
    return out


# ---------------------------------------------------------------- the transformers oracle

def check_transformers(d):
    """Replays golden_chat.json with transformers: its template rendering, its tokenizer, its Qwen3MoeForCausalLM."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(d)
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
    with open(os.path.join(d, "golden_chat.json"), encoding="utf-8") as f:
        g = json.load(f)
    bad = 0
    for c in g["cases"]:
        prompt = tok.apply_chat_template(c["messages"], tools=c["tools"], add_generation_prompt=True, tokenize=False,
                                         **c["chat_template_kwargs"])
        ids = tok.encode(prompt, add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=g["max_new_tokens"],
                                 eos_token_id=g["stop_ids"], pad_token_id=g["stop_ids"][-1])
        new = out[0, len(ids):].tolist()
        checks = {"prompt": prompt == c["prompt"], "prompt_ids": ids == c["prompt_ids"], "new_ids": new == c["new_ids"],
                  "text": tok.decode(new, skip_special_tokens=False) == c["text"]}
        bad += not all(checks.values())
        print("%-26s %s" % (c["name"], " ".join("%s %s" % (k, "ok" if v else "DIFFERS") for k, v in checks.items())))
    print("transformers %s: %d of %d cases differ" % (transformers.__version__, bad, len(g["cases"])))
    return 1 if bad else 0


# ---------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--template", default=os.path.join(root, "tests/chat_templates/qwen3-30b-a3b/chat_template.jinja"))
    ap.add_argument("--out", default=os.path.join(root, "tests/models/tiny-agent"))
    ap.add_argument("--train-minutes", type=float, default=25.0)
    ap.add_argument("--samples", type=int, default=12000)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--eval", type=int, default=100, help="held-out conversations")
    ap.add_argument("--golden-tokens", type=int, default=96, help="new tokens at most per golden generation")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads (more than the free cores only slows it)")
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda where there is one)")
    ap.add_argument("--init", metavar="DIR", help="start from this checkpoint's weights (same data and tokenizer)")
    ap.add_argument("--check-transformers", metavar="DIR")
    args = ap.parse_args()
    if args.check_transformers:
        return check_transformers(args.check_transformers)

    import torch
    from byte_bpe import ByteBPE, train as train_bpe
    from tiny_qwen3_moe import Qwen3Moe, load_safetensors, round_bf16_, save_safetensors
    t_start = time.time()

    def log(msg):
        print("[%7.1f s] %s" % (time.time() - t_start, msg), flush=True)

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    with open(args.template, encoding="utf-8") as f:
        template = f.read()
    os.makedirs(args.out, exist_ok=True)
    render = Renderer(template)
    log("rendering with %s, torch %s, training on %s" % (render.engine, torch.__version__, args.device))

    train_cities = [c for c in CITIES if c[0] not in UNSEEN_CITIES]
    samples = make_samples(render, args.samples, 0, train_cities)
    vocab, merges = train_bpe([p + c for p, c in samples[:3000]], BPE_VOCAB)
    bpe = ByteBPE(vocab, merges, SPECIAL, ADDED)
    write_tokenizer_files(args.out, bpe, template)
    data = [(bpe.encode(p), bpe.encode(c)) for p, c in samples]
    lens = sorted(len(p) + len(c) for p, c in data)
    log("%d samples, %d tokens (median %d, max %d); %d ids in the vocabulary" %
        (len(data), sum(lens), lens[len(lens) // 2], lens[-1], bpe.get_vocab_size()))

    cfg = model_config(bpe)
    write_json(os.path.join(args.out, "config.json"), cfg)
    write_json(os.path.join(args.out, "generation_config.json"), generation_config(bpe))
    model = Qwen3Moe(dict(cfg, rope_parameters={"rope_theta": cfg["rope_theta"]}))
    if args.init:  # a second stretch of training: the tokenizer must be the one the weights learnt
        with open(os.path.join(args.init, "tokenizer.json"), encoding="utf-8") as f:
            if json.load(f) != bpe.to_json():
                raise SystemExit("--init %s: its tokenizer differs from this run's (same --samples needed)" % args.init)
        load_safetensors(model, os.path.join(args.init, "model.safetensors"))
        log("weights from %s" % args.init)
    model = model.to(args.device)
    n_params = sum(p.numel() for p in model.parameters())
    log("model: %d parameters" % n_params)
    steps, loss = train(model, data, bpe.token_to_id("<|endoftext|>"), args, args.out, log)
    log("trained %d steps, final loss %.4f" % (steps, loss))

    round_bf16_(model)  # everything below runs the bf16 checkpoint's weights in fp32
    save_safetensors(model, os.path.join(args.out, "model.safetensors"))
    acc = evaluate(model, bpe, render, args.eval, log)
    log("held-out: %s" % json.dumps(acc))
    cases = golden(model.cpu(), bpe, render, args.golden_tokens, log)  # the golden run on the CPU: fp32, one summation order
    write_json(os.path.join(args.out, "golden_chat.json"),
               {"reference": "tools/tiny_qwen3_moe.py (fp32 compute, bf16 weights), template by " + render.engine,
                "torch": torch.__version__, "do_sample": False, "max_new_tokens": args.golden_tokens,
                "stop_ids": [bpe.token_to_id(s) for s in STOP], "cases": cases})
    report = {"samples": len(samples), "tokens": sum(lens), "steps": steps, "batch": args.batch, "lr": args.lr,
              "train_minutes": args.train_minutes, "threads": args.threads, "final_loss": loss, "params": n_params,
              "torch": torch.__version__, "renderer": render.engine, **acc,
              "golden_stepwise_equal": all(c["stepwise_argmax_equal"] for c in cases)}
    write_json(os.path.join(args.out, "train_report.json"), report)
    log("done: %s" % json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
