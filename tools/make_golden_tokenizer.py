#!/usr/bin/env python3
"""Golden data for fp8moe's tokenizer (tests/test_tokenizer.c), made with the reference libraries.

Run on a machine with `tokenizers`, `sentencepiece` and `transformers` installed (no network needed), from the
repository root:

    python3 tools/make_golden_tokenizer.py            # writes tests/tokenizers/*/ and build/tokenizer_bench.txt

It writes, for three tokenizers of the two families fp8moe reads:
  tests/tokenizers/qwen2-bpe/    tokenizer.json: byte-level BPE with Qwen2's exact pre-tokenizer configuration (NFC;
                                 Split with Qwen2's regex, isolated; ByteLevel without regex; ByteLevel decoder),
                                 trained by the `tokenizers` BpeTrainer on tests/tokenizers/train_corpus.txt (~2000
                                 tokens), with Qwen's special tokens and a few added tokens
  tests/tokenizers/llama-spm/    tokenizer.json + tokenizer_config.json: a SentencePiece BPE with byte_fallback trained
                                 by `sentencepiece` on the same corpus, converted by transformers as it converts
                                 Llama/Mistral tokenizers (Prepend/Replace or Metaspace, <0xNN> tokens, <s> </s> <unk>)
  tests/tokenizers/tiny-code-moe/  golden.json only (the tokenizer is models/tiny-code-moe/tokenizer.json)
and in each directory golden.json: for every case of the corpus below, the ids `tokenizers` encodes (with and
without add_special_tokens, and with special tokens in the text treated as text), and the decoded strings (with
and without skip_special_tokens); plus decode-only cases of byte tokens that are invalid UTF-8.

It also times `tokenizers` encoding ~1 MB of text on one thread (TOKENIZERS_PARALLELISM=false, encode, not
encode_batch) with each tokenizer, writes that text to build/tokenizer_bench.txt, and prints the fp8moe commands
that time the same text.
"""
import argparse
import glob
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread, before tokenizers is imported
os.environ["RAYON_NUM_THREADS"] = "1"
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "tokenizers")
CORPUS = os.path.join(OUT, "train_corpus.txt")

