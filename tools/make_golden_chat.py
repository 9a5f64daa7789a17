#!/usr/bin/env python3
"""Golden chat-template renderings: tests/chat_templates/golden.json.

Each template fixture under tests/chat_templates/ (an official template, kept as the model ships it) renders a set of
conversations through transformers' own apply_chat_template(tokenize=False), with and without the generation prompt,
and for Qwen3 with enable_thinking True and False. A conversation the template rejects records the template's error
text. tests/test_chat_template.c renders the same cases with fp8moe and compares byte for byte.

Run from the repository root (no network; everything it reads is in the repository):
    python3 tools/make_golden_chat.py            # writes tests/chat_templates/golden.json
Needs transformers (with jinja2) and tokenizers. The tokenizer only carries the template: any tokenizer.json works,
the bundled model's is used.

    python3 tools/make_golden_chat.py --jinja2-only OUT.json
renders with jinja2 alone, set up as transformers sets it up (a check on machines without transformers; the committed
golden file comes from transformers).
"""
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import jinja2  # noqa: E402
import jinja2.ext  # noqa: E402
import jinja2.sandbox  # noqa: E402

JINJA2_ONLY = len(sys.argv) == 3 and sys.argv[1] == "--jinja2-only"
if not JINJA2_ONLY:
    import transformers  # noqa: E402
    from transformers import PreTrainedTokenizerFast  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "chat_templates")
TOKENIZER = os.path.join(ROOT, "models", "tiny-code-moe", "tokenizer.json")

# fixture directory -> a short name for its cases, and whether the template has the thinking switch
TEMPLATES = [
    ("qwen3-30b-a3b", "qwen3", True),
    ("chatml", "chatml", False),
    ("mixtral-8x7b-instruct-v0.1", "mistral", False),
    ("mixtral-8x7b-instruct-v0.1-2023", "mistral-legacy", False),
]


def m(role, content):
    return {"role": role, "content": content}


UNICODE = "Grüße, 世界! 🙂 e\u0301 (a combining accent), ﬁ, \u200b zero width, tab\there"
THINK_REPLY = "<think>\nThe user greets me. I should greet back.\n</think>\n\nHello! How can I help?"
TOOL_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'

COMMON = [
    ("single user turn", [m("user", "Write a Python function that adds two numbers.")]),
    ("system + user", [m("system", "You are a terse assistant."), m("user", "What is 2 + 2?")]),
    ("multi-turn", [m("user", "Hi"), m("assistant", "Hello! How can I help?"), m("user", "Tell me a joke.")]),
    ("system + multi-turn", [m("system", "Be brief."), m("user", "Hi"), m("assistant", "Hello."),
                             m("user", "Count to three."), m("assistant", "1, 2, 3."), m("user", "Again.")]),
    ("ends with an assistant turn", [m("user", "Say yes."), m("assistant", "Yes.")]),
    ("unicode", [m("system", UNICODE), m("user", UNICODE), m("assistant", UNICODE), m("user", UNICODE)]),
    ("empty contents", [m("user", ""), m("assistant", ""), m("user", "")]),
    ("newlines and spaces kept", [m("user", "  leading\n\ntrailing  \n"), m("assistant", "\n\nanswer\n"),
                                  m("user", "\n")]),
    ("special-token text in content", [m("user", "<|im_start|>user [INST] <s></s> <think></think>")]),
]

QWEN3_ONLY = [
    ("earlier assistant turn with reasoning (stripped)",
     [m("user", "Hi"), m("assistant", THINK_REPLY), m("user", "How are you?")]),
    ("last assistant turn with reasoning (kept)", [m("user", "Hi"), m("assistant", THINK_REPLY)]),
    ("last assistant turn without reasoning (empty think block)", [m("user", "Hi"), m("assistant", "Hello!")]),
    ("reasoning without newlines", [m("user", "Hi"), m("assistant", "<think>short</think>Hello!")]),
    ("several </think>, unclosed <think>",
     [m("user", "a"), m("assistant", "<think>one</think>two</think>\n\nthree"), m("user", "b"),
      m("assistant", "x <think>\n\ny\n\n</think>\n\n\nz"), m("assistant", "<think>never closed")]),
    ("only newlines as reasoning", [m("user", "a"), m("assistant", "<think>\n\n</think>\n\nanswer")]),
    ("tool call, two tool results grouped into one user turn",
     [m("system", "You can call tools."), m("user", "What is the weather in Paris?"), m("assistant", TOOL_CALL),
      m("tool", '{"temperature": 21}'), m("tool", '{"humidity": 40}')]),
    ("multi-step tools with reasoning after the last query",
     [m("user", "Weather in Paris, then in Rome?"),
      m("assistant", "<think>\nFirst Paris.\n</think>\n\n" + TOOL_CALL), m("tool", '{"temperature": 21}'),
      m("assistant", "<think>\nNow Rome.\n</think>\n\n" + TOOL_CALL.replace("Paris", "Rome")),
      m("tool", '{"temperature": 25}'),
      m("assistant", "<think>\nBoth known.\n</think>\n\nParis 21, Rome 25.")]),
    ("a user turn that is a wrapped tool response does not count as the query",
     [m("user", "Weather?"), m("assistant", "<think>\ncall it\n</think>\n\n" + TOOL_CALL),
      m("user", "<tool_response>\n{\"temperature\": 21}\n</tool_response>"),
      m("assistant", "<think>\nwarm\n</think>\n\nIt is 21 degrees.")]),
    ("tool result first", [m("tool", "orphan result"), m("user", "ok")]),
    ("system message later in the conversation", [m("user", "Hi"), m("system", "Now be formal."), m("user", "Hey")]),
]

