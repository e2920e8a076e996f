#!/usr/bin/env python3
"""Writes tests/data/tokenizers/tiktoken_vectors.json: ids from the PyPI `tiktoken` package for
tricky texts, for the tiktoken-format encodings in ../shared/data/tokenizers. loom's tests
compare its own encoder against these.

  .venv/bin/pip install tiktoken==0.9.0 && .venv/bin/python tools/make_tokenizer_vectors.py
"""
import base64
import json
import os
import sys

import tiktoken

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKENIZERS = os.path.join(ROOT, "..", "shared", "data", "tokenizers")

TEXTS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "It's, they're, we've, I'm, you'll, he'd, IT'S, THEY'RE",
    "Numbers: 1 12 123 1234 12345 3.14159 -42 1e10 0x1F 2026-11-29",
    "   leading spaces, trailing spaces   ",
    "tabs\tand\t\ttabs, newlines\n\nand\r\nwindows line ends\n",
    "Unicode: café naïve Ünïcödé Grüße 北京 東京 서울 مرحبا שלום Привет",
    "Emoji 🎉🚀👍🏽 and flags 🇩🇪 and ZWJ 👨‍👩‍👧",
    "supercalifragilisticexpialidocious antidisestablishmentarianism pneumonoultramicroscopicsilicovolcanoconiosis",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "def f(x):\n    return x ** 2  # comment\n\tif x: pass\n",
    "{\"json\": [1, 2, {\"nested\": null}], 'single': true}",
    "<|endoftext|> is text here, not a special token",
    "Mixed-case CamelCaseWords and snake_case_words and SCREAMING_CASE",
    "punctuation!!! ??? ... --- *** ### @@@ $$$ %%% ^^^ &&& ((( )))",
    "\u00a0non-breaking\u2003em-space\u3000ideographic space",
    "",
    " ",
    "\n",
    "a\n\n\n\nb    \n  c",
]


def load_ranks(path):
    ranks = {}
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
    return ranks


def main():
    out = {"tiktoken_version": tiktoken.__version__, "encodings": {}}
    for name in ("cl100k_base", "gpt2"):
        with open(os.path.join(TOKENIZERS, name + ".json")) as f:
            spec = json.load(f)
        enc = tiktoken.Encoding(name, pat_str=spec["pat_str"],
                                mergeable_ranks=load_ranks(os.path.join(TOKENIZERS, name + ".tiktoken")),
                                special_tokens=spec["special_tokens"])
        out["encodings"][name] = [{"text": t, "ids": enc.encode_ordinary(t)} for t in TEXTS]
    path = os.path.join(ROOT, "tests", "data", "tokenizers", "tiktoken_vectors.json")
    # One vector per line keeps diffs readable.
    lines = ["{", f' "tiktoken_version": {json.dumps(out["tiktoken_version"])},', ' "encodings": {']
    names = list(out["encodings"])
    for i, name in enumerate(names):
        lines.append(f"  {json.dumps(name)}: [")
        vectors = out["encodings"][name]
        for j, v in enumerate(vectors):
            comma = "," if j + 1 < len(vectors) else ""
            lines.append("   " + json.dumps(v, ensure_ascii=False) + comma)
        lines.append("  ]" + ("," if i + 1 < len(names) else ""))
    lines += [" }", "}"]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