# Qwen2's pre-tokenizer regex, as in Qwen/Qwen2-7B's (and Qwen3's) tokenizer.json
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# The test corpus: (name, text) or (name, bytes) for input that is not valid UTF-8 (the golden encoding is of
# bytes.decode("utf-8", "replace"): fp8moe replaces invalid bytes by U+FFFD the same way before encoding).
NFD_CAFE = "cafe\u0301 A\u030angstro\u0308m n\u0303"  # combining marks: NFC composes them
CASES = [
    ("empty", ""),
    ("hello", "Hello world"),
    ("leading_space", " Hello"),
    ("code_python", "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n"),
    ("code_c", "int main(int argc, char **argv) {\n\tprintf(\"%d\\n\", argc);\n\treturn 0;\n}\n"),
    ("whitespace_runs", "a  b   c    d\t\te\n\nf \n \n\t \t g     \n"),
    ("whitespace_only", "   \t\n  "),
    ("trailing_spaces", "end of line   "),
    ("crlf", "line one\r\nline two\r\n\r\n"),
    ("digits", "0 1 12 123 1234 12345 123456789 3.14159 1e-5 0x1F 2026-12-01"),
    ("contractions", "I'm sure you'll see they've done what it's DON'T I'D"),
    ("punctuation", "Hello, world! (a) [b] {c} <d> ... ?! ;: -- '' \"\" @#$%^&*"),
    ("cjk", "中文分词器把文本切成词元。日本語のテキスト。한국어 텍스트."),
    ("cjk_mixed", "我们测试English单词和数字123，还有全角数字１２３。"),
    ("emoji", "I like 🍕 and 🎉🎉 and ❤️!"),
    ("emoji_zwj", "family 👨‍👩‍👧‍👦 coder 👩🏽‍💻 flag 🏳️‍🌈 🇫🇷🇯🇵"),
    ("combining_nfc", "café Ångström ñ"),
    ("combining_nfd", NFD_CAFE),
    ("math", "∀x ∈ ℝ, x² ≥ 0; ∑ᵢ aᵢ = π ≈ 3.14"),
    ("rare_chars", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ꙮ 𓀀 ⿰ \u2028 \u00a0 \ufeff"),
    ("cyrillic_greek", "Москва — столица. Αθήνα!"),
    ("special_inside", "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"),
    ("special_adjacent", "a<|endoftext|>b<|endoftext|><|endoftext|>c"),
    ("llama_specials", "<s>Hello</s> <unk> and <s> again"),
    ("added_plain", "x <think>reasoning</think> y"),
    ("special_partial", "<|im_start <|im_end| <|endoftext"),
    ("long_word", "a" * 300 + " " + "ab" * 150),
    ("long_spaces", " " * 100 + "x" + "\t" * 40 + "\n" * 20),
    ("mixed", "Price: $1,299.99 (was €1.499,00) — 50% off!! Email: a.b@c.io #tag @user"),
    ("invalid_lone_continuation", b"ab\x80cd"),
    ("invalid_truncated", b"x\xe4\xb8 y \xf0\x9f\x98"),
    ("invalid_overlong", b"\xc0\xaf \xe0\x80\xaf \xed\xa0\x80 \xff\xfe"),
]


def read_corpus():
    with open(CORPUS, encoding="utf-8", newline="") as f:
        return f.read()


def bytes_to_unicode():
    """GPT-2's byte-level alphabet (the same table as tokenizers' ByteLevel)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def build_qwen2(dirpath):
    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=2000,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
    )
    tok.train([CORPUS], trainer)
    # as Qwen3 has them: <think> and </think> are added tokens that are not special
    tok.add_tokens([AddedToken("<think>", special=False, normalized=False), AddedToken("</think>", special=False, normalized=False)])
    os.makedirs(dirpath, exist_ok=True)
    tok.save(os.path.join(dirpath, "tokenizer.json"))
    return Tokenizer.from_file(os.path.join(dirpath, "tokenizer.json")), "tokenizers BpeTrainer"


def train_spm(tmp):
    import sentencepiece as spm

    prefix = os.path.join(tmp, "spm")
    # Llama's trainer settings: BPE, byte fallback, digits split, no normalization, whitespace kept
    spm.SentencePieceTrainer.train(
        input=CORPUS,
        model_prefix=prefix,
        vocab_size=2000,
        model_type="bpe",
        byte_fallback=True,
        split_digits=True,
        character_coverage=0.99,  # some rare characters are left to the byte fallback
        normalization_rule_name="identity",
        add_dummy_prefix=True,
        remove_extra_whitespaces=False,
        allow_whitespace_only_pieces=True,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        num_threads=1,
        minloglevel=2,
    )
    return prefix + ".model"


def build_llama(dirpath):
    """The SentencePiece model converted to tokenizer.json the way transformers does for Llama/Mistral checkpoints
    that ship only tokenizer.model: AutoTokenizer with the Llama tokenizer class, then save_pretrained."""
    import transformers

    tmp = tempfile.mkdtemp()
    try:
        model = train_spm(tmp)
        src = os.path.join(tmp, "ckpt")
        os.makedirs(src)
        shutil.copy(model, os.path.join(src, "tokenizer.model"))
        cfg = {"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
               "add_bos_token": True, "add_eos_token": False, "model_max_length": 4096}
        with open(os.path.join(src, "tokenizer_config.json"), "w") as f:
            json.dump(cfg, f)
        how = None
        errors = []
        try:  # transformers 4.x and 5.x: the fast Llama tokenizer built from tokenizer.model
            from transformers import AutoTokenizer

            hf = AutoTokenizer.from_pretrained(src, use_fast=True)
            if not getattr(hf, "is_fast", False):
                raise RuntimeError("AutoTokenizer gave a slow tokenizer")
            out = os.path.join(tmp, "saved")
            hf.save_pretrained(out)
            if not os.path.exists(os.path.join(out, "tokenizer.json")):
                raise RuntimeError("save_pretrained wrote no tokenizer.json")
            os.makedirs(dirpath, exist_ok=True)
            shutil.copy(os.path.join(out, "tokenizer.json"), os.path.join(dirpath, "tokenizer.json"))
            if os.path.exists(os.path.join(out, "tokenizer_config.json")):
                with open(os.path.join(out, "tokenizer_config.json")) as f:
                    saved = json.load(f)
                saved.pop("chat_template", None)
                with open(os.path.join(dirpath, "tokenizer_config.json"), "w") as f:
                    json.dump(saved, f, indent=2, ensure_ascii=False)
            how = f"transformers {transformers.__version__} {type(hf).__name__} (AutoTokenizer from tokenizer.model)"
        except Exception as e:  # noqa: BLE001
            errors.append(f"AutoTokenizer: {e!r}")
        if how is None:
            try:  # transformers 4.x: the converter class directly, with a stand-in for the slow tokenizer
                from transformers.convert_slow_tokenizer import LlamaConverter

                class Slow:
                    vocab_file = model
                    legacy = True
                    add_prefix_space = None
                    add_bos_token = True
                    add_eos_token = False
                    bos_token = "<s>"
                    eos_token = "</s>"
                    unk_token = "<unk>"
                    handle_byte_fallback = True

                tk = LlamaConverter(Slow()).converted()
                tk.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                                  special_tokens=[("<s>", tk.token_to_id("<s>"))])
                os.makedirs(dirpath, exist_ok=True)
                tk.save(os.path.join(dirpath, "tokenizer.json"))
                how = f"transformers {transformers.__version__} LlamaConverter (legacy) + TemplateProcessing <s> $A"
            except Exception as e:  # noqa: BLE001
                errors.append(f"LlamaConverter: {e!r}")
        if how is None:
            sys.exit("could not convert the SentencePiece model with transformers:\n  " + "\n  ".join(errors))
        for e in errors:
            print(f"llama-spm: note: {e}")
        return Tokenizer.from_file(os.path.join(dirpath, "tokenizer.json")), how
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def byte_token_ids(tok, family):
    """ids of the tokens standing for single bytes: <0xNN> (SentencePiece) or GPT-2 byte characters."""
    ids = {}
    if family == "spm":
        for b in range(256):
            i = tok.token_to_id(f"<0x{b:02X}>")
            if i is not None:
                ids[b] = i
    else:
        for b, ch in bytes_to_unicode().items():
            i = tok.token_to_id(ch)
            if i is not None:
                ids[b] = i
    return ids


def golden(tok, family, how, tokenizer_dir):
    cases = []
    for name, value in CASES:
        text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
        c = {"name": name}
        if isinstance(value, bytes):
            c["bytes_hex"] = value.hex()
        else:
            c["text"] = value
        c["ids"] = tok.encode(text, add_special_tokens=True).ids
        c["ids_no_special"] = tok.encode(text, add_special_tokens=False).ids
        tok.encode_special_tokens = True  # special tokens written in the text are text
        c["ids_text_special"] = tok.encode(text, add_special_tokens=False).ids
        tok.encode_special_tokens = False
        c["decoded"] = tok.decode(c["ids"], skip_special_tokens=False)
        c["decoded_skip_special"] = tok.decode(c["ids"], skip_special_tokens=True)
        cases.append(c)
    # decode only: byte tokens that are not valid UTF-8 on their own
    bt = byte_token_ids(tok, family)
    letter = tok.encode("a", add_special_tokens=False).ids
    decode_cases = []
    for name, seq in [
        ("bytes_truncated_cjk", [0xE4, 0xB8]),
        ("bytes_complete_cjk", [0xE4, 0xB8, 0xAD]),
        ("bytes_lone_ff", [0xFF]),
        ("bytes_continuation_then_ascii", [0x80, 0x41]),
        ("bytes_truncated_emoji", [0xF0, 0x9F, 0x98]),
        ("bytes_surrogate", [0xED, 0xA0, 0x80]),
    ]:
        if not all(b in bt for b in seq):
            continue
        for tail_name, tail in [("", []), ("_then_a", letter)]:
            ids = [bt[b] for b in seq] + tail
            decode_cases.append({"name": name + tail_name, "ids": ids,
                                 "decoded": tok.decode(ids, skip_special_tokens=False)})
    import tokenizers

    doc = {
        "generator": "tools/make_golden_tokenizer.py",
        "tokenizers_version": tokenizers.__version__,
        "built_by": how,
        "family": family,
        "vocab_size": tok.get_vocab_size(with_added_tokens=True),
        "cases": cases,
        "decode_cases": decode_cases,
    }
    if tokenizer_dir:
        doc["tokenizer_dir"] = tokenizer_dir  # relative to the repository root
    return doc


def bench_text(path, size):
    """~size bytes of mixed text: the training corpus, then the repository's sources and docs, cut at a character."""
    parts, total = [], 0
    files = [CORPUS] + sorted(glob.glob(os.path.join(ROOT, "src", "**", "*.[ch]"), recursive=True))
    files += sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))) + [os.path.join(ROOT, "README.md")]
    while total < size:
        for f in files:
            with open(f, "rb") as fh:
                b = fh.read()
            parts.append(b)
            total += len(b)
            if total >= size:
                break
    data = b"".join(parts)[:size]
    data = data.decode("utf-8", "ignore").encode("utf-8")  # no character cut in half
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    return data.decode("utf-8")