MISTRAL_ONLY = [
    ("error: assistant first", [m("assistant", "I start."), m("user", "Hi")]),
    ("error: two user turns in a row", [m("user", "Hi"), m("user", "Hello?")]),
    ("error: system message at an odd position", [m("user", "Hi"), m("system", "late system")]),
    ("error: system message at an even position", [m("user", "Hi"), m("assistant", "Hello"), m("system", "late")]),
    ("error: tool turn", [m("user", "Hi"), m("tool", "result")]),
    ("only a system message", [m("system", "Just a system message.")]),
]

CHATML_ONLY = [
    ("tool turn", [m("user", "Weather?"), m("assistant", TOOL_CALL), m("tool", '{"temperature": 21}')]),
]


def load_fixture(fixture):
    """The template text and special tokens of a fixture directory, read as transformers reads a checkpoint."""
    d = os.path.join(FIXTURES, fixture)
    cfg = {}
    if os.path.exists(os.path.join(d, "tokenizer_config.json")):
        with open(os.path.join(d, "tokenizer_config.json"), encoding="utf-8") as f:
            cfg = json.load(f)
    jinja_path = os.path.join(d, "chat_template.jinja")
    if os.path.exists(jinja_path):
        with open(jinja_path, encoding="utf-8", newline="") as f:
            template = f.read()
    else:
        template = cfg["chat_template"]
    return template, cfg.get("bos_token"), cfg.get("eos_token")


class Jinja2Renderer:
    """apply_chat_template(tokenize=False) without transformers: its Jinja environment and globals."""

    def __init__(self, template, bos, eos):
        def raise_exception(message):
            raise jinja2.exceptions.TemplateError(message)

        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                          extensions=[jinja2.ext.loopcontrols])
        env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False, **kw)
        env.globals["raise_exception"] = raise_exception
        self.template = env.from_string(template)
        self.tokens = {k: v for k, v in (("bos_token", bos), ("eos_token", eos)) if v is not None}

    def apply_chat_template(self, messages, tokenize, add_generation_prompt, **kwargs):
        assert not tokenize
        return self.template.render(messages=messages, tools=None, documents=None,
                                    add_generation_prompt=add_generation_prompt, **{**self.tokens, **kwargs})


def render(tok, messages, add_generation_prompt, enable_thinking, special):
    kwargs = {"tokenize": False, "add_generation_prompt": add_generation_prompt}
    if enable_thinking is not None:
        kwargs["enable_thinking"] = enable_thinking
    # bos_token/eos_token as the checkpoint's tokenizer_config.json names them, passed explicitly too so that the
    # rendering does not depend on how a transformers version forwards the tokenizer's special tokens
    kwargs.update(special)
    try:
        text = tok.apply_chat_template(messages, **kwargs)
    except jinja2.exceptions.TemplateError as e:  # raise_exception() in the template
        return {"error": str(e)}
    if not isinstance(text, str):
        sys.exit(f"apply_chat_template(tokenize=False) returned {type(text).__name__}, not the text")
    return {"text": text}


def main():
    cases = []
    for fixture, name, thinking in TEMPLATES:
        template, bos, eos = load_fixture(fixture)
        special = {k: v for k, v in (("bos_token", bos), ("eos_token", eos)) if v is not None}
        if JINJA2_ONLY:
            tok = Jinja2Renderer(template, bos, eos)
        else:
            tok = PreTrainedTokenizerFast(tokenizer_file=TOKENIZER, bos_token=bos, eos_token=eos)
            tok.chat_template = template
        convs = list(COMMON)
        convs += QWEN3_ONLY if name == "qwen3" else CHATML_ONLY if name == "chatml" else MISTRAL_ONLY
        for title, messages in convs:
            for gen in (True, False):
                for think in ((True, False) if thinking else (None,)):
                    case = {"fixture": fixture, "template": name, "conversation": title, "messages": messages,
                            "add_generation_prompt": gen, "enable_thinking": think}
                    case.update(render(tok, messages, gen, think, special))
                    cases.append(case)
    out = {
        "generator": "tools/make_golden_chat.py",
        "transformers": "none (--jinja2-only)" if JINJA2_ONLY else transformers.__version__,
        "jinja2": jinja2.__version__,
        "note": "apply_chat_template(messages, tokenize=False, add_generation_prompt=..., enable_thinking=... when "
                "not null); 'error' is the text of the template's raise_exception",
        "cases": cases,
    }
    path = sys.argv[2] if JINJA2_ONLY else os.path.join(FIXTURES, "golden.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
        f.write("\n")
    n_err = sum("error" in c for c in cases)
    print(f"wrote {len(cases)} cases ({n_err} rejected by their template) to {os.path.relpath(path, ROOT)}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
