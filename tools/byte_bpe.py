"""A byte-level BPE tokenizer with Qwen2/Qwen3's configuration, trained and written as a Hugging Face tokenizer.json.

For machines without the `tokenizers` library (Debian's python has none). It implements what tokenizer.json
then says: added tokens split out of the raw text first; NFC; Qwen2's pre-tokenizer regex (isolated pieces); each
piece as GPT-2 byte characters; merges applied by rank inside each piece. fp8moe's own tokenizer (tested against
`tokenizers` on other Qwen2-style files) reads the file; make_agent_model.py checks the two agree on every prompt.
"""
import collections
import json
import unicodedata

import regex

QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PIECE = regex.compile(QWEN2_PATTERN)


def byte_chars():
    """GPT-2's map from the 256 bytes to printable characters (ByteLevel in `tokenizers`)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


BYTE_CHAR = byte_chars()
CHAR_BYTE = {c: b for b, c in BYTE_CHAR.items()}


def pieces(text):
    """NFC, then the pre-tokenizer's pieces as byte-character strings."""
    return ["".join(BYTE_CHAR[b] for b in p.encode("utf-8")) for p in PIECE.findall(unicodedata.normalize("NFC", text))]


def train(texts, vocab_size):
    """Merges learnt greedily (the most frequent adjacent pair; ties by the pair's text) until vocab_size tokens."""
    words = collections.Counter(p for t in texts for p in pieces(t))
    seqs = {w: list(w) for w in words}
    vocab = sorted(BYTE_CHAR.values())
    merges = []
    while len(vocab) < vocab_size:
        pairs = collections.Counter()
        for w, n in words.items():
            s = seqs[w]
            for a, b in zip(s, s[1:]):
                pairs[a, b] += n
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        if pairs[best] < 2:
            break
        merges.append(best)
        vocab.append(best[0] + best[1])
        for w in words:
            s = seqs[w]
            if len(s) < 2:
                continue
            out, i = [], 0
            while i < len(s):
                if i + 1 < len(s) and s[i] == best[0] and s[i + 1] == best[1]:
                    out.append(best[0] + best[1])
                    i += 2
                else:
                    out.append(s[i])
                    i += 1
            seqs[w] = out
    return vocab, merges


class ByteBPE:
    def __init__(self, vocab, merges, special, added):
        """vocab: token strings in id order; special/added: token strings appended after it (special ones first)."""
        self.tokens = list(vocab) + list(special) + list(added)
        self.ids = {t: i for i, t in enumerate(self.tokens)}
        self.rank = {m: i for i, m in enumerate(merges)}
        self.merges = merges
        self.special, self.added = list(special), list(added)
        self.split = regex.compile("(" + "|".join(regex.escape(t) for t in self.special + self.added) + ")")
        self.cache = {}

    def token_to_id(self, t):
        return self.ids[t]

    def get_vocab_size(self):
        return len(self.tokens)

    def bpe(self, piece):
        if piece in self.cache:
            return self.cache[piece]
        s = list(piece)
        while len(s) > 1:
            ranked = [(self.rank.get((a, b), 1 << 30), i) for i, (a, b) in enumerate(zip(s, s[1:]))]
            r, i = min(ranked)
            if r == 1 << 30:
                break
            s[i:i + 2] = [s[i] + s[i + 1]]
        ids = [self.ids[t] for t in s]
        self.cache[piece] = ids
        return ids

    def encode(self, text):
        out = []
        for part in self.split.split(text):
            if not part:
                continue
            if part in self.ids and (part in self.special or part in self.added):
                out.append(self.ids[part])
            else:
                for p in pieces(part):
                    out.extend(self.bpe(p))
        return out

    def decode(self, ids):
        out, buf = [], bytearray()
        for i in ids:
            t = self.tokens[i]
            if t in self.special or t in self.added:
                out.append(buf.decode("utf-8", "replace"))
                buf = bytearray()
                out.append(t)
            else:
                buf.extend(CHAR_BYTE[c] for c in t)
        out.append(buf.decode("utf-8", "replace"))
        return "".join(out)

    def to_json(self):
        """tokenizer.json as `tokenizers` writes Qwen2/Qwen3's."""
        n = len(self.tokens) - len(self.special) - len(self.added)
        added = [{"id": self.ids[t], "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                  "normalized": False, "special": t in self.special} for t in self.special + self.added]
        return {
            "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": {"type": "NFC"},
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": QWEN2_PATTERN}, "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
            "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                               "use_regex": False},
            "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                      "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": {t: i for i, t in enumerate(self.tokens[:n])},
                      "merges": [[a, b] for a, b in self.merges]},
        }

    def save(self, path):
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_json(), f, ensure_ascii=False, indent=2)
            f.write("\n")