def time_encode(tok, text, repeat):
    tok.encode(text)  # warm-up
    secs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        tok.encode(text)
        secs.append(time.perf_counter() - t0)
    return statistics.median(secs)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench-text", default=os.path.join(ROOT, "build", "tokenizer_bench.txt"))
    ap.add_argument("--bench-bytes", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--bench-model", action="append", default=[],
                    help="also time this directory's tokenizer.json (a real Qwen3 or Mixtral one, when at hand)")
    ap.add_argument("--no-bench", action="store_true")
    args = ap.parse_args()

    built = []
    qwen_dir = os.path.join(OUT, "qwen2-bpe")
    tok, how = build_qwen2(qwen_dir)
    built.append(("qwen2-bpe", qwen_dir, tok, "byte_level", how, None))
    llama_dir = os.path.join(OUT, "llama-spm")
    tok, how = build_llama(llama_dir)
    built.append(("llama-spm", llama_dir, tok, "spm", how, None))
    tiny = os.path.join(ROOT, "models", "tiny-code-moe")
    tok = Tokenizer.from_file(os.path.join(tiny, "tokenizer.json"))
    built.append(("tiny-code-moe", os.path.join(OUT, "tiny-code-moe"), tok, "byte_level", "models/tiny-code-moe",
                  "models/tiny-code-moe"))

    for name, d, tok, family, how, tdir in built:
        os.makedirs(d, exist_ok=True)
        doc = golden(tok, family, how, tdir)
        with open(os.path.join(d, "golden.json"), "w", encoding="utf-8") as f:
            json.dump(doc, f, ensure_ascii=False, indent=1)
            f.write("\n")
        print(f"{name}: {len(doc['cases'])} cases, {len(doc['decode_cases'])} decode cases, vocab {doc['vocab_size']}, "
              f"built by {how} -> {os.path.relpath(d, ROOT)}/")

    if args.no_bench:
        return
    text = bench_text(args.bench_text, args.bench_bytes)
    nbytes = len(text.encode("utf-8"))
    import tokenizers

    print(f"\nencode throughput of tokenizers {tokenizers.__version__} (Rust), one thread, "
          f"{nbytes} bytes of {os.path.relpath(args.bench_text, ROOT)}, median of {args.repeat}:")
    dirs = [(n, tdir or os.path.relpath(d, ROOT)) for n, d, _, _, _, tdir in built]
    dirs += [(os.path.basename(os.path.normpath(m)), m) for m in args.bench_model]
    for name, d in dirs:
        tok = Tokenizer.from_file(os.path.join(ROOT, d, "tokenizer.json") if not os.path.isabs(d)
                                  else os.path.join(d, "tokenizer.json"))
        med = time_encode(tok, text, args.repeat)
        n = len(tok.encode(text).ids)
        print(f"  {name:16s} {nbytes / med / 1e6:8.2f} MB/s  ({med * 1e3:.1f} ms, {n} tokens)")
    print("\nthe same text with fp8moe (one thread):")
    for name, d in dirs:
        print(f"  ./build/fp8moe bench tokenize --model {d} --file {os.path.relpath(args.bench_text, ROOT)}")


if __name__ == "__main__":
    main()
